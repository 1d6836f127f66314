/*
 * convert.c — the converter pipeline: inputs -> chunks -> documents -> shards -> index.json.
 *
 *   producer thread   cuts the inputs, in order, into numbered chunks (convert_input.c)
 *   worker threads    tokenize chunks, all with the one tokenizer of the run (a file's BPE encodes
 *                     thread-safely, each thread keeping its own caches); compress and write finished
 *                     shards (shard_writer.c)
 *   calling thread    the builder: takes chunk results in number order, appends documents to the
 *                     current shard, hands a shard to the workers once it reaches the shard size,
 *                     reports bad lines as file:line, draws the progress bar, writes the index last
 *
 * Backpressure: at most RING chunks and two finished shards are in flight (a shard is compressed by
 * all workers at once, in pieces), so memory is bounded by about chunk size x RING + 3 x shard size,
 * not by the input. Determinism: the document sequence is
 * fixed by the inputs alone and shard boundaries by the document sequence, so the thread count
 * changes nothing in the output bytes.
 *
 * The output directory holds shard-NNNNN.wks and index.json. A run writes them into a staging
 * directory next to it and swaps that in at the end (output.c), under a lock, so the dataset already
 * there stays whole until the new one is, and two converters cannot write one directory. With
 * WK_CONVERT_RESUME a rerun still reads and tokenizes everything, but keeps each shard (left in the
 * staging directory by an interrupted run, or in the current dataset) whose verified contents equal
 * what it would write (decoding is much cheaper than compressing).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>    /* clock_gettime for the progress bar's timed waits */
#include <unistd.h>  /* sysconf, isatty, unlink */

#include <zstd.h>    /* ZSTD_minCLevel, ZSTD_maxCLevel */

#include "convert.h"

enum {
  MAX_THREADS = 64,
  MAX_BAD_KEPT = 1000,
  MAX_SHARDS_IN_FLIGHT = 2,  /* one being compressed while the next is built */
};

/* THREADS' default (0) is replaced by the online CPUs when the converter is made; LEVEL's bounds are
 * zstd's, asked of the library at run time (wk_converter_param_bounds). */
static const WkParamSpec PARAM_SPECS[WK_CONVERT_PARAM_COUNT] = {
    [WK_CONVERT_THREADS] = {1, MAX_THREADS, 0, "threads"},
    [WK_CONVERT_SHARD_TOKENS] = {1, INT64_C(1) << 40, INT64_C(1) << 26, "shard_tokens"},
    [WK_CONVERT_BLOCK_TOKENS] = {1, WK_SHARD_MAX_BLOCK_TOKENS, WK_SHARD_DEFAULT_BLOCK_TOKENS, "block_tokens"},
    [WK_CONVERT_COMPRESSION] = {0, 1, WK_CODEC_ZSTD, "compression"},
    [WK_CONVERT_LEVEL] = {0, 0, 3, "level"},
    [WK_CONVERT_STRICT] = {0, 1, 0, "strict"},
    [WK_CONVERT_PROGRESS] = {0, 1, 0, "progress"},
    [WK_CONVERT_RESUME] = {0, 1, 0, "resume"},
    [WK_CONVERT_TEXT_SPLIT] = {WK_TEXT_SPLIT_FILE, WK_TEXT_SPLIT_LINE, WK_TEXT_SPLIT_FILE, "text_split"},
    [WK_CONVERT_HEADERLESS_BIN] = {0, 1, 0, "headerless_bin"},
};
static const WkParamTable PARAMS = {"converter", PARAM_SPECS, WK_CONVERT_PARAM_COUNT};

struct WkConverter {
  char *out_dir;
  const WkTokenizer *tokenizer;  /* NULL: decided by the inputs (bytes for text, gpt2 for .bin) */
  WkTokenizer *owned;            /* the tokenizer file wk_converter_new opened, freed with the converter */
  char *field;
  char *json_field;
  int64_t params[WK_CONVERT_PARAM_COUNT];
  char **include;  /* NULL-terminated globs for files found in directories; NULL: all */
  Input *inputs;
  size_t input_count, input_capacity;
  WkRemote *remote;  /* opened at the first URL input (remote_input.c) */
  uint64_t total_input_bytes;
  WkConvertStats stats;
  char **bad_lines;
  size_t bad_kept;
};

/* ---- settings ------------------------------------------------------------------------------------ */

WkConverter *wk_converter_new(const char *out_dir, const char *tokenizer) {
  if (!out_dir || !out_dir[0]) {
    WK_FAIL(WK_ERR_INVALID_ARG, "converter: an output directory is required");
    return NULL;
  }
  WkConverter *cv = wk_calloc(1, sizeof *cv, "converter");
  if (!cv) return NULL;
  /* A built-in describes, a file is opened here: its errors are the caller's at once, not the run's. */
  cv->tokenizer = tokenizer ? wk_tokenizer_find(tokenizer) : NULL;
  if (tokenizer && !cv->tokenizer) {
    cv->owned = wk_tokenizer_open(tokenizer, NULL);
    if (!cv->owned) {
      wk_error_context("converter: tokenizer");
      free(cv);
      return NULL;
    }
    cv->tokenizer = cv->owned;
  }
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  wk_param_defaults(&PARAMS, cv->params);
  cv->params[WK_CONVERT_THREADS] = cpus < 1 ? 1 : cpus > MAX_THREADS ? MAX_THREADS : cpus;
  cv->out_dir = strdup(out_dir);
  cv->field = strdup("text");
  cv->json_field = strdup("text");
  if (!cv->out_dir || !cv->field || !cv->json_field) {
    wk_converter_free(cv);
    WK_FAIL(WK_ERR_NOMEM, "out of memory creating the converter");
    return NULL;
  }
  return cv;
}

