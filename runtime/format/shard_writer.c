/*
 * shard_writer.c — one shard file from a token stream: blocks (zstd or raw, each checksummed),
 * then the block table and the document index, then the header that points at them.
 *
 * Two steps so the converter can spread one shard over its threads: wk_shard_compress turns a range
 * of blocks into a piece (any thread), wk_shard_assemble writes the pieces in order. A block's bytes
 * depend only on its tokens, so the file is the same however the blocks were split into pieces.
 *
 * Columns besides the tokens (format version 2) are compressed by the assembling thread, block by block
 * as the tokens (blocks of a WkBlockLayout), and written after the token blocks; their column table and
 * block tables follow the document index.
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

/* Where a block's raw bytes are: rows of a layout in one array, or blobs cut by their end offsets. */
typedef struct {
  const WkBlockLayout *l;
  const uint8_t *data;
  const uint64_t *blob_ends;  /* element_bytes 0 */
} BlockSource;

static const uint8_t *source_block(const BlockSource *src, uint32_t b, size_t *n) {
  if (src->l->element_bytes == 0) {
    uint64_t start = b ? src->blob_ends[b - 1] : 0;
    *n = (size_t)(src->blob_ends[b] - start);
    return src->data + start;
  }
  *n = (size_t)(wk_layout_block_rows(src->l, b) * src->l->element_bytes);
  return src->data + (size_t)b * src->l->rows_per_block * src->l->element_bytes;
}

