/*
 * shard_writer.c — one shard file from a token stream: blocks (zstd or raw, each checksummed),
 * then the block table and the document index, then the header that points at them.
 *
 * Two steps so the converter can spread one shard over its threads: wk_shard_compress turns a range
 * of blocks into a piece (any thread), wk_shard_assemble writes the pieces in order. A block's bytes
 * depend only on its tokens, so the file is the same however the blocks were split into pieces.
 *
 * The file is written under a temporary name and renamed into place, so a reader never sees half
 * a shard. Output depends only on the inputs (no timestamps, zeroed padding, single-threaded zstd
 * per block), which is what makes the converter's output byte-identical across thread counts.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>  /* unlink */
#include <zstd.h>    /* ZSTD_compressCCtx */

#include "shard_writer.h"

typedef struct {
  FILE *f;
  const char *path;
  uint64_t offset;
} Out;

static WkStatus out_write(Out *o, const void *data, size_t length) {
  if (length && fwrite(data, 1, length, o->f) != length) return WK_FAIL_ERRNO("write", o->path);
  o->offset += length;
  return WK_OK;
}

static WkStatus out_pad(Out *o, uint64_t align) {
  static const uint8_t zeros[WK_SHARD_BLOCK_ALIGN];
  size_t pad = (size_t)((align - o->offset % align) % align);
  return out_write(o, zeros, pad);
}

