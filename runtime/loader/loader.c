/*
 * loader.c — the pipeline: reader threads fill a bounded ring of micro-batches ahead of the
 * consumer (docs/pipeline.md). The ring's sizing and layout are ring.c's, planning plan.c's, the audit
 * file audit.c's (loader.h has what they share).
 *
 * One lock guards the ring. A reader thread takes the planner (one at a time) and the next
 * micro-batch number under the lock, plans it without the lock (mix allocation once per step, then
 * locating its rows: arithmetic on the order's tables, which are built when the order enters a new
 * window; in pad mode that reads shards' document indexes, so planning can wait on I/O while the
 * other threads fill and the consumer takes), and reads, decodes and packs its rows without the lock,
 * through each source's node cache reader (node_reader.c). The consumer takes micro-batches strictly
 * in order, so the stream is the same for any number of threads. The ring has `prefetch` buffers: a full ring stops the readers
 * (backpressure, bounded memory).
 *
 * Each source's low water (the first draw this loader may still read: the earliest step among the
 * micro-batches being filled) is passed to its node cache reader whenever a micro-batch is done, so decoded
 * units are let go exactly when the order has passed them.
 *
 * The consumer takes a micro-batch as tensors made once per ring slot (device_copy.c); with a device,
 * the reader that filled a slot also queues its copy there. A step's micro-batches stay held (out of
 * the readers' reach) until the consumer asks for the next step's first, so they can be used together.
 *
 * The cursor reflects what the consumer has received, never what was prefetched.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "../io/remote/remote.h" /* wk_remote_options_check */
#include "../tokenizer/tokenizer.h" /* WK_TEMPLATE_MAX: the longest template a dataset records */
#include "loader.h"

/* Shuffle defaults: a window of ~8 default-sized shards (2^26 tokens each) permuted together, and
 * pools of 4M tokens (8 MiB of u16) whose samples are shuffled together: the working set. */
#define DEFAULT_WINDOW_TOKENS (1ll << 29)
#define DEFAULT_POOL_TOKENS (1ll << 22)
#define MAX_SHUFFLE_TOKENS (1ll << 40)
#define DEFAULT_CACHE_BYTES (64ll << 20) /* per source and node */
/* fallback 0 for MICRO_BATCH and PREFETCH means "derived at start". */
static const WkParamSpec PARAM_SPECS[WK_LOADER_PARAM_COUNT] = {
    [WK_LOADER_SEQ_LEN] = {1, 1 << 24, 1024, "seq_len"},
    [WK_LOADER_GLOBAL_BATCH] = {1, 1 << 24, 8, "global_batch"},
    [WK_LOADER_MICRO_BATCH] = {0, 1 << 24, 0, "micro_batch"},
    [WK_LOADER_WORLD_SIZE] = {1, 1 << 20, 1, "world_size"},
    [WK_LOADER_RANK] = {0, (1 << 20) - 1, 0, "rank"},
    [WK_LOADER_SEED] = {INT64_MIN, INT64_MAX, 0, "seed"},
    [WK_LOADER_SHUFFLE] = {0, 1, 1, "shuffle"},
    [WK_LOADER_WINDOW_TOKENS] = {1, MAX_SHUFFLE_TOKENS, DEFAULT_WINDOW_TOKENS, "window_tokens"},
    [WK_LOADER_POOL_TOKENS] = {1, MAX_SHUFFLE_TOKENS, DEFAULT_POOL_TOKENS, "pool_tokens"},
    [WK_LOADER_PARTITIONS] = {1, 1 << 20, 1, "partitions"},
    [WK_LOADER_CHUNK] = {1, 1 << 24, 1, "chunk"},
    [WK_LOADER_MODE] = {0, 1, 0, "mode"},
    [WK_LOADER_THREADS] = {1, MAX_THREADS, 2, "threads"},
    [WK_LOADER_PREFETCH] = {0, 4096, 0, "prefetch"},
    [WK_LOADER_ON_CORRUPT] = {0, 1, 0, "on_corrupt"},
    [WK_LOADER_PAD_LAST] = {0, 1, 0, "pad_last"},
    [WK_LOADER_DOCUMENT_IDS] = {0, 1, 0, "document_ids"},
    [WK_LOADER_MEMORY_BUDGET] = {0, INT64_MAX, 0, "memory_budget"},
    [WK_LOADER_NODE_CACHE_BYTES] = {0, INT64_MAX, DEFAULT_CACHE_BYTES, "node_cache_bytes"},
    [WK_LOADER_DTYPE] = {WK_I32, WK_I64, WK_I32, "dtype"},
    [WK_LOADER_DEVICE] = {WK_LOADER_ON_CPU, MAX_DEVICE_INDEX, WK_LOADER_ON_CPU, "device"},
    [WK_LOADER_MIXED_TOKENIZERS] = {0, 1, 0, "mixed_tokenizers"},
    [WK_LOADER_BLOB_BYTES] = {1, 1ll << 32, 1 << 20, "blob_bytes"},
};
static const WkParamTable PARAMS = {"loader", PARAM_SPECS, WK_LOADER_PARAM_COUNT};

/* ---- configuration ----------------------------------------------------------------------------- */

WkLoader *wk_loader_new(void) {
  WkLoader *loader = wk_calloc(1, sizeof *loader, "loader");
  if (!loader) return NULL;
  wk_param_defaults(&PARAMS, loader->params);
  wk_remote_options_default(&loader->remote);
  pthread_mutex_init(&loader->lock, NULL);
  loader->audit_fd = -1;
  pthread_cond_init(&loader->ready, NULL);
  pthread_cond_init(&loader->free, NULL);
  loader->wake_consumer_at = UINT64_MAX;
  return loader;
}

WkStatus wk_loader_param_bounds(WkLoaderParam param, int64_t *min, int64_t *max) {
  return wk_param_bounds(&PARAMS, (int)param, min, max);
}

WkStatus wk_loader_param_default(WkLoaderParam param, int64_t *value) {
  return wk_param_default(&PARAMS, (int)param, value);
}

