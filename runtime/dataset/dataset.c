/*
 * dataset.c — WkDataset: an opened index.json with lazily opened shards, and token reads by
 * (shard, offset) that verify and decode every block they touch.
 *
 * Opening parses the index only. A shard is opened at its first use: header, block table and
 * document index are read, checked against the index and against their checksums; then its raw
 * blocks are read straight from the file mapping (each block's checksum verified once), zstd blocks
 * are decoded into the bounded block cache (cache.c). At most WK_DATASET_MAX_OPEN_SHARDS shards stay
 * open; the least recently used unpinned one is closed when another opens. So memory is bounded by
 * configuration (open shards' block tables + the cache budget), never by the dataset's size.
 *
 * Remote datasets (http://, https://, s3://) open their index and shards through a remote context
 * (remote/remote.h): the index through the node's disk cache (its hash names the dataset there), each
 * shard as a blob of the size the index gives, cached under data/<index hash>/<shard number>. A block
 * (or a shard's header and tables) whose checksum fails on a remote blob is forgotten and read once
 * more, then reported with its URL and offset.
 *
 * Thread safety: one mutex guards the table of open shards (held only for pointer updates); shard
 * state is immutable once open, pinned by readers while they use it; the cache has its own lock.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../format/index.h"
#include "../format/shard.h"
#include "../io/remote/remote.h"
#include "cache.h"

enum {
  OPENER_THREADS_MAX = 8,    /* remote shards opened at once for read-ahead (two round trips each) */
  ADVICE_QUEUE = 4096,       /* read-ahead waiting for its shard to open; more is dropped (a hint) */
  MAX_INDEX_BYTES = 1 << 30,
  SHARD_KEY_CAPACITY = 128,  /* "data/<32 hex>/<shard number>" */
};

static const WkParamSpec PARAM_SPECS[WK_DATASET_PARAM_COUNT] = {
    [WK_DATASET_BLOCK_CACHE_BYTES] = {0, INT64_MAX, 64 << 20, "block_cache_bytes"},
    [WK_DATASET_MAX_OPEN_SHARDS] = {1, 1 << 20, 64, "max_open_shards"},
};
static const WkParamTable PARAMS = {"dataset", PARAM_SPECS, WK_DATASET_PARAM_COUNT};

typedef struct {
  WkBlob *blob;
  char *path;
  WkShardView v;            /* header, block table, document index: verified at open */
  atomic_uchar *verified;   /* per block: raw block checksum already verified; the tokens' blocks, then each
                               column's from verified_base[column] */
  uint64_t verified_base[WK_MAX_COLUMNS];
  uint32_t pins;
  uint64_t last_use;
} Shard;

struct WkDataset {
  char *path;  /* as given */
  char *dir;   /* the directory shard names are relative to */
  WkIndex index;
  pthread_mutex_t lock;
  Shard **shards;      /* index.shard_count slots, NULL when closed */
  uint32_t *open;      /* indices of open shards */
  uint32_t open_count, open_capacity;
  int64_t max_open;
  uint64_t tick;
  WkBlockCache *cache;
  int64_t cache_budget;
  uint32_t block_tokens;   /* of the first shard opened; every other shard must agree */
  atomic_uint_fast64_t blocks_decoded, blocks_verified;
  WkRemote *remote;        /* NULL for a local dataset */
  char identity[33];       /* a remote index's hash: its shards' directory in the cache */
  WkQueue *advice;         /* read-ahead of remote shards not open yet (started at the first) */
  pthread_t openers[OPENER_THREADS_MAX];
  uint32_t opener_count, opener_limit; /* started; at most: max_transfers, capped (more only queue) */
};

/* ---- opening the index ------------------------------------------------------------------------ */

static char *join_path(const char *dir, const char *name) {
  if (wk_blob_is_remote(dir)) return wk_url_join(dir, name); /* names percent-encoded */
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = wk_malloc(n, "path");
  if (p) snprintf(p, n, "%s/%s", dir, name);
  return p;
}

static WkStatus read_whole(const char *path, char **out, size_t *length) {
  WkBlob *blob = wk_blob_open(path);
  if (!blob) return wk_last_status();
  WkStatus status = WK_OK;
  if (blob->size > MAX_INDEX_BYTES) {
    status = WK_FAIL(WK_ERR_FORMAT, "index '%s' is %llu bytes, more than the %d an index may have", path,
                     (unsigned long long)blob->size, MAX_INDEX_BYTES);
  } else {
    *out = wk_malloc((size_t)blob->size + 1, "index text");
    if (!*out) status = WK_ERR_NOMEM;
    else status = blob->read_at(blob, 0, (size_t)blob->size, *out);
    if (status == WK_OK) {
      (*out)[blob->size] = '\0';
      *length = (size_t)blob->size;
    } else {
      free(*out);
      *out = NULL;
    }
  }
  blob->close(blob);
  return status;
}

WkDataset *wk_dataset_open(const char *path) { return wk_dataset_open_with(path, NULL); }

static WkStatus read_index(WkDataset *ds, const char *index_path, const WkRemoteOptions *remote, char **text,
                           size_t *length) {
  if (!wk_blob_is_remote(index_path)) return read_whole(index_path, text, length);
  WK_TRY(wk_remote_open(remote, &ds->remote));
  WkRemoteOptions defaults;
  wk_remote_options_default(&defaults);
  const WkRemoteOptions *o = remote ? remote : &defaults;
  /* No prefetch budget, no read-ahead: the openers would open shards only for the blob to drop it. */
  int64_t openers = o->prefetch_bytes == 0 ? 0 : o->max_transfers;
  ds->opener_limit = openers < OPENER_THREADS_MAX ? (uint32_t)openers : OPENER_THREADS_MAX;
  return wk_remote_fetch_index(ds->remote, index_path, MAX_INDEX_BYTES, text, length, ds->identity);
}

