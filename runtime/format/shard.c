/*
 * shard.c — reading the shard format: header, block table and document index validation,
 * block checksums and decoding, the column table of version 2 (each column a block table of its own,
 * read by the same code as the tokens' through a WkBlockLayout), and the "view" that does all of it
 * through a WkBlob. No
 * files, locks or caches here (only a per-thread zstd context), so the fuzz target drives exactly
 * the code the dataset reader runs.
 *
 * Every check that can fail names the shard, the block or document, and the reason, with a hint
 * (the format is in FORMAT.md).
 */
#include <pthread.h>
#include <stdio.h>  /* snprintf */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>  /* XXH3_64bits, XXH3 streaming state */
#include <zstd.h>    /* ZSTD_decompressDCtx, ZSTD_getFrameContentSize */

#include "shard.h"

#define CORRUPT_HINT "file truncated or corrupted; re-run the converter or delete it from the cache"

/* Stored tokens are little-endian and copied as such (u32 blocks by memcpy, u16 by SSE2 lanes). */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "Wick's shard reader assumes a little-endian host");

/* ---- little-endian fields ----------------------------------------------------------------- */

static uint32_t get32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }
static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* ---- header ------------------------------------------------------------------------------------- */

/* Field offsets inside the 128-byte header (FORMAT.md has the table). */
enum {
  H_MAGIC = 0, H_VERSION = 8, H_HEADER_BYTES = 12, H_FLAGS = 16, H_TOKEN_BYTES = 20, H_CODEC = 24,
  H_BLOCK_TOKENS = 28, H_TOKENS = 32, H_DOCUMENTS = 40, H_FILE_BYTES = 48, H_BLOCK_COUNT = 56, H_VOCAB = 60,
  H_EOS = 64, H_COLUMN_COUNT = 68, H_PAYLOAD = 72, H_BLOCK_TABLE = 80, H_DOC_INDEX = 88, H_BLOCK_TABLE_HASH = 96,
  H_DOC_INDEX_HASH = 104, H_COLUMN_TABLE_HASH = 112, H_HEADER_HASH = 120
};

void wk_shard_header_encode(const WkShardHeader *h, uint8_t out[WK_SHARD_HEADER_BYTES]) {
  memset(out, 0, WK_SHARD_HEADER_BYTES);
  memcpy(out + H_MAGIC, WK_SHARD_MAGIC, 8);
  put32(out + H_VERSION, h->version);
  put32(out + H_HEADER_BYTES, WK_SHARD_HEADER_BYTES);
  put32(out + H_FLAGS, h->flags);
  put32(out + H_TOKEN_BYTES, h->token_bytes);
  put32(out + H_CODEC, h->codec);
  put32(out + H_BLOCK_TOKENS, h->block_tokens);
  put64(out + H_TOKENS, h->tokens);
  put64(out + H_DOCUMENTS, h->documents);
  put64(out + H_FILE_BYTES, h->file_bytes);
  put32(out + H_BLOCK_COUNT, h->block_count);
  put32(out + H_VOCAB, h->vocab_size);
  put32(out + H_EOS, h->eos);
  put64(out + H_PAYLOAD, h->payload_offset);
  put64(out + H_BLOCK_TABLE, h->block_table_offset);
  put64(out + H_DOC_INDEX, h->doc_index_offset);
  put64(out + H_BLOCK_TABLE_HASH, h->block_table_hash);
  put64(out + H_DOC_INDEX_HASH, h->doc_index_hash);
  put32(out + H_COLUMN_COUNT, h->column_count);
  put64(out + H_COLUMN_TABLE_HASH, h->column_table_hash);
  put64(out + H_HEADER_HASH, wk_hash64(out, H_HEADER_HASH));
}

#define BAD(...) (wk_fail_at(__FILE__, __LINE__, WK_ERR_FORMAT, __VA_ARGS__))

