/*
 * input_parquet.c — a Parquet file as converter input: the strings of its --field column, row by
 * row in row-group order, as record chunks (records.c); a null row is counted, not a document. With
 * --column, each row group's column chunks of the other fields are read first, row by row, and each
 * row's record carries them (numbers as JSON text, strings, a struct's bytes); a file without the text
 * column gives records without text (empty documents). The
 * format itself is read by parquet/ (footer, pages, levels, codecs); this file walks its row groups,
 * reading each column chunk once (mapped when the file can be, else copied), and reports progress by
 * the file offsets it has passed.
 */
#include <math.h>    /* isfinite */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert.h"
#include "parquet/parquet.h"

enum { RECORD_CHUNK_BYTES = 1 << 20 };

/* The converter's bounds: FineWeb's footers are a few hundred KB and its pages about 1 MB. A footer's
 * parsed schema can take ~40 bytes per byte of it, so its bound is the tighter one. */
const RecordLimits CONVERT_RECORD_LIMITS = {
    .chunk_bytes = RECORD_CHUNK_BYTES,
    .max_footer_bytes = 64ull << 20,
    .max_page_bytes = 1ull << 30,
    .max_member_bytes = 1ull << 30,
};

static WkStatus on_value(void *context, const uint8_t *bytes, size_t length) {
  RecordSlot text = {SLOT_STRING, bytes, length};
  return record_cutter_add(context, &text, 1);
}

static WkStatus on_nulls(void *context, uint64_t count) { return record_cutter_nulls(context, count); }

/* A column chunk's bytes: mapped when the blob can, else read into *copy. NULL on failure. */
static const uint8_t *chunk_data(WkBlob *blob, const ParquetChunk *chunk, uint8_t **copy) {
  const uint8_t *data = chunk->length ? blob->map(blob, chunk->offset, (size_t)chunk->length) : NULL;
  if (data) return data;
  uint8_t *grown = realloc(*copy, chunk->length ? (size_t)chunk->length : 1);
  if (!grown) {
    WK_FAIL(WK_ERR_NOMEM, "out of memory reading %llu bytes of '%s'", (unsigned long long)chunk->length, blob->name);
    return NULL;
  }
  *copy = grown;
  return blob->read_at(blob, chunk->offset, (size_t)chunk->length, grown) == WK_OK ? grown : NULL;
}

/* Reads one column chunk through value/nulls, then lets its pages go from the page cache's view. */
static WkStatus read_chunk(WkBlob *blob, const ParquetMeta *meta, uint32_t g, const ParquetLimits *bounds,
                           ParquetValueFn value, ParquetNullFn nulls, void *context, uint8_t **copy) {
  const ParquetChunk *chunk = &meta->chunks[g];
  const uint8_t *data = chunk_data(blob, chunk, copy);
  if (!data) return wk_last_status();
  WkStatus status = parquet_chunk_read(meta, chunk, data, bounds, value, nulls, context);
  blob->advise(blob, chunk->offset, chunk->length, WK_ADVICE_DONTNEED);
  return status;
}

/* ---- with --column: a row group's columns side by side ------------------------------------------ */

/* One column's values of a row group, row by row: a slot each (its bytes in data from offset). */
typedef struct {
  const ParquetMeta *meta;
  WkByteVec data;
  WkByteVec rows;  /* RowSlot per row */
} ColumnRows;

typedef struct {
  uint64_t offset, length;
  SlotType type;
} RowSlot;

