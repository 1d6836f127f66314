/*
 * node_cache.h — the node cache: what of a source is resident while the loader reads it, and how a
 * located sample's tokens are read through it:
 *   node_cache.c   the decoded units and edges of a source, shared by the node's ranks, held exactly
 *                  as long as the order needs them (their hold vs the readers' low water);
 *   node_reader.c  a source's reads through the node cache (zstd blocks decoded, raw blocks copied),
 *                  the per-token columns' blocks with their tokens', read-ahead, counters of bytes
 *                  decoded and delivered.
 *
 * Internal header of runtime/loader; the loader is its one user.
 */
#ifndef WK_LOADER_NODE_CACHE_H
#define WK_LOADER_NODE_CACHE_H

#include "stream.h"

/* ---- node_cache.c ------------------------------------------------------------------------------------- */

/* Counters of one node cache (all its local readers together). */
typedef struct {
  uint64_t decoded_units;     /* units decoded into the cache */
  uint64_t private_decodes;   /* units the slowest reader decoded outside a full cache */
  uint64_t decoded_bytes;     /* every decode of the node's readers: cached, private, missing edges */
  uint64_t delivered_bytes;   /* stored bytes of the samples the node's readers delivered */
  uint64_t edges_saved, edges_used, edges_missing, edges_dropped;
  uint64_t waits;             /* reads that waited for a decode in another process or for room */
  uint64_t steals;            /* slots the slowest reader took from units needed later */
  uint64_t slots, edge_slots;
} WkNodeCacheStats;

typedef struct {
  const char *what;           /* the source, for messages */
  const char *shared_name;    /* "/wick-..." to share with the node's other ranks; NULL: this process only */
  uint64_t identity;          /* dataset fingerprint and order settings: other streams never share it */
  uint64_t budget_bytes;      /* the whole region */
  uint64_t unit_bytes;        /* decoded bytes of one unit */
  uint64_t edge_bytes;        /* bytes of the longest edge */
  uint32_t edge_slots;
} WkNodeCacheConfig;

typedef struct WkNodeCache WkNodeCache;

/* Decodes one unit into dst (unit_bytes), saving its edges. Runs without the cache's lock. */
typedef WkStatus (*WkUnitFill)(void *ctx, uint8_t *dst);

typedef struct {
  const uint8_t *data;        /* the unit's stored-width tokens (then its columns: node_reader.c) */
  uint64_t hold_until;        /* valid while this reader reads draws up to this one */
  bool cached;                /* false: decoded privately into the caller's scratch */
} WkUnitHit;

/* Unit slots a configuration's budget gives (0: it cannot hold one unit next to its edges), and the
 * budget that gives `units` slots. */
uint32_t wk_node_cache_slots(const WkNodeCacheConfig *cfg);
uint64_t wk_node_cache_bytes_for(const WkNodeCacheConfig *cfg, uint32_t units);
/* Creates or joins the cache and attaches this loader as a reader whose low water is first_draw. */
WkStatus wk_node_cache_open(const WkNodeCacheConfig *cfg, uint64_t first_draw, WkNodeCache **out);
void wk_node_cache_close(WkNodeCache *c);
/* This reader will never again read a draw below `draw`: entries held only up to it may go. */
void wk_node_cache_set_low_water(WkNodeCache *c, uint64_t draw);
/* This reader may be reading draws up to `draw` (published before they are read). */
void wk_node_cache_set_high_water(WkNodeCache *c, uint64_t draw);
/* The unit `key`, decoded by `fill` when no reader of the node has it. When the cache is full of units
 * still needed and this loader is the node's slowest reader, the unit is decoded into scratch instead of
 * waiting (the others wait for it). */
WkStatus wk_node_cache_get(WkNodeCache *c, uint64_t key, WkHold hold, WkUnitFill fill, void *ctx, uint8_t *scratch,
                           WkUnitHit *out);
