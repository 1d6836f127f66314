/*
 * runtime/format — the dataset's files: shards (shard.h, FORMAT.md), the index (index.h) and the
 * shard writer (shard_writer.h). Bytes come from runtime/io; what reads them in order is
 * runtime/dataset and runtime/loader; what writes them, runtime/convert. Layer: above core/, io/ and
 * tokenizer/ (the index records a tokenizer's fingerprint; runtime/LAYERS).
 *
 * shard.h — the shard file format (FORMAT.md next to this file is the prose version; keep the two in
 * step): header and block table layout and their validation, block verification and decoding, the
 * document index, the column table of version 2 and its columns' block tables, a verified view of a
 * shard over a blob, and token widening (shard.c).
 *
 * Internal header: runtime/ code above format/ and tests include it; Lua never sees it.
 */
#ifndef WK_FORMAT_SHARD_H
#define WK_FORMAT_SHARD_H

#include "../io/blob.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- shard layout (little-endian; see FORMAT.md) --------------------------------------------- */

#define WK_SHARD_MAGIC "WICKSHRD"
enum {
  WK_SHARD_VERSION = 2,                    /* the newest this reader knows; 1 is a shard of tokens only */
  WK_SHARD_HEADER_BYTES = 128,
  WK_SHARD_COLUMN_ENTRY_BYTES = 128,       /* one entry of the column table (version 2) */
  WK_SHARD_BLOCK_ENTRY_BYTES = 24,
  WK_SHARD_DOC_ENTRY_BYTES = 8,
  WK_SHARD_BLOCK_ALIGN = 64,               /* every block starts at a multiple of this */
  WK_SHARD_MAX_BLOCK_TOKENS = 1 << 24,     /* a decoded block is at most 64 MiB */
  WK_SHARD_DEFAULT_BLOCK_TOKENS = 1 << 16, /* 128 KiB of u16 tokens: the unit of fetch and decode */
  WK_SHARD_MAX_BLOCK_BYTES = 1 << 26,      /* a decoded block of a fixed-width column, at most */
  WK_SHARD_COLUMN_BLOCK_BYTES = 128 << 10, /* what the writer aims a record column's raw block at */
};

typedef enum { WK_CODEC_RAW = 0, WK_CODEC_ZSTD = 1 } WkCodec;

/* The decoded 128-byte header. */
typedef struct {
  uint32_t version;
  uint32_t flags;          /* none defined yet: a set bit means "needs a newer reader" */
  uint32_t token_bytes;    /* 2 or 4 */
  uint32_t codec;          /* the codec the writer asked for; blocks may fall back to raw */
  uint32_t block_tokens;   /* tokens per block; the last block may hold fewer */
  uint32_t block_count;
  uint32_t vocab_size;
  uint32_t eos;
  uint64_t tokens;         /* tokens of the stream, EOS separators included */
  uint64_t documents;
  uint64_t file_bytes;
  uint64_t payload_offset;
  uint64_t block_table_offset;
  uint64_t doc_index_offset;
  uint64_t block_table_hash;  /* XXH3-64 of the block table */
  uint64_t doc_index_hash;    /* XXH3-64 of the document index */
  uint32_t column_count;      /* version 2: columns besides the tokens (0 in version 1) */
  uint64_t column_table_offset; /* = doc_index_offset + 8 x documents (not stored) */
  uint64_t column_table_hash; /* XXH3-64 of the column table */
  uint64_t header_hash;       /* XXH3-64 of header bytes [0, 120): the shard's checksum in the index */
} WkShardHeader;

typedef struct {
  uint64_t offset;        /* absolute file offset of the stored bytes */
  uint32_t stored_bytes;  /* bytes on disk */
  uint32_t codec;         /* WkCodec of this block */
  uint64_t hash;          /* XXH3-64 of the stored bytes */
} WkBlockEntry;

/* What a block table describes: rows of element_bytes each, rows_per_block to a block (the last may
 * hold fewer); element_bytes 0 is one blob per block (a BYTES column), its size the stored bytes
 * (raw) or the zstd frame's content size. The tokens are one such layout (wk_shard_token_layout). */
typedef struct {
  const char *column;       /* for messages: NULL for the tokens, else the column's name */
  uint64_t rows;
  uint64_t element_bytes;
  uint32_t rows_per_block;
  uint32_t block_count;
  uint32_t align;           /* a raw block's offset is a multiple of this */
} WkBlockLayout;

/* One entry of a version 2 shard's column table, decoded and checked against the header. */
typedef struct {
  WkColumnInfo info;
  WkBlockLayout layout;         /* layout.column points at info.name */
  uint64_t block_table_offset;  /* its block table (24-byte entries) */
  uint64_t block_table_hash;
} WkColumnEntry;

/* Encodes/decodes the header. parse validates everything that does not need the rest of the file
 * (magic, version, sizes, offsets against file_size, header checksum); name is for messages. */
void wk_shard_header_encode(const WkShardHeader *h, uint8_t out[WK_SHARD_HEADER_BYTES]);
WkStatus wk_shard_header_parse(const uint8_t *bytes, size_t length, uint64_t file_size, const char *name,
                               WkShardHeader *out);

void wk_block_entry_encode(const WkBlockEntry *e, uint8_t out[WK_SHARD_BLOCK_ENTRY_BYTES]);
/* Decodes entry i of a block table and checks it against the header (bounds, codec, sizes). */
WkStatus wk_block_entry_parse(const uint8_t *table, const WkShardHeader *h, uint32_t block, const char *name,
                              WkBlockEntry *out);
