/*
 * metadata.c — a Parquet file's footer: `PAR1` at both ends, the FileMetaData (Thrift compact) before
 * the last 8 bytes, and from it the schema and the chosen column's chunk in every row group.
 *
 * Read from FileMetaData: schema (2: name, type, repetition, children), num_rows (3), row_groups (4:
 * columns, num_rows); from each ColumnChunk: file_path (1, refused), meta_data (3: type, path,
 * codec, values, compressed size, data and dictionary page offsets), encryption (refused). Every
 * other field is skipped. The column must be a top-level value column (BOOLEAN, INT32, INT64, FLOAT, DOUBLE,
 * BYTE_ARRAY) or a struct's "bytes" child, REQUIRED or OPTIONAL.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parquet.h"

#define MAGIC "PAR1"
#define ENCRYPTED_MAGIC "PARE"
enum {
  MAGIC_BYTES = 4,
  TAIL_BYTES = 8,  /* footer length (u32 little-endian) + magic */
  REPETITION_REQUIRED = 0, REPETITION_OPTIONAL = 1, REPETITION_REPEATED = 2,
  MAX_PATH = 2,          /* a column, or a struct and its "bytes" */
  SHOWN_COLUMNS = 8,     /* columns listed when the asked one is missing */
  FIELD_ENCRYPTION = 8,  /* FileMetaData.encryption_algorithm, ColumnChunk.crypto_metadata */
  FIELD_ENCRYPTED_COLUMN = 9,
};

typedef struct {
  const uint8_t *name;
  size_t name_length;
  int32_t type, repetition, children;
} SchemaElement;

typedef struct {
  Thrift t;
  const char *column;
  size_t column_length;
  const char *path[MAX_PATH];  /* the leaf's path in the schema, once found (after the schema is read) */
  size_t path_length[MAX_PATH];
  uint32_t path_count;
  bool optional;
  ParquetMeta *meta;
  uint64_t file_size;
  SchemaElement *schema;
  uint32_t schema_count;
  ParquetChunk *chunks;
  uint32_t chunk_count;
  int64_t rows;
  int32_t value_type;  /* of the chosen column's chunks */
} Footer;

/* ---- schema --------------------------------------------------------------------------------- */

static WkStatus read_schema_element(Thrift *t, SchemaElement *e) {
  *e = (SchemaElement){.type = -1, .repetition = REPETITION_REQUIRED};
  WK_TRY(thrift_enter(t));
  int16_t last = 0, id = 0;
  ThriftType type = THRIFT_STOP;
  WkStatus status;
  while ((status = thrift_field(t, &last, &id, &type)) == WK_OK && type != THRIFT_STOP) {
    if (id == 1) status = thrift_i32(t, type, &e->type);
    else if (id == 3) status = thrift_i32(t, type, &e->repetition);
    else if (id == 4 && type == THRIFT_BINARY) status = thrift_binary(t, &e->name, &e->name_length);
    else if (id == 5) status = thrift_i32(t, type, &e->children);
    else status = thrift_skip(t, type);
    if (status != WK_OK) break;
  }
  thrift_leave(t);
  if (status == WK_OK && e->children < 0) status = thrift_fail(t, "a schema element with %d children", e->children);
  return status;
}

static WkStatus read_schema(Footer *f) {
  Thrift *t = &f->t;
  ThriftType element;
  uint32_t count;
  WK_TRY(thrift_list(t, &element, &count));
  if (element != THRIFT_STRUCT) return thrift_fail(t, "the schema is not a list of structures");
  if (f->schema) return thrift_fail(t, "a second schema");
  f->schema = wk_calloc(count ? count : 1, sizeof *f->schema, "Parquet schema");
  if (!f->schema) return WK_ERR_NOMEM;
  f->schema_count = count;
  for (uint32_t i = 0; i < count; i++) WK_TRY(read_schema_element(t, &f->schema[i]));
  return WK_OK;
}

/* ---- row groups ----------------------------------------------------------------------------- */

typedef struct {
  int32_t type, codec;
  int64_t values, compressed, data_offset, dictionary_offset;
  bool has_dictionary, is_column;  /* its path is exactly the leaf's */
} ColumnMeta;

