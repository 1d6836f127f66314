/*
 * thrift.c — the Thrift compact protocol, as Parquet's footer and page headers are written in it:
 * ULEB128 varints (zigzag for signed integers), field headers with a delta of the field id in the
 * high nibble and the type in the low one, length-prefixed binaries, list headers with the count in
 * the high nibble (15: a varint follows). Reading only; every length is checked against the bytes
 * left, and nesting is bounded so that a hostile footer cannot recurse the stack away.
 */
#include <stdarg.h>
#include <stdio.h>

#include "parquet.h"

enum {
  MAX_DEPTH = 32,        /* Parquet's own structs nest about 6 deep */
  MAX_VARINT_BYTES = 10, /* 64 bits, 7 per byte */
  LONG_FORM = 15,        /* a list's count nibble saying "a varint count follows" */
};

void thrift_init(Thrift *t, const uint8_t *data, size_t length, uint64_t base, const char *path, const char *what) {
  *t = (Thrift){.start = data, .p = data, .end = data + length, .base = base, .path = path, .what = what};
}

uint64_t thrift_offset(const Thrift *t) { return t->base + (uint64_t)(t->p - t->start); }

WkStatus thrift_fail(const Thrift *t, const char *fmt, ...) {
  char reason[512];
  va_list args;
  va_start(args, fmt);
  vsnprintf(reason, sizeof reason, fmt, args);
  va_end(args);
  return WK_FAIL(WK_ERR_FORMAT, "'%s': %s at byte %llu: %s (file truncated or corrupted, or not Parquet)", t->path,
                 t->what, (unsigned long long)thrift_offset(t), reason);
}

static WkStatus varint(Thrift *t, uint64_t *out) {
  uint64_t v = 0;
  for (int i = 0; i < MAX_VARINT_BYTES; i++) {
    if (t->p >= t->end) return thrift_fail(t, "ends inside a number");
    uint8_t b = *t->p++;
    v |= (uint64_t)(b & 0x7f) << (7 * i);
    if (!(b & 0x80)) {
      *out = v;
      return WK_OK;
    }
  }
  return thrift_fail(t, "a number longer than 10 bytes");
}

static int64_t unzigzag(uint64_t v) { return (int64_t)(v >> 1) ^ -(int64_t)(v & 1); }

WkStatus thrift_enter(Thrift *t) {
  if (t->depth >= MAX_DEPTH) return thrift_fail(t, "structures nested deeper than %d", MAX_DEPTH);
  t->depth++;
  return WK_OK;
}

void thrift_leave(Thrift *t) { t->depth--; }

WkStatus thrift_field(Thrift *t, int16_t *last, int16_t *id, ThriftType *type) {
  if (t->p >= t->end) return thrift_fail(t, "ends inside a structure");
  uint8_t b = *t->p++;
  *type = (ThriftType)(b & 0x0f);
  if (*type == THRIFT_STOP) return WK_OK;
  if (*type > THRIFT_STRUCT) return thrift_fail(t, "unknown field type %d", (int)*type);
  int delta = b >> 4;
  if (delta) {
    *id = (int16_t)(*last + delta);
  } else {
    uint64_t v = 0;
    WK_TRY(varint(t, &v));
    int64_t wide = unzigzag(v);
    if (wide < INT16_MIN || wide > INT16_MAX) return thrift_fail(t, "field id %lld out of range", (long long)wide);
    *id = (int16_t)wide;
  }
  *last = *id;
  return WK_OK;
}

WkStatus thrift_i64(Thrift *t, ThriftType type, int64_t *out) {
  if (type == THRIFT_BYTE) {
    if (t->p >= t->end) return thrift_fail(t, "ends inside a byte");
    *out = (int8_t)*t->p++;
    return WK_OK;
  }
  if (type != THRIFT_I16 && type != THRIFT_I32 && type != THRIFT_I64)
    return thrift_fail(t, "an integer was expected, found type %d", (int)type);
  uint64_t v = 0;
  WK_TRY(varint(t, &v));
  *out = unzigzag(v);
  return WK_OK;
}

WkStatus thrift_i32(Thrift *t, ThriftType type, int32_t *out) {
  if (type == THRIFT_I64) return thrift_fail(t, "a 32-bit integer was expected, found a 64-bit one");
  int64_t v = 0;
  WK_TRY(thrift_i64(t, type, &v));
  if (v < INT32_MIN || v > INT32_MAX) return thrift_fail(t, "integer %lld out of 32-bit range", (long long)v);
  *out = (int32_t)v;
  return WK_OK;
}

