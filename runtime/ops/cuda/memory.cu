/*
 * memory.cu — the CUDA caching allocator, pinned host memory, streams, events and device copies.
 *
 * Caching: a freed block goes to its device's free list instead of cudaFree, and the next request
 * of a similar size takes it back, so after the first training step cudaMalloc is no longer called
 * (WkAllocatorStats.device_allocs stops growing). Requests round up to 512 B, or to 2 MiB from
 * 1 MiB on, and take the smallest cached block that is at most twice their size. Reuse is safe
 * without events because all ops of a device run on one stream in order; memory handed to another
 * stream (a copy stream) must be synchronised before it is freed. A failed cudaMalloc empties the
 * cache and retries once.
 */
#include <pthread.h>
#include <stdlib.h>

#include "common.cuh"

enum { MAX_DEVICES = 16 };
static const size_t SMALL_ROUND = 512, LARGE_ROUND = 2u << 20, LARGE_FROM = 1u << 20;

struct Block {
  void *ptr;
  size_t size;
};

struct DeviceCache {
  pthread_mutex_t lock;
  Block *free_blocks;
  size_t count, capacity;
  WkAllocatorStats stats;
};

static DeviceCache caches[MAX_DEVICES] = {};
static pthread_once_t caches_once = PTHREAD_ONCE_INIT;

static void init_caches(void) {
  for (int d = 0; d < MAX_DEVICES; d++) pthread_mutex_init(&caches[d].lock, NULL);
}

static size_t round_size(size_t bytes) {
  size_t unit = bytes >= LARGE_FROM ? LARGE_ROUND : SMALL_ROUND;
  return (bytes + unit - 1) / unit * unit + (bytes == 0 ? unit : 0);
}

static WkStatus cache_for(int device, DeviceCache **out) {
  if (device < 0 || device >= MAX_DEVICES)
    return WK_FAIL(WK_ERR_INVALID_ARG, "cuda:%d: device index out of range 0..%d", device, MAX_DEVICES - 1);
  int count = wk_cuda_device_count();
  if (device >= count)
    return WK_FAIL(WK_ERR_UNSUPPORTED, "cuda:%d: this machine has %d CUDA device(s)%s", device, count,
                   count == 0 ? " (no GPU or no driver; use device 'cpu')" : "");
  pthread_once(&caches_once, init_caches);
  *out = &caches[device];
  return WK_OK;
}

/* Takes the smallest cached block in [size, 2 * size]; lock held. */
static bool take_cached(DeviceCache *c, size_t size, Block *out) {
  size_t best = c->count;
  for (size_t i = 0; i < c->count; i++) {
    size_t s = c->free_blocks[i].size;
    if (s >= size && s <= 2 * size && (best == c->count || s < c->free_blocks[best].size)) best = i;
  }
  if (best == c->count) return false;
  *out = c->free_blocks[best];
  c->free_blocks[best] = c->free_blocks[--c->count];
  return true;
}

/* Returns every cached block of c to the driver; lock held. */
static WkStatus release_cached(DeviceCache *c) {
  WkStatus status = WK_OK;
  for (size_t i = 0; i < c->count; i++) {
    cudaError_t err = cudaFree(c->free_blocks[i].ptr);
    if (err != cudaSuccess) status = WK_FAIL(WK_ERR_DEVICE, "cudaFree: %s", cudaGetErrorString(err));
    c->stats.bytes_cached -= c->free_blocks[i].size;
  }
  c->count = 0;
  return status;
}

static WkStatus alloc_locked(DeviceCache *c, int device, size_t size, Block *out) {
  if (take_cached(c, size, out)) {
    c->stats.cache_hits++;
    c->stats.bytes_cached -= out->size;
    return WK_OK;
  }
  CUDA_TRY(cudaSetDevice(device));
  cudaError_t err = cudaMalloc(&out->ptr, size);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    WK_TRY(release_cached(c));
    err = cudaMalloc(&out->ptr, size);
  }
  if (err != cudaSuccess)
    return WK_FAIL(err == cudaErrorMemoryAllocation ? WK_ERR_NOMEM : WK_ERR_DEVICE,
                   "cudaMalloc of %zu bytes on cuda:%d: %s (%llu bytes in use; lower the micro-batch)", size,
                   device, cudaGetErrorString(err), (unsigned long long)c->stats.bytes_in_use);
  out->size = size;
  c->stats.device_allocs++;
  return WK_OK;
}