static WkStatus require_not_started(const WkLoader *loader, const char *what) {
  if (loader->started) return WK_FAIL(WK_ERR_INVALID_ARG, "%s: the loader has already started", what);
  return WK_OK;
}

WkStatus wk_loader_set(WkLoader *loader, WkLoaderParam param, int64_t value) {
  int64_t min, max;
  WK_TRY(wk_loader_param_bounds(param, &min, &max));
  WK_TRY(require_not_started(loader, PARAM_SPECS[param].name));
  WK_TRY(wk_param_check(&PARAMS, (int)param, value, min, max));
  if (param == WK_LOADER_DEVICE) WK_TRY(wk_device_copy_check(value));
  loader->params[param] = value;
  return WK_OK;
}

WkStatus wk_loader_set_remote(WkLoader *loader, const WkRemoteOptions *remote) {
  WK_TRY(require_not_started(loader, "remote options"));
  WkRemoteOptions options;
  if (remote) options = *remote;
  else wk_remote_options_default(&options);
  WK_TRY(wk_remote_options_check(&options));
  char *copy = options.cache_dir ? strdup(options.cache_dir) : NULL;
  if (options.cache_dir && !copy) return WK_FAIL(WK_ERR_NOMEM, "out of memory for cache_dir");
  free(loader->cache_dir);
  loader->cache_dir = copy;
  loader->remote = options;
  loader->remote.cache_dir = copy;
  return WK_OK;
}

WkStatus wk_loader_add_source(WkLoader *loader, const char *path, uint64_t max_epochs, uint32_t *index) {
  WK_TRY(require_not_started(loader, "add_source"));
  uint32_t i = loader->mix.count;
  if (i == WK_MIX_MAX_SOURCES) return WK_FAIL(WK_ERR_INVALID_ARG, "a mix holds at most %d sources", WK_MIX_MAX_SOURCES);
  WkDataset *ds = wk_dataset_open_with(path, &loader->remote);
  if (!ds) return wk_last_status();
  char *copy = strdup(path);
  if (!copy) {
    wk_dataset_close(ds);
    return WK_FAIL(WK_ERR_NOMEM, "out of memory for a source path");
  }
  loader->sources[i] = (Source){.path = copy, .ds = ds};
  loader->mix.max_epochs[i] = max_epochs;
  loader->mix.weight[i] = (WkSchedule){.points = 1, .steps = {0}, .weights = {1.0}};
  loader->mix.count++;
  *index = i;
  return WK_OK;
}

WkStatus wk_loader_set_weight(WkLoader *loader, uint32_t source, const double *steps, const double *weights,
                              uint32_t points) {
  WK_TRY(require_not_started(loader, "set_weight"));
  if (source >= loader->mix.count) return WK_FAIL(WK_ERR_INVALID_ARG, "no source %u", source);
  if (points == 0 || points > WK_SCHEDULE_MAX_POINTS)
    return WK_FAIL(WK_ERR_INVALID_ARG, "a weight schedule has 1 to %d points, got %u", WK_SCHEDULE_MAX_POINTS, points);
  WkSchedule *schedule = &loader->mix.weight[source];
  for (uint32_t p = 0; p < points; p++) {
    if (!(weights[p] >= 0) || !isfinite(weights[p]))
      return WK_FAIL(WK_ERR_INVALID_ARG, "weight %g of source %u must be a finite number >= 0", weights[p], source);
    if (!isfinite(steps[p]) || (p > 0 && !(steps[p] >= steps[p - 1])))
      return WK_FAIL(WK_ERR_INVALID_ARG, "weight schedule steps must be finite and increasing (source %u)", source);
    schedule->steps[p] = steps[p];
    schedule->weights[p] = weights[p];
  }
  schedule->points = points;
  return WK_OK;
}

WkStatus wk_loader_restore(WkLoader *loader, const char *cursor) {
  WK_TRY(require_not_started(loader, "restore"));
  WK_TRY(wk_cursor_parse(cursor, &loader->start));
  loader->restored = true;
  return WK_OK;
}

/* ---- start -------------------------------------------------------------------------------------- */

static WkOrderConfig order_config(const WkLoader *loader) {
  return (WkOrderConfig){
      .seq_len = (uint32_t)param(loader, WK_LOADER_SEQ_LEN),
      .mode = (WkPackMode)param(loader, WK_LOADER_MODE),
      .seed = (uint64_t)param(loader, WK_LOADER_SEED),
      .shuffle = param(loader, WK_LOADER_SHUFFLE) != 0,
      .window_tokens = (uint64_t)param(loader, WK_LOADER_WINDOW_TOKENS),
      .buffer_tokens = (uint64_t)param(loader, WK_LOADER_POOL_TOKENS),
      .partitions = (uint32_t)param(loader, WK_LOADER_PARTITIONS),
      .chunk = (uint32_t)param(loader, WK_LOADER_CHUNK),
  };
}

static WkStatus derive_batch_shape(WkLoader *loader) {
  uint32_t G = (uint32_t)param(loader, WK_LOADER_GLOBAL_BATCH);
  uint32_t W = (uint32_t)param(loader, WK_LOADER_WORLD_SIZE);
  if (param(loader, WK_LOADER_RANK) >= W)
    return WK_FAIL(WK_ERR_INVALID_ARG, "rank %lld is not below world size %u", (long long)param(loader, WK_LOADER_RANK), W);
  if (G % W != 0)
    return WK_FAIL(WK_ERR_INVALID_ARG, "global batch %u is not divisible by world size %u", G, W);
  loader->per_rank = G / W;
  uint32_t m = param(loader, WK_LOADER_MICRO_BATCH) ? (uint32_t)param(loader, WK_LOADER_MICRO_BATCH) : loader->per_rank;
  if (loader->per_rank % m != 0)
    return WK_FAIL(WK_ERR_INVALID_ARG, "micro batch %u does not divide the %u samples per rank (global batch %u / world %u)",
                   m, loader->per_rank, G, W);
  loader->rows = m;
  loader->micro_steps = loader->per_rank / m;
  loader->mix.global_batch = G;
  loader->mix.seed = (uint64_t)param(loader, WK_LOADER_SEED);
  loader->mix.pad_last = param(loader, WK_LOADER_PAD_LAST) != 0;
  return WK_OK;
}