WkStatus thrift_binary(Thrift *t, const uint8_t **bytes, size_t *length) {
  uint64_t n = 0;
  WK_TRY(varint(t, &n));
  if (n > (uint64_t)(t->end - t->p)) return thrift_fail(t, "a string of %llu bytes runs past the end", (unsigned long long)n);
  *bytes = t->p;
  *length = (size_t)n;
  t->p += n;
  return WK_OK;
}

WkStatus thrift_list(Thrift *t, ThriftType *element, uint32_t *count) {
  if (t->p >= t->end) return thrift_fail(t, "ends inside a list header");
  uint8_t b = *t->p++;
  uint64_t n = b >> 4;
  if (n == LONG_FORM) WK_TRY(varint(t, &n));
  *element = (ThriftType)(b & 0x0f);
  if (*element == THRIFT_STOP || *element > THRIFT_STRUCT)
    return thrift_fail(t, "a list of unknown element type %d", (int)*element);
  /* Every element takes at least one byte (a boolean, a varint, an empty struct's stop). */
  if (n > (uint64_t)(t->end - t->p)) return thrift_fail(t, "a list of %llu elements runs past the end", (unsigned long long)n);
  *count = (uint32_t)n;
  return WK_OK;
}

static WkStatus skip_bytes(Thrift *t, size_t n) {
  if (n > (size_t)(t->end - t->p)) return thrift_fail(t, "ends inside a value");
  t->p += n;
  return WK_OK;
}

WkStatus thrift_skip(Thrift *t, ThriftType type) {
  uint64_t v = 0;
  switch (type) {
    case THRIFT_TRUE:
    case THRIFT_FALSE: return WK_OK; /* the value is in the field header */
    case THRIFT_BYTE: return skip_bytes(t, 1);
    case THRIFT_I16:
    case THRIFT_I32:
    case THRIFT_I64: return varint(t, &v);
    case THRIFT_DOUBLE: return skip_bytes(t, sizeof(double));
    case THRIFT_BINARY: {
      const uint8_t *bytes;
      size_t length;
      return thrift_binary(t, &bytes, &length);
    }
    case THRIFT_LIST:
    case THRIFT_SET: {
      ThriftType element;
      uint32_t count;
      WK_TRY(thrift_list(t, &element, &count));
      WK_TRY(thrift_enter(t));
      WkStatus status = WK_OK;
      /* A boolean element is one byte of its own in a list. */
      for (uint32_t i = 0; i < count && status == WK_OK; i++)
        status = element == THRIFT_TRUE || element == THRIFT_FALSE ? skip_bytes(t, 1) : thrift_skip(t, element);
      thrift_leave(t);
      return status;
    }
    case THRIFT_MAP: {
      WK_TRY(varint(t, &v));
      if (v == 0) return WK_OK;
      if (t->p >= t->end) return thrift_fail(t, "ends inside a map header");
      uint8_t kinds = *t->p++;
      ThriftType key = (ThriftType)(kinds >> 4), value = (ThriftType)(kinds & 0x0f);
      if (key == THRIFT_STOP || key > THRIFT_STRUCT || value == THRIFT_STOP || value > THRIFT_STRUCT)
        return thrift_fail(t, "a map of unknown types %d, %d", (int)key, (int)value);
      if (v > (uint64_t)(t->end - t->p)) return thrift_fail(t, "a map of %llu entries runs past the end", (unsigned long long)v);
      WK_TRY(thrift_enter(t));
      WkStatus status = WK_OK;
      for (uint64_t i = 0; i < v && status == WK_OK; i++) {
        status = thrift_skip(t, key);
        if (status == WK_OK) status = thrift_skip(t, value);
      }
      thrift_leave(t);
      return status;
    }
    case THRIFT_STRUCT: {
      WK_TRY(thrift_enter(t));
      int16_t last = 0, id = 0;
      ThriftType field = THRIFT_STOP;
      WkStatus status;
      while ((status = thrift_field(t, &last, &id, &field)) == WK_OK && field != THRIFT_STOP)
        if ((status = thrift_skip(t, field)) != WK_OK) break;
      thrift_leave(t);
      return status;
    }
    case THRIFT_STOP: break;
  }
  return thrift_fail(t, "cannot skip a value of type %d", (int)type);
}
