/*
 * node_reader.c — a source's reads for the loader: a located sample (order.c) -> its tokens in a row,
 * through the node cache (node_cache.c).
 *
 * The thread that first needs a unit reads it into the cache: a zstd block is verified and decoded, a
 * raw block verified and copied (pread, not the file mapping: mapped pages would stay resident, and
 * the page cache maps whole large folios on a fault, far beyond the block). It also saves the unit's
 * edges (the parts of straddling samples that later buffers draw); a straddler drawn later reads that
 * part from its edge. Each thread keeps a small memo of the units it got, valid while its draws stay
 * within their hold (the cache cannot reuse such a slot), so most reads take no lock at all. Resident
 * memory is the cache's budget, for raw and zstd shards alike, whatever the dataset's size; the file
 * pages a unit comes from are only asked for ahead (read-ahead), never mapped.
 *
 * Columns: the per-token (TOKEN_U8) columns asked for cover the token blocks' positions, so a unit's
 * slot holds them too, a byte a position each after its tokens ([tokens][column 0]...[column n-1], each
 * unit_tokens long), decoded with them; an edge holds its positions the same way ([tokens][column 0]...,
 * each as long as the edge). A row's column bytes are copied next to its tokens, from the same unit.
 *
 * Sharing: when the process is one of several local ranks of a job (LOCAL_WORLD_SIZE > 1 and a job id
 * from the launcher, torchrun or SLURM), the node cache is a region in /dev/shm named by the job and the
 * stream (wk_shared_job_name), so all local ranks read each unit once between them; otherwise it is
 * private.
 */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/shared.h"
#include "../format/shard.h"    /* wk_tokens_widen */
#include "node_cache.h"

enum {
  MEMO_ENTRIES = 256,         /* per thread: more than the units of a buffer or two */
};

struct WkNodeReader {
  WkDataset *ds;
  WkNodeReaderConfig cfg;
  char what[256];
  uint32_t token_bytes;
  uint32_t position_bytes;    /* a position's bytes in a unit: its token's and a byte a column */
  pthread_mutex_t lock;       /* the cache's creation, the waters */
  _Atomic(WkNodeCache *) cache; /* created at the first read */
  uint64_t low_water, high_water;
  _Atomic uint64_t decoded_bytes, delivered_bytes;
};

typedef struct {
  uint64_t key;               /* 0: empty (keys are never 0: see unit_key) */
  const uint8_t *data;
  uint64_t hold_until;
} Memo;

struct WkNodeReaderThread {
  Memo memo[MEMO_ENTRIES];
  uint64_t delivered;         /* bytes delivered since the last flush (shared counters are flushed once
                                 per micro-batch, not per sample: they bounce between cores) */
  uint8_t *scratch;           /* a unit decoded privately */
  uint8_t *edge;              /* an edge's positions (taken, or gathered to be saved) */
};

static uint64_t unit_key(uint32_t shard, uint32_t unit) { return ((uint64_t)shard + 1) << 32 | unit; }

static uint64_t unit_bytes(const WkNodeReader *r) { return r->cfg.unit_tokens * r->position_bytes; }
static uint64_t edge_bytes(const WkNodeReaderConfig *cfg, uint32_t position_bytes) {
  return (cfg->seq_len + 1ull) * position_bytes;
}

/* Edges in flight peak near half a window (each boundary waits from its first unit's buffer to its
 * second's); a margin of a few standard deviations, capped by the window. */
static uint32_t edge_slots(const WkNodeReaderConfig *cfg) {
  double n = (double)cfg->window_boundaries;
  double slots = n / 2 + 4 * sqrt(n) + 16;
  return (uint32_t)(slots < n + 1 ? slots : n + 1);
}

static WkNodeCacheConfig cache_config(const WkNodeReaderConfig *cfg, uint32_t position_bytes, uint64_t budget,
                                      const char *what, const char *name) {
  return (WkNodeCacheConfig){.what = what, .shared_name = name, .identity = cfg->identity, .budget_bytes = budget,
                             .unit_bytes = cfg->unit_tokens * position_bytes, .edge_bytes = edge_bytes(cfg, position_bytes),
                             .edge_slots = edge_slots(cfg)};
}

