/*
 * convert.c — the converter pipeline: inputs -> chunks -> documents -> shards -> index.json. Its
 * threads and the run are here; the settings are settings.c's, the builder and the index builder.c's
 * (converter.h has what the three share).
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
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "converter.h"

/* ---- the run ----------------------------------------------------------------------------------------- */

void convert_pool_put(Pool *p, void *data, uint64_t capacity) {
  if (!data) return;
  if (p->count == POOL_SLOTS) {
    free(data);
    return;
  }
  p->data[p->count] = data;
  p->capacity[p->count++] = capacity;
}

void *convert_pool_take(Pool *p, uint64_t *capacity) {
  if (p->count == 0) return NULL;
  p->count--;
  *capacity = p->capacity[p->count];
  return p->data[p->count];
}

void convert_pool_free(Pool *p) {
  while (p->count) free(p->data[--p->count]);
}

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
void convert_free_shard_inputs(Run *r, ShardJob *job) {
  for (uint32_t p = 0; p < job->piece_count; p++) wk_shard_piece_free(&job->pieces[p].piece);
  if (r) {
    pthread_mutex_lock(&r->lock);
    convert_pool_put(&r->shard_buffers, job->tokens, job->token_capacity);
    convert_pool_put(&r->shard_starts, job->doc_starts, job->doc_capacity);
    pthread_mutex_unlock(&r->lock);
  } else {
    free(job->tokens);
    free(job->doc_starts);
  }
  job->tokens = NULL;
  job->doc_starts = NULL;
  for (uint32_t k = 0; job->columns && k < job->column_count; k++)
    free(job->columns[k].data.data), free(job->columns[k].ends.data);
  free(job->columns);
  job->columns = NULL;
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
      WkShardColumn columns[COLUMN_MAX];
      for (uint32_t k = 0; k < job->column_count; k++) {
        const ColumnData *c = &job->columns[k];
        columns[k] = (WkShardColumn){.data = c->data.data, .data_bytes = c->data.length,
                                     .blob_ends = r->context.columns[k].kind == COLUMN_BYTES
                                                      ? (const uint64_t *)c->ends.data : NULL};
        column_spec_info(&r->context.columns[k], &columns[k].info);
      }
      job->status = wk_shard_assemble_columns(job->path, &r->write_options, job->token_count, job->doc_starts,
                                              job->doc_count, pieces, job->piece_count, columns, job->column_count,
                                              &job->written);
      free(pieces);
    }
    if (job->status != WK_OK) snprintf(job->message, sizeof job->message, "%s", wk_last_error());
  }
  convert_free_shard_inputs(r, job);
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
      c->tokens.data = convert_pool_take(&r->chunk_tokens, &capacity);
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

/* The tokenizer of the run: the one given, or for token files the declared vocabulary (WK_CONVERT_VOCAB_SIZE,
 * WK_CONVERT_EOS) or GPT-2's for .bin files, or bytes for text. */
static WkStatus choose_tokenizer(Run *r) {
  WkConverter *cv = r->cv;
  size_t tokens = 0, npys = 0;
  const char *token_example = NULL, *npy_example = NULL, *text_example = NULL;
  for (size_t i = 0; i < cv->input_count; i++) {
    if (cv->inputs[i].kind == INPUT_TOKENS_NPY) npys++, npy_example = cv->inputs[i].path;
    if (convert_input_is_tokens(cv->inputs[i].kind)) tokens++, token_example = cv->inputs[i].path;
    else text_example = cv->inputs[i].path;
  }
  if (tokens && text_example)
    return WK_FAIL(WK_ERR_INVALID_ARG, "converter: token files ('%s') and text ('%s') cannot share a dataset; "
                   "convert them separately", token_example, text_example);
  int64_t vocab = param(cv, WK_CONVERT_VOCAB_SIZE), eos = param(cv, WK_CONVERT_EOS);
  if ((vocab > 0) != (eos >= 0))
    return WK_FAIL(WK_ERR_INVALID_ARG, "converter: the vocabulary of token files is declared by both a size and an "
                   "EOS (--vocab-size and --eos); %s is missing", vocab > 0 ? "the EOS" : "the size");
  if (vocab > 0) {
    if (!tokens) return WK_FAIL(WK_ERR_INVALID_ARG, "converter: --vocab-size and --eos declare the ids of token files "
                                "(.bin, .npy); '%s' is text (its tokenizer says both)", text_example);
    if (cv->tokenizer)
      return WK_FAIL(WK_ERR_INVALID_ARG, "converter: --vocab-size and --eos declare the ids of token files without a "
                     "tokenizer; tokenizer '%s' was given too", cv->tokenizer->name);
    if (eos >= vocab)
      return WK_FAIL(WK_ERR_INVALID_ARG, "converter: EOS %lld is outside the declared vocabulary (%lld ids)",
                     (long long)eos, (long long)vocab);
    r->declared = (WkTokenizer){.name = "ids", .vocab_size = (uint32_t)vocab, .eos = (uint32_t)eos};
    r->tokenizer = &r->declared;
    return WK_OK;
  }
  if (npys)
    return WK_FAIL(WK_ERR_INVALID_ARG, "converter: '%s' holds token ids of an unknown vocabulary; declare it with "
                   "--vocab-size N and --eos ID", npy_example);
  const WkTokenizer *gpt2 = wk_tokenizer_find("gpt2");
  const WkTokenizer *t = cv->tokenizer ? cv->tokenizer : tokens ? gpt2 : wk_tokenizer_find("bytes");
  if (tokens && t != gpt2)
    return WK_FAIL(WK_ERR_INVALID_ARG, "converter: '%s' holds GPT-2 tokens unless --vocab-size and --eos declare "
                   "others; use --tokenizer gpt2 (not %s)", token_example, t->name);
  if (!tokens && !t->encode)
    return WK_FAIL(WK_ERR_INVALID_ARG, "converter: tokenizer '%s' only describes pre-tokenized .bin inputs; to "
                   "encode text give a tokenizer.json or a .tiktoken rank file (or bytes)", t->name);
  if (t->eos == WK_TOKENIZER_NONE)
    return WK_FAIL(WK_ERR_INVALID_ARG, "converter: tokenizer '%s' names no EOS token to end documents with; name "
                   "one (wick.data.convert --eos TEXT, wk_tokenizer_set WK_TOKENIZER_EOS)", t->name);
  r->tokenizer = t;
  return WK_OK;
}

