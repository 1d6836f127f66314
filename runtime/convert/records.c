/*
 * records.c — chunks of records, the form the Parquet and WebDataset tar readers hand their texts to
 * the converter's workers in: each record is one row (or sample) that has a text, as u64 row number
 * within the chunk, then its fields (the text; with --column, each column's too), each a u8 SlotType, a u32
 * length and the bytes. Rows without a text are counted in the chunk instead: null Parquet rows (nulls),
 * and rows the reader found bad (bad, with their reason).
 *
 * Producer side (record_cutter_*): records accumulate until the chunk size, then the chunk is
 * emitted. Worker side (convert_process_records): each record becomes a document, or a bad line when
 * it is not UTF-8 (or, for a tar .json member, has no string json_field); with --column its fields go
 * to the columns (column_value.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert.h"

enum { ROW_BYTES = 8, TYPE_BYTES = 1, LENGTH_BYTES = 4, SLOT_HEADER = TYPE_BYTES + LENGTH_BYTES };

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

WkStatus record_cutter_add(RecordCutter *rc, const RecordSlot *slots, uint32_t count) {
  uint64_t row = rc->rows;
  WK_TRY(wk_byte_vec_append(&rc->data, &row, ROW_BYTES)); /* little-endian host (as the shard format) */
  for (uint32_t k = 0; k < count; k++) {
    if (slots[k].length > UINT32_MAX)
      return WK_FAIL(WK_ERR_FORMAT, "a field of %zu bytes (at most 4 GiB)", slots[k].length);
    uint8_t header[SLOT_HEADER] = {(uint8_t)slots[k].type};
    uint32_t n = (uint32_t)slots[k].length;
    memcpy(header + TYPE_BYTES, &n, LENGTH_BYTES);
    WK_TRY(wk_byte_vec_append(&rc->data, header, sizeof header));
    WK_TRY(wk_byte_vec_append(&rc->data, slots[k].bytes, slots[k].length));
  }
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

/* The next field of a record at *p (before end): a short one is a bug of the producer, not bad input. */
static WkStatus next_slot(const uint8_t **p, const uint8_t *end, RecordSlot *out) {
  uint32_t length;
  if ((size_t)(end - *p) < SLOT_HEADER) return WK_FAIL(WK_ERR_INTERNAL, "a truncated record in a chunk");
  out->type = (SlotType)(*p)[0];
  memcpy(&length, *p + TYPE_BYTES, LENGTH_BYTES);
  *p += SLOT_HEADER;
  if (length > (size_t)(end - *p)) return WK_FAIL(WK_ERR_INTERNAL, "a truncated record in a chunk");
  out->bytes = *p;
  out->length = length;
  *p += length;
  return WK_OK;
}

/* The text of a record without --column: the slot's bytes (UTF-8 checked), or a tar .json member's
 * json_field. */
static WkStatus text_record(const ChunkContext *ctx, Chunk *c, const RecordSlot *slot, bool json, uint64_t row,
                            WkScratch *scratch) {
  const uint8_t *text = slot->bytes;
  size_t text_length = slot->length;
  char reason[128];
  if (json) {
    const char *member;
    if (!wk_json_line_field((const char *)text, text_length, ctx->json_field, scratch, &member, &text_length, reason))
      return convert_bad_add(&c->bad, &c->bad_count, &c->bad_capacity, row + 1, reason);
    text = (const uint8_t *)member;
  } else {
    size_t valid = wk_utf8_valid_prefix(text, text_length);
    if (valid < text_length) {
      snprintf(reason, sizeof reason, "invalid UTF-8 at byte %zu of the text (document skipped)", valid);
      return convert_bad_add(&c->bad, &c->bad_count, &c->bad_capacity, row + 1, reason);
    }
  }
  return convert_chunk_add_text(ctx, c, text, text_length);
}

/* A tar sample's "json.NAME" field (or the text field "json", whose string is --json-field): the .json
 * member's NAME. NULL: the field is the slot itself. */
static const char *json_key(const ChunkContext *ctx, const Input *in, const char *field) {
  if (in->kind != INPUT_TAR) return NULL;
  if (strcmp(field, "json") == 0) return ctx->json_field;
  return strncmp(field, "json.", 5) == 0 ? field + 5 : NULL;
}

/* A field as a value; a JSON slot is parsed into *tree (freed by the caller). */
static Value slot_value(const RecordSlot *slot, const char *key, WkJson **tree, bool *bad_json) {
  static const ValueType TYPES[] = {[SLOT_MISSING] = VALUE_MISSING, [SLOT_NULL] = VALUE_NULL,
                                    [SLOT_STRING] = VALUE_STRING, [SLOT_BINARY] = VALUE_BINARY,
                                    [SLOT_MEMBER] = VALUE_MEMBER};
  if (slot->type != SLOT_JSON) return (Value){.type = TYPES[slot->type], .bytes = slot->bytes, .length = slot->length};
  if (wk_json_parse((const char *)slot->bytes, slot->length, tree) != WK_OK) {
    wk_clear_error();
    *bad_json = true;
    return (Value){.type = VALUE_MISSING};
  }
  return key ? value_of_member(*tree, key) : value_of_json(*tree);
}

/* A record with --column: its fields as values, to the columns. */
static WkStatus fields_record(const ChunkContext *ctx, const Input *in, Chunk *c, const RecordSlot *slots,
                              uint64_t row) {
  const char *fields[1 + COLUMN_MAX];
  uint32_t n = convert_record_fields(ctx, fields, 1 + COLUMN_MAX);
  WkJson *trees[1 + COLUMN_MAX] = {0};
  Value values[1 + COLUMN_MAX];
  bool bad_json = false;
  for (uint32_t k = 0; k < n; k++)
    values[k] = slot_value(&slots[k], json_key(ctx, in, fields[k]), &trees[k], &bad_json);
  WkStatus status = bad_json ? convert_bad_add(&c->bad, &c->bad_count, &c->bad_capacity, row + 1,
                                               "the .json member is not valid JSON")
                             : convert_chunk_add_record(ctx, c, &values[0], &values[1], row + 1);
  for (uint32_t k = 0; k < n; k++) wk_json_free(trees[k]);
  return status;
}

WkStatus convert_process_records(const ChunkContext *ctx, const Input *in, Chunk *c) {
  if (c->length == 0) return WK_OK; /* a last chunk that only reports progress (its data may be NULL) */
  bool json = in->kind == INPUT_TAR && strcmp(ctx->field, "json") == 0;
  const char *fields[1 + COLUMN_MAX];
  uint32_t count = ctx->records ? convert_record_fields(ctx, fields, 1 + COLUMN_MAX) : 1;
  WkScratch scratch = {0};
  WkStatus status = WK_OK;
  const uint8_t *p = c->data, *end = c->data + c->length;
  while (status == WK_OK && p < end) {
    uint64_t row;
    RecordSlot slots[1 + COLUMN_MAX];
    if ((size_t)(end - p) < ROW_BYTES) {
      status = WK_FAIL(WK_ERR_INTERNAL, "a truncated record in a chunk");
      break;
    }
    memcpy(&row, p, ROW_BYTES);
    p += ROW_BYTES;
    for (uint32_t k = 0; k < count && status == WK_OK; k++) status = next_slot(&p, end, &slots[k]);
    if (status != WK_OK) break;
    status = ctx->records ? fields_record(ctx, in, c, slots, row) : text_record(ctx, c, &slots[0], json, row, &scratch);
  }
  free(scratch.data);
  return status;
}