extern "C" WkStatus wk_cuda_alloc(int device, size_t bytes, void **out, size_t *reserved) {
  DeviceCache *c;
  WK_TRY(cache_for(device, &c));
  Block block;
  pthread_mutex_lock(&c->lock);
  WkStatus status = alloc_locked(c, device, round_size(bytes), &block);
  if (status == WK_OK) c->stats.bytes_in_use += block.size;
  pthread_mutex_unlock(&c->lock);
  if (status != WK_OK) return status;
  *out = block.ptr;
  *reserved = block.size;
  return WK_OK;
}

extern "C" void wk_cuda_release(int device, void *ptr, size_t reserved) {
  DeviceCache *c;
  if (!ptr || cache_for(device, &c) != WK_OK) return;
  pthread_mutex_lock(&c->lock);
  if (c->count == c->capacity) {
    size_t capacity = c->capacity ? 2 * c->capacity : 64;
    Block *grown = (Block *)realloc(c->free_blocks, capacity * sizeof *grown);
    if (!grown) {  /* cannot remember it: give it back instead */
      pthread_mutex_unlock(&c->lock);
      cudaFree(ptr);
      return;
    }
    c->free_blocks = grown;
    c->capacity = capacity;
  }
  c->free_blocks[c->count++] = Block{ptr, reserved};
  c->stats.bytes_in_use -= reserved;
  c->stats.bytes_cached += reserved;
  pthread_mutex_unlock(&c->lock);
}

extern "C" void wk_cuda_allocator_stats(int device, WkAllocatorStats *out) {
  DeviceCache *c;
  if (cache_for(device, &c) != WK_OK) return;
  pthread_mutex_lock(&c->lock);
  *out = c->stats;
  pthread_mutex_unlock(&c->lock);
}

extern "C" WkStatus wk_cuda_empty_cache(int device) {
  DeviceCache *c;
  WK_TRY(cache_for(device, &c));
  CUDA_TRY(cudaDeviceSynchronize());  /* no queued kernel may still use a cached block */
  pthread_mutex_lock(&c->lock);
  WkStatus status = release_cached(c);
  pthread_mutex_unlock(&c->lock);
  return status;
}

extern "C" WkStatus wk_cuda_host_alloc(size_t bytes, void **out) {
  CUDA_TRY(cudaHostAlloc(out, bytes ? bytes : 1, cudaHostAllocPortable));
  return WK_OK;
}

extern "C" void wk_cuda_host_free(void *ptr) {
  cudaError_t err = cudaFreeHost(ptr);
  if (err != cudaSuccess) wk_logf(WK_LOG_WARN, "cudaFreeHost: %s", cudaGetErrorString(err));
}

/* ---- copies ------------------------------------------------------------------------------------ */

extern "C" WkStatus wk_cuda_memcpy(void *dst, const void *src, size_t bytes, WkStream *stream) {
  cudaStream_t s = stream && stream->device == WK_DEVICE_CUDA ? (cudaStream_t)stream->handle : current_stream();
  if (bytes) CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
  return WK_OK;
}

struct Layout {
  int ndim;
  int64_t offset;
  int64_t shape[WK_MAX_DIMS];
  int64_t strides[WK_MAX_DIMS];
};

__device__ static double load_any(const void *base, WkDType dtype, int64_t i) {
  switch (dtype) {
    case WK_F32: return ((const float *)base)[i];
    case WK_BF16: return __bfloat162float(((const __nv_bfloat16 *)base)[i]);
    case WK_F16: return __half2float(((const __half *)base)[i]);
    case WK_I32: return ((const int32_t *)base)[i];
    case WK_I64: return (double)((const int64_t *)base)[i];
    case WK_U16: return ((const uint16_t *)base)[i];
    case WK_U8: return ((const uint8_t *)base)[i];
    default: return 0.0;
  }
}

