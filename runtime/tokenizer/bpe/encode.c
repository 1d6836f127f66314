/*
 * encode.c — the BPE tokenizer behind WkTokenizer: encoding (added tokens -> pre-tokenizer pieces ->
 * merges), decoding, token lookup, and the state each encoding thread keeps.
 *
 * Encoding, in Hugging Face's order: the text is split at added tokens that are not normalized; each
 * run between them is normalized (normalize.c) and split at the added tokens that are; each
 * remaining run optionally gets a leading space (add_prefix_space), the pre-tokenizer cuts it into
 * pieces (regexes, then Metaspace), and merge.c turns each piece into tokens. tiktoken tokenizers are
 * the same with one set of special tokens and ignore_merges. Decoding concatenates the tokens' bytes,
 * or runs the tokenizer's decoders over their strings (decode.c).
 *
 * Thread state: what a call writes (regex match data, merge scratch, the piece cache, ~1 MiB) is the
 * calling thread's, found through a pthread key of the tokenizer, made on the thread's first call and
 * freed when the thread exits or the tokenizer is freed, whichever comes first. So a tokenizer must
 * be freed after the threads that used it have returned (joined, or idle in no call of it).
 */
#include <stdlib.h>
#include <string.h>

#include "bpe.h"
#include "../../core/json.h"  /* wk_utf8_valid_prefix */
#include "../unigram/unigram.h"