/* Names the stream a source's node cache serves: its content and every setting of its order. */
static uint64_t stream_identity(const WkLoader *loader, const Source *source) {
  WkOrderConfig o = order_config(loader);
  uint64_t fields[] = {wk_order_fingerprint(source->order), o.seq_len, o.mode, o.seed, o.shuffle, o.window_tokens,
                       o.buffer_tokens, o.partitions, o.chunk};
  uint64_t h = 0x6e6f6465;
  for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++) h = wk_mix64(h, fields[f]);
  /* and the per-token columns its units hold besides the tokens */
  uint32_t columns[WK_BATCH_MAX_COLUMNS];
  uint32_t n = loader_source_columns(loader, (uint32_t)(source - loader->sources), true, columns);
  for (uint32_t c = 0; c < n; c++) h = wk_mix64(h, columns[c] + 1);
  return h;
}

static WkStatus open_node_reader(WkLoader *loader, Source *source) {
  WkOrderConfig o = order_config(loader);
  WkNodeReaderConfig cfg = {.what = source->path, .cache_bytes = (uint64_t)param(loader, WK_LOADER_NODE_CACHE_BYTES),
                           .identity = stream_identity(loader, source), .seq_len = o.seq_len,
                           .unit_tokens = wk_order_unit_tokens(source->order),
                           .buffer_units = wk_order_buffer_units(source->order),
                           .window_boundaries = wk_order_max_window_boundaries(source->order)};
  uint32_t s = (uint32_t)(source - loader->sources);
  cfg.column_count = loader_source_columns(loader, s, true, cfg.columns);
  cfg.record_column_count = loader_source_columns(loader, s, false, cfg.record_columns);
  source->node_reader = wk_node_reader_new(source->ds, &cfg);
  return source->node_reader ? WK_OK : wk_last_status();
}

static WkStatus open_orders(WkLoader *loader) {
  WkOrderConfig config = order_config(loader);
  for (uint32_t i = 0; i < loader->mix.count; i++) {
    Source *source = &loader->sources[i];
    if (source->order) continue; /* opened by an earlier start that failed later on */
    source->order = wk_order_new(source->ds, &config);
    if (!source->order) return wk_error_context("source '%s'", source->path);
    source->ahead_from = NO_BUFFER;
    WK_TRY(open_node_reader(loader, source));
    loader->mix.epoch_length[i] = wk_order_epoch_length(source->order);
    if (loader->mix.epoch_length[i] == 0)
      return WK_FAIL(WK_ERR_INVALID_ARG, "source '%s' is too small for one epoch: it needs at least one sample of "
                     "%u tokens (seq_len + 1), and chunk x partitions = %u x %u samples", source->path,
                     config.seq_len + 1, config.chunk, config.partitions);
  }
  /* A source is known by its content (cursor, shuffle keys): the same dataset twice would draw
   * the same samples twice. */
  for (uint32_t i = 0; i < loader->mix.count; i++)
    for (uint32_t j = 0; j < i; j++)
      if (wk_order_fingerprint(loader->sources[i].order) == wk_order_fingerprint(loader->sources[j].order))
        return WK_FAIL(WK_ERR_INVALID_ARG, "sources '%s' and '%s' hold the same data; give it one entry in the mix "
                       "with the summed weight", loader->sources[j].path, loader->sources[i].path);
  return WK_OK;
}

/* The cursor must describe the same stream: anything that changes the order is refused. */
static WkStatus check_cursor(WkLoader *loader) {
  const WkCursor *c = &loader->start;
  WkOrderConfig o = order_config(loader);
  struct { const char *name; uint64_t cursor, loader; } same[] = {
      {"global batch", c->global_batch, loader->mix.global_batch}, {"seq_len", c->seq_len, o.seq_len},
      {"seed", c->seed, o.seed}, {"mode", c->mode, o.mode}, {"shuffle", c->shuffle, o.shuffle},
      {"shuffle window_tokens", c->window_tokens, o.window_tokens},
      {"shuffle pool_tokens", c->buffer_tokens, o.buffer_tokens}, {"partitions", c->partitions, o.partitions},
      {"chunk", c->chunk, o.chunk}};
  for (size_t f = 0; f < sizeof same / sizeof same[0]; f++)
    if (same[f].cursor != same[f].loader)
      return WK_FAIL(WK_ERR_INVALID_ARG, "the cursor was saved with %s %llu but this loader has %llu; they must match to resume",
                     same[f].name, (unsigned long long)same[f].cursor, (unsigned long long)same[f].loader);
  uint32_t W = (uint32_t)param(loader, WK_LOADER_WORLD_SIZE);
  if (c->micro != 0 && c->world != W)
    return WK_FAIL(WK_ERR_INVALID_ARG, "the cursor stops inside step %llu (micro-step %u) on world size %u: "
                   "resume on world size %u needs a cursor saved at a step boundary",
                   (unsigned long long)c->step, c->micro, c->world, W);
  if (c->micro >= loader->micro_steps)
    return WK_FAIL(WK_ERR_INVALID_ARG, "the cursor's micro-step %u is not below %u", c->micro, loader->micro_steps);
  /* Sources are matched by content; a source new to the cursor starts from its beginning. */
  for (uint32_t i = 0; i < loader->mix.count; i++) {
    uint64_t fingerprint = wk_order_fingerprint(loader->sources[i].order);
    for (uint32_t j = 0; j < c->sources; j++)
      if (c->fingerprint[j] == fingerprint) loader->positions[i] = c->position[j];
  }
  for (uint32_t j = 0; j < c->sources; j++) {
    bool present = false;
    for (uint32_t i = 0; i < loader->mix.count; i++)
      present = present || c->fingerprint[j] == wk_order_fingerprint(loader->sources[i].order);
    if (!present) wk_logf(WK_LOG_WARN, "cursor source %016llx is not in this mix any more; its position is dropped",
                          (unsigned long long)c->fingerprint[j]);
  }
  loader->skipped = c->skipped;
  return WK_OK;
}

