/*
 * cache.c — the decoded-block cache: a hash table of (shard, block) -> decoded bytes with an LRU
 * list and a byte budget.
 *
 * Readers pin an entry while they copy from it; eviction only takes unpinned entries, and an insert
 * that cannot fit is refused (the caller decodes into a private buffer instead), so the bytes held
 * never exceed the budget, whatever the dataset size. One mutex: the work done under it is pointer
 * surgery, never decoding or copying.
 */
#include <pthread.h>
#include <stdlib.h>

#include "format.h"

enum { BUCKETS = 4096 };

struct WkCacheEntry {
  uint64_t key;
  void *data;
  uint64_t bytes;
  uint32_t pins;
  WkCacheEntry *chain;             /* next in the bucket */
  WkCacheEntry *newer, *older;     /* LRU list */
};

struct WkBlockCache {
  pthread_mutex_t lock;
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

static void remove_entry(WkBlockCache *c, WkCacheEntry *e) {
  WkCacheEntry **link = &c->buckets[bucket_of(e->key)];
  while (*link != e) link = &(*link)->chain;
  *link = e->chain;
  lru_unlink(c, e);
  c->used -= e->bytes;
  free(e->data);
  free(e);
}

/* Evicts unpinned entries, oldest first, until `need` more bytes fit. Lock held. */
static bool make_room(WkBlockCache *c, uint64_t need) {
  WkCacheEntry *e = c->oldest;
  while (c->used + need > c->budget && e) {
    WkCacheEntry *newer = e->newer;
    if (e->pins == 0) remove_entry(c, e);
    e = newer;
  }
  return c->used + need <= c->budget;
}

void wk_cache_free(WkBlockCache *c) {
  if (!c) return;
  while (c->oldest) remove_entry(c, c->oldest);
  pthread_mutex_destroy(&c->lock);
  free(c);
}

void wk_cache_set_budget(WkBlockCache *c, uint64_t budget_bytes) {
  pthread_mutex_lock(&c->lock);
  c->budget = budget_bytes;
  make_room(c, 0);
  pthread_mutex_unlock(&c->lock);
}

WkCacheEntry *wk_cache_acquire(WkBlockCache *c, uint64_t key) {
  pthread_mutex_lock(&c->lock);
  WkCacheEntry *e = c->buckets[bucket_of(key)];
  while (e && e->key != key) e = e->chain;
  if (e) {
    e->pins++;
    lru_unlink(c, e);
    lru_push_newest(c, e);
    c->hits++;
  } else {
    c->misses++;
  }
  pthread_mutex_unlock(&c->lock);
  return e;
}

WkCacheEntry *wk_cache_insert(WkBlockCache *c, uint64_t key, void *data, uint64_t bytes) {
  WkCacheEntry *fresh = malloc(sizeof *fresh);
  if (!fresh) return NULL; /* not caching is always allowed */
  pthread_mutex_lock(&c->lock);
  /* Another reader may have decoded the same block meanwhile: use theirs. */
  WkCacheEntry *e = c->buckets[bucket_of(key)];
  while (e && e->key != key) e = e->chain;
  if (e) {
    e->pins++;
    pthread_mutex_unlock(&c->lock);
    free(fresh);
    free(data);
    return e;
  }
  if (!make_room(c, bytes)) {
    pthread_mutex_unlock(&c->lock);
    free(fresh);
    return NULL;
  }
  *fresh = (WkCacheEntry){.key = key, .data = data, .bytes = bytes, .pins = 1};
  size_t b = bucket_of(key);
  fresh->chain = c->buckets[b];
  c->buckets[b] = fresh;
  lru_push_newest(c, fresh);
  c->used += bytes;
  if (c->used > c->peak) c->peak = c->used;
  pthread_mutex_unlock(&c->lock);
  return fresh;
}

const void *wk_cache_data(const WkCacheEntry *entry) { return entry->data; }

void wk_cache_release(WkBlockCache *c, WkCacheEntry *e) {
  pthread_mutex_lock(&c->lock);
  e->pins--;
  /* A budget lowered while this entry was pinned is honoured now. */
  if (c->used > c->budget) make_room(c, 0);
  pthread_mutex_unlock(&c->lock);
}

void wk_cache_drop_shard(WkBlockCache *c, uint32_t shard) {
  pthread_mutex_lock(&c->lock);
  WkCacheEntry *e = c->oldest;
  while (e) {
    WkCacheEntry *newer = e->newer;
    if ((uint32_t)(e->key >> 32) == shard && e->pins == 0) remove_entry(c, e);
    e = newer;
  }
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
