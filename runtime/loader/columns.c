/*
 * columns.c — the columns a loader is asked for (wk_loader_add_column) besides the tokens: each found in
 * every source at start (the same kind, dtype and shape everywhere), its place in a row, and its values
 * read into a row for the sample there. A per-token column (TOKEN_U8) covers the same stream positions
 * as the row's tokens; a per-record one (I64, F32, TENSOR, BYTES) is the row's record, so only pad mode
 * (one record a row) takes it.
 *
 * A per-token column rides with the tokens: the node reader decodes its blocks into the same unit of the
 * node cache and copies a row's bytes next to its tokens (node_reader.c); here its positions are chosen
 * and the rest of its row zeroed. A per-record column is read through the dataset's block cache
 * (wk_dataset_read_column, wk_dataset_read_blob), one call per row and column.
 */
#include <stdio.h>
#include <string.h>

#include "loader.h"

static bool per_record(uint32_t kind) { return kind != WK_COLUMN_TOKENS && kind != WK_COLUMN_TOKEN_U8; }

WkStatus wk_loader_add_column(WkLoader *loader, const char *name) {
  if (loader->started) return WK_FAIL(WK_ERR_INVALID_ARG, "add_column: the loader has already started");
  size_t length = strlen(name);
  if (length == 0 || length >= WK_COLUMN_NAME_BYTES)
    return WK_FAIL(WK_ERR_INVALID_ARG, "column name '%s' must have 1 to %d bytes", name, WK_COLUMN_NAME_BYTES - 1);
  if (strcmp(name, "tokens") == 0)
    return WK_FAIL(WK_ERR_INVALID_ARG, "column 'tokens' is always in the batch (its tokens); ask only for others");
  for (uint32_t c = 0; c < loader->column_count; c++)
    if (strcmp(loader->columns[c].name, name) == 0) return WK_FAIL(WK_ERR_INVALID_ARG, "column '%s' is asked for twice", name);
  if (loader->column_count == WK_BATCH_MAX_COLUMNS)
    return WK_FAIL(WK_ERR_INVALID_ARG, "a batch carries at most %d columns ('%s' is one more)", WK_BATCH_MAX_COLUMNS, name);
  LoaderColumn *column = &loader->columns[loader->column_count++];
  memset(column, 0, sizeof *column);
  memcpy(column->name, name, length + 1);
  return WK_OK;
}

/* "f32[4,8]", "i64", ...: a column's type as the converter's --column spells it. */
static void describe(const WkColumnInfo *info, char *out, size_t capacity) {
  if (info->kind != WK_COLUMN_TENSOR) {
    snprintf(out, capacity, "%s", wk_column_kind_name(info->kind));
    return;
  }
  int used = snprintf(out, capacity, "%s[", wk_dtype_name((WkDType)info->dtype));
  for (uint32_t d = 0; d < info->ndim && used > 0 && (size_t)used < capacity; d++)
    used += snprintf(out + used, capacity - (size_t)used, "%s%u", d ? "," : "", info->shape[d]);
  if (used > 0 && (size_t)used < capacity) snprintf(out + used, capacity - (size_t)used, "]");
}

static bool same_type(const WkColumnInfo *a, const WkColumnInfo *b) {
  return a->kind == b->kind && a->dtype == b->dtype && a->ndim == b->ndim && a->element_bytes == b->element_bytes &&
         memcmp(a->shape, b->shape, sizeof a->shape) == 0;
}

static WkStatus resolve(WkLoader *loader, LoaderColumn *column) {
  bool packed = param(loader, WK_LOADER_MODE) == WK_PACK_PACKED;
  for (uint32_t i = 0; i < loader->mix.count; i++) {
    const Source *source = &loader->sources[i];
    WkColumnInfo info;
    if (wk_dataset_column_find(source->ds, column->name, &column->index[i]) != WK_OK ||
        wk_dataset_column_info(source->ds, column->index[i], &info) != WK_OK)
      return wk_error_context("source '%s'", source->path);
    char type[64], first[64];
    describe(&info, type, sizeof type);
    if (i == 0) column->info = info;
    describe(&column->info, first, sizeof first);
    if (!same_type(&column->info, &info))
      return WK_FAIL(WK_ERR_INVALID_ARG, "column '%s' is %s in source '%s' but %s in source '%s': sources of a mix "
                     "must agree on each column asked for", column->name, first, loader->sources[0].path, type,
                     source->path);
    if (packed && per_record(info.kind))
      return WK_FAIL(WK_ERR_INVALID_ARG, "column '%s' of source '%s' holds one %s per record, but packed rows cut "
                     "across records: ask for it in pad mode (mode = 'pad', one record a row)", column->name,
                     source->path, type);
  }
  return WK_OK;
}

