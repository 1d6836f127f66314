/*
 * runtime/convert/parquet/ — a focused Parquet reader: the values of one top-level column, row by row,
 * for the converter (FineWeb and every Hugging Face dataset exported to Parquet): strings and binary
 * (BYTE_ARRAY), INT32, INT64, FLOAT, DOUBLE, BOOLEAN, and the bytes of a struct with a "bytes" child
 * (Hugging Face's Image and Audio features: {bytes, path}).
 * No Debian package provides Parquet for C; this reads what text corpora use and refuses the rest
 * with the file, the column and the feature it lacks.
 *
 *   thrift.c    the Thrift compact protocol: varints, field headers, strings, lists, skipping
 *   metadata.c  the footer (PAR1 magic, FileMetaData): the schema, the row groups, the chosen column
 *   page.c      page headers (data page v1 and v2, dictionary pages)
 *   levels.c    the RLE / bit-packed hybrid of definition levels and dictionary indices
 *   codec.c     page decompression: uncompressed, snappy, gzip (zlib), zstd
 *   column.c    one column chunk: its pages in order, dictionary and PLAIN values, nulls
 *
 * Supported: data pages v1 and v2, PLAIN and dictionary (PLAIN_DICTIONARY / RLE_DICTIONARY) values,
 * REQUIRED or OPTIONAL columns (a null row is counted, not a document), any number of row groups.
 * Refused: repeated columns (lists), other nested columns, INT96 and FIXED_LEN_BYTE_ARRAY, other
 * encodings (DELTA_*), other codecs (LZO, brotli, LZ4), column data in another file, encrypted files.
 *
 * Input is untrusted (a file from anywhere, later a URL): every length, count and offset is checked
 * against the bytes it claims before it is used, allocations are bounded by ParquetLimits, and long
 * runs of nulls are counted a run at a time. Errors name the file and the byte offset.
 */
#ifndef WK_CONVERT_PARQUET_H
#define WK_CONVERT_PARQUET_H

#include "../../io/blob.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Thrift compact protocol (thrift.c) ------------------------------------------------------- */

typedef enum {
  THRIFT_STOP = 0, THRIFT_TRUE = 1, THRIFT_FALSE = 2, THRIFT_BYTE = 3, THRIFT_I16 = 4, THRIFT_I32 = 5,
  THRIFT_I64 = 6, THRIFT_DOUBLE = 7, THRIFT_BINARY = 8, THRIFT_LIST = 9, THRIFT_SET = 10, THRIFT_MAP = 11,
  THRIFT_STRUCT = 12
} ThriftType;

/* A cursor over Thrift bytes that lie at file offset `base`; errors name path and offset. */
typedef struct {
  const uint8_t *start, *p, *end;
  uint64_t base;
  const char *path;
  const char *what;  /* "footer", "page header" */
  int depth;         /* nesting of structs and lists being skipped or read */
} Thrift;