static void *reader_thread(void *arg);

/* A reader thread's own state: one node cache reader context per source (its memo and scratch buffers). */
static WkStatus make_reader(WkLoader *loader, Reader *reader) {
  reader->loader = loader;
  for (uint32_t i = 0; i < loader->mix.count; i++) {
    if (reader->contexts[i]) continue; /* made by an earlier start that failed later on */
    reader->contexts[i] = wk_node_reader_thread_new(loader->sources[i].node_reader);
    if (!reader->contexts[i]) return wk_last_status();
  }
  return WK_OK;
}

enum { TEMPLATE_TEXT_BYTES = WK_TEMPLATE_MAX * 11 + 8 };

/* What the converter put around each document of a source (its tokenizer's template, when applied), as
 * text for comparison and messages: "128000 $A" (Llama 3's BOS), "101 $A 102", "$A" for nothing. */
static void describe_template(const WkDataset *ds, char out[TEMPLATE_TEXT_BYTES]) {
  const uint32_t *ids;
  uint32_t prefix, suffix;
  if (wk_dataset_template(ds, &ids, &prefix, &suffix) != 1) prefix = suffix = 0;
  size_t used = 0;
  for (uint32_t i = 0; i <= prefix + suffix; i++) {
    const char *gap = i ? " " : "";
    int n = i == prefix ? snprintf(out + used, TEMPLATE_TEXT_BYTES - used, "%s$A", gap)
                        : snprintf(out + used, TEMPLATE_TEXT_BYTES - used, "%s%u", gap, ids[i < prefix ? i : i - 1]);
    used += (size_t)n; /* at most 11 bytes an id: it fits */
  }
}

/* The ids of every source mean the same text: one tokenizer (by fingerprint; by name where an old
 * index has none), one vocabulary, one EOS. Otherwise only when told (WK_LOADER_MIXED_TOKENIZERS). */
static WkStatus check_tokenizers(const WkLoader *loader) {
  if (param(loader, WK_LOADER_MIXED_TOKENIZERS)) return WK_OK;
  const Source *first = &loader->sources[0];
  for (uint32_t i = 1; i < loader->mix.count; i++) {
    const Source *s = &loader->sources[i];
    uint64_t a = wk_dataset_tokenizer_fingerprint(first->ds), b = wk_dataset_tokenizer_fingerprint(s->ds);
    bool same = a && b ? a == b : strcmp(wk_dataset_tokenizer(first->ds), wk_dataset_tokenizer(s->ds)) == 0;
    same = same && wk_dataset_vocab_size(first->ds) == wk_dataset_vocab_size(s->ds) &&
           wk_dataset_eos(first->ds) == wk_dataset_eos(s->ds);
    if (!same)
      return WK_FAIL(WK_ERR_INVALID_ARG, "sources '%s' (tokenizer %s, fingerprint %016llx, vocabulary %u, EOS %u) and "
                     "'%s' (tokenizer %s, fingerprint %016llx, vocabulary %u, EOS %u) were made by different tokenizers: "
                     "the same id would mean different text; convert them with one tokenizer, or allow it "
                     "(mixed_tokenizers = true)", first->path, wk_dataset_tokenizer(first->ds), (unsigned long long)a,
                     wk_dataset_vocab_size(first->ds), wk_dataset_eos(first->ds), s->path, wk_dataset_tokenizer(s->ds),
                     (unsigned long long)b, wk_dataset_vocab_size(s->ds), wk_dataset_eos(s->ds));
    char first_template[TEMPLATE_TEXT_BYTES], template[TEMPLATE_TEXT_BYTES];
    describe_template(first->ds, first_template);
    describe_template(s->ds, template);
    if (strcmp(first_template, template) != 0)
      return WK_FAIL(WK_ERR_INVALID_ARG, "sources '%s' (documents: %s) and '%s' (documents: %s) have different tokens "
                     "around their documents (the tokenizer's template applied to one only): convert them alike, "
                     "with or without --no-special-tokens, or allow it (mixed_tokenizers = true)", first->path,
                     first_template, s->path, template);
  }
  return WK_OK;
}

/* What start checks and opens before it allocates anything of the ring (again after a failed start
 * or a check: each step keeps what it opened). */
static WkStatus prepare(WkLoader *loader, const char *what) {
  WK_TRY(require_not_started(loader, what));
  if (loader->mix.count == 0) return WK_FAIL(WK_ERR_INVALID_ARG, "the loader has no source");
  WK_TRY(check_tokenizers(loader));
  WK_TRY(loader_resolve_columns(loader));
  WK_TRY(derive_batch_shape(loader));
  WK_TRY(open_orders(loader));
  if (loader->restored) WK_TRY(check_cursor(loader));
  return WK_OK;
}

WkStatus wk_loader_check(WkLoader *loader, uint64_t *ring_bytes) {
  WK_TRY(prepare(loader, "check"));
  uint32_t count = 0;
  WK_TRY(loader_size_ring(loader, &count));
  *ring_bytes = (uint64_t)count * loader->buffer_bytes;
  return WK_OK;
}

WkStatus wk_loader_start(WkLoader *loader) {
  WK_TRY(prepare(loader, "start"));
  if (!loader->device_copy) WK_TRY(wk_device_copy_new(param(loader, WK_LOADER_DEVICE), &loader->device_copy));
  WK_TRY(loader_allocate_ring(loader));
  memcpy(loader->start_positions, loader->positions, sizeof loader->positions);
  for (uint32_t i = 0; i < loader->mix.count; i++) loader->plan_low[i] = loader->positions[i].draws;
  for (uint32_t i = 0; i < loader->mix.count; i++)
    WK_TRY(wk_node_reader_start(loader->sources[i].node_reader, loader->positions[i].draws));
  uint32_t threads = (uint32_t)param(loader, WK_LOADER_THREADS);
  for (uint32_t t = 0; t < threads; t++) WK_TRY(make_reader(loader, &loader->readers[t]));
  loader->started = true;
  for (uint32_t t = 0; t < threads; t++) {
    /* Threads already running are stopped and joined by wk_loader_free. */
    if (wk_thread_create(&loader->threads[t], reader_thread, &loader->readers[t]) != 0)
      return WK_FAIL(WK_ERR_INTERNAL, "cannot start loader thread %u", t);
    loader->thread_count++;
  }
  return WK_OK;
}