/* ---- sharing ------------------------------------------------------------------------------------- */

static WkStatus open_cache(WkNodeReader *r) {
  char what[32], name[WK_SHARED_NAME_CAPACITY];
  bool shared;
  snprintf(what, sizeof what, "node cache %016" PRIx64, r->cfg.identity);
  WK_TRY(wk_shared_job_name(what, name, &shared));
  WkNodeCacheConfig cfg = cache_config(&r->cfg, r->position_bytes, r->cfg.cache_bytes, r->what,
                                      shared ? name : NULL);
  WkNodeCache *cache = NULL;
  WK_TRY(wk_node_cache_open(&cfg, r->low_water, &cache));
  wk_node_cache_set_high_water(cache, r->high_water);
  atomic_store_explicit(&r->cache, cache, memory_order_release);
  return WK_OK;
}

/* ---- lifetime -------------------------------------------------------------------------------------- */

WkNodeReader *wk_node_reader_new(WkDataset *ds, const WkNodeReaderConfig *cfg) {
  WkNodeReader *r = wk_calloc(1, sizeof *r, "node cache reader");
  if (!r) return NULL;
  r->ds = ds;
  r->cfg = *cfg;
  snprintf(r->what, sizeof r->what, "%s", cfg->what);
  r->cfg.what = r->what;
  r->token_bytes = wk_dataset_token_bytes(ds);
  r->position_bytes = r->token_bytes + cfg->column_count;
  pthread_mutex_init(&r->lock, NULL);
  return r;
}

void wk_node_reader_free(WkNodeReader *r) {
  if (!r) return;
  wk_node_cache_close(r->cache);
  pthread_mutex_destroy(&r->lock);
  free(r);
}

WkStatus wk_node_reader_start(WkNodeReader *r, uint64_t first_draw) {
  r->low_water = first_draw;
  return WK_OK;
}

uint64_t wk_node_reader_buffers_room(WkNodeReader *r) {
  WkNodeCacheConfig c = cache_config(&r->cfg, r->position_bytes, r->cfg.cache_bytes, "", NULL);
  return wk_node_cache_slots(&c) / r->cfg.buffer_units;
}

uint64_t wk_node_reader_cache_bytes_for(WkNodeReader *r, uint64_t buffers) {
  WkNodeCacheConfig c = cache_config(&r->cfg, r->position_bytes, 0, "", NULL);
  return wk_node_cache_bytes_for(&c, (uint32_t)(buffers * r->cfg.buffer_units));
}

void wk_node_reader_advance(WkNodeReader *r, uint64_t low_water) {
  pthread_mutex_lock(&r->lock);
  if (low_water > r->low_water) r->low_water = low_water;
  if (r->cache) wk_node_cache_set_low_water(r->cache, r->low_water);
  pthread_mutex_unlock(&r->lock);
}

void wk_node_reader_plan(WkNodeReader *r, uint64_t high_water) {
  pthread_mutex_lock(&r->lock);
  r->high_water = high_water;
  if (r->cache) wk_node_cache_set_high_water(r->cache, high_water);
  pthread_mutex_unlock(&r->lock);
}

WkNodeReaderThread *wk_node_reader_thread_new(WkNodeReader *r) {
  WkNodeReaderThread *t = wk_calloc(1, sizeof *t, "node cache reader thread");
  if (!t) return NULL;
  t->scratch = wk_malloc(unit_bytes(r), "decoded unit");
  t->edge = wk_malloc(edge_bytes(&r->cfg, r->position_bytes), "edge");
  if (!t->scratch || !t->edge) {
    wk_node_reader_thread_free(t);
    return NULL;
  }
  return t;
}

void wk_node_reader_thread_free(WkNodeReaderThread *t) {
  if (!t) return;
  free(t->scratch);
  free(t->edge);
  free(t);
}

/* ---- reading ------------------------------------------------------------------------------------- */