WkDataset *wk_dataset_open_with(const char *path, const WkRemoteOptions *remote) {
  if (!path) {
    WK_FAIL(WK_ERR_INVALID_ARG, "wk_dataset_open: path is NULL");
    return NULL;
  }
  const char *given = path;
  if (strncmp(path, "file://", 7) == 0) path += 7;
  WkDataset *ds = wk_calloc(1, sizeof *ds, "dataset");
  if (!ds) return NULL;
  pthread_mutex_init(&ds->lock, NULL);
  ds->max_open = PARAM_SPECS[WK_DATASET_MAX_OPEN_SHARDS].fallback;
  ds->cache_budget = PARAM_SPECS[WK_DATASET_BLOCK_CACHE_BYTES].fallback;
  ds->path = strdup(given);
  struct stat st;
  char *index_path = NULL;
  size_t length = strlen(path);
  bool is_index = length >= 5 && strcmp(path + length - 5, ".json") == 0;
  bool is_dir = wk_blob_is_remote(path) ? !is_index : stat(path, &st) == 0 && S_ISDIR(st.st_mode);
  if (is_dir) {
    ds->dir = strdup(path);
    index_path = join_path(path, "index.json");
  } else {
    const char *slash = strrchr(path, '/');
    ds->dir = slash ? strndup(path, (size_t)(slash - path + (slash == path))) : strdup(".");
    index_path = strdup(path);
  }
  char *text = NULL;
  size_t text_length = 0;
  ds->cache = wk_cache_new((uint64_t)ds->cache_budget);
  if (!ds->path || !ds->dir || !index_path || !ds->cache) {
    if (wk_last_status() != WK_ERR_NOMEM) WK_FAIL(WK_ERR_NOMEM, "out of memory opening dataset '%s'", path);
    goto fail;
  }
  if (read_index(ds, index_path, remote, &text, &text_length) != WK_OK) {
    wk_error_context("dataset '%s'", given);
    goto fail;
  }
  if (wk_index_parse(text, text_length, index_path, &ds->index) != WK_OK) goto fail;
  ds->shards = wk_calloc(ds->index.shard_count, sizeof *ds->shards, "shard table");
  if (!ds->shards) goto fail;
  free(text);
  free(index_path);
  return ds;
fail:
  free(text);
  free(index_path);
  wk_dataset_close(ds);
  return NULL;
}

/* ---- shards ------------------------------------------------------------------------------------- */

static void shard_close(Shard *s) {
  if (!s) return;
  wk_shard_view_release(&s->v);
  if (s->blob) s->blob->close(s->blob);
  free(s->verified);
  free(s->path);
  free(s);
}

/* "tokens, loss_mask:token_u8, emb:tensor(f32[4,8])": columns for a message. */
static void describe_columns(char *out, size_t size, const WkColumnInfo *const *infos, uint32_t count) {
  size_t at = 0;
  out[0] = '\0';
  for (uint32_t c = 0; c < count && at < size; c++) {
    const WkColumnInfo *info = infos[c];
    at += (size_t)snprintf(out + at, size - at, "%s%s%s%s", c ? ", " : "", info->name, c ? ":" : "",
                           c ? wk_column_kind_name(info->kind) : "");
    if (info->kind == WK_COLUMN_TENSOR && at < size) {
      const char *dtype = wk_column_dtype_name(info->dtype);
      at += (size_t)snprintf(out + at, size - at, "(%s", dtype ? dtype : "?");
      for (uint32_t d = 0; d < info->ndim && at < size; d++)
        at += (size_t)snprintf(out + at, size - at, "%s%u", d ? "," : "[", info->shape[d]);
      if (at < size) at += (size_t)snprintf(out + at, size - at, "])");
    }
  }
}

static bool same_column(const WkColumnInfo *a, const WkColumnInfo *b) {
  return strcmp(a->name, b->name) == 0 && a->kind == b->kind && a->dtype == b->dtype && a->ndim == b->ndim &&
         memcmp(a->shape, b->shape, sizeof a->shape) == 0;
}

/* True (with the error set) when the shard's columns are not the index's, in order. */
static bool columns_disagree(WkDataset *ds, Shard *s) {
  const WkIndex *ix = &ds->index;
  bool same = s->v.column_count + 1 == ix->column_count;
  for (uint32_t c = 0; same && c < s->v.column_count; c++) same = same_column(&s->v.columns[c].info, &ix->columns[c + 1]);
  if (same) return false;
  const WkColumnInfo *ours[WK_MAX_COLUMNS], *theirs[WK_MAX_COLUMNS];
  for (uint32_t c = 0; c < ix->column_count; c++) theirs[c] = &ix->columns[c];
  ours[0] = &ix->columns[0];
  for (uint32_t c = 0; c < s->v.column_count; c++) ours[c + 1] = &s->v.columns[c].info;
  char a[1024], b[1024];
  describe_columns(a, sizeof a, ours, s->v.column_count + 1);
  describe_columns(b, sizeof b, theirs, ix->column_count);
  WK_FAIL(WK_ERR_FORMAT,
          "shard '%s' has the columns (%s) but the index says (%s) (shards of different datasets mixed, or a stale "
          "index; re-run the converter)",
          s->path, a, b);
  return true;
}

