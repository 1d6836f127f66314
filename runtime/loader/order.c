/*
 * order.c — the sample sequence of one source: a pure function of (dataset, seed, epoch), arranged so
 * that each unit of decode is read once per epoch while it is resident.
 *
 * Hierarchy (docs/order.md), per epoch:
 *   1. the shards are permuted (Feistel keyed by seed, content fingerprint and epoch) and dealt
 *      round-robin into `partitions` disjoint sets;
 *   2. inside a partition, consecutive shards form windows of at least window_tokens tokens;
 *   3. a window's units (R consecutive blocks of one shard, R x block_tokens >= seq_len + 1) are
 *      permuted and dealt, in permuted order, into buffers of K units (K x unit tokens >= buffer_tokens);
 *   4. the samples of a buffer are permuted together;
 *   5. the source's draws take `chunk` consecutive samples from partition 0, then `chunk` from
 *      partition 1, ... (canonical partitions: with chunk = global_batch / partitions and
 *      partitions = nodes, a node reads only its own partition's shards).
 * So a reader's working set is one buffer (two while ranks straddle a buffer boundary), every unit is
 * decoded once per epoch, and the order inside a buffer is a full shuffle of its samples. Window and
 * buffer are sized in tokens, so the same option means the same mixing whatever the shard size.
 *
 * Samples and units. A sample ("item") is a window of seq_len + 1 tokens at stride seq_len (packed) or
 * the first seq_len + 1 tokens of a document (pad). A unit holds at least seq_len + 1 tokens, so an
 * item lies in one unit or straddles one boundary into the next. An item belongs to the unit of its
 * first token, except a straddler whose next unit is drawn in a later buffer: it belongs to that later
 * unit, and its part in the earlier unit is kept as an "edge" when the earlier unit is decoded (a duty
 * the order hands the reader, see WkSampleLoc). So no unit has to be decoded twice for a few tokens.
 *
 * Nothing per sample is stored: per epoch, O(shards) tables (shard order, windows); per partition, the
 * current window's O(units in window) table, bounded by configuration (a window holds whole shards:
 * window_tokens plus at most one shard).
 * Each epoch has the same length: partitions are cut to the sample count the smallest possible
 * partition is guaranteed to hold, so a few samples per partition sit out each epoch when
 * partitions > 1 (different ones each epoch, since the shard permutation changes).
 */
#include <stdlib.h>
#include <string.h>

#include "stream.h"

enum { FEISTEL_ROUNDS = 6, MIN_FEISTEL_BITS = 2 };

static const uint64_t GOLDEN_GAMMA = 0x9E3779B97F4A7C15ull; /* splitmix64's increment */
enum { KEY_SHARDS = 1, KEY_UNITS = 2, KEY_SAMPLES = 3 };    /* which permutation a key is for */

