/*
 * columns_v1.c — TEMPORARY, until branch format2 (the column reader) is merged: every dataset as
 * version 1, one `tokens` column. Lets the loader's column plumbing build and refuse what it must;
 * the merge replaces this file with the real reader.
 */
#include <stdio.h>
#include <string.h>

#include "dataset.h"

const char *wk_column_kind_name(uint32_t kind) {
  static const char *const NAMES[WK_COLUMN_KIND_COUNT] = {"tokens", "token_u8", "i64", "f32", "tensor", "bytes"};
  return kind < WK_COLUMN_KIND_COUNT ? NAMES[kind] : "?";
}

uint32_t wk_dataset_column_count(const WkDataset *ds) {
  (void)ds;
  return 1;
}

WkStatus wk_dataset_column_info(const WkDataset *ds, uint32_t column, WkColumnInfo *out) {
  if (column != 0) return WK_FAIL(WK_ERR_INVALID_ARG, "dataset '%s' has 1 column, not %u", wk_dataset_name(ds), column);
  memset(out, 0, sizeof *out);
  snprintf(out->name, sizeof out->name, "tokens");
  out->kind = WK_COLUMN_TOKENS;
  out->dtype = wk_dataset_token_bytes(ds) == 2 ? WK_U16 : WK_I32;
  out->element_bytes = wk_dataset_token_bytes(ds);
  return WK_OK;
}

WkStatus wk_dataset_column_find(const WkDataset *ds, const char *name, uint32_t *column) {
  if (strcmp(name, "tokens") == 0) {
    *column = 0;
    return WK_OK;
  }
  return WK_FAIL(WK_ERR_INVALID_ARG, "dataset '%s' has no column '%s' (its columns: tokens)", wk_dataset_name(ds), name);
}

WkStatus wk_dataset_read_column(WkDataset *ds, uint32_t column, uint32_t shard, uint64_t first, uint64_t count,
                                void *out) {
  (void)ds, (void)column, (void)shard, (void)first, (void)count, (void)out;
  return WK_FAIL(WK_ERR_UNSUPPORTED, "column reads need format version 2");
}

WkStatus wk_dataset_read_blob(WkDataset *ds, uint32_t column, uint32_t shard, uint64_t record, void *out,
                              uint64_t capacity, uint64_t *size) {
  (void)ds, (void)column, (void)shard, (void)record, (void)out, (void)capacity, (void)size;
  return WK_FAIL(WK_ERR_UNSUPPORTED, "column reads need format version 2");
}