/* Positions laid out as a unit's slot or an edge: tokens from `base`, then each column's bytes, every
 * part `stride` positions long; `at` is the first position wanted. */
typedef struct {
  const uint8_t *base;
  uint64_t stride, at;
} Span;

static const uint8_t *span_tokens(const WkNodeReader *r, Span s) { return s.base + s.at * r->token_bytes; }
static const uint8_t *span_column(const WkNodeReader *r, Span s, uint32_t c) {
  return s.base + s.stride * r->token_bytes + c * s.stride + s.at;
}

/* Copies count positions of a span into `out` laid out as an edge of count positions. */
static void gather(const WkNodeReader *r, Span s, uint64_t count, uint8_t *out) {
  memcpy(out, span_tokens(r, s), count * r->token_bytes);
  for (uint32_t c = 0; c < r->cfg.column_count; c++)
    memcpy(out + count * r->token_bytes + c * count, span_column(r, s, c), count);
}

typedef struct {
  WkNodeReader *r;
  uint32_t shard;
  const WkUnitUse *use;
  uint8_t *edge;              /* where an edge's positions are gathered to be saved */
} Fill;

/* Reads a unit (decoding zstd blocks, copying raw ones, verifying both), its tokens and then each column,
 * and saves its edges (the order's duties for it). */
static WkStatus fill_unit(void *ctx, uint8_t *dst) {
  const Fill *f = ctx;
  WkNodeReader *r = f->r;
  uint64_t begin = (uint64_t)f->use->unit * r->cfg.unit_tokens, end = begin + r->cfg.unit_tokens;
  WkShardInfo info;
  WK_TRY(wk_dataset_shard_info(r->ds, f->shard, &info));
  if (end > info.tokens) end = info.tokens;
  WK_TRY(wk_dataset_decode_range(r->ds, f->shard, begin, end, dst));
  Span unit = {.base = dst, .stride = r->cfg.unit_tokens};
  for (uint32_t c = 0; c < r->cfg.column_count; c++)
    WK_TRY(wk_dataset_decode_column_range(r->ds, r->cfg.columns[c], f->shard, begin, end,
                                          (uint8_t *)span_column(r, unit, c)));
  uint64_t bytes = (end - begin) * r->position_bytes;
  atomic_fetch_add(&r->decoded_bytes, bytes);
  wk_node_cache_add_decoded(r->cache, bytes);
  for (uint32_t d = 0; d < f->use->duties; d++) {
    const WkEdgeDuty *duty = &f->use->duty[d];
    uint64_t count = duty->end - duty->begin;
    gather(r, (Span){.base = dst, .stride = r->cfg.unit_tokens, .at = duty->begin - begin}, count, f->edge);
    wk_node_cache_put_edge(r->cache, unit_key(f->shard, duty->boundary), duty->hold_until, f->edge,
                           (uint32_t)(count * r->position_bytes));
  }
  return WK_OK;
}

static WkStatus ensure_cache(WkNodeReader *r) {
  if (atomic_load_explicit(&r->cache, memory_order_acquire)) return WK_OK;
  pthread_mutex_lock(&r->lock);
  WkStatus status = r->cache ? WK_OK : open_cache(r);
  pthread_mutex_unlock(&r->lock);
  return status;
}

/* The unit's decoded positions: from this thread's memo, or the node cache (decoding it if nobody has). */
static WkStatus get_unit(WkNodeReader *r, WkNodeReaderThread *t, const WkSampleLoc *loc, const WkUnitUse *use,
                         const uint8_t **data) {
  uint64_t key = unit_key(loc->shard, use->unit);
  Memo *m = &t->memo[wk_mix64(key, 0) % MEMO_ENTRIES];
  if (m->key == key && m->data && m->hold_until >= loc->draw) {
    *data = m->data;
    return WK_OK;
  }
  Fill fill = {r, loc->shard, use, t->edge};
  WkUnitHit hit;
  WK_TRY(wk_node_cache_get(r->cache, key, use->hold, fill_unit, &fill, t->scratch, &hit));
  if (hit.cached) *m = (Memo){.key = key, .data = hit.data, .hold_until = hit.hold_until};
  *data = hit.data;
  return WK_OK;
}