uint64_t wk_mix64(uint64_t a, uint64_t b) {
  uint64_t x = a ^ (b + GOLDEN_GAMMA + (a << 6) + (a >> 2));
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

/* ---- permutations ------------------------------------------------------------------------------- */

static uint64_t feistel(uint64_t key, unsigned half_bits, uint64_t x, bool inverse) {
  uint64_t mask = (1ull << half_bits) - 1;
  uint64_t left = x >> half_bits, right = x & mask;
  for (uint64_t i = 0; i < FEISTEL_ROUNDS; i++) {
    if (!inverse) {
      uint64_t next = left ^ (wk_mix64(key + i, right) & mask);
      left = right;
      right = next;
    } else { /* undo round FEISTEL_ROUNDS - 1 - i */
      uint64_t previous = right ^ (wk_mix64(key + (FEISTEL_ROUNDS - 1 - i), left) & mask);
      right = left;
      left = previous;
    }
  }
  return (left << half_bits) | right;
}

/* Cycle walking: the network permutes [0, 2^bits) with 2^bits < 4n, so on average fewer than four
 * steps land back inside [0, n), and the restriction is still a bijection (and so is its inverse). */
static uint64_t permute(uint64_t key, uint64_t n, uint64_t i, bool inverse) {
  if (n <= 1) return i;
  unsigned bits = 64u - (unsigned)__builtin_clzll(n - 1);
  if (bits < MIN_FEISTEL_BITS) bits = MIN_FEISTEL_BITS;
  bits += bits & 1u; /* even: two equal halves */
  uint64_t x = i;
  do x = feistel(key, bits / 2, x, inverse);
  while (x >= n);
  return x;
}

uint64_t wk_permute(uint64_t key, uint64_t n, uint64_t i) { return permute(key, n, i, false); }
uint64_t wk_permute_inverse(uint64_t key, uint64_t n, uint64_t i) { return permute(key, n, i, true); }

/* ---- tables ------------------------------------------------------------------------------------- */

/* One unit of the current window, in stored order (its shard's units are consecutive). */
typedef struct {
  uint32_t shard;           /* dataset shard */
  uint32_t unit;            /* unit within the shard */
  uint32_t slot;            /* its place in the window's permuted order (buffer = slot / K) */
  bool straddled;           /* an item crosses the unit's end into the next unit of the shard */
  uint64_t first, end;      /* items whose first token lies in the unit: [first, end) */
  uint64_t straddle_begin, straddle_end; /* that crossing item's tokens, when straddled */
} UnitInfo;

typedef struct {
  bool valid;
  uint32_t index;           /* window of the partition */
  uint64_t units;           /* units in the window */
  UnitInfo *info;           /* [units], stored order */
  uint32_t *unit_at;        /* [units]: slot -> index into info */
  uint64_t *prefix;         /* [units + 1]: items drawn before each slot */
  size_t capacity;          /* entries allocated in the three arrays */
} Window;

typedef struct {
  uint32_t shard_count;     /* shards in the partition this epoch */
  uint32_t *shards;         /* [shard_count], drawn in this order */
  uint32_t window_count;
  uint32_t *window_first;   /* [window_count + 1]: index into shards of each window's first shard */
  uint64_t *window_start;   /* [window_count + 1]: items before each window */
  Window window;            /* the window last located in */
} Partition;

struct WkOrder {
  WkDataset *ds;
  WkOrderConfig config;
  uint32_t shard_count;
  uint64_t *items;          /* items (samples) per shard */
  uint64_t *tokens;         /* tokens per shard */
  uint64_t unit_tokens;     /* tokens per unit (R blocks) */
  uint64_t buffer_units;    /* K */
  uint64_t fingerprint;
  uint64_t epoch_length;
  uint64_t partition_length; /* items each partition contributes per epoch */
  bool have_epoch;
  uint64_t cached_epoch;
  Partition *parts;         /* [partitions] */
};

static uint64_t ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

static uint64_t shard_items(const WkOrderConfig *config, const WkShardInfo *info) {
  if (config->mode == WK_PACK_PAD) return info->documents;
  return info->tokens > config->seq_len ? (info->tokens - 1) / config->seq_len : 0;
}

static uint64_t shard_units(const WkOrder *order, uint32_t shard) {
  return ceil_div(order->tokens[shard], order->unit_tokens);
}

static int compare_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* Shards a partition always gets: floor(S / P). The smallest that many shards can hold bounds
 * every partition's length in every epoch. */
static WkStatus compute_epoch_length(WkOrder *order) {
  uint32_t partitions = order->config.partitions;
  uint64_t per_partition = order->shard_count / partitions;
  uint64_t *sorted = wk_malloc(sizeof(uint64_t) * (order->shard_count + 1u), "order: sorted sample counts");
  if (!sorted) return wk_last_status();
  memcpy(sorted, order->items, sizeof(uint64_t) * order->shard_count);
  qsort(sorted, order->shard_count, sizeof(uint64_t), compare_u64);
  uint64_t guaranteed = 0;
  for (uint64_t i = 0; i < per_partition; i++) guaranteed += sorted[i];
  free(sorted);
  uint64_t chunk = order->config.chunk;
  order->partition_length = guaranteed / chunk * chunk;
  order->epoch_length = order->partition_length * partitions;
  return WK_OK;
}

static WkStatus validate_config(const WkOrderConfig *c, uint32_t shard_count) {
  if (c->seq_len == 0) return WK_FAIL(WK_ERR_INVALID_ARG, "seq_len must be at least 1");
  if (c->mode != WK_PACK_PACKED && c->mode != WK_PACK_PAD)
    return WK_FAIL(WK_ERR_INVALID_ARG, "unknown pack mode %d", (int)c->mode);
  if (c->window_tokens == 0 || c->buffer_tokens == 0)
    return WK_FAIL(WK_ERR_INVALID_ARG, "shuffle window and buffer must be at least 1 token");
  if (c->chunk == 0) return WK_FAIL(WK_ERR_INVALID_ARG, "chunk must be at least 1");
  if (c->partitions == 0 || c->partitions > shard_count)
    return WK_FAIL(WK_ERR_INVALID_ARG, "partitions must be between 1 and the shard count (%u), got %u",
                   shard_count, c->partitions);
  return WK_OK;
}

static WkStatus read_shard_shapes(WkOrder *order) {
  uint32_t block_tokens = 0;
  WK_TRY(wk_dataset_block_tokens(order->ds, &block_tokens));
  uint64_t blocks_per_unit = ceil_div((uint64_t)order->config.seq_len + 1, block_tokens);
  order->unit_tokens = blocks_per_unit * block_tokens;
  order->buffer_units = ceil_div(order->config.buffer_tokens, order->unit_tokens);
  uint64_t fingerprint = wk_mix64(order->shard_count, block_tokens);
  for (uint32_t s = 0; s < order->shard_count; s++) {
    WkShardInfo info;
    WK_TRY(wk_dataset_shard_info(order->ds, s, &info));
    order->items[s] = shard_items(&order->config, &info);
    order->tokens[s] = info.tokens;
    for (const char *p = info.name; *p; p++) fingerprint = wk_mix64(fingerprint, (uint8_t)*p);
    fingerprint = wk_mix64(fingerprint, info.tokens);
    fingerprint = wk_mix64(fingerprint, info.documents);
  }
  order->fingerprint = fingerprint;
  return WK_OK;
}

WkOrder *wk_order_new(WkDataset *ds, const WkOrderConfig *config) {
  uint32_t shard_count = wk_dataset_shard_count(ds);
  if (validate_config(config, shard_count) != WK_OK) return NULL;
  WkOrder *order = wk_calloc(1, sizeof *order, "order");
  if (!order) return NULL;
  order->ds = ds;
  order->config = *config;
  order->shard_count = shard_count;
  order->items = wk_calloc(shard_count, sizeof(uint64_t), "order: samples per shard");
  order->tokens = wk_calloc(shard_count, sizeof(uint64_t), "order: tokens per shard");
  order->parts = wk_calloc(config->partitions, sizeof(Partition), "order: partitions");
  if (!order->items || !order->tokens || !order->parts || read_shard_shapes(order) != WK_OK ||
      compute_epoch_length(order) != WK_OK) {
    wk_order_free(order);
    return NULL;
  }
  return order;
}

static void window_release(Window *w) {
  free(w->info);
  free(w->unit_at);
  free(w->prefix);
  memset(w, 0, sizeof *w);
}

void wk_order_free(WkOrder *order) {
  if (!order) return;
  for (uint32_t k = 0; order->parts && k < order->config.partitions; k++) {
    Partition *p = &order->parts[k];
    free(p->shards);
    free(p->window_first);
    free(p->window_start);
    window_release(&p->window);
  }
  free(order->parts);
  free(order->items);
  free(order->tokens);
  free(order);
}

uint64_t wk_order_epoch_length(const WkOrder *order) { return order->epoch_length; }
uint64_t wk_order_fingerprint(const WkOrder *order) { return order->fingerprint; }
uint64_t wk_order_unit_tokens(const WkOrder *order) { return order->unit_tokens; }
uint64_t wk_order_buffer_units(const WkOrder *order) { return order->buffer_units; }

uint64_t wk_order_total_units(const WkOrder *order) {
  uint64_t total = 0;
  for (uint32_t s = 0; s < order->shard_count; s++) total += shard_units(order, s);
  return total;
}

uint64_t wk_order_max_window_boundaries(const WkOrder *order) {
  /* A window's shards hold fewer than window_tokens tokens before its last shard; boundaries between
   * units lie inside shards. */
  uint64_t largest = 0, total = 0;
  for (uint32_t s = 0; s < order->shard_count; s++) {
    uint64_t units = shard_units(order, s);
    if (order->tokens[s] > largest) largest = order->tokens[s];
    total += units > 0 ? units - 1 : 0;
  }
  uint64_t bound = ceil_div(order->config.window_tokens + largest, order->unit_tokens);
  return bound < total ? bound : total;
}

static uint64_t epoch_key(const WkOrder *order, uint64_t epoch, uint64_t purpose) {
  return wk_mix64(wk_mix64(wk_mix64(order->config.seed, order->fingerprint), epoch), purpose);
}

/* ---- epochs: shards, partitions, windows ----------------------------------------------------------- */

static uint32_t partition_shard_count(const WkOrder *order, uint32_t k) {
  uint32_t partitions = order->config.partitions;
  return order->shard_count / partitions + (k < order->shard_count % partitions ? 1 : 0);
}

/* The t-th shard of partition k in epoch e. */
static uint32_t partition_shard(const WkOrder *order, uint64_t epoch, uint32_t k, uint64_t t) {
  uint64_t position = t * order->config.partitions + k;
  if (!order->config.shuffle) return (uint32_t)position;
  return (uint32_t)wk_permute(epoch_key(order, epoch, KEY_SHARDS), order->shard_count, position);
}

static WkStatus allocate_partition(Partition *p, uint32_t shards) {
  p->shards = wk_malloc(sizeof(uint32_t) * (shards + 1u), "order: shard table");
  p->window_first = wk_malloc(sizeof(uint32_t) * (shards + 1u), "order: window table");
  p->window_start = wk_malloc(sizeof(uint64_t) * (shards + 1u), "order: window table");
  if (!p->shards || !p->window_first || !p->window_start) return wk_last_status();
  p->shard_count = shards;
  return WK_OK;
}

/* Shard order and windows of every partition for one epoch: consecutive shards are grouped until the
 * group holds window_tokens tokens (a larger shard is a window alone). */
static WkStatus build_epoch(WkOrder *order, uint64_t epoch) {
  for (uint32_t k = 0; k < order->config.partitions; k++) {
    Partition *p = &order->parts[k];
    /* A partition's shard count is the same every epoch: allocate once. */
    if (!p->shards) WK_TRY(allocate_partition(p, partition_shard_count(order, k)));
    uint64_t items = 0, window_tokens = 0;
    p->window_count = 0;
    for (uint32_t t = 0; t < p->shard_count; t++) {
      uint32_t shard = p->shards[t] = partition_shard(order, epoch, k, t);
      if (t == 0 || window_tokens >= order->config.window_tokens) {
        p->window_first[p->window_count] = t;
        p->window_start[p->window_count++] = items;
        window_tokens = 0;
      }
      window_tokens += order->tokens[shard];
      items += order->items[shard];
    }
    p->window_first[p->window_count] = p->shard_count;
    p->window_start[p->window_count] = items;
    p->window.valid = false;
  }
  order->cached_epoch = epoch;
  order->have_epoch = true;
  return WK_OK;
}

/* ---- windows: units, their permutation and the items each unit draws ----------------------------- */

static uint64_t window_key(const WkOrder *order, uint64_t epoch, uint32_t k, uint32_t w, uint64_t purpose) {
  return wk_mix64(epoch_key(order, epoch, purpose), ((uint64_t)k << 32) | w);
}

static uint64_t buffer_of(const WkOrder *order, const UnitInfo *u) { return u->slot / order->buffer_units; }

/* The next unit of the same shard, or NULL at the shard's end. */
static const UnitInfo *next_unit(const Window *w, const UnitInfo *u) {
  const UnitInfo *n = u + 1;
  return n < w->info + w->units && n->shard == u->shard ? n : NULL;
}

static const UnitInfo *previous_unit(const Window *w, const UnitInfo *u) {
  if (u == w->info) return NULL;
  return (u - 1)->shard == u->shard ? u - 1 : NULL;
}

/* Items that start and end in u: the ones u draws whatever its neighbours. A unit with none (a shard's
 * short tail) may never be decoded in its own buffer, so no edge is ever expected from it. */
static uint64_t own_items(const UnitInfo *u) { return u->end - u->first - (u->straddled ? 1 : 0); }

/* Which unit draws the item straddling u's end: the next unit when it is drawn in a later buffer and
 * draws items of its own (so it is decoded there anyway); otherwise u. */
static bool straddler_drawn_by_next(const WkOrder *order, const Window *w, const UnitInfo *u) {
  const UnitInfo *n = next_unit(w, u);
  return u->straddled && buffer_of(order, n) > buffer_of(order, u) && own_items(n) > 0;
}

static uint64_t items_drawn(const WkOrder *order, const Window *w, const UnitInfo *u) {
  const UnitInfo *p = previous_unit(w, u);
  uint64_t count = own_items(u);
  if (p && straddler_drawn_by_next(order, w, p)) count++;
  if (u->straddled && !straddler_drawn_by_next(order, w, u)) count++;
  return count;
}

/* Items whose first token lies in [begin, end) of a shard, and whether the last of them crosses end
 * (only when end is inside the shard). Packed: arithmetic; pad: the shard's document index. */
static WkStatus unit_items(WkOrder *order, uint32_t shard, uint64_t begin, uint64_t end, UnitInfo *u) {
  uint64_t items = order->items[shard], L = order->config.seq_len;
  u->straddled = false;
  if (order->config.mode == WK_PACK_PACKED) {
    u->first = ceil_div(begin, L) < items ? ceil_div(begin, L) : items;
    u->end = ceil_div(end, L) < items ? ceil_div(end, L) : items;
  } else {
    WK_TRY(wk_dataset_first_document(order->ds, shard, begin, &u->first));
    WK_TRY(wk_dataset_first_document(order->ds, shard, end, &u->end));
  }
  if (u->end == u->first || end >= order->tokens[shard]) return WK_OK;
  WkSampleLoc last;
  WK_TRY(wk_order_item(order, shard, u->end - 1, &last));
  if (last.offset + last.length > end) {
    u->straddled = true;
    u->straddle_begin = last.offset;
    u->straddle_end = last.offset + last.length;
  }
  return WK_OK;
}

static WkStatus reserve_window(Window *w, uint64_t units) {
  if (units <= w->capacity) return WK_OK;
  window_release(w);
  w->info = wk_malloc(sizeof(UnitInfo) * units, "order: window units");
  w->unit_at = wk_malloc(sizeof(uint32_t) * units, "order: window slots");
  w->prefix = wk_malloc(sizeof(uint64_t) * (units + 1), "order: window prefix");
  if (!w->info || !w->unit_at || !w->prefix) {
    window_release(w);
    return wk_last_status();
  }
  w->capacity = units;
  return WK_OK;
}

static WkStatus build_window(WkOrder *order, uint64_t epoch, uint32_t k, uint32_t index) {
  Partition *p = &order->parts[k];
  Window *w = &p->window;
  w->valid = false;
  uint64_t units = 0;
  for (uint32_t t = p->window_first[index]; t < p->window_first[index + 1]; t++) units += shard_units(order, p->shards[t]);
  if (units > UINT32_MAX)
    return WK_FAIL(WK_ERR_INVALID_ARG, "a shuffle window of %llu units is too large; lower shuffle.window_tokens",
                   (unsigned long long)units);
  WK_TRY(reserve_window(w, units > 0 ? units : 1)); /* a window of empty shards still has its prefix[0] */
  w->units = units;
  w->index = index;
  uint64_t key = window_key(order, epoch, k, index, KEY_UNITS);
  uint64_t i = 0;
  for (uint32_t t = p->window_first[index]; t < p->window_first[index + 1]; t++) {
    uint32_t shard = p->shards[t];
    for (uint64_t u = 0; u < shard_units(order, shard); u++, i++) {
      UnitInfo *info = &w->info[i];
      uint64_t begin = u * order->unit_tokens, end = begin + order->unit_tokens;
      if (end > order->tokens[shard]) end = order->tokens[shard];
      info->shard = shard;
      info->unit = (uint32_t)u;
      info->slot = (uint32_t)(order->config.shuffle ? wk_permute_inverse(key, units, i) : i);
      WK_TRY(unit_items(order, shard, begin, end, info));
      w->unit_at[info->slot] = (uint32_t)i;
    }
  }
  w->prefix[0] = 0;
  for (uint64_t s = 0; s < units; s++) w->prefix[s + 1] = w->prefix[s] + items_drawn(order, w, &w->info[w->unit_at[s]]);
  if (w->prefix[units] != p->window_start[index + 1] - p->window_start[index])
    return WK_FAIL(WK_ERR_INTERNAL, "order: window %u holds %llu samples, expected %llu", index,
                   (unsigned long long)w->prefix[units],
                   (unsigned long long)(p->window_start[index + 1] - p->window_start[index]));
  w->valid = true;
  return WK_OK;
}

/* ---- locating ----------------------------------------------------------------------------------- */

/* Last i in [lo, hi) with table[i] <= q (table[lo] <= q is given). */
static uint64_t last_at_most(const uint64_t *table, uint64_t lo, uint64_t hi, uint64_t q) {
  while (hi - lo > 1) {
    uint64_t mid = lo + (hi - lo) / 2;
    if (table[mid] <= q) lo = mid; else hi = mid;
  }
  return lo;
}

/* Position q of partition k (its q-th item this epoch) as an absolute draw of the source. */
static uint64_t draw_of(const WkOrder *order, uint64_t epoch, uint32_t k, uint64_t q) {
  uint64_t chunk = order->config.chunk;
  if (q >= order->partition_length) q = order->partition_length - 1; /* sits out this epoch: never drawn */
  return epoch * order->epoch_length + q / chunk * chunk * order->config.partitions + k * chunk + q % chunk;
}

/* The absolute draws of the first and last item of buffer b of the partition's current window. */
static WkHold buffer_hold(const WkOrder *order, uint64_t epoch, uint32_t k, uint64_t b) {
  const Partition *p = &order->parts[k];
  uint64_t first_slot = b * order->buffer_units, end_slot = first_slot + order->buffer_units;
  if (end_slot > p->window.units) end_slot = p->window.units;
  uint64_t start = p->window_start[p->window.index];
  return (WkHold){.from = draw_of(order, epoch, k, start + p->window.prefix[first_slot]),
                  .until = draw_of(order, epoch, k, start + p->window.prefix[end_slot] - 1)};
}

WkStatus wk_order_item(WkOrder *order, uint32_t shard, uint64_t item, WkSampleLoc *out) {
  memset(out, 0, sizeof *out);
  out->shard = shard;
  out->item = item;
  if (order->config.mode == WK_PACK_PAD) {
    WK_TRY(wk_dataset_document(order->ds, shard, item, &out->offset, &out->length));
    if (out->length > order->config.seq_len + 1u) out->length = order->config.seq_len + 1u;
    return WK_OK;
  }
  out->offset = item * order->config.seq_len;
  out->length = (uint64_t)order->config.seq_len + 1;
  return WK_OK;
}

/* Unit u as the loader's reads see it: where it stays resident until, and the edges its decoder saves:
 * its parts of straddlers drawn in a later buffer (only when u is decoded in its own buffer). */
static WkUnitUse unit_use(const WkOrder *order, uint64_t epoch, uint32_t k, const UnitInfo *u) {
  const Window *w = &order->parts[k].window;
  WkUnitUse use = {.unit = u->unit, .hold = buffer_hold(order, epoch, k, buffer_of(order, u))};
  if (own_items(u) == 0) return use;
  const UnitInfo *p = previous_unit(w, u), *n = next_unit(w, u);
  if (p && p->straddled && !straddler_drawn_by_next(order, w, p) && buffer_of(order, p) > buffer_of(order, u))
    use.duty[use.duties++] = (WkEdgeDuty){.begin = (uint64_t)u->unit * order->unit_tokens, .end = p->straddle_end,
                                          .boundary = u->unit, .hold_until = buffer_hold(order, epoch, k, buffer_of(order, p)).until};
  if (straddler_drawn_by_next(order, w, u))
    use.duty[use.duties++] = (WkEdgeDuty){.begin = u->straddle_begin, .end = (uint64_t)n->unit * order->unit_tokens,
                                          .boundary = n->unit, .hold_until = buffer_hold(order, epoch, k, buffer_of(order, n)).until};
  return use;
}

/* The other unit of a straddler drawn by `drawer`: its part is an edge when it was decoded in an earlier
 * buffer; otherwise it is read now (same buffer, or a unit that draws nothing itself), held as long
 * as the drawer. */
static WkUnitUse other_use(const WkOrder *order, uint64_t epoch, uint32_t k, const UnitInfo *other,
                           const WkUnitUse *drawer, uint64_t drawer_buffer) {
  WkUnitUse use = unit_use(order, epoch, k, other);
  use.from_edge = buffer_of(order, other) < drawer_buffer && own_items(other) > 0;
  if (!use.from_edge && buffer_of(order, other) != drawer_buffer) {
    use.hold = drawer->hold;
    use.duties = 0;
  }
  return use;
}

/* Item r of what unit u draws: [the straddler from the previous unit] [its own items] [its straddler]. */
static WkStatus locate_in_unit(WkOrder *order, uint64_t epoch, uint32_t k, const UnitInfo *u, uint64_t r,
                               WkSampleLoc *out) {
  const Window *w = &order->parts[k].window;
  const UnitInfo *p = previous_unit(w, u), *n = next_unit(w, u);
  bool from_previous = p && straddler_drawn_by_next(order, w, p);
  WkUnitUse home = unit_use(order, epoch, k, u);
  uint64_t buffer = buffer_of(order, u);
  if (from_previous && r == 0) { /* the previous unit's straddler */
    WK_TRY(wk_order_item(order, u->shard, p->end - 1, out));
    out->units[0] = other_use(order, epoch, k, p, &home, buffer);
    out->units[1] = home;
    out->unit_count = 2;
    return WK_OK;
  }
  r -= from_previous;
  WK_TRY(wk_order_item(order, u->shard, u->first + r, out));
  out->units[0] = home;
  out->unit_count = 1;
  if (r == own_items(u)) { /* u's own straddler, drawn with u */
    out->units[1] = other_use(order, epoch, k, n, &home, buffer);
    out->unit_count = 2;
  }
  return WK_OK;
}

/* The partition, window (built) and buffer of draw c of an epoch, and c's position in the partition. */
typedef struct {
  uint32_t k;
  uint64_t q, buffer, first_slot, end_slot;
} Place;

static WkStatus find_buffer(WkOrder *order, uint64_t epoch, uint64_t c, Place *out) {
  if (c >= order->epoch_length)
    return WK_FAIL(WK_ERR_INVALID_ARG, "sample %llu is past the epoch length %llu", (unsigned long long)c,
                   (unsigned long long)order->epoch_length);
  if (!order->have_epoch || order->cached_epoch != epoch) WK_TRY(build_epoch(order, epoch));
  uint64_t chunk = order->config.chunk, partitions = order->config.partitions;
  out->k = (uint32_t)((c / chunk) % partitions);
  out->q = c / (chunk * partitions) * chunk + c % chunk;
  Partition *p = &order->parts[out->k];
  uint32_t index = (uint32_t)last_at_most(p->window_start, 0, p->window_count, out->q);
  if (!p->window.valid || p->window.index != index) WK_TRY(build_window(order, epoch, out->k, index));
  const Window *w = &p->window;
  uint64_t K = order->buffer_units, q_window = out->q - p->window_start[index];
  /* The buffer holding q: buffers are runs of K slots; binary search over their first slots. */
  uint64_t lo = 0, hi = (w->units + K - 1) / K;
  while (hi - lo > 1) {
    uint64_t mid = lo + (hi - lo) / 2;
    if (w->prefix[mid * K] <= q_window) lo = mid; else hi = mid;
  }
  out->buffer = lo;
  out->first_slot = lo * K;
  out->end_slot = out->first_slot + K < w->units ? out->first_slot + K : w->units;
  return WK_OK;
}

WkStatus wk_order_locate(WkOrder *order, uint64_t epoch, uint64_t c, WkSampleLoc *out) {
  Place at;
  WK_TRY(find_buffer(order, epoch, c, &at));
  const Partition *p = &order->parts[at.k];
  const Window *w = &p->window;
  uint64_t base = w->prefix[at.first_slot], size = w->prefix[at.end_slot] - base;
  uint64_t i = at.q - p->window_start[w->index] - base;
  if (order->config.shuffle) i = wk_permute(wk_mix64(window_key(order, epoch, at.k, w->index, KEY_SAMPLES), at.buffer), size, i);
  uint64_t slot = last_at_most(w->prefix, at.first_slot, at.end_slot, base + i);
  WK_TRY(locate_in_unit(order, epoch, at.k, &w->info[w->unit_at[slot]], base + i - w->prefix[slot], out));
  out->draw = draw_of(order, epoch, at.k, at.q);
  out->buffer_from = buffer_hold(order, epoch, at.k, at.buffer).from;
  return WK_OK;
}

WkStatus wk_order_units_after(WkOrder *order, uint64_t epoch, uint64_t c, uint32_t ahead, WkUnitRef *out,
                              uint32_t capacity, uint32_t *count) {
  Place at;
  *count = 0;
  WK_TRY(find_buffer(order, epoch, c, &at));
  const Window *w = &order->parts[at.k].window;
  uint64_t first = at.first_slot + (uint64_t)ahead * order->buffer_units;
  uint64_t end = first + order->buffer_units < w->units ? first + order->buffer_units : w->units;
  for (uint64_t slot = first; slot < end && *count < capacity; slot++) {
    const UnitInfo *u = &w->info[w->unit_at[slot]];
    out[(*count)++] = (WkUnitRef){.shard = u->shard, .unit = u->unit};
  }
  return WK_OK;
}