static void put64le(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* ---- compressing pieces (any thread) --------------------------------------------------------- */

WkStatus wk_shard_compress(const WkShardWriteOptions *opt, const void *tokens, uint64_t token_count,
                           uint32_t first_block, uint32_t block_count, WkShardPiece *piece) {
  memset(piece, 0, sizeof *piece);
  piece->first_block = first_block;
  piece->block_count = block_count;
  piece->blocks = wk_calloc(block_count, sizeof *piece->blocks, "piece blocks");
  if (!piece->blocks) return WK_ERR_NOMEM;
  WkShardHeader h = {.block_tokens = opt->block_tokens, .tokens = token_count};
  size_t block_bytes = (size_t)opt->block_tokens * opt->token_bytes;
  ZSTD_CCtx *cctx = NULL;
  size_t capacity = 0;
  WkStatus status = WK_OK;
  if (opt->codec == WK_CODEC_ZSTD) {
    cctx = ZSTD_createCCtx();
    if (!cctx) status = WK_FAIL(WK_ERR_NOMEM, "cannot create a zstd context");
  }
  for (uint32_t k = 0; k < block_count && status == WK_OK; k++) {
    uint32_t b = first_block + k;
    size_t n = (size_t)wk_block_token_count(&h, b) * opt->token_bytes;
    const uint8_t *raw = (const uint8_t *)tokens + (size_t)b * block_bytes;
    WkPieceBlock *pb = &piece->blocks[k];
    *pb = (WkPieceBlock){.codec = WK_CODEC_RAW, .bytes = (uint32_t)n, .raw = raw};
    if (opt->codec == WK_CODEC_ZSTD) {
      size_t bound = ZSTD_compressBound(n);
      if (piece->buffer_bytes + bound > capacity) {
        size_t cap = capacity ? capacity : bound * 4;
        while (cap < piece->buffer_bytes + bound) cap *= 2;
        uint8_t *grown = realloc(piece->buffer, cap);
        if (!grown) {
          status = WK_FAIL(WK_ERR_NOMEM, "out of memory compressing block %u", b);
          break;
        }
        piece->buffer = grown;
        capacity = cap;
      }
      size_t c = ZSTD_compressCCtx(cctx, piece->buffer + piece->buffer_bytes, bound, raw, n, opt->level);
      if (ZSTD_isError(c)) {
        status = WK_FAIL(WK_ERR_INTERNAL, "block %u: zstd: %s", b, ZSTD_getErrorName(c));
        break;
      }
      if (c < n) { /* incompressible blocks stay raw */
        pb->codec = WK_CODEC_ZSTD;
        pb->bytes = (uint32_t)c;
        pb->raw = NULL;
        pb->at = piece->buffer_bytes;
        piece->buffer_bytes += c;
      }
    }
  }
  for (uint32_t k = 0; k < block_count && status == WK_OK; k++) {
    WkPieceBlock *pb = &piece->blocks[k];
    pb->hash = wk_hash64(pb->raw ? pb->raw : piece->buffer + pb->at, pb->bytes);
  }
  ZSTD_freeCCtx(cctx);
  if (status != WK_OK) wk_shard_piece_free(piece);
  return status;
}

void wk_shard_piece_free(WkShardPiece *piece) {
  free(piece->buffer);
  free(piece->blocks);
  memset(piece, 0, sizeof *piece);
}

/* ---- assembling the file ------------------------------------------------------------------------ */

static WkStatus write_body(Out *o, const WkShardWriteOptions *opt, const WkShardPiece *pieces, uint32_t piece_count,
                           const uint64_t *doc_starts, uint64_t doc_count, WkShardHeader *h) {
  uint8_t placeholder[WK_SHARD_HEADER_BYTES] = {0};
  WK_TRY(out_write(o, placeholder, sizeof placeholder));
  h->payload_offset = o->offset;
  size_t table_bytes = (size_t)h->block_count * WK_SHARD_BLOCK_ENTRY_BYTES;
  uint8_t *table = wk_malloc(table_bytes, "block table");
  if (!table) return WK_ERR_NOMEM;
  WkStatus status = WK_OK;
  uint32_t next = 0;
  for (uint32_t p = 0; p < piece_count && status == WK_OK; p++) {
    const WkShardPiece *piece = &pieces[p];
    if (piece->first_block != next || piece->block_count > h->block_count - next) {
      status = WK_FAIL(WK_ERR_INTERNAL, "shard '%s': pieces do not cover the blocks in order", o->path);
      break;
    }
    for (uint32_t k = 0; k < piece->block_count && status == WK_OK; k++) {
      const WkPieceBlock *pb = &piece->blocks[k];
      if ((status = out_pad(o, WK_SHARD_BLOCK_ALIGN)) != WK_OK) break;
      WkBlockEntry e = {.offset = o->offset, .stored_bytes = pb->bytes, .codec = pb->codec, .hash = pb->hash};
      wk_block_entry_encode(&e, table + (size_t)(next + k) * WK_SHARD_BLOCK_ENTRY_BYTES);
      status = out_write(o, pb->raw ? pb->raw : piece->buffer + pb->at, pb->bytes);
    }
    next += piece->block_count;
  }
  if (status == WK_OK && next != h->block_count)
    status = WK_FAIL(WK_ERR_INTERNAL, "shard '%s': pieces hold %u of %u blocks", o->path, next, h->block_count);
  if (status == WK_OK) status = out_pad(o, 8);
  if (status == WK_OK) {
    h->block_table_offset = o->offset;
    h->block_table_hash = wk_hash64(table, table_bytes);
    status = out_write(o, table, table_bytes);
  }
  free(table);
  if (status != WK_OK) return status;
  /* The document index: little-endian u64 start of each document in the stream. */
  h->doc_index_offset = o->offset;
  uint64_t index_bytes = doc_count * WK_SHARD_DOC_ENTRY_BYTES;
  uint8_t *index = wk_malloc(index_bytes, "document index");
  if (!index) return WK_ERR_NOMEM;
  for (uint64_t d = 0; d < doc_count; d++) put64le(index + d * WK_SHARD_DOC_ENTRY_BYTES, doc_starts[d]);
  h->doc_index_hash = wk_hash64(index, index_bytes);
  status = out_write(o, index, index_bytes);
  free(index);
  h->file_bytes = o->offset;
  return status;
}

static WkStatus check_options(const char *path, const WkShardWriteOptions *opt, uint64_t token_count,
                              uint32_t *block_count) {
  if (opt->block_tokens == 0 || opt->block_tokens > WK_SHARD_MAX_BLOCK_TOKENS ||
      (opt->token_bytes != 2 && opt->token_bytes != 4))
    return WK_FAIL(WK_ERR_INVALID_ARG, "shard '%s': block of %u tokens of %u bytes is out of range", path,
                   opt->block_tokens, opt->token_bytes);
  uint64_t blocks = token_count / opt->block_tokens + (token_count % opt->block_tokens != 0);
  if (blocks > UINT32_MAX)
    return WK_FAIL(WK_ERR_INVALID_ARG, "shard '%s': %llu blocks are too many; use larger blocks or smaller shards",
                   path, (unsigned long long)blocks);
  *block_count = (uint32_t)blocks;
  return WK_OK;
}

uint32_t wk_shard_block_count(const WkShardWriteOptions *opt, uint64_t token_count) {
  return opt->block_tokens ? (uint32_t)(token_count / opt->block_tokens + (token_count % opt->block_tokens != 0)) : 0;
}

WkStatus wk_shard_write(const char *path, const WkShardWriteOptions *opt, const void *tokens, uint64_t token_count,
                        const uint64_t *doc_starts, uint64_t doc_count, WkShardWritten *out) {
  uint32_t blocks = 0;
  WK_TRY(check_options(path, opt, token_count, &blocks));
  WkShardPiece piece;
  WK_TRY(wk_shard_compress(opt, tokens, token_count, 0, blocks, &piece));
  WkStatus status = wk_shard_assemble(path, opt, token_count, doc_starts, doc_count, &piece, 1, out);
  wk_shard_piece_free(&piece);
  return status;
}

WkStatus wk_shard_assemble(const char *path, const WkShardWriteOptions *opt, uint64_t token_count,
                           const uint64_t *doc_starts, uint64_t doc_count, const WkShardPiece *pieces,
                           uint32_t piece_count, WkShardWritten *out) {
  uint32_t blocks = 0;
  WK_TRY(check_options(path, opt, token_count, &blocks));
  WkShardHeader h = {
      .version = WK_SHARD_VERSION,
      .token_bytes = opt->token_bytes,
      .codec = opt->codec,
      .block_tokens = opt->block_tokens,
      .block_count = blocks,
      .vocab_size = opt->vocab_size,
      .eos = opt->eos,
      .tokens = token_count,
      .documents = doc_count,
  };
  size_t tmp_length = strlen(path) + 16;
  char *tmp = wk_malloc(tmp_length, "temporary shard name");
  if (!tmp) return WK_ERR_NOMEM;
  snprintf(tmp, tmp_length, "%s.tmp", path);
  Out o = {.f = fopen(tmp, "wb"), .path = tmp};
  if (!o.f) {
    WkStatus status = WK_FAIL_ERRNO("create", tmp);
    free(tmp);
    return status;
  }
  setvbuf(o.f, NULL, _IOFBF, 1 << 20);
  WkStatus status = write_body(&o, opt, pieces, piece_count, doc_starts, doc_count, &h);
  if (status == WK_OK) {
    uint8_t header[WK_SHARD_HEADER_BYTES];
    wk_shard_header_encode(&h, header);
    if (fseek(o.f, 0, SEEK_SET) != 0 || fwrite(header, 1, sizeof header, o.f) != sizeof header)
      status = WK_FAIL_ERRNO("write", tmp);
    WkShardHeader check;
    if (status == WK_OK) status = wk_shard_header_parse(header, sizeof header, h.file_bytes, path, &check);
    if (status == WK_OK) {
      out->bytes = h.file_bytes;
      out->header_hash = check.header_hash;
    }
  }
  if (fclose(o.f) != 0 && status == WK_OK) status = WK_FAIL_ERRNO("close", tmp);
  if (status == WK_OK && rename(tmp, path) != 0) status = WK_FAIL_ERRNO("rename into place", path);
  if (status != WK_OK) unlink(tmp);
  free(tmp);
  return status;
}
