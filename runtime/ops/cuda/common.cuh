/*
 * runtime/ops/cuda — the ops half of the CUDA module: one file per CPU counterpart in runtime/ops/cpu
 * (elementwise.cu, layers.cu, attention.cu, loss.cu) and the cuBLAS matmuls (blas.cu), entered through
 * the kernels' table (runtime/ops/cuda_ops.h) after ops.c checked the arguments. Index checks
 * (embedding, targets) raise a device flag that is read back, so bad tokens fail with the same
 * message class as on the CPU.
 *
 * common.cuh — what the kernel files of runtime/ops/cuda share beyond runtime/tensor/cuda/cuda.cuh
 * (checked calls, the current stream, launch sizes): checked cuBLAS calls, warp reductions, launch
 * and loop shapes, and device scratch scalars (a sum, a bad-index flag) read back by the host.
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

/* Scratch device memory for a scalar result (a loss sum, a flag), from the caching allocator. */
struct DeviceScalar {
  void *ptr;
  size_t reserved;
  int device;
};

static inline WkStatus scalar_new(DeviceScalar *s, size_t bytes) {
  CUDA_TRY(cudaGetDevice(&s->device));
  WK_TRY(cuda_alloc(s->device, bytes, &s->ptr, &s->reserved));
  CUDA_TRY(cudaMemsetAsync(s->ptr, 0, bytes, current_stream()));
  return WK_OK;
}

/* Copies the scalar to the host (waiting for the stream) and releases it. */
static inline WkStatus scalar_read(DeviceScalar *s, void *out, size_t bytes) {
  cudaError_t err = cudaMemcpyAsync(out, s->ptr, bytes, cudaMemcpyDeviceToHost, current_stream());
  if (err == cudaSuccess) err = cudaStreamSynchronize(current_stream());
  cuda_release(s->device, s->ptr);
  if (err != cudaSuccess) return WK_FAIL(WK_ERR_DEVICE, "reading a device scalar: %s", cudaGetErrorString(err));
  return WK_OK;
}

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

/* Reads a flag a kernel raised for an index outside the vocabulary and turns it into an error. */
static inline WkStatus check_flag(DeviceScalar *flag, const char *what) {
  int bad = 0;
  WK_TRY(scalar_read(flag, &bad, sizeof bad));
  if (bad) return WK_FAIL(WK_ERR_INVALID_ARG, "%s: an index is outside the vocabulary (tokenizer and model vocab disagree?)", what);
  return WK_OK;
}

#endif /* WK_CUDA_COMMON_CUH */
