/*
 * cache.c — the decoded-block cache: a hash table of (shard, block) -> decoded bytes with an LRU
 * list and a byte budget.
 *
 * Readers pin an entry while they copy from it; eviction only takes unpinned entries, and a
 * reservation that cannot fit is refused (the caller decodes into a private buffer instead), so the
 * bytes held never exceed the budget, whatever the dataset size.
 *
 * Single flight: the first reader to miss a block reserves its entry and decodes it; readers that
 * want the same block meanwhile wait for that decode instead of repeating it (loader threads reading
 * neighbouring samples all miss the same block at once). One mutex and one condition variable: the
 * work done under the lock is pointer surgery, never decoding or copying.
 */
#include <pthread.h>
#include <stdlib.h>

#include "cache.h"

enum { BUCKETS = 4096 };

typedef enum { ENTRY_LOADING, ENTRY_READY, ENTRY_ABANDONED } EntryState;

struct WkCacheEntry {
  uint64_t key;
  void *data;
  uint64_t bytes;
  uint32_t pins;
  EntryState state;
  WkCacheEntry *chain;             /* next in the bucket */
  WkCacheEntry *newer, *older;     /* LRU list */
};

struct WkBlockCache {
  pthread_mutex_t lock;
  pthread_cond_t filled;           /* a LOADING entry became READY or ABANDONED */
  uint64_t budget, used, peak, hits, misses;
  WkCacheEntry *buckets[BUCKETS];
  WkCacheEntry *newest, *oldest;
};

static size_t bucket_of(uint64_t key) {
  key ^= key >> 33;
  key *= 0xff51afd7ed558ccdull;
  key ^= key >> 33;
  return (size_t)(key % BUCKETS);
}

WkBlockCache *wk_cache_new(uint64_t budget_bytes) {
  WkBlockCache *c = wk_calloc(1, sizeof *c, "block cache");
  if (!c) return NULL;
  pthread_mutex_init(&c->lock, NULL);
  pthread_cond_init(&c->filled, NULL);
  c->budget = budget_bytes;
  return c;
}

static void lru_unlink(WkBlockCache *c, WkCacheEntry *e) {
  if (e->newer) e->newer->older = e->older; else c->newest = e->older;
  if (e->older) e->older->newer = e->newer; else c->oldest = e->newer;
  e->newer = e->older = NULL;
}

static void lru_push_newest(WkBlockCache *c, WkCacheEntry *e) {
  e->older = c->newest;
  e->newer = NULL;
  if (c->newest) c->newest->newer = e; else c->oldest = e;
  c->newest = e;
}

static WkCacheEntry *find(WkBlockCache *c, uint64_t key) {
  WkCacheEntry *e = c->buckets[bucket_of(key)];
  while (e && e->key != key) e = e->chain;
  return e;
}

/* Takes e out of the table and the LRU list and returns its bytes to the budget. */
static void detach(WkBlockCache *c, WkCacheEntry *e) {
  WkCacheEntry **link = &c->buckets[bucket_of(e->key)];
  while (*link != e) link = &(*link)->chain;
  *link = e->chain;
  lru_unlink(c, e);
  c->used -= e->bytes;
}

static void destroy(WkCacheEntry *e) {
  free(e->data);
  free(e);
}

/* Evicts unpinned entries, oldest first, until `need` more bytes fit. Lock held. */
static bool make_room(WkBlockCache *c, uint64_t need) {
  WkCacheEntry *e = c->oldest;
  while (c->used + need > c->budget && e) {
    WkCacheEntry *newer = e->newer;
    if (e->pins == 0) {
      detach(c, e);
      destroy(e);
    }
    e = newer;
  }
  return c->used + need <= c->budget;
}

void wk_cache_free(WkBlockCache *c) {
  if (!c) return;
  while (c->oldest) {
    WkCacheEntry *e = c->oldest;
    detach(c, e);
    destroy(e);
  }
  pthread_cond_destroy(&c->filled);
  pthread_mutex_destroy(&c->lock);
  free(c);
}

void wk_cache_set_budget(WkBlockCache *c, uint64_t budget_bytes) {
  pthread_mutex_lock(&c->lock);
  c->budget = budget_bytes;
  make_room(c, 0);
  pthread_mutex_unlock(&c->lock);
}

WkCacheEntry *wk_cache_get(WkBlockCache *c, uint64_t key, uint64_t bytes, bool *fill) {
  *fill = false;
  pthread_mutex_lock(&c->lock);
  for (;;) {
    WkCacheEntry *e = find(c, key);
    if (!e) break;
    e->pins++;
    while (e->state == ENTRY_LOADING) pthread_cond_wait(&c->filled, &c->lock);
    if (e->state == ENTRY_READY) {
      lru_unlink(c, e);
      lru_push_newest(c, e);
      c->hits++;
      pthread_mutex_unlock(&c->lock);
      return e;
    }
    /* Its decoder failed: let go and look again (this thread may decode it and fail the same way). */
    if (--e->pins == 0) destroy(e);
  }
  c->misses++;
  WkCacheEntry *fresh = NULL;
  if (make_room(c, bytes)) fresh = malloc(sizeof *fresh);
  if (fresh) {
    *fresh = (WkCacheEntry){.key = key, .bytes = bytes, .pins = 1, .state = ENTRY_LOADING};
    size_t b = bucket_of(key);
    fresh->chain = c->buckets[b];
    c->buckets[b] = fresh;
    lru_push_newest(c, fresh);
    c->used += bytes;
    if (c->used > c->peak) c->peak = c->used;
    *fill = true;
  }
  pthread_mutex_unlock(&c->lock);
  return fresh;
}

void *wk_cache_buffer(WkCacheEntry *entry, const char *what) {
  if (!entry->data) entry->data = wk_malloc(entry->bytes, what);
  return entry->data;
}

void wk_cache_fill(WkBlockCache *c, WkCacheEntry *e) {
  pthread_mutex_lock(&c->lock);
  e->state = ENTRY_READY;
  pthread_cond_broadcast(&c->filled);
  pthread_mutex_unlock(&c->lock);
}

void wk_cache_abandon(WkBlockCache *c, WkCacheEntry *e) {
  pthread_mutex_lock(&c->lock);
  detach(c, e);
  e->state = ENTRY_ABANDONED;
  pthread_cond_broadcast(&c->filled);
  if (--e->pins == 0) destroy(e);
  pthread_mutex_unlock(&c->lock);
}

const void *wk_cache_data(const WkCacheEntry *entry) { return entry->data; }

void wk_cache_release(WkBlockCache *c, WkCacheEntry *e) {
  pthread_mutex_lock(&c->lock);
  e->pins--;
  /* A budget lowered while this entry was pinned is honoured now. */
  if (c->used > c->budget) make_room(c, 0);
  pthread_mutex_unlock(&c->lock);
}

void wk_cache_stats(WkBlockCache *c, WkDatasetStats *out) {
  pthread_mutex_lock(&c->lock);
  out->cache_bytes = c->used;
  out->cache_peak_bytes = c->peak;
  out->cache_budget = c->budget;
  out->cache_hits = c->hits;
  out->cache_misses = c->misses;
  pthread_mutex_unlock(&c->lock);
}