/* A number or boolean as JSON text (a value not finite as null: no JSON number holds it). */
static size_t json_number(int32_t type, const uint8_t *v, char *out, size_t capacity) {
  int32_t i32;
  int64_t i64;
  float f;
  double d;
  switch (type) {
    case PARQUET_BOOLEAN: return (size_t)snprintf(out, capacity, "%s", v[0] ? "true" : "false");
    case PARQUET_INT32: memcpy(&i32, v, 4); return (size_t)snprintf(out, capacity, "%d", i32);
    case PARQUET_INT64: memcpy(&i64, v, 8); return (size_t)snprintf(out, capacity, "%lld", (long long)i64);
    case PARQUET_FLOAT: memcpy(&f, v, 4); d = f; break;
    default: memcpy(&d, v, 8);
  }
  return (size_t)(isfinite(d) ? snprintf(out, capacity, "%.17g", d) : snprintf(out, capacity, "null"));
}

static WkStatus add_row(ColumnRows *c, SlotType type, const uint8_t *bytes, size_t length) {
  RowSlot slot = {c->data.length, length, type};
  if (length) WK_TRY(wk_byte_vec_append(&c->data, bytes, length));
  return wk_byte_vec_append(&c->rows, &slot, sizeof slot);
}

static WkStatus column_value(void *context, const uint8_t *bytes, size_t length) {
  ColumnRows *c = context;
  if (c->meta->type == PARQUET_BYTE_ARRAY) return add_row(c, c->meta->text ? SLOT_STRING : SLOT_BINARY, bytes, length);
  char text[64];
  return add_row(c, SLOT_JSON, (const uint8_t *)text, json_number(c->meta->type, bytes, text, sizeof text));
}

static WkStatus column_nulls(void *context, uint64_t count) {
  for (uint64_t k = 0; k < count; k++) WK_TRY(add_row(context, SLOT_NULL, NULL, 0));
  return WK_OK;
}

/* A row group being cut into records: the text column drives, the others were read before it. */
typedef struct {
  RecordCutter *rc;
  ColumnRows *columns;  /* [1 .. count): the --columns' fields */
  uint32_t count;
  uint64_t row;         /* the next row of the group */
} Rows;

static WkStatus emit_row(Rows *rows, RecordSlot text) {
  RecordSlot slots[1 + COLUMN_MAX] = {text};
  for (uint32_t k = 1; k < rows->count; k++) {
    if (rows->row >= rows->columns[k].rows.length / sizeof(RowSlot))
      return WK_FAIL(WK_ERR_FORMAT, "'%s' column '%s': fewer values than its row group's rows (corrupted?)",
                     rows->columns[k].meta->path, rows->columns[k].meta->column);
    const RowSlot *r = &((const RowSlot *)rows->columns[k].rows.data)[rows->row];
    const uint8_t *data = rows->columns[k].data.data; /* NULL while every value so far was empty */
    slots[k] = (RecordSlot){r->type, data ? data + r->offset : NULL, (size_t)r->length};
  }
  rows->row++;
  return record_cutter_add(rows->rc, slots, rows->count);
}

static WkStatus row_text(void *context, const uint8_t *bytes, size_t length) {
  return emit_row(context, (RecordSlot){SLOT_STRING, bytes, length});
}

/* A null text: the row is no record (counted as today, --column or not). */
static WkStatus row_nulls(void *context, uint64_t count) {
  Rows *rows = context;
  rows->row += count;
  return record_cutter_nulls(rows->rc, count);
}

/* The file's columns for the fields (the text's may be absent: empty documents), checked side by side. */
static WkStatus open_columns(const ChunkContext *ctx, WkBlob *blob, const ParquetLimits *bounds, ParquetMeta *metas,
                             uint32_t *count) {
  const char *fields[1 + COLUMN_MAX];
  *count = convert_record_fields(ctx, fields, 1 + COLUMN_MAX);
  for (uint32_t k = 0; k < *count; k++) {
    WK_TRY(parquet_meta_read(blob, fields[k], k == 0 && !ctx->tokens, bounds, &metas[k]));
    if (k == 0 && !metas[0].absent && metas[0].type != PARQUET_BYTE_ARRAY)
      return WK_FAIL(WK_ERR_UNSUPPORTED, "'%s' column '%s': the text is a string column, not Parquet type %d",
                     blob->name, fields[0], (int)metas[0].type);
    const ParquetMeta *a = &metas[k], *b = metas[0].absent ? &metas[1] : &metas[0];
    if (a->absent || b->absent) continue;
    bool same = a->chunk_count == b->chunk_count;
    for (uint32_t g = 0; same && g < a->chunk_count; g++) same = a->chunks[g].values == b->chunks[g].values;
    if (!same)
      return WK_FAIL(WK_ERR_FORMAT, "'%s': columns '%s' and '%s' have different row groups (corrupted footer?)",
                     blob->name, a->column, b->column);
  }
  return WK_OK;
}