/* ---- reading (no lock) --------------------------------------------------------------------------- */

/* Logs a skipped sample unless its reason (usually one bad block) was the last one logged, and
 * goes quiet after SKIP_LOG_LIMIT distinct reasons. Rare path: takes the lock. */
static void log_skip(WkLoader *loader, const Source *source, const WkSampleInfo *info) {
  const char *reason = wk_last_error();
  pthread_mutex_lock(&loader->lock);
  if (loader->skip_logs < SKIP_LOG_LIMIT && strcmp(reason, loader->last_skip_reason) != 0) {
    loader->skip_logs++;
    snprintf(loader->last_skip_reason, sizeof loader->last_skip_reason, "%s", reason);
    wk_logf(WK_LOG_WARN, "skipping corrupt samples of '%s' (first: shard %u, token %llu): %s%s", source->path,
            info->shard, (unsigned long long)info->offset, reason,
            loader->skip_logs == SKIP_LOG_LIMIT ? " (further skips are counted, not logged)" : "");
  }
  pthread_mutex_unlock(&loader->lock);
}

/* Reads a row's tokens and per-token columns through its source's node cache reader, and its other
 * columns, then completes the row. */
static WkStatus fill_row(WkLoader *loader, const Reader *reader, Buffer *b, uint32_t r) {
  uint32_t L = (uint32_t)param(loader, WK_LOADER_SEQ_LEN), s = b->info[r].source;
  Source *source = &loader->sources[s];
  uint8_t *columns[WK_BATCH_MAX_COLUMNS];
  uint32_t tail = loader_token_column_rows(loader, &b->rows, &b->locs[r], r, columns);
  WK_TRY(wk_node_reader_read(source->node_reader, reader->contexts[s], &b->locs[r], wk_rows_tokens(&b->rows, L, r),
                           b->rows.token_bytes, columns, tail));
  WK_TRY(loader_read_columns(loader, s, &b->locs[r], &b->rows, r));
  wk_pack_row((WkPackMode)param(loader, WK_LOADER_MODE), L, wk_dataset_eos(source->ds), &b->locs[r], &b->rows, r);
  return WK_OK;
}

static void fill_rows(WkLoader *loader, const Reader *reader, Buffer *b) {
  uint32_t L = (uint32_t)param(loader, WK_LOADER_SEQ_LEN);
  bool skip_corrupt = param(loader, WK_LOADER_ON_CORRUPT) == 1;
  for (uint32_t r = 0; r < loader->rows && b->status == WK_OK; r++) {
    WkSampleInfo *info = &b->info[r];
    if (info->status == WK_SAMPLE_PADDING) {
      wk_pack_empty_row(L, wk_dataset_eos(loader->sources[0].ds), &b->rows, r);
    } else {
      Source *source = &loader->sources[info->source];
      WkStatus status = fill_row(loader, reader, b, r);
      if (status == WK_ERR_FORMAT && skip_corrupt) {
        log_skip(loader, source, info);
        wk_pack_empty_row(L, wk_dataset_eos(source->ds), &b->rows, r);
        info->status = WK_SAMPLE_SKIPPED;
        b->skipped++;
      } else if (status != WK_OK) {
        b->status = status;
        snprintf(b->error, sizeof b->error, "source '%s': %s", source->path, wk_last_error());
        return;
      }
    }
  }
}

/* A failure of the copy to the device fails the micro-batch, like a read. */
static void copy_stage(WkLoader *loader, Buffer *b, WkStatus status) {
  if (status == WK_OK) return;
  b->status = status;
  snprintf(b->error, sizeof b->error, "copy to cuda:%lld: %s", (long long)param(loader, WK_LOADER_DEVICE),
           wk_last_error());
}

/* Micro-batches the readers may fill ahead of the consumer: the ring less the room for held ones. */
static uint32_t ahead_limit(const WkLoader *loader) { return loader->buffer_count - (loader->micro_steps - 1); }

static bool is_ready(const WkLoader *loader, uint64_t seq) {
  const Buffer *b = &loader->buffers[seq % loader->buffer_count];
  return b->state == BUFFER_READY && b->seq == seq;
}

static bool at_end(const WkLoader *loader) { return loader->ended && loader->consumed >= loader->end_seq; }

/* Lock held. What the waiting consumer needs before it runs again: its batch, and either the
 * batch it chose to wait for (see wait_for), a failure, or the end of the stream. */
static bool consumer_can_go(const WkLoader *loader) {
  if (at_end(loader)) return true;
  uint64_t seq = loader->consumed;
  if (!is_ready(loader, seq)) return false;
  return loader->wake_consumer_at == UINT64_MAX || is_ready(loader, loader->wake_consumer_at) || loader->ended ||
         loader->buffers[seq % loader->buffer_count].status != WK_OK;
}

/* Lock held. The first draw of source i this loader may still read: the earliest step among the
 * micro-batches being filled, or the step last planned. */
static uint64_t low_water(const WkLoader *loader, uint32_t i) {
  uint64_t low = loader->plan_low[i];
  for (uint32_t k = 0; k < loader->buffer_count; k++) {
    const Buffer *b = &loader->buffers[k];
    if (b->state == BUFFER_FILLING && b->before[i].draws < low) low = b->before[i].draws;
  }
  return low;
}

/* Lock held. The buffer of the next micro-batch when this reader may plan it now: no other planner,
 * its slot free and within the ahead limit, the stream not ended. */
