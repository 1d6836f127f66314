/*
 * column_value.c — a record's fields -> a document of the chunk: its tokens (a string tokenized, or a list
 * of ids checked against the vocabulary) and each --column's value in the column's stored form. A field that
 * does not fit its column (missing, of another type, a per-token list of another length, out of range) makes
 * the whole row bad, reported as "column 'label': field 'label' is a string, expected an integer"; nothing
 * of a bad row stays in the chunk. Never a silent default.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert.h"

enum { REASON_BYTES = 256, MASK_IGNORED = -100 /* Hugging Face's ignore_index in labels */ };

Value value_of_json(const WkJson *j) {
  if (!j) return (Value){.type = VALUE_MISSING};
  switch (j->type) {
    case WK_JSON_NULL: return (Value){.type = VALUE_NULL};
    case WK_JSON_FALSE: return (Value){.type = VALUE_BOOL, .truth = false};
    case WK_JSON_TRUE: return (Value){.type = VALUE_BOOL, .truth = true};
    case WK_JSON_NUMBER: return (Value){.type = VALUE_NUMBER, .bytes = (const uint8_t *)j->string, .length = j->length};
    case WK_JSON_STRING: return (Value){.type = VALUE_STRING, .bytes = (const uint8_t *)j->string, .length = j->length};
    case WK_JSON_ARRAY: return (Value){.type = VALUE_LIST, .json = j};
    case WK_JSON_OBJECT: return (Value){.type = VALUE_OBJECT, .json = j};
  }
  return (Value){.type = VALUE_MISSING};
}

Value value_of_member(const WkJson *record, const char *field) {
  return record && record->type == WK_JSON_OBJECT ? value_of_json(wk_json_get(record, field))
                                                  : (Value){.type = VALUE_MISSING};
}

uint32_t convert_record_fields(const ChunkContext *ctx, const char **fields, uint32_t capacity) {
  uint32_t n = 0;
  if (n < capacity) fields[n++] = ctx->tokens ? ctx->tokens->field : ctx->field;
  for (uint32_t k = 0; k < ctx->column_count && n < capacity; k++) fields[n++] = ctx->columns[k].field;
  return n;
}

static const char *type_name(const Value *v) {
  static const char *const NAMES[] = {[VALUE_MISSING] = "missing", [VALUE_NULL] = "null",
                                      [VALUE_BOOL] = "a boolean", [VALUE_NUMBER] = "a number",
                                      [VALUE_STRING] = "a string", [VALUE_BINARY] = "binary",
                                      [VALUE_MEMBER] = "a member", [VALUE_LIST] = "a list",
                                      [VALUE_OBJECT] = "an object"};
  return NAMES[v->type];
}

/* ---- scalars --------------------------------------------------------------------------------------- */

/* text[0..n) (blanks around it dropped when trim: a tar member's text) as a NUL-terminated string in
 * buffer; false when it is empty or too long to be a number. */
enum { NUMBER_TEXT_BYTES = 64 };
static bool number_text(const uint8_t *text, size_t n, bool trim, char buffer[NUMBER_TEXT_BYTES]) {
  while (trim && n && (text[n - 1] == '\n' || text[n - 1] == '\r' || text[n - 1] == ' ' || text[n - 1] == '\t')) n--;
  while (trim && n && (text[0] == ' ' || text[0] == '\t')) text++, n--;
  if (n == 0 || n >= NUMBER_TEXT_BYTES) return false;
  memcpy(buffer, text, n);
  buffer[n] = '\0';
  return buffer[0] != ' ' && buffer[0] != '+';
}

/* The whole of text[0..n) as an integer / a finite number. */
static bool text_integer(const uint8_t *text, size_t n, bool trim, int64_t *out) {
  char buffer[NUMBER_TEXT_BYTES], *end;
  if (!number_text(text, n, trim, buffer)) return false;
  errno = 0;
  long long v = strtoll(buffer, &end, 10);
  if (*end != '\0' || errno == ERANGE) return false;
  *out = v;
  return true;
}