static void free_include(WkConverter *cv) {
  for (size_t i = 0; cv->include && cv->include[i]; i++) free(cv->include[i]);
  free(cv->include);
  cv->include = NULL;
}

void wk_converter_free(WkConverter *cv) {
  if (!cv) return;
  free_include(cv);
  for (size_t i = 0; i < cv->input_count; i++) free(cv->inputs[i].path);
  free(cv->inputs);
  convert_remote_close(cv->remote);
  for (size_t i = 0; i < cv->bad_kept; i++) free(cv->bad_lines[i]);
  free(cv->bad_lines);
  free(cv->out_dir);
  wk_tokenizer_free(cv->owned);
  free(cv->field);
  free(cv->json_field);
  free(cv);
}

WkStatus wk_converter_param_bounds(WkConvertParam param, int64_t *min, int64_t *max) {
  WK_TRY(wk_param_bounds(&PARAMS, (int)param, min, max));
  if (param == WK_CONVERT_LEVEL) *min = ZSTD_minCLevel(), *max = ZSTD_maxCLevel();
  return WK_OK;
}

WkStatus wk_converter_set(WkConverter *cv, WkConvertParam param, int64_t value) {
  if (!cv) return WK_FAIL(WK_ERR_INVALID_ARG, "wk_converter_set: converter is NULL");
  int64_t min, max;
  WK_TRY(wk_converter_param_bounds(param, &min, &max));
  WK_TRY(wk_param_check(&PARAMS, (int)param, value, min, max));
  cv->params[param] = value;
  return WK_OK;
}

static int64_t param(const WkConverter *cv, WkConvertParam p) { return cv->params[p]; }

WkStatus wk_converter_use_tokenizer(WkConverter *cv, const WkTokenizer *tokenizer) {
  if (!cv) return WK_FAIL(WK_ERR_INVALID_ARG, "wk_converter_use_tokenizer: converter is NULL");
  wk_tokenizer_free(cv->owned);
  cv->owned = NULL;
  cv->tokenizer = tokenizer;
  return WK_OK;
}

static WkStatus set_name(char **slot, const char *value, const char *what) {
  if (!value || !value[0]) return WK_FAIL(WK_ERR_INVALID_ARG, "converter: the %s is empty", what);
  char *copy = strdup(value);
  if (!copy) return WK_FAIL(WK_ERR_NOMEM, "out of memory");
  free(*slot);
  *slot = copy;
  return WK_OK;
}

WkStatus wk_converter_set_field(WkConverter *cv, const char *field) {
  if (!cv) return WK_FAIL(WK_ERR_INVALID_ARG, "wk_converter_set_field: converter is NULL");
  return set_name(&cv->field, field, "field name");
}

WkStatus wk_converter_set_json_field(WkConverter *cv, const char *field) {
  if (!cv) return WK_FAIL(WK_ERR_INVALID_ARG, "wk_converter_set_json_field: converter is NULL");
  return set_name(&cv->json_field, field, "JSON field name");
}

WkStatus wk_converter_set_include(WkConverter *cv, const char *patterns) {
  if (!cv) return WK_FAIL(WK_ERR_INVALID_ARG, "wk_converter_set_include: converter is NULL");
  free_include(cv);
  if (!patterns || !patterns[0]) return WK_OK;
  size_t n = 1;
  for (const char *p = patterns; *p; p++) n += *p == ',';
  cv->include = calloc(n + 1, sizeof *cv->include);
  if (!cv->include) return WK_FAIL(WK_ERR_NOMEM, "out of memory");
  size_t k = 0;
  for (const char *p = patterns;;) {
    const char *comma = strchr(p, ',');
    size_t length = comma ? (size_t)(comma - p) : strlen(p);
    if (length > 0) {
      cv->include[k] = strndup(p, length);
      if (!cv->include[k++]) {
        free_include(cv);
        return WK_FAIL(WK_ERR_NOMEM, "out of memory");
      }
    }
    if (!comma) break;
    p = comma + 1;
  }
  return WK_OK;
}

WkStatus wk_converter_add_input(WkConverter *cv, const char *path) {
  if (!cv || !path) return WK_FAIL(WK_ERR_INVALID_ARG, "wk_converter_add_input: NULL argument");
  size_t before = cv->input_count;
  if (wk_blob_is_remote(path))
    WK_TRY(convert_add_remote_input(&cv->remote, path, (const char *const *)cv->include, &cv->inputs, &cv->input_count,
                                    &cv->input_capacity));
  else
    WK_TRY(convert_list_inputs(path, (const char *const *)cv->include, cv->out_dir, &cv->inputs, &cv->input_count,
                               &cv->input_capacity));
  for (size_t i = before; i < cv->input_count; i++) cv->total_input_bytes += cv->inputs[i].size;
  return WK_OK;
}

void wk_converter_stats(const WkConverter *cv, WkConvertStats *out) {
  memset(out, 0, sizeof *out);
  if (cv) *out = cv->stats;
}

const char *wk_converter_bad_line(const WkConverter *cv, uint64_t i) {
  return cv && i < cv->bad_kept ? cv->bad_lines[i] : NULL;
}

/* ---- the run --------------------------------------------------------------------------------------- */

typedef struct ShardJob ShardJob;

/* A range of a shard's blocks, compressed by whichever worker takes it. */
typedef struct {
  JobKind kind;
  ShardJob *shard;
  WkShardPiece piece;
  uint32_t first_block, block_count;
  WkStatus status;
  char message[1024];
} PieceJob;

/* A finished shard: its pieces are compressed in parallel; the worker finishing the last one writes
 * the file. */
