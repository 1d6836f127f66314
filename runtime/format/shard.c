/*
 * shard.c — reading the shard format: header, block table and document index validation,
 * block checksums and decoding, and the "view" that does all of it through a WkBlob. No
 * files, locks or caches here (only a per-thread zstd context), so the fuzz target drives exactly
 * the code the dataset reader runs.
 *
 * Every check that can fail names the shard, the block or document, and the reason, with a hint
 * (the format is in FORMAT.md).
 */
#include <pthread.h>
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
  H_EOS = 64, H_RESERVED0 = 68, H_PAYLOAD = 72, H_BLOCK_TABLE = 80, H_DOC_INDEX = 88, H_BLOCK_TABLE_HASH = 96,
  H_DOC_INDEX_HASH = 104, H_RESERVED1 = 112, H_HEADER_HASH = 120
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
  if (h->payload_offset != WK_SHARD_HEADER_BYTES || h->block_table_offset < h->payload_offset ||
      h->block_table_offset > file_size ||
      (uint64_t)h->block_count * WK_SHARD_BLOCK_ENTRY_BYTES != h->doc_index_offset - h->block_table_offset ||
      h->doc_index_offset < h->block_table_offset || h->doc_index_offset > file_size ||
      h->documents > (file_size - h->doc_index_offset) / WK_SHARD_DOC_ENTRY_BYTES ||
      h->doc_index_offset + h->documents * WK_SHARD_DOC_ENTRY_BYTES != file_size)
    return BAD("shard '%s': sections (payload %llu, block table %llu, document index %llu, end %llu) do not tile "
               "the file (" CORRUPT_HINT ")",
               name, (unsigned long long)h->payload_offset, (unsigned long long)h->block_table_offset,
               (unsigned long long)h->doc_index_offset, (unsigned long long)file_size);
  return WK_OK;
}

/* ---- block table ---------------------------------------------------------------------------- */

void wk_block_entry_encode(const WkBlockEntry *e, uint8_t out[WK_SHARD_BLOCK_ENTRY_BYTES]) {
  put64(out, e->offset);
  put32(out + 8, e->stored_bytes);
  put32(out + 12, e->codec);
  put64(out + 16, e->hash);
}

uint32_t wk_block_token_count(const WkShardHeader *h, uint32_t block) {
  uint64_t first = (uint64_t)block * h->block_tokens;
  uint64_t left = h->tokens > first ? h->tokens - first : 0;
  return left < h->block_tokens ? (uint32_t)left : h->block_tokens;
}

WkStatus wk_block_entry_parse(const uint8_t *table, const WkShardHeader *h, uint32_t block, const char *name,
                              WkBlockEntry *e) {
  const uint8_t *p = table + (size_t)block * WK_SHARD_BLOCK_ENTRY_BYTES;
  e->offset = get64(p);
  e->stored_bytes = get32(p + 8);
  e->codec = get32(p + 12);
  e->hash = get64(p + 16);
  uint64_t decoded = (uint64_t)wk_block_token_count(h, block) * h->token_bytes;
  if (e->offset < h->payload_offset || e->offset > h->block_table_offset ||
      e->stored_bytes > h->block_table_offset - e->offset)
    return BAD("shard '%s' block %u: stored at [%llu, +%u) outside the payload [%llu, %llu) (" CORRUPT_HINT ")", name,
               block, (unsigned long long)e->offset, e->stored_bytes, (unsigned long long)h->payload_offset,
               (unsigned long long)h->block_table_offset);
  if (e->codec == WK_CODEC_RAW) {
    if (e->stored_bytes != decoded)
      return BAD("shard '%s' block %u: raw block of %u bytes, expected %llu (" CORRUPT_HINT ")", name, block,
                 e->stored_bytes, (unsigned long long)decoded);
    if (e->offset % h->token_bytes != 0)
      return BAD("shard '%s' block %u: raw block at unaligned offset %llu (" CORRUPT_HINT ")", name, block,
                 (unsigned long long)e->offset);
  } else if (e->codec == WK_CODEC_ZSTD) {
    if (e->stored_bytes == 0 || e->stored_bytes > ZSTD_compressBound((size_t)decoded))
      return BAD("shard '%s' block %u: zstd block of %u bytes for %llu decoded bytes (" CORRUPT_HINT ")", name,
                 block, e->stored_bytes, (unsigned long long)decoded);
  } else {
    return BAD("shard '%s' block %u: unknown codec %u (" CORRUPT_HINT ")", name, block, e->codec);
  }
  return WK_OK;
}

/* ---- blocks --------------------------------------------------------------------------------- */

WkStatus wk_block_verify(const WkBlockEntry *e, uint32_t block, const void *stored, const char *name) {
  uint64_t actual = wk_hash64(stored, e->stored_bytes);
  if (actual != e->hash)
    return BAD("shard '%s' block %u: checksum 0x%016llx != 0x%016llx (" CORRUPT_HINT ")", name, block,
               (unsigned long long)actual, (unsigned long long)e->hash);
  return WK_OK;
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

WkStatus wk_block_decode(const WkShardHeader *h, const WkBlockEntry *e, uint32_t block, const void *stored,
                         void *dst, const char *name) {
  WK_TRY(wk_block_verify(e, block, stored, name));
  size_t decoded = (size_t)wk_block_token_count(h, block) * h->token_bytes;
  if (e->codec == WK_CODEC_RAW) {
    memcpy(dst, stored, decoded);
    return WK_OK;
  }
  unsigned long long content = ZSTD_getFrameContentSize(stored, e->stored_bytes);
  if (content != decoded)
    return BAD("shard '%s' block %u: zstd frame holds %lld bytes, expected %zu (" CORRUPT_HINT ")", name, block,
               content == ZSTD_CONTENTSIZE_UNKNOWN || content == ZSTD_CONTENTSIZE_ERROR ? -1LL : (long long)content,
               decoded);
  ZSTD_DCtx *dctx = thread_dctx();
  if (!dctx) return wk_last_status();
  size_t n = ZSTD_decompressDCtx(dctx, dst, decoded, stored, e->stored_bytes);
  if (ZSTD_isError(n))
    return BAD("shard '%s' block %u: zstd: %s (" CORRUPT_HINT ")", name, block, ZSTD_getErrorName(n));
  if (n != decoded)
    return BAD("shard '%s' block %u: decoded %zu bytes, expected %zu (" CORRUPT_HINT ")", name, block, n, decoded);
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
  free(tail);
  if (status != WK_OK) wk_shard_view_release(v);
  return status;
}

void wk_shard_view_release(WkShardView *v) {
  free(v->table_copy);
  v->table_copy = NULL;
  v->table = NULL;
  v->doc_index = NULL;
}

WkStatus wk_shard_view_stored(const WkShardView *v, uint32_t b, WkBlockEntry *e, const uint8_t **stored,
                              uint8_t **copy) {
  *copy = NULL;
  if (b >= v->h.block_count)
    return WK_FAIL(WK_ERR_INVALID_ARG, "shard '%s': block %u out of range (it has %u)", v->name, b, v->h.block_count);
  WK_TRY(wk_block_entry_parse(v->table, &v->h, b, v->name, e));
  *stored = v->blob->map(v->blob, e->offset, e->stored_bytes);
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
