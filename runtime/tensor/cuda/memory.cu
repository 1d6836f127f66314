/*
 * memory.cu — the CUDA caching allocator and pinned host memory.
 *
 * Caching: a freed block goes to its device's cache instead of cudaFree, and the next request of a
 * similar size takes it back, so after the first training step cudaMalloc is no longer called
 * (WkAllocatorStats.device_allocs stops growing). Which block may serve which stream is
 * runtime/tensor/block_cache.c's bookkeeping (a block freed while another stream may still use it
 * waits for that stream's event); here are its device calls: cudaMalloc and cudaFree on the
 * cache's own device, and events. One cache per device.
 */
#include <pthread.h>
#include <stdint.h>

#include "../block_cache.h"
#include "cuda.cuh"

static WkBlockCache caches[MAX_DEVICES];
static pthread_once_t caches_once = PTHREAD_ONCE_INIT;

static int device_of(void *ctx) { return (int)(intptr_t)ctx; }

static WkStatus device_malloc(void *ctx, size_t bytes, void **out) {
  int device = device_of(ctx);
  DEVICE_GUARD(device);
  cudaError_t err = cudaMalloc(out, bytes);
  if (err == cudaSuccess) return WK_OK;
  cudaGetLastError();  /* an allocation failure is not sticky: clear it for the retry */
  WkAllocatorStats stats = caches[device].stats;  /* the cache's lock is held by our caller */
  return WK_FAIL(err == cudaErrorMemoryAllocation ? WK_ERR_NOMEM : WK_ERR_DEVICE,
                 "cudaMalloc of %zu bytes on cuda:%d: %s (%llu bytes in use; lower the micro-batch)", bytes, device,
                 cudaGetErrorString(err), (unsigned long long)stats.bytes_in_use);
}

static void device_free(void *ctx, void *ptr) {
  DeviceGuard guard(device_of(ctx));
  cudaError_t err = guard.status == cudaSuccess ? cudaFree(ptr) : guard.status;
  if (err != cudaSuccess) wk_logf(WK_LOG_WARN, "cudaFree on cuda:%d: %s", device_of(ctx), cudaGetErrorString(err));
}

static WkStatus device_event_record(void *ctx, void *stream, void **event) {
  DEVICE_GUARD(device_of(ctx));
  cudaEvent_t e;
  CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  cudaError_t err = cudaEventRecord(e, (cudaStream_t)stream);
  if (err != cudaSuccess) {
    cudaEventDestroy(e);
    return WK_FAIL(WK_ERR_DEVICE, "cudaEventRecord: %s", cudaGetErrorString(err));
  }
  *event = e;
  return WK_OK;
}

/* An event whose query fails reads as done: the error surfaces at the next synchronising call. */
static bool device_event_done(void *ctx, void *event) {
  cudaError_t err = cudaEventQuery((cudaEvent_t)event);
  if (err == cudaErrorNotReady) return false;
  if (err != cudaSuccess) cudaGetLastError();
  return true;
}

static WkStatus device_event_synchronize(void *ctx, void *event) {
  CUDA_TRY(cudaEventSynchronize((cudaEvent_t)event));
  return WK_OK;
}

static void device_event_free(void *ctx, void *event) {
  cudaError_t err = cudaEventDestroy((cudaEvent_t)event);
  if (err != cudaSuccess) wk_logf(WK_LOG_WARN, "cudaEventDestroy: %s", cudaGetErrorString(err));
}

static void init_caches(void) {
  for (int d = 0; d < MAX_DEVICES; d++) {
    WkBlockDevice ops = {(void *)(intptr_t)d,  device_malloc,           device_free,      device_event_record,
                         device_event_done, device_event_synchronize, device_event_free};
    wk_block_cache_init(&caches[d], &ops);
  }
}

static WkStatus cache_for(int device, WkBlockCache **out) {
  WK_TRY(check_device(device));
  pthread_once(&caches_once, init_caches);
  *out = &caches[device];
  return WK_OK;
}

extern "C" WkStatus cuda_alloc(int device, size_t bytes, void **out, size_t *reserved) {
  WkBlockCache *c;
  WK_TRY(cache_for(device, &c));
  return wk_block_cache_alloc(c, bytes, current_stream(), out, reserved);
}

extern "C" WkStatus cuda_record_stream(int device, void *ptr, void *stream) {
  WkBlockCache *c;
  WK_TRY(cache_for(device, &c));
  return wk_block_cache_record_stream(c, ptr, stream);
}

extern "C" void cuda_release(int device, void *ptr) {
  WkBlockCache *c;
  if (ptr && cache_for(device, &c) == WK_OK) wk_block_cache_release(c, ptr);
}

extern "C" void cuda_allocator_stats(int device, WkAllocatorStats *out) {
  WkBlockCache *c;
  if (cache_for(device, &c) == WK_OK) wk_block_cache_stats(c, out);
}

extern "C" void cuda_reset_peak(int device) {
  WkBlockCache *c;
  if (cache_for(device, &c) == WK_OK) wk_block_cache_reset_peak(c);
}

/* Only this device's cache, after the streams that used its blocks are done with them. */
extern "C" WkStatus cuda_empty_cache(int device) {
  WkBlockCache *c;
  WK_TRY(cache_for(device, &c));
  return wk_block_cache_empty(c);
}

extern "C" WkStatus cuda_host_alloc(size_t bytes, void **out) {
  CUDA_TRY(cudaHostAlloc(out, bytes ? bytes : 1, cudaHostAllocPortable));
  return WK_OK;
}

extern "C" void cuda_host_free(void *ptr) {
  cudaError_t err = cudaFreeHost(ptr);
  if (err != cudaSuccess) wk_logf(WK_LOG_WARN, "cudaFreeHost: %s", cudaGetErrorString(err));
}
