/*
 * runtime/format — the dataset's files: shards (shard.h, FORMAT.md), the index (index.h) and the
 * shard writer (shard_writer.h). Bytes come from runtime/io; what reads them in order is
 * runtime/dataset and runtime/loader; what writes them, runtime/convert. Layer: above core/, io/ and
 * tokenizer/ (the index records a tokenizer's fingerprint; runtime/LAYERS).
 *
 * shard.h — the shard file format (FORMAT.md next to this file is the prose version; keep the two in
 * step): header and block table layout and their validation, block verification and decoding, the
 * document index, a verified view of a shard over a blob, and token widening (shard.c).
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
  WK_SHARD_VERSION = 1,
  WK_SHARD_HEADER_BYTES = 128,
  WK_SHARD_BLOCK_ENTRY_BYTES = 24,
  WK_SHARD_DOC_ENTRY_BYTES = 8,
  WK_SHARD_BLOCK_ALIGN = 64,               /* every block starts at a multiple of this */
  WK_SHARD_MAX_BLOCK_TOKENS = 1 << 24,     /* a decoded block is at most 64 MiB */
  WK_SHARD_DEFAULT_BLOCK_TOKENS = 1 << 16, /* 128 KiB of u16 tokens: the unit of fetch and decode */
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
  uint64_t header_hash;       /* XXH3-64 of header bytes [0, 120): the shard's checksum in the index */
} WkShardHeader;

typedef struct {
  uint64_t offset;        /* absolute file offset of the stored bytes */
  uint32_t stored_bytes;  /* bytes on disk */
  uint32_t codec;         /* WkCodec of this block */
  uint64_t hash;          /* XXH3-64 of the stored bytes */
} WkBlockEntry;

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

/* Verifies the checksum of a block's stored bytes and decodes them into dst (capacity
 * wk_block_token_count * token_bytes). zstd uses a per-thread decompression context. */
WkStatus wk_block_decode(const WkShardHeader *h, const WkBlockEntry *e, uint32_t block, const void *stored,
                         void *dst, const char *name);
WkStatus wk_block_verify(const WkBlockEntry *e, uint32_t block, const void *stored, const char *name);

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
} WkShardView;

WkStatus wk_shard_view_open(WkBlob *blob, const char *name, WkShardView *out);
void wk_shard_view_release(WkShardView *v);
/* Block b's entry and stored bytes: a pointer into the mapping, or read into *copy (malloc'd, the
 * caller frees it). Not verified yet: see wk_block_verify / wk_block_decode. */
WkStatus wk_shard_view_stored(const WkShardView *v, uint32_t b, WkBlockEntry *e, const uint8_t **stored,
                              uint8_t **copy);
WkStatus wk_shard_view_document(const WkShardView *v, uint64_t doc, uint64_t *start, uint64_t *length);

/* u16/u32 stored tokens -> 4- or 8-byte tokens (dst_bytes): the rows' int32 or int64. */
void wk_tokens_widen(const void *src, uint32_t token_bytes, size_t count, void *dst, uint32_t dst_bytes);

#ifdef __cplusplus
}
#endif
#endif /* WK_FORMAT_SHARD_H */
