/*
 * records.c — chunks of records, the form the Parquet and WebDataset tar readers hand their texts to
 * the converter's workers in: each record is one row (or sample) that has a text, as u64 row number
 * within the chunk, u32 length, the bytes. Rows without a text are counted in the chunk instead: null
 * Parquet rows (nulls), and rows the reader found bad (bad, with their reason).
 *
 * Producer side (record_cutter_*): records accumulate until the chunk size, then the chunk is
 * emitted. Worker side (convert_process_records): each record becomes a document, or a bad line when
 * it is not UTF-8 (or, for a tar .json member, has no string json_field).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert.h"

enum { ROW_BYTES = 8, LENGTH_BYTES = 4, RECORD_HEADER = ROW_BYTES + LENGTH_BYTES };

void record_cutter_init(RecordCutter *rc, uint32_t input, size_t chunk_bytes, ChunkEmit emit, void *arg) {
  *rc = (RecordCutter){.input = input, .chunk_bytes = chunk_bytes, .emit = emit, .arg = arg, .first = true};
}

void record_cutter_free(RecordCutter *rc) {
  free(rc->data.data);
  free(rc->bad);
  rc->data = (WkByteVec){0};
  rc->bad = NULL;
}

WkStatus record_cutter_flush(RecordCutter *rc, bool last) {
  Chunk *c = calloc(1, sizeof *c);
  if (!c) return WK_FAIL(WK_ERR_NOMEM, "out of memory allocating a chunk");
  *c = (Chunk){.kind = JOB_CHUNK, .input = rc->input, .first = rc->first, .last = last, .data = rc->data.data,
               .length = rc->data.length, .lines = rc->rows, .nulls = rc->nulls, .bad = rc->bad,
               .bad_count = rc->bad_count, .bad_capacity = rc->bad_capacity,
               .input_bytes = rc->progress - rc->reported};
  rc->reported = rc->progress;
  rc->first = false;
  rc->data = (WkByteVec){0};
  rc->bad = NULL;
  rc->bad_count = rc->bad_capacity = 0;
  rc->rows = rc->nulls = 0;
  return rc->emit(rc->arg, c);
}

WkStatus record_cutter_add(RecordCutter *rc, const uint8_t *text, size_t length) {
  if (length > UINT32_MAX) return WK_FAIL(WK_ERR_FORMAT, "a text of %zu bytes (at most 4 GiB)", length);
  uint8_t header[RECORD_HEADER];
  uint64_t row = rc->rows;
  uint32_t n = (uint32_t)length;
  memcpy(header, &row, ROW_BYTES); /* little-endian host (as the shard format) */
  memcpy(header + ROW_BYTES, &n, LENGTH_BYTES);
  WK_TRY(wk_byte_vec_append(&rc->data, header, sizeof header));
  WK_TRY(wk_byte_vec_append(&rc->data, text, length));
  rc->rows++;
  return rc->data.length >= rc->chunk_bytes ? record_cutter_flush(rc, false) : WK_OK;
}

WkStatus record_cutter_nulls(RecordCutter *rc, uint64_t count) {
  rc->rows += count;
  rc->nulls += count;
  return WK_OK;
}

WkStatus record_cutter_bad(RecordCutter *rc, const char *reason) {
  return convert_bad_add(&rc->bad, &rc->bad_count, &rc->bad_capacity, ++rc->rows /* 1-based in the chunk */, reason);
}

/* ---- worker side ---------------------------------------------------------------------------------- */

/* ---- what chunks collect (shared with convert_input.c) ------------------------------------------ */

WkStatus convert_bad_add(BadLine **bad, size_t *count, size_t *capacity, uint64_t line, const char *reason) {
  if (*count == *capacity) {
    size_t cap = *capacity ? *capacity * 2 : 16;
    BadLine *grown = realloc(*bad, cap * sizeof *grown);
    if (!grown) return WK_FAIL(WK_ERR_NOMEM, "out of memory collecting bad lines");
    *bad = grown;
    *capacity = cap;
  }
  BadLine *b = &(*bad)[(*count)++];
  b->line = line;
  snprintf(b->reason, sizeof b->reason, "%s", reason);
  return WK_OK;
}

WkStatus convert_chunk_end_document(Chunk *c) {
  if (c->doc_count == c->doc_capacity) {
    size_t cap = c->doc_capacity ? c->doc_capacity * 2 : 256;
    uint64_t *grown = realloc(c->doc_ends, cap * sizeof *grown);
    if (!grown) return WK_FAIL(WK_ERR_NOMEM, "out of memory collecting documents");
    c->doc_ends = grown;
    c->doc_capacity = cap;
  }
  c->doc_ends[c->doc_count++] = c->tokens.length;
  return WK_OK;
}

WkStatus convert_chunk_add_text(const ChunkContext *ctx, Chunk *c, const uint8_t *text, size_t length) {
  WK_TRY(wk_tokenizer_encode_with(ctx->tokenizer, length ? ctx->template : NULL, text, length, &c->tokens));
  return convert_chunk_end_document(c);
}

/* ---- worker side ---------------------------------------------------------------------------------- */

WkStatus convert_process_records(const ChunkContext *ctx, const Input *in, Chunk *c) {
  if (c->length == 0) return WK_OK; /* a last chunk that only reports progress (its data may be NULL) */
  bool json = in->kind == INPUT_TAR && strcmp(ctx->field, "json") == 0;
  WkScratch scratch = {0};
  WkStatus status = WK_OK;
  const uint8_t *p = c->data, *end = c->data + c->length;
  while (status == WK_OK && p < end) {
    uint64_t row;
    uint32_t length;
    /* The producer wrote these records: a short one is a bug, not bad input. */
    if ((size_t)(end - p) < RECORD_HEADER) return WK_FAIL(WK_ERR_INTERNAL, "a truncated record in a chunk");
    memcpy(&row, p, ROW_BYTES);
    memcpy(&length, p + ROW_BYTES, LENGTH_BYTES);
    p += RECORD_HEADER;
    if (length > (size_t)(end - p)) return WK_FAIL(WK_ERR_INTERNAL, "a truncated record in a chunk");
    const uint8_t *text = p;
    size_t text_length = length;
    p += length;
    char reason[128];
    if (json) {
      const char *member;
      if (!wk_json_line_field((const char *)text, text_length, ctx->json_field, &scratch, &member, &text_length,
                              reason)) {
        status = convert_bad_add(&c->bad, &c->bad_count, &c->bad_capacity, row + 1, reason);
        continue;
      }
      text = (const uint8_t *)member;
    } else {
      size_t valid = wk_utf8_valid_prefix(text, text_length);
      if (valid < text_length) {
        snprintf(reason, sizeof reason, "invalid UTF-8 at byte %zu of the text (document skipped)", valid);
        status = convert_bad_add(&c->bad, &c->bad_count, &c->bad_capacity, row + 1, reason);
        continue;
      }
    }
    status = convert_chunk_add_text(ctx, c, text, text_length);
  }
  free(scratch.data);
  return status;
}
