/*
 * fuzz_shard.c — libFuzzer target for the shard reader: header, block table, document index and
 * block decoding (wk_shard_view_* and wk_block_decode, the code wk_dataset_read runs), over an
 * in-memory blob, with and without a zero-copy map.
 *
 * Random bytes rarely get past a checksum, so when the first input byte is odd the target first
 * repairs every checksum it can find (header, table, document index, blocks) and so reaches the
 * checks behind them.
 *
 *   make fuzz && build/fuzz/fuzz_shard -max_total_time=60 /tmp/new-inputs tests/fuzz/corpus/shard
 */
#include <stdlib.h>
#include <string.h>

#include "format/shard.h"

enum { MAX_DECODE_BYTES = 1 << 22, MAX_BLOCKS = 256, MAX_DOCS = 4096 };

typedef struct {
  WkBlob base;
  const uint8_t *data;
  bool mappable;
} MemorySource;

static WkStatus memory_read_at(WkBlob *self, uint64_t offset, size_t length, void *dst) {
  MemorySource *m = (MemorySource *)self;
  if (offset > self->size || length > self->size - offset)
    return WK_FAIL(WK_ERR_FORMAT, "'%s': read past the end", self->name);
  memcpy(dst, m->data + offset, length);
  return WK_OK;
}

static const void *memory_map(WkBlob *self, uint64_t offset, size_t length) {
  MemorySource *m = (MemorySource *)self;
  if (!m->mappable || offset > self->size || length > self->size - offset) return NULL;
  return m->data + offset;
}

static void put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* Recomputes whichever checksums point at bytes inside the file. */
static void repair(uint8_t *d, size_t size) {
  if (size < WK_SHARD_HEADER_BYTES) return;
  uint64_t documents = get64(d + 40), table = get64(d + 80), docs = get64(d + 88);
  uint32_t block_count = (uint32_t)(get64(d + 56) & 0xffffffffu);
  if (table <= size && (uint64_t)block_count * WK_SHARD_BLOCK_ENTRY_BYTES <= size - table) {
    for (uint32_t b = 0; b < block_count; b++) {
      uint8_t *e = d + table + (size_t)b * WK_SHARD_BLOCK_ENTRY_BYTES;
      uint64_t offset = get64(e);
      uint32_t stored = (uint32_t)get64(e + 8);
      if (offset <= size && stored <= size - offset && offset + stored <= table)
        put64(e + 16, wk_hash64(d + offset, stored));
    }
    put64(d + 96, wk_hash64(d + table, (size_t)block_count * WK_SHARD_BLOCK_ENTRY_BYTES));
  }
  if (docs <= size && documents <= (size - docs) / 8) put64(d + 104, wk_hash64(d + docs, (size_t)documents * 8));
  put64(d + 120, wk_hash64(d, 120));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  uint8_t mode = data[0];
  size--;
  uint8_t *copy = malloc(size ? size : 1);
  memcpy(copy, data + 1, size);
  if (mode & 1) repair(copy, size);
  MemorySource src = {.base = {.name = "fuzz.wks", .size = size, .read_at = memory_read_at, .map = memory_map},
                      .data = copy, .mappable = (mode & 2) != 0};
  WkShardView v;
  if (wk_shard_view_open(&src.base, "fuzz.wks", &v) == WK_OK) {
    const WkShardHeader *h = &v.h;
    for (uint32_t b = 0; b < h->block_count && b < MAX_BLOCKS; b++) {
      size_t decoded = (size_t)wk_block_token_count(h, b) * h->token_bytes;
      if (decoded > MAX_DECODE_BYTES) continue;
      WkBlockEntry e;
      const uint8_t *stored;
      uint8_t *stored_copy;
      if (wk_shard_view_stored(&v, b, &e, &stored, &stored_copy) != WK_OK) continue;
      uint8_t *out = malloc(decoded ? decoded : 1);
      if (wk_block_decode(h, &e, b, stored, out, "fuzz.wks") == WK_OK) {
        uint32_t *wide = malloc((decoded / h->token_bytes + 1) * sizeof *wide);
        wk_tokens_widen(out, h->token_bytes, decoded / h->token_bytes, wide, sizeof *wide);
        free(wide);
      }
      free(out);
      free(stored_copy);
    }
    for (uint64_t d = 0; d < h->documents && d < MAX_DOCS; d++) {
      uint64_t start, length;
      if (wk_shard_view_document(&v, d, &start, &length) == WK_OK && start + length >= h->tokens) abort();
    }
    wk_shard_view_release(&v);
  }
  free(copy);
  return 0;
}
