/*
 * fuzz_parquet.c — libFuzzer target for the converter's record inputs: the Parquet reader
 * (runtime/convert/parquet/: footer, page headers, levels, codecs, dictionary and PLAIN values)
 * and the WebDataset tar reader behind it, with the record chunks they emit processed as a worker
 * would. Input: byte 0 picks the reader (bit 0: tar) and the column or extension (bit 1: "text" or
 * "txt", else "a"), and bit 3 records with two --columns (an i64 and a bytes: "b" and "c", or the tar
 * members "cls" and "json.b"); the rest is the file, read through a blob that cannot map (bit 2) or can.
 * What must hold whatever the bytes: no crash, leak or sanitizer report; the chunks number their
 * rows consistently (documents, bad rows and nulls never exceed the rows), and every token is inside
 * the vocabulary. Output is capped (a dictionary run can claim 2^31 rows of one value).
 *
 *   make fuzz && build/fuzz/fuzz_parquet -max_total_time=60 /tmp/new-inputs tests/fuzz/corpus/parquet
 */
#include <stdlib.h>
#include <string.h>

#include "convert/convert.h"

enum { MAX_ROWS = 1 << 14, TINY_CHUNK_BYTES = 256, LIMIT_BYTES = 1 << 16 };

typedef struct {
  WkBlob base;
  const uint8_t *data;
  bool mappable;
} MemoryBlob;

static WkStatus memory_read_at(WkBlob *self, uint64_t offset, size_t length, void *dst) {
  if (offset > self->size || length > self->size - offset)
    return WK_FAIL(WK_ERR_FORMAT, "'%s': read past the end", self->name);
  if (length) memcpy(dst, ((MemoryBlob *)self)->data + offset, length);
  return WK_OK;
}

static const void *memory_map(WkBlob *self, uint64_t offset, size_t length) {
  MemoryBlob *m = (MemoryBlob *)self;
  if (!m->mappable || offset > self->size || length > self->size - offset) return NULL;
  return m->data + offset;
}

static void memory_advise(WkBlob *self, uint64_t offset, uint64_t length, WkAdvice advice) {}
static void memory_close(WkBlob *self) {}

typedef struct {
  const ChunkContext *context;
  uint64_t rows;
} Taken;

static WkStatus take_chunk(void *arg, Chunk *c) {
  Taken *t = arg;
  convert_process_chunk(t->context, c);
  if (c->status == WK_OK) {
    if (c->doc_count + c->bad_count + c->nulls > c->lines) abort();
    for (size_t k = 0; k < c->bad_count; k++)
      if (c->bad[k].line == 0 || c->bad[k].line > c->lines) abort();
    for (size_t k = 0; k < c->tokens.length; k++)
      if (c->tokens.data[k] >= t->context->tokenizer->vocab_size) abort();
  }
  t->rows += c->lines;
  convert_chunk_free(c);
  return t->rows > MAX_ROWS ? WK_ERR_CLOSED : WK_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  bool tar = data[0] & 1, named = data[0] & 2;
  MemoryBlob blob = {.base = {.name = tar ? "fuzz.tar" : "fuzz.parquet", .size = size - 1, .read_at = memory_read_at,
                              .map = memory_map, .advise = memory_advise, .close = memory_close},
                     .data = data + 1, .mappable = !(data[0] & 4)};
  Input input = {.path = (char *)blob.base.name, .kind = tar ? INPUT_TAR : INPUT_PARQUET, .size = size - 1};
  ColumnSpec columns[2];
  if (column_spec_parse(tar ? "label=cls:i64" : "label=b:i64", &columns[0]) != WK_OK ||
      column_spec_parse(tar ? "x=json.b:bytes" : "x=c:bytes", &columns[1]) != WK_OK)
    abort();
  bool records = data[0] & 8;
  ChunkContext context = {.tokenizer = wk_tokenizer_find("bytes"), .field = named ? (tar ? "txt" : "text") : "a",
                          .json_field = "text", .inputs = &input, .records = records,
                          .columns = records ? columns : NULL, .column_count = records ? 2 : 0};
  RecordLimits limits = {.chunk_bytes = TINY_CHUNK_BYTES, .max_footer_bytes = LIMIT_BYTES,
                         .max_page_bytes = LIMIT_BYTES, .max_member_bytes = LIMIT_BYTES};
  Taken taken = {.context = &context};
  if (tar) convert_cut_tar(&context, 0, &blob.base, &limits, take_chunk, &taken);
  else convert_cut_parquet(&context, 0, &blob.base, &limits, take_chunk, &taken);
  wk_clear_error();
  return 0;
}
