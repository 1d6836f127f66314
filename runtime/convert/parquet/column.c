/*
 * column.c — one column chunk of a Parquet row group: its pages in order (an optional dictionary
 * page first, then data pages v1 or v2; index pages skipped), each decompressed, its definition
 * levels read (a level below the column's maximum is a null row) and its values decoded, PLAIN (a u32
 * length and the bytes; fixed-width little-endian numbers; booleans one bit each) or through the
 * dictionary (indices in the RLE / bit-packed hybrid), and handed to the caller row by row. Nothing is
 * read outside the chunk's bytes or past a page's own sizes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parquet.h"

enum { LENGTH_BYTES = 4 };

/* The definition levels' bit width: enough for the column's maximum level (0, 1 or 2). */
static int definition_bit_width(const ParquetMeta *m) { return m->max_definition > 1 ? 2 : m->max_definition; }

static const char *encoding_name(int32_t e) {
  static const char *const names[] = {"PLAIN", "GROUP_VAR_INT", "PLAIN_DICTIONARY", "RLE", "BIT_PACKED",
                                      "DELTA_BINARY_PACKED", "DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY",
                                      "RLE_DICTIONARY", "BYTE_STREAM_SPLIT"};
  return e >= 0 && (size_t)e < sizeof names / sizeof names[0] ? names[e] : "unknown";
}

static uint32_t le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

typedef struct {
  const ParquetMeta *meta;
  const ParquetLimits *limits;
  char what[256];       /* "'f.parquet' column 'text', page at byte N" */
  uint8_t *page;        /* decompressed page (reused) */
  size_t page_capacity;
  uint8_t *dictionary;  /* the dictionary page's values, decompressed */
  uint32_t *entry_start, *entry_length;
  uint32_t entries;
  bool has_dictionary;
} Walk;

static WkStatus fail(const Walk *w, const char *fmt, const char *detail) {
  return WK_FAIL(WK_ERR_FORMAT, "%s: %s%s (file truncated or corrupted)", w->what, fmt, detail ? detail : "");
}

static WkStatus reserve(uint8_t **buffer, size_t *capacity, size_t n) {
  if (n <= *capacity && *buffer) return WK_OK;
  uint8_t *grown = realloc(*buffer, n ? n : 1);
  if (!grown) return WK_FAIL(WK_ERR_NOMEM, "out of memory for a Parquet page of %zu bytes", n);
  *buffer = grown;
  *capacity = n;
  return WK_OK;
}

/* ---- dictionary pages --------------------------------------------------------------------------- */

static WkStatus read_dictionary(Walk *w, const PageHeader *h, const uint8_t *src, int32_t codec) {
  if (w->has_dictionary) return fail(w, "a second dictionary page", NULL);
  if (h->encoding != ENCODING_PLAIN && h->encoding != ENCODING_PLAIN_DICTIONARY)
    return WK_FAIL(WK_ERR_UNSUPPORTED, "%s: a dictionary page encoded %s (only PLAIN is supported)", w->what,
                   encoding_name(h->encoding));
  size_t n = (size_t)h->uncompressed_bytes, width = parquet_value_bytes(w->meta->type);
  if (w->meta->type == PARQUET_BOOLEAN) return fail(w, "a dictionary of booleans", NULL);
  /* Each entry is at least its 4-byte length (or its fixed width): a count beyond that is a lie. */
  if ((uint64_t)h->values > n / (width ? width : LENGTH_BYTES))
    return fail(w, "more dictionary entries than the page has bytes for", NULL);
  w->dictionary = malloc(n ? n : 1);
  w->entry_start = malloc(((size_t)h->values + 1) * sizeof *w->entry_start);
  w->entry_length = malloc(((size_t)h->values + 1) * sizeof *w->entry_length);
  if (!w->dictionary || !w->entry_start || !w->entry_length)
    return WK_FAIL(WK_ERR_NOMEM, "out of memory for a Parquet dictionary of %zu bytes", n);
  WK_TRY(parquet_decompress(codec, src, (size_t)h->compressed_bytes, w->dictionary, n, w->what));
  size_t at = 0;
  for (uint32_t i = 0; i < (uint32_t)h->values && width; i++)
    w->entry_start[i] = (uint32_t)(i * width), w->entry_length[i] = (uint32_t)width;
  for (uint32_t i = 0; i < (uint32_t)h->values && !width; i++) {
    if (n - at < LENGTH_BYTES) return fail(w, "the dictionary ends inside an entry's length", NULL);
    uint32_t length = le32(w->dictionary + at);
    at += LENGTH_BYTES;
    if (length > n - at) return fail(w, "a dictionary entry runs past the page's end", NULL);
    w->entry_start[i] = (uint32_t)at;
    w->entry_length[i] = length;
    at += length;
  }
  w->entries = (uint32_t)h->values;
  w->has_dictionary = true;
  return WK_OK;
}