__device__ static void store_any(void *base, WkDType dtype, int64_t i, double v) {
  switch (dtype) {
    case WK_F32: ((float *)base)[i] = (float)v; break;
    case WK_BF16: ((__nv_bfloat16 *)base)[i] = __float2bfloat16_rn((float)v); break;
    case WK_F16: ((__half *)base)[i] = __float2half_rn((float)v); break;
    case WK_I32: ((int32_t *)base)[i] = (int32_t)v; break;
    case WK_I64: ((int64_t *)base)[i] = (int64_t)v; break;
    case WK_U16: ((uint16_t *)base)[i] = (uint16_t)v; break;
    case WK_U8: ((uint8_t *)base)[i] = (uint8_t)v; break;
    default: break;
  }
}

/* dst (contiguous) = src (any strides), converted; element i of dst is logical element i of src. */
__global__ static void copy_convert_kernel(void *dst, WkDType dst_dtype, const void *src, WkDType src_dtype,
                                           Layout layout, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t rest = i, at = layout.offset;
    for (int d = layout.ndim - 1; d >= 0; d--) {
      at += (rest % layout.shape[d]) * layout.strides[d];
      rest /= layout.shape[d];
    }
    store_any(dst, dst_dtype, i, load_any(src, src_dtype, at));
  }
}

extern "C" WkStatus wk_cuda_copy_convert(WkTensor *dst, const WkTensor *src) {
  Layout layout = {};
  layout.ndim = src->ndim;
  layout.offset = src->offset;
  for (int d = 0; d < src->ndim; d++) {
    layout.shape[d] = src->shape[d];
    layout.strides[d] = src->strides[d];
  }
  int64_t n = wk_tensor_numel(dst);
  if (n == 0) return WK_OK;
  copy_convert_kernel<<<blocks_for((size_t)n, THREADS), THREADS, 0, current_stream()>>>(
      tensor_ptr(dst), dst->dtype, src->storage->data, src->dtype, layout, n);
  LAUNCH_CHECK();
  return WK_OK;
}

/* ---- streams and events ------------------------------------------------------------------------- */

extern "C" WkStatus wk_cuda_stream_new(int device, void **handle) {
  DeviceCache *c;
  WK_TRY(cache_for(device, &c));
  CUDA_TRY(cudaSetDevice(device));
  cudaStream_t s;
  CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  *handle = s;
  return WK_OK;
}

extern "C" void wk_cuda_stream_free(void *handle) {
  cudaError_t err = cudaStreamDestroy((cudaStream_t)handle);
  if (err != cudaSuccess) wk_logf(WK_LOG_WARN, "cudaStreamDestroy: %s", cudaGetErrorString(err));
}

extern "C" WkStatus wk_cuda_stream_synchronize(void *handle) {
  if (!handle && wk_cuda_device_count() == 0) return WK_OK;  /* nothing can have been queued */
  CUDA_TRY(cudaStreamSynchronize((cudaStream_t)handle));
  return WK_OK;
}

extern "C" WkStatus wk_cuda_device_synchronize(int device) {
  DeviceCache *c;
  WK_TRY(cache_for(device, &c));
  CUDA_TRY(cudaSetDevice(device));
  CUDA_TRY(cudaDeviceSynchronize());
  return WK_OK;
}

extern "C" WkStatus wk_cuda_event_new(int device, void **handle) {
  DeviceCache *c;
  WK_TRY(cache_for(device, &c));
  CUDA_TRY(cudaSetDevice(device));
  cudaEvent_t e;
  CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  *handle = e;
  return WK_OK;
}

extern "C" void wk_cuda_event_free(void *handle) {
  cudaError_t err = cudaEventDestroy((cudaEvent_t)handle);
  if (err != cudaSuccess) wk_logf(WK_LOG_WARN, "cudaEventDestroy: %s", cudaGetErrorString(err));
}

extern "C" WkStatus wk_cuda_event_record(void *event, void *stream) {
  CUDA_TRY(cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream));
  return WK_OK;
}

extern "C" WkStatus wk_cuda_event_synchronize(void *event) {
  CUDA_TRY(cudaEventSynchronize((cudaEvent_t)event));
  return WK_OK;
}

extern "C" WkStatus wk_cuda_stream_wait_event(void *stream, void *event) {
  CUDA_TRY(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0));
  return WK_OK;
}