static WkStatus read_path(Footer *f, bool *matches) {
  Thrift *t = &f->t;
  ThriftType element;
  uint32_t count;
  WK_TRY(thrift_list(t, &element, &count));
  if (element != THRIFT_BINARY) return thrift_fail(t, "path_in_schema is not a list of strings");
  *matches = f->path_count > 0 && count == f->path_count;
  for (uint32_t i = 0; i < count; i++) {
    const uint8_t *name;
    size_t length;
    WK_TRY(thrift_binary(t, &name, &length));
    *matches = *matches && length == f->path_length[i] && memcmp(name, f->path[i], length) == 0;
  }
  return WK_OK;
}

static WkStatus read_column_meta(Footer *f, ColumnMeta *m) {
  Thrift *t = &f->t;
  *m = (ColumnMeta){.type = -1, .codec = -1, .values = -1, .compressed = -1, .data_offset = -1};
  WK_TRY(thrift_enter(t));
  int16_t last = 0, id = 0;
  ThriftType type = THRIFT_STOP;
  WkStatus status;
  while ((status = thrift_field(t, &last, &id, &type)) == WK_OK && type != THRIFT_STOP) {
    switch (id) {
      case 1: status = thrift_i32(t, type, &m->type); break;
      case 3: status = type == THRIFT_LIST ? read_path(f, &m->is_column) : thrift_skip(t, type); break;
      case 4: status = thrift_i32(t, type, &m->codec); break;
      case 5: status = thrift_i64(t, type, &m->values); break;
      case 7: status = thrift_i64(t, type, &m->compressed); break;
      case 9: status = thrift_i64(t, type, &m->data_offset); break;
      case 11:
        status = thrift_i64(t, type, &m->dictionary_offset);
        m->has_dictionary = true;
        break;
      default: status = thrift_skip(t, type);
    }
    if (status != WK_OK) break;
  }
  thrift_leave(t);
  return status;
}

static WkStatus add_chunk(Footer *f, const ColumnMeta *m, int64_t group_rows, uint32_t group) {
  Thrift *t = &f->t;
  if (m->type != f->meta->type)
    return thrift_fail(t, "row group %u: column '%s' holds values of type %d, its schema says %d", group, f->column,
                       (int)m->type, (int)f->meta->type);
  if (m->values < 0 || m->compressed < 0 || m->data_offset < MAGIC_BYTES)
    return thrift_fail(t, "row group %u: column '%s' has no valid value count, size or data page offset", group,
                       f->column);
  if (group_rows >= 0 && m->values != group_rows)
    return thrift_fail(t, "row group %u: column '%s' holds %lld values for %lld rows (a repeated column?)", group,
                       f->column, (long long)m->values, (long long)group_rows);
  /* The chunk starts at its dictionary page when it has one before the data pages. */
  int64_t start = m->has_dictionary && m->dictionary_offset >= MAGIC_BYTES && m->dictionary_offset < m->data_offset
                      ? m->dictionary_offset : m->data_offset;
  uint64_t data_end = f->file_size - TAIL_BYTES;
  if ((uint64_t)start > data_end || (uint64_t)m->compressed > data_end - (uint64_t)start)
    return thrift_fail(t, "row group %u: column '%s' claims bytes %lld..%lld, past the data's end at %llu", group,
                       f->column, (long long)start, (long long)start + (long long)m->compressed,
                       (unsigned long long)data_end);
  if (f->chunk_count % 64 == 0) {
    ParquetChunk *grown = realloc(f->chunks, (f->chunk_count + 64) * sizeof *grown);
    if (!grown) return WK_FAIL(WK_ERR_NOMEM, "out of memory reading '%s' metadata", t->path);
    f->chunks = grown;
  }
  f->chunks[f->chunk_count++] = (ParquetChunk){.offset = (uint64_t)start, .length = (uint64_t)m->compressed,
                                               .values = m->values, .codec = m->codec};
  return WK_OK;
}

