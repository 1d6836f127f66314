/*
 * page.c — Parquet page headers (PageHeader, Thrift compact): the page type and sizes, and the part
 * of its data page (v1), data page v2 or dictionary page header a reader needs. Statistics, CRCs and
 * index pages are skipped.
 */
#include <string.h>

#include "parquet.h"

static WkStatus read_data_v1(Thrift *t, PageHeader *h) {
  WK_TRY(thrift_enter(t));
  int16_t last = 0, id = 0;
  ThriftType type = THRIFT_STOP;
  WkStatus status;
  while ((status = thrift_field(t, &last, &id, &type)) == WK_OK && type != THRIFT_STOP) {
    if (id == 1) status = thrift_i32(t, type, &h->values);
    else if (id == 2) status = thrift_i32(t, type, &h->encoding);
    else if (id == 3) status = thrift_i32(t, type, &h->definition_encoding);
    else if (id == 4) status = thrift_i32(t, type, &h->repetition_encoding);
    else status = thrift_skip(t, type);
    if (status != WK_OK) break;
  }
  thrift_leave(t);
  return status;
}

static WkStatus read_data_v2(Thrift *t, PageHeader *h) {
  WK_TRY(thrift_enter(t));
  int16_t last = 0, id = 0;
  ThriftType type = THRIFT_STOP;
  WkStatus status;
  while ((status = thrift_field(t, &last, &id, &type)) == WK_OK && type != THRIFT_STOP) {
    if (id == 1) status = thrift_i32(t, type, &h->values);
    else if (id == 4) status = thrift_i32(t, type, &h->encoding);
    else if (id == 5) status = thrift_i32(t, type, &h->definition_bytes);
    else if (id == 6) status = thrift_i32(t, type, &h->repetition_bytes);
    else if (id == 7 && (type == THRIFT_TRUE || type == THRIFT_FALSE)) h->compressed = type == THRIFT_TRUE;
    else status = thrift_skip(t, type);
    if (status != WK_OK) break;
  }
  thrift_leave(t);
  return status;
}

static WkStatus read_dictionary(Thrift *t, PageHeader *h) {
  WK_TRY(thrift_enter(t));
  int16_t last = 0, id = 0;
  ThriftType type = THRIFT_STOP;
  WkStatus status;
  while ((status = thrift_field(t, &last, &id, &type)) == WK_OK && type != THRIFT_STOP) {
    if (id == 1) status = thrift_i32(t, type, &h->values);
    else if (id == 2) status = thrift_i32(t, type, &h->encoding);
    else status = thrift_skip(t, type);
    if (status != WK_OK) break;
  }
  thrift_leave(t);
  return status;
}

WkStatus parquet_page_header(const uint8_t *data, size_t length, uint64_t base, const char *path, PageHeader *out) {
  *out = (PageHeader){.type = -1, .uncompressed_bytes = -1, .compressed_bytes = -1, .values = -1, .encoding = -1,
                      .definition_encoding = -1, .repetition_encoding = -1, .compressed = true};
  Thrift t;
  thrift_init(&t, data, length, base, path, "page header");
  WK_TRY(thrift_enter(&t));
  int16_t last = 0, id = 0;
  ThriftType type = THRIFT_STOP;
  WkStatus status;
  bool detail = false;
  while ((status = thrift_field(&t, &last, &id, &type)) == WK_OK && type != THRIFT_STOP) {
    if (id == 1) status = thrift_i32(&t, type, &out->type);
    else if (id == 2) status = thrift_i32(&t, type, &out->uncompressed_bytes);
    else if (id == 3) status = thrift_i32(&t, type, &out->compressed_bytes);
    else if (id == 5 && type == THRIFT_STRUCT) status = read_data_v1(&t, out), detail = true;
    else if (id == 7 && type == THRIFT_STRUCT) status = read_dictionary(&t, out), detail = true;
    else if (id == 8 && type == THRIFT_STRUCT) status = read_data_v2(&t, out), detail = true;
    else status = thrift_skip(&t, type);
    if (status != WK_OK) break;
  }
  thrift_leave(&t);
  if (status != WK_OK) return status;
  out->header_bytes = (size_t)(t.p - t.start);
  t.p = t.start; /* messages below name the header's start */
  if (out->uncompressed_bytes < 0 || out->compressed_bytes < 0)
    return thrift_fail(&t, "page sizes %d and %d (missing or negative)", out->uncompressed_bytes,
                       out->compressed_bytes);
  if (out->type != PAGE_INDEX && (!detail || out->values < 0))
    return thrift_fail(&t, "a page of type %d without its header or value count", out->type);
  if (out->type == PAGE_DATA_V2 &&
      (out->definition_bytes < 0 || out->repetition_bytes < 0 ||
       (int64_t)out->definition_bytes + out->repetition_bytes > out->compressed_bytes ||
       (int64_t)out->definition_bytes + out->repetition_bytes > out->uncompressed_bytes))
    return thrift_fail(&t, "level sections of %d and %d bytes do not fit the page", out->definition_bytes,
                       out->repetition_bytes);
  return WK_OK;
}