static WkStatus compress_blocks(const BlockSource *src, WkCodec codec, int level, uint32_t first_block,
                                uint32_t block_count, WkShardPiece *piece) {
  memset(piece, 0, sizeof *piece);
  piece->first_block = first_block;
  piece->block_count = block_count;
  piece->blocks = wk_calloc(block_count ? block_count : 1, sizeof *piece->blocks, "piece blocks");
  if (!piece->blocks) return WK_ERR_NOMEM;
  ZSTD_CCtx *cctx = NULL;
  size_t capacity = 0;
  WkStatus status = WK_OK;
  if (codec == WK_CODEC_ZSTD) {
    cctx = ZSTD_createCCtx();
    if (!cctx) status = WK_FAIL(WK_ERR_NOMEM, "cannot create a zstd context");
  }
  for (uint32_t k = 0; k < block_count && status == WK_OK; k++) {
    uint32_t b = first_block + k;
    size_t n;
    const uint8_t *raw = source_block(src, b, &n);
    WkPieceBlock *pb = &piece->blocks[k];
    *pb = (WkPieceBlock){.codec = WK_CODEC_RAW, .bytes = (uint32_t)n, .raw = raw};
    if (codec == WK_CODEC_ZSTD && n > 0) {
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
      size_t c = ZSTD_compressCCtx(cctx, piece->buffer + piece->buffer_bytes, bound, raw, n, level);
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

WkStatus wk_shard_compress(const WkShardWriteOptions *opt, const void *tokens, uint64_t token_count,
                           uint32_t first_block, uint32_t block_count, WkShardPiece *piece) {
  WkShardHeader h = {.block_tokens = opt->block_tokens, .tokens = token_count, .token_bytes = opt->token_bytes};
  WkBlockLayout l = wk_shard_token_layout(&h);
  BlockSource src = {.l = &l, .data = tokens};
  return compress_blocks(&src, opt->codec, opt->level, first_block, block_count, piece);
}

void wk_shard_piece_free(WkShardPiece *piece) {
  free(piece->buffer);
  free(piece->blocks);
  memset(piece, 0, sizeof *piece);
}

/* ---- checking the columns ----------------------------------------------------------------------- */

/* A column ready to write: its checked info, its layout in this shard, its blocks compressed. */
typedef struct {
  WkColumnEntry entry;
  WkShardPiece piece;
} Column;

/* Checks one column against the shard (h: tokens, documents, block_tokens) and fills its entry. */
static WkStatus check_column(const char *path, const WkShardHeader *h, const WkShardColumn *in, Column *out) {
  WkColumnInfo *info = &out->entry.info;
  *info = in->info;
  char where[1100];
  snprintf(where, sizeof where, "shard '%s'", path);
  if (wk_column_info_check(info, where) != WK_OK) { /* the caller's columns, not a file: an argument error */
    char message[1400];
    snprintf(message, sizeof message, "%s", wk_last_error());
    return WK_FAIL(WK_ERR_INVALID_ARG, "%s", message);
  }
  if (in->info.element_bytes && in->info.element_bytes != info->element_bytes)
    return WK_FAIL(WK_ERR_INVALID_ARG, "shard '%s' column '%s': element_bytes %llu, but its shape makes %llu", path,
                   info->name, (unsigned long long)in->info.element_bytes, (unsigned long long)info->element_bytes);
  WkBlockLayout l = wk_column_layout(info, h);
  if (l.block_count == UINT32_MAX)
    return WK_FAIL(WK_ERR_INVALID_ARG, "shard '%s' column '%s': too many blocks; write smaller shards", path,
                   info->name);
  const char *per = info->kind == WK_COLUMN_TOKEN_U8 ? "tokens" : "records";
  if (info->kind == WK_COLUMN_BYTES) {
    uint64_t end = 0;
    for (uint64_t d = 0; d < h->documents && in->blob_ends; d++) {
      if (in->blob_ends[d] < end || in->blob_ends[d] - end > UINT32_MAX)
        return WK_FAIL(WK_ERR_INVALID_ARG, "shard '%s' column '%s' record %llu: blob ends at %llu after %llu (each "
                       "blob is at most 4 GiB - 1)", path, info->name, (unsigned long long)d,
                       (unsigned long long)in->blob_ends[d], (unsigned long long)end);
      end = in->blob_ends[d];
    }
    if ((!in->blob_ends && h->documents) || end != in->data_bytes)
      return WK_FAIL(WK_ERR_INVALID_ARG, "shard '%s' column '%s': %llu blob bytes, but the %llu blobs' ends say %llu",
                     path, info->name, (unsigned long long)in->data_bytes, (unsigned long long)h->documents,
                     (unsigned long long)end);
  } else if (in->data_bytes != l.rows * l.element_bytes) {
    return WK_FAIL(WK_ERR_INVALID_ARG, "shard '%s' column '%s' (%s): %llu bytes, expected %llu for its %llu %s", path,
                   info->name, wk_column_kind_name(info->kind), (unsigned long long)in->data_bytes,
                   (unsigned long long)(l.rows * l.element_bytes), (unsigned long long)l.rows, per);
  }
  if (in->data_bytes && !in->data)
    return WK_FAIL(WK_ERR_INVALID_ARG, "shard '%s' column '%s': data is NULL", path, info->name);
  out->entry.layout = l;
  return WK_OK;
}

/* Checks every column (names unique, not "tokens") and compresses its blocks. */
static WkStatus prepare_columns(const char *path, const WkShardWriteOptions *opt, const WkShardHeader *h,
                                const WkShardColumn *in, uint32_t count, Column *out) {
  if (count >= WK_MAX_COLUMNS)
    return WK_FAIL(WK_ERR_INVALID_ARG, "shard '%s': %u columns besides the tokens, at most %d", path, count,
                   WK_MAX_COLUMNS - 1);
  for (uint32_t c = 0; c < count; c++) {
    WK_TRY(check_column(path, h, &in[c], &out[c]));
    for (uint32_t o = 0; o <= c; o++)
      if (strcmp(out[c].entry.info.name, o < c ? out[o].entry.info.name : "tokens") == 0)
        return WK_FAIL(WK_ERR_INVALID_ARG, "shard '%s': two columns are named '%s'", path, out[c].entry.info.name);
  }
  for (uint32_t c = 0; c < count; c++) {
    out[c].entry.layout.column = out[c].entry.info.name;
    BlockSource src = {.l = &out[c].entry.layout, .data = in[c].data, .blob_ends = in[c].blob_ends};
    WK_TRY(compress_blocks(&src, opt->codec, opt->level, 0, out[c].entry.layout.block_count, &out[c].piece));
  }
  return WK_OK;
}

/* ---- assembling the file ------------------------------------------------------------------------ */

/* Writes the blocks of pieces (covering blocks [0, block_count) in order), each 64-aligned, and encodes
 * their block table into table. */
static WkStatus write_blocks(Out *o, const WkShardPiece *pieces, uint32_t piece_count, uint32_t block_count,
                             uint8_t *table) {
  uint32_t next = 0;
  for (uint32_t p = 0; p < piece_count; p++) {
    const WkShardPiece *piece = &pieces[p];
    if (piece->first_block != next || piece->block_count > block_count - next)
      return WK_FAIL(WK_ERR_INTERNAL, "shard '%s': pieces do not cover the blocks in order", o->path);
    for (uint32_t k = 0; k < piece->block_count; k++) {
      const WkPieceBlock *pb = &piece->blocks[k];
      WK_TRY(out_pad(o, WK_SHARD_BLOCK_ALIGN));
      WkBlockEntry e = {.offset = o->offset, .stored_bytes = pb->bytes, .codec = pb->codec, .hash = pb->hash};
      wk_block_entry_encode(&e, table + (size_t)(next + k) * WK_SHARD_BLOCK_ENTRY_BYTES);
      WK_TRY(out_write(o, pb->raw ? pb->raw : piece->buffer + pb->at, pb->bytes));
    }
    next += piece->block_count;
  }
  if (next != block_count)
    return WK_FAIL(WK_ERR_INTERNAL, "shard '%s': pieces hold %u of %u blocks", o->path, next, block_count);
  return WK_OK;
}

/* A block table per layout: the tokens' (tables[0]) and each column's. */
static uint8_t *new_table(uint32_t blocks) {
  return wk_calloc(blocks ? blocks : 1, WK_SHARD_BLOCK_ENTRY_BYTES, "block table");
}

/* The column table and the column block tables, after the document index. */
static WkStatus write_column_tables(Out *o, Column *columns, uint32_t count, uint8_t *const *tables,
                                    WkShardHeader *h) {
  size_t table_bytes = (size_t)count * WK_SHARD_COLUMN_ENTRY_BYTES;
  uint8_t *table = wk_calloc(count, WK_SHARD_COLUMN_ENTRY_BYTES, "column table");
  if (!table) return WK_ERR_NOMEM;
  uint64_t at = o->offset + table_bytes;
  for (uint32_t c = 0; c < count; c++) {
    WkColumnEntry *e = &columns[c].entry;
    size_t bytes = (size_t)e->layout.block_count * WK_SHARD_BLOCK_ENTRY_BYTES;
    e->block_table_offset = at;
    e->block_table_hash = wk_hash64(tables[c], bytes);
    wk_column_entry_encode(e, table + (size_t)c * WK_SHARD_COLUMN_ENTRY_BYTES);
    at += bytes;
  }
  h->column_table_hash = wk_hash64(table, table_bytes);
  WkStatus status = out_write(o, table, table_bytes);
  free(table);
  for (uint32_t c = 0; c < count && status == WK_OK; c++)
    status = out_write(o, tables[c], (size_t)columns[c].entry.layout.block_count * WK_SHARD_BLOCK_ENTRY_BYTES);
  return status;
}

static WkStatus write_body(Out *o, const WkShardPiece *pieces, uint32_t piece_count, Column *columns,
                           uint32_t column_count, const uint64_t *doc_starts, uint64_t doc_count, WkShardHeader *h) {
  uint8_t placeholder[WK_SHARD_HEADER_BYTES] = {0};
  WK_TRY(out_write(o, placeholder, sizeof placeholder));
  h->payload_offset = o->offset;
  uint8_t *tables[WK_MAX_COLUMNS] = {0}; /* [0]: the tokens', then one per column */
  WkStatus status = (tables[0] = new_table(h->block_count)) ? WK_OK : WK_ERR_NOMEM;
  if (status == WK_OK) status = write_blocks(o, pieces, piece_count, h->block_count, tables[0]);
  for (uint32_t c = 0; c < column_count && status == WK_OK; c++) {
    uint32_t blocks = columns[c].entry.layout.block_count;
    status = (tables[c + 1] = new_table(blocks)) ? WK_OK : WK_ERR_NOMEM;
    if (status == WK_OK) status = write_blocks(o, &columns[c].piece, 1, blocks, tables[c + 1]);
  }
  if (status == WK_OK) status = out_pad(o, 8);
  if (status == WK_OK) {
    size_t table_bytes = (size_t)h->block_count * WK_SHARD_BLOCK_ENTRY_BYTES;
    h->block_table_offset = o->offset;
    h->block_table_hash = wk_hash64(tables[0], table_bytes);
    status = out_write(o, tables[0], table_bytes);
  }
  /* The document index: little-endian u64 start of each document in the stream. */
  uint64_t index_bytes = doc_count * WK_SHARD_DOC_ENTRY_BYTES;
  uint8_t *index = status == WK_OK ? wk_malloc(index_bytes ? index_bytes : 1, "document index") : NULL;
  if (status == WK_OK && !index) status = WK_ERR_NOMEM;
  if (status == WK_OK) {
    h->doc_index_offset = o->offset;
    for (uint64_t d = 0; d < doc_count; d++) put64le(index + d * WK_SHARD_DOC_ENTRY_BYTES, doc_starts[d]);
    h->doc_index_hash = wk_hash64(index, index_bytes);
    status = out_write(o, index, index_bytes);
  }
  free(index);
  if (status == WK_OK && column_count) status = write_column_tables(o, columns, column_count, tables + 1, h);
  for (uint32_t t = 0; t <= column_count; t++) free(tables[t]);
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

WkStatus wk_shard_write_columns(const char *path, const WkShardWriteOptions *opt, const void *tokens,
                                uint64_t token_count, const uint64_t *doc_starts, uint64_t doc_count,
                                const WkShardColumn *columns, uint32_t column_count, WkShardWritten *out) {
  uint32_t blocks = 0;
  WK_TRY(check_options(path, opt, token_count, &blocks));
  WkShardPiece piece;
  WK_TRY(wk_shard_compress(opt, tokens, token_count, 0, blocks, &piece));
  WkStatus status = wk_shard_assemble_columns(path, opt, token_count, doc_starts, doc_count, &piece, 1, columns,
                                              column_count, out);
  wk_shard_piece_free(&piece);
  return status;
}

WkStatus wk_shard_write(const char *path, const WkShardWriteOptions *opt, const void *tokens, uint64_t token_count,
                        const uint64_t *doc_starts, uint64_t doc_count, WkShardWritten *out) {
  return wk_shard_write_columns(path, opt, tokens, token_count, doc_starts, doc_count, NULL, 0, out);
}

WkStatus wk_shard_assemble(const char *path, const WkShardWriteOptions *opt, uint64_t token_count,
                           const uint64_t *doc_starts, uint64_t doc_count, const WkShardPiece *pieces,
                           uint32_t piece_count, WkShardWritten *out) {
  return wk_shard_assemble_columns(path, opt, token_count, doc_starts, doc_count, pieces, piece_count, NULL, 0, out);
}

/* The file under a temporary name, then its header, then renamed into place. */
static WkStatus write_file(const char *path, const WkShardPiece *pieces, uint32_t piece_count, Column *columns,
                           uint32_t column_count, const uint64_t *doc_starts, uint64_t doc_count, WkShardHeader *h,
                           WkShardWritten *out) {
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
  WkStatus status = write_body(&o, pieces, piece_count, columns, column_count, doc_starts, doc_count, h);
  if (status == WK_OK) {
    uint8_t header[WK_SHARD_HEADER_BYTES];
    wk_shard_header_encode(h, header);
    if (fseek(o.f, 0, SEEK_SET) != 0 || fwrite(header, 1, sizeof header, o.f) != sizeof header)
      status = WK_FAIL_ERRNO("write", tmp);
    WkShardHeader check;
    if (status == WK_OK) status = wk_shard_header_parse(header, sizeof header, h->file_bytes, path, &check);
    if (status == WK_OK) {
      out->bytes = h->file_bytes;
      out->header_hash = check.header_hash;
    }
  }
  if (fclose(o.f) != 0 && status == WK_OK) status = WK_FAIL_ERRNO("close", tmp);
  if (status == WK_OK && rename(tmp, path) != 0) status = WK_FAIL_ERRNO("rename into place", path);
  if (status != WK_OK) unlink(tmp);
  free(tmp);
  return status;
}

WkStatus wk_shard_assemble_columns(const char *path, const WkShardWriteOptions *opt, uint64_t token_count,
                                   const uint64_t *doc_starts, uint64_t doc_count, const WkShardPiece *pieces,
                                   uint32_t piece_count, const WkShardColumn *in, uint32_t column_count,
                                   WkShardWritten *out) {
  uint32_t blocks = 0;
  WK_TRY(check_options(path, opt, token_count, &blocks));
  WkShardHeader h = {
      .version = column_count ? 2 : 1, /* a shard of tokens only stays version 1, byte for byte */
      .token_bytes = opt->token_bytes,
      .codec = opt->codec,
      .block_tokens = opt->block_tokens,
      .block_count = blocks,
      .vocab_size = opt->vocab_size,
      .eos = opt->eos,
      .tokens = token_count,
      .documents = doc_count,
      .column_count = column_count,
  };
  Column columns[WK_MAX_COLUMNS];
  memset(columns, 0, sizeof columns);
  WkStatus status = prepare_columns(path, opt, &h, in, column_count, columns);
  if (status == WK_OK)
    status = write_file(path, pieces, piece_count, columns, column_count, doc_starts, doc_count, &h, out);
  for (uint32_t c = 0; c < column_count && c < WK_MAX_COLUMNS; c++) wk_shard_piece_free(&columns[c].piece);
  return status;
}
