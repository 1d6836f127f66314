/*
 * shard_writer.c — one shard file from a token stream: blocks (zstd or raw, each checksummed),
 * then the block table and the document index, then the header that points at them.
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

#include "format.h"

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

/* Writes blocks, table and doc index after the header placeholder; fills h. */
static WkStatus write_body(Out *o, const WkShardWriteOptions *opt, const uint8_t *tokens, uint64_t token_count,
                           const uint64_t *doc_starts, uint64_t doc_count, WkShardHeader *h) {
  uint8_t placeholder[WK_SHARD_HEADER_BYTES] = {0};
  WK_TRY(out_write(o, placeholder, sizeof placeholder));
  h->payload_offset = o->offset;

  size_t block_bytes = (size_t)opt->block_tokens * opt->token_bytes;
  size_t bound = ZSTD_compressBound(block_bytes);
  uint8_t *compressed = opt->codec == WK_CODEC_ZSTD ? wk_malloc(bound, "zstd block buffer") : NULL;
  uint8_t *table = wk_malloc((size_t)h->block_count * WK_SHARD_BLOCK_ENTRY_BYTES, "block table");
  ZSTD_CCtx *cctx = opt->codec == WK_CODEC_ZSTD ? ZSTD_createCCtx() : NULL;
  WkStatus status = WK_OK;
  if ((opt->codec == WK_CODEC_ZSTD && (!compressed || !cctx)) || !table) {
    status = wk_last_status() != WK_OK ? wk_last_status() : WK_ERR_NOMEM;
    if (!cctx && opt->codec == WK_CODEC_ZSTD) status = WK_FAIL(WK_ERR_NOMEM, "cannot create a zstd context");
    goto done;
  }
  for (uint32_t b = 0; b < h->block_count; b++) {
    size_t n = (size_t)wk_block_token_count(h, b) * opt->token_bytes;
    const uint8_t *raw = tokens + (size_t)b * block_bytes;
    WkBlockEntry e = {.codec = WK_CODEC_RAW, .stored_bytes = (uint32_t)n};
    const uint8_t *stored = raw;
    if (opt->codec == WK_CODEC_ZSTD) {
      size_t c = ZSTD_compressCCtx(cctx, compressed, bound, raw, n, opt->level);
      if (ZSTD_isError(c)) {
        status = WK_FAIL(WK_ERR_INTERNAL, "shard '%s' block %u: zstd: %s", o->path, b, ZSTD_getErrorName(c));
        goto done;
      }
      if (c < n) { /* incompressible blocks stay raw */
        e.codec = WK_CODEC_ZSTD;
        e.stored_bytes = (uint32_t)c;
        stored = compressed;
      }
    }
    if ((status = out_pad(o, WK_SHARD_BLOCK_ALIGN)) != WK_OK) goto done;
    e.offset = o->offset;
    e.hash = wk_hash64(stored, e.stored_bytes);
    wk_block_entry_encode(&e, table + (size_t)b * WK_SHARD_BLOCK_ENTRY_BYTES);
    if ((status = out_write(o, stored, e.stored_bytes)) != WK_OK) goto done;
  }
  if ((status = out_pad(o, 8)) != WK_OK) goto done;
  h->block_table_offset = o->offset;
  h->block_table_hash = wk_hash64(table, (size_t)h->block_count * WK_SHARD_BLOCK_ENTRY_BYTES);
  if ((status = out_write(o, table, (size_t)h->block_count * WK_SHARD_BLOCK_ENTRY_BYTES)) != WK_OK) goto done;
  h->doc_index_offset = o->offset;
  /* The document index: little-endian u64 start of each document in the stream. */
  uint64_t hash_input_size = doc_count * WK_SHARD_DOC_ENTRY_BYTES;
  uint8_t *all = wk_malloc(hash_input_size, "document index");
  if (!all) {
    status = WK_ERR_NOMEM;
    goto done;
  }
  for (uint64_t d = 0; d < doc_count; d++) put64le(all + d * WK_SHARD_DOC_ENTRY_BYTES, doc_starts[d]);
  h->doc_index_hash = wk_hash64(all, hash_input_size);
  status = out_write(o, all, hash_input_size);
  free(all);
  h->file_bytes = o->offset;
done:
  ZSTD_freeCCtx(cctx);
  free(compressed);
  free(table);
  return status;
}

WkStatus wk_shard_write(const char *path, const WkShardWriteOptions *opt, const void *tokens, uint64_t token_count,
                        const uint64_t *doc_starts, uint64_t doc_count, WkShardWritten *out) {
  if (opt->block_tokens == 0 || opt->block_tokens > WK_SHARD_MAX_BLOCK_TOKENS ||
      (opt->token_bytes != 2 && opt->token_bytes != 4))
    return WK_FAIL(WK_ERR_INVALID_ARG, "shard '%s': block of %u tokens of %u bytes is out of range", path,
                   opt->block_tokens, opt->token_bytes);
  uint64_t blocks = token_count / opt->block_tokens + (token_count % opt->block_tokens != 0);
  if (blocks > UINT32_MAX)
    return WK_FAIL(WK_ERR_INVALID_ARG, "shard '%s': %llu blocks are too many; use larger blocks or smaller shards",
                   path, (unsigned long long)blocks);
  WkShardHeader h = {
      .version = WK_SHARD_VERSION,
      .token_bytes = opt->token_bytes,
      .codec = opt->codec,
      .block_tokens = opt->block_tokens,
      .block_count = (uint32_t)blocks,
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
  WkStatus status = write_body(&o, opt, tokens, token_count, doc_starts, doc_count, &h);
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