static Buffer *plannable(WkLoader *loader) {
  if (loader->planning || loader->ended || loader->next_seq >= loader->consumed + ahead_limit(loader)) return NULL;
  Buffer *b = &loader->buffers[loader->next_seq % loader->buffer_count];
  return b->state == BUFFER_FREE ? b : NULL;
}

/* What a reader owes the others once it leaves the lock: woken under it, a thread would run only to
 * block on it. */
typedef struct {
  bool lows;                  /* each source's low water, for its node cache reader */
  uint64_t low[WK_MIX_MAX_SOURCES];
  bool consumer;              /* the consumer can go */
  bool planner;               /* a waiting reader can plan */
} Owed;

/* Lock held. Publishes a filled micro-batch: ready for the consumer (woken only when it can go), and
 * each source's low water. */
static void publish(WkLoader *loader, Buffer *b, Owed *owed) {
  b->state = BUFFER_READY;
  owed->consumer = consumer_can_go(loader);
  for (uint32_t i = 0; i < loader->mix.count; i++) owed->low[i] = low_water(loader, i);
  owed->lows = true;
}

/* Without the lock. */
static void pay(WkLoader *loader, Owed *owed) {
  if (owed->consumer) pthread_cond_signal(&loader->ready);
  if (owed->planner) pthread_cond_signal(&loader->free);
  for (uint32_t i = 0; owed->lows && i < loader->mix.count; i++)
    wk_node_reader_advance(loader->sources[i].node_reader, owed->low[i]);
  owed->lows = owed->consumer = owed->planner = false;
}

static bool owes(const Owed *owed) { return owed->lows || owed->consumer || owed->planner; }

/* Fills a planned micro-batch, without the lock: read-ahead, rows, the device copy, the counters. */
static void fill(WkLoader *loader, const Reader *reader, Buffer *b) {
  for (uint32_t a = 0; a < b->ahead_count; a++)
    wk_node_reader_read_ahead(loader->sources[b->ahead[a].source].node_reader, b->ahead[a].unit);
  if (b->status == WK_OK) copy_stage(loader, b, wk_batch_tensors_reuse(&b->tensors));
  if (b->status == WK_OK) fill_rows(loader, reader, b);
  if (b->status == WK_OK) copy_stage(loader, b, wk_batch_tensors_copy(&b->tensors, loader->device_copy));
  for (uint32_t i = 0; i < loader->mix.count; i++) wk_node_reader_thread_flush(loader->sources[i].node_reader, reader->contexts[i]);
}

/* Two lock round trips a micro-batch: one publishes the last filled micro-batch and takes the planner
 * for the next, one hands the planner on and marks the micro-batch filling. What a round trip owes the
 * other threads (wake-ups, the low waters for the node cache readers) is paid right after it unlocks,
 * and always before this reader sleeps (a peer rank may be waiting for that room, the consumer for that
 * micro-batch). A reader sleeps only when it cannot plan, and one waiter is woken per chance to plan
 * (waiters all wait for the same thing). */
static void *reader_thread(void *arg) {
  const Reader *reader = arg;
  WkLoader *loader = reader->loader;
  Owed owed = {0};
  pthread_mutex_lock(&loader->lock);
  while (!loader->stopping) {
    Buffer *b = plannable(loader);
    if (!b) {
      if (owes(&owed)) { /* not while asleep */
        pthread_mutex_unlock(&loader->lock);
        pay(loader, &owed);
        pthread_mutex_lock(&loader->lock);
        continue;
      }
      loader->readers_waiting++;
      pthread_cond_wait(&loader->free, &loader->lock);
      loader->readers_waiting--;
      continue;
    }
    /* Planning can read shards (a pad-mode window's document indexes, later remote round trips): it
     * runs outside the lock, one planner at a time, while the others fill and the consumer takes. */
    loader->planning = true;
    b->state = BUFFER_PLANNED;
    uint64_t seq = loader->next_seq;
    pthread_mutex_unlock(&loader->lock);
    pay(loader, &owed);
    bool more = loader_plan_next(loader, b);
    pthread_mutex_lock(&loader->lock);
    loader->planning = false;
    if (!more) {
      b->state = BUFFER_FREE;
      loader->ended = true;
      loader->end_seq = seq;
      owed.consumer = true; /* the end of the stream */
      continue;
    }
    for (uint32_t i = 0; i < loader->mix.count; i++) loader->plan_low[i] = loader->step_before[i].draws;
    loader->next_seq++;
    b->state = BUFFER_FILLING;
    owed.planner = loader->readers_waiting && plannable(loader);
    pthread_mutex_unlock(&loader->lock);
    pay(loader, &owed);
    fill(loader, reader, b);
    pthread_mutex_lock(&loader->lock);
    publish(loader, b, &owed);
  }
  pthread_mutex_unlock(&loader->lock);
  return NULL;
}

WkStatus wk_loader_sample_info(WkLoader *loader, uint32_t row, WkSampleInfo *out) {
  if (!loader->held) return WK_FAIL(WK_ERR_INVALID_ARG, "no batch has been returned yet");
  if (row >= loader->rows) return WK_FAIL(WK_ERR_INVALID_ARG, "row %u is not below %u", row, loader->rows);
  *out = loader->held->info[row];
  /* Hashed on request (audits, inspect), not for every row streamed. */
  uint32_t L = (uint32_t)param(loader, WK_LOADER_SEQ_LEN);
  const WkRows *rows = &loader->held->rows;
  out->token_hash = XXH3_64bits(wk_rows_tokens(rows, L, row), (L + 1u) * (size_t)rows->token_bytes);
  return WK_OK;
}

/* ---- consuming ----------------------------------------------------------------------------------- */

/* Lock held. Returns a buffer to the readers; a reader only waits when the ring is full, so one
 * free buffer is work for one of them (woken by unlock_consumer). The consumer's stream marks where it
 * stops reading the buffer's device tensors. */
