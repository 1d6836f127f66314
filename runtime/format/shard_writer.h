/*
 * shard_writer.h — writes shard files from token streams: in one call, or compressed in pieces by several
 * threads and assembled (shard_writer.c); with columns besides the tokens, format version 2. Same inputs,
 * same bytes.
 *
 * Internal header: the converter (runtime/convert/) and tests include it; Lua never sees it.
 */
#ifndef WK_FORMAT_SHARD_WRITER_H
#define WK_FORMAT_SHARD_WRITER_H

#include "shard.h"

#ifdef __cplusplus
extern "C" {
#endif

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

/* ---- columns (format version 2) ----------------------------------------------------------------- */

/* One column's values for a whole shard, besides the token stream (format version 2). */
typedef struct {
  WkColumnInfo info;          /* name, kind, dtype, ndim, shape; element_bytes is checked when not 0 */
  const void *data;           /* TOKEN_U8: token_count bytes; I64/F32/TENSOR: doc_count x element_bytes; BYTES: the
                                 blobs concatenated */
  uint64_t data_bytes;
  const uint64_t *blob_ends;  /* BYTES: doc_count end offsets into data (blob d = [ends[d-1] or 0, ends[d])); else
                                 NULL */
} WkShardColumn;

/* wk_shard_write / wk_shard_assemble with columns (column_count 0: exactly the version 1 bytes those
 * write). The assembling thread compresses the columns' blocks. Each column is checked first (name,
 * kind, dtype, shape, its length against the tokens or documents), failing with WK_ERR_INVALID_ARG. */
WkStatus wk_shard_write_columns(const char *path, const WkShardWriteOptions *opt, const void *tokens,
                                uint64_t token_count, const uint64_t *doc_starts, uint64_t doc_count,
                                const WkShardColumn *columns, uint32_t column_count, WkShardWritten *out);
WkStatus wk_shard_assemble_columns(const char *path, const WkShardWriteOptions *opt, uint64_t token_count,
                                   const uint64_t *doc_starts, uint64_t doc_count, const WkShardPiece *pieces,
                                   uint32_t piece_count, const WkShardColumn *columns, uint32_t column_count,
                                   WkShardWritten *out);

#ifdef __cplusplus
}
#endif
#endif /* WK_FORMAT_SHARD_WRITER_H */