static WkStatus shard_open(WkDataset *ds, uint32_t i, Shard **out) {
  const WkIndexShard *ix = &ds->index.shards[i];
  Shard *s = wk_calloc(1, sizeof *s, "shard");
  if (!s) return WK_ERR_NOMEM;
  WkStatus status = WK_OK;
  s->path = join_path(ds->dir, ix->name);
  if (!s->path) { status = WK_ERR_NOMEM; goto fail; }
  char key[SHARD_KEY_CAPACITY];
  snprintf(key, sizeof key, "data/%s/%u", ds->identity, i);
  s->blob = ds->remote ? wk_remote_blob_open(ds->remote, s->path, ix->bytes, key) : wk_blob_open(s->path);
  if (!s->blob) { status = wk_error_context("dataset '%s'", ds->path); goto fail; }
  if (s->blob->size != ix->bytes) {
    status = WK_FAIL(WK_ERR_FORMAT,
                     "shard '%s': the index says %llu bytes but the file has %llu (truncated, replaced, or a stale "
                     "index; re-run the converter or delete it from the cache)",
                     s->path, (unsigned long long)ix->bytes, (unsigned long long)s->blob->size);
    goto fail;
  }
  status = wk_shard_view_open(s->blob, s->path, &s->v);
  if (status == WK_ERR_FORMAT && s->blob->forget) { /* a remote copy: fetch header and tables anew, once */
    wk_logf(WK_LOG_WARN, "%s; fetching it again", wk_last_error());
    s->blob->forget(s->blob, 0, s->blob->size);
    status = wk_shard_view_open(s->blob, s->path, &s->v);
    if (status == WK_ERR_FORMAT)
      wk_error_context("corrupt on the server (also when fetched anew: re-upload the shard)");
  }
  if (status != WK_OK) goto fail;
  const WkShardHeader *h = &s->v.h;
  if (h->header_hash != ix->checksum || h->tokens != ix->tokens || h->documents != ix->documents) {
    status = WK_FAIL(WK_ERR_FORMAT,
                     "shard '%s' disagrees with the index: header checksum 0x%016llx, %llu tokens, %llu documents; "
                     "index: 0x%016llx, %llu tokens, %llu documents (shard replaced or index stale; re-run the "
                     "converter)",
                     s->path, (unsigned long long)h->header_hash, (unsigned long long)h->tokens,
                     (unsigned long long)h->documents, (unsigned long long)ix->checksum,
                     (unsigned long long)ix->tokens, (unsigned long long)ix->documents);
    goto fail;
  }
  if (h->token_bytes != ds->index.token_bytes || h->vocab_size != ds->index.vocab_size || h->eos != ds->index.eos) {
    status = WK_FAIL(WK_ERR_FORMAT,
                     "shard '%s': %u-byte tokens, vocabulary %u, EOS %u, but the index says %u, %u, %u (shards of "
                     "different datasets mixed?)",
                     s->path, h->token_bytes, h->vocab_size, h->eos, ds->index.token_bytes, ds->index.vocab_size,
                     ds->index.eos);
    goto fail;
  }
  if (columns_disagree(ds, s)) {
    status = wk_last_status();
    goto fail;
  }
  uint64_t flags = h->block_count;
  for (uint32_t c = 0; c < s->v.column_count; c++) {
    s->verified_base[c + 1] = flags;
    flags += s->v.columns[c].layout.block_count;
  }
  s->verified = wk_calloc(flags ? flags : 1, sizeof *s->verified, "verified-block flags");
  if (!s->verified) { status = WK_ERR_NOMEM; goto fail; }
  *out = s;
  return WK_OK;
fail:
  shard_close(s);
  return status;
}

/* Closes least recently used unpinned shards until the limit holds. Lock held. */
static void evict_shards(WkDataset *ds) {
  while (ds->open_count > (uint32_t)ds->max_open) {
    uint32_t victim = UINT32_MAX;
    for (uint32_t k = 0; k < ds->open_count; k++) {
      Shard *s = ds->shards[ds->open[k]];
      if (s->pins == 0 && (victim == UINT32_MAX || s->last_use < ds->shards[ds->open[victim]]->last_use)) victim = k;
    }
    if (victim == UINT32_MAX) return; /* all pinned: readers hold them; retried at the next release */
    uint32_t index = ds->open[victim];
    shard_close(ds->shards[index]);
    ds->shards[index] = NULL;
    ds->open[victim] = ds->open[--ds->open_count];
  }
}

static WkStatus shard_acquire(WkDataset *ds, uint32_t i, Shard **out) {
  if (i >= ds->index.shard_count)
    return WK_FAIL(WK_ERR_INVALID_ARG, "dataset '%s': shard %u out of range (it has %u)", ds->path, i,
                   ds->index.shard_count);
  pthread_mutex_lock(&ds->lock);
  Shard *s = ds->shards[i];
  if (s) {
    s->pins++;
    s->last_use = ++ds->tick;
    pthread_mutex_unlock(&ds->lock);
    *out = s;
    return WK_OK;
  }
  pthread_mutex_unlock(&ds->lock);

  Shard *fresh = NULL;
  WK_TRY(shard_open(ds, i, &fresh)); /* I/O outside the lock */

  pthread_mutex_lock(&ds->lock);
  s = ds->shards[i];
  if (s) { /* another thread opened it meanwhile */
    shard_close(fresh);
  } else {
    if (ds->open_count == ds->open_capacity) {
      uint32_t cap = ds->open_capacity ? ds->open_capacity * 2 : 16;
      uint32_t *grown = realloc(ds->open, cap * sizeof *grown);
      if (!grown) {
        pthread_mutex_unlock(&ds->lock);
        shard_close(fresh);
        return WK_FAIL(WK_ERR_NOMEM, "out of memory tracking open shards");
      }
      ds->open = grown;
      ds->open_capacity = cap;
    }
    if (ds->block_tokens && fresh->v.h.block_tokens != ds->block_tokens) {
      pthread_mutex_unlock(&ds->lock);
      WkStatus status = WK_FAIL(WK_ERR_FORMAT,
                                "shard '%s' has blocks of %u tokens but the dataset's other shards have %u (the sample "
                                "order needs one block size per dataset; re-run the converter)",
                                fresh->path, fresh->v.h.block_tokens, ds->block_tokens);
      shard_close(fresh);
      return status;
    }
    ds->block_tokens = fresh->v.h.block_tokens;
    s = ds->shards[i] = fresh;
    ds->open[ds->open_count++] = i;
  }
  s->pins++;
  s->last_use = ++ds->tick;
  evict_shards(ds);
  pthread_mutex_unlock(&ds->lock);
  *out = s;
  return WK_OK;
}

static void shard_release(WkDataset *ds, Shard *s) {
  pthread_mutex_lock(&ds->lock);
  s->pins--;
  if (ds->open_count > (uint32_t)ds->max_open) evict_shards(ds);
  pthread_mutex_unlock(&ds->lock);
}

/* ---- reads -------------------------------------------------------------------------------------- */

/* The blocks of a column of an open shard: column 0 is the tokens, column c > 0 the shard's extra column c - 1. */
typedef struct {
  WkBlockLayout l;
  const uint8_t *table;
  atomic_uchar *verified;
} Blocks;

static Blocks blocks_of(const Shard *s, uint32_t column) {
  if (column == 0) return (Blocks){wk_shard_token_layout(&s->v.h), s->v.table, s->verified};
  const WkColumnEntry *c = &s->v.columns[column - 1];
  return (Blocks){c->layout, s->v.column_tables[column - 1], s->verified + s->verified_base[column]};
}

static WkStatus blocks_stored(const Shard *s, uint32_t column, uint32_t b, WkBlockEntry *e, const uint8_t **stored,
                              uint8_t **copy) {
  return column == 0 ? wk_shard_view_stored(&s->v, b, e, stored, copy)
                     : wk_shard_view_column_stored(&s->v, column - 1, b, e, stored, copy);
}

