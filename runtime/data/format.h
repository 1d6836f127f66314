/*
 * format.h — the on-disk format of Wick datasets, shared by the reader, the writer, the converter
 * and the fuzz targets. FORMAT.md next to this file is the prose version; keep the two in step.
 *
 * Owns: shard header and block table layout and their validation, block verification/decoding,
 * the dataset index (index.json) model, the small JSON parser both the index and the .jsonl
 * converter use, the tokenizer interface, and the block cache. It does not own threads, files of a
 * dataset as a whole (dataset.c) or the converter pipeline (convert.c).
 *
 * Internal header: runtime/data/ code and tests include it; Lua never sees it.
 */
#ifndef WK_DATA_FORMAT_H
#define WK_DATA_FORMAT_H

#include "../core/json.h"
#include "data.h"

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
 * bounds, tiling) through a byte source. The dataset adds index agreement, caching and lifetime;
 * the fuzz target drives it over memory. */
typedef struct {
  WkByteSource *src;          /* borrowed */
  const char *name;           /* borrowed; used in messages */
  WkShardHeader h;
  const uint8_t *table;       /* the block table: in the mapping, or table_copy */
  uint8_t *table_copy;
  const uint8_t *doc_index;   /* in the mapping, or NULL (entries read on demand) */
} WkShardView;

WkStatus wk_shard_view_open(WkByteSource *src, const char *name, WkShardView *out);
void wk_shard_view_release(WkShardView *v);
/* Block b's entry and stored bytes: a pointer into the mapping, or read into *copy (malloc'd, the
 * caller frees it). Not verified yet: see wk_block_verify / wk_block_decode. */
WkStatus wk_shard_view_stored(const WkShardView *v, uint32_t b, WkBlockEntry *e, const uint8_t **stored,
                              uint8_t **copy);
WkStatus wk_shard_view_document(const WkShardView *v, uint64_t doc, uint64_t *start, uint64_t *length);

/* u16/u32 stored tokens -> 4- or 8-byte tokens (dst_bytes): the rows' int32 or int64. */
void wk_tokens_widen(const void *src, uint32_t token_bytes, size_t count, void *dst, uint32_t dst_bytes);

uint64_t wk_hash64(const void *data, size_t length); /* XXH3-64, seed 0 */

/* ---- shard writer ------------------------------------------------------------------------------- */

/* Writes one shard file from a token stream (stored width, little-endian) and its document starts.
 * The file appears atomically (temp name + rename). Deterministic: same inputs -> same bytes. */
typedef struct {
  uint32_t token_bytes;
  uint32_t vocab_size;
  uint32_t eos;
  uint32_t block_tokens;
  WkCodec codec;
  int level;  /* zstd level */
} WkShardWriteOptions;

typedef struct {
  uint64_t bytes;        /* file size */
  uint64_t header_hash;  /* the checksum the index records */
} WkShardWritten;

WkStatus wk_shard_write(const char *path, const WkShardWriteOptions *opt, const void *tokens, uint64_t token_count,
                        const uint64_t *doc_starts, uint64_t doc_count, WkShardWritten *out);

/* The same in two steps, so several threads can compress one shard: pieces cover consecutive block
 * ranges; assembling them in order gives the same bytes as wk_shard_write. */
typedef struct {
  const uint8_t *raw;  /* stored raw: points into the caller's tokens; else NULL */
  uint64_t at;         /* zstd: offset of the frame in the piece's buffer */
  uint32_t bytes;      /* stored bytes */
  uint32_t codec;
  uint64_t hash;
} WkPieceBlock;

typedef struct {
  uint32_t first_block, block_count;
  uint8_t *buffer;     /* the zstd frames */
  size_t buffer_bytes;
  WkPieceBlock *blocks;
} WkShardPiece;

uint32_t wk_shard_block_count(const WkShardWriteOptions *opt, uint64_t token_count);
WkStatus wk_shard_compress(const WkShardWriteOptions *opt, const void *tokens, uint64_t token_count,
                           uint32_t first_block, uint32_t block_count, WkShardPiece *piece);
void wk_shard_piece_free(WkShardPiece *piece);
WkStatus wk_shard_assemble(const char *path, const WkShardWriteOptions *opt, uint64_t token_count,
                           const uint64_t *doc_starts, uint64_t doc_count, const WkShardPiece *pieces,
                           uint32_t piece_count, WkShardWritten *out);

