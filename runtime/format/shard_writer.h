/*
 * shard_writer.h — writes shard files from token streams: in one call, or compressed in pieces by several
 * threads and assembled (shard_writer.c). Same inputs, same bytes.
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

#ifdef __cplusplus
}
#endif
#endif /* WK_FORMAT_SHARD_WRITER_H */