/* ---- data pages -------------------------------------------------------------------------------- */

typedef struct {
  bool dictionary;
  bool booleans;          /* RLE-encoded booleans (data page v2): indices holds them, bit width 1 */
  Rle indices;
  const uint8_t *p, *end; /* PLAIN values */
  uint64_t bit;           /* PLAIN booleans: the next one's bit from p */
} Values;

static WkStatus values_init(Walk *w, Values *v, int32_t encoding, const uint8_t *p, const uint8_t *end) {
  *v = (Values){.p = p, .end = end};
  if (encoding == ENCODING_PLAIN) return WK_OK;
  if (encoding == ENCODING_RLE && w->meta->type == PARQUET_BOOLEAN) { /* a u32 length, then the runs */
    if ((size_t)(end - p) < LENGTH_BYTES || le32(p) > (size_t)(end - p) - LENGTH_BYTES)
      return fail(w, "RLE booleans run past the page's end", NULL);
    v->booleans = true;
    if (rle_init(&v->indices, p + LENGTH_BYTES, le32(p), 1) != WK_OK) return wk_error_context("%s", w->what);
    return WK_OK;
  }
  if (encoding != ENCODING_PLAIN_DICTIONARY && encoding != ENCODING_RLE_DICTIONARY)
    return WK_FAIL(WK_ERR_UNSUPPORTED, "%s: values encoded %s are not supported (only PLAIN and dictionary; write "
                   "the file with pyarrow's default encodings, or convert it to JSONL)", w->what, encoding_name(encoding));
  if (!w->has_dictionary) return fail(w, "dictionary-encoded values without a dictionary page", NULL);
  if (p >= end) return fail(w, "the page ends before its index bit width", NULL);
  v->dictionary = true;
  if (rle_init(&v->indices, p + 1, (size_t)(end - p - 1), *p) != WK_OK) return wk_error_context("%s", w->what);
  return WK_OK;
}

/* The next PLAIN value: a length-prefixed BYTE_ARRAY, a fixed-width number, a bit of a boolean (as a byte). */
static const uint8_t BOOLEANS[2] = {0, 1};

static WkStatus plain_value(Walk *w, Values *v, ParquetValueFn value, void *context) {
  int32_t type = w->meta->type;
  if (type == PARQUET_BOOLEAN) {
    if (v->bit / 8 >= (uint64_t)(v->end - v->p)) return fail(w, "the values end before the page's value count", NULL);
    uint8_t bit = (v->p[v->bit / 8] >> (v->bit % 8)) & 1;
    v->bit++;
    return value(context, &BOOLEANS[bit], 1);
  }
  size_t length = parquet_value_bytes(type);
  if (length == 0) {
    if ((size_t)(v->end - v->p) < LENGTH_BYTES) return fail(w, "the values end before the page's value count", NULL);
    length = le32(v->p);
    v->p += LENGTH_BYTES;
  }
  if (length > (size_t)(v->end - v->p)) return fail(w, "a value runs past the page's end", NULL);
  const uint8_t *bytes = v->p;
  v->p += length;
  return value(context, bytes, length);
}

