/*
 * runtime/ops/cuda — the ops half of the CUDA module: one file per CPU counterpart in runtime/ops/cpu
 * (elementwise.cu, layers.cu, attention.cu, loss.cu; rmsnorm.cu, rope.cu, swiglu.cu, qkv_pack.cu,
 * attention_cached.cu for the Llama family) and the cuBLAS matmuls (blas.cu), entered through the
 * kernels' table (runtime/ops/cuda_ops.h) after ops.c checked the arguments. Index checks
 * (embedding, targets) mark a step's status in device memory (WkStepStatus, read by ops.c once a
 * step or once a call), so bad tokens fail with the CPU's message. The design and cost of each
 * kernel: docs/gpu.md.
 *
 * common.cuh — what the kernel files of runtime/ops/cuda share beyond runtime/tensor/cuda/cuda.cuh
 * (checked calls, the current stream, launch sizes): checked cuBLAS calls, warp reductions, launch
 * and loop shapes, device scratch scalars (a sum) read back by the host, and bad-index marks.
 */
#ifndef WK_CUDA_COMMON_CUH
#define WK_CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../../tensor/cuda/cuda.cuh"
#include "../ops.h"

enum { WARP = 32, WARPS_PER_BLOCK = THREADS / WARP };

#define CUBLAS_TRY(call)                                                                      \
  do {                                                                                        \
    cublasStatus_t cublas_err_ = (call);                                                      \
    if (cublas_err_ != CUBLAS_STATUS_SUCCESS)                                                 \
      return WK_FAIL(WK_ERR_DEVICE, "%s: %s", #call, cublasGetStatusString(cublas_err_));     \
  } while (0)

__device__ inline float warp_sum(float v) {
  for (int offset = WARP / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ inline float warp_max(float v) {
  for (int offset = WARP / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

/* Device scratch from the caching allocator (stream-ordered: freeing it after queuing the kernels
 * that use it is safe), and scalar results (a sum) made in it and read back. */
struct DeviceScratch {
  void *ptr;
  size_t reserved;
  int device;
};

static inline WkStatus scratch_new(DeviceScratch *s, size_t bytes) {
  CUDA_TRY(cudaGetDevice(&s->device));
  return cuda_alloc(s->device, bytes, &s->ptr, &s->reserved);
}

static inline void scratch_free(DeviceScratch *s) { cuda_release(s->device, s->ptr); }

/* Scratch for a scalar, zeroed on the current stream. */
static inline WkStatus scalar_new(DeviceScratch *s, size_t bytes) {
  WK_TRY(scratch_new(s, bytes));
  cudaError_t err = cudaMemsetAsync(s->ptr, 0, bytes, current_stream());
  if (err == cudaSuccess) return WK_OK;
  scratch_free(s);
  return WK_FAIL(WK_ERR_DEVICE, "zeroing a device scalar: %s", cudaGetErrorString(err));
}

/* Copies the scalar to the host (waiting for the stream) and releases it. */
static inline WkStatus scalar_read(DeviceScratch *s, void *out, size_t bytes) {
  cudaError_t err = cudaMemcpyAsync(out, s->ptr, bytes, cudaMemcpyDeviceToHost, current_stream());
  if (err == cudaSuccess) err = cudaStreamSynchronize(current_stream());
  scratch_free(s);
  if (err != cudaSuccess) return WK_FAIL(WK_ERR_DEVICE, "reading a device scalar: %s", cudaGetErrorString(err));
  return WK_OK;
}

/* After a launch, where scratch must be freed on the way out (LAUNCH_CHECK would return at once). */
static inline WkStatus launch_status(const char *what) {
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return WK_OK;
  return WK_FAIL(WK_ERR_DEVICE, "%s kernel: %s", what, cudaGetErrorString(err));
}

/* *out (device memory) += the sum of x[0..n) (of their squares if squares), deterministic: block
 * partials, then one block adds them in order (elementwise.cu). */
WkStatus device_sum(double *out, const float *x, size_t n, bool squares);

/* ---- storage types: kernels store f32, bf16 or f16 and compute in f32 (as llm.c's floatX) ------- */

__device__ inline float to_float(float x) { return x; }
__device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline float to_float(__half x) { return __half2float(x); }

template <typename Storage> __device__ inline Storage from_float(float x);
template <> __device__ inline float from_float<float>(float x) { return x; }
template <> __device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ inline __half from_float<__half>(float x) { return __float2half_rn(x); }

/* sum[i] = a[i] + b[i], the f32 sum rounded once on the store (add's rule, the CPU's stored_add), and
 * the value stored, as f32: the fused residual norms share it so that their sum is add's to the bit. */
template <typename Storage>
__device__ inline float stored_add(Storage *sum, const Storage *a, const Storage *b, size_t i) {
  Storage s = from_float<Storage>(to_float(a[i]) + to_float(b[i]));
  sum[i] = s;
  return to_float(s);
}

/* Element i of a norm's input on the first pass over its row: a[i], or with a residual b the sum
 * a + b rounded into sum (stored_add). The later passes read the row from sum (or a). */
template <typename Storage>
__device__ inline float norm_input(Storage *sum, const Storage *a, const Storage *b, size_t i) {
  return b ? stored_add(sum, a, b, i) : to_float(a[i]);
}

/* Returns call with `Storage` the C++ type of dtype; what names the op for the error. */
#define STORAGE_DISPATCH(dtype, what, call)                                                                \
  switch (dtype) {                                                                                         \
    case WK_F32: { typedef float Storage; return call; }                                                   \
    case WK_BF16: { typedef __nv_bfloat16 Storage; return call; }                                          \
    case WK_F16: { typedef __half Storage; return call; }                                                  \
    default: return WK_FAIL(WK_ERR_INVALID_ARG, "%s: %s tensors have no CUDA kernel", what, wk_dtype_name(dtype)); \
  }

/* d[i] = gelu'(pre[i]) * d[i] over n elements of dtype, in place (elementwise.cu): the GELU backward of
 * blas.cu's matmul where cuBLASLt has no DGELU epilogue for it. */
WkStatus gelu_derivative_times(WkDType dtype, void *d, const void *pre, size_t n);

/* ---- cuBLAS (blas.cu) ---------------------------------------------------------------------------- */

/* The cuBLAS handle of the current device (made on first use), bound to the current stream. */
WkStatus cublas_for_current_device(cublasHandle_t *out);

/* One operand of a strided batch of products: row-major, of dtype f32, bf16 or f16, ld elements from
 * one row to the next and stride elements from one item of the batch to the next. */
struct BatchOperand {
  const void *data;
  WkDType dtype;
  size_t ld, stride;
};

/* The output of a strided batch of products, laid out as an operand is. */
struct BatchOutput {
  void *data;
  WkDType dtype;
  size_t ld, stride;
};

/* C[i] = alpha op(A[i]) op(B[i]) + beta C[i] for i < batch, in row-major terms (the CPU reference's
 * cblas calls, word for word), the arithmetic fp32: A and B share a dtype, f32 (no TF32), or bf16 /
 * f16 on the tensor cores, whose products of 16-bit values are exact in f32 and summed in f32, as
 * the CPU sums the same values widened; C is f32 or A's dtype, rounded once on the store. */
WkStatus gemm_strided_batched(cublasHandle_t handle, size_t batch, bool trans_a, bool trans_b, size_t M, size_t N,
                              size_t K, float alpha, BatchOperand A, BatchOperand B, float beta, BatchOutput C);

/* The WkDType of a storage type. */
template <typename Storage> constexpr WkDType storage_dtype();
template <> constexpr WkDType storage_dtype<float>() { return WK_F32; }
template <> constexpr WkDType storage_dtype<__nv_bfloat16>() { return WK_BF16; }
template <> constexpr WkDType storage_dtype<__half>() { return WK_F16; }

#define GRID_STRIDE(i, n) \
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

#define LAUNCH(kernel, n, ...)                                                            \
  do {                                                                                    \
    kernel<<<blocks_for((n), THREADS), THREADS, 0, current_stream()>>>(__VA_ARGS__);      \
    LAUNCH_CHECK();                                                                       \
  } while (0)

/* One warp per row: blocks of WARPS_PER_BLOCK rows. */
#define LAUNCH_ROWS(kernel, rows, ...)                                                             \
  do {                                                                                             \
    kernel<<<blocks_for((rows), WARPS_PER_BLOCK), THREADS, 0, current_stream()>>>(__VA_ARGS__);    \
    LAUNCH_CHECK();                                                                                \
  } while (0)

/* The rows of a warp, grid-stride: past blocks_for's cap of 1,048,560 blocks (8.4M rows) a warp
 * takes rows a grid apart. The loop is warp-uniform, so the warp's shuffles stay converged. */
#define ROW_LOOP(n, N)                                                                      \
  for (size_t n = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / WARP; n < (N);         \
       n += (size_t)gridDim.x * blockDim.x / WARP)
__device__ static inline unsigned lane(void) { return threadIdx.x % WARP; }

/* The sum (or the max) of v over a block of THREADS threads, returned to all of them; every thread of
 * the block must call it. */
__device__ inline float block_reduce(float v, bool max) {
  __shared__ float per_warp[WARPS_PER_BLOCK];
  v = max ? warp_max(v) : warp_sum(v);
  __syncthreads();  /* the previous call's readers are done with per_warp */
  if (lane() == 0) per_warp[threadIdx.x / WARP] = v;
  __syncthreads();
  float total = per_warp[0];
  for (int w = 1; w < WARPS_PER_BLOCK; w++) total = max ? fmaxf(total, per_warp[w]) : total + per_warp[w];
  return total;
}
__device__ inline float block_sum(float v) { return block_reduce(v, false); }
__device__ inline float block_max(float v) { return block_reduce(v, true); }

/* Marks element n's bad id in a step's status (device memory): the first bad element wins
 * (wk_bad_mark), and limit is the vocabulary it was checked against. */
__device__ inline void mark_bad_id(unsigned long long *mark, int64_t *limit, size_t n, int32_t id, size_t V) {
  atomicMax(mark, (unsigned long long)wk_bad_mark(n, id));
  *limit = (int64_t)V;  /* every writer writes the same value */
}

#endif /* WK_CUDA_COMMON_CUH */
