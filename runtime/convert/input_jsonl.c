/*
 * input_jsonl.c — .jsonl and .jsonl.zst inputs (one JSON object per line): the producer cuts the byte
 * stream (decompressed when zstd, any number of frames) into chunks of whole lines, a worker turns each
 * line's --field string into one document (with --column, the line's object parsed whole, its fields
 * handed to the columns: column_value.c); a bad line is skipped and reported as file:line.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>  /* ZSTD_decompressStream for .jsonl.zst */

#include "convert.h"

/* Inputs are read through WkBlob (blob.c), which refuses anything but a regular file before reading:
 * a file replaced by a FIFO after listing fails instead of blocking. */
typedef struct {
  WkBlob *blob;
  const char *path;
  ZSTD_DStream *zstd;   /* NULL for plain files */
  uint8_t *in;
  ZSTD_inBuffer input;
  size_t in_capacity;
  size_t frame_left;    /* last ZSTD_decompressStream hint: 0 at a frame boundary */
  uint64_t consumed;    /* bytes read from the file */
  bool eof;
} Stream;

/* Up to capacity bytes of the file at s->consumed (0 at its end). */
static WkStatus file_read(Stream *s, uint8_t *dst, size_t capacity, size_t *got) {
  uint64_t left = s->blob->size - s->consumed;
  size_t n = left < capacity ? (size_t)left : capacity;
  *got = 0;
  if (n) WK_TRY(s->blob->read_at(s->blob, s->consumed, n, dst));
  s->consumed += n;
  *got = n;
  return WK_OK;
}

static WkStatus stream_read(Stream *s, uint8_t *dst, size_t capacity, size_t *got) {
  *got = 0;
  if (!s->zstd) return file_read(s, dst, capacity, got);
  ZSTD_outBuffer output = {dst, capacity, 0};
  while (output.pos == 0) {
    if (s->input.pos == s->input.size) {
      if (s->eof) {
        if (s->frame_left != 0)
          return WK_FAIL(WK_ERR_FORMAT, "'%s': zstd stream ends inside a frame (file truncated?)", s->path);
        break;
      }
      size_t n = 0;
      WK_TRY(file_read(s, s->in, s->in_capacity, &n));
      if (n == 0) { s->eof = true; continue; }
      s->input = (ZSTD_inBuffer){s->in, n, 0};
    }
    size_t r = ZSTD_decompressStream(s->zstd, &output, &s->input);
    if (ZSTD_isError(r))
      return WK_FAIL(WK_ERR_FORMAT, "'%s': zstd: %s (file corrupted or not zstd)", s->path, ZSTD_getErrorName(r));
    s->frame_left = r;
  }
  *got = output.pos;
  return WK_OK;
}