/* After a block read through a remote blob failed its checks (WK_ERR_FORMAT): forgets the cached copy,
 * reads the block once more into `stored` and verifies (raw: stored is dst) or decodes it into dst. A
 * local blob has no other copy: the first failure stands. */
static WkStatus refetch_block(Shard *s, const WkBlockLayout *l, uint32_t b, const WkBlockEntry *e, uint8_t *stored,
                              uint8_t *dst) {
  if (!s->blob->forget) return WK_ERR_FORMAT;
  wk_logf(WK_LOG_WARN, "%s; fetching it again", wk_last_error());
  s->blob->forget(s->blob, e->offset, e->stored_bytes);
  WkStatus status = s->blob->read_at(s->blob, e->offset, e->stored_bytes, stored);
  if (status == WK_OK)
    status = stored == dst ? wk_layout_block_verify(l, e, b, stored, s->path) : wk_layout_block_decode(l, e, b, stored, dst, s->path);
  if (status == WK_ERR_FORMAT) {
    char again[256]; /* copied: the message below is written where this one is */
    snprintf(again, sizeof again, "%s", wk_last_error());
    return WK_FAIL(WK_ERR_FORMAT, "'%s' bytes %llu-%llu (block %u) are corrupt on the server: %s, also when fetched "
                   "anew (re-upload the shard)", s->path, (unsigned long long)e->offset,
                   (unsigned long long)(e->offset + e->stored_bytes - 1), b, again);
  }
  return status;
}

/* A decoded block held while a reader copies from it: in the mapping (a raw block, verified once), a
 * pinned cache entry, or a private buffer when the cache has no room. */
typedef struct {
  const uint8_t *data;
  uint64_t bytes;
  WkCacheEntry *entry;
  uint8_t *own;
} Held;

/* Cache keys: (shard, block) for the tokens, as always; a column's blocks add the column above bit 59,
 * so a dataset of fewer than 2^27 shards keeps them apart (a larger one reads columns uncached). */
enum { COLUMN_KEY_SHIFT = 59, KEYED_SHARDS = 1u << (COLUMN_KEY_SHIFT - 32) };

static WkStatus block_hold(WkDataset *ds, uint32_t i, Shard *s, uint32_t column, uint32_t b, Held *out) {
  memset(out, 0, sizeof *out);
  Blocks k = blocks_of(s, column);
  const WkShardHeader *h = &s->v.h;
  WkBlockEntry e;
  const uint8_t *stored = NULL;
  uint8_t *copy = NULL;
  WK_TRY(wk_layout_entry_parse(k.table, h, &k.l, b, s->path, &e));
  /* Raw blocks of a mapped file skip the cache: read straight from the mapping. */
  const uint8_t *mapped = e.codec != WK_CODEC_RAW ? NULL
                          : e.stored_bytes ? s->blob->map(s->blob, e.offset, e.stored_bytes) : (const uint8_t *)"";
  if (mapped) {
    if (!atomic_load_explicit(&k.verified[b], memory_order_acquire)) {
      WK_TRY(wk_layout_block_verify(&k.l, &e, b, mapped, s->path));
      atomic_fetch_add(&ds->blocks_verified, 1);
      atomic_store_explicit(&k.verified[b], 1, memory_order_release);
    }
    out->data = mapped;
    return wk_layout_block_bytes(&k.l, &e, b, mapped, s->path, &out->bytes);
  }
  WkStatus status = WK_OK;
  if (!k.l.element_bytes && e.codec != WK_CODEC_RAW) /* a zstd blob: its size is in its frame */
    status = blocks_stored(s, column, b, &e, &stored, &copy);
  if (status == WK_OK) status = wk_layout_block_bytes(&k.l, &e, b, stored, s->path, &out->bytes);
  if (status != WK_OK) {
    free(copy);
    return status;
  }
  bool keyed = (column == 0 || ds->index.shard_count <= KEYED_SHARDS) && out->bytes > 0;
  uint64_t key = (uint64_t)column << COLUMN_KEY_SHIFT | (uint64_t)i << 32 | b;
  bool fill = false;
  WkCacheEntry *entry = keyed ? wk_cache_get(ds->cache, key, out->bytes, &fill) : NULL;
  if (entry && !fill) { /* a hit, possibly after waiting for another reader's decode */
    free(copy);
    out->entry = entry;
    out->data = wk_cache_data(entry);
    return WK_OK;
  }
  /* This reader decodes: into the reserved entry, or privately when the budget has no room. */
  uint8_t *decoded = entry ? wk_cache_buffer(entry, "decoded block") : wk_malloc(out->bytes ? out->bytes : 1, "decoded block");
  status = decoded ? WK_OK : WK_ERR_NOMEM;
  if (status == WK_OK && !stored) status = blocks_stored(s, column, b, &e, &stored, &copy);
  if (status == WK_OK) status = wk_layout_block_decode(&k.l, &e, b, stored, decoded, s->path);
  if (status == WK_ERR_FORMAT && copy) status = refetch_block(s, &k.l, b, &e, copy, decoded);
  free(copy);
  if (status != WK_OK) {
    if (entry) wk_cache_abandon(ds->cache, entry);
    else free(decoded);
    return status;
  }
  atomic_fetch_add(&ds->blocks_verified, 1);
  if (e.codec == WK_CODEC_ZSTD) atomic_fetch_add(&ds->blocks_decoded, 1);
  if (entry) wk_cache_fill(ds->cache, entry);
  out->entry = entry;
  out->own = entry ? NULL : decoded;
  out->data = decoded;
  return WK_OK;
}

static void block_drop(WkDataset *ds, Held *held) {
  if (held->entry) wk_cache_release(ds->cache, held->entry);
  free(held->own);
}

/* Copies tokens [within, within+count) of block b of shard i into out, widened to out_bytes. */
static WkStatus read_block(WkDataset *ds, uint32_t i, Shard *s, uint32_t b, uint32_t within, uint32_t count,
                           uint8_t *out, uint32_t out_bytes) {
  Held held;
  WK_TRY(block_hold(ds, i, s, 0, b, &held));
  wk_tokens_widen(held.data + (size_t)within * s->v.h.token_bytes, s->v.h.token_bytes, count, out, out_bytes);
  block_drop(ds, &held);
  return WK_OK;
}

