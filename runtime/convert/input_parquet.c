/*
 * input_parquet.c — a Parquet file as converter input: the strings of its --field column, row by
 * row in row-group order, as record chunks (records.c); a null row is counted, not a document. The
 * format itself is read by parquet/ (footer, pages, levels, codecs); this file walks its row groups,
 * reading each column chunk once (mapped when the file can be, else copied), and reports progress by
 * the file offsets it has passed.
 */
#include <stdlib.h>

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

WkStatus convert_cut_parquet(const ChunkContext *ctx, uint32_t i, WkBlob *blob, const RecordLimits *limits,
                             ChunkEmit emit, void *arg) {
  ParquetLimits bounds = {.max_footer_bytes = limits->max_footer_bytes, .max_page_bytes = limits->max_page_bytes};
  ParquetMeta meta;
  WK_TRY(parquet_meta_read(blob, ctx->field, &bounds, &meta));
  RecordCutter rc;
  record_cutter_init(&rc, i, limits->chunk_bytes, emit, arg);
  WkStatus status = WK_OK;
  uint8_t *copy = NULL;
  for (uint32_t g = 0; g < meta.chunk_count && status == WK_OK; g++) {
    const ParquetChunk *chunk = &meta.chunks[g];
    const uint8_t *data = chunk->length ? blob->map(blob, chunk->offset, (size_t)chunk->length) : NULL;
    if (!data) {
      uint8_t *grown = realloc(copy, chunk->length ? (size_t)chunk->length : 1);
      if (!grown) {
        status = WK_FAIL(WK_ERR_NOMEM, "out of memory reading %llu bytes of '%s'", (unsigned long long)chunk->length,
                         blob->name);
        break;
      }
      copy = grown;
      if ((status = blob->read_at(blob, chunk->offset, (size_t)chunk->length, copy)) != WK_OK) break;
      data = copy;
    }
    status = parquet_chunk_read(&meta, chunk, data, &bounds, on_value, on_nulls, &rc);
    /* Its pages are read: let them go from the page cache's view of this process. */
    blob->advise(blob, chunk->offset, chunk->length, WK_ADVICE_DONTNEED);
    rc.progress = chunk->offset + chunk->length;
  }
  if (status == WK_OK) {
    rc.progress = blob->size;
    status = record_cutter_flush(&rc, true);
  }
  free(copy);
  record_cutter_free(&rc);
  parquet_meta_free(&meta);
  return status;
}
