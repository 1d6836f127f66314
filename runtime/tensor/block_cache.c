/*
 * block_cache.c — the stream-safe caching allocator's bookkeeping (block_cache.h says the rule).
 *
 * Requests round up to 512 B, or to 2 MiB from 1 MiB on, and take the smallest reusable cached
 * block that is at most twice their size. Blocks live in two unsorted arrays searched linearly: a
 * training step holds hundreds of blocks, not millions, and the device calls dwarf the scan.
 */
#include <stdlib.h>

#include "block_cache.h"

static const size_t SMALL_ROUND = 512, LARGE_ROUND = 2u << 20, LARGE_FROM = 1u << 20;

struct WkBlock {
  void *ptr;
  size_t size;
  void *streams[WK_BLOCK_STREAMS];  /* [0] is the stream it was allocated on */
  void *events[WK_BLOCK_STREAMS];   /* cached blocks: recorded on streams[i] at release; NULL once done */
  int stream_count;
};

static size_t round_size(size_t bytes) {
  size_t unit = bytes >= LARGE_FROM ? LARGE_ROUND : SMALL_ROUND;
  return bytes == 0 ? unit : (bytes + unit - 1) / unit * unit;
}

static bool reserve(WkBlock **items, size_t *capacity, size_t count) {
  if (count < *capacity) return true;
  size_t grown = *capacity ? 2 * *capacity : 64;
  WkBlock *more = realloc(*items, grown * sizeof *more);
  if (!more) return false;
  *items = more;
  *capacity = grown;
  return true;
}

void wk_block_cache_init(WkBlockCache *c, const WkBlockDevice *device) {
  memset(c, 0, sizeof *c);
  pthread_mutex_init(&c->lock, NULL);
  c->device = *device;
}

/* A stream no block is used on: reusable_on(c, b, ANY_STREAM) means every stream of b is done. */
static const char ANY_STREAM_TAG;
#define ANY_STREAM ((void *)&ANY_STREAM_TAG)

/* Frees the events of b that have completed; true when none on a stream other than `stream` is left. */
static bool reusable_on(WkBlockCache *c, WkBlock *b, void *stream) {
  bool ready = true;
  for (int i = 0; i < b->stream_count; i++) {
    if (!b->events[i]) continue;
    if (c->device.event_done(c->device.ctx, b->events[i])) {
      c->device.event_free(c->device.ctx, b->events[i]);
      b->events[i] = NULL;
    } else if (b->streams[i] != stream) {
      ready = false;
    }
  }
  return ready;
}

static void free_events(WkBlockCache *c, WkBlock *b) {
  for (int i = 0; i < b->stream_count; i++)
    if (b->events[i]) c->device.event_free(c->device.ctx, b->events[i]);
}

/* Takes the smallest reusable cached block in [size, 2 * size]; lock held. */
static bool take_cached(WkBlockCache *c, size_t size, void *stream, WkBlock *out) {
  size_t best = c->cached_count;
  for (size_t i = 0; i < c->cached_count; i++) {
    size_t s = c->cached[i].size;
    bool fits = s >= size && s <= 2 * size && (best == c->cached_count || s < c->cached[best].size);
    if (fits && reusable_on(c, &c->cached[i], stream)) best = i;
  }
  if (best == c->cached_count) return false;
  *out = c->cached[best];
  c->cached[best] = c->cached[--c->cached_count];
  free_events(c, out);
  c->stats.cache_hits++;
  c->stats.bytes_cached -= out->size;
  return true;
}

/* Returns to the device the cached blocks whose streams are done (all of them when wait); lock held. */
static WkStatus return_cached(WkBlockCache *c, bool wait) {
  WkStatus status = WK_OK;
  size_t kept = 0;
  for (size_t i = 0; i < c->cached_count; i++) {
    WkBlock *b = &c->cached[i];
    for (int e = 0; wait && e < b->stream_count; e++) {
      WkStatus synced = b->events[e] ? c->device.event_synchronize(c->device.ctx, b->events[e]) : WK_OK;
      if (synced != WK_OK) status = synced;
    }
    if (!wait && !reusable_on(c, b, ANY_STREAM)) {
      c->cached[kept++] = *b;
      continue;
    }
    free_events(c, b);
    c->device.free(c->device.ctx, b->ptr);
    c->stats.bytes_cached -= b->size;
  }
  c->cached_count = kept;
  return status;
}

static WkStatus alloc_locked(WkBlockCache *c, size_t size, void *stream, WkBlock *out) {
  if (take_cached(c, size, stream, out)) return WK_OK;
  if (!reserve(&c->live, &c->live_capacity, c->live_count + 1))
    return WK_FAIL(WK_ERR_NOMEM, "out of host memory for the device allocator's block list");
  memset(out, 0, sizeof *out);
  WkStatus status = c->device.malloc(c->device.ctx, size, &out->ptr);
  if (status == WK_ERR_NOMEM) {
    WK_TRY(return_cached(c, false));
    status = c->device.malloc(c->device.ctx, size, &out->ptr);
  }
  if (status != WK_OK) return status;
  out->size = size;
  c->stats.device_allocs++;
  return WK_OK;
}

