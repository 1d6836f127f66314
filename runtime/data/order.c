/*
 * order.c — the sample sequence of one source: a pure function of (dataset, seed, epoch).
 *
 * Hierarchy (DESIGN §3):
 *   1. the shards are permuted per epoch (Feistel, keyed by seed, content fingerprint and epoch);
 *   2. the permuted list is dealt round-robin into `partitions` disjoint shard sets;
 *   3. inside a partition, consecutive runs of `window` shards form windows, and the samples of a
 *      window are permuted together: the working set is `window` shards, yet the order within it is
 *      a full-quality shuffle;
 *   4. the source's draws take `chunk` consecutive samples from partition 0, then `chunk` from
 *      partition 1, ... so a node that reads a contiguous slice of every global batch (chunk =
 *      global_batch / partitions, partitions = nodes) touches only its own partition's shards.
 *
 * Nothing per sample is stored: one epoch's shard order and window table (O(shards) integers, like
 * the index itself) are cached.
 * Each epoch has the same length: partitions are cut to the sample count the smallest possible
 * partition is guaranteed to hold, so a few samples per partition sit out each epoch when
 * partitions > 1 (different ones each epoch, since the shard permutation changes).
 */
#include <stdlib.h>
#include <string.h>

#include "stream.h"

enum { FEISTEL_ROUNDS = 6, MIN_FEISTEL_BITS = 2 };

static const uint64_t GOLDEN_GAMMA = 0x9E3779B97F4A7C15ull; /* splitmix64's increment */
enum { KEY_SHARDS = 1, KEY_WINDOW = 2 };                    /* which permutation a key is for */

