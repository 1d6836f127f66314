/*
 * builder.c — the calling thread's part of a run: it takes chunk results in number order, appends their
 * documents to the shard being built, hands a shard to the workers once it reaches the shard size (or
 * keeps an earlier run's identical one, resuming), reports bad lines as file:line, draws the progress
 * bar, and writes the index last.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>    /* clock_gettime for the progress bar's timed waits */
#include <unistd.h>  /* unlink */

#include "../core/terminal.h" /* wk_terminal_fit */
#include "converter.h"

static WkStatus buffer_reserve(Run *r, uint64_t extra) {
  if (!r->buffer) {
    pthread_mutex_lock(&r->lock);
    r->buffer = convert_pool_take(&r->shard_buffers, &r->buffer_capacity);
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

/* Starts a document at the shard's current end. */
static WkStatus open_document(Run *r) {
  if (!r->doc_open) {
    if (!r->starts) {
      pthread_mutex_lock(&r->lock);
      r->starts = convert_pool_take(&r->shard_starts, &r->start_capacity);
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
  return WK_OK;
}

/* Appends n tokens already in stored width (see store_tokens) to the shard being built. */
static WkStatus append_tokens(Run *r, const uint8_t *stored, uint64_t n) {
  if (n == 0) return WK_OK;
  WK_TRY(buffer_reserve(r, n + 1));
  WK_TRY(open_document(r));
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
  uint32_t columns = r->context.column_count;
  if (columns) {
    job->columns = malloc(columns * sizeof *job->columns);
    if (!job->columns) {
      free(job->path), free(job->pieces), free(job);
      return WK_FAIL(WK_ERR_NOMEM, "out of memory: shard job");
    }
    memcpy(job->columns, r->columns, columns * sizeof *job->columns);
    job->column_count = columns;
    memset(r->columns, 0, sizeof r->columns);
  }
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
      convert_free_shard_inputs(NULL, job);
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
    convert_free_shard_inputs(r, job);
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
  uint64_t column_bytes = 0;
  for (uint32_t k = 0; k < r->context.column_count; k++) column_bytes += r->columns[k].data.length;
  if (r->buffer_tokens >= (uint64_t)param(r->cv, WK_CONVERT_SHARD_TOKENS) || column_bytes >= MAX_SHARD_COLUMN_BYTES)
    WK_TRY(flush_shard(r));
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

/* Document d of chunk c (its tokens [begin, end) of the chunk) appended to each column of the shard: a per-token
 * column's values and its EOS's (the last token's, 0 for an empty document), a record's value, a blob. */
static WkStatus append_columns(Run *r, const Chunk *c, size_t d, uint64_t begin, uint64_t end) {
  for (uint32_t k = 0; k < r->context.column_count; k++) {
    const ColumnSpec *col = &r->context.columns[k];
    const ColumnData *from = &c->columns[k];
    ColumnData *to = &r->columns[k];
    if (col->kind == COLUMN_MASK || col->kind == COLUMN_TOKEN_U8) {
      uint8_t eos = end > begin ? from->data.data[end - 1] : 0;
      if (end > begin) WK_TRY(wk_byte_vec_append(&to->data, from->data.data + begin, (size_t)(end - begin)));
      WK_TRY(wk_byte_vec_append(&to->data, &eos, 1));
    } else if (col->kind == COLUMN_BYTES) {
      const uint64_t *ends = (const uint64_t *)from->ends.data;
      uint64_t first = d ? ends[d - 1] : 0;
      if (ends[d] > first) WK_TRY(wk_byte_vec_append(&to->data, from->data.data + first, (size_t)(ends[d] - first)));
      uint64_t shard_end = to->data.length;
      WK_TRY(wk_byte_vec_append(&to->ends, &shard_end, sizeof shard_end));
    } else {
      WK_TRY(wk_byte_vec_append(&to->data, from->data.data + d * col->element_bytes, (size_t)col->element_bytes));
    }
  }
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
    if (r->context.records) WK_TRY(open_document(r)); /* kept even when empty: its columns are the record */
    WK_TRY(append_tokens(r, stored + position * width, c->doc_ends[d] - position));
    if (r->context.column_count) WK_TRY(append_columns(r, c, d, position, c->doc_ends[d]));
    WK_TRY(end_document(r));
    position = c->doc_ends[d];
  }
  WK_TRY(append_tokens(r, stored + position * width, c->tokens.length - position));
  if (c->last && r->doc_open) WK_TRY(end_document(r)); /* a .bin file ends its last document */
  cv->stats.input_bytes += c->input_bytes;
  return WK_OK;
}

/* A duration as h:mm:ss into out. */
static void duration_text(char *out, size_t n, double seconds) {
  uint64_t s = seconds > 0 ? (uint64_t)(seconds + 0.5) : 0;
  snprintf(out, n, "%" PRIu64 ":%02u:%02u", s / 3600, (unsigned)(s % 3600 / 60), (unsigned)(s % 60));
}

/* The bar, the share of the input read, the rate, what was made and the time left at that rate (the
 * time it took, on the final line). Redrawn in place after \r, it is cut to the terminal's width, as
 * a wrapped line would leave a row behind at each redraw; the final line stays whole. */
void convert_draw_progress(Run *r, bool final) {
  uint64_t now = wk_now_ns();
  if (!final && now - r->last_draw_ns < 100 * 1000000ull) return;
  r->last_draw_ns = now;
  const WkConverter *cv = r->cv;
  double fraction = cv->total_input_bytes ? (double)cv->stats.input_bytes / (double)cv->total_input_bytes : 1.0;
  if (fraction > 1) fraction = 1;
  double seconds = (double)(now - r->start_ns) / 1e9;
  double mbps = seconds > 0 ? (double)cv->stats.input_bytes / seconds / 1e6 : 0;
  char when[40] = "eta ?";  /* nothing read yet: no rate to go by */
  if (final) {
    memcpy(when, "in ", 3);
    duration_text(when + 3, sizeof when - 3, seconds);
  } else if (fraction > 0) {
    memcpy(when, "eta ", 4);
    duration_text(when + 4, sizeof when - 4, seconds * (1 - fraction) / fraction);
  }
  enum { WIDTH = 20 };
  char bar[WIDTH + 1], line[256];
  int filled = (int)(fraction * WIDTH);
  for (int k = 0; k < WIDTH; k++) bar[k] = k < filled ? '=' : k == filled ? '>' : ' ';
  bar[WIDTH] = '\0';
  int n = snprintf(line, sizeof line, "[%s] %5.1f%% %6.1f MB/s  %" PRIu64 " docs  %u shards  %" PRIu64 " bad  %s", bar,
                   fraction * 100, mbps, cv->stats.documents, r->shard_count, cv->stats.bad, when);
  size_t length = n < 0 ? 0 : (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
  if (!final) length = wk_terminal_fit(STDERR_FILENO, line, length);
  fprintf(stderr, "\r\033[K%.*s%s", (int)length, line, final ? "\n" : "");
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
      convert_draw_progress(r, false);
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
  convert_pool_put(&r->chunk_tokens, c->tokens.data, c->tokens.capacity);
  c->tokens.data = NULL;
  pthread_cond_broadcast(&r->changed);
  pthread_mutex_unlock(&r->lock);
  convert_chunk_free(c);
}

WkStatus convert_build(Run *r) {
  WkStatus status = WK_OK;
  Chunk *c;
  while ((c = next_chunk(r, &status)) != NULL) {
    status = consume_chunk(r, c);
    chunk_consumed(r);
    if (status != WK_OK) return status;
    if (param(r->cv, WK_CONVERT_PROGRESS)) convert_draw_progress(r, false);
  }
  if (status != WK_OK) return status;
  if (r->doc_open) WK_TRY(end_document(r));
  return flush_shard(r);
}

/* ---- output directory and index ----------------------------------------------------------------- */

/* A run that found no document writes no dataset: an empty one would only fail later, in the loader
 * ("partitions must be between 1 and the shard count (0)"). Why is the inputs': the first line
 * skipped says it. */
WkStatus convert_require_documents(const WkConverter *cv) {
  if (cv->stats.documents > 0) return WK_OK;
  return WK_FAIL(WK_ERR_FORMAT, "converter: no document in %llu input%s (%llu bad, %llu empty, %llu null skipped)%s%s; "
                 "'%s' is not written", (unsigned long long)cv->stats.inputs, cv->stats.inputs == 1 ? "" : "s",
                 (unsigned long long)cv->stats.bad, (unsigned long long)cv->stats.empty,
                 (unsigned long long)cv->stats.nulls, cv->bad_kept ? ": the first skipped, " : "",
                 cv->bad_kept ? cv->bad_lines[0] : "", cv->out_dir);
}

WkStatus convert_write_index(Run *r) {
  WkConverter *cv = r->cv;
  WkIndex index = {
      .version = WK_INDEX_VERSION,
      .tokenizer = (char *)r->tokenizer->name,
      .tokenizer_fingerprint = r->tokenizer->fingerprint,
      .vocab_size = r->tokenizer->vocab_size,
      .eos = r->tokenizer->eos,
      .template_state = r->template_state,
      .template = r->template,
      .token_bytes = r->write_options.token_bytes,
      .shard_count = r->shard_count,
  };
  WkColumnInfo columns[WK_MAX_COLUMNS];
  wk_index_tokens_column(r->write_options.token_bytes, &columns[0]);
  for (uint32_t k = 0; k < r->context.column_count; k++) column_spec_info(&r->context.columns[k], &columns[1 + k]);
  index.column_count = 1 + r->context.column_count; /* tokens alone: version 1, as before */
  index.columns = columns;
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