/* Hands `count` present values to the caller. */
static WkStatus emit_values(Walk *w, Values *v, uint64_t count, ParquetValueFn value, void *context) {
  while (count > 0) {
    if (!v->dictionary && !v->booleans) {
      WK_TRY(plain_value(w, v, value, context));
      count--;
      continue;
    }
    uint32_t index;
    uint64_t run;
    if (rle_run(&v->indices, count, &index, &run) != WK_OK) return wk_error_context("%s: dictionary indices", w->what);
    if (v->booleans) {
      for (uint64_t k = 0; k < run; k++) WK_TRY(value(context, &BOOLEANS[index & 1], 1));
      count -= run;
      continue;
    }
    if (index >= w->entries) {
      char detail[64];
      snprintf(detail, sizeof detail, " (index %u of %u entries)", index, w->entries);
      return fail(w, "a dictionary index out of range", detail);
    }
    for (uint64_t k = 0; k < run; k++)
      WK_TRY(value(context, w->dictionary + w->entry_start[index], w->entry_length[index]));
    count -= run;
  }
  return WK_OK;
}

/* The rows of one data page: definition levels (def, when the column is OPTIONAL) and values. */
static WkStatus read_rows(Walk *w, Rle *def, Values *v, uint64_t rows, ParquetValueFn value, ParquetNullFn nulls,
                          void *context) {
  while (rows > 0) {
    uint32_t level = 0;
    uint64_t run = rows;
    if (def) {
      if (rle_run(def, rows, &level, &run) != WK_OK) return wk_error_context("%s: definition levels", w->what);
    } else {
      level = 0, run = rows;
    }
    bool present = def ? level == (uint32_t)w->meta->max_definition : true; /* below: a null (struct or value) */
    if (def && level > (uint32_t)w->meta->max_definition) return fail(w, "a definition level above the column's", NULL);
    WK_TRY(present ? emit_values(w, v, run, value, context) : nulls(context, run));
    rows -= run;
  }
  return WK_OK;
}

static WkStatus read_data_v1(Walk *w, const PageHeader *h, const uint8_t *src, int32_t codec, ParquetValueFn value,
                             ParquetNullFn nulls, void *context) {
  size_t n = (size_t)h->uncompressed_bytes;
  WK_TRY(reserve(&w->page, &w->page_capacity, n));
  WK_TRY(parquet_decompress(codec, src, (size_t)h->compressed_bytes, w->page, n, w->what));
  const uint8_t *p = w->page, *end = w->page + n;
  Rle def;
  if (w->meta->max_definition > 0) {
    if (h->definition_encoding != ENCODING_RLE)
      return WK_FAIL(WK_ERR_UNSUPPORTED, "%s: definition levels encoded %s (only RLE is supported)", w->what,
                     encoding_name(h->definition_encoding));
    if (n < LENGTH_BYTES) return fail(w, "the page ends before its definition levels", NULL);
    uint32_t length = le32(p);
    p += LENGTH_BYTES;
    if (length > (size_t)(end - p)) return fail(w, "definition levels run past the page's end", NULL);
    WK_TRY(rle_init(&def, p, length, definition_bit_width(w->meta)));
    p += length;
  }
  Values v;
  WK_TRY(values_init(w, &v, h->encoding, p, end));
  return read_rows(w, w->meta->max_definition > 0 ? &def : NULL, &v, (uint64_t)h->values, value, nulls, context);
}

