/*
 * common.cuh — what every CUDA file of runtime/ops/cuda shares: checked calls that turn CUDA and
 * cuBLAS errors into WkStatus with the decoded message and call site, the current stream, launch
 * sizes, and warp reductions.
 */
#ifndef WK_CUDA_COMMON_CUH
#define WK_CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "../ops.h"

enum { THREADS = 256, WARP = 32, WARPS_PER_BLOCK = THREADS / WARP };

#define CUDA_TRY(call)                                                                        \
  do {                                                                                        \
    cudaError_t cuda_err_ = (call);                                                           \
    if (cuda_err_ != cudaSuccess)                                                             \
      return WK_FAIL(WK_ERR_DEVICE, "%s: %s (%s)", #call, cudaGetErrorString(cuda_err_),      \
                     cudaGetErrorName(cuda_err_));                                            \
  } while (0)

#define CUBLAS_TRY(call)                                                                      \
  do {                                                                                        \
    cublasStatus_t cublas_err_ = (call);                                                      \
    if (cublas_err_ != CUBLAS_STATUS_SUCCESS)                                                 \
      return WK_FAIL(WK_ERR_DEVICE, "%s: %s", #call, cublasGetStatusString(cublas_err_));     \
  } while (0)

/* After a kernel launch: reports a bad configuration or an earlier asynchronous fault. */
#define LAUNCH_CHECK() CUDA_TRY(cudaGetLastError())

static inline cudaStream_t current_stream(void) {
  WkStream *s = wk_stream_current();
  return s && s->device == WK_DEVICE_CUDA ? (cudaStream_t)s->handle : (cudaStream_t)0;
}

static inline unsigned blocks_for(size_t n, unsigned per_block) {
  size_t blocks = (n + per_block - 1) / per_block;
  const size_t limit = 65535u * 16u;  /* grid-stride loops cover the rest */
  return (unsigned)(blocks == 0 ? 1 : blocks < limit ? blocks : limit);
}

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
  WK_TRY(wk_cuda_alloc(s->device, bytes, &s->ptr, &s->reserved));
  CUDA_TRY(cudaMemsetAsync(s->ptr, 0, bytes, current_stream()));
  return WK_OK;
}

/* Copies the scalar to the host (waiting for the stream) and releases it. */
static inline WkStatus scalar_read(DeviceScalar *s, void *out, size_t bytes) {
  cudaError_t err = cudaMemcpyAsync(out, s->ptr, bytes, cudaMemcpyDeviceToHost, current_stream());
  if (err == cudaSuccess) err = cudaStreamSynchronize(current_stream());
  wk_cuda_release(s->device, s->ptr, s->reserved);
  if (err != cudaSuccess) return WK_FAIL(WK_ERR_DEVICE, "reading a device scalar: %s", cudaGetErrorString(err));
  return WK_OK;
}

#endif /* WK_CUDA_COMMON_CUH */