/* Tokens held by block i (block_tokens except for the last). */
uint32_t wk_block_token_count(const WkShardHeader *h, uint32_t block);
/* The same for any layout: entry `block` of its table checked against the header's payload, rows of a block. */
WkBlockLayout wk_shard_token_layout(const WkShardHeader *h);
WkStatus wk_layout_entry_parse(const uint8_t *table, const WkShardHeader *h, const WkBlockLayout *l, uint32_t block,
                               const char *name, WkBlockEntry *out);
uint64_t wk_layout_block_rows(const WkBlockLayout *l, uint32_t block);
/* Bytes block `block` decodes to: rows x element_bytes, or a blob's size (the stored bytes of a raw
 * blob; a zstd blob's frame content size, read from the stored bytes and checked). */
WkStatus wk_layout_block_bytes(const WkBlockLayout *l, const WkBlockEntry *e, uint32_t block, const void *stored,
                               const char *name, uint64_t *bytes);
/* Verifies the stored bytes' checksum (messages name the column, if any). */
WkStatus wk_layout_block_verify(const WkBlockLayout *l, const WkBlockEntry *e, uint32_t block, const void *stored,
                                const char *name);
/* Verifies and decodes block `block` into dst (its wk_layout_block_bytes). */
WkStatus wk_layout_block_decode(const WkBlockLayout *l, const WkBlockEntry *e, uint32_t block, const void *stored,
                                void *dst, const char *name);

/* Verifies the checksum of a block's stored bytes and decodes them into dst (capacity
 * wk_block_token_count * token_bytes). zstd uses a per-thread decompression context. */
WkStatus wk_block_decode(const WkShardHeader *h, const WkBlockEntry *e, uint32_t block, const void *stored,
                         void *dst, const char *name);
WkStatus wk_block_verify(const WkBlockEntry *e, uint32_t block, const void *stored, const char *name);

/* Column kinds and the dtypes a column may hold: names as index.json spells them. */
const char *wk_column_dtype_name(uint32_t dtype);  /* "f32", "i32", "i64", "u8", "u16"; NULL for others */
bool wk_column_dtype_parse(const char *name, uint32_t *dtype);
bool wk_column_kind_parse(const char *name, uint32_t *kind);
bool wk_column_name_is_valid(const char *name, size_t length);  /* [A-Za-z_][A-Za-z0-9_]*, < 48 bytes */
/* Checks an extra column's kind, dtype, ndim, shape and name (where: the file, for the message) and sets
 * its element_bytes. TOKENS is not an extra column. */
WkStatus wk_column_info_check(WkColumnInfo *info, const char *where);
/* The block layout of a column of a shard (tokens and documents from its header; rows_per_block:
 * what the writer chooses, the reader checks the table against). */
WkBlockLayout wk_column_layout(const WkColumnInfo *info, const WkShardHeader *h);
void wk_column_entry_encode(const WkColumnEntry *c, uint8_t out[WK_SHARD_COLUMN_ENTRY_BYTES]);
/* Decodes entry c of a column table and checks it against the header: name, kind, dtype, shape, rows
 * per block, block count, and that its block table starts at `expected_table` (the tables tile the end). */
WkStatus wk_column_entry_parse(const uint8_t *table, const WkShardHeader *h, uint32_t c, uint64_t expected_table,
                               const char *name, WkColumnEntry *out);

/* Document doc's span from its document-index entry (8 bytes) and the next one (NULL for the last
 * document), validated against the header: starts strictly increase, the first is 0, all < tokens. */
WkStatus wk_doc_index_span(const WkShardHeader *h, const uint8_t *entry, const uint8_t *next_entry, uint64_t doc,
                           const char *name, uint64_t *start, uint64_t *length);

/* A shard whose header, block table and document index have been read and verified (checksums,
 * bounds, tiling) through a blob. The dataset adds index agreement, caching and lifetime;
 * the fuzz target drives it over memory. */
typedef struct {
  WkBlob *blob;          /* borrowed */
  const char *name;           /* borrowed; used in messages */
  WkShardHeader h;
  const uint8_t *table;       /* the block table: in the mapping, or table_copy */
  uint8_t *table_copy;
  const uint8_t *doc_index;   /* in the mapping, or NULL (entries read on demand) */
  uint32_t column_count;      /* version 2: the column table, decoded, and each column's block table */
  WkColumnEntry *columns;
  const uint8_t **column_tables; /* in the mapping, or into tables_copy */
  uint8_t *tables_copy;
} WkShardView;

WkStatus wk_shard_view_open(WkBlob *blob, const char *name, WkShardView *out);
void wk_shard_view_release(WkShardView *v);
/* Block b's entry and stored bytes: a pointer into the mapping, or read into *copy (malloc'd, the
 * caller frees it). Not verified yet: see wk_block_verify / wk_block_decode. */
WkStatus wk_shard_view_stored(const WkShardView *v, uint32_t b, WkBlockEntry *e, const uint8_t **stored,
                              uint8_t **copy);
/* The same for block b of column c (0-based among the shard's extra columns). */
WkStatus wk_shard_view_column_stored(const WkShardView *v, uint32_t c, uint32_t b, WkBlockEntry *e,
                                     const uint8_t **stored, uint8_t **copy);
WkStatus wk_shard_view_document(const WkShardView *v, uint64_t doc, uint64_t *start, uint64_t *length);

/* u16/u32 stored tokens -> 4- or 8-byte tokens (dst_bytes): the rows' int32 or int64. */
void wk_tokens_widen(const void *src, uint32_t token_bytes, size_t count, void *dst, uint32_t dst_bytes);

#ifdef __cplusplus
}
#endif
#endif /* WK_FORMAT_SHARD_H */