struct ShardJob {
  uint32_t index;
  char *path;
  uint8_t *tokens;  /* stored width */
  uint64_t token_count, token_capacity;
  uint64_t *doc_starts;
  uint64_t doc_count, doc_capacity;
  PieceJob *pieces;
  uint32_t piece_count, pieces_left;
  bool done;
  WkStatus status;
  char message[1024];
  WkShardWritten written;
};

/* Buffers handed back for reuse: fresh memory costs a page fault and a page clear per 4 KiB, which
 * was the converter's largest cost. Lock held when used. */
enum { POOL_SLOTS = 8 };
typedef struct {
  void *data[POOL_SLOTS];
  uint64_t capacity[POOL_SLOTS];
  uint32_t count;
} Pool;

static void pool_put(Pool *p, void *data, uint64_t capacity) {
  if (!data) return;
  if (p->count == POOL_SLOTS) {
    free(data);
    return;
  }
  p->data[p->count] = data;
  p->capacity[p->count++] = capacity;
}

static void *pool_take(Pool *p, uint64_t *capacity) {
  if (p->count == 0) return NULL;
  p->count--;
  *capacity = p->capacity[p->count];
  return p->data[p->count];
}

static void pool_free(Pool *p) {
  while (p->count) free(p->data[--p->count]);
}

typedef struct {
  WkConverter *cv;
  const WkTokenizer *tokenizer;
  ChunkContext context;
  WkShardWriteOptions write_options;
  uint32_t threads;
  WkQueue *jobs;
  pthread_mutex_t lock;
  pthread_cond_t changed;
  /* chunks: produced with consecutive numbers, consumed in order */
  Chunk **ring;
  uint64_t ring_size;
  uint64_t produced, consumed;
  bool producer_done;
  WkStatus producer_status;
  char producer_message[1024];
  atomic_bool stop;
  /* shards: at most MAX_SHARDS_IN_FLIGHT finished shards wait for or undergo compression */
  ShardJob **shards;
  uint32_t shard_count, shard_capacity, shards_in_flight;
  Pool shard_buffers, shard_starts, chunk_tokens;
  /* the shard being built */
  uint8_t *buffer;
  uint64_t buffer_tokens, buffer_capacity;
  uint64_t *starts;
  uint64_t start_count, start_capacity;
  bool doc_open;        /* a document (of a .bin input) continues into the next chunk */
  uint64_t line_base;   /* lines of the current input before the chunk being consumed */
  uint64_t last_draw_ns, start_ns;
  ConvertOutput out;
} Run;

static WkStatus emit_chunk(void *arg, Chunk *c) {
  Run *r = arg;
  pthread_mutex_lock(&r->lock);
  while (r->produced - r->consumed >= r->ring_size && !atomic_load(&r->stop))
    pthread_cond_wait(&r->changed, &r->lock);
  if (atomic_load(&r->stop)) {
    pthread_mutex_unlock(&r->lock);
    convert_chunk_free(c);
    return WK_ERR_CLOSED;
  }
  c->seq = r->produced++;
  r->ring[c->seq % r->ring_size] = c;
  pthread_mutex_unlock(&r->lock);
  /* The queue holds every chunk and shard that can be in flight, so this push never waits. */
  return wk_queue_push(r->jobs, c, -1);
}

static void *producer_main(void *arg) {
  Run *r = arg;
  pthread_setname_np(pthread_self(), "wick-cv-read");
  WkStatus status = WK_OK;
  for (uint32_t i = 0; i < r->cv->input_count && status == WK_OK && !atomic_load(&r->stop); i++)
    status = convert_cut_input(&r->context, i, emit_chunk, r, &r->stop);
  pthread_mutex_lock(&r->lock);
  r->producer_done = true;
  if (status != WK_OK && status != WK_ERR_CLOSED) {
    r->producer_status = status;
    snprintf(r->producer_message, sizeof r->producer_message, "%s", wk_last_error());
  }
  pthread_cond_broadcast(&r->changed);
  pthread_mutex_unlock(&r->lock);
  return NULL;
}

/* Returns a written shard's buffers to the pools (or frees them when r is NULL). Lock not held. */
static void free_shard_inputs(Run *r, ShardJob *job) {
  for (uint32_t p = 0; p < job->piece_count; p++) wk_shard_piece_free(&job->pieces[p].piece);
  if (r) {
    pthread_mutex_lock(&r->lock);
    pool_put(&r->shard_buffers, job->tokens, job->token_capacity);
    pool_put(&r->shard_starts, job->doc_starts, job->doc_capacity);
    pthread_mutex_unlock(&r->lock);
  } else {
    free(job->tokens);
    free(job->doc_starts);
  }
  job->tokens = NULL;
  job->doc_starts = NULL;
}

/* Compresses one piece; the last piece of a shard also writes the file. Called without the lock. */
static void run_piece(Run *r, PieceJob *pj, bool skip) {
  ShardJob *job = pj->shard;
  if (!skip) {
    pj->status = wk_shard_compress(&r->write_options, job->tokens, job->token_count, pj->first_block,
                                   pj->block_count, &pj->piece);
    if (pj->status != WK_OK) snprintf(pj->message, sizeof pj->message, "%s", wk_last_error());
  }
  pthread_mutex_lock(&r->lock);
  bool last = --job->pieces_left == 0;
  pthread_mutex_unlock(&r->lock);
  if (!last) return;
  job->status = WK_OK;
  for (uint32_t p = 0; p < job->piece_count && job->status == WK_OK; p++) {
    if (job->pieces[p].status != WK_OK) {
      job->status = job->pieces[p].status;
      snprintf(job->message, sizeof job->message, "%s", job->pieces[p].message);
    }
  }
  if (job->status == WK_OK && !skip) {
    WkShardPiece *pieces = malloc(job->piece_count * sizeof *pieces);
    if (!pieces) {
      job->status = WK_FAIL(WK_ERR_NOMEM, "out of memory assembling shard '%s'", job->path);
    } else {
      for (uint32_t p = 0; p < job->piece_count; p++) pieces[p] = job->pieces[p].piece;
      job->status = wk_shard_assemble(job->path, &r->write_options, job->token_count, job->doc_starts,
                                      job->doc_count, pieces, job->piece_count, &job->written);
      free(pieces);
    }
    if (job->status != WK_OK) snprintf(job->message, sizeof job->message, "%s", wk_last_error());
  }
  free_shard_inputs(r, job);
  pthread_mutex_lock(&r->lock);
  job->done = true;
  r->shards_in_flight--;
  pthread_cond_broadcast(&r->changed);
  pthread_mutex_unlock(&r->lock);
}