uint64_t wk_mix64(uint64_t a, uint64_t b) {
  uint64_t x = a ^ (b + GOLDEN_GAMMA + (a << 6) + (a >> 2));
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

static uint64_t feistel(uint64_t key, unsigned half_bits, uint64_t x) {
  uint64_t mask = (1ull << half_bits) - 1;
  uint64_t left = x >> half_bits, right = x & mask;
  for (uint64_t round = 0; round < FEISTEL_ROUNDS; round++) {
    uint64_t next = left ^ (wk_mix64(key + round, right) & mask);
    left = right;
    right = next;
  }
  return (left << half_bits) | right;
}

uint64_t wk_permute(uint64_t key, uint64_t n, uint64_t i) {
  if (n <= 1) return i;
  unsigned bits = 64u - (unsigned)__builtin_clzll(n - 1);
  if (bits < MIN_FEISTEL_BITS) bits = MIN_FEISTEL_BITS;
  bits += bits & 1u; /* even: two equal halves */
  /* Cycle walking: the network permutes [0, 2^bits) with 2^bits < 4n, so on average fewer than
   * four steps land back inside [0, n), and the restriction is still a bijection. */
  uint64_t x = i;
  do x = feistel(key, bits / 2, x);
  while (x >= n);
  return x;
}

struct WkOrder {
  WkDataset *ds;
  WkOrderConfig config;
  uint32_t shard_count;
  uint64_t *samples;  /* samples in each shard */
  uint64_t fingerprint;
  uint64_t epoch_length;
  uint64_t partition_length; /* samples each partition contributes per epoch */
  /* Window table of the cached epoch: for partition k, windows[k] windows whose sample counts
   * start at prefix[k][u]; prefix[k][windows[k]] is the partition's total. */
  bool have_epoch;
  uint64_t cached_epoch;
  uint32_t *windows;
  uint64_t **prefix;
  uint32_t **shards; /* shards[k][t]: the t-th shard of partition k this epoch */
};

static uint64_t shard_samples(const WkOrderConfig *config, const WkShardInfo *info) {
  if (config->mode == WK_PACK_PAD) return info->documents;
  return info->tokens > config->seq_len ? (info->tokens - 1) / config->seq_len : 0;
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
  memcpy(sorted, order->samples, sizeof(uint64_t) * order->shard_count);
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
  if (c->window == 0) return WK_FAIL(WK_ERR_INVALID_ARG, "shuffle window must be at least 1 shard");
  if (c->chunk == 0) return WK_FAIL(WK_ERR_INVALID_ARG, "chunk must be at least 1");
  if (c->partitions == 0 || c->partitions > shard_count)
    return WK_FAIL(WK_ERR_INVALID_ARG, "partitions must be between 1 and the shard count (%u), got %u",
                   shard_count, c->partitions);
  return WK_OK;
}

static WkStatus read_shard_shapes(WkOrder *order) {
  uint64_t fingerprint = order->shard_count;
  for (uint32_t s = 0; s < order->shard_count; s++) {
    WkShardInfo info;
    WK_TRY(wk_dataset_shard_info(order->ds, s, &info));
    order->samples[s] = shard_samples(&order->config, &info);
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
  order->samples = wk_calloc(shard_count, sizeof(uint64_t), "order: samples per shard");
  order->windows = wk_calloc(config->partitions, sizeof(uint32_t), "order: windows per partition");
  order->prefix = wk_calloc(config->partitions, sizeof(uint64_t *), "order: window table");
  order->shards = wk_calloc(config->partitions, sizeof(uint32_t *), "order: shard table");
  if (!order->samples || !order->windows || !order->prefix || !order->shards || read_shard_shapes(order) != WK_OK ||
      compute_epoch_length(order) != WK_OK) {
    wk_order_free(order);
    return NULL;
  }
  return order;
}

void wk_order_free(WkOrder *order) {
  if (!order) return;
  for (uint32_t k = 0; order->prefix && k < order->config.partitions; k++) free(order->prefix[k]);
  for (uint32_t k = 0; order->shards && k < order->config.partitions; k++) free(order->shards[k]);
  free(order->prefix);
  free(order->shards);
  free(order->windows);
  free(order->samples);
  free(order);
}

uint64_t wk_order_epoch_length(const WkOrder *order) { return order->epoch_length; }
uint64_t wk_order_fingerprint(const WkOrder *order) { return order->fingerprint; }

static uint64_t epoch_key(const WkOrder *order, uint64_t epoch, uint64_t purpose) {
  return wk_mix64(wk_mix64(wk_mix64(order->config.seed, order->fingerprint), epoch), purpose);
}

/* The t-th shard of partition k in epoch e. */
static uint32_t partition_shard(const WkOrder *order, uint64_t epoch, uint32_t k, uint64_t t) {
  uint64_t position = t * order->config.partitions + k;
  if (!order->config.shuffle) return (uint32_t)position;
  return (uint32_t)wk_permute(epoch_key(order, epoch, KEY_SHARDS), order->shard_count, position);
}

static uint64_t partition_shard_count(const WkOrder *order, uint32_t k) {
  uint32_t partitions = order->config.partitions;
  return order->shard_count / partitions + (k < order->shard_count % partitions ? 1 : 0);
}

static WkStatus build_epoch(WkOrder *order, uint64_t epoch) {
  uint32_t window = order->config.window;
  for (uint32_t k = 0; k < order->config.partitions; k++) {
    uint64_t shards = partition_shard_count(order, k);
    uint32_t windows = (uint32_t)((shards + window - 1) / window);
    if (!order->prefix[k]) {
      /* A partition's shard and window counts are the same every epoch: allocate once. */
      order->prefix[k] = wk_malloc(sizeof(uint64_t) * (windows + 1u), "order: window table");
      order->shards[k] = wk_malloc(sizeof(uint32_t) * (shards + 1u), "order: shard table");
      if (!order->prefix[k] || !order->shards[k]) return wk_last_status();
      order->windows[k] = windows;
    }
    uint64_t total = 0;
    for (uint64_t t = 0; t < shards; t++) {
      if (t % window == 0) order->prefix[k][t / window] = total;
      order->shards[k][t] = partition_shard(order, epoch, k, t);
      total += order->samples[order->shards[k][t]];
    }
    order->prefix[k][windows] = total;
  }
  order->cached_epoch = epoch;
  order->have_epoch = true;
  return WK_OK;
}

/* Last window u with prefix[u] <= q (binary search). */
static uint32_t find_window(const uint64_t *prefix, uint32_t windows, uint64_t q) {
  uint32_t lo = 0, hi = windows;
  while (hi - lo > 1) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (prefix[mid] <= q) lo = mid; else hi = mid;
  }
  return lo;
}

static WkStatus locate_item(WkOrder *order, uint32_t shard, uint64_t item, WkSampleLoc *out) {
  out->shard = shard;
  out->item = item;
  if (order->config.mode == WK_PACK_PAD) return wk_dataset_document(order->ds, shard, item, &out->offset, &out->length);
  out->offset = item * order->config.seq_len;
  out->length = (uint64_t)order->config.seq_len + 1;
  return WK_OK;
}

WkStatus wk_order_locate(WkOrder *order, uint64_t epoch, uint64_t c, WkSampleLoc *out) {
  if (c >= order->epoch_length)
    return WK_FAIL(WK_ERR_INVALID_ARG, "sample %llu is past the epoch length %llu", (unsigned long long)c,
                   (unsigned long long)order->epoch_length);
  if (!order->have_epoch || order->cached_epoch != epoch) WK_TRY(build_epoch(order, epoch));
  uint64_t chunk = order->config.chunk, partitions = order->config.partitions;
  uint32_t k = (uint32_t)((c / chunk) % partitions);
  uint64_t local = c / (chunk * partitions) * chunk + c % chunk;
  uint32_t u = find_window(order->prefix[k], order->windows[k], local);
  uint64_t window_start = order->prefix[k][u];
  uint64_t window_size = order->prefix[k][u + 1] - window_start;
  uint64_t q = local - window_start;
  if (order->config.shuffle)
    q = wk_permute(wk_mix64(epoch_key(order, epoch, KEY_WINDOW), ((uint64_t)k << 32) | u), window_size, q);
  /* Walk the window's shards (at most `window` of them) to the one holding sample q. */
  uint64_t shards = partition_shard_count(order, k);
  for (uint64_t t = (uint64_t)u * order->config.window; t < shards; t++) {
    uint32_t shard = order->shards[k][t];
    if (q < order->samples[shard]) return locate_item(order, shard, q, out);
    q -= order->samples[shard];
  }
  return WK_FAIL(WK_ERR_INTERNAL, "order: sample %llu of epoch %llu fell outside its window",
                 (unsigned long long)c, (unsigned long long)epoch);
}