static WkStatus read_data_v2(Walk *w, const PageHeader *h, const uint8_t *src, int32_t codec, ParquetValueFn value,
                             ParquetNullFn nulls, void *context) {
  /* Levels first, never compressed; then the values, compressed unless the header says not. */
  size_t levels = (size_t)h->repetition_bytes + (size_t)h->definition_bytes;
  const uint8_t *definition = src + h->repetition_bytes;
  size_t stored = (size_t)h->compressed_bytes - levels, n = (size_t)h->uncompressed_bytes - levels;
  const uint8_t *p = src + levels;
  if (h->compressed && codec != PARQUET_UNCOMPRESSED) {
    WK_TRY(reserve(&w->page, &w->page_capacity, n));
    WK_TRY(parquet_decompress(codec, p, stored, w->page, n, w->what));
    p = w->page;
  } else if (stored != n) {
    return fail(w, "an uncompressed values section whose two sizes differ", NULL);
  }
  Rle def;
  if (w->meta->max_definition > 0)
    WK_TRY(rle_init(&def, definition, (size_t)h->definition_bytes, definition_bit_width(w->meta)));
  Values v;
  WK_TRY(values_init(w, &v, h->encoding, p, p + n));
  return read_rows(w, w->meta->max_definition > 0 ? &def : NULL, &v, (uint64_t)h->values, value, nulls, context);
}

/* ---- the chunk ------------------------------------------------------------------------------------ */

WkStatus parquet_chunk_read(const ParquetMeta *meta, const ParquetChunk *chunk, const uint8_t *data,
                            const ParquetLimits *limits, ParquetValueFn value, ParquetNullFn nulls, void *context) {
  Walk w = {.meta = meta, .limits = limits};
  WkStatus status = WK_OK;
  uint64_t pos = 0, seen = 0, wanted = (uint64_t)chunk->values;
  while (status == WK_OK && seen < wanted) {
    uint64_t at = chunk->offset + pos;
    snprintf(w.what, sizeof w.what, "'%s' column '%s', page at byte %llu", meta->path, meta->column,
             (unsigned long long)at);
    if (pos >= chunk->length) {
      char detail[96];
      snprintf(detail, sizeof detail, " (after %llu of its %llu values)", (unsigned long long)seen,
               (unsigned long long)wanted);
      status = fail(&w, "the column chunk ends before its last page", detail);
      break;
    }
    PageHeader h;
    if ((status = parquet_page_header(data + pos, (size_t)(chunk->length - pos), at, meta->path, &h)) != WK_OK) break;
    pos += h.header_bytes;
    if ((uint64_t)h.compressed_bytes > chunk->length - pos) {
      status = fail(&w, "a page runs past the end of its column chunk", NULL);
      break;
    }
    if ((uint64_t)h.compressed_bytes > limits->max_page_bytes || (uint64_t)h.uncompressed_bytes > limits->max_page_bytes) {
      status = WK_FAIL(WK_ERR_FORMAT, "%s: a page of %d bytes (%d compressed) is over the limit of %llu", w.what,
                       h.uncompressed_bytes, h.compressed_bytes, (unsigned long long)limits->max_page_bytes);
      break;
    }
    const uint8_t *src = data + pos;
    if (h.type == PAGE_DATA || h.type == PAGE_DATA_V2) {
      if ((uint64_t)h.values > wanted - seen) {
        status = fail(&w, "a page holds more values than its column chunk", NULL);
        break;
      }
      status = h.type == PAGE_DATA ? read_data_v1(&w, &h, src, chunk->codec, value, nulls, context)
                                   : read_data_v2(&w, &h, src, chunk->codec, value, nulls, context);
      seen += (uint64_t)h.values;
    } else if (h.type == PAGE_DICTIONARY) {
      status = read_dictionary(&w, &h, src, chunk->codec);
    } else if (h.type != PAGE_INDEX) {
      char detail[32];
      snprintf(detail, sizeof detail, " (%d)", h.type);
      status = fail(&w, "an unknown page type", detail);
    }
    pos += (uint64_t)h.compressed_bytes;
  }
  free(w.page);
  free(w.dictionary);
  free(w.entry_start);
  free(w.entry_length);
  return status;
}