static WkStatus read_column_chunk(Footer *f, ColumnMeta *found, bool *has) {
  Thrift *t = &f->t;
  WK_TRY(thrift_enter(t));
  int16_t last = 0, id = 0;
  ThriftType type = THRIFT_STOP;
  WkStatus status;
  bool external = false;
  ColumnMeta m = {0};
  bool has_meta = false;
  while ((status = thrift_field(t, &last, &id, &type)) == WK_OK && type != THRIFT_STOP) {
    if (id == 1) external = true, status = thrift_skip(t, type);
    else if (id == 3 && type == THRIFT_STRUCT) status = read_column_meta(f, &m), has_meta = true;
    else if (id == FIELD_ENCRYPTION || id == FIELD_ENCRYPTED_COLUMN)
      status = WK_FAIL(WK_ERR_UNSUPPORTED, "'%s': encrypted columns cannot be read", t->path);
    else status = thrift_skip(t, type);
    if (status != WK_OK) break;
  }
  thrift_leave(t);
  if (status != WK_OK || !has_meta || !m.is_column) return status;
  if (external)
    return WK_FAIL(WK_ERR_UNSUPPORTED, "'%s' column '%s': its data is in another file (ColumnChunk.file_path); "
                   "only self-contained files are read", t->path, f->column);
  if (*has) return thrift_fail(t, "column '%s' appears twice in one row group", f->column);
  *found = m;
  *has = true;
  return WK_OK;
}

static WkStatus read_row_group(Footer *f, uint32_t group) {
  Thrift *t = &f->t;
  WK_TRY(thrift_enter(t));
  int16_t last = 0, id = 0;
  ThriftType type = THRIFT_STOP;
  WkStatus status;
  ColumnMeta m = {0};
  bool has = false;
  int64_t rows = -1;
  while ((status = thrift_field(t, &last, &id, &type)) == WK_OK && type != THRIFT_STOP) {
    if (id == 1 && type == THRIFT_LIST) {
      ThriftType element;
      uint32_t count;
      status = thrift_list(t, &element, &count);
      if (status == WK_OK && element != THRIFT_STRUCT) status = thrift_fail(t, "columns are not structures");
      for (uint32_t i = 0; i < count && status == WK_OK; i++) status = read_column_chunk(f, &m, &has);
    } else if (id == 3) {
      status = thrift_i64(t, type, &rows);
    } else {
      status = thrift_skip(t, type);
    }
    if (status != WK_OK) break;
  }
  thrift_leave(t);
  if (status != WK_OK) return status;
  /* A column missing from the schema is reported later, with the columns there are. */
  return has ? add_chunk(f, &m, rows, group) : WK_OK;
}

static WkStatus read_row_groups(Footer *f) {
  Thrift *t = &f->t;
  ThriftType element;
  uint32_t count;
  WK_TRY(thrift_list(t, &element, &count));
  if (element != THRIFT_STRUCT) return thrift_fail(t, "row groups are not structures");
  for (uint32_t i = 0; i < count; i++) WK_TRY(read_row_group(f, i));
  return WK_OK;
}

static WkStatus find_column(Footer *f, ParquetMeta *m);

static WkStatus read_file_metadata(Footer *f) {
  Thrift *t = &f->t;
  WK_TRY(thrift_enter(t));
  int16_t last = 0, id = 0;
  ThriftType type = THRIFT_STOP;
  WkStatus status;
  while ((status = thrift_field(t, &last, &id, &type)) == WK_OK && type != THRIFT_STOP) {
    if (id == 2 && type == THRIFT_LIST) {
      status = read_schema(f);
      if (status == WK_OK) status = find_column(f, f->meta);
    }
    else if (id == 3) status = thrift_i64(t, type, &f->rows);
    else if (id == 4 && type == THRIFT_LIST) status = read_row_groups(f);
    else if (id == FIELD_ENCRYPTION)
      status = WK_FAIL(WK_ERR_UNSUPPORTED, "'%s': encrypted Parquet files cannot be read", t->path);
    else status = thrift_skip(t, type);
    if (status != WK_OK) break;
  }
  thrift_leave(t);
  return status;
}

/* ---- the column ------------------------------------------------------------------------------ */

