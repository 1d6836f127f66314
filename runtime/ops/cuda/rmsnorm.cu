/*
 * rmsnorm.cu — the CUDA mirror of runtime/ops/cpu/rmsnorm.c: out = x s * weight with the row's
 * reciprocal rms s = 1 / sqrt(mean(x^2) + eps), kept f32 for the backward, x the input or, fused,
 * the rounded sum a + b of a residual add the kernel makes first. Activations and the
 * weight's compute copy are stored f32, bf16 or f16 (computed in f32, rounded once on the store); the
 * weight gradient is f32, reduced per block and then summed over the blocks in order, as layernorm's
 * (layers.cu), so it needs no atomics and is deterministic.
 */
#include "common.cuh"

/* One warp per row: the sum of squares is a warp reduction, the row is in L1 for the second pass.
 * With a residual b (add_rmsnorm) the first pass also forms the rounded sum a + b into sum, and the
 * second reads the row back from there, as layernorm's kernel does (layers.cu says why). */
template <typename Storage>
__global__ static void rmsnorm_forward_kernel(Storage *sum, Storage *out, float *rstd, const Storage *a,
                                              const Storage *b, const Storage *weight, size_t N, size_t C, float eps) {
  ROW_LOOP(n, N) {
    float sumsq = 0.0f;
    for (size_t c = lane(); c < C; c += WARP) {
      float v = norm_input(sum, a, b, n * C + c);
      sumsq += v * v;
    }
    float s = rsqrtf(warp_sum(sumsq) / (float)C + eps);
    const Storage *x = (b ? sum : a) + n * C;
    for (size_t c = lane(); c < C; c += WARP)
      out[n * C + c] = from_float<Storage>(to_float(x[c]) * s * to_float(weight[c]));
    if (lane() == 0) rstd[n] = s;
  }
}

template <typename Storage>
static WkStatus rmsnorm_forward(Storage *sum, Storage *out, float *rstd, const Storage *a, const Storage *b,
                                const Storage *weight, size_t N, size_t C, float eps) {
  LAUNCH_ROWS(rmsnorm_forward_kernel<Storage>, N, sum, out, rstd, a, b, weight, N, C, eps);
  return WK_OK;
}

/* b and sum NULL: the plain RMSNorm of a. */
extern "C" WkStatus cuda_add_rmsnorm_forward(WkDType dtype, void *sum, void *out, float *rstd, const void *a,
                                             const void *b, const void *weight, size_t N, size_t C, float eps) {
  if (N == 0) return WK_OK;
  STORAGE_DISPATCH(dtype, "rmsnorm", rmsnorm_forward((Storage *)sum, (Storage *)out, rstd, (const Storage *)a,
                                                     (const Storage *)b, (const Storage *)weight, N, C, eps));
}

/* A block per row, grid-stride. With xhat = x s and g = weight * dy: dx += s (g - xhat mean(g xhat)),
 * the mean a block reduction. Each thread keeps the dweight of its own columns (the same for every
 * row) in shared memory; each block leaves its column sums in partial[block][C]. */
template <typename Storage>
__global__ static void rmsnorm_backward_kernel(Storage *dinp, float *partial, const Storage *dout, const Storage *inp,
                                               const Storage *weight, const float *rstd, size_t N, size_t C) {
  extern __shared__ float dw[];  /* [C]: this block's dweight */
  for (size_t c = threadIdx.x; c < C; c += blockDim.x) dw[c] = 0.0f;
  for (size_t n = blockIdx.x; n < N; n += gridDim.x) {
    const Storage *x = inp + n * C, *dy = dout + n * C;
    float s = rstd[n], g_xhat_mean = 0.0f;
    for (size_t c = threadIdx.x; c < C; c += blockDim.x)
      g_xhat_mean += to_float(weight[c]) * to_float(dy[c]) * to_float(x[c]) * s;
    g_xhat_mean = block_sum(g_xhat_mean) / (float)C;
    for (size_t c = threadIdx.x; c < C; c += blockDim.x) {
      float xhat = to_float(x[c]) * s, g = to_float(weight[c]) * to_float(dy[c]);
      dinp[n * C + c] = from_float<Storage>(to_float(dinp[n * C + c]) + (g - xhat * g_xhat_mean) * s);
      dw[c] += to_float(dy[c]) * xhat;
    }
  }
  for (size_t c = threadIdx.x; c < C; c += blockDim.x) partial[blockIdx.x * C + c] = dw[c];
}

/* dweight (f32) += the blocks' column sums, in block order. */
__global__ static void rmsnorm_column_sums_kernel(float *dweight, const float *partial, size_t blocks, size_t C) {
  GRID_STRIDE(c, C) {
    float sum = 0.0f;
    for (size_t b = 0; b < blocks; b++) sum += partial[b * C + c];
    dweight[c] += sum;
  }
}

template <typename Storage>
static WkStatus rmsnorm_backward(Storage *dinp, float *dweight, const Storage *dout, const Storage *inp,
                                 const Storage *weight, const float *rstd, size_t N, size_t C) {
  int device = 0, sms = 0, shared_limit = 0;
  CUDA_TRY(cudaGetDevice(&device));
  CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  CUDA_TRY(cudaDeviceGetAttribute(&shared_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  size_t shared = C * sizeof(float);
  if (shared > (size_t)shared_limit)
    return WK_FAIL(WK_ERR_UNSUPPORTED, "rmsnorm_backward: C = %zu needs %zu bytes of shared memory, cuda:%d has %d", C,
                   shared, device, shared_limit);
  CUDA_TRY(cudaFuncSetAttribute(rmsnorm_backward_kernel<Storage>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)shared));
  size_t blocks = N < (size_t)(4 * sms) ? N : (size_t)(4 * sms);  /* a few resident blocks per SM */
  DeviceScratch partial;
  WK_TRY(scratch_new(&partial, blocks * shared));
  rmsnorm_backward_kernel<Storage><<<(unsigned)blocks, THREADS, shared, current_stream()>>>(
      dinp, (float *)partial.ptr, dout, inp, weight, rstd, N, C);
  WkStatus status = launch_status("rmsnorm backward");
  if (status == WK_OK) {
    rmsnorm_column_sums_kernel<<<blocks_for(C, THREADS), THREADS, 0, current_stream()>>>(dweight, (float *)partial.ptr,
                                                                                         blocks, C);
    status = launch_status("rmsnorm column sums");
  }
  scratch_free(&partial);
  return status;
}

extern "C" WkStatus cuda_rmsnorm_backward(WkDType dtype, void *dinp, float *dweight, const void *dout, const void *inp,
                                          const void *weight, const float *rstd, size_t N, size_t C) {
  if (N == 0 || C == 0) return WK_OK;
  STORAGE_DISPATCH(dtype, "rmsnorm_backward",
                   rmsnorm_backward((Storage *)dinp, dweight, (const Storage *)dout, (const Storage *)inp,
                                    (const Storage *)weight, rstd, N, C));
}