static bool text_number(const uint8_t *text, size_t n, bool trim, double *out) {
  char buffer[NUMBER_TEXT_BYTES], *end;
  if (!number_text(text, n, trim, buffer)) return false;
  double v = strtod(buffer, &end);
  if (*end != '\0' || !isfinite(v)) return false;
  *out = v;
  return true;
}

/* An integer field: a JSON integer, a boolean (0/1), a tar member's text. */
static bool as_integer(const Value *v, int64_t *out, char *reason, const char *expected) {
  if (v->type == VALUE_BOOL) return *out = v->truth, true;
  if ((v->type == VALUE_NUMBER || v->type == VALUE_MEMBER) &&
      text_integer(v->bytes, v->length, v->type == VALUE_MEMBER, out))
    return true;
  snprintf(reason, REASON_BYTES, "is %s%s, expected %s", type_name(v),
           v->type == VALUE_NUMBER || v->type == VALUE_MEMBER ? " that is not an integer" : "", expected);
  return false;
}

/* A number for an f32: a JSON number or a tar member's text, finite as an f32 too. */
static bool as_float(const Value *v, float *out, char *reason) {
  double x;
  if ((v->type == VALUE_NUMBER || v->type == VALUE_MEMBER) &&
      text_number(v->bytes, v->length, v->type == VALUE_MEMBER, &x)) {
    *out = (float)x;
    if (isfinite(*out)) return true;
    snprintf(reason, REASON_BYTES, "is %g, beyond f32's range", x);
    return false;
  }
  snprintf(reason, REASON_BYTES, "is %s%s, expected a number", type_name(v),
           v->type == VALUE_MEMBER ? " that is not a number" : "");
  return false;
}

/* ---- lists ----------------------------------------------------------------------------------------- */

static size_t list_length(const WkJson *list) {
  size_t n = 0;
  for (const WkJson *e = list->child; e; e = e->next) n++;
  return n;
}

/* A per-token list (MASK, TOKEN_U8): as many integers as the record has tokens. */
static bool per_token(const ColumnSpec *col, const Value *v, uint64_t tokens, WkByteVec *out, char *reason) {
  if (v->type != VALUE_LIST) {
    snprintf(reason, REASON_BYTES, "is %s, expected a list of integers, one per token", type_name(v));
    return false;
  }
  size_t n = list_length(v->json);
  if (n != tokens) {
    snprintf(reason, REASON_BYTES, "has %zu values for the record's %llu tokens", n, (unsigned long long)tokens);
    return false;
  }
  size_t k = 0;
  for (const WkJson *e = v->json->child; e; e = e->next, k++) {
    Value ev = value_of_json(e);
    int64_t x;
    char why[REASON_BYTES];
    if (!as_integer(&ev, &x, why, "an integer")) {
      snprintf(reason, REASON_BYTES, "element %zu %s", k, why);
      return false;
    }
    if (col->kind == COLUMN_TOKEN_U8 && (x < 0 || x > 255)) {
      snprintf(reason, REASON_BYTES, "element %zu is %lld, outside 0..255", k, (long long)x);
      return false;
    }
    out->data[out->length + k] = col->kind == COLUMN_MASK ? x != MASK_IGNORED : (uint8_t)x;
  }
  out->length += n;
  return true;
}

/* One tensor element of dtype from a JSON number, range-checked. */
static bool tensor_element(uint32_t dtype, const Value *v, uint8_t *dst, char *reason) {
  if (dtype == WK_F32) {
    float f;
    if (!as_float(v, &f, reason)) return false;
    memcpy(dst, &f, sizeof f);
    return true;
  }
  int64_t x;
  if (!as_integer(v, &x, reason, "an integer")) return false;
  if ((dtype == WK_I32 && (x < INT32_MIN || x > INT32_MAX)) || (dtype == WK_U8 && (x < 0 || x > 255))) {
    snprintf(reason, REASON_BYTES, "is %lld, outside %s's range", (long long)x, column_dtype_name(dtype));
    return false;
  }
  if (dtype == WK_I64) memcpy(dst, &x, 8);
  else if (dtype == WK_I32) { int32_t y = (int32_t)x; memcpy(dst, &y, 4); }
  else *dst = (uint8_t)x;
  return true;
}

