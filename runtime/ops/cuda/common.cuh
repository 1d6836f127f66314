/*
 * common.cuh — what the kernel files of runtime/ops/cuda share beyond runtime/tensor/cuda/cuda.cuh
 * (checked calls, the current stream, launch sizes): checked cuBLAS calls, warp reductions, and
 * device scratch scalars for results read back by the host.
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

#endif /* WK_CUDA_COMMON_CUH */