WkStatus wk_dataset_read_into(WkDataset *ds, uint32_t shard, uint64_t offset, uint64_t count, void *out,
                              uint32_t out_bytes) {
  if (!ds) return WK_FAIL(WK_ERR_INVALID_ARG, "wk_dataset_read: dataset is NULL");
  if (shard >= ds->index.shard_count)
    return WK_FAIL(WK_ERR_INVALID_ARG, "dataset '%s': shard %u out of range (it has %u)", ds->path, shard,
                   ds->index.shard_count);
  uint64_t tokens = ds->index.shards[shard].tokens;
  if (offset > tokens || count > tokens - offset)
    return WK_FAIL(WK_ERR_INVALID_ARG, "dataset '%s' shard %u: tokens [%llu, +%llu) past its end (%llu tokens)",
                   ds->path, shard, (unsigned long long)offset, (unsigned long long)count,
                   (unsigned long long)tokens);
  if (count == 0) return WK_OK;
  if (!out) return WK_FAIL(WK_ERR_INVALID_ARG, "wk_dataset_read: out is NULL");
  Shard *s;
  WK_TRY(shard_acquire(ds, shard, &s));
  WkStatus status = WK_OK;
  uint64_t bt = s->v.h.block_tokens;
  uint8_t *at = out;
  while (count > 0 && status == WK_OK) {
    uint32_t b = (uint32_t)(offset / bt);
    uint32_t within = (uint32_t)(offset % bt);
    uint32_t n = wk_block_token_count(&s->v.h, b) - within;
    if (n > count) n = (uint32_t)count;
    status = read_block(ds, shard, s, b, within, n, at, out_bytes);
    offset += n;
    count -= n;
    at += (size_t)n * out_bytes;
  }
  shard_release(ds, s);
  return status;
}

WkStatus wk_dataset_read(WkDataset *ds, uint32_t shard, uint64_t offset, uint64_t count, uint32_t *out) {
  return wk_dataset_read_into(ds, shard, offset, count, out, sizeof *out);
}

WkStatus wk_dataset_document(WkDataset *ds, uint32_t shard, uint64_t doc, uint64_t *start, uint64_t *length) {
  if (!ds || !start || !length) return WK_FAIL(WK_ERR_INVALID_ARG, "wk_dataset_document: NULL argument");
  if (shard < ds->index.shard_count && doc >= ds->index.shards[shard].documents)
    return WK_FAIL(WK_ERR_INVALID_ARG, "dataset '%s' shard %u: document %llu out of range (it has %llu)", ds->path,
                   shard, (unsigned long long)doc, (unsigned long long)ds->index.shards[shard].documents);
  Shard *s;
  WK_TRY(shard_acquire(ds, shard, &s));
  WkStatus status = wk_shard_view_document(&s->v, doc, start, length);
  shard_release(ds, s);
  return status;
}

WkStatus wk_dataset_check_shard(WkDataset *ds, uint32_t shard) {
  if (!ds) return WK_FAIL(WK_ERR_INVALID_ARG, "wk_dataset_check_shard: dataset is NULL");
  Shard *s;
  WK_TRY(shard_acquire(ds, shard, &s));
  shard_release(ds, s);
  return WK_OK;
}

/* ---- columns ---------------------------------------------------------------------------------------- */

uint32_t wk_dataset_column_count(const WkDataset *ds) { return ds ? ds->index.column_count : 0; }

static WkStatus column_of(const WkDataset *ds, uint32_t column, const WkColumnInfo **out) {
  *out = NULL;
  if (!ds) return WK_FAIL(WK_ERR_INVALID_ARG, "wk_dataset column: dataset is NULL");
  if (column >= ds->index.column_count)
    return WK_FAIL(WK_ERR_INVALID_ARG, "dataset '%s': column %u out of range (it has %u)", ds->path, column,
                   ds->index.column_count);
  *out = &ds->index.columns[column];
  return WK_OK;
}

WkStatus wk_dataset_column_info(const WkDataset *ds, uint32_t column, WkColumnInfo *out) {
  const WkColumnInfo *info = NULL;
  WK_TRY(column_of(ds, column, &info));
  if (!out) return WK_FAIL(WK_ERR_INVALID_ARG, "wk_dataset_column_info: out is NULL");
  *out = *info;
  return WK_OK;
}

WkStatus wk_dataset_column_find(const WkDataset *ds, const char *name, uint32_t *column) {
  if (!ds || !name || !column) return WK_FAIL(WK_ERR_INVALID_ARG, "wk_dataset_column_find: NULL argument");
  const WkColumnInfo *infos[WK_MAX_COLUMNS];
  for (uint32_t c = 0; c < ds->index.column_count; c++) {
    if (strcmp(ds->index.columns[c].name, name) == 0) return *column = c, WK_OK;
    infos[c] = &ds->index.columns[c];
  }
  char list[1024];
  describe_columns(list, sizeof list, infos, ds->index.column_count);
  return WK_FAIL(WK_ERR_INVALID_ARG, "dataset '%s' has no column '%s' (its columns: %s)", ds->path, name, list);
}

/* A column's info, checked to be of a kind the call reads, and the shard's rows of it. */
static WkStatus column_for(WkDataset *ds, uint32_t column, uint32_t shard, bool blob, const char *call,
                           const WkColumnInfo **info, uint64_t *rows) {
  WK_TRY(column_of(ds, column, info));
  if (shard >= ds->index.shard_count)
    return WK_FAIL(WK_ERR_INVALID_ARG, "dataset '%s': shard %u out of range (it has %u)", ds->path, shard,
                   ds->index.shard_count);
  if (((*info)->kind == WK_COLUMN_BYTES) != blob)
    return WK_FAIL(WK_ERR_INVALID_ARG, "dataset '%s': %s cannot read column '%s' (%s); %s", ds->path, call,
                   (*info)->name, wk_column_kind_name((*info)->kind),
                   blob ? "wk_dataset_read_column reads fixed-width columns" : "its blobs are read by wk_dataset_read_blob");
  bool per_token = (*info)->kind == WK_COLUMN_TOKENS || (*info)->kind == WK_COLUMN_TOKEN_U8;
  *rows = per_token ? ds->index.shards[shard].tokens : ds->index.shards[shard].documents;
  return WK_OK;
}