static WkStatus cut_columns(const ChunkContext *ctx, WkBlob *blob, const ParquetLimits *bounds, RecordCutter *rc) {
  ParquetMeta metas[1 + COLUMN_MAX] = {0};
  ColumnRows columns[1 + COLUMN_MAX] = {0};
  uint32_t count = 0;
  uint8_t *copy = NULL;
  WkStatus status = open_columns(ctx, blob, bounds, metas, &count);
  const ParquetMeta *rows_of = metas[0].absent ? &metas[count > 1 ? 1 : 0] : &metas[0];
  for (uint32_t g = 0; status == WK_OK && g < rows_of->chunk_count; g++) {
    for (uint32_t k = 1; k < count && status == WK_OK; k++) {
      columns[k].meta = &metas[k];
      columns[k].data.length = columns[k].rows.length = 0;
      status = read_chunk(blob, &metas[k], g, bounds, column_value, column_nulls, &columns[k], &copy);
    }
    Rows rows = {.rc = rc, .columns = columns, .count = count};
    if (status == WK_OK && !metas[0].absent)
      status = read_chunk(blob, &metas[0], g, bounds, row_text, row_nulls, &rows, &copy);
    while (status == WK_OK && metas[0].absent && rows.row < (uint64_t)rows_of->chunks[g].values)
      status = emit_row(&rows, (RecordSlot){SLOT_MISSING, NULL, 0});
    rc->progress = rows_of->chunks[g].offset + rows_of->chunks[g].length;
  }
  for (uint32_t k = 0; k < 1 + COLUMN_MAX; k++) {
    free(columns[k].data.data), free(columns[k].rows.data);
    parquet_meta_free(&metas[k]);
  }
  free(copy);
  return status;
}

WkStatus convert_cut_parquet(const ChunkContext *ctx, uint32_t i, WkBlob *blob, const RecordLimits *limits,
                             ChunkEmit emit, void *arg) {
  ParquetLimits bounds = {.max_footer_bytes = limits->max_footer_bytes, .max_page_bytes = limits->max_page_bytes};
  RecordCutter rc;
  record_cutter_init(&rc, i, limits->chunk_bytes, emit, arg);
  WkStatus status = WK_OK;
  if (ctx->records) {
    status = cut_columns(ctx, blob, &bounds, &rc);
  } else {
    ParquetMeta meta;
    uint8_t *copy = NULL;
    status = parquet_meta_read(blob, ctx->field, false, &bounds, &meta);
    if (status == WK_OK && meta.type != PARQUET_BYTE_ARRAY)
      status = WK_FAIL(WK_ERR_UNSUPPORTED, "'%s' column '%s': values of Parquet type %d, not BYTE_ARRAY (strings); "
                       "choose a text column with --field", blob->name, ctx->field, (int)meta.type);
    for (uint32_t g = 0; status == WK_OK && g < meta.chunk_count; g++) {
      status = read_chunk(blob, &meta, g, &bounds, on_value, on_nulls, &rc, &copy);
      rc.progress = meta.chunks[g].offset + meta.chunks[g].length;
    }
    free(copy);
    parquet_meta_free(&meta);
  }
  if (status == WK_OK) {
    rc.progress = blob->size;
    status = record_cutter_flush(&rc, true);
  }
  record_cutter_free(&rc);
  return status;
}