WkStatus wk_shard_header_parse(const uint8_t *b, size_t length, uint64_t file_size, const char *name,
                               WkShardHeader *h) {
  memset(h, 0, sizeof *h);
  if (length < WK_SHARD_HEADER_BYTES || file_size < WK_SHARD_HEADER_BYTES)
    return BAD("shard '%s': %llu bytes, shorter than the %d-byte header (" CORRUPT_HINT ")", name,
               (unsigned long long)(file_size < length ? file_size : length), WK_SHARD_HEADER_BYTES);
  if (memcmp(b + H_MAGIC, WK_SHARD_MAGIC, 8) != 0) {
    char shown[9];
    for (int i = 0; i < 8; i++) shown[i] = b[i] >= 0x20 && b[i] < 0x7f ? (char)b[i] : '?';
    shown[8] = '\0';
    return BAD("shard '%s': bad magic '%s', expected '" WK_SHARD_MAGIC "' (not a Wick shard, or its start is corrupted)",
               name, shown);
  }
  h->version = get32(b + H_VERSION);
  if (h->version > WK_SHARD_VERSION)
    return BAD("shard '%s': format version %u is newer than this reader's %d (upgrade Wick to read it)", name,
               h->version, WK_SHARD_VERSION);
  if (h->version == 0) return BAD("shard '%s': format version 0 is not valid (" CORRUPT_HINT ")", name);
  uint64_t stored_hash = get64(b + H_HEADER_HASH), actual_hash = wk_hash64(b, H_HEADER_HASH);
  if (stored_hash != actual_hash)
    return BAD("shard '%s' header: checksum 0x%016llx != 0x%016llx (" CORRUPT_HINT ")", name,
               (unsigned long long)actual_hash, (unsigned long long)stored_hash);
  h->header_hash = stored_hash;
  h->flags = get32(b + H_FLAGS);
  h->token_bytes = get32(b + H_TOKEN_BYTES);
  h->codec = get32(b + H_CODEC);
  h->block_tokens = get32(b + H_BLOCK_TOKENS);
  h->tokens = get64(b + H_TOKENS);
  h->documents = get64(b + H_DOCUMENTS);
  h->file_bytes = get64(b + H_FILE_BYTES);
  h->block_count = get32(b + H_BLOCK_COUNT);
  h->vocab_size = get32(b + H_VOCAB);
  h->eos = get32(b + H_EOS);
  h->payload_offset = get64(b + H_PAYLOAD);
  h->block_table_offset = get64(b + H_BLOCK_TABLE);
  h->doc_index_offset = get64(b + H_DOC_INDEX);
  h->block_table_hash = get64(b + H_BLOCK_TABLE_HASH);
  h->doc_index_hash = get64(b + H_DOC_INDEX_HASH);
  h->column_count = get32(b + H_COLUMN_COUNT);
  h->column_table_hash = get64(b + H_COLUMN_TABLE_HASH);

  if (get32(b + H_HEADER_BYTES) != WK_SHARD_HEADER_BYTES)
    return BAD("shard '%s': header size %u, expected %d for version %u", name, get32(b + H_HEADER_BYTES),
               WK_SHARD_HEADER_BYTES, h->version);
  if (h->flags != 0)
    return BAD("shard '%s': unknown flags 0x%x (written by a newer Wick; upgrade to read it)", name, h->flags);
  if (h->token_bytes != 2 && h->token_bytes != 4)
    return BAD("shard '%s': token width %u bytes, expected 2 or 4", name, h->token_bytes);
  if (h->codec != WK_CODEC_RAW && h->codec != WK_CODEC_ZSTD)
    return BAD("shard '%s': unknown codec %u (written by a newer Wick?)", name, h->codec);
  if (h->block_tokens == 0 || h->block_tokens > WK_SHARD_MAX_BLOCK_TOKENS)
    return BAD("shard '%s': %u tokens per block, expected 1..%d", name, h->block_tokens,
               WK_SHARD_MAX_BLOCK_TOKENS);
  if (h->vocab_size == 0 || (h->token_bytes == 2 && h->vocab_size > 65536) || h->eos >= h->vocab_size)
    return BAD("shard '%s': vocabulary %u with EOS %u does not fit %u-byte tokens", name, h->vocab_size, h->eos,
               h->token_bytes);
  if (h->file_bytes != file_size)
    return BAD("shard '%s': header says %llu bytes but the file has %llu (" CORRUPT_HINT ")", name,
               (unsigned long long)h->file_bytes, (unsigned long long)file_size);
  uint64_t blocks = h->tokens / h->block_tokens + (h->tokens % h->block_tokens != 0);
  if (blocks != h->block_count)
    return BAD("shard '%s': %u blocks for %llu tokens of %u per block, expected %llu (" CORRUPT_HINT ")", name,
               h->block_count, (unsigned long long)h->tokens, h->block_tokens, (unsigned long long)blocks);
  if (h->documents > h->tokens || (h->tokens > 0 && h->documents == 0))
    return BAD("shard '%s': %llu documents cannot end %llu tokens with one EOS each (" CORRUPT_HINT ")", name,
               (unsigned long long)h->documents, (unsigned long long)h->tokens);
  if (h->version == 1 && (h->column_count != 0 || h->column_table_hash != 0))
    return BAD("shard '%s': reserved header fields are not 0 in a version 1 shard (" CORRUPT_HINT ")", name);
  if (h->column_count >= WK_MAX_COLUMNS)
    return BAD("shard '%s': %u columns besides the tokens, at most %d (" CORRUPT_HINT ")", name, h->column_count,
               WK_MAX_COLUMNS - 1);
  /* Version 2: the column table follows the document index; the column block tables after it are
   * checked to tile the rest when the table is read (wk_shard_view_open). */
  uint64_t columns_bytes = (uint64_t)h->column_count * WK_SHARD_COLUMN_ENTRY_BYTES;
  if (h->payload_offset != WK_SHARD_HEADER_BYTES || h->block_table_offset < h->payload_offset ||
      h->block_table_offset > file_size ||
      (uint64_t)h->block_count * WK_SHARD_BLOCK_ENTRY_BYTES != h->doc_index_offset - h->block_table_offset ||
      h->doc_index_offset < h->block_table_offset || h->doc_index_offset > file_size ||
      h->documents > (file_size - h->doc_index_offset) / WK_SHARD_DOC_ENTRY_BYTES ||
      (h->column_table_offset = h->doc_index_offset + h->documents * WK_SHARD_DOC_ENTRY_BYTES) > file_size ||
      columns_bytes > file_size - h->column_table_offset ||
      (h->column_count == 0 && h->column_table_offset != file_size))
    return BAD("shard '%s': sections (payload %llu, block table %llu, document index %llu, end %llu) do not tile "
               "the file (" CORRUPT_HINT ")",
               name, (unsigned long long)h->payload_offset, (unsigned long long)h->block_table_offset,
               (unsigned long long)h->doc_index_offset, (unsigned long long)file_size);
  return WK_OK;
}

/* ---- block tables (the tokens' and each column's) ------------------------------------------------ */

void wk_block_entry_encode(const WkBlockEntry *e, uint8_t out[WK_SHARD_BLOCK_ENTRY_BYTES]) {
  put64(out, e->offset);
  put32(out + 8, e->stored_bytes);
  put32(out + 12, e->codec);
  put64(out + 16, e->hash);
}

WkBlockLayout wk_shard_token_layout(const WkShardHeader *h) {
  return (WkBlockLayout){.rows = h->tokens, .element_bytes = h->token_bytes, .rows_per_block = h->block_tokens,
                         .block_count = h->block_count, .align = h->token_bytes};
}

uint64_t wk_layout_block_rows(const WkBlockLayout *l, uint32_t block) {
  uint64_t first = (uint64_t)block * l->rows_per_block;
  uint64_t left = l->rows > first ? l->rows - first : 0;
  return left < l->rows_per_block ? left : l->rows_per_block;
}

