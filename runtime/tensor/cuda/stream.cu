/*
 * stream.cu — CUDA streams (non-blocking, so they never wait for the legacy default stream) and
 * events (without timing). Handles cross the module boundary as void pointers.
 */
#include "cuda.cuh"

extern "C" WkStatus cuda_stream_new(int device, void **handle) {
  WK_TRY(check_device(device));
  DEVICE_GUARD(device);
  cudaStream_t s;
  CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  *handle = s;
  return WK_OK;
}

extern "C" void cuda_stream_free(void *handle) {
  cudaError_t err = cudaStreamDestroy((cudaStream_t)handle);
  if (err != cudaSuccess) wk_logf(WK_LOG_WARN, "cudaStreamDestroy: %s", cudaGetErrorString(err));
}

extern "C" WkStatus cuda_stream_synchronize(void *handle) {
  if (!handle && cuda_device_count() == 0) return WK_OK;  /* nothing can have been queued */
  CUDA_TRY(cudaStreamSynchronize((cudaStream_t)handle));
  return WK_OK;
}

extern "C" WkStatus cuda_device_synchronize(int device) {
  WK_TRY(check_device(device));
  DEVICE_GUARD(device);
  CUDA_TRY(cudaDeviceSynchronize());
  return WK_OK;
}

extern "C" WkStatus cuda_event_new(int device, void **handle) {
  WK_TRY(check_device(device));
  DEVICE_GUARD(device);
  cudaEvent_t e;
  CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  *handle = e;
  return WK_OK;
}

extern "C" void cuda_event_free(void *handle) {
  cudaError_t err = cudaEventDestroy((cudaEvent_t)handle);
  if (err != cudaSuccess) wk_logf(WK_LOG_WARN, "cudaEventDestroy: %s", cudaGetErrorString(err));
}

extern "C" WkStatus cuda_event_record(void *event, void *stream) {
  CUDA_TRY(cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream));
  return WK_OK;
}

extern "C" WkStatus cuda_event_synchronize(void *event) {
  CUDA_TRY(cudaEventSynchronize((cudaEvent_t)event));
  return WK_OK;
}

extern "C" WkStatus cuda_stream_wait_event(void *stream, void *event) {
  CUDA_TRY(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0));
  return WK_OK;
}