/* A unit still resident's positions [at, at + count) gathered into t->edge (laid out as an edge); false
 * when any part of it is gone. */
static bool copy_resident(WkNodeReader *r, WkNodeReaderThread *t, uint64_t key, uint64_t at, uint64_t count) {
  uint64_t stride = r->cfg.unit_tokens;
  if (!wk_node_cache_copy_resident(r->cache, key, at * r->token_bytes, t->edge, (uint32_t)(count * r->token_bytes)))
    return false;
  for (uint32_t c = 0; c < r->cfg.column_count; c++)
    if (!wk_node_cache_copy_resident(r->cache, key, stride * r->token_bytes + c * stride + at,
                                     t->edge + count * r->token_bytes + c * count, (uint32_t)count))
      return false;
  return true;
}

/* Where a row's positions go: its tokens (dst_bytes wide) and each column's bytes, at the sample's
 * first position. */
typedef struct {
  uint8_t *tokens;
  uint32_t dst_bytes;
  uint8_t *const *columns;
} Row;

/* Asks for the lines of a part of a unit: a row's part is a random place of a node cache far larger than
 * the caches, so a column's misses are left to overlap with the widening of the tokens. */
static void prefetch(const uint8_t *p, uint64_t bytes) {
  for (uint64_t at = 0; at < bytes; at += 64) __builtin_prefetch(p + at);
}

/* Positions [begin, end) of the sample from a span into the row, and `tail` more of the columns when
 * the span holds them. */
static void deliver(const WkNodeReader *r, Span s, const WkSampleLoc *loc, uint64_t begin, uint64_t end, uint64_t tail,
                    const Row *row) {
  uint64_t at = begin - loc->offset;
  for (uint32_t c = 0; c < r->cfg.column_count; c++) prefetch(span_column(r, s, c), end - begin + tail);
  wk_tokens_widen(span_tokens(r, s), r->token_bytes, end - begin, row->tokens + at * row->dst_bytes, row->dst_bytes);
  for (uint32_t c = 0; c < r->cfg.column_count; c++)
    memcpy(row->columns[c] + at, span_column(r, s, c), end - begin + tail);
}

/* The sample's positions [begin, end) that lie in one unit into the row, and `tail` more of the columns
 * (only when the unit holds them, not from an edge). */
static WkStatus read_part(WkNodeReader *r, WkNodeReaderThread *t, const WkSampleLoc *loc, const WkUnitUse *use,
                          uint64_t begin, uint64_t end, uint64_t tail, const Row *row) {
  uint64_t unit_begin = (uint64_t)use->unit * r->cfg.unit_tokens, count = end - begin;
  Span edge = {.base = t->edge, .stride = count};
  if (use->from_edge) {
    uint64_t boundary = loc->units[1].unit;
    if (wk_node_cache_take_edge(r->cache, unit_key(loc->shard, (uint32_t)boundary), t->edge,
                                (uint32_t)(count * r->position_bytes))) {
      deliver(r, edge, loc, begin, end, 0, row);
      return WK_OK;
    }
    /* Not saved: the earlier unit is still resident (the edge slots were full while ranks ran far
     * apart), or nobody on this node decoded it (its samples went to other nodes): decode it here. */
    if (copy_resident(r, t, unit_key(loc->shard, use->unit), begin - unit_begin, count)) {
      deliver(r, edge, loc, begin, end, 0, row);
      return WK_OK;
    }
    Fill fill = {r, loc->shard, use, t->edge};
    WK_TRY(fill_unit(&fill, t->scratch));
    deliver(r, (Span){.base = t->scratch, .stride = r->cfg.unit_tokens, .at = begin - unit_begin}, loc, begin, end, 0,
            row);
    return WK_OK;
  }
  const uint8_t *data;
  WK_TRY(get_unit(r, t, loc, use, &data));
  deliver(r, (Span){.base = data, .stride = r->cfg.unit_tokens, .at = begin - unit_begin}, loc, begin, end, tail, row);
  return WK_OK;
}