void thrift_init(Thrift *t, const uint8_t *data, size_t length, uint64_t base, const char *path, const char *what);
uint64_t thrift_offset(const Thrift *t);  /* the file offset of the cursor */
WkStatus thrift_fail(const Thrift *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The next field of the current struct: *type THRIFT_STOP at its end. *last is the previous field id
 * of this struct (0 at its start), updated. Booleans come as THRIFT_TRUE / THRIFT_FALSE. */
WkStatus thrift_field(Thrift *t, int16_t *last, int16_t *id, ThriftType *type);
WkStatus thrift_i32(Thrift *t, ThriftType type, int32_t *out);  /* an i8, i16 or i32 field */
WkStatus thrift_i64(Thrift *t, ThriftType type, int64_t *out);  /* any integer field */
WkStatus thrift_binary(Thrift *t, const uint8_t **bytes, size_t *length);
/* A list or set header: element type and count (checked against the bytes left: each element takes
 * at least one byte). */
WkStatus thrift_list(Thrift *t, ThriftType *element, uint32_t *count);
WkStatus thrift_skip(Thrift *t, ThriftType type);
/* Struct nesting: every struct read calls enter/leave, bounded (no recursion bombs). */
WkStatus thrift_enter(Thrift *t);
void thrift_leave(Thrift *t);

/* ---- bounds ------------------------------------------------------------------------------------ */

typedef struct {
  uint64_t max_footer_bytes;  /* a longer footer is refused */
  uint64_t max_page_bytes;    /* a page (compressed or not) claiming more is refused */
} ParquetLimits;

/* ---- metadata (metadata.c) -------------------------------------------------------------------- */

enum {
  PARQUET_BOOLEAN = 0, PARQUET_INT32 = 1, PARQUET_INT64 = 2, PARQUET_FLOAT = 4, PARQUET_DOUBLE = 5,
  PARQUET_BYTE_ARRAY = 6,
  PARQUET_UNCOMPRESSED = 0, PARQUET_SNAPPY = 1, PARQUET_GZIP = 2, PARQUET_ZSTD = 6,
};

/* Where the chosen column's data of one row group lies. */
typedef struct {
  uint64_t offset, length;  /* its pages: from the dictionary page (or first data page), compressed size */
  int64_t values;           /* rows (one value or null each: the column is not repeated) */
  int32_t codec;
} ParquetChunk;

typedef struct {
  const char *path;
  char column[128];   /* the column's name, for messages */
  int32_t type;       /* the values' physical type (PARQUET_BOOLEAN .. PARQUET_BYTE_ARRAY) */
  bool text;          /* BYTE_ARRAY of a top-level column (a string), not a struct's bytes (an image's) */
  bool absent;        /* an optional column the file does not have: no chunks */
  int max_definition; /* 0 REQUIRED, 1 OPTIONAL, 2 an OPTIONAL child of an OPTIONAL struct */
  ParquetChunk *chunks;
  uint32_t chunk_count;
  int64_t rows;
} ParquetMeta;

/* Reads and checks the footer of blob and finds the top-level column `column`: a value column, or a struct's
 * "bytes" child. Missing, it is an error naming the columns there are, unless optional (then out->absent). */
WkStatus parquet_meta_read(WkBlob *blob, const char *column, bool optional, const ParquetLimits *limits,
                           ParquetMeta *out);
/* The bytes of one value of the column's type (BOOLEAN: 1 byte, 0 or 1; INT32, FLOAT 4; INT64, DOUBLE 8); 0 for
 * BYTE_ARRAY (its length is its own). */
size_t parquet_value_bytes(int32_t type);
void parquet_meta_free(ParquetMeta *m);

/* ---- pages (page.c) --------------------------------------------------------------------------- */

enum { PAGE_DATA = 0, PAGE_INDEX = 1, PAGE_DICTIONARY = 2, PAGE_DATA_V2 = 3 };
enum { ENCODING_PLAIN = 0, ENCODING_PLAIN_DICTIONARY = 2, ENCODING_RLE = 3, ENCODING_BIT_PACKED = 4,
       ENCODING_RLE_DICTIONARY = 8 };

typedef struct {
  int32_t type;
  int32_t uncompressed_bytes, compressed_bytes;
  int32_t values;            /* data and dictionary pages */
  int32_t encoding;          /* of the values */
  int32_t definition_encoding, repetition_encoding;  /* v1 */
  int32_t definition_bytes, repetition_bytes;         /* v2 */
  bool compressed;           /* v2: the values section is compressed (default) */
  size_t header_bytes;       /* the header's own length */
} PageHeader;

/* Parses the page header at data[0..length) (file offset base). */
WkStatus parquet_page_header(const uint8_t *data, size_t length, uint64_t base, const char *path, PageHeader *out);

/* ---- levels and indices (levels.c) ------------------------------------------------------------ */

/* The RLE / bit-packed hybrid: runs of one repeated value, or groups of 8 values bit-packed. */
typedef struct {
  const uint8_t *p, *end;
  int bit_width;        /* 0..32 */
  uint64_t repeat;      /* values left in the current repeated run */
  uint32_t value;       /* its value */
  uint64_t packed;      /* values left in the current bit-packed run */
  uint64_t bit;         /* the next packed value's bit position from p */
} Rle;

WkStatus rle_init(Rle *r, const uint8_t *data, size_t length, int bit_width);
/* The next run: *count (>= 1, at most max) values equal to *value; a bit-packed run gives them one
 * at a time. WK_ERR_FORMAT when the data ends first (the caller adds file and offset). */
WkStatus rle_run(Rle *r, uint64_t max, uint32_t *value, uint64_t *count);

/* ---- decompression (codec.c) ------------------------------------------------------------------- */

/* Decompresses src into exactly dst_length bytes of dst (a page's own size claim); any other size is
 * WK_ERR_FORMAT. what names the page for messages. */
WkStatus parquet_decompress(int32_t codec, const uint8_t *src, size_t src_length, uint8_t *dst, size_t dst_length,
                            const char *what);
const char *parquet_codec_name(int32_t codec);

/* ---- a column chunk (column.c) ---------------------------------------------------------------- */

/* Called once per row with its value (little-endian bytes of parquet_value_bytes(type), or a BYTE_ARRAY's);
 * non-OK stops the walk. */
typedef WkStatus (*ParquetValueFn)(void *context, const uint8_t *bytes, size_t length);
/* Called for a run of `count` null rows at once. */
typedef WkStatus (*ParquetNullFn)(void *context, uint64_t count);

/* Walks the pages of chunk, whose bytes are data[0..chunk->length) (already read from the file). */
WkStatus parquet_chunk_read(const ParquetMeta *meta, const ParquetChunk *chunk, const uint8_t *data,
                            const ParquetLimits *limits, ParquetValueFn value, ParquetNullFn nulls, void *context);

#ifdef __cplusplus
}
#endif
#endif /* WK_CONVERT_PARQUET_H */