uint32_t wk_block_token_count(const WkShardHeader *h, uint32_t block) {
  WkBlockLayout l = wk_shard_token_layout(h);
  return (uint32_t)wk_layout_block_rows(&l, block);
}

/* "shard 'NAME' block 3" or "shard 'NAME' column 'label' block 3": how every block message starts. */
typedef struct {
  char text[1200];
} Where;

static Where block_where(const char *name, const WkBlockLayout *l, uint32_t block) {
  Where w;
  if (l && l->column) snprintf(w.text, sizeof w.text, "shard '%s' column '%s' block %u", name, l->column, block);
  else snprintf(w.text, sizeof w.text, "shard '%s' block %u", name, block);
  return w;
}

WkStatus wk_layout_entry_parse(const uint8_t *table, const WkShardHeader *h, const WkBlockLayout *l, uint32_t block,
                               const char *name, WkBlockEntry *e) {
  const uint8_t *p = table + (size_t)block * WK_SHARD_BLOCK_ENTRY_BYTES;
  e->offset = get64(p);
  e->stored_bytes = get32(p + 8);
  e->codec = get32(p + 12);
  e->hash = get64(p + 16);
  uint64_t decoded = wk_layout_block_rows(l, block) * l->element_bytes; /* 0 for a blob: known from its frame */
  if (e->offset < h->payload_offset || e->offset > h->block_table_offset ||
      e->stored_bytes > h->block_table_offset - e->offset)
    return BAD("%s: stored at [%llu, +%u) outside the payload [%llu, %llu) (" CORRUPT_HINT ")",
               block_where(name, l, block).text, (unsigned long long)e->offset, e->stored_bytes,
               (unsigned long long)h->payload_offset, (unsigned long long)h->block_table_offset);
  if (e->codec == WK_CODEC_RAW) {
    if (l->element_bytes && e->stored_bytes != decoded)
      return BAD("%s: raw block of %u bytes, expected %llu (" CORRUPT_HINT ")", block_where(name, l, block).text,
                 e->stored_bytes, (unsigned long long)decoded);
    if (e->offset % l->align != 0)
      return BAD("%s: raw block at unaligned offset %llu (" CORRUPT_HINT ")", block_where(name, l, block).text,
                 (unsigned long long)e->offset);
  } else if (e->codec == WK_CODEC_ZSTD) {
    if (e->stored_bytes == 0 || (l->element_bytes && e->stored_bytes > ZSTD_compressBound((size_t)decoded)))
      return BAD("%s: zstd block of %u bytes for %llu decoded bytes (" CORRUPT_HINT ")",
                 block_where(name, l, block).text, e->stored_bytes, (unsigned long long)decoded);
  } else {
    return BAD("%s: unknown codec %u (" CORRUPT_HINT ")", block_where(name, l, block).text, e->codec);
  }
  return WK_OK;
}

WkStatus wk_block_entry_parse(const uint8_t *table, const WkShardHeader *h, uint32_t block, const char *name,
                              WkBlockEntry *e) {
  WkBlockLayout l = wk_shard_token_layout(h);
  return wk_layout_entry_parse(table, h, &l, block, name, e);
}

/* ---- blocks --------------------------------------------------------------------------------- */

WkStatus wk_layout_block_verify(const WkBlockLayout *l, const WkBlockEntry *e, uint32_t block, const void *stored,
                                const char *name) {
  uint64_t actual = wk_hash64(stored, e->stored_bytes);
  if (actual != e->hash)
    return BAD("%s: checksum 0x%016llx != 0x%016llx (" CORRUPT_HINT ")", block_where(name, l, block).text,
               (unsigned long long)actual, (unsigned long long)e->hash);
  return WK_OK;
}

WkStatus wk_block_verify(const WkBlockEntry *e, uint32_t block, const void *stored, const char *name) {
  return wk_layout_block_verify(NULL, e, block, stored, name);
}

/* One decompression context per thread, freed when the thread exits. */
static pthread_key_t dctx_key;
static pthread_once_t dctx_once = PTHREAD_ONCE_INIT;
static void free_dctx(void *dctx) { ZSTD_freeDCtx(dctx); }
static void make_dctx_key(void) { pthread_key_create(&dctx_key, free_dctx); }

static ZSTD_DCtx *thread_dctx(void) {
  pthread_once(&dctx_once, make_dctx_key);
  ZSTD_DCtx *dctx = pthread_getspecific(dctx_key);
  if (!dctx) {
    dctx = ZSTD_createDCtx();
    if (!dctx) {
      WK_FAIL(WK_ERR_NOMEM, "out of memory creating a zstd decompression context");
      return NULL;
    }
    if (pthread_setspecific(dctx_key, dctx) != 0) {
      ZSTD_freeDCtx(dctx);
      WK_FAIL(WK_ERR_NOMEM, "cannot store the thread's zstd context");
      return NULL;
    }
  }
  return dctx;
}

WkStatus wk_layout_block_bytes(const WkBlockLayout *l, const WkBlockEntry *e, uint32_t block, const void *stored,
                               const char *name, uint64_t *bytes) {
  if (l->element_bytes || e->codec == WK_CODEC_RAW) {
    *bytes = l->element_bytes ? wk_layout_block_rows(l, block) * l->element_bytes : e->stored_bytes;
    return WK_OK;
  }
  unsigned long long content = ZSTD_getFrameContentSize(stored, e->stored_bytes);
  if (content == ZSTD_CONTENTSIZE_UNKNOWN || content == ZSTD_CONTENTSIZE_ERROR || content > UINT32_MAX)
    return BAD("%s: a zstd blob whose frame does not say its size, or says more than 4 GiB - 1 (" CORRUPT_HINT ")",
               block_where(name, l, block).text);
  *bytes = content;
  return WK_OK;
}

