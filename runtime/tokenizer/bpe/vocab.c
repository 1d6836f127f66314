/*
 * vocab.c — a model's tokens: id -> bytes, bytes -> id (open addressing over XXH3 hashes), and the
 * merge table (pair of ids -> rank and merged id, open addressing over the pair).
 *
 * Both tables are built once, while loading, and only read afterwards (from every encoding thread).
 */
#include <stdlib.h>
#include <string.h>
#define XXH_INLINE_ALL  /* XXH3 inlined: tokens are short */
#include <xxhash.h>

#include "bpe.h"

enum { INDEX_EMPTY_SLOT = 0 };  /* slots hold tag << 32 | (id + 1); 0 is empty */

WkStatus vocab_init(Vocab *v, uint32_t count) {
  memset(v, 0, sizeof *v);
  v->count = count;
  v->start = wk_calloc(count ? count : 1, sizeof *v->start, "token offsets");
  v->length = wk_calloc(count ? count : 1, sizeof *v->length, "token lengths");
  v->present = wk_calloc(count ? count : 1, 1, "token table");
  if (!v->start || !v->length || !v->present) return wk_last_status();
  return WK_OK;
}

void vocab_free(Vocab *v) {
  free(v->start);
  free(v->length);
  free(v->present);
  free(v->bytes);
  free(v->index);
  memset(v, 0, sizeof *v);
}

WkStatus vocab_set(Vocab *v, uint32_t id, const uint8_t *bytes, size_t length, const char *source) {
  if (id >= v->count) return WK_FAIL(WK_ERR_INTERNAL, "%s: token id %u past the table (%u)", source, id, v->count);
  if (v->present[id]) return WK_FAIL(WK_ERR_FORMAT, "%s: token id %u is given twice", source, id);
  if (length == 0) return WK_FAIL(WK_ERR_FORMAT, "%s: token %u is empty", source, id);
  if (length > UINT32_MAX) return WK_FAIL(WK_ERR_FORMAT, "%s: token %u is longer than 4 GiB", source, id);
  if (v->bytes_length + length > v->bytes_capacity) {
    size_t cap = v->bytes_capacity ? v->bytes_capacity : 1 << 16;
    while (cap < v->bytes_length + length) cap *= 2;
    uint8_t *grown = realloc(v->bytes, cap);
    if (!grown) return WK_FAIL(WK_ERR_NOMEM, "%s: out of memory for %zu bytes of tokens", source, cap);
    v->bytes = grown;
    v->bytes_capacity = cap;
  }
  memcpy(v->bytes + v->bytes_length, bytes, length);
  v->start[id] = v->bytes_length;
  v->length[id] = (uint32_t)length;
  v->present[id] = 1;
  v->bytes_length += length;
  if (length > v->max_token_bytes) v->max_token_bytes = (uint32_t)length;
  return WK_OK;
}

static uint64_t bytes_hash(const uint8_t *bytes, size_t length) { return XXH3_64bits(bytes, length); }

WkStatus vocab_finish(Vocab *v) {
  uint64_t slots = 16;
  while (slots < 2 * (uint64_t)v->count) slots *= 2;
  v->index = wk_calloc(slots, sizeof *v->index, "token index");
  if (!v->index) return wk_last_status();
  v->index_mask = slots - 1;
  for (uint32_t id = 0; id < v->count; id++) {
    if (!v->present[id]) continue;
    size_t length;
    const uint8_t *bytes = vocab_bytes(v, id, &length);
    uint64_t h = bytes_hash(bytes, length);
    uint64_t i = h & v->index_mask;
    while (v->index[i] != INDEX_EMPTY_SLOT) {
      uint32_t other = (uint32_t)v->index[i] - 1;
      size_t other_length;
      const uint8_t *other_bytes = vocab_bytes(v, other, &other_length);
      if (other_length == length && memcmp(other_bytes, bytes, length) == 0)
        return WK_FAIL(WK_ERR_FORMAT, "tokens %u and %u stand for the same %zu bytes", other, id, length);
      i = (i + 1) & v->index_mask;
    }
    v->index[i] = (h >> 32) << 32 | ((uint64_t)id + 1);
  }
  return WK_OK;
}

uint32_t vocab_find(const Vocab *v, const uint8_t *bytes, size_t length) {
  uint64_t h = bytes_hash(bytes, length), tag = h >> 32;
  for (uint64_t i = h & v->index_mask;; i = (i + 1) & v->index_mask) {
    uint64_t slot = v->index[i];
    if (slot == INDEX_EMPTY_SLOT) return BPE_NO_TOKEN;
    if (slot >> 32 != tag) continue;
    uint32_t id = (uint32_t)slot - 1;
    if (v->length[id] == length && memcmp(v->bytes + v->start[id], bytes, length) == 0) return id;
  }
}

/* ---- merges ------------------------------------------------------------------------------------ */

WkStatus pairs_init(PairTable *p, size_t expected) {
  uint64_t slots = 16;
  while (slots < 2 * (uint64_t)expected) slots *= 2;
  p->slots = wk_malloc(slots * sizeof *p->slots, "merge table");
  if (!p->slots) return wk_last_status();
  for (uint64_t i = 0; i < slots; i++) p->slots[i].key = UINT64_MAX;
  p->mask = slots - 1;
  p->count = 0;
  return WK_OK;
}

void pairs_free(PairTable *p) {
  free(p->slots);
  memset(p, 0, sizeof *p);
}

/* Doubles the table when it is more than half full (the loaders may not know the count ahead). */
static WkStatus pairs_grow(PairTable *p) {
  PairTable bigger;
  WK_TRY(pairs_init(&bigger, (size_t)(p->mask + 1)));
  for (uint64_t i = 0; i <= p->mask; i++) {
    PairSlot *s = &p->slots[i];
    if (s->key == UINT64_MAX) continue;
    uint64_t j = pair_hash(s->key) & bigger.mask;
    while (bigger.slots[j].key != UINT64_MAX) j = (j + 1) & bigger.mask;
    bigger.slots[j] = *s;
  }
  bigger.count = p->count;
  free(p->slots);
  *p = bigger;
  return WK_OK;
}

WkStatus pairs_put(PairTable *p, uint32_t left, uint32_t right, uint32_t rank, uint32_t merged) {
  if (2 * (p->count + 1) > p->mask + 1) WK_TRY(pairs_grow(p));
  uint64_t key = (uint64_t)left << 32 | right;
  uint64_t i = pair_hash(key) & p->mask;
  while (p->slots[i].key != UINT64_MAX && p->slots[i].key != key) i = (i + 1) & p->mask;
  if (p->slots[i].key == UINT64_MAX) p->count++;
  p->slots[i] = (PairSlot){.key = key, .rank = rank, .merged = merged};
  return WK_OK;
}