/* The end of the subtree starting at element i (its elements are i .. end-1, depth first). */
static uint32_t subtree_end(const Footer *f, uint32_t i) {
  uint64_t pending = 1;
  while (pending > 0 && i < f->schema_count) {
    pending = pending - 1 + (uint64_t)f->schema[i].children;
    i++;
  }
  return i;
}

size_t parquet_value_bytes(int32_t type) {
  static const size_t BYTES[] = {[PARQUET_BOOLEAN] = 1, [PARQUET_INT32] = 4, [PARQUET_INT64] = 8,
                                 [PARQUET_FLOAT] = 4, [PARQUET_DOUBLE] = 8, [PARQUET_BYTE_ARRAY] = 0};
  return type >= 0 && type <= PARQUET_BYTE_ARRAY ? BYTES[type] : 0;
}

static bool readable_type(int32_t type) { return type >= PARQUET_BOOLEAN && type <= PARQUET_BYTE_ARRAY && type != 3; }

/* The leaf of a struct: its child named "bytes" (Hugging Face's Image / Audio {bytes, path}); NULL: none. */
static const SchemaElement *bytes_child(const Footer *f, uint32_t group) {
  for (uint32_t i = group + 1, k = 0; k < (uint32_t)f->schema[group].children && i < f->schema_count; k++) {
    const SchemaElement *e = &f->schema[i];
    if (e->name_length == 5 && memcmp(e->name, "bytes", 5) == 0 && e->children == 0) return e;
    i = subtree_end(f, i);
  }
  return NULL;
}

static WkStatus find_column(Footer *f, ParquetMeta *m) {
  const char *path = f->t.path;
  if (f->schema_count == 0) return thrift_fail(&f->t, "the file has no schema");
  char names[512] = "";
  size_t used = 0;
  uint32_t shown = 0, top = (uint32_t)f->schema[0].children, at = 0;
  const SchemaElement *column = NULL;
  for (uint32_t i = 1, k = 0; k < top && i < f->schema_count; k++) {
    const SchemaElement *e = &f->schema[i];
    if (e->name_length == f->column_length && memcmp(e->name, f->column, f->column_length) == 0) column = e, at = i;
    if (shown++ < SHOWN_COLUMNS && used < sizeof names)
      used += (size_t)snprintf(names + used, sizeof names - used, "%s%.*s", k ? ", " : "", (int)e->name_length,
                               (const char *)e->name);
    i = subtree_end(f, i);
  }
  if (!column && f->optional) return m->absent = true, WK_OK;
  if (!column)
    return WK_FAIL(WK_ERR_INVALID_ARG, "'%s' has no top-level column '%s' (it has: %s%s); choose one with --field",
                   path, f->column, names, shown > SHOWN_COLUMNS ? ", ..." : "");
  const SchemaElement *leaf = column;
  if (column->children > 0) {
    leaf = column->repetition == REPETITION_REPEATED ? NULL : bytes_child(f, at);
    if (!leaf)
      return WK_FAIL(WK_ERR_UNSUPPORTED, "'%s' column '%s' is a group (a list or map, or a struct without a 'bytes' "
                     "member); only value columns and {bytes, ...} structs (images, audio) are read", path, f->column);
  }
  if (column->repetition == REPETITION_REPEATED || leaf->repetition == REPETITION_REPEATED)
    return WK_FAIL(WK_ERR_UNSUPPORTED, "'%s' column '%s' is repeated (a list of values per row); only one value per "
                   "row can be read", path, f->column);
  if (!readable_type(leaf->type))
    return WK_FAIL(WK_ERR_UNSUPPORTED, "'%s' column '%s': values of Parquet type %d (INT96 or FIXED_LEN_BYTE_ARRAY) "
                   "cannot be read", path, f->column, (int)leaf->type);
  f->path[0] = (const char *)column->name, f->path_length[0] = column->name_length, f->path_count = 1;
  if (leaf != column) f->path[1] = "bytes", f->path_length[1] = 5, f->path_count = 2;
  m->type = leaf->type;
  m->text = leaf == column; /* a struct's bytes are an image's or a sound's */
  m->max_definition =
      (column->repetition == REPETITION_OPTIONAL) + (leaf != column && leaf->repetition == REPETITION_OPTIONAL);
  return WK_OK;
}