WkStatus wk_layout_block_decode(const WkBlockLayout *l, const WkBlockEntry *e, uint32_t block, const void *stored,
                                void *dst, const char *name) {
  WK_TRY(wk_layout_block_verify(l, e, block, stored, name));
  uint64_t bytes = 0;
  WK_TRY(wk_layout_block_bytes(l, e, block, stored, name, &bytes));
  size_t decoded = (size_t)bytes;
  if (e->codec == WK_CODEC_RAW) {
    if (decoded) memcpy(dst, stored, decoded);
    return WK_OK;
  }
  unsigned long long content = ZSTD_getFrameContentSize(stored, e->stored_bytes);
  if (content != decoded)
    return BAD("%s: zstd frame holds %lld bytes, expected %zu (" CORRUPT_HINT ")", block_where(name, l, block).text,
               content == ZSTD_CONTENTSIZE_UNKNOWN || content == ZSTD_CONTENTSIZE_ERROR ? -1LL : (long long)content,
               decoded);
  ZSTD_DCtx *dctx = thread_dctx();
  if (!dctx) return wk_last_status();
  size_t n = ZSTD_decompressDCtx(dctx, dst, decoded, stored, e->stored_bytes);
  if (ZSTD_isError(n))
    return BAD("%s: zstd: %s (" CORRUPT_HINT ")", block_where(name, l, block).text, ZSTD_getErrorName(n));
  if (n != decoded)
    return BAD("%s: decoded %zu bytes, expected %zu (" CORRUPT_HINT ")", block_where(name, l, block).text, n, decoded);
  return WK_OK;
}

WkStatus wk_block_decode(const WkShardHeader *h, const WkBlockEntry *e, uint32_t block, const void *stored,
                         void *dst, const char *name) {
  WkBlockLayout l = wk_shard_token_layout(h);
  return wk_layout_block_decode(&l, e, block, stored, dst, name);
}

/* ---- columns (version 2) ----------------------------------------------------------------------- */

/* The kinds, as index.json, the converter and Lua name them, with the dtype each holds (-1: a tensor's own). */
#define COLUMN_KINDS(X) \
  X(TOKENS, "tokens", -1) X(TOKEN_U8, "token_u8", WK_U8) X(I64, "i64", WK_I64) X(F32, "f32", WK_F32) \
  X(TENSOR, "tensor", -1) X(BYTES, "bytes", WK_U8)
#define KIND_NAME(kind, text, dtype) [WK_COLUMN_##kind] = text,
#define KIND_DTYPE(kind, text, dtype) [WK_COLUMN_##kind] = dtype,
static const char *const KIND_NAMES[WK_COLUMN_KIND_COUNT] = {COLUMN_KINDS(KIND_NAME)};
static const int KIND_DTYPES[WK_COLUMN_KIND_COUNT] = {COLUMN_KINDS(KIND_DTYPE)};
#undef KIND_NAME
#undef KIND_DTYPE

/* The dtypes a column may hold: tokens (u16, i32 for u32 ids), a tensor's, the scalars'. */
static const struct {
  uint32_t dtype;
  const char *name;
  uint32_t bytes;
  bool tensor;
} COLUMN_DTYPES[] = {
    {WK_F32, "f32", 4, true}, {WK_I32, "i32", 4, true}, {WK_I64, "i64", 8, true}, {WK_U8, "u8", 1, true},
    {WK_U16, "u16", 2, false},
};
enum { COLUMN_DTYPE_COUNT = sizeof COLUMN_DTYPES / sizeof COLUMN_DTYPES[0] };

const char *wk_column_kind_name(uint32_t kind) { return kind < WK_COLUMN_KIND_COUNT ? KIND_NAMES[kind] : "?"; }

bool wk_column_kind_parse(const char *name, uint32_t *kind) {
  for (uint32_t k = 0; k < WK_COLUMN_KIND_COUNT; k++)
    if (strcmp(name, KIND_NAMES[k]) == 0) return *kind = k, true;
  return false;
}

int wk_column_kind_dtype(uint32_t kind) { return kind < WK_COLUMN_KIND_COUNT ? KIND_DTYPES[kind] : -1; }

const char *wk_column_dtype_name(uint32_t dtype) {
  for (int i = 0; i < COLUMN_DTYPE_COUNT; i++)
    if (COLUMN_DTYPES[i].dtype == dtype) return COLUMN_DTYPES[i].name;
  return NULL;
}

bool wk_column_dtype_parse(const char *name, uint32_t *dtype) {
  for (int i = 0; i < COLUMN_DTYPE_COUNT; i++)
    if (strcmp(name, COLUMN_DTYPES[i].name) == 0) return *dtype = COLUMN_DTYPES[i].dtype, true;
  return false;
}

