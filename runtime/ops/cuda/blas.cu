/*
 * blas.cu — matmul forward and backward with cuBLAS (fp32 GEMM, TF32 left off so results agree
 * with the CPU reference), plus the bias broadcast and reduction kernels around it.
 *
 * cuBLAS is column-major: a row-major [R, K] matrix is the column-major [K, R] one, so each
 * row-major product below is issued as the transposed product with the operands swapped.
 * One handle per device, created on first use, bound to the current stream on every call.
 */
#include <pthread.h>

#include "common.cuh"

static cublasHandle_t handles[MAX_DEVICES];
static pthread_mutex_t handles_lock = PTHREAD_MUTEX_INITIALIZER;

static WkStatus handle_for(int device, cublasHandle_t *out) {
  WK_TRY(check_device(device));
  DEVICE_GUARD(device);  /* a handle belongs to the device current at its creation */
  pthread_mutex_lock(&handles_lock);
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  if (!handles[device]) status = cublasCreate(&handles[device]);
  pthread_mutex_unlock(&handles_lock);
  if (status != CUBLAS_STATUS_SUCCESS)
    return WK_FAIL(WK_ERR_DEVICE, "cublasCreate on cuda:%d: %s", device, cublasGetStatusString(status));
  CUBLAS_TRY(cublasSetStream(handles[device], current_stream()));
  *out = handles[device];
  return WK_OK;
}

__global__ static void broadcast_rows_kernel(float *out, const float *bias, size_t N, size_t OC) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < N * OC; i += (size_t)gridDim.x * blockDim.x)
    out[i] = bias[i % OC];
}

/* dbias[o] += sum over rows of dout[:, o]: one thread per column. */
__global__ static void column_sum_kernel(float *dbias, const float *dout, size_t N, size_t OC) {
  for (size_t o = blockIdx.x * (size_t)blockDim.x + threadIdx.x; o < OC; o += (size_t)gridDim.x * blockDim.x) {
    float sum = 0.0f;
    for (size_t n = 0; n < N; n++) sum += dout[n * OC + o];
    dbias[o] += sum;
  }
}

extern "C" WkStatus cuda_matmul_forward(int device, float *out, const float *inp, const float *w, const float *bias,
                                        size_t N, size_t C, size_t OC, int transpose_w) {
  cublasHandle_t h;
  WK_TRY(handle_for(device, &h));
  float one = 1.0f, beta = 0.0f;
  if (bias && N * OC) {
    broadcast_rows_kernel<<<blocks_for(N * OC, THREADS), THREADS, 0, current_stream()>>>(out, bias, N, OC);
    LAUNCH_CHECK();
    beta = 1.0f;
  }
  /* out^T[OC, N] = w^T[OC, C] @ inp^T[C, N]; w row-major [C, OC] is column-major [OC, C] */
  CUBLAS_TRY(cublasSgemm(h, transpose_w ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, (int)OC, (int)N, (int)C, &one, w,
                         transpose_w ? (int)C : (int)OC, inp, (int)C, &beta, out, (int)OC));
  return WK_OK;
}

extern "C" WkStatus cuda_matmul_backward(int device, float *dinp, float *dw, float *dbias, const float *dout,
                                         const float *inp, const float *w, size_t N, size_t C, size_t OC,
                                         int transpose_w) {
  cublasHandle_t h;
  WK_TRY(handle_for(device, &h));
  float one = 1.0f;
  /* dinp^T[C, N] += w[C, OC] @ dout^T[OC, N] (or w^T when w is stored [OC, C]) */
  CUBLAS_TRY(cublasSgemm(h, transpose_w ? CUBLAS_OP_N : CUBLAS_OP_T, CUBLAS_OP_N, (int)C, (int)N, (int)OC, &one, w,
                         transpose_w ? (int)C : (int)OC, dout, (int)OC, &one, dinp, (int)C));
  if (transpose_w) /* dw (row-major [OC, C]) += dout^T @ inp: column-major [C, OC] = inp^T-view @ dout-view^T */
    CUBLAS_TRY(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, (int)C, (int)OC, (int)N, &one, inp, (int)C, dout, (int)OC,
                           &one, dw, (int)C));
  else /* dw (row-major [C, OC]) += inp^T @ dout: column-major [OC, C] = dout-view @ inp-view^T */
    CUBLAS_TRY(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, (int)OC, (int)C, (int)N, &one, dout, (int)OC, inp, (int)C,
                           &one, dw, (int)OC));
  if (dbias && OC) {
    column_sum_kernel<<<blocks_for(OC, THREADS), THREADS, 0, current_stream()>>>(dbias, dout, N, OC);
    LAUNCH_CHECK();
  }
  return WK_OK;
}