WkStatus wk_dataset_read_column(WkDataset *ds, uint32_t column, uint32_t shard, uint64_t first, uint64_t count,
                                void *out) {
  const WkColumnInfo *info = NULL;
  uint64_t rows = 0;
  WK_TRY(column_for(ds, column, shard, false, "wk_dataset_read_column", &info, &rows));
  if (first > rows || count > rows - first)
    return WK_FAIL(WK_ERR_INVALID_ARG, "dataset '%s' shard %u column '%s': rows [%llu, +%llu) past its end (%llu rows)",
                   ds->path, shard, info->name, (unsigned long long)first, (unsigned long long)count,
                   (unsigned long long)rows);
  if (count == 0) return WK_OK;
  if (!out) return WK_FAIL(WK_ERR_INVALID_ARG, "wk_dataset_read_column: out is NULL");
  Shard *s;
  WK_TRY(shard_acquire(ds, shard, &s));
  Blocks k = blocks_of(s, column);
  WkStatus status = WK_OK;
  uint8_t *at = out;
  while (count > 0 && status == WK_OK) {
    uint32_t b = (uint32_t)(first / k.l.rows_per_block);
    uint64_t within = first % k.l.rows_per_block, n = wk_layout_block_rows(&k.l, b) - within;
    if (n > count) n = count;
    Held held;
    status = block_hold(ds, shard, s, column, b, &held);
    if (status != WK_OK) break;
    memcpy(at, held.data + within * k.l.element_bytes, (size_t)(n * k.l.element_bytes));
    block_drop(ds, &held);
    first += n;
    count -= n;
    at += n * k.l.element_bytes;
  }
  shard_release(ds, s);
  return status;
}

WkStatus wk_dataset_read_blob(WkDataset *ds, uint32_t column, uint32_t shard, uint64_t record, void *out,
                              uint64_t capacity, uint64_t *size) {
  const WkColumnInfo *info = NULL;
  uint64_t rows = 0;
  WK_TRY(column_for(ds, column, shard, true, "wk_dataset_read_blob", &info, &rows));
  if (!size) return WK_FAIL(WK_ERR_INVALID_ARG, "wk_dataset_read_blob: size is NULL");
  if (record >= rows)
    return WK_FAIL(WK_ERR_INVALID_ARG, "dataset '%s' shard %u column '%s': record %llu out of range (it has %llu)",
                   ds->path, shard, info->name, (unsigned long long)record, (unsigned long long)rows);
  Shard *s;
  WK_TRY(shard_acquire(ds, shard, &s));
  Held held;
  WkStatus status = block_hold(ds, shard, s, column, (uint32_t)record, &held);
  if (status == WK_OK) {
    *size = held.bytes;
    if (out && capacity < held.bytes)
      status = WK_FAIL(WK_ERR_INVALID_ARG, "dataset '%s' shard %u column '%s' record %llu: a blob of %llu bytes does "
                       "not fit in %llu", ds->path, shard, info->name, (unsigned long long)record,
                       (unsigned long long)held.bytes, (unsigned long long)capacity);
    else if (out && held.bytes)
      memcpy(out, held.data, (size_t)held.bytes);
    block_drop(ds, &held);
  }
  shard_release(ds, s);
  return status;
}

/* ---- what the loader's reads need ---------------------------------------------------------------- */

WkStatus wk_dataset_block_tokens(WkDataset *ds, uint32_t *out) {
  if (ds->index.shard_count == 0) return WK_FAIL(WK_ERR_INVALID_ARG, "dataset '%s' has no shards", ds->path);
  pthread_mutex_lock(&ds->lock);
  uint32_t known = ds->block_tokens;
  pthread_mutex_unlock(&ds->lock);
  if (!known) WK_TRY(wk_dataset_check_shard(ds, 0));
  pthread_mutex_lock(&ds->lock);
  *out = ds->block_tokens;
  pthread_mutex_unlock(&ds->lock);
  return WK_OK;
}

WkStatus wk_dataset_first_document(WkDataset *ds, uint32_t shard, uint64_t token, uint64_t *doc) {
  Shard *s;
  WK_TRY(shard_acquire(ds, shard, &s));
  /* Binary search for the first document whose start is >= token. */
  uint64_t lo = 0, hi = s->v.h.documents;
  WkStatus status = WK_OK;
  while (lo < hi && status == WK_OK) {
    uint64_t mid = lo + (hi - lo) / 2, start = 0, length = 0;
    status = wk_shard_view_document(&s->v, mid, &start, &length);
    if (start < token) lo = mid + 1; else hi = mid;
  }
  shard_release(ds, s);
  *doc = lo;
  return status;
}

WkStatus wk_dataset_document_at(WkDataset *ds, uint32_t shard, uint64_t token, uint64_t *doc) {
  if (!ds || !doc) return WK_FAIL(WK_ERR_INVALID_ARG, "wk_dataset_document_at: NULL argument");
  if (shard >= ds->index.shard_count || token >= ds->index.shards[shard].tokens)
    return WK_FAIL(WK_ERR_INVALID_ARG, "dataset '%s': no token %llu in shard %u", ds->path, (unsigned long long)token,
                   shard);
  uint64_t next = 0;
  WK_TRY(wk_dataset_first_document(ds, shard, token + 1, &next));
  *doc = next - 1; /* the first document starts at token 0 */
  return WK_OK;
}

WkStatus wk_dataset_shard_codec(WkDataset *ds, uint32_t shard, uint32_t *codec) {
  Shard *s;
  WK_TRY(shard_acquire(ds, shard, &s));
  *codec = s->v.h.codec;
  shard_release(ds, s);
  return WK_OK;
}

/* Reads the stored bytes with read_at (a copy into `stored`, not the mapping: mapped pages would stay
 * resident, and large folios map far beyond the block) and decodes them into dst. */