bool wk_column_name_is_valid(const char *name, size_t length) {
  if (length == 0 || length >= WK_COLUMN_NAME_BYTES || (name[0] >= '0' && name[0] <= '9')) return false;
  for (size_t i = 0; i < length; i++) {
    char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

WkStatus wk_column_info_check(WkColumnInfo *info, const char *where) {
  size_t length = strnlen(info->name, WK_COLUMN_NAME_BYTES);
  if (length == WK_COLUMN_NAME_BYTES || !wk_column_name_is_valid(info->name, length))
    return BAD("%s: column name '%.*s' is not [A-Za-z_][A-Za-z0-9_]* of at most %d characters", where, (int)length,
               info->name, WK_COLUMN_NAME_BYTES - 1);
  if (info->kind == WK_COLUMN_TOKENS || info->kind >= WK_COLUMN_KIND_COUNT)
    return BAD("%s: column '%s' has kind %u, expected 1..%d (token_u8, i64, f32, tensor, bytes)", where, info->name,
               info->kind, WK_COLUMN_KIND_COUNT - 1);
  const char *kind = KIND_NAMES[info->kind];
  int want = KIND_DTYPES[info->kind];
  const char *dtype = wk_column_dtype_name(info->dtype);
  bool tensor = info->kind == WK_COLUMN_TENSOR;
  uint64_t bytes = 0;
  for (int i = 0; i < COLUMN_DTYPE_COUNT; i++)
    if (COLUMN_DTYPES[i].dtype == info->dtype && (tensor ? COLUMN_DTYPES[i].tensor : (int)info->dtype == want))
      bytes = COLUMN_DTYPES[i].bytes;
  if (!bytes)
    return BAD("%s: column '%s' (%s) holds dtype %s (%u), which a %s column cannot", where, info->name, kind,
               dtype ? dtype : "?", info->dtype, kind);
  if (tensor ? info->ndim < 1 || info->ndim > WK_COLUMN_MAX_DIMS : info->ndim != 0)
    return BAD("%s: column '%s' (%s) has %u dimensions, expected %s", where, info->name, kind, info->ndim,
               tensor ? "1..4" : "0");
  for (uint32_t d = 0; d < WK_COLUMN_MAX_DIMS; d++) {
    if (d < info->ndim ? info->shape[d] == 0 : info->shape[d] != 0)
      return BAD("%s: column '%s' (%s): dimension %u is %u, expected %s", where, info->name, kind, d, info->shape[d],
                 d < info->ndim ? "at least 1" : "0 past its dimensions");
    if (d < info->ndim) bytes *= info->shape[d];
    if (bytes > WK_SHARD_MAX_BLOCK_BYTES)
      return BAD("%s: column '%s' (%s) has records of more than %d bytes", where, info->name, kind,
                 WK_SHARD_MAX_BLOCK_BYTES);
  }
  info->element_bytes = info->kind == WK_COLUMN_BYTES ? 0 : bytes;
  return WK_OK;
}

WkBlockLayout wk_column_layout(const WkColumnInfo *info, const WkShardHeader *h) {
  WkBlockLayout l = {.column = info->name, .element_bytes = info->element_bytes, .align = 1};
  l.rows = info->kind == WK_COLUMN_TOKEN_U8 ? h->tokens : h->documents;
  if (info->kind == WK_COLUMN_TOKEN_U8) l.rows_per_block = h->block_tokens; /* the token blocks' positions */
  else if (info->kind == WK_COLUMN_BYTES) l.rows_per_block = 1;           /* the table is the blobs' offsets */
  else if (info->element_bytes) {
    uint64_t rows = WK_SHARD_COLUMN_BLOCK_BYTES / info->element_bytes;
    l.rows_per_block = rows ? (uint32_t)rows : 1;
  }
  uint64_t blocks = l.rows_per_block ? l.rows / l.rows_per_block + (l.rows % l.rows_per_block != 0) : 0;
  l.block_count = blocks > UINT32_MAX ? UINT32_MAX : (uint32_t)blocks;
  return l;
}

/* Offsets inside a column table entry (FORMAT.md has the table). */
enum {
  C_NAME = 0, C_KIND = 48, C_DTYPE = 52, C_NDIM = 56, C_SHAPE = 60, C_ROWS_PER_BLOCK = 76, C_BLOCK_COUNT = 80,
  C_RESERVED0 = 84, C_BLOCK_TABLE = 88, C_BLOCK_TABLE_HASH = 96, C_RESERVED1 = 104
};

void wk_column_entry_encode(const WkColumnEntry *c, uint8_t out[WK_SHARD_COLUMN_ENTRY_BYTES]) {
  memset(out, 0, WK_SHARD_COLUMN_ENTRY_BYTES);
  memcpy(out + C_NAME, c->info.name, strnlen(c->info.name, WK_COLUMN_NAME_BYTES - 1));
  put32(out + C_KIND, c->info.kind);
  put32(out + C_DTYPE, c->info.dtype);
  put32(out + C_NDIM, c->info.ndim);
  for (int d = 0; d < WK_COLUMN_MAX_DIMS; d++) put32(out + C_SHAPE + 4 * d, c->info.shape[d]);
  put32(out + C_ROWS_PER_BLOCK, c->layout.rows_per_block);
  put32(out + C_BLOCK_COUNT, c->layout.block_count);
  put64(out + C_BLOCK_TABLE, c->block_table_offset);
  put64(out + C_BLOCK_TABLE_HASH, c->block_table_hash);
}

static bool all_zero(const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i]) return false;
  return true;
}