WkStatus wk_block_cache_alloc(WkBlockCache *c, size_t bytes, void *stream, void **out, size_t *reserved) {
  WkBlock block;
  pthread_mutex_lock(&c->lock);
  WkStatus status = alloc_locked(c, round_size(bytes), stream, &block);
  if (status == WK_OK) {
    block.streams[0] = stream;
    block.stream_count = 1;
    c->live[c->live_count++] = block;  /* alloc_locked reserved the slot */
    c->stats.bytes_in_use += block.size;
    if (c->stats.bytes_in_use > c->stats.bytes_peak) c->stats.bytes_peak = c->stats.bytes_in_use;
  }
  pthread_mutex_unlock(&c->lock);
  if (status != WK_OK) return status;
  *out = block.ptr;
  *reserved = block.size;
  return WK_OK;
}

static WkBlock *find_live(WkBlockCache *c, void *ptr) {
  for (size_t i = 0; i < c->live_count; i++)
    if (c->live[i].ptr == ptr) return &c->live[i];
  return NULL;
}

static WkStatus record_locked(WkBlockCache *c, void *ptr, void *stream) {
  WkBlock *b = find_live(c, ptr);
  if (!b) return WK_FAIL(WK_ERR_INTERNAL, "record_stream: %p is not a live block of this device", ptr);
  for (int i = 0; i < b->stream_count; i++)
    if (b->streams[i] == stream) return WK_OK;
  if (b->stream_count == WK_BLOCK_STREAMS)
    return WK_FAIL(WK_ERR_INVALID_ARG, "record_stream: a block is used on more than %d streams", WK_BLOCK_STREAMS);
  b->streams[b->stream_count++] = stream;
  return WK_OK;
}

WkStatus wk_block_cache_record_stream(WkBlockCache *c, void *ptr, void *stream) {
  pthread_mutex_lock(&c->lock);
  WkStatus status = record_locked(c, ptr, stream);
  pthread_mutex_unlock(&c->lock);
  return status;
}

/* Records b's events; false (with the ones recorded freed) when the device cannot. */
static bool record_events(WkBlockCache *c, WkBlock *b) {
  for (int i = 0; i < b->stream_count; i++) {
    if (c->device.event_record(c->device.ctx, b->streams[i], &b->events[i]) == WK_OK) continue;
    b->events[i] = NULL;
    free_events(c, b);
    return false;
  }
  return true;
}

void wk_block_cache_release(WkBlockCache *c, void *ptr) {
  if (!ptr) return;
  pthread_mutex_lock(&c->lock);
  WkBlock *live = find_live(c, ptr);
  if (!live) {
    pthread_mutex_unlock(&c->lock);
    wk_logf(WK_LOG_WARN, "device allocator: %p released but not allocated here (ignored)", ptr);
    return;
  }
  WkBlock b = *live;
  *live = c->live[--c->live_count];
  c->stats.bytes_in_use -= b.size;
  /* Without events or room to remember it, give it back: the device's free waits for queued work. */
  if (!reserve(&c->cached, &c->cached_capacity, c->cached_count + 1) || !record_events(c, &b)) {
    c->device.free(c->device.ctx, b.ptr);
  } else {
    c->cached[c->cached_count++] = b;
    c->stats.bytes_cached += b.size;
  }
  pthread_mutex_unlock(&c->lock);
}

WkStatus wk_block_cache_empty(WkBlockCache *c) {
  pthread_mutex_lock(&c->lock);
  WkStatus status = return_cached(c, true);
  pthread_mutex_unlock(&c->lock);
  return status;
}

void wk_block_cache_stats(WkBlockCache *c, WkAllocatorStats *out) {
  pthread_mutex_lock(&c->lock);
  *out = c->stats;
  pthread_mutex_unlock(&c->lock);
}

void wk_block_cache_reset_peak(WkBlockCache *c) {
  pthread_mutex_lock(&c->lock);
  c->stats.bytes_peak = c->stats.bytes_in_use;
  pthread_mutex_unlock(&c->lock);
}

void wk_block_cache_destroy(WkBlockCache *c) {
  (void)wk_block_cache_empty(c);
  for (size_t i = 0; i < c->live_count; i++) c->device.free(c->device.ctx, c->live[i].ptr);
  free(c->live);
  free(c->cached);
  pthread_mutex_destroy(&c->lock);
  memset(c, 0, sizeof *c);
}
