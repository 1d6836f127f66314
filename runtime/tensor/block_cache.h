/*
 * block_cache.h — the bookkeeping of the device caching allocator, with no CUDA in it: which freed
 * block may serve which request on which stream. The device's malloc, free and events come in
 * through WkBlockDevice, so runtime/tensor/cuda/memory.cu plugs in the CUDA runtime and
 * tests/c/test_block_cache.c a fake whose events it completes by hand.
 *
 * The rule is PyTorch's recordStream: a block remembers the stream it was allocated on and every
 * stream recorded as using it. When it is freed an event is recorded on each of them, and the block
 * serves a request on stream S only once every event on a stream other than S has completed (work
 * on S itself runs in order, so S may reuse it at once). A failed malloc returns the reusable blocks
 * to the device and retries once.
 */
#ifndef WK_TENSOR_BLOCK_CACHE_H
#define WK_TENSOR_BLOCK_CACHE_H

#include <pthread.h>

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { WK_BLOCK_STREAMS = 8 };  /* streams one block may be used on (its own included) */

/* A device's memory and events. A stream or an event is an opaque handle; NULL is the default stream. */
typedef struct {
  void *ctx;
  WkStatus (*malloc)(void *ctx, size_t bytes, void **out);  /* WK_ERR_NOMEM when the device is full */
  void (*free)(void *ctx, void *ptr);
  WkStatus (*event_record)(void *ctx, void *stream, void **event);  /* a new event, recorded on stream */
  bool (*event_done)(void *ctx, void *event);                       /* an event that fails reads as done */
  WkStatus (*event_synchronize)(void *ctx, void *event);
  void (*event_free)(void *ctx, void *event);
} WkBlockDevice;

typedef struct WkBlock WkBlock;

typedef struct {
  pthread_mutex_t lock;
  WkBlockDevice device;
  WkBlock *live;    /* handed out */
  WkBlock *cached;  /* freed, kept for reuse */
  size_t live_count, live_capacity, cached_count, cached_capacity;
  WkAllocatorStats stats;
} WkBlockCache;

WK_INTERNAL_EXPORT void wk_block_cache_init(WkBlockCache *c, const WkBlockDevice *device);
/* Gives every block back (live ones too: the device is going away); the cache can be initialised again. */
WK_INTERNAL_EXPORT void wk_block_cache_destroy(WkBlockCache *c);
/* A block of at least bytes for work on stream; *reserved receives its size. */
WK_INTERNAL_EXPORT WkStatus wk_block_cache_alloc(WkBlockCache *c, size_t bytes, void *stream, void **out,
                                                 size_t *reserved);
/* Work on stream uses the live block at ptr (a copy on another stream, a collective's stream). */
WK_INTERNAL_EXPORT WkStatus wk_block_cache_record_stream(WkBlockCache *c, void *ptr, void *stream);
/* The live block at ptr is no longer referenced; queued work on its streams may still use it. */
WK_INTERNAL_EXPORT void wk_block_cache_release(WkBlockCache *c, void *ptr);
/* Waits for the cached blocks' streams, then returns every cached block to the device. */
WK_INTERNAL_EXPORT WkStatus wk_block_cache_empty(WkBlockCache *c);
WK_INTERNAL_EXPORT void wk_block_cache_stats(WkBlockCache *c, WkAllocatorStats *out);
WK_INTERNAL_EXPORT void wk_block_cache_reset_peak(WkBlockCache *c);  /* bytes_peak = bytes_in_use */

#ifdef __cplusplus
}
#endif
#endif /* WK_TENSOR_BLOCK_CACHE_H */
