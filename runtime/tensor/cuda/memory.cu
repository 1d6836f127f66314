/*
 * memory.cu — the CUDA caching allocator and pinned host memory.
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

#include "cuda.cuh"

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
  WK_TRY(check_device(device));
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

extern "C" WkStatus cuda_alloc(int device, size_t bytes, void **out, size_t *reserved) {
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

extern "C" void cuda_release(int device, void *ptr, size_t reserved) {
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

extern "C" void cuda_allocator_stats(int device, WkAllocatorStats *out) {
  DeviceCache *c;
  if (cache_for(device, &c) != WK_OK) return;
  pthread_mutex_lock(&c->lock);
  *out = c->stats;
  pthread_mutex_unlock(&c->lock);
}

extern "C" WkStatus cuda_empty_cache(int device) {
  DeviceCache *c;
  WK_TRY(cache_for(device, &c));
  CUDA_TRY(cudaDeviceSynchronize());  /* no queued kernel may still use a cached block */
  pthread_mutex_lock(&c->lock);
  WkStatus status = release_cached(c);
  pthread_mutex_unlock(&c->lock);
  return status;
}

extern "C" WkStatus cuda_host_alloc(size_t bytes, void **out) {
  CUDA_TRY(cudaHostAlloc(out, bytes ? bytes : 1, cudaHostAllocPortable));
  return WK_OK;
}

extern "C" void cuda_host_free(void *ptr) {
  cudaError_t err = cudaFreeHost(ptr);
  if (err != cudaSuccess) wk_logf(WK_LOG_WARN, "cudaFreeHost: %s", cudaGetErrorString(err));
}