/* Saves an edge (dropped, and counted, when every edge slot is still needed). */
void wk_node_cache_put_edge(WkNodeCache *c, uint64_t key, uint64_t hold_until, const void *data, uint32_t bytes);
/* Copies an edge of exactly `bytes` into dst; false when no reader of the node saved it. */
bool wk_node_cache_take_edge(WkNodeCache *c, uint64_t key, void *dst, uint32_t bytes);
/* Copies `bytes` at `offset` of a unit still resident (decoded, its slot not yet reused: its hold may be
 * over) into dst; false when it is not. The fallback of a straddler whose edge was not saved. */
bool wk_node_cache_copy_resident(WkNodeCache *c, uint64_t key, uint64_t offset, void *dst, uint32_t bytes);
void wk_node_cache_add_decoded(WkNodeCache *c, uint64_t bytes);
void wk_node_cache_add_delivered(WkNodeCache *c, uint64_t bytes);
void wk_node_cache_stats(WkNodeCache *c, WkNodeCacheStats *out);

/* ---- node_reader.c --------------------------------------------------------------------------------------- */

typedef struct WkNodeReader WkNodeReader;
typedef struct WkNodeReaderThread WkNodeReaderThread;

typedef struct {
  const char *what;           /* the source, for messages */
  uint64_t cache_bytes;       /* the source's node cache */
  uint64_t identity;          /* of the stream: dataset fingerprint and order settings */
  uint32_t seq_len;
  uint64_t unit_tokens, buffer_units;
  uint64_t window_boundaries; /* most unit boundaries a shuffle window holds: bounds the edges in flight */
  uint32_t column_count;      /* per-token (TOKEN_U8) columns read with the tokens, a byte a position each */
  uint32_t columns[WK_BATCH_MAX_COLUMNS]; /* their indices in the dataset */
  uint32_t record_column_count; /* per-record columns (pad mode): only read ahead, for a unit's records */
  uint32_t record_columns[WK_BATCH_MAX_COLUMNS];
} WkNodeReaderConfig;

WkNodeReader *wk_node_reader_new(WkDataset *ds, const WkNodeReaderConfig *cfg);
void wk_node_reader_free(WkNodeReader *r);
/* Before the first read: the stream starts at draw first_draw. */
WkStatus wk_node_reader_start(WkNodeReader *r, uint64_t first_draw);
/* Buffers of units the source's node cache holds next to a window's edges, and the cache_bytes that
 * would hold `buffers`. */
uint64_t wk_node_reader_buffers_room(WkNodeReader *r);
uint64_t wk_node_reader_cache_bytes_for(WkNodeReader *r, uint64_t buffers);
/* This loader will never read a draw below low_water again: its raw pages and cache holds may go. */
void wk_node_reader_advance(WkNodeReader *r, uint64_t low_water);
/* This loader has planned draws up to high_water (before reading them). */
void wk_node_reader_plan(WkNodeReader *r, uint64_t high_water);

WkNodeReaderThread *wk_node_reader_thread_new(WkNodeReader *r);
void wk_node_reader_thread_free(WkNodeReaderThread *t);
/* Reads loc's tokens into dst as 4- or 8-byte tokens, and its bytes of the per-token columns into
 * columns[c] (the config's order), with column_tail more positions past the sample, which the shard
 * must hold (pad mode: its record's EOS). */
WkStatus wk_node_reader_read(WkNodeReader *r, WkNodeReaderThread *t, const WkSampleLoc *loc, void *dst, uint32_t dst_bytes,
                             uint8_t *const *columns, uint32_t column_tail);
/* Asks the blob to read a unit ahead (its stored bytes, the per-token columns' too, and the per-record
 * columns' of the records that start in it), before the buffer that draws it. */
void wk_node_reader_read_ahead(WkNodeReader *r, WkUnitRef unit);
/* Adds what the thread delivered since its last flush to the counters (once per micro-batch). */
void wk_node_reader_thread_flush(WkNodeReader *r, WkNodeReaderThread *t);

typedef struct {
  uint64_t decoded_bytes;     /* this loader's unit reads (decodes and copies, stored width) */
  uint64_t delivered_bytes;   /* this loader's samples (stored width) */
  WkNodeCacheStats node;      /* zeros until the first read */
} WkNodeReaderStats;
void wk_node_reader_stats(WkNodeReader *r, WkNodeReaderStats *out);

#endif /* WK_LOADER_NODE_CACHE_H */