/* Worker side, after tokenizing: rewrites a chunk's u32 tokens in place as little-endian values of
 * the stored width, so the (single) builder thread only copies. Writing byte 2k+1 never overtakes
 * token k being read, so in place is safe; bytes may alias anything. */
static void store_tokens(WkTokenVec *tokens, uint32_t width) {
  uint8_t *out = (uint8_t *)tokens->data;
  if (width == 2) {
    for (size_t k = 0; k < tokens->length; k++) {
      uint32_t t = tokens->data[k];
      out[2 * k] = (uint8_t)t;
      out[2 * k + 1] = (uint8_t)(t >> 8);
    }
  } /* width 4: u32 on a little-endian host is already the stored form */
}

static void *worker_main(void *arg) {
  Run *r = arg;
  pthread_setname_np(pthread_self(), "wick-cv-work");
  void *item;
  while (wk_queue_pop(r->jobs, &item, -1) == WK_OK) {
    bool skip = atomic_load(&r->stop);
    if (*(JobKind *)item == JOB_PIECE) {
      run_piece(r, item, skip);
      continue;
    }
    if (!skip) {
      Chunk *c = item;
      pthread_mutex_lock(&r->lock);
      uint64_t capacity = 0;
      c->tokens.data = pool_take(&r->chunk_tokens, &capacity);
      c->tokens.capacity = (size_t)capacity;
      pthread_mutex_unlock(&r->lock);
      convert_process_chunk(&r->context, c);
      if (c->status == WK_OK) store_tokens(&c->tokens, r->write_options.token_bytes);
    }
    pthread_mutex_lock(&r->lock);
    ((Chunk *)item)->done = true;
    pthread_cond_broadcast(&r->changed);
    pthread_mutex_unlock(&r->lock);
  }
  return NULL;
}

/* ---- builder ------------------------------------------------------------------------------------ */

static WkStatus buffer_reserve(Run *r, uint64_t extra) {
  if (!r->buffer) {
    pthread_mutex_lock(&r->lock);
    r->buffer = pool_take(&r->shard_buffers, &r->buffer_capacity);
    pthread_mutex_unlock(&r->lock);
  }
  if (r->buffer_tokens + extra <= r->buffer_capacity) return WK_OK;
  uint64_t cap = r->buffer_capacity ? r->buffer_capacity : 1 << 16;
  while (cap < r->buffer_tokens + extra) cap *= 2;
  uint8_t *grown = realloc(r->buffer, (size_t)(cap * r->write_options.token_bytes));
  if (!grown) return WK_FAIL(WK_ERR_NOMEM, "out of memory: shard buffer of %llu tokens", (unsigned long long)cap);
  r->buffer = grown;
  r->buffer_capacity = cap;
  return WK_OK;
}

/* Appends n tokens already in stored width (see store_tokens) to the shard being built. */
static WkStatus append_tokens(Run *r, const uint8_t *stored, uint64_t n) {
  if (n == 0) return WK_OK;
  WK_TRY(buffer_reserve(r, n + 1));
  if (!r->doc_open) {
    if (!r->starts) {
      pthread_mutex_lock(&r->lock);
      r->starts = pool_take(&r->shard_starts, &r->start_capacity);
      pthread_mutex_unlock(&r->lock);
    }
    if (r->start_count == r->start_capacity) {
      uint64_t cap = r->start_capacity ? r->start_capacity * 2 : 1024;
      uint64_t *grown = realloc(r->starts, (size_t)cap * sizeof *grown);
      if (!grown) return WK_FAIL(WK_ERR_NOMEM, "out of memory: document index");
      r->starts = grown;
      r->start_capacity = cap;
    }
    r->starts[r->start_count++] = r->buffer_tokens;
    r->doc_open = true;
  }
  uint32_t width = r->write_options.token_bytes;
  memcpy(r->buffer + r->buffer_tokens * width, stored, (size_t)(n * width));
  r->buffer_tokens += n;
  return WK_OK;
}

/* Resuming: does the file at path already hold exactly these tokens and documents, verified? Any
 * doubt (missing, corrupt, other options) answers no, and the shard is written afresh. */