/* Emits newline-terminated pieces of about sizes->line_bytes (a longer line makes a longer chunk). */
WkStatus convert_cut_lines(const Input *in, uint32_t i, WkBlob *blob, const ChunkSizes *sizes, ChunkEmit emit,
                           void *arg, const atomic_bool *stop) {
  Stream s = {.blob = blob, .path = in->path};
  WkStatus status = WK_OK;
  if (in->kind == INPUT_JSONL_ZST) {
    s.zstd = ZSTD_createDStream();
    s.in_capacity = ZSTD_DStreamInSize();
    s.in = malloc(s.in_capacity);
    if (!s.zstd || !s.in) status = WK_FAIL(WK_ERR_NOMEM, "out of memory opening '%s'", in->path);
  }
  size_t capacity = 2 * sizes->line_bytes, have = 0;
  uint8_t *buffer = malloc(capacity);
  if (!buffer && status == WK_OK) status = WK_FAIL(WK_ERR_NOMEM, "out of memory reading '%s'", in->path);
  uint64_t reported = 0, emitted = 0;
  bool first = true, eof = false;
  while (status == WK_OK && !atomic_load(stop)) {
    while (!eof && have < sizes->line_bytes) {
      size_t got = 0;
      if ((status = stream_read(&s, buffer + have, capacity - have, &got)) != WK_OK) break;
      if (got == 0) eof = true;
      have += got;
    }
    if (status != WK_OK) break;
    if (have == 0) break;
    size_t cut = have;
    if (!eof) {
      while (cut > 0 && buffer[cut - 1] != '\n') cut--;
      if (cut == 0) { /* one line longer than the buffer: grow and read on */
        if (have >= sizes->max_line_bytes) {
          status = WK_FAIL(WK_ERR_FORMAT, "'%s': the line starting at byte %llu%s is longer than %zu bytes (is "
                           "it line-delimited JSON?)", in->path, (unsigned long long)emitted,
                           s.zstd ? " of the decompressed stream" : "", sizes->max_line_bytes);
          break;
        }
        capacity *= 2;
        uint8_t *grown = realloc(buffer, capacity);
        if (!grown) { status = WK_FAIL(WK_ERR_NOMEM, "out of memory: a line of '%s' is over %zu bytes", in->path, have); break; }
        buffer = grown;
        size_t got = 0;
        if ((status = stream_read(&s, buffer + have, capacity - have, &got)) != WK_OK) break;
        if (got == 0) eof = true;
        have += got;
        continue;
      }
    }
    uint8_t *rest = malloc(capacity);
    if (!rest) { status = WK_FAIL(WK_ERR_NOMEM, "out of memory reading '%s'", in->path); break; }
    memcpy(rest, buffer + cut, have - cut);
    Chunk *c = NULL;
    if ((status = convert_chunk_new(i, buffer, cut, &c)) != WK_OK) { free(rest); break; }
    c->first = first;
    c->last = eof && cut == have;
    c->input_bytes = s.consumed - reported;
    reported = s.consumed;
    first = false;
    buffer = rest;
    have -= cut;
    emitted += cut;
    if ((status = emit(arg, c)) != WK_OK) break;
    if (eof && have == 0) break;
  }
  free(buffer);
  free(s.in);
  ZSTD_freeDStream(s.zstd);
  return status;
}

/* Records mode (--column): the line's object parsed whole, its fields handed to the columns. */
static WkStatus line_record(const ChunkContext *ctx, Chunk *c, const uint8_t *p, size_t n, uint64_t line) {
  WkJson *root = NULL;
  if (wk_json_parse((const char *)p, n, &root) != WK_OK) {
    char reason[256];
    snprintf(reason, sizeof reason, "%s", wk_last_error());
    wk_clear_error();
    return convert_chunk_bad_line(c, line, reason);
  }
  Value text = value_of_member(root, ctx->tokens ? ctx->tokens->field : ctx->field), columns[COLUMN_MAX];
  for (uint32_t k = 0; k < ctx->column_count; k++) columns[k] = value_of_member(root, ctx->columns[k].field);
  WkStatus status = root->type == WK_JSON_OBJECT ? convert_chunk_add_record(ctx, c, &text, columns, line)
                                                  : convert_chunk_bad_line(c, line, "not a JSON object");
  wk_json_free(root);
  return status;
}

WkStatus convert_process_lines(const ChunkContext *ctx, const Input *in, Chunk *c) {
  (void)in; /* a line numbers itself within the chunk */
  WkScratch scratch = {0};
  WkStatus status = WK_OK;
  const uint8_t *p = c->data, *end = c->data + c->length;
  uint64_t line = 0;
  while (p < end && status == WK_OK) {
    const uint8_t *nl = memchr(p, '\n', (size_t)(end - p));
    const uint8_t *line_end = nl ? nl : end;
    line++;
    size_t n = (size_t)(line_end - p);
    if (n > 0 && p[n - 1] == '\r') n--;
    bool blank = true;
    for (size_t k = 0; k < n && blank; k++) blank = p[k] == ' ' || p[k] == '\t';
    if (!blank && ctx->records) {
      status = line_record(ctx, c, p, n, line);
    } else if (!blank) {
      const char *text;
      size_t text_length;
      char reason[128];
      if (wk_json_line_field((const char *)p, n, ctx->field, &scratch, &text, &text_length, reason)) {
        status = convert_chunk_add_text(ctx, c, (const uint8_t *)text, text_length);
      } else {
        status = convert_chunk_bad_line(c, line, reason);
      }
    }
    p = nl ? nl + 1 : end;
  }
  c->lines = line;
  free(scratch.data);
  return status;
}