WkStatus loader_resolve_columns(WkLoader *loader) {
  for (uint32_t c = 0; c < loader->column_count; c++) WK_TRY(resolve(loader, &loader->columns[c]));
  return WK_OK;
}

uint64_t loader_column_row(const WkLoader *loader, uint32_t c, WkRowColumn *out) {
  const WkColumnInfo *info = &loader->columns[c].info;
  memset(out, 0, sizeof *out);
  out->kind = info->kind;
  out->dtype = info->dtype;
  if (info->kind == WK_COLUMN_TOKEN_U8) {
    out->ndim = 1;
    out->shape[0] = param(loader, WK_LOADER_SEQ_LEN) + 1;
    out->row_bytes = (uint64_t)out->shape[0];
  } else if (info->kind == WK_COLUMN_BYTES) {
    out->dtype = WK_U8;
    out->ndim = 1;
    out->shape[0] = param(loader, WK_LOADER_BLOB_BYTES);
    out->row_bytes = (uint64_t)out->shape[0];
  } else {
    out->ndim = info->kind == WK_COLUMN_TENSOR ? info->ndim : 0;
    for (uint32_t d = 0; d < out->ndim; d++) out->shape[d] = info->shape[d];
    out->row_bytes = info->element_bytes;
  }
  return out->row_bytes;
}

/* ---- reading a row's columns -------------------------------------------------------------------- */

/* A record's blob, refused (naming the file and the record) when the row cannot hold it. */
static WkStatus read_blob(WkLoader *loader, uint32_t s, uint32_t c, const WkSampleLoc *loc, WkRowColumn *column,
                          uint32_t r) {
  const Source *source = &loader->sources[s];
  uint8_t *row = column->data + r * column->row_bytes;
  uint64_t size = 0;
  WkStatus status = wk_dataset_read_blob(source->ds, loader->columns[c].index[s], loc->shard, loc->item, row,
                                         column->row_bytes, &size);
  if (status == WK_OK || size <= column->row_bytes) {
    if (status != WK_OK) return status;
    memset(row + size, 0, column->row_bytes - size);
    column->sizes[r] = (int64_t)size;
    return WK_OK;
  }
  WkShardInfo shard;
  const char *file = wk_dataset_shard_info(source->ds, loc->shard, &shard) == WK_OK ? shard.name : "?";
  return WK_FAIL(WK_ERR_INVALID_ARG, "shard '%s' record %llu: column '%s' holds %llu bytes, more than a row's %llu "
                 "(raise blob_bytes, the recipe's data.blob_bytes)", file, (unsigned long long)loc->item,
                 loader->columns[c].name, (unsigned long long)size, (unsigned long long)column->row_bytes);
}

uint32_t loader_source_columns(const WkLoader *loader, uint32_t s, bool per_token, uint32_t *out) {
  uint32_t n = 0;
  for (uint32_t c = 0; c < loader->column_count; c++)
    if ((loader->columns[c].info.kind == WK_COLUMN_TOKEN_U8) == per_token) out[n++] = loader->columns[c].index[s];
  return n;
}

/* The row's stream positions: packed, its window; pad, its record's tokens and the EOS after them (when
 * the row has room for it). */
static uint64_t positions(const WkLoader *loader, const WkSampleLoc *loc) {
  uint64_t width = (uint64_t)param(loader, WK_LOADER_SEQ_LEN) + 1;
  return loc->length + (param(loader, WK_LOADER_MODE) == WK_PACK_PAD && loc->length < width);
}

uint32_t loader_token_column_rows(const WkLoader *loader, const WkRows *rows, const WkSampleLoc *loc, uint32_t r,
                                  uint8_t **out) {
  uint32_t n = 0;
  for (uint32_t c = 0; c < rows->column_count; c++)
    if (rows->columns[c].kind == WK_COLUMN_TOKEN_U8) out[n++] = rows->columns[c].data + r * rows->columns[c].row_bytes;
  return (uint32_t)(positions(loader, loc) - loc->length);
}

WkStatus loader_read_columns(WkLoader *loader, uint32_t s, const WkSampleLoc *loc, WkRows *rows, uint32_t r) {
  for (uint32_t c = 0; c < rows->column_count; c++) {
    WkRowColumn *column = &rows->columns[c];
    uint8_t *row = column->data + r * column->row_bytes;
    uint64_t filled = column->kind == WK_COLUMN_TOKEN_U8 ? positions(loader, loc) : 0;
    if (column->kind == WK_COLUMN_TOKEN_U8) memset(row + filled, 0, column->row_bytes - filled);
    else if (column->kind == WK_COLUMN_BYTES) WK_TRY(read_blob(loader, s, c, loc, column, r));
    else WK_TRY(wk_dataset_read_column(loader->sources[s].ds, loader->columns[c].index[s], loc->shard, loc->item, 1, row));
  }
  return WK_OK;
}