static WkStatus decode_blocks(WkDataset *ds, Shard *s, uint32_t column, uint32_t first, uint32_t end, uint8_t *dst) {
  Blocks k = blocks_of(s, column);
  uint8_t *stored = NULL;
  size_t capacity = 0;
  WkStatus status = WK_OK;
  for (uint32_t b = first; b < end && status == WK_OK; b++) {
    WkBlockEntry e;
    status = wk_layout_entry_parse(k.table, &s->v.h, &k.l, b, s->path, &e);
    if (status == WK_OK && e.codec != WK_CODEC_RAW && e.stored_bytes > capacity) {
      free(stored);
      capacity = e.stored_bytes;
      stored = wk_malloc(capacity, "stored block");
      if (!stored) status = wk_last_status();
    }
    if (status == WK_OK && e.codec == WK_CODEC_RAW) { /* the stored bytes are the rows: read them in place */
      status = s->blob->read_at(s->blob, e.offset, e.stored_bytes, dst);
      if (status == WK_OK) status = wk_layout_block_verify(&k.l, &e, b, dst, s->path);
      if (status == WK_ERR_FORMAT) status = refetch_block(s, &k.l, b, &e, dst, dst);
    } else if (status == WK_OK) {
      status = s->blob->read_at(s->blob, e.offset, e.stored_bytes, stored);
      if (status == WK_OK) status = wk_layout_block_decode(&k.l, &e, b, stored, dst, s->path);
      if (status == WK_ERR_FORMAT) status = refetch_block(s, &k.l, b, &e, stored, dst);
    }
    if (status != WK_OK) break;
    atomic_fetch_add(&ds->blocks_verified, 1);
    if (e.codec == WK_CODEC_ZSTD) atomic_fetch_add(&ds->blocks_decoded, 1);
    dst += (size_t)(wk_layout_block_rows(&k.l, b) * k.l.element_bytes);
  }
  free(stored);
  return status;
}

/* Blocks of stream positions [begin, end) of a per-position column (the tokens, or a TOKEN_U8 column). */
static WkStatus decode_positions(WkDataset *ds, uint32_t column, uint32_t shard, uint64_t begin, uint64_t end,
                                 void *dst) {
  Shard *s;
  WK_TRY(shard_acquire(ds, shard, &s));
  const WkShardHeader *h = &s->v.h;
  WkStatus status = WK_OK;
  if (begin % h->block_tokens != 0 || end > h->tokens || begin > end)
    status = WK_FAIL(WK_ERR_INVALID_ARG, "shard '%s': tokens [%llu, %llu) are not a range of whole blocks", s->path,
                     (unsigned long long)begin, (unsigned long long)end);
  else
    status = decode_blocks(ds, s, column, (uint32_t)(begin / h->block_tokens),
                           (uint32_t)((end + h->block_tokens - 1) / h->block_tokens), dst);
  shard_release(ds, s);
  return status;
}

WkStatus wk_dataset_decode_range(WkDataset *ds, uint32_t shard, uint64_t begin, uint64_t end, void *dst) {
  return decode_positions(ds, 0, shard, begin, end, dst);
}

WkStatus wk_dataset_decode_column_range(WkDataset *ds, uint32_t column, uint32_t shard, uint64_t begin, uint64_t end,
                                        void *dst) {
  if (column >= ds->index.column_count || ds->index.columns[column].kind != WK_COLUMN_TOKEN_U8)
    return WK_FAIL(WK_ERR_INVALID_ARG, "dataset '%s': column %u is not a token_u8 column", ds->path, column);
  return decode_positions(ds, column, shard, begin, end, dst);
}

static WkStatus advise_open(WkDataset *ds, uint32_t shard, uint64_t begin, uint64_t end, WkAdvice advice) {
  Shard *s;
  WK_TRY(shard_acquire(ds, shard, &s));
  const WkShardHeader *h = &s->v.h;
  if (end > h->tokens) end = h->tokens;
  /* Block by block, each its stored bytes: the ranges a remote blob caches and later reads are the same. */
  for (uint64_t b = begin / h->block_tokens; begin < end && b <= (end - 1) / h->block_tokens; b++) {
    WkBlockEntry e;
    if (wk_block_entry_parse(s->v.table, h, (uint32_t)b, s->path, &e) == WK_OK)
      s->blob->advise(s->blob, e.offset, e.stored_bytes, advice);
  }
  shard_release(ds, s);
  return WK_OK;
}

/* ---- read-ahead of remote shards not open yet ---------------------------------------------------------
 * Opening a remote shard costs two round trips (its header, then its tables), so a reader's read-ahead
 * does not wait for them: the advice for a shard not open yet goes to a few threads (one per parallel
 * transfer, up to OPENER_THREADS_MAX: more would only wait in the fetch engine), which open such shards in
 * parallel and then pass the advice on to the blob (its prefetch). Advice is a hint: when the queue is
 * full or a thread cannot start it is dropped (the read itself fetches what it needs), and closing the
 * dataset drops what is queued, then waits for the shards being opened. With prefetch_bytes 0 there is
 * no read-ahead of remote data at all. */

typedef struct {
  uint32_t shard;
  uint64_t begin, end;
} Advice;

static void *opener_main(void *arg) {
  WkDataset *ds = arg;
  void *item;
  while (wk_queue_pop(ds->advice, &item, -1) == WK_OK) {
    const Advice *a = item;
    if (advise_open(ds, a->shard, a->begin, a->end, WK_ADVICE_WILLNEED) != WK_OK)
      wk_logf(WK_LOG_DEBUG, "read-ahead of shard %u: %s (its read will report it)", a->shard, wk_last_error());
    free(item);
  }
  return NULL;
}

/* Queues the advice for the openers (starting them); false when it cannot (then advise in place). */
static bool advise_later(WkDataset *ds, uint32_t shard, uint64_t begin, uint64_t end) {
  pthread_mutex_lock(&ds->lock);
  if (!ds->advice && (ds->advice = wk_queue_new(ADVICE_QUEUE)))
    for (; ds->opener_count < ds->opener_limit; ds->opener_count++) {
      int rc = wk_thread_create(&ds->openers[ds->opener_count], opener_main, ds);
      if (rc != 0) {
        wk_logf(WK_LOG_DEBUG, "dataset '%s': read-ahead thread %u not started (%s); reads fetch for themselves",
                ds->path, ds->opener_count, strerror(rc));
        break;
      }
    }
  bool ready = ds->advice && ds->opener_count > 0;
  pthread_mutex_unlock(&ds->lock);
  if (!ready) return false;
  Advice *a = malloc(sizeof *a);
  if (!a) return true; /* a hint: dropped */
  *a = (Advice){shard, begin, end};
  if (wk_queue_push(ds->advice, a, 0) != WK_OK) free(a); /* full: dropped */
  return true;
}