/* Nested lists of the tensor's shape from dimension d on, flattened into dst (row-major). */
static bool tensor_fill(const ColumnSpec *col, const Value *v, uint32_t d, uint8_t **dst, char *reason) {
  if (v->type != VALUE_LIST) {
    snprintf(reason, REASON_BYTES, "is %s at depth %u, expected a list of %u", type_name(v), d, col->shape[d]);
    return false;
  }
  size_t n = list_length(v->json);
  if (n != col->shape[d]) {
    snprintf(reason, REASON_BYTES, "has %zu values at depth %u, expected %u", n, d, col->shape[d]);
    return false;
  }
  size_t size = column_dtype_size(col->dtype);
  for (const WkJson *e = v->json->child; e; e = e->next) {
    Value ev = value_of_json(e);
    if (d + 1 < col->ndim) {
      if (!tensor_fill(col, &ev, d + 1, dst, reason)) return false;
      continue;
    }
    if (!tensor_element(col->dtype, &ev, *dst, reason)) return false;
    *dst += size;
  }
  return true;
}

static bool blob(const Value *v, ColumnData *out, char *reason) {
  if (v->type != VALUE_STRING && v->type != VALUE_BINARY && v->type != VALUE_MEMBER) {
    snprintf(reason, REASON_BYTES, "is %s, expected a string or bytes", type_name(v));
    return false;
  }
  if (v->length) memcpy(out->data.data + out->data.length, v->bytes, v->length);
  out->data.length += v->length;
  uint64_t end = out->data.length;
  memcpy(out->ends.data + out->ends.length, &end, sizeof end);
  out->ends.length += sizeof end;
  return true;
}

/* Room for the largest value the column can take from v (reserve_column first: the checks then never allocate). */
static WkStatus reserve_column(const ColumnSpec *col, const Value *v, uint64_t tokens, ColumnData *out) {
  if (col->kind == COLUMN_BYTES) {
    WK_TRY(wk_byte_vec_reserve(&out->ends, sizeof(uint64_t)));
    return wk_byte_vec_reserve(&out->data, v->length);
  }
  bool per_token = col->kind == COLUMN_MASK || col->kind == COLUMN_TOKEN_U8;
  return wk_byte_vec_reserve(&out->data, per_token ? (size_t)tokens : (size_t)col->element_bytes);
}

/* One column's value of a record appended to out (room reserved); false with the reason when it does not fit. */
static bool column_value(const ColumnSpec *col, const Value *v, uint64_t tokens, ColumnData *out, char *reason) {
  switch (col->kind) {
    case COLUMN_MASK:
    case COLUMN_TOKEN_U8: return per_token(col, v, tokens, &out->data, reason);
    case COLUMN_BYTES: return blob(v, out, reason);
    default: break;
  }
  uint8_t *dst = out->data.data + out->data.length;
  if (col->kind == COLUMN_I64) {
    int64_t x;
    if (!as_integer(v, &x, reason, "an integer")) return false;
    memcpy(dst, &x, sizeof x);
  } else if (col->kind == COLUMN_F32) {
    float f;
    if (!as_float(v, &f, reason)) return false;
    memcpy(dst, &f, sizeof f);
  } else {
    uint8_t *p = dst;
    if (!tensor_fill(col, v, 0, &p, reason)) return false;
  }
  out->data.length += (size_t)col->element_bytes;
  return true;
}

/* ---- tokens ----------------------------------------------------------------------------------------- */