/* Names an EOS token usually has, looked for when the file does not say which it is. */
static const char *const EOS_NAMES[] = {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"};

/* ---- thread state -------------------------------------------------------------------------------- */

static void thread_state_free(ThreadState *ts) {
  if (!ts) return;
  free(ts->cache);
  merge_scratch_free(&ts->scratch);
  pretokenize_state_free(ts->pre);
  free(ts->prefixed);
  normalize_scratch_free(&ts->normalized);
  free(ts->spaced.data);
  free(ts->lattice_score);
  free(ts);
}

/* Thread exit: unlink from the owner (still alive: it deletes its key before it goes). */
static void thread_state_release(void *value) {
  ThreadState *ts = value;
  Bpe *owner = (Bpe *)ts->owner;
  pthread_mutex_lock(&owner->lock);
  for (ThreadState **p = &owner->states; *p; p = &(*p)->next)
    if (*p == ts) {
      *p = ts->next;
      break;
    }
  pthread_mutex_unlock(&owner->lock);
  thread_state_free(ts);
}

static ThreadState *thread_state(const Bpe *bpe) {
  ThreadState *ts = pthread_getspecific(bpe->key);
  if (ts) return ts;
  ts = wk_calloc(1, sizeof *ts, "tokenizer thread state");
  if (!ts) return NULL;
  ts->owner = bpe;
  ts->cache = wk_calloc(CACHE_ENTRIES, sizeof *ts->cache, "tokenizer piece cache");
  ts->pre = pretokenize_state_new();
  if (!ts->cache || !ts->pre) {
    thread_state_free(ts);
    return NULL;
  }
  /* The registry is the one part of a tokenizer that encoding writes, under its lock. */
  Bpe *owner = (Bpe *)bpe;
  pthread_mutex_lock(&owner->lock);
  ts->next = owner->states;
  owner->states = ts;
  pthread_mutex_unlock(&owner->lock);
  int rc = pthread_setspecific(bpe->key, ts);
  if (rc != 0) {
    thread_state_release(ts);
    WK_FAIL(WK_ERR_NOMEM, "pthread_setspecific for the tokenizer's thread state failed (error %d)", rc);
    return NULL;
  }
  return ts;
}

/* ---- encoding ---------------------------------------------------------------------------------- */

typedef struct {
  const Bpe *bpe;
  ThreadState *ts;
  WkTokenVec *out;
  const uint8_t *text;         /* the text encoded */
  bool segment_at_start;       /* the run of text being normalized starts the text */
  const uint8_t *normalized;   /* that run normalized */
  const uint8_t *run;          /* the run being pre-tokenized, and whether it starts the text */
  bool run_at_start;
} Encoding;

static WkStatus on_model_piece(void *context, const uint8_t *piece, size_t length) {
  Encoding *e = context;
  if (e->bpe->unigram) return unigram_piece(e->bpe, e->ts, piece, length, e->out);
  if (e->bpe->word_mark_length) return bpe_merge_words(e->bpe, e->ts, piece, length, e->out);
  return bpe_merge_piece(e->bpe, e->ts, piece, length, e->out);
}

static WkStatus on_piece(void *context, const uint8_t *piece, size_t length) {
  Encoding *e = context;
  if (!e->bpe->metaspace.on) return on_model_piece(e, piece, length);
  return metaspace_split(&e->bpe->metaspace, &e->ts->spaced, piece, length, e->run_at_start && piece == e->run,
                         on_model_piece, e);
}

static WkStatus push_token(WkTokenVec *out, uint32_t id) {
  WK_TRY(wk_token_vec_reserve(out, 1));
  out->data[out->length++] = id;
  return WK_OK;
}

/* A run of text without added tokens. */
static WkStatus encode_run(Encoding *e, const uint8_t *text, size_t length) {
  ThreadState *ts = e->ts;
  if (e->bpe->add_prefix_space && text[0] != ' ') {
    if (length + 1 > ts->prefixed_capacity) {
      uint8_t *grown = realloc(ts->prefixed, length + 1);
      if (!grown) return WK_FAIL(WK_ERR_NOMEM, "out of memory encoding %zu bytes", length);
      ts->prefixed = grown;
      ts->prefixed_capacity = length + 1;
    }
    ts->prefixed[0] = ' ';
    memcpy(ts->prefixed + 1, text, length);
    return pretokenize(&e->bpe->pre, ts->pre, ts->prefixed, length + 1, on_piece, e);
  }
  e->run = text;
  return pretokenize(&e->bpe->pre, ts->pre, text, length, on_piece, e);
}

static WkStatus on_normalized_segment(void *context, const uint8_t *text, size_t length, uint32_t added) {
  Encoding *e = context;
  if (added != BPE_NO_TOKEN) return push_token(e->out, added);
  e->run_at_start = e->segment_at_start && text == e->normalized;
  return encode_run(e, text, length);
}

static WkStatus on_segment(void *context, const uint8_t *text, size_t length, uint32_t added) {
  Encoding *e = context;
  if (added != BPE_NO_TOKEN) return push_token(e->out, added);
  e->segment_at_start = text == e->text;
  if (e->bpe->normalizer.count) WK_TRY(normalize(&e->bpe->normalizer, &e->ts->normalized, &text, &length));
  e->normalized = text;
  return added_split(&e->bpe->added[1], e->bpe->base.honour_special, text, length, on_normalized_segment, e);
}

static WkStatus bpe_encode(const WkTokenizer *self, const uint8_t *text, size_t length, WkTokenVec *out) {
  const Bpe *bpe = (const Bpe *)self;
  size_t valid = wk_utf8_valid_prefix(text, length);
  if (valid < length)
    return WK_FAIL(WK_ERR_FORMAT, "tokenizer '%s': the text is not valid UTF-8 (at byte %zu of %zu)", bpe->name,
                   valid, length);
  if (length == 0) return WK_OK;
  ThreadState *ts = thread_state(bpe);
  if (!ts) return wk_last_status();
  Encoding e = {.bpe = bpe, .ts = ts, .out = out, .text = text};
  return added_split(&bpe->added[0], self->honour_special, text, length, on_segment, &e);
}

/* ---- decoding and lookup ------------------------------------------------------------------------- */

enum { ADDED_SET_BIT = 31 };

static const AddedToken *added_token_of(const Bpe *bpe, uint32_t id) {
  uint32_t at = bpe->added_of[id];
  if (at == BPE_NO_TOKEN) return NULL;
  return &bpe->added[at >> ADDED_SET_BIT].tokens[at & ~(1u << ADDED_SET_BIT)];
}

/* The string of token i of a decode call: an added token's, else the vocabulary's. */
static WkStatus token_string(const Bpe *bpe, const uint32_t *tokens, size_t i, const uint8_t **bytes, size_t *n) {
  uint32_t id = tokens[i];
  if (id >= bpe->base.vocab_size)
    return WK_FAIL(WK_ERR_INVALID_ARG, "tokenizer '%s': token %u (at %zu) is outside the vocabulary (%u)", bpe->name,
                   id, i, bpe->base.vocab_size);
  const AddedToken *added = added_token_of(bpe, id);
  if (added) {
    *bytes = added->bytes;  /* normalized, as Hugging Face's id_to_token gives it */
    *n = added->length;
  } else if (vocab_has(&bpe->vocab, id)) {
    *bytes = vocab_bytes(&bpe->vocab, id, n);
  } else {
    return WK_FAIL(WK_ERR_INVALID_ARG, "tokenizer '%s': token %u (at %zu) is not in the vocabulary (a gap)",
                   bpe->name, id, i);
  }
  return WK_OK;
}

/* Through the decoders: the tokens' strings are gathered first, as the decoders take the list. */
static WkStatus decode_chain(const Bpe *bpe, const uint32_t *tokens, size_t count, WkByteVec *out) {
  WkByteVec strings = {0};
  size_t *ends = wk_malloc((count ? count : 1) * sizeof *ends, "token ends");
  WkStatus status = ends ? WK_OK : wk_last_status();
  for (size_t i = 0; i < count && status == WK_OK; i++) {
    const uint8_t *bytes = NULL;
    size_t n = 0;
    status = token_string(bpe, tokens, i, &bytes, &n);
    if (status == WK_OK) status = wk_byte_vec_append(&strings, bytes, n);
    if (status == WK_OK) ends[i] = strings.length;
  }
  if (status == WK_OK) status = decoder_run(&bpe->decoder, strings.data, ends, count, out);
  free(strings.data);
  free(ends);
  return status;
}

static WkStatus bpe_decode(const WkTokenizer *self, const uint32_t *tokens, size_t count, WkByteVec *out) {
  const Bpe *bpe = (const Bpe *)self;
  if (bpe->decoder.count) return decode_chain(bpe, tokens, count, out);
  for (size_t i = 0; i < count; i++) {
    const uint8_t *bytes = NULL;
    size_t n = 0;
    WK_TRY(token_string(bpe, tokens, i, &bytes, &n));
    WK_TRY(wk_byte_vec_append(out, bytes, n));
  }
  return WK_OK;
}

static uint32_t bpe_token_id(const WkTokenizer *self, const uint8_t *bytes, size_t length) {
  const Bpe *bpe = (const Bpe *)self;
  for (int s = 0; s < 2; s++)
    for (size_t i = 0; i < bpe->added[s].count; i++) {
      const AddedToken *t = &bpe->added[s].tokens[i];
      if (t->content_length == length && memcmp(t->content, bytes, length) == 0) return t->id;
    }
  return vocab_find(&bpe->vocab, bytes, length);
}

/* ---- life cycle ------------------------------------------------------------------------------------ */

static void bpe_free_self(WkTokenizer *self) { bpe_free((Bpe *)self); }

Bpe *bpe_new(const char *name) {
  Bpe *bpe = wk_calloc(1, sizeof *bpe, "a tokenizer");
  if (!bpe) return NULL;
  bpe->name = strdup(name);
  int rc = bpe->name ? pthread_key_create(&bpe->key, thread_state_release) : 0;
  if (!bpe->name || rc != 0) {
    free(bpe->name);
    free(bpe);
    WK_FAIL(WK_ERR_NOMEM, "cannot make a tokenizer (%s)", rc ? "pthread_key_create failed" : "out of memory");
    return NULL;
  }
  bpe->key_made = true;
  pthread_mutex_init(&bpe->lock, NULL);
  bpe->base = (WkTokenizer){.name = bpe->name, .eos = WK_TOKENIZER_NONE, .encode = bpe_encode,
                            .decode = bpe_decode, .token_id = bpe_token_id, .free = bpe_free_self};
  for (int b = 0; b < 256; b++) bpe->byte_token[b] = bpe->fallback_token[b] = BPE_NO_TOKEN;
  bpe->unk = BPE_NO_TOKEN;
  return bpe;
}

WkStatus bpe_finish(Bpe *bpe) {
  uint32_t size = bpe->vocab.count;
  for (int s = 0; s < 2; s++) {
    WK_TRY(added_finish(&bpe->added[s]));
    for (size_t i = 0; i < bpe->added[s].count; i++) {
      uint32_t id = bpe->added[s].tokens[i].id;
      if (id >= BPE_MAX_VOCAB) return WK_FAIL(WK_ERR_FORMAT, "tokenizer '%s': added token id %u is too large", bpe->name, id);
      if (id + 1 > size) size = id + 1;
    }
  }
  bpe->base.vocab_size = size;
  bpe->added_of = wk_malloc((size_t)size * sizeof *bpe->added_of, "the added token table");
  if (!bpe->added_of) return wk_last_status();
  for (uint32_t id = 0; id < size; id++) bpe->added_of[id] = BPE_NO_TOKEN;
  bpe->max_decode_bytes = bpe->vocab.max_token_bytes;
  for (uint32_t s = 0; s < 2; s++)
    for (size_t i = 0; i < bpe->added[s].count; i++) {
      const AddedToken *t = &bpe->added[s].tokens[i];
      bpe->added_of[t->id] = (uint32_t)i | s << ADDED_SET_BIT;
      if (t->length > bpe->max_decode_bytes) bpe->max_decode_bytes = (uint32_t)t->length;
    }
  for (int b = 0; b < 256; b++) {
    uint8_t byte = (uint8_t)b;
    bpe->byte_token[b] = vocab_find(&bpe->vocab, &byte, 1);
  }
  for (size_t i = 0; i < sizeof EOS_NAMES / sizeof EOS_NAMES[0] && bpe->base.eos == WK_TOKENIZER_NONE; i++)
    bpe->base.eos = bpe_token_id(&bpe->base, (const uint8_t *)EOS_NAMES[i], strlen(EOS_NAMES[i]));
  return WK_OK;
}

void bpe_free(Bpe *bpe) {
  if (!bpe) return;
  if (bpe->key_made) {
    pthread_key_delete(bpe->key); /* no more thread-exit releases: the states are freed here */
    for (ThreadState *ts = bpe->states, *next; ts; ts = next) {
      next = ts->next;
      thread_state_free(ts);
    }
    pthread_mutex_destroy(&bpe->lock);
  }
  vocab_free(&bpe->vocab);
  pairs_free(&bpe->pairs);
  pretokenizer_free(&bpe->pre);
  normalizer_free(&bpe->normalizer);
  decoder_free(&bpe->decoder);
  unigram_free(bpe->unigram);
  added_free(&bpe->added[0]);
  added_free(&bpe->added[1]);
  free(bpe->added_of);
  free(bpe->name);
  free(bpe);
}
