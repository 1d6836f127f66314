/*
 * cache.h — the decoded-block cache of plain dataset reads (wk_dataset_read): LRU with pinned entries, a
 * byte budget and single-flight decodes (cache.c). The loader reads through the node cache instead
 * (node_cache.h).
 *
 * Internal header: dataset.c and tests include it; Lua never sees it.
 */
#ifndef WK_DATASET_CACHE_H
#define WK_DATASET_CACHE_H

#include "dataset.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- block cache ------------------------------------------------------------------------------------ */

/* Decoded blocks keyed by (shard, block), least recently used evicted first, never holding more than
 * its budget. Entries are pinned while a reader copies from them. Thread-safe, single flight: one
 * reader decodes a missing block while the others wanting it wait. */
typedef struct WkBlockCache WkBlockCache;
typedef struct WkCacheEntry WkCacheEntry;

WkBlockCache *wk_cache_new(uint64_t budget_bytes);
void wk_cache_free(WkBlockCache *cache);
void wk_cache_set_budget(WkBlockCache *cache, uint64_t budget_bytes);
/* A hit returns the pinned entry, after waiting while another reader decodes it. A miss reserves
 * `bytes` of the budget and returns a pinned entry with *fill set: the caller decodes into
 * wk_cache_buffer(entry) and then calls wk_cache_fill, or wk_cache_abandon on failure. NULL when the
 * budget cannot hold the block even after evicting unpinned entries: decode privately. */
WkCacheEntry *wk_cache_get(WkBlockCache *cache, uint64_t key, uint64_t bytes, bool *fill);
void *wk_cache_buffer(WkCacheEntry *entry, const char *what); /* the entry's bytes (allocated once) */
void wk_cache_fill(WkBlockCache *cache, WkCacheEntry *entry);     /* publishes; the entry stays pinned */
void wk_cache_abandon(WkBlockCache *cache, WkCacheEntry *entry);  /* drops the reservation and the pin */
const void *wk_cache_data(const WkCacheEntry *entry);
void wk_cache_release(WkBlockCache *cache, WkCacheEntry *entry);
void wk_cache_stats(WkBlockCache *cache, WkDatasetStats *out);

#ifdef __cplusplus
}
#endif
#endif /* WK_DATASET_CACHE_H */
