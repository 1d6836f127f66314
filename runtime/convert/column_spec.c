/*
 * column_spec.c — a --column of the converter, "NAME=FIELD:KIND": the column's name in the dataset, the
 * input field its values come from, and what they are read as (COLUMN_KINDS, or a fixed-shape tensor
 * "f32[4,8]"). Parsing only: reading the values is column_value.c's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert.h"

#define COLUMN_KIND_NAME(kind, name) [COLUMN_##kind] = name,
static const char *const KIND_NAMES[COLUMN_KIND_COUNT] = {COLUMN_KINDS(COLUMN_KIND_NAME)};
#undef COLUMN_KIND_NAME

/* The element types a tensor column may hold, by name (tensor/ is not linked into the fuzz targets: its
 * dtype table is not asked). */
static const struct {
  const char *name;
  WkDType dtype;
  size_t size;
} TENSOR_DTYPES[] = {{"f32", WK_F32, 4}, {"i32", WK_I32, 4}, {"i64", WK_I64, 8}, {"u8", WK_U8, 1}};
enum { TENSOR_DTYPE_COUNT = sizeof TENSOR_DTYPES / sizeof TENSOR_DTYPES[0] };

static int tensor_dtype(uint32_t dtype) {
  for (int k = 0; k < TENSOR_DTYPE_COUNT; k++)
    if ((uint32_t)TENSOR_DTYPES[k].dtype == dtype) return k;
  return 0;
}

const char *column_dtype_name(uint32_t dtype) { return TENSOR_DTYPES[tensor_dtype(dtype)].name; }
size_t column_dtype_size(uint32_t dtype) { return TENSOR_DTYPES[tensor_dtype(dtype)].size; }

enum { MAX_TENSOR_ELEMENTS = 1 << 28 };

const char *column_kind_name(ColumnKind kind) { return kind < COLUMN_KIND_COUNT ? KIND_NAMES[kind] : "?"; }

static WkStatus refuse(const char *spec, const char *why) {
  return WK_FAIL(WK_ERR_INVALID_ARG, "column '%s': %s (expected NAME=FIELD:KIND, KIND one of tokens, mask, "
                 "token_u8, i64, f32, bytes, or a tensor such as f32[4,8] with f32, i32, i64 or u8 elements)",
                 spec, why);
}

static bool is_name(const char *s, size_t n) {
  if (n == 0 || (s[0] >= '0' && s[0] <= '9')) return false;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!(c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))) return false;
  }
  return true;
}

/* "DTYPE[d0,d1,...]" -> the tensor's dtype and shape. */
static WkStatus parse_tensor(const char *spec, const char *kind, ColumnSpec *out) {
  const char *open = strchr(kind, '[');
  size_t n = (size_t)(open - kind);
  int d = -1;
  for (int k = 0; k < TENSOR_DTYPE_COUNT; k++)
    if (strlen(TENSOR_DTYPES[k].name) == n && strncmp(kind, TENSOR_DTYPES[k].name, n) == 0) d = k;
  if (d < 0) return refuse(spec, "a tensor's elements are f32, i32, i64 or u8");
  out->kind = COLUMN_TENSOR;
  out->dtype = (uint32_t)TENSOR_DTYPES[d].dtype;
  out->elements = 1;
  const char *p = open + 1;
  for (;;) {
    char *end;
    unsigned long long size = strtoull(p, &end, 10);
    if (end == p || *p == '-' || *p == '+' || size == 0 || size > MAX_TENSOR_ELEMENTS)
      return refuse(spec, "a tensor's dimensions are integers from 1");
    if (out->ndim == COLUMN_MAX_DIMS) return refuse(spec, "a tensor has at most 4 dimensions");
    out->shape[out->ndim++] = (uint32_t)size;
    out->elements *= size;
    if (out->elements > MAX_TENSOR_ELEMENTS) return refuse(spec, "a tensor of more than 2^28 elements");
    p = end;
    if (*p == ',') { p++; continue; }
    if (p[0] == ']' && p[1] == '\0') break;
    return refuse(spec, "a tensor's shape is [d0,d1,...] at the end");
  }
  out->element_bytes = out->elements * TENSOR_DTYPES[d].size;
  return WK_OK;
}

void column_spec_info(const ColumnSpec *col, WkColumnInfo *out) {
  static const uint32_t KINDS[COLUMN_KIND_COUNT] = {
      [COLUMN_TOKENS] = WK_COLUMN_TOKENS, [COLUMN_MASK] = WK_COLUMN_TOKEN_U8, [COLUMN_TOKEN_U8] = WK_COLUMN_TOKEN_U8,
      [COLUMN_I64] = WK_COLUMN_I64, [COLUMN_F32] = WK_COLUMN_F32, [COLUMN_BYTES] = WK_COLUMN_BYTES,
      [COLUMN_TENSOR] = WK_COLUMN_TENSOR};
  static const uint32_t DTYPES[COLUMN_KIND_COUNT] = {[COLUMN_MASK] = WK_U8, [COLUMN_TOKEN_U8] = WK_U8,
                                                     [COLUMN_I64] = WK_I64, [COLUMN_F32] = WK_F32,
                                                     [COLUMN_BYTES] = WK_U8};
  *out = (WkColumnInfo){.kind = KINDS[col->kind], .dtype = col->kind == COLUMN_TENSOR ? col->dtype : DTYPES[col->kind],
                        .ndim = col->ndim, .element_bytes = col->element_bytes};
  memcpy(out->name, col->name, sizeof out->name);
  memcpy(out->shape, col->shape, sizeof out->shape);
}

WkStatus column_spec_parse(const char *spec, ColumnSpec *out) {
  memset(out, 0, sizeof *out);
  if (!spec) return WK_FAIL(WK_ERR_INVALID_ARG, "column: the spec is NULL");
  const char *equals = strchr(spec, '='), *colon = equals ? strrchr(equals, ':') : NULL;
  if (!equals || !colon) return refuse(spec, "no '=' and ':'");
  size_t name = (size_t)(equals - spec), field = (size_t)(colon - equals - 1);
  if (!is_name(spec, name)) return refuse(spec, "a name is letters, digits and '_', not starting with a digit");
  if (name >= COLUMN_NAME_BYTES) return refuse(spec, "a name is at most 47 bytes");
  if (field == 0 || field >= COLUMN_FIELD_BYTES) return refuse(spec, "the field is 1 to 127 bytes");
  memcpy(out->name, spec, name);
  memcpy(out->field, equals + 1, field);
  const char *kind = colon + 1;
  if (strchr(kind, '[')) {
    WK_TRY(parse_tensor(spec, kind, out));
  } else {
    int k = -1;
    for (int i = 0; i < COLUMN_KIND_COUNT; i++)
      if (i != COLUMN_TENSOR && strcmp(kind, KIND_NAMES[i]) == 0) k = i;
    if (k < 0) return refuse(spec, "an unknown kind");
    out->kind = (ColumnKind)k;
    static const uint64_t BYTES[COLUMN_KIND_COUNT] = {[COLUMN_MASK] = 1, [COLUMN_TOKEN_U8] = 1, [COLUMN_I64] = 8,
                                                      [COLUMN_F32] = 4};
    out->element_bytes = BYTES[k];
  }
  if ((out->kind == COLUMN_TOKENS) != (strcmp(out->name, "tokens") == 0))
    return refuse(spec, out->kind == COLUMN_TOKENS
                            ? "kind tokens is the token stream, the column named 'tokens' (tokens=FIELD:tokens)"
                            : "the column 'tokens' is the token stream, of kind tokens (tokens=FIELD:tokens)");
  return WK_OK;
}