static bool shard_matches(const char *path, const WkShardWriteOptions *opt, const uint8_t *tokens,
                          uint64_t token_count, const uint64_t *starts, uint64_t doc_count, WkShardWritten *out) {
  WkBlob *src = wk_blob_open_file(path);
  if (!src) return false;
  WkShardView v;
  bool same = wk_shard_view_open(src, path, &v) == WK_OK;
  const WkShardHeader *h = &v.h;
  same = same && h->token_bytes == opt->token_bytes && h->vocab_size == opt->vocab_size && h->eos == opt->eos &&
         h->tokens == token_count && h->documents == doc_count && h->block_tokens == opt->block_tokens &&
         h->codec == (uint32_t)opt->codec;
  uint8_t *decoded = same ? malloc((size_t)h->block_tokens * h->token_bytes) : NULL;
  same = same && decoded;
  for (uint64_t d = 0; same && d < doc_count; d++) {
    uint64_t start, length;
    same = wk_shard_view_document(&v, d, &start, &length) == WK_OK && start == starts[d];
  }
  for (uint32_t b = 0; same && b < h->block_count; b++) {
    WkBlockEntry e;
    const uint8_t *stored;
    uint8_t *copy;
    size_t n = (size_t)wk_block_token_count(h, b) * h->token_bytes;
    same = wk_shard_view_stored(&v, b, &e, &stored, &copy) == WK_OK &&
           wk_block_decode(h, &e, b, stored, decoded, path) == WK_OK &&
           memcmp(decoded, tokens + (size_t)b * h->block_tokens * h->token_bytes, n) == 0;
    free(copy);
  }
  if (same) *out = (WkShardWritten){.bytes = src->size, .header_hash = h->header_hash};
  free(decoded);
  wk_shard_view_release(&v);
  src->close(src);
  wk_clear_error();
  return same;
}

/* Resuming: the shard of this name in the staging directory (an interrupted run's) or in the current
 * dataset (linked into the staging directory) when it holds exactly this job's shard. */
static bool reusable(Run *r, ShardJob *job, const char *name) {
  if (shard_matches(job->path, &r->write_options, job->tokens, job->token_count, job->doc_starts, job->doc_count,
                    &job->written))
    return true;
  size_t n = strlen(r->out.dir) + strlen(name) + 2;
  char *current = malloc(n);
  if (!current) return false;
  snprintf(current, n, "%s/%s", r->out.dir, name);
  bool same = shard_matches(current, &r->write_options, job->tokens, job->token_count, job->doc_starts,
                            job->doc_count, &job->written);
  free(current);
  if (same && convert_output_adopt(&r->out, name) != WK_OK) {
    wk_logf(WK_LOG_DEBUG, "converter: %s (writing the shard instead)", wk_last_error());
    wk_clear_error();
    same = false;
  }
  return same;
}

static WkStatus flush_shard(Run *r) {
  if (r->start_count == 0) return WK_OK;
  ShardJob *job = calloc(1, sizeof *job);
  if (!job) return WK_FAIL(WK_ERR_NOMEM, "out of memory: shard job");
  job->index = r->shard_count;
  char name[32];
  snprintf(name, sizeof name, "shard-%05u.wks", job->index);
  job->path = convert_output_path(&r->out, name);
  uint32_t blocks = wk_shard_block_count(&r->write_options, r->buffer_tokens);
  job->piece_count = blocks < r->threads ? blocks : r->threads;
  if (job->piece_count == 0) job->piece_count = 1;
  job->pieces = calloc(job->piece_count, sizeof *job->pieces);
  if (!job->path || !job->pieces) {
    free(job->path), free(job->pieces), free(job);
    return WK_FAIL(WK_ERR_NOMEM, "out of memory: shard job");
  }
  job->tokens = r->buffer;
  job->token_count = r->buffer_tokens;
  job->token_capacity = r->buffer_capacity;
  job->doc_starts = r->starts;
  job->doc_count = r->start_count;
  job->doc_capacity = r->start_capacity;
  r->buffer = NULL;
  r->buffer_tokens = r->buffer_capacity = 0;
  r->starts = NULL;
  r->start_count = r->start_capacity = 0;
  /* Consecutive, nearly equal block ranges, one per thread. */
  for (uint32_t p = 0, first = 0; p < job->piece_count; p++) {
    uint32_t count = blocks / job->piece_count + (p < blocks % job->piece_count);
    job->pieces[p] = (PieceJob){.kind = JOB_PIECE, .shard = job, .first_block = first, .block_count = count};
    first += count;
  }
  job->pieces_left = job->piece_count;
  if (r->shard_count == r->shard_capacity) {
    uint32_t cap = r->shard_capacity ? r->shard_capacity * 2 : 16;
    ShardJob **grown = realloc(r->shards, cap * sizeof *grown);
    if (!grown) {
      free_shard_inputs(NULL, job);
      free(job->pieces), free(job->path), free(job);
      return WK_FAIL(WK_ERR_NOMEM, "out of memory: shard list");
    }
    r->shards = grown;
    r->shard_capacity = cap;
  }
  if (param(r->cv, WK_CONVERT_RESUME) && reusable(r, job, name)) {
    r->cv->stats.reused++;
    job->done = true;
    job->pieces_left = 0;
    free_shard_inputs(r, job);
    pthread_mutex_lock(&r->lock);
    r->shards[r->shard_count++] = job;
    pthread_mutex_unlock(&r->lock);
    return WK_OK;
  }
  pthread_mutex_lock(&r->lock);
  while (r->shards_in_flight >= MAX_SHARDS_IN_FLIGHT) pthread_cond_wait(&r->changed, &r->lock);
  r->shards[r->shard_count++] = job;
  r->shards_in_flight++;
  pthread_mutex_unlock(&r->lock);
  for (uint32_t p = 0; p < job->piece_count; p++) WK_TRY(wk_queue_push(r->jobs, &job->pieces[p], -1));
  return WK_OK;
}

static WkStatus end_document(Run *r) {
  if (!r->doc_open) {
    r->cv->stats.empty++;
    return WK_OK;
  }
  uint32_t eos = r->tokenizer->eos;
  uint8_t stored[4] = {(uint8_t)eos, (uint8_t)(eos >> 8), (uint8_t)(eos >> 16), (uint8_t)(eos >> 24)};
  WK_TRY(append_tokens(r, stored, 1));
  r->doc_open = false;
  r->cv->stats.documents++;
  if (r->buffer_tokens >= (uint64_t)param(r->cv, WK_CONVERT_SHARD_TOKENS)) WK_TRY(flush_shard(r));
  return WK_OK;
}

