/*
 * fuzz_inputs.c — libFuzzer target for the converter's input readers (runtime/convert/
 * convert_input.c): the .jsonl line cutter (plain and zstd) with the JSON line reader behind it, and
 * the llm.c/nanoGPT .bin token reader.
 *
 * Input: byte 0 picks the reader (and, for .jsonl, records with --columns: an i64, a mask and a tensor,
 * the line parsed whole), byte 1 the chunk sizes; the rest is the file. Each input is cut
 * twice, into tiny chunks (1..64 bytes, 1..16 tokens, so that every chunk boundary is met) and into
 * one chunk (as the converter cuts any file under its 1 MiB chunk size), every chunk is processed as a worker would, and the target checks what must
 * hold whatever the bytes:
 *   - the chunks' bytes put together are the file (or, for zstd, what it decompresses to), cut only
 *     after a newline except at the end; .bin chunks tile the token part of the file;
 *   - documents end in order inside their chunk, tokens are inside the vocabulary, bad lines are
 *     numbered inside their chunk;
 *   - both cuttings give the same tokens, document ends, bad lines (file-wide numbers) and status.
 *
 *   make fuzz && build/fuzz/fuzz_inputs -max_total_time=60 /tmp/new-inputs tests/fuzz/corpus/inputs
 */
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "convert/convert.h"

enum {
  MODE_JSONL, MODE_JSONL_ZST, MODE_JSONL_ZST_OF, MODE_BIN, MODES,  /* ZST_OF: the target compresses the rest */
  TINY_LINE_BYTES = 64, TINY_BIN_TOKENS = 16, COMPRESS_LEVEL = 1,
  MAX_DECODED_BYTES = 1 << 16,  /* a small zstd frame can expand to gigabytes: stop reading there */
  MAX_LINE_BYTES = 1 << 15,     /* and into one endless line: refused past this (the converter's is 1 GiB) */
};

/* ---- an in-memory file --------------------------------------------------------------------------- */

typedef struct {
  WkBlob base;
  const uint8_t *data;
} MemoryBlob;

static WkStatus memory_read_at(WkBlob *self, uint64_t offset, size_t length, void *dst) {
  if (offset > self->size || length > self->size - offset)
    return WK_FAIL(WK_ERR_FORMAT, "'%s': read past the end", self->name);
  memcpy(dst, ((MemoryBlob *)self)->data + offset, length);
  return WK_OK;
}

static const void *memory_map(WkBlob *self, uint64_t offset, size_t length) { return NULL; }
static void memory_advise(WkBlob *self, uint64_t offset, uint64_t length, WkAdvice advice) {}
static void memory_close(WkBlob *self) {}

/* ---- what one cutting gives ------------------------------------------------------------------- */

typedef struct {
  uint8_t *bytes;  /* the chunks' data, put together */
  size_t byte_count, byte_capacity;
  WkTokenVec tokens;
  uint64_t *ends, *bad;  /* document ends (file-wide token positions), bad lines (file-wide numbers) */
  size_t end_count, end_capacity, bad_count, bad_capacity;
  uint64_t lines, chunks;
  WkStatus status;
  bool stopped;  /* at MAX_DECODED_BYTES or MAX_LINE_BYTES: not comparable (where each cutting notices
                  * an overlong line depends on where its reads end) */
} Result;

typedef struct {
  const ChunkContext *context;
  const Input *input;
  Result *result;
} Cutting;

/* Room for `need` items of `size` bytes in *p (capacity doubling). */
static void reserve(void *p, size_t *capacity, size_t need, size_t size) {
  if (need <= *capacity) return;
  size_t cap = *capacity ? *capacity : 64;
  while (cap < need) cap *= 2;
  void *q = realloc(*(void **)p, cap * size);
  if (!q) abort();
  *(void **)p = q;
  *capacity = cap;
}

static WkStatus take_chunk(void *arg, Chunk *c) {
  Cutting *cut = arg;
  Result *r = cut->result;
  if (r->byte_count + c->length > MAX_DECODED_BYTES) {
    convert_chunk_free(c);
    r->stopped = true;
    return WK_ERR_CLOSED;
  }
  bool lines = cut->input->kind != INPUT_TOKENS_BIN;
  if (c->first != (r->chunks == 0)) abort();
  if (lines && c->length && c->data[c->length - 1] != '\n' && !c->last) abort(); /* cut after a newline */
  if (!lines && c->length % 2) abort();
  reserve(&r->bytes, &r->byte_capacity, r->byte_count + c->length, 1);
  if (c->length) memcpy(r->bytes + r->byte_count, c->data, c->length);
  r->byte_count += c->length;
  r->chunks++;

  convert_process_chunk(cut->context, c);
  WkStatus status = c->status;
  if (status != WK_OK && !c->message[0]) abort();
  uint64_t base = r->tokens.length;
  for (size_t d = 0; status == WK_OK && d < c->doc_count; d++) {
    if (c->doc_ends[d] > c->tokens.length || (d && c->doc_ends[d] < c->doc_ends[d - 1])) abort();
    reserve(&r->ends, &r->end_capacity, r->end_count + 1, sizeof *r->ends);
    r->ends[r->end_count++] = base + c->doc_ends[d];
  }
  for (size_t b = 0; status == WK_OK && b < c->bad_count; b++) {
    if (c->bad[b].line < 1 || c->bad[b].line > c->lines || !c->bad[b].reason[0]) abort();
    reserve(&r->bad, &r->bad_capacity, r->bad_count + 1, sizeof *r->bad);
    r->bad[r->bad_count++] = r->lines + c->bad[b].line;
  }
  if (status == WK_OK) {
    uint32_t vocab = cut->context->tokenizer->vocab_size;
    for (size_t k = 0; k < c->tokens.length; k++)
      if (c->tokens.data[k] >= vocab) abort();
    if (wk_token_vec_reserve(&r->tokens, c->tokens.length) != WK_OK) abort();
    if (c->tokens.length) memcpy(r->tokens.data + base, c->tokens.data, c->tokens.length * sizeof *c->tokens.data);
    r->tokens.length += c->tokens.length;
  }
  r->lines += c->lines;
  convert_chunk_free(c);
  return status;
}