WkStatus wk_column_entry_parse(const uint8_t *table, const WkShardHeader *h, uint32_t c, uint64_t expected_table,
                               const char *name, WkColumnEntry *out) {
  const uint8_t *p = table + (size_t)c * WK_SHARD_COLUMN_ENTRY_BYTES;
  memset(out, 0, sizeof *out);
  WkColumnInfo *info = &out->info;
  size_t length = strnlen((const char *)p + C_NAME, WK_COLUMN_NAME_BYTES);
  if (length == WK_COLUMN_NAME_BYTES || !all_zero(p + C_NAME + length, WK_COLUMN_NAME_BYTES - length))
    return BAD("shard '%s' column %u: its name is not NUL-terminated and zero-padded (" CORRUPT_HINT ")", name, c);
  memcpy(info->name, p + C_NAME, length);
  info->kind = get32(p + C_KIND);
  info->dtype = get32(p + C_DTYPE);
  info->ndim = get32(p + C_NDIM);
  for (int d = 0; d < WK_COLUMN_MAX_DIMS; d++) info->shape[d] = get32(p + C_SHAPE + 4 * d);
  char where[1100];
  snprintf(where, sizeof where, "shard '%s' column table", name);
  WK_TRY(wk_column_info_check(info, where));
  if (get32(p + C_RESERVED0) != 0 || !all_zero(p + C_RESERVED1, WK_SHARD_COLUMN_ENTRY_BYTES - C_RESERVED1))
    return BAD("shard '%s' column '%s': reserved bytes are not 0 (" CORRUPT_HINT ")", name, info->name);
  WkBlockLayout want = wk_column_layout(info, h);
  out->layout = want;
  out->layout.column = NULL; /* the caller points it at its own copy of the name */
  out->layout.rows_per_block = get32(p + C_ROWS_PER_BLOCK);
  out->layout.block_count = get32(p + C_BLOCK_COUNT);
  WkBlockLayout *l = &out->layout;
  /* Per-token columns cover the token blocks' positions, blobs are a block each; record columns choose
   * their block size, up to WK_SHARD_MAX_BLOCK_BYTES decoded. */
  bool fixed = info->kind == WK_COLUMN_TOKEN_U8 || info->kind == WK_COLUMN_BYTES;
  if (l->rows_per_block == 0 || (fixed && l->rows_per_block != want.rows_per_block) ||
      (uint64_t)l->rows_per_block * info->element_bytes > WK_SHARD_MAX_BLOCK_BYTES)
    return BAD("shard '%s' column '%s' (%s): %u rows per block, expected %s%u (" CORRUPT_HINT ")", name, info->name,
               KIND_NAMES[info->kind], l->rows_per_block, fixed ? "" : "1..",
               fixed ? want.rows_per_block : (uint32_t)(WK_SHARD_MAX_BLOCK_BYTES / info->element_bytes));
  uint64_t blocks = l->rows / l->rows_per_block + (l->rows % l->rows_per_block != 0);
  if (blocks != l->block_count)
    return BAD("shard '%s' column '%s' (%s): %u blocks, but %llu %s in blocks of %u need %llu (" CORRUPT_HINT ")",
               name, info->name, KIND_NAMES[info->kind], l->block_count, (unsigned long long)l->rows,
               info->kind == WK_COLUMN_TOKEN_U8 ? "tokens" : "records", l->rows_per_block,
               (unsigned long long)blocks);
  out->block_table_offset = get64(p + C_BLOCK_TABLE);
  out->block_table_hash = get64(p + C_BLOCK_TABLE_HASH);
  if (out->block_table_offset != expected_table ||
      (uint64_t)l->block_count * WK_SHARD_BLOCK_ENTRY_BYTES > h->file_bytes - expected_table)
    return BAD("shard '%s' column '%s': block table at %llu (%u entries), expected at %llu inside the file of %llu "
               "bytes (" CORRUPT_HINT ")",
               name, info->name, (unsigned long long)out->block_table_offset, l->block_count,
               (unsigned long long)expected_table, (unsigned long long)h->file_bytes);
  return WK_OK;
}

/* ---- document index ------------------------------------------------------------------------- */

WkStatus wk_doc_index_span(const WkShardHeader *h, const uint8_t *entry, const uint8_t *next_entry, uint64_t doc,
                           const char *name, uint64_t *start, uint64_t *length) {
  uint64_t s = get64(entry);
  uint64_t end = next_entry ? get64(next_entry) : h->tokens; /* exclusive, the EOS included */
  if ((doc == 0 && s != 0) || s >= end || end > h->tokens)
    return BAD("shard '%s' document %llu: span [%llu, %llu) is not inside the %llu-token stream in order "
               "(" CORRUPT_HINT ")",
               name, (unsigned long long)doc, (unsigned long long)s, (unsigned long long)end,
               (unsigned long long)h->tokens);
  *start = s;
  *length = end - s - 1;
  return WK_OK;
}

/* ---- a verified shard through a blob ------------------------------------------------- */

/* The document index's checksum, over the mapping, or over `tail` (the block table and document index
 * read in one piece from a blob that cannot map: one request for a remote shard). */
static WkStatus check_doc_index(WkShardView *v, const uint8_t *tail) {
  const WkShardHeader *h = &v->h;
  uint64_t length = h->documents * WK_SHARD_DOC_ENTRY_BYTES;
  const uint8_t *mapped = length && !tail ? v->blob->map(v->blob, h->doc_index_offset, (size_t)length) : NULL;
  if (mapped) v->doc_index = mapped;
  /* Not kept from the tail: entries are read on demand (a remote blob serves them from its cached tail). */
  const uint8_t *bytes = tail ? tail + (h->doc_index_offset - h->block_table_offset) : mapped;
  if (length > 0 && !bytes) {
    uint8_t *copy = wk_malloc((size_t)length, "document index");
    if (!copy) return wk_last_status();
    WkStatus status = v->blob->read_at(v->blob, h->doc_index_offset, (size_t)length, copy);
    uint64_t hash = wk_hash64(copy, (size_t)length);
    free(copy);
    WK_TRY(status);
    if (hash != h->doc_index_hash)
      return BAD("shard '%s' document index: checksum 0x%016llx != 0x%016llx (" CORRUPT_HINT ")", v->name,
                 (unsigned long long)hash, (unsigned long long)h->doc_index_hash);
    return WK_OK;
  }
  uint64_t hash = wk_hash64(bytes, (size_t)length);
  if (hash != h->doc_index_hash)
    return BAD("shard '%s' document index: checksum 0x%016llx != 0x%016llx (" CORRUPT_HINT ")", v->name,
               (unsigned long long)hash, (unsigned long long)h->doc_index_hash);
  return WK_OK;
}

/* Bytes [offset, offset + length) of the shard: in the mapping, in `tail` (bytes from block_table_offset
 * on, already read, freed when the view is open: copied into *copy when `keep`), or read into *copy. */
static const uint8_t *view_bytes(WkShardView *v, const uint8_t *tail, uint64_t offset, size_t length, bool keep,
                                 uint8_t **copy) {
  *copy = NULL;
  if (tail && !keep) return tail + (offset - v->h.block_table_offset);
  const uint8_t *mapped = length && !tail ? v->blob->map(v->blob, offset, length) : NULL;
  if (mapped || !length) return mapped ? mapped : (const uint8_t *)"";
  *copy = wk_malloc(length, "shard tables");
  if (*copy && tail) memcpy(*copy, tail + (offset - v->h.block_table_offset), length);
  else if (*copy && v->blob->read_at(v->blob, offset, length, *copy) != WK_OK) {
    free(*copy);
    *copy = NULL;
  }
  return *copy;
}