static WkStatus keep_bad_line(WkConverter *cv, const char *path, uint64_t line, const char *reason) {
  cv->stats.bad++;
  if (cv->bad_kept >= MAX_BAD_KEPT) return WK_OK;
  if (cv->bad_kept == 0) {
    cv->bad_lines = calloc(MAX_BAD_KEPT, sizeof *cv->bad_lines);
    if (!cv->bad_lines) return WK_FAIL(WK_ERR_NOMEM, "out of memory: bad line list");
  }
  size_t n = strlen(path) + strlen(reason) + 32;
  char *text = malloc(n);
  if (!text) return WK_FAIL(WK_ERR_NOMEM, "out of memory: bad line list");
  snprintf(text, n, "%s:%" PRIu64 ": %s", path, line, reason);
  cv->bad_lines[cv->bad_kept++] = text;
  return WK_OK;
}

static WkStatus consume_chunk(Run *r, Chunk *c) {
  WkConverter *cv = r->cv;
  const Input *in = &cv->inputs[c->input];
  if (c->status != WK_OK) return WK_FAIL(c->status, "%s", c->message);
  if (c->first) r->line_base = 0;
  for (size_t k = 0; k < c->bad_count; k++) {
    uint64_t line = r->line_base + c->bad[k].line;
    if (param(cv, WK_CONVERT_STRICT))
      return WK_FAIL(WK_ERR_FORMAT, "%s:%" PRIu64 ": %s (--strict: bad lines are fatal)", in->path, line,
                     c->bad[k].reason);
    WK_TRY(keep_bad_line(cv, in->path, line, c->bad[k].reason));
  }
  r->line_base += c->lines;
  cv->stats.nulls += c->nulls;
  const uint8_t *stored = (const uint8_t *)c->tokens.data;
  uint32_t width = r->write_options.token_bytes;
  uint64_t position = 0;
  for (size_t d = 0; d < c->doc_count; d++) {
    WK_TRY(append_tokens(r, stored + position * width, c->doc_ends[d] - position));
    WK_TRY(end_document(r));
    position = c->doc_ends[d];
  }
  WK_TRY(append_tokens(r, stored + position * width, c->tokens.length - position));
  if (c->last && r->doc_open) WK_TRY(end_document(r)); /* a .bin file ends its last document */
  cv->stats.input_bytes += c->input_bytes;
  return WK_OK;
}

static void draw_progress(Run *r, bool final) {
  uint64_t now = wk_now_ns();
  if (!final && now - r->last_draw_ns < 100 * 1000000ull) return;
  r->last_draw_ns = now;
  const WkConverter *cv = r->cv;
  double fraction = cv->total_input_bytes ? (double)cv->stats.input_bytes / (double)cv->total_input_bytes : 1.0;
  if (fraction > 1) fraction = 1;
  double seconds = (double)(now - r->start_ns) / 1e9;
  double mbps = seconds > 0 ? (double)cv->stats.input_bytes / seconds / 1e6 : 0;
  enum { WIDTH = 30 };
  char bar[WIDTH + 1];
  int filled = (int)(fraction * WIDTH);
  for (int k = 0; k < WIDTH; k++) bar[k] = k < filled ? '=' : k == filled ? '>' : ' ';
  bar[WIDTH] = '\0';
  fprintf(stderr, "\r[%s] %5.1f%%  %7.1f MB/s  %" PRIu64 " docs  %u shards  %" PRIu64 " bad%s", bar,
          fraction * 100, mbps, cv->stats.documents, r->shard_count, cv->stats.bad, final ? "\n" : "");
  fflush(stderr);
}

/* Waits for the next chunk in order; NULL at the end of the input or on a producer failure. */
static Chunk *next_chunk(Run *r, WkStatus *status) {
  pthread_mutex_lock(&r->lock);
  for (;;) {
    if (r->consumed < r->produced) {
      Chunk *c = r->ring[r->consumed % r->ring_size];
      if (c->done) {
        pthread_mutex_unlock(&r->lock);
        return c;
      }
    } else if (r->producer_done) {
      *status = r->producer_status;
      if (*status != WK_OK) WK_FAIL(*status, "%s", r->producer_message);
      pthread_mutex_unlock(&r->lock);
      return NULL;
    }
    if (param(r->cv, WK_CONVERT_PROGRESS)) {
      /* Wake up now and then to keep the bar moving during long chunks. */
      struct timespec deadline;
      clock_gettime(CLOCK_REALTIME, &deadline);
      deadline.tv_nsec += 100 * 1000000;
      if (deadline.tv_nsec >= 1000000000) deadline.tv_sec++, deadline.tv_nsec -= 1000000000;
      pthread_cond_timedwait(&r->changed, &r->lock, &deadline);
      pthread_mutex_unlock(&r->lock);
      draw_progress(r, false);
      pthread_mutex_lock(&r->lock);
    } else {
      pthread_cond_wait(&r->changed, &r->lock);
    }
  }
}

static void chunk_consumed(Run *r) {
  pthread_mutex_lock(&r->lock);
  Chunk *c = r->ring[r->consumed % r->ring_size];
  r->ring[r->consumed % r->ring_size] = NULL;
  r->consumed++;
  pool_put(&r->chunk_tokens, c->tokens.data, c->tokens.capacity);
  c->tokens.data = NULL;
  pthread_cond_broadcast(&r->changed);
  pthread_mutex_unlock(&r->lock);
  convert_chunk_free(c);
}

static WkStatus build(Run *r) {
  WkStatus status = WK_OK;
  Chunk *c;
  while ((c = next_chunk(r, &status)) != NULL) {
    status = consume_chunk(r, c);
    chunk_consumed(r);
    if (status != WK_OK) return status;
    if (param(r->cv, WK_CONVERT_PROGRESS)) draw_progress(r, false);
  }
  if (status != WK_OK) return status;
  if (r->doc_open) WK_TRY(end_document(r));
  return flush_shard(r);
}