/* ---- reading -------------------------------------------------------------------------------- */

static uint32_t le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

WkStatus parquet_meta_read(WkBlob *blob, const char *column, bool optional, const ParquetLimits *limits,
                           ParquetMeta *out) {
  memset(out, 0, sizeof *out);
  out->path = blob->name;
  snprintf(out->column, sizeof out->column, "%s", column);
  uint64_t size = blob->size;
  if (size < MAGIC_BYTES + TAIL_BYTES)
    return WK_FAIL(WK_ERR_FORMAT, "'%s': %llu bytes is too short for a Parquet file (truncated?)", blob->name,
                   (unsigned long long)size);
  uint8_t head[MAGIC_BYTES], tail[TAIL_BYTES];
  WK_TRY(blob->read_at(blob, 0, sizeof head, head));
  WK_TRY(blob->read_at(blob, size - TAIL_BYTES, sizeof tail, tail));
  if (memcmp(tail + 4, ENCRYPTED_MAGIC, MAGIC_BYTES) == 0)
    return WK_FAIL(WK_ERR_UNSUPPORTED, "'%s': an encrypted Parquet file (PARE) cannot be read", blob->name);
  if (memcmp(head, MAGIC, MAGIC_BYTES) != 0 || memcmp(tail + 4, MAGIC, MAGIC_BYTES) != 0)
    return WK_FAIL(WK_ERR_FORMAT, "'%s': no PAR1 magic at %s (not a Parquet file, or truncated)", blob->name,
                   memcmp(head, MAGIC, MAGIC_BYTES) != 0 ? "byte 0" : "its end");
  uint64_t footer = le32(tail);
  if (footer > size - MAGIC_BYTES - TAIL_BYTES)
    return WK_FAIL(WK_ERR_FORMAT, "'%s': footer of %llu bytes claimed at byte %llu does not fit the file (%llu "
                   "bytes; truncated?)", blob->name, (unsigned long long)footer,
                   (unsigned long long)(size - TAIL_BYTES), (unsigned long long)size);
  if (footer > limits->max_footer_bytes)
    return WK_FAIL(WK_ERR_FORMAT, "'%s': footer of %llu bytes is over the limit of %llu", blob->name,
                   (unsigned long long)footer, (unsigned long long)limits->max_footer_bytes);
  uint64_t footer_at = size - TAIL_BYTES - footer;
  uint8_t *bytes = wk_malloc(footer ? (size_t)footer : 1, "Parquet footer");
  if (!bytes) return WK_ERR_NOMEM;
  WkStatus status = blob->read_at(blob, footer_at, (size_t)footer, bytes);
  Footer f = {.column = column, .column_length = strlen(column), .optional = optional, .meta = out,
              .file_size = footer_at + TAIL_BYTES, .rows = -1};
  thrift_init(&f.t, bytes, (size_t)footer, footer_at, blob->name, "footer");
  if (status == WK_OK) status = read_file_metadata(&f);
  if (status == WK_OK && f.schema_count == 0) status = thrift_fail(&f.t, "the file has no schema");
  if (status == WK_OK && f.rows < 0) status = thrift_fail(&f.t, "the file's row count is missing or negative");
  int64_t total = 0;
  bool overflow = false;
  for (uint32_t i = 0; status == WK_OK && i < f.chunk_count; i++)
    overflow = overflow || __builtin_add_overflow(total, f.chunks[i].values, &total);
  if (status == WK_OK && !out->absent && (overflow || total != f.rows))
    status = WK_FAIL(WK_ERR_FORMAT, "'%s': column '%s' holds %lld values in its row groups but the file has %lld "
                     "rows (a row group without the column, or a corrupted footer)", blob->name, column,
                     (long long)total, (long long)f.rows);
  free(f.schema);
  free(bytes);
  if (status != WK_OK) {
    free(f.chunks);
    return status;
  }
  out->chunks = f.chunks;
  out->chunk_count = f.chunk_count;
  out->rows = f.rows;
  return WK_OK;
}

void parquet_meta_free(ParquetMeta *m) {
  free(m->chunks);
  m->chunks = NULL;
  m->chunk_count = 0;
}