static void stop_openers(WkDataset *ds) {
  if (!ds->advice) return;
  void *item;
  while (wk_queue_pop(ds->advice, &item, 0) == WK_OK) free(item);
  wk_queue_close(ds->advice);
  for (uint32_t t = 0; t < ds->opener_count; t++) pthread_join(ds->openers[t], NULL);
  wk_queue_free(ds->advice);
  ds->advice = NULL;
}

WkStatus wk_dataset_advise(WkDataset *ds, uint32_t shard, uint64_t begin, uint64_t end, WkAdvice advice) {
  if (ds->remote && advice == WK_ADVICE_WILLNEED && shard < ds->index.shard_count) {
    pthread_mutex_lock(&ds->lock);
    bool open = ds->shards[shard] != NULL;
    pthread_mutex_unlock(&ds->lock);
    if (!open && (ds->opener_limit == 0 || advise_later(ds, shard, begin, end))) return WK_OK;
  }
  return advise_open(ds, shard, begin, end, advice);
}

/* ---- the rest of the API ------------------------------------------------------------------------ */

void wk_dataset_close(WkDataset *ds) {
  if (!ds) return;
  stop_openers(ds);
  if (ds->shards)
    for (uint32_t i = 0; i < ds->index.shard_count; i++) shard_close(ds->shards[i]);
  free(ds->shards);
  free(ds->open);
  wk_remote_close(ds->remote); /* after its shards' blobs */
  wk_cache_free(ds->cache);
  wk_index_free(&ds->index);
  pthread_mutex_destroy(&ds->lock);
  free(ds->path);
  free(ds->dir);
  free(ds);
}

const char *wk_dataset_name(const WkDataset *ds) { return ds->path; }
uint32_t wk_dataset_shard_count(const WkDataset *ds) { return ds->index.shard_count; }
uint64_t wk_dataset_token_count(const WkDataset *ds) { return ds->index.tokens; }
uint64_t wk_dataset_document_count(const WkDataset *ds) { return ds->index.documents; }
uint32_t wk_dataset_vocab_size(const WkDataset *ds) { return ds->index.vocab_size; }
uint32_t wk_dataset_eos(const WkDataset *ds) { return ds->index.eos; }
uint32_t wk_dataset_token_bytes(const WkDataset *ds) { return ds->index.token_bytes; }
const char *wk_dataset_tokenizer(const WkDataset *ds) { return ds->index.tokenizer; }
uint64_t wk_dataset_tokenizer_fingerprint(const WkDataset *ds) { return ds->index.tokenizer_fingerprint; }

int wk_dataset_template(const WkDataset *ds, const uint32_t **ids, uint32_t *prefix, uint32_t *suffix) {
  *ids = ds->index.template.ids;
  *prefix = ds->index.template.prefix;
  *suffix = ds->index.template.suffix;
  return ds->index.template_state == WK_INDEX_TEMPLATE_APPLIED ? 1 : ds->index.template_state == WK_INDEX_TEMPLATE_SKIPPED ? 0 : -1;
}

WkStatus wk_dataset_shard_info(const WkDataset *ds, uint32_t shard, WkShardInfo *out) {
  if (!ds || !out) return WK_FAIL(WK_ERR_INVALID_ARG, "wk_dataset_shard_info: NULL argument");
  if (shard >= ds->index.shard_count)
    return WK_FAIL(WK_ERR_INVALID_ARG, "dataset '%s': shard %u out of range (it has %u)", ds->path, shard,
                   ds->index.shard_count);
  const WkIndexShard *s = &ds->index.shards[shard];
  out->name = s->name;
  out->tokens = s->tokens;
  out->documents = s->documents;
  out->bytes = s->bytes;
  return WK_OK;
}

WkStatus wk_dataset_param_bounds(WkDatasetParam param, int64_t *min, int64_t *max) {
  return wk_param_bounds(&PARAMS, (int)param, min, max);
}

WkStatus wk_dataset_set(WkDataset *ds, WkDatasetParam param, int64_t value) {
  if (!ds) return WK_FAIL(WK_ERR_INVALID_ARG, "wk_dataset_set: dataset is NULL");
  int64_t min, max;
  WK_TRY(wk_dataset_param_bounds(param, &min, &max));
  WK_TRY(wk_param_check(&PARAMS, (int)param, value, min, max));
  pthread_mutex_lock(&ds->lock);
  if (param == WK_DATASET_BLOCK_CACHE_BYTES) ds->cache_budget = value;
  else {
    ds->max_open = value;
    evict_shards(ds);
  }
  pthread_mutex_unlock(&ds->lock);
  if (param == WK_DATASET_BLOCK_CACHE_BYTES) wk_cache_set_budget(ds->cache, (uint64_t)value);
  return WK_OK;
}

int64_t wk_dataset_get(const WkDataset *ds, WkDatasetParam param) {
  if (!ds) return -1;
  switch (param) {
    case WK_DATASET_BLOCK_CACHE_BYTES: return ds->cache_budget;
    case WK_DATASET_MAX_OPEN_SHARDS: return ds->max_open;
    default: return -1;
  }
}

void wk_dataset_stats(WkDataset *ds, WkDatasetStats *out) {
  memset(out, 0, sizeof *out);
  if (!ds) return;
  wk_cache_stats(ds->cache, out);
  out->blocks_decoded = atomic_load(&ds->blocks_decoded);
  out->blocks_verified = atomic_load(&ds->blocks_verified);
  pthread_mutex_lock(&ds->lock);
  out->open_shards = ds->open_count;
  pthread_mutex_unlock(&ds->lock);
}

void wk_dataset_remote_stats(WkDataset *ds, WkRemoteStats *out) {
  memset(out, 0, sizeof *out);
  if (ds && ds->remote) wk_remote_stats(ds->remote, out);
}

_Static_assert(sizeof(WkRemoteStats) % sizeof(uint64_t) == 0, "WkRemoteStats is summed as an array of counters");

void wk_remote_stats_add(WkRemoteStats *sum, WkDataset *ds) {
  WkRemoteStats r;
  wk_dataset_remote_stats(ds, &r);
  uint64_t *to = &sum->requests;
  const uint64_t *from = &r.requests;
  for (size_t f = 0; f < sizeof r / sizeof r.requests; f++)
    if (&to[f] != &sum->disk_bytes) to[f] += from[f];
  if (r.disk_bytes > sum->disk_bytes) sum->disk_bytes = r.disk_bytes; /* one directory, seen by each source */
}