/* ---- output directory and index ----------------------------------------------------------------- */

/* A run that found no document writes no dataset: an empty one would only fail later, in the loader
 * ("partitions must be between 1 and the shard count (0)"). Why is the inputs': the first line
 * skipped says it. */
static WkStatus require_documents(const WkConverter *cv) {
  if (cv->stats.documents > 0) return WK_OK;
  return WK_FAIL(WK_ERR_FORMAT, "converter: no document in %llu input%s (%llu bad, %llu empty, %llu null skipped)%s%s; "
                 "'%s' is not written", (unsigned long long)cv->stats.inputs, cv->stats.inputs == 1 ? "" : "s",
                 (unsigned long long)cv->stats.bad, (unsigned long long)cv->stats.empty,
                 (unsigned long long)cv->stats.nulls, cv->bad_kept ? ": the first skipped, " : "",
                 cv->bad_kept ? cv->bad_lines[0] : "", cv->out_dir);
}

static WkStatus write_index(Run *r) {
  WkConverter *cv = r->cv;
  WkIndex index = {
      .version = WK_INDEX_VERSION,
      .tokenizer = (char *)r->tokenizer->name,
      .tokenizer_fingerprint = r->tokenizer->fingerprint,
      .vocab_size = r->tokenizer->vocab_size,
      .eos = r->tokenizer->eos,
      .token_bytes = r->write_options.token_bytes,
      .shard_count = r->shard_count,
  };
  WkIndexShard *shards = wk_calloc(r->shard_count, sizeof *shards, "index shards");
  if (!shards) return WK_ERR_NOMEM;
  for (uint32_t i = 0; i < r->shard_count; i++) {
    const ShardJob *job = r->shards[i];
    const char *slash = strrchr(job->path, '/');
    shards[i] = (WkIndexShard){.name = (char *)(slash ? slash + 1 : job->path), .tokens = job->token_count,
                               .documents = job->doc_count, .bytes = job->written.bytes,
                               .checksum = job->written.header_hash};
    index.tokens += job->token_count;
    index.documents += job->doc_count;
    cv->stats.output_bytes += job->written.bytes;
  }
  index.shards = shards;
  cv->stats.tokens = index.tokens;
  cv->stats.shards = r->shard_count;
  char extra[512];
  char compression[32];
  if (param(cv, WK_CONVERT_COMPRESSION))
    snprintf(compression, sizeof compression, "zstd:%d", (int)param(cv, WK_CONVERT_LEVEL));
  else snprintf(compression, sizeof compression, "none");
  static const char *const SPLIT_NAMES[] = {[WK_TEXT_SPLIT_FILE] = "file", [WK_TEXT_SPLIT_PARAGRAPH] = "paragraph",
                                            [WK_TEXT_SPLIT_LINE] = "line"};
  snprintf(extra, sizeof extra,
           "\"compression\": \"%s\", \"block_tokens\": %lld, \"shard_tokens\": %lld, \"split\": \"%s\", "
           "\"inputs\": %zu, \"bad\": %" PRIu64 ", \"empty\": %" PRIu64 ", \"nulls\": %" PRIu64,
           compression, (long long)param(cv, WK_CONVERT_BLOCK_TOKENS), (long long)param(cv, WK_CONVERT_SHARD_TOKENS),
           SPLIT_NAMES[param(cv, WK_CONVERT_TEXT_SPLIT)],
           cv->input_count, cv->stats.bad, cv->stats.empty, cv->stats.nulls);
  char *text = NULL;
  size_t length = 0;
  WkStatus status = wk_index_format(&index, extra, &text, &length);
  free(shards);
  if (status != WK_OK) return status;
  char *path = convert_output_path(&r->out, "index.json"), *tmp = convert_output_path(&r->out, "index.json.tmp");
  if (!path || !tmp) {
    free(text), free(path), free(tmp);
    return WK_ERR_NOMEM;
  }
  FILE *f = fopen(tmp, "wb");
  if (!f) status = WK_FAIL_ERRNO("create", tmp);
  if (status == WK_OK && fwrite(text, 1, length, f) != length) status = WK_FAIL_ERRNO("write", tmp);
  if (f && fclose(f) != 0 && status == WK_OK) status = WK_FAIL_ERRNO("close", tmp);
  if (status == WK_OK && rename(tmp, path) != 0) status = WK_FAIL_ERRNO("rename into place", path);
  if (status != WK_OK) unlink(tmp);
  free(text), free(path), free(tmp);
  return status;
}

static WkStatus choose_tokenizer(WkConverter *cv, const WkTokenizer **out) {
  size_t bins = 0;
  const char *bin_example = NULL, *text_example = NULL;
  for (size_t i = 0; i < cv->input_count; i++) {
    if (cv->inputs[i].kind == INPUT_TOKENS_BIN) bins++, bin_example = cv->inputs[i].path;
    else text_example = cv->inputs[i].path;
  }
  if (bins && text_example)
    return WK_FAIL(WK_ERR_INVALID_ARG, "converter: token files ('%s') and text ('%s') cannot share a dataset; "
                   "convert them separately", bin_example, text_example);
  const WkTokenizer *gpt2 = wk_tokenizer_find("gpt2");
  const WkTokenizer *t = cv->tokenizer ? cv->tokenizer : bins ? gpt2 : wk_tokenizer_find("bytes");
  if (bins && t != gpt2)
    return WK_FAIL(WK_ERR_INVALID_ARG, "converter: '%s' holds GPT-2 tokens; use --tokenizer gpt2 (not %s)",
                   bin_example, t->name);
  if (!bins && !t->encode)
    return WK_FAIL(WK_ERR_INVALID_ARG, "converter: tokenizer '%s' only describes pre-tokenized .bin inputs; to "
                   "encode text give a tokenizer.json or a .tiktoken rank file (or bytes)", t->name);
  if (t->eos == WK_TOKENIZER_NONE)
    return WK_FAIL(WK_ERR_INVALID_ARG, "converter: tokenizer '%s' names no EOS token to end documents with; name "
                   "one (wick.shard --eos TEXT, wk_tokenizer_set WK_TOKENIZER_EOS)", t->name);
  *out = t;
  return WK_OK;
}