static void cut(const ChunkContext *context, const Input *input, WkBlob *blob, const ChunkSizes *sizes, Result *r) {
  memset(r, 0, sizeof *r);
  atomic_bool stop;
  atomic_init(&stop, false);
  Cutting cutting = {.context = context, .input = input, .result = r};
  r->status = convert_cut_blob(input, 0, blob, sizes, take_chunk, &cutting, &stop);
  if (r->status != WK_OK && strstr(wk_last_error(), " bytes (is it line-delimited JSON?)")) r->stopped = true;
  wk_clear_error();
}

static void result_free(Result *r) {
  free(r->bytes);
  free(r->tokens.data);
  free(r->ends);
  free(r->bad);
}

static bool same(const void *a, const void *b, size_t n) { return n == 0 || memcmp(a, b, n) == 0; }

/* ---- the target ------------------------------------------------------------------------------- */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  int mode = data[0] % MODES;
  ChunkSizes tiny = {.line_bytes = 1 + data[1] % TINY_LINE_BYTES, .bin_tokens = 1 + data[1] % TINY_BIN_TOKENS,
                     .max_line_bytes = MAX_LINE_BYTES};
  const uint8_t *file = data + 2;
  size_t file_size = size - 2;
  uint8_t *compressed = NULL;
  if (mode == MODE_JSONL_ZST_OF) {
    size_t bound = ZSTD_compressBound(file_size);
    compressed = malloc(bound ? bound : 1);
    if (!compressed) abort();
    size_t n = ZSTD_compress(compressed, bound, file, file_size, COMPRESS_LEVEL);
    if (ZSTD_isError(n)) abort();
    file = compressed, file_size = n;
  }
  Input input = {.path = (char *)"fuzz/input",
                 .kind = mode == MODE_JSONL ? INPUT_JSONL : mode == MODE_BIN ? INPUT_TOKENS_BIN : INPUT_JSONL_ZST,
                 .size = file_size,
                 .headerless = (data[0] / MODES) % 2 == 1}; /* .bin: llm.c's header, or nanoGPT's none */
  MemoryBlob blob = {.base = {.name = input.path, .size = file_size, .read_at = memory_read_at, .map = memory_map,
                              .advise = memory_advise, .close = memory_close},
                     .data = file};
  ColumnSpec columns[3];
  if (column_spec_parse("label=b:i64", &columns[0]) != WK_OK || column_spec_parse("m=m:mask", &columns[1]) != WK_OK ||
      column_spec_parse("e=e:f32[2,2]", &columns[2]) != WK_OK)
    abort();
  bool records = mode != MODE_BIN && (data[0] / MODES) % 2 == 1;
  ChunkContext context = {.tokenizer = wk_tokenizer_find(mode == MODE_BIN ? "gpt2" : "bytes"), .field = "text",
                          .split = WK_TEXT_SPLIT_FILE, .inputs = &input, .records = records,
                          .columns = records ? columns : NULL, .column_count = records ? 3 : 0};
  Result small, large;
  cut(&context, &input, &blob.base, &tiny, &small);
  ChunkSizes whole = {.line_bytes = file_size + 1, .bin_tokens = file_size / 2 + 1, .max_line_bytes = MAX_LINE_BYTES};
  cut(&context, &input, &blob.base, &whole, &large);

  if (small.stopped || large.stopped) goto done;
  /* The chunks tile the file (or what it decompresses to, when that worked). */
  if (mode == MODE_JSONL && (small.byte_count != file_size || !same(small.bytes, file, file_size))) abort();
  if (mode == MODE_JSONL_ZST_OF && small.status == WK_OK &&
      (small.byte_count != size - 2 || !same(small.bytes, data + 2, size - 2)))
    abort();
  if (mode == MODE_BIN && small.status == WK_OK) {
    size_t header = input.headerless ? 0 : 256 * 4;
    if (small.byte_count + header != file_size || !same(small.bytes, file + header, small.byte_count)) abort();
  }
  /* How a file is cut changes nothing in what it holds. */
  if (small.status != large.status) abort();
  if (small.status == WK_OK) {
    if (small.byte_count != large.byte_count || !same(small.bytes, large.bytes, small.byte_count)) abort();
    if (small.tokens.length != large.tokens.length ||
        !same(small.tokens.data, large.tokens.data, small.tokens.length * sizeof *small.tokens.data))
      abort();
    if (small.end_count != large.end_count || !same(small.ends, large.ends, small.end_count * sizeof *small.ends))
      abort();
    if (small.bad_count != large.bad_count || !same(small.bad, large.bad, small.bad_count * sizeof *small.bad))
      abort();
    if (small.lines != large.lines) abort();
  }
done:
  result_free(&small);
  result_free(&large);
  free(compressed);
  return 0;
}