static WkStatus release(WkLoader *loader, Buffer *b) {
  b->state = BUFFER_FREE;
  loader->frees++;
  return wk_batch_tensors_release(&b->tensors);
}

/* Lock held. The waiting readers owed a wake-up: one per chance given since the last call. */
static uint32_t readers_to_wake(WkLoader *loader) {
  uint32_t n = loader->frees < loader->readers_waiting ? loader->frees : loader->readers_waiting;
  loader->frees = 0;
  return n;
}

static void wake_readers(WkLoader *loader, uint32_t n) {
  while (n-- > 0) pthread_cond_signal(&loader->free);
}

/* The consumer leaves the lock, then wakes the readers it owes: woken under the lock, a reader would
 * run only to block on it (a futex round trip more a micro-batch, seen in the data bench's profile). */
static void unlock_consumer(WkLoader *loader) {
  uint32_t n = readers_to_wake(loader);
  pthread_mutex_unlock(&loader->lock);
  wake_readers(loader, n);
}

/* Lock held. Gives back the held micro-batches when the next one starts another step (or always,
 * at the end); the micro-batches of one step stay valid together. */
static WkStatus release_held(WkLoader *loader, bool all) {
  uint64_t absolute = loader->start.step * loader->micro_steps + loader->start.micro + loader->consumed;
  if (!loader->held || (!all && absolute % loader->micro_steps != 0)) return WK_OK;
  WkStatus status = WK_OK;
  for (uint64_t seq = loader->held_from; seq < loader->consumed; seq++) {
    WkStatus released = release(loader, &loader->buffers[seq % loader->buffer_count]);
    if (status == WK_OK) status = released;
  }
  loader->held_from = loader->consumed;
  return status;
}

/* Lock held. Waits for micro-batch `seq`. When it is not ready, the readers are behind: sleep until
 * half of the ring they can fill is ready (or the end, or a failure) rather than waking for every
 * batch, which costs a context switch per batch and slows the readers it waits for. */
static void wait_for(WkLoader *loader, uint64_t seq) {
  if (is_ready(loader, seq)) return;
  /* The first batch is awaited alone: time to first batch is what a starting job feels. */
  bool first = loader->consumed == 0;
  uint32_t ring = ahead_limit(loader);
  loader->wake_consumer_at = seq + (first || ring <= 2 ? 0 : ring / 2 - 1);
  wake_readers(loader, readers_to_wake(loader)); /* before sleeping: they fill what it waits for */
  while (!consumer_can_go(loader)) pthread_cond_wait(&loader->ready, &loader->lock);
  loader->wake_consumer_at = UINT64_MAX;
}

/* The consumer cannot go on: every later call reports status with this message. Lock held. */
static WkStatus fail_consumer(WkLoader *loader, WkStatus status, const char *message) {
  loader->failed = true;
  loader->failure = status;
  snprintf(loader->failure_message, sizeof loader->failure_message, "%s", message);
  release_held(loader, true);
  loader->held = NULL;
  unlock_consumer(loader);
  return WK_FAIL(loader->failure, "%s", loader->failure_message);
}

WkStatus wk_loader_next(WkLoader *loader, WkBatch *out) {
  if (!loader->started) return WK_FAIL(WK_ERR_INVALID_ARG, "wk_loader_next before wk_loader_start");
  if (loader->failed) return WK_FAIL(loader->failure, "%s", loader->failure_message);
  pthread_mutex_lock(&loader->lock);
  if (release_held(loader, false) != WK_OK) return fail_consumer(loader, wk_last_status(), wk_last_error());
  Buffer *b = &loader->buffers[loader->consumed % loader->buffer_count];
  uint64_t t0 = wk_now_ns();
  wait_for(loader, loader->consumed);
  uint64_t waited = wk_now_ns() - t0;
  loader->stats.wait_ns += waited;
  if (at_end(loader)) {
    release_held(loader, true);
    loader->held = NULL;
    unlock_consumer(loader);
    return WK_FAIL(WK_ERR_CLOSED, "the data stream has ended (all sources used their epochs)");
  }
  if (b->status != WK_OK) {
    char message[BUFFER_ERROR_CAPACITY + 32];
    snprintf(message, sizeof message, "step %llu: %s", (unsigned long long)b->step, b->error);
    release(loader, b);
    return fail_consumer(loader, b->status, message);
  }
  if (!loader->held) loader->held_from = loader->consumed;
  loader->held = b;
  loader->consumed++;
  if (loader->micro_steps > 1) loader->frees++; /* ahead_limit moved */
  loader->skipped += b->skipped;
  loader->stats.batches++;
  loader->stats.skipped = loader->skipped;
  unlock_consumer(loader);
  *out = (WkBatch){.slot = (uint32_t)(b - loader->buffers), .rows = loader->rows,
                   .seq_len = (uint32_t)param(loader, WK_LOADER_SEQ_LEN), .step = b->step, .micro_step = b->micro,
                   .micro_steps = loader->micro_steps, .fingerprint = b->fingerprint, .wait_ns = waited};
  WK_TRY(wk_batch_tensors_deliver(&b->tensors, out));
  if (loader->audit_fd >= 0) return loader_audit_batch(loader, out);
  return WK_OK;
}

WkStatus wk_loader_slot(WkLoader *loader, uint32_t slot, WkBatch *out) {
  if (!loader->started) return WK_FAIL(WK_ERR_INVALID_ARG, "ring slots exist once the loader has started");
  if (slot >= loader->buffer_count)
    return WK_FAIL(WK_ERR_INVALID_ARG, "slot %u is not below the ring's %u", slot, loader->buffer_count);
  memset(out, 0, sizeof *out);
  out->slot = slot;
  wk_batch_tensors_fields(&loader->buffers[slot].tensors, out);
  return WK_OK;
}

WkStatus wk_loader_source_epoch_length(WkLoader *loader, uint32_t source, uint64_t *out) {
  if (!loader->started) return WK_FAIL(WK_ERR_INVALID_ARG, "epoch lengths are known once the loader has started");
  if (source >= loader->mix.count) return WK_FAIL(WK_ERR_INVALID_ARG, "no source %u", source);
  *out = loader->mix.epoch_length[source];
  return WK_OK;
}