/* Version 2: the column table (its checksum, each entry, names unique), then each column's block table
 * (checksum, every entry in bounds); the tables must tile the file's end. */
static WkStatus open_columns(WkShardView *v, const uint8_t *tail) {
  const WkShardHeader *h = &v->h;
  if (h->column_count == 0) return WK_OK;
  size_t table_bytes = (size_t)h->column_count * WK_SHARD_COLUMN_ENTRY_BYTES;
  uint8_t *table_copy;
  const uint8_t *table = view_bytes(v, tail, h->column_table_offset, table_bytes, false, &table_copy);
  if (!table) return wk_last_status();
  WkStatus status = WK_OK;
  uint64_t hash = wk_hash64(table, table_bytes);
  if (hash != h->column_table_hash)
    status = BAD("shard '%s' column table: checksum 0x%016llx != 0x%016llx (" CORRUPT_HINT ")", v->name,
                 (unsigned long long)hash, (unsigned long long)h->column_table_hash);
  v->columns = status == WK_OK ? wk_calloc(h->column_count, sizeof *v->columns, "shard columns") : NULL;
  v->column_tables = v->columns ? wk_calloc(h->column_count, sizeof *v->column_tables, "column tables") : NULL;
  if (status == WK_OK && !v->column_tables) status = WK_ERR_NOMEM;
  uint64_t at = h->column_table_offset + table_bytes;
  for (uint32_t c = 0; c < h->column_count && status == WK_OK; c++) {
    WkColumnEntry *col = &v->columns[c];
    status = wk_column_entry_parse(table, h, c, at, v->name, col);
    if (status != WK_OK) break;
    col->layout.column = col->info.name;
    v->column_count = c + 1;
    for (uint32_t o = 0; o <= c && status == WK_OK; o++)
      if (strcmp(col->info.name, o < c ? v->columns[o].info.name : "tokens") == 0)
        status = BAD("shard '%s': two columns are named '%s' (" CORRUPT_HINT ")", v->name, col->info.name);
    at += (uint64_t)col->layout.block_count * WK_SHARD_BLOCK_ENTRY_BYTES;
  }
  free(table_copy);
  if (status == WK_OK && at != h->file_bytes)
    status = BAD("shard '%s': the column block tables end at %llu, not at the end of the file (%llu) (" CORRUPT_HINT
                 ")",
                 v->name, (unsigned long long)at, (unsigned long long)h->file_bytes);
  if (status != WK_OK) return status;
  uint64_t first = h->column_table_offset + table_bytes;
  const uint8_t *tables = view_bytes(v, tail, first, (size_t)(h->file_bytes - first), true, &v->tables_copy);
  if (!tables) return wk_last_status();
  for (uint32_t c = 0; c < v->column_count && status == WK_OK; c++) {
    const WkColumnEntry *col = &v->columns[c];
    const uint8_t *t = v->column_tables[c] = tables + (col->block_table_offset - first);
    uint64_t t_hash = wk_hash64(t, (size_t)col->layout.block_count * WK_SHARD_BLOCK_ENTRY_BYTES);
    if (t_hash != col->block_table_hash)
      status = BAD("shard '%s' column '%s' block table: checksum 0x%016llx != 0x%016llx (" CORRUPT_HINT ")", v->name,
                   col->info.name, (unsigned long long)t_hash, (unsigned long long)col->block_table_hash);
    for (uint32_t b = 0; status == WK_OK && b < col->layout.block_count; b++) {
      WkBlockEntry e;
      status = wk_layout_entry_parse(t, h, &col->layout, b, v->name, &e);
    }
  }
  return status;
}

WkStatus wk_shard_view_open(WkBlob *blob, const char *name, WkShardView *v) {
  memset(v, 0, sizeof *v);
  v->blob = blob;
  v->name = name;
  uint8_t header[WK_SHARD_HEADER_BYTES];
  if (blob->size < WK_SHARD_HEADER_BYTES)
    return BAD("shard '%s': %llu bytes, shorter than the %d-byte header (" CORRUPT_HINT ")", name,
               (unsigned long long)blob->size, WK_SHARD_HEADER_BYTES);
  WK_TRY(blob->read_at(blob, 0, sizeof header, header));
  WK_TRY(wk_shard_header_parse(header, sizeof header, blob->size, name, &v->h));
  const WkShardHeader *h = &v->h;
  size_t table_bytes = (size_t)h->block_count * WK_SHARD_BLOCK_ENTRY_BYTES;
  v->table = table_bytes ? blob->map(blob, h->block_table_offset, table_bytes) : NULL;
  uint8_t *tail = NULL;
  if (!v->table) { /* block table and document index in one read, the table kept */
    size_t tail_bytes = (size_t)(blob->size - h->block_table_offset);
    tail = wk_malloc(tail_bytes ? tail_bytes : 1, "block table and document index");
    if (!tail) return WK_ERR_NOMEM;
    WkStatus status = blob->read_at(blob, h->block_table_offset, tail_bytes, tail);
    if (status != WK_OK) {
      free(tail);
      return status;
    }
    v->table_copy = wk_malloc(table_bytes ? table_bytes : 1, "block table");
    if (!v->table_copy) {
      free(tail);
      return WK_ERR_NOMEM;
    }
    memcpy(v->table_copy, tail, table_bytes);
    v->table = v->table_copy;
  }
  WkStatus status = WK_OK;
  uint64_t table_hash = wk_hash64(v->table, table_bytes);
  if (table_hash != h->block_table_hash)
    status = BAD("shard '%s' block table: checksum 0x%016llx != 0x%016llx (" CORRUPT_HINT ")", name,
                 (unsigned long long)table_hash, (unsigned long long)h->block_table_hash);
  for (uint32_t b = 0; status == WK_OK && b < h->block_count; b++) {
    WkBlockEntry e;
    status = wk_block_entry_parse(v->table, h, b, name, &e);
  }
  if (status == WK_OK) status = check_doc_index(v, tail);
  if (status == WK_OK) status = open_columns(v, tail);
  free(tail);
  if (status != WK_OK) wk_shard_view_release(v);
  return status;
}

