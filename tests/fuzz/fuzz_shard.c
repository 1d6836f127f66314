/*
 * fuzz_shard.c — libFuzzer target for the shard reader: header, block table, document index and
 * block decoding (wk_shard_view_* and wk_block_decode, the code wk_dataset_read runs), and in version 2
 * the column table, each column's block table and its blocks (blobs included), over an in-memory blob,
 * with and without a zero-copy map.
 *
 * Random bytes rarely get past a checksum, so when the first input byte is odd the target first
 * repairs every checksum it can find (header, table, document index, blocks, column table, column
 * block tables and column blocks) and so reaches the checks behind them. Seeds of version 2:
 * tests/fuzz/corpus/shard/v2-*.wks (written by the shard writer with every column kind).
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

/* Recomputes the checksums of a block table's blocks (those inside the payload before `end`) and
 * returns the table's own, or 0 when the table is not inside the file. */
static uint64_t repair_table(uint8_t *d, size_t size, uint64_t table, uint32_t block_count, uint64_t end) {
  if (table > size || (uint64_t)block_count * WK_SHARD_BLOCK_ENTRY_BYTES > size - table) return 0;
  for (uint32_t b = 0; b < block_count; b++) {
    uint8_t *e = d + table + (size_t)b * WK_SHARD_BLOCK_ENTRY_BYTES;
    uint64_t offset = get64(e);
    uint32_t stored = (uint32_t)get64(e + 8);
    if (offset <= size && stored <= size - offset && offset + stored <= end) put64(e + 16, wk_hash64(d + offset, stored));
  }
  return wk_hash64(d + table, (size_t)block_count * WK_SHARD_BLOCK_ENTRY_BYTES);
}

/* Recomputes whichever checksums point at bytes inside the file. */
static void repair(uint8_t *d, size_t size) {
  if (size < WK_SHARD_HEADER_BYTES) return;
  uint64_t documents = get64(d + 40), table = get64(d + 80), docs = get64(d + 88);
  uint32_t block_count = (uint32_t)(get64(d + 56) & 0xffffffffu);
  if (table <= size && (uint64_t)block_count * WK_SHARD_BLOCK_ENTRY_BYTES <= size - table)
    put64(d + 96, repair_table(d, size, table, block_count, table));
  if (docs <= size && documents <= (size - docs) / 8) {
    put64(d + 104, wk_hash64(d + docs, (size_t)documents * 8));
    /* Version 2: the column table after the document index, each entry's block table and blocks. */
    uint64_t columns = docs + documents * 8;
    uint32_t column_count = (uint32_t)(get64(d + 68) & 0xffffffffu);
    if (column_count < WK_MAX_COLUMNS && (uint64_t)column_count * WK_SHARD_COLUMN_ENTRY_BYTES <= size - columns) {
      for (uint32_t c = 0; c < column_count; c++) {
        uint8_t *e = d + columns + (size_t)c * WK_SHARD_COLUMN_ENTRY_BYTES;
        put64(e + 96, repair_table(d, size, get64(e + 88), (uint32_t)(get64(e + 80) & 0xffffffffu), table));
      }
      put64(d + 112, wk_hash64(d + columns, (size_t)column_count * WK_SHARD_COLUMN_ENTRY_BYTES));
    }
  }
  put64(d + 120, wk_hash64(d, 120));
}

/* Reads and decodes the blocks of each column (bounded), as wk_dataset_read_column and read_blob do. */
static void read_columns(const WkShardView *v) {
  for (uint32_t c = 0; c < v->column_count; c++) {
    const WkBlockLayout *l = &v->columns[c].layout;
    for (uint32_t b = 0; b < l->block_count && b < MAX_BLOCKS; b++) {
      WkBlockEntry e;
      const uint8_t *stored;
      uint8_t *stored_copy;
      uint64_t bytes = 0;
      if (wk_shard_view_column_stored(v, c, b, &e, &stored, &stored_copy) != WK_OK) continue;
      if (wk_layout_block_bytes(l, &e, b, stored, v->name, &bytes) == WK_OK && bytes <= MAX_DECODE_BYTES) {
        uint8_t *out = malloc(bytes ? bytes : 1);
        if (wk_layout_block_decode(l, &e, b, stored, out, v->name) == WK_OK && l->element_bytes &&
            bytes != wk_layout_block_rows(l, b) * l->element_bytes)
          abort(); /* a fixed-width block decodes to exactly its rows */
        free(out);
      }
      free(stored_copy);
    }
  }
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
    read_columns(&v);
    wk_shard_view_release(&v);
  }
  free(copy);
  return 0;
}