/* Column positions past the sample that its last unit does not hold (pad mode: an EOS just past a unit's
 * end, or past an edge): read alone, through the dataset's block cache (rare: most records end inside
 * their unit). */
static WkStatus read_tail(WkNodeReader *r, const WkSampleLoc *loc, uint64_t tail, const Row *row) {
  for (uint32_t c = 0; c < r->cfg.column_count; c++)
    WK_TRY(wk_dataset_read_column(r->ds, r->cfg.columns[c], loc->shard, loc->offset + loc->length, tail,
                                  row->columns[c] + loc->length));
  return WK_OK;
}

WkStatus wk_node_reader_read(WkNodeReader *r, WkNodeReaderThread *t, const WkSampleLoc *loc, void *dst, uint32_t dst_bytes,
                             uint8_t *const *columns, uint32_t column_tail) {
  t->delivered += loc->length * r->position_bytes;
  WK_TRY(ensure_cache(r));
  Row row = {dst, dst_bytes, columns};
  uint64_t end = loc->offset + loc->length;
  const WkUnitUse *last = &loc->units[loc->unit_count - 1];
  uint64_t last_end = ((uint64_t)last->unit + 1) * r->cfg.unit_tokens;
  bool tail_elsewhere = column_tail && (last->from_edge || end + column_tail > last_end);
  uint64_t tail = tail_elsewhere ? 0 : column_tail;
  if (loc->unit_count == 2) {
    uint64_t split = (uint64_t)loc->units[1].unit * r->cfg.unit_tokens;
    WK_TRY(read_part(r, t, loc, &loc->units[0], loc->offset, split, 0, &row));
    WK_TRY(read_part(r, t, loc, &loc->units[1], split, end, tail, &row));
  } else {
    WK_TRY(read_part(r, t, loc, &loc->units[0], loc->offset, end, tail, &row));
  }
  return tail_elsewhere ? read_tail(r, loc, column_tail, &row) : WK_OK;
}

void wk_node_reader_read_ahead(WkNodeReader *r, WkUnitRef unit) {
  uint64_t begin = (uint64_t)unit.unit * r->cfg.unit_tokens, end = begin + r->cfg.unit_tokens;
  wk_dataset_advise(r->ds, unit.shard, begin, end, WK_ADVICE_WILLNEED);
  for (uint32_t c = 0; c < r->cfg.column_count; c++)
    wk_dataset_advise_column(r->ds, r->cfg.columns[c], unit.shard, begin, end, WK_ADVICE_WILLNEED);
  uint64_t first, last; /* the records a pad row of this unit takes: those whose first token is in it */
  if (r->cfg.record_column_count == 0 || wk_dataset_first_document(r->ds, unit.shard, begin, &first) != WK_OK ||
      wk_dataset_first_document(r->ds, unit.shard, end, &last) != WK_OK)
    return; /* advice is a hint: a failure shows when the rows are read */
  for (uint32_t c = 0; c < r->cfg.record_column_count; c++)
    wk_dataset_advise_column(r->ds, r->cfg.record_columns[c], unit.shard, first, last, WK_ADVICE_WILLNEED);
}

void wk_node_reader_thread_flush(WkNodeReader *r, WkNodeReaderThread *t) {
  if (t->delivered == 0) return;
  atomic_fetch_add(&r->delivered_bytes, t->delivered);
  WkNodeCache *cache = atomic_load_explicit(&r->cache, memory_order_acquire);
  if (cache) wk_node_cache_add_delivered(cache, t->delivered);
  t->delivered = 0;
}

void wk_node_reader_stats(WkNodeReader *r, WkNodeReaderStats *out) {
  memset(out, 0, sizeof *out);
  out->decoded_bytes = atomic_load(&r->decoded_bytes);
  out->delivered_bytes = atomic_load(&r->delivered_bytes);
  pthread_mutex_lock(&r->lock);
  if (r->cache) wk_node_cache_stats(r->cache, &out->node);
  pthread_mutex_unlock(&r->lock);
}