/* ---- dataset index (index.json) ------------------------------------------------------------------ */

enum { WK_INDEX_VERSION = 1 };

typedef struct {
  char *name;
  uint64_t tokens, documents, bytes;
  uint64_t checksum;  /* header_hash of the shard */
} WkIndexShard;

typedef struct {
  uint32_t version;
  char *tokenizer;
  uint32_t vocab_size;
  uint32_t eos;
  uint32_t token_bytes;
  uint64_t tokens, documents;
  uint32_t shard_count;
  WkIndexShard *shards;
} WkIndex;

/* Parses and validates index text (names safe, counts consistent); name is the file for messages. */
WkStatus wk_index_parse(const char *text, size_t length, const char *name, WkIndex *out);
void wk_index_free(WkIndex *index);
/* Serializes deterministically (fixed key order, no timestamps); *out is malloc'd. extra is a
 * JSON object body (may be NULL) describing how it was made. */
WkStatus wk_index_format(const WkIndex *index, const char *extra, char **out, size_t *length);
/* A shard name is a plain relative path: no leading '/', no '..' or '.' components, no '\\' or
 * control characters, not empty. */
bool wk_index_name_is_safe(const char *name);


/* ---- tokenizers ------------------------------------------------------------------------------------ */

/* A growable array of tokens (realloc). */
typedef struct {
  uint32_t *data;
  size_t length, capacity;
} WkTokenVec;

WkStatus wk_token_vec_reserve(WkTokenVec *v, size_t extra);

typedef struct WkTokenizer WkTokenizer;
struct WkTokenizer {
  const char *name;
  uint32_t vocab_size;
  uint32_t eos;
  /* Appends the tokens of UTF-8 text; NULL for tokenizers that only describe pre-tokenized data. */
  WkStatus (*encode)(const WkTokenizer *self, const uint8_t *text, size_t length, WkTokenVec *out);
  /* Appends the bytes a token stands for to out (capacity >= 64); returns how many. */
  size_t (*decode)(const WkTokenizer *self, uint32_t token, uint8_t *out);
};

/* "bytes" (vocab 257, EOS 256) or "gpt2" (pre-tokenized only: vocab 50257, EOS 50256). */
const WkTokenizer *wk_tokenizer_find(const char *name);

/* ---- block cache ------------------------------------------------------------------------------------ */

/* Decoded blocks keyed by (shard, block), least recently used evicted first, never holding more than
 * its budget. Entries are pinned while a reader copies from them. Thread-safe, single flight: one
 * reader decodes a missing block while the others wanting it wait. */
typedef struct WkBlockCache WkBlockCache;
typedef struct WkCacheEntry WkCacheEntry;

WkBlockCache *wk_cache_new(uint64_t budget_bytes);
void wk_cache_free(WkBlockCache *cache);
void wk_cache_set_budget(WkBlockCache *cache, uint64_t budget_bytes);
/* A hit returns the pinned entry, after waiting while another reader decodes it. A miss reserves
 * `bytes` of the budget and returns a pinned entry with *fill set: the caller decodes into
 * wk_cache_buffer(entry) and then calls wk_cache_fill, or wk_cache_abandon on failure. NULL when the
 * budget cannot hold the block even after evicting unpinned entries: decode privately. */
WkCacheEntry *wk_cache_get(WkBlockCache *cache, uint64_t key, uint64_t bytes, bool *fill);
void *wk_cache_buffer(WkCacheEntry *entry, const char *what); /* the entry's bytes (allocated once) */
void wk_cache_fill(WkBlockCache *cache, WkCacheEntry *entry);     /* publishes; the entry stays pinned */
void wk_cache_abandon(WkBlockCache *cache, WkCacheEntry *entry);  /* drops the reservation and the pin */
const void *wk_cache_data(const WkCacheEntry *entry);
void wk_cache_release(WkBlockCache *cache, WkCacheEntry *entry);
void wk_cache_stats(WkBlockCache *cache, WkDatasetStats *out);

#ifdef __cplusplus
}
#endif
#endif /* WK_DATA_FORMAT_H */
