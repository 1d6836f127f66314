/*
 * runtime/tensor/cuda — the device half of runtime/tensor, in the CUDA module: device queries and
 * the thread's device (here), the caching allocator and pinned host memory (memory.cu), copies (copy.cu), streams and
 * events (stream.cu). Kernels live in runtime/ops/cuda, in the same module.
 *
 * Compiled only when nvcc is found (make CUDA=0 skips it); then WK_HAVE_CUDA is defined for the
 * whole library. A build with CUDA still runs on a machine without a GPU or driver: the device
 * count below reports 0 rather than failing, and every entry that needs a device checks it first.
 */
#include "cuda.cuh"

extern "C" int cuda_device_count(void) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    /* No driver or no device is a normal state for a CPU machine: log at debug, report zero. */
    wk_logf(WK_LOG_DEBUG, "cudaGetDeviceCount: %s", cudaGetErrorString(err));
    cudaGetLastError(); /* clear the sticky error so later queries start clean */
    return 0;
  }
  return count;
}

extern "C" WkStatus cuda_set_device(int device) {
  WK_TRY(check_device(device));
  CUDA_TRY(cudaSetDevice(device));
  return WK_OK;
}
