/*
 * runtime/ops/cuda — the CUDA backend: kernels, cuBLAS calls and device queries.
 *
 * Compiled only when nvcc is found (make CUDA=0 skips it); then WK_HAVE_CUDA is defined for the
 * whole library. A build with CUDA still runs on a machine without a GPU or driver: every entry
 * point first asks wk_cuda_device_count(), which reports 0 rather than failing.
 */
#include <cuda_runtime.h>

#include "../../core/core.h"

extern "C" int wk_cuda_device_count(void) {
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