/* What goes around each document's text (text inputs only: token files hold the ids as they are): the
 * tokenizer's template, less an EOS at its end, since every document is followed by one. */
static void choose_template(Run *r) {
  if (!r->tokenizer->encode || r->tokenizer->single.prefix + r->tokenizer->single.suffix == 0) return;
  r->template = r->tokenizer->single;
  if (r->template.suffix && r->template.ids[r->template.prefix + r->template.suffix - 1] == r->tokenizer->eos)
    r->template.suffix--;
  r->template_state = r->tokenizer->bare ? WK_INDEX_TEMPLATE_SKIPPED : WK_INDEX_TEMPLATE_APPLIED;
}

/* What --column cannot go with: token files (no fields), resuming (a shard's columns are not compared);
 * --no-text needs columns and no tokens column. */
static WkStatus check_records(const Run *r) {
  const WkConverter *cv = r->cv;
  if (r->context.no_text && (cv->column_count == 0 || cv->has_tokens))
    return WK_FAIL(WK_ERR_INVALID_ARG, "converter: --no-text makes records of columns without text: it needs a "
                   "--column, and no tokens column");
  if (!r->context.records) return WK_OK;
  if (param(cv, WK_CONVERT_RESUME))
    return WK_FAIL(WK_ERR_INVALID_ARG, "converter: --resume cannot keep shards with columns (--column); convert "
                   "afresh");
  for (size_t i = 0; i < cv->input_count; i++)
    if (convert_input_is_tokens(cv->inputs[i].kind))
      return WK_FAIL(WK_ERR_INVALID_ARG, "converter: '%s' holds token ids, no fields for --column (JSONL, Parquet, "
                     "tar and text inputs have them)", cv->inputs[i].path);
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
  WK_TRY(choose_tokenizer(&r));
  choose_template(&r);
  r.context = (ChunkContext){.tokenizer = r.tokenizer,
                             .template = r.template_state == WK_INDEX_TEMPLATE_APPLIED ? &r.template : NULL,
                             .field = cv->field, .json_field = cv->json_field,
                             .split = (WkTextSplit)param(cv, WK_CONVERT_TEXT_SPLIT),
                             .inputs = cv->inputs,
                             .records = cv->has_tokens || cv->column_count > 0,
                             .tokens = cv->has_tokens ? &cv->tokens : NULL,
                             .no_text = param(cv, WK_CONVERT_NO_TEXT) != 0,
                             .columns = cv->columns, .column_count = cv->column_count};
  WK_TRY(check_records(&r));
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
  bool producer_started = wk_thread_create(&producer, producer_main, &r) == 0;
  for (; producer_started && started < r.threads; started++)
    if (wk_thread_create(&workers[started], worker_main, &r) != 0) break;
  WkStatus status = WK_OK;
  if (!producer_started || started == 0) status = WK_FAIL(WK_ERR_NOMEM, "converter: cannot start threads");
  if (status == WK_OK) status = convert_build(&r);

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
  if (status == WK_OK) status = convert_require_documents(cv);
  if (status == WK_OK) status = convert_write_index(&r);
  if (status == WK_OK) status = convert_output_publish(&r.out, r.shard_count);
  convert_output_close(&r.out, status != WK_OK);
  for (uint32_t i = 0; i < r.shard_count; i++) {
    convert_free_shard_inputs(NULL, r.shards[i]);
    free(r.shards[i]->pieces);
    free(r.shards[i]->path);
    free(r.shards[i]);
  }
  free(r.shards);
  convert_pool_free(&r.shard_buffers);
  convert_pool_free(&r.shard_starts);
  convert_pool_free(&r.chunk_tokens);
  free(r.buffer);
  free(r.starts);
  for (uint32_t k = 0; k < COLUMN_MAX; k++) free(r.columns[k].data.data), free(r.columns[k].ends.data);
  free(r.ring);
  wk_queue_free(r.jobs);
  pthread_cond_destroy(&r.changed);
  pthread_mutex_destroy(&r.lock);
  cv->stats.seconds = (double)(wk_now_ns() - start_ns) / 1e9;
  if (param(cv, WK_CONVERT_PROGRESS)) convert_draw_progress(&r, true);
  return status;
}
