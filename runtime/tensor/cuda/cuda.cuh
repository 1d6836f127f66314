/*
 * cuda.cuh — what every CUDA file of the module shares (runtime/tensor/cuda and runtime/ops/cuda):
 * checked CUDA calls that turn an error into a WkStatus with the decoded message and the call site,
 * the device-index check, the calling thread's current stream, a guard for work on another device,
 * and launch sizes.
 */
#ifndef WK_TENSOR_CUDA_CUH
#define WK_TENSOR_CUDA_CUH

#include <cuda_runtime.h>

#include "../cuda_module.h"

enum { THREADS = 256 };
enum { MAX_DEVICES = WK_MAX_DEVICES };

#define CUDA_TRY(call)                                                                        \
  do {                                                                                        \
    cudaError_t cuda_err_ = (call);                                                           \
    if (cuda_err_ != cudaSuccess)                                                             \
      return WK_FAIL(WK_ERR_DEVICE, "%s: %s (%s)", #call, cudaGetErrorString(cuda_err_),      \
                     cudaGetErrorName(cuda_err_));                                            \
  } while (0)

/* After a kernel launch: reports a bad configuration or an earlier asynchronous fault. */
#define LAUNCH_CHECK() CUDA_TRY(cudaGetLastError())

/* A device index this machine has (and the module keeps state for). */
static inline WkStatus check_device(int device) {
  if (device < 0 || device >= MAX_DEVICES)
    return WK_FAIL(WK_ERR_INVALID_ARG, "cuda:%d: device index out of range 0..%d", device, MAX_DEVICES - 1);
  int count = cuda_device_count();
  if (device >= count)
    return WK_FAIL(WK_ERR_UNSUPPORTED, "cuda:%d: this machine has %d CUDA device(s)%s", device, count,
                   count == 0 ? " (no GPU or no driver; use device 'cpu')" : "");
  return WK_OK;
}

/* The calling thread's current stream on its current device (the one its entry point entered). */
static inline cudaStream_t current_stream(void) {
  WkStream *s = wk_stream_current_on(wk_cuda_current_device());
  return s ? (cudaStream_t)s->handle : (cudaStream_t)0;
}

/* Work on another device than the thread's (a free from any thread, a loader's copy stream): sets
 * it for the guard's scope and restores the thread's device after, so only wk_cuda_enter moves it. */
struct DeviceGuard {
  int saved = -1;
  cudaError_t status;
  explicit DeviceGuard(int device) {
    status = cudaGetDevice(&saved);
    if (status == cudaSuccess && saved != device) status = cudaSetDevice(device);
    else saved = -1;
  }
  ~DeviceGuard() {
    cudaError_t err = saved >= 0 ? cudaSetDevice(saved) : cudaSuccess;
    if (err != cudaSuccess) wk_logf(WK_LOG_WARN, "restoring cuda:%d: %s", saved, cudaGetErrorString(err));
  }
  DeviceGuard(const DeviceGuard &) = delete;
  DeviceGuard &operator=(const DeviceGuard &) = delete;
};
#define DEVICE_GUARD(device)        \
  DeviceGuard device_guard_(device); \
  CUDA_TRY(device_guard_.status)

static inline unsigned blocks_for(size_t n, unsigned per_block) {
  size_t blocks = (n + per_block - 1) / per_block;
  const size_t limit = 65535u * 16u;  /* grid-stride loops cover the rest */
  return (unsigned)(blocks == 0 ? 1 : blocks < limit ? blocks : limit);
}

#endif /* WK_TENSOR_CUDA_CUH */