/* The record's tokens: a string encoded with the template (an empty one stays empty), a list of ids. */
static WkStatus record_tokens(const ChunkContext *ctx, Chunk *c, const Value *v, char *reason, bool *bad) {
  if (ctx->no_text) return WK_OK; /* a record of columns: its EOS alone */
  if (v->type == VALUE_MISSING) {
    snprintf(reason, REASON_BYTES, "is missing%s", ctx->tokens ? "" : " (records without text: --no-text)");
    return *bad = true, WK_OK;
  }
  if (v->type == VALUE_STRING || v->type == VALUE_MEMBER) {
    size_t valid = wk_utf8_valid_prefix(v->bytes, v->length);
    if (valid < v->length) {
      snprintf(reason, REASON_BYTES, "has invalid UTF-8 at byte %zu", valid);
      return *bad = true, WK_OK;
    }
    return wk_tokenizer_encode_with(ctx->tokenizer, v->length ? ctx->template : NULL, v->bytes, v->length, &c->tokens);
  }
  if (v->type != VALUE_LIST) {
    snprintf(reason, REASON_BYTES, "is %s, expected a string or a list of token ids", type_name(v));
    return *bad = true, WK_OK;
  }
  WK_TRY(wk_token_vec_reserve(&c->tokens, list_length(v->json)));
  size_t k = 0;
  for (const WkJson *e = v->json->child; e; e = e->next, k++) {
    Value ev = value_of_json(e);
    int64_t id;
    char why[REASON_BYTES];
    if (!as_integer(&ev, &id, why, "a token id")) {
      snprintf(reason, REASON_BYTES, "element %zu %s", k, why);
      return *bad = true, WK_OK;
    }
    if (id < 0 || id >= ctx->tokenizer->vocab_size) {
      snprintf(reason, REASON_BYTES, "element %zu is token %lld, outside the vocabulary (%u ids)", k, (long long)id,
               ctx->tokenizer->vocab_size);
      return *bad = true, WK_OK;
    }
    c->tokens.data[c->tokens.length++] = (uint32_t)id;
  }
  return WK_OK;
}

/* ---- a record ----------------------------------------------------------------------------------------- */

static WkStatus columns_new(const ChunkContext *ctx, Chunk *c) {
  if (c->columns || ctx->column_count == 0) return WK_OK;
  c->columns = calloc(ctx->column_count, sizeof *c->columns);
  if (!c->columns) return WK_FAIL(WK_ERR_NOMEM, "out of memory: a chunk's columns");
  c->column_count = ctx->column_count;
  return WK_OK;
}

WkStatus convert_chunk_add_record(const ChunkContext *ctx, Chunk *c, const Value *text, const Value *columns,
                                  uint64_t line) {
  WK_TRY(columns_new(ctx, c));
  size_t tokens_before = c->tokens.length;
  size_t data_before[COLUMN_MAX], ends_before[COLUMN_MAX];
  for (uint32_t k = 0; k < ctx->column_count; k++)
    data_before[k] = c->columns[k].data.length, ends_before[k] = c->columns[k].ends.length;
  char reason[REASON_BYTES] = "", why[REASON_BYTES] = "";
  bool bad = false;
  const char *name = ctx->tokens ? "tokens" : NULL, *field = ctx->tokens ? ctx->tokens->field : ctx->field;
  WK_TRY(record_tokens(ctx, c, text, why, &bad));
  uint64_t tokens = c->tokens.length - tokens_before;
  for (uint32_t k = 0; k < ctx->column_count && !bad; k++) {
    const ColumnSpec *col = &ctx->columns[k];
    WK_TRY(reserve_column(col, &columns[k], tokens, &c->columns[k]));
    if (columns[k].type == VALUE_MISSING) snprintf(why, sizeof why, "is missing");
    else if (column_value(col, &columns[k], tokens, &c->columns[k], why)) continue;
    bad = true;
    name = col->name;
    field = col->field;
  }
  if (!bad) return convert_chunk_end_document(c);
  c->tokens.length = tokens_before;
  for (uint32_t k = 0; k < ctx->column_count; k++)
    c->columns[k].data.length = data_before[k], c->columns[k].ends.length = ends_before[k];
  if (name) snprintf(reason, sizeof reason, "column '%s': field '%s' %s", name, field, why);
  else snprintf(reason, sizeof reason, "the text: field '%s' %s", field, why);
  return convert_chunk_bad_line(c, line, reason);
}