WkStatus wk_converter_run(WkConverter *cv) {
  if (!cv) return WK_FAIL(WK_ERR_INVALID_ARG, "wk_converter_run: converter is NULL");
  if (cv->input_count == 0) return WK_FAIL(WK_ERR_INVALID_ARG, "converter: no input files");
  uint64_t start_ns = wk_now_ns();
  for (size_t i = 0; i < cv->bad_kept; i++) free(cv->bad_lines[i]);
  cv->bad_kept = 0;
  memset(&cv->stats, 0, sizeof cv->stats);
  cv->stats.inputs = cv->input_count;
  for (size_t i = 0; i < cv->input_count; i++) cv->inputs[i].headerless = param(cv, WK_CONVERT_HEADERLESS_BIN) != 0;

  Run r = {.cv = cv, .threads = (uint32_t)param(cv, WK_CONVERT_THREADS), .start_ns = start_ns};
  WK_TRY(choose_tokenizer(cv, &r.tokenizer));
  r.context = (ChunkContext){.tokenizer = r.tokenizer, .field = cv->field, .json_field = cv->json_field,
                             .split = (WkTextSplit)param(cv, WK_CONVERT_TEXT_SPLIT),
                             .inputs = cv->inputs};
  r.write_options = (WkShardWriteOptions){
      .token_bytes = r.tokenizer->vocab_size <= 65536 ? 2 : 4,
      .vocab_size = r.tokenizer->vocab_size,
      .eos = r.tokenizer->eos,
      .block_tokens = (uint32_t)param(cv, WK_CONVERT_BLOCK_TOKENS),
      .codec = param(cv, WK_CONVERT_COMPRESSION) ? WK_CODEC_ZSTD : WK_CODEC_RAW,
      .level = (int)param(cv, WK_CONVERT_LEVEL),
  };
  WK_TRY(convert_output_open(cv->out_dir, param(cv, WK_CONVERT_RESUME) != 0, &r.out));

  r.ring_size = 2 * (uint64_t)r.threads + 2;
  r.ring = calloc(r.ring_size, sizeof *r.ring);
  r.jobs = wk_queue_new(r.ring_size + (uint64_t)MAX_SHARDS_IN_FLIGHT * r.threads + 1);
  if (!r.ring || !r.jobs) {
    free(r.ring);
    wk_queue_free(r.jobs);
    WkStatus status = WK_FAIL(WK_ERR_NOMEM, "out of memory starting the converter");
    convert_output_close(&r.out, true);
    return status;
  }
  pthread_mutex_init(&r.lock, NULL);
  pthread_cond_init(&r.changed, NULL);
  atomic_init(&r.stop, false);

  pthread_t producer, workers[MAX_THREADS];
  uint32_t started = 0;
  bool producer_started = pthread_create(&producer, NULL, producer_main, &r) == 0;
  for (; producer_started && started < r.threads; started++)
    if (pthread_create(&workers[started], NULL, worker_main, &r) != 0) break;
  WkStatus status = WK_OK;
  if (!producer_started || started == 0) status = WK_FAIL(WK_ERR_NOMEM, "converter: cannot start threads");
  if (status == WK_OK) status = build(&r);

  /* Stop: wake the producer, let the workers finish what they hold (they skip work once stop is set
   * on failure), then collect shard results. */
  if (status != WK_OK) atomic_store(&r.stop, true);
  pthread_mutex_lock(&r.lock);
  pthread_cond_broadcast(&r.changed);
  pthread_mutex_unlock(&r.lock);
  if (producer_started) pthread_join(producer, NULL);
  wk_queue_close(r.jobs);
  for (uint32_t k = 0; k < started; k++) pthread_join(workers[k], NULL);
  for (uint64_t s = r.consumed; s < r.produced; s++) convert_chunk_free(r.ring[s % r.ring_size]);
  for (uint32_t i = 0; i < r.shard_count && status == WK_OK; i++)
    if (r.shards[i]->status != WK_OK) status = WK_FAIL(r.shards[i]->status, "%s", r.shards[i]->message);
  if (status == WK_OK) status = require_documents(cv);
  if (status == WK_OK) status = write_index(&r);
  if (status == WK_OK) status = convert_output_publish(&r.out, r.shard_count);
  convert_output_close(&r.out, status != WK_OK);
  for (uint32_t i = 0; i < r.shard_count; i++) {
    free_shard_inputs(NULL, r.shards[i]);
    free(r.shards[i]->pieces);
    free(r.shards[i]->path);
    free(r.shards[i]);
  }
  free(r.shards);
  pool_free(&r.shard_buffers);
  pool_free(&r.shard_starts);
  pool_free(&r.chunk_tokens);
  free(r.buffer);
  free(r.starts);
  free(r.ring);
  wk_queue_free(r.jobs);
  pthread_cond_destroy(&r.changed);
  pthread_mutex_destroy(&r.lock);
  cv->stats.seconds = (double)(wk_now_ns() - start_ns) / 1e9;
  if (param(cv, WK_CONVERT_PROGRESS)) draw_progress(&r, true);
  return status;
}