void wk_shard_view_release(WkShardView *v) {
  free(v->table_copy);
  free(v->tables_copy);
  free(v->columns);
  free(v->column_tables);
  v->tables_copy = NULL;
  v->columns = NULL;
  v->column_tables = NULL;
  v->column_count = 0;
  v->table_copy = NULL;
  v->table = NULL;
  v->doc_index = NULL;
}

static WkStatus view_stored(const WkShardView *v, const uint8_t *table, const WkBlockLayout *l, uint32_t b,
                            WkBlockEntry *e, const uint8_t **stored, uint8_t **copy) {
  *copy = NULL;
  if (b >= l->block_count)
    return WK_FAIL(WK_ERR_INVALID_ARG, "%s out of range (it has %u)", block_where(v->name, l, b).text, l->block_count);
  WK_TRY(wk_layout_entry_parse(table, &v->h, l, b, v->name, e));
  *stored = e->stored_bytes ? v->blob->map(v->blob, e->offset, e->stored_bytes) : (const uint8_t *)""; /* an empty blob */
  if (*stored) return WK_OK;
  *copy = wk_malloc(e->stored_bytes, "stored block");
  if (!*copy) return WK_ERR_NOMEM;
  WkStatus status = v->blob->read_at(v->blob, e->offset, e->stored_bytes, *copy);
  if (status != WK_OK) {
    free(*copy);
    *copy = NULL;
    return status;
  }
  *stored = *copy;
  return WK_OK;
}

WkStatus wk_shard_view_stored(const WkShardView *v, uint32_t b, WkBlockEntry *e, const uint8_t **stored,
                              uint8_t **copy) {
  WkBlockLayout l = wk_shard_token_layout(&v->h);
  return view_stored(v, v->table, &l, b, e, stored, copy);
}

WkStatus wk_shard_view_column_stored(const WkShardView *v, uint32_t c, uint32_t b, WkBlockEntry *e,
                                     const uint8_t **stored, uint8_t **copy) {
  *copy = NULL;
  if (c >= v->column_count)
    return WK_FAIL(WK_ERR_INVALID_ARG, "shard '%s': column %u out of range (it has %u)", v->name, c, v->column_count);
  return view_stored(v, v->column_tables[c], &v->columns[c].layout, b, e, stored, copy);
}

WkStatus wk_shard_view_document(const WkShardView *v, uint64_t doc, uint64_t *start, uint64_t *length) {
  if (doc >= v->h.documents)
    return WK_FAIL(WK_ERR_INVALID_ARG, "shard '%s': document %llu out of range (it has %llu)", v->name,
                   (unsigned long long)doc, (unsigned long long)v->h.documents);
  uint8_t entries[2 * WK_SHARD_DOC_ENTRY_BYTES];
  bool last = doc + 1 == v->h.documents;
  const uint8_t *p = v->doc_index ? v->doc_index + doc * WK_SHARD_DOC_ENTRY_BYTES : NULL;
  if (!p) {
    size_t n = last ? WK_SHARD_DOC_ENTRY_BYTES : 2 * WK_SHARD_DOC_ENTRY_BYTES;
    WK_TRY(v->blob->read_at(v->blob, v->h.doc_index_offset + doc * WK_SHARD_DOC_ENTRY_BYTES, n, entries));
    p = entries;
  }
  return wk_doc_index_span(&v->h, p, last ? NULL : p + WK_SHARD_DOC_ENTRY_BYTES, doc, v->name, start, length);
}

/* ---- tokens ------------------------------------------------------------------------------------ */

/* One loop per (stored, output) width pair, each a plain typed loop the compiler vectorizes (memcpy
 * keeps the loads alignment-free); stored tokens are little-endian, as the host order is checked to be. */
#define WIDEN(FROM, TO)                                       \
  for (size_t i = 0; i < count; i++) {                        \
    FROM v;                                                   \
    memcpy(&v, (const uint8_t *)src + sizeof(FROM) * i, sizeof v); \
    ((TO *)dst)[i] = (TO)v;                                   \
  }

/* The loops are vectorized (-O3: SSE2 unpacks) and wait on their loads: a loader row is ~2 KB from a
 * random place of a node cache far larger than the caches, and the hardware prefetcher ramps up over
 * its first lines. Asking for every line of a row first lets their misses overlap (-20% time a token,
 * measured on 2 KB rows of a 64 MiB buffer). */
static void prefetch_lines(const void *src, size_t bytes) {
  enum { LINE = 64, MAX_PREFETCH_BYTES = 16384 };
  if (bytes > MAX_PREFETCH_BYTES) bytes = MAX_PREFETCH_BYTES; /* longer runs stream on their own */
  for (size_t at = 0; at < bytes; at += LINE) __builtin_prefetch((const uint8_t *)src + at);
}

void wk_tokens_widen(const void *src, uint32_t token_bytes, size_t count, void *dst, uint32_t dst_bytes) {
  _Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "stored tokens are little-endian: add a swapping path");
  if (token_bytes == 4 && dst_bytes == 4) {
    memcpy(dst, src, count * 4);
    return;
  }
  prefetch_lines(src, count * token_bytes);
  if (token_bytes == 2 && dst_bytes == 4) WIDEN(uint16_t, uint32_t)
  else if (token_bytes == 2) WIDEN(uint16_t, uint64_t)
  else WIDEN(uint32_t, uint64_t)
}
#undef WIDEN