WkStatus wk_loader_vocab(const WkLoader *loader, uint32_t *vocab_size, uint32_t *eos) {
  if (loader->mix.count == 0) return WK_FAIL(WK_ERR_INVALID_ARG, "the loader has no source");
  uint32_t largest = 0;
  for (uint32_t i = 0; i < loader->mix.count; i++) {
    uint32_t v = wk_dataset_vocab_size(loader->sources[i].ds);
    if (v > largest) largest = v;
  }
  *vocab_size = largest;
  *eos = wk_dataset_eos(loader->sources[0].ds);
  return WK_OK;
}

uint32_t wk_loader_source_count(const WkLoader *loader) { return loader->mix.count; }

/* ---- cursor -------------------------------------------------------------------------------------- */

/* Lock held. Where source i stands after the micro-batches returned so far (b: the last of them). */
static WkSourcePosition consumed_position(const WkLoader *loader, const Buffer *b, uint32_t i) {
  if (!b) return loader->start_positions[i]; /* nothing consumed yet */
  return b->micro + 1 < loader->micro_steps ? b->before[i] : b->after[i];
}

WkStatus wk_loader_source_draws(WkLoader *loader, uint32_t source, uint64_t *out) {
  if (!loader->started) return WK_FAIL(WK_ERR_INVALID_ARG, "draws are known once the loader has started");
  if (source >= loader->mix.count) return WK_FAIL(WK_ERR_INVALID_ARG, "no source %u", source);
  pthread_mutex_lock(&loader->lock);
  *out = consumed_position(loader, loader->held, source).draws;
  pthread_mutex_unlock(&loader->lock);
  return WK_OK;
}

WkStatus wk_loader_state(WkLoader *loader, char *buffer, size_t capacity, size_t *length) {
  if (!loader->started) return WK_FAIL(WK_ERR_INVALID_ARG, "the cursor is defined once the loader has started");
  WkOrderConfig o = order_config(loader);
  WkCursor c = {.step = loader->start.step, .micro = loader->start.micro,
                .world = (uint32_t)param(loader, WK_LOADER_WORLD_SIZE), .global_batch = loader->mix.global_batch,
                .seq_len = o.seq_len, .seed = o.seed, .mode = o.mode, .shuffle = o.shuffle,
                .window_tokens = o.window_tokens, .buffer_tokens = o.buffer_tokens, .partitions = o.partitions,
                .chunk = o.chunk, .skipped = loader->skipped,
                .sources = loader->mix.count};
  pthread_mutex_lock(&loader->lock);
  const Buffer *b = loader->held;
  for (uint32_t i = 0; i < loader->mix.count; i++) {
    c.fingerprint[i] = wk_order_fingerprint(loader->sources[i].order);
    c.position[i] = consumed_position(loader, b, i);
  }
  if (b) {
    bool step_done = b->micro + 1 == loader->micro_steps;
    c.step = step_done ? b->step + 1 : b->step;
    c.micro = step_done ? 0 : b->micro + 1;
  }
  pthread_mutex_unlock(&loader->lock);
  return wk_cursor_format(&c, buffer, capacity, length);
}

void wk_loader_stats(WkLoader *loader, WkLoaderStats *out) {
  pthread_mutex_lock(&loader->lock);
  *out = loader->stats;
  out->buffers = loader->buffer_count;
  out->buffer_bytes = loader->buffer_bytes;
  pthread_mutex_unlock(&loader->lock);
  for (uint32_t i = 0; i < loader->mix.count; i++) {
    if (!loader->sources[i].node_reader) continue;
    WkNodeReaderStats r;
    wk_node_reader_stats(loader->sources[i].node_reader, &r);
    out->decoded_bytes += r.decoded_bytes;
    out->delivered_bytes += r.delivered_bytes;
    out->node_decoded_bytes += r.node.decoded_bytes;
    out->node_delivered_bytes += r.node.delivered_bytes;
    out->node_private_decodes += r.node.private_decodes;
    out->node_edges_saved += r.node.edges_saved;
    out->node_edges_used += r.node.edges_used;
    out->node_edges_missing += r.node.edges_missing;
    out->node_edges_dropped += r.node.edges_dropped;
    out->node_waits += r.node.waits;
    out->node_steals += r.node.steals;
    wk_remote_stats_add(&out->remote, loader->sources[i].ds);
  }
}

/* ---- teardown ------------------------------------------------------------------------------------ */

void wk_loader_free(WkLoader *loader) {
  if (!loader) return;
  pthread_mutex_lock(&loader->lock);
  loader->stopping = true;
  pthread_cond_broadcast(&loader->free);
  pthread_cond_broadcast(&loader->ready);
  pthread_mutex_unlock(&loader->lock);
  for (uint32_t t = 0; t < loader->thread_count; t++) pthread_join(loader->threads[t], NULL);
  wk_device_copy_free(loader->device_copy);
  for (uint32_t i = 0; loader->buffers && i < loader->buffer_count; i++) loader_free_buffer(&loader->buffers[i]);
  free(loader->buffers);
  free(loader->locs);
  free(loader->draws);
  for (uint32_t t = 0; t < MAX_THREADS; t++)
    for (uint32_t i = 0; i < loader->mix.count; i++) wk_node_reader_thread_free(loader->readers[t].contexts[i]);
  for (uint32_t i = 0; i < loader->mix.count; i++) {
    wk_node_reader_free(loader->sources[i].node_reader);
    wk_order_free(loader->sources[i].order);
    wk_dataset_close(loader->sources[i].ds);
    free(loader->sources[i].path);
  }
  if (loader->audit_fd >= 0) close(loader->audit_fd);
  free(loader->audit_path);
  free(loader->cache_dir);
  pthread_cond_destroy(&loader->ready);
  pthread_cond_destroy(&loader->free);
  pthread_mutex_destroy(&loader->lock);
  free(loader);
}
