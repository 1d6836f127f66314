/*
 * unigram.c — the Unigram model: Viterbi over a piece's lattice, exactly as Hugging Face's
 * Unigram::encode_optimized (after SentencePiece's unigram_model.cc) and Unigram::tokenize compute it.
 *
 * At each character boundary, from left to right, every vocabulary token that starts there (a walk
 * down the trie of the vocabulary's bytes) offers the path ending where it ends: the score so far plus
 * its own, in f64, added in that order. A path replaces the one found before only when strictly
 * better, so on a tie the earlier start, then the shorter token, wins. A character no token of its
 * exact length covers offers unk at the lowest score minus 10. Walking back from the end gives the
 * tokens; unk tokens next to each other are fused into one string, which is looked up again (it may
 * be a token), falls back to its bytes' <0xNN> tokens when the model has byte_fallback and all of
 * them, and is unk otherwise.
 *
 * The trie is a hash table of (node, byte) -> child (vocab.c's pair table), one lookup per byte of a
 * walk. Pieces are cached per thread as BPE's are (merge.c).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "unigram.h"

enum { UNK_PENALTY = 10 };  /* unk scores the lowest score minus this (K_UNK_PENALTY) */

struct Unigram {
  double *score;        /* [vocab count] */
  double unk_score;
  uint32_t unk;
  PairTable trie;       /* (node, byte) -> child node, in .merged */
  uint32_t *node_token; /* [nodes] the token that ends at a node, BPE_NO_TOKEN for none */
  uint32_t nodes;
};

void unigram_free(Unigram *u) {
  if (!u) return;
  free(u->score);
  pairs_free(&u->trie);
  free(u->node_token);
  free(u);
}

static WkStatus build_trie(Unigram *u, const Vocab *v) {
  size_t bytes = v->bytes_length + 1;  /* nodes: at most one a byte, and the root */
  u->node_token = wk_malloc(bytes * sizeof *u->node_token, "the Unigram trie");
  if (!u->node_token) return wk_last_status();
  WK_TRY(pairs_init(&u->trie, bytes));
  u->node_token[0] = BPE_NO_TOKEN;
  u->nodes = 1;
  for (uint32_t id = 0; id < v->count; id++) {
    size_t n;
    const uint8_t *b = vocab_bytes(v, id, &n);
    uint32_t node = 0;
    for (size_t i = 0; i < n; i++) {
      const PairSlot *child = pairs_find(&u->trie, node, b[i]);
      if (child) {
        node = child->merged;
        continue;
      }
      WK_TRY(pairs_put(&u->trie, node, b[i], 0, u->nodes));
      u->node_token[u->nodes] = BPE_NO_TOKEN;
      node = u->nodes++;
    }
    u->node_token[node] = id;
  }
  return WK_OK;
}

WkStatus unigram_new(const Bpe *bpe, const double *scores, uint32_t unk, const char *what, Unigram **out) {
  *out = NULL;
  const Vocab *v = &bpe->vocab;
  Unigram *u = wk_calloc(1, sizeof *u, "a Unigram model");
  if (!u) return wk_last_status();
  u->score = wk_malloc((size_t)v->count * sizeof *u->score, "Unigram scores");
  WkStatus status = u->score ? build_trie(u, v) : wk_last_status();
  if (status != WK_OK) {
    unigram_free(u);
    return wk_error_context("%s", what);
  }
  double lowest = INFINITY;
  for (uint32_t id = 0; id < v->count; id++) {
    u->score[id] = scores[id];
    if (scores[id] < lowest) lowest = scores[id];
  }
  u->unk_score = lowest - UNK_PENALTY;
  u->unk = unk;
  *out = u;
  return WK_OK;
}

/* ---- one piece ------------------------------------------------------------------------------------ */

/* The lattice of a piece of n bytes: scores here, starts and ids in the merge scratch's prev and next. */
typedef struct {
  double *score;
  uint32_t *start, *id;
} Lattice;

static WkStatus lattice_of(ThreadState *ts, size_t n, Lattice *l) {
  WK_TRY(merge_scratch_reserve(&ts->scratch, n));
  if (n > ts->lattice_capacity) {
    double *grown = realloc(ts->lattice_score, n * sizeof *grown);
    if (!grown) return WK_FAIL(WK_ERR_NOMEM, "out of memory for the lattice of a %zu-byte piece", n - 1);
    ts->lattice_score = grown;
    ts->lattice_capacity = n;
  }
  *l = (Lattice){.score = ts->lattice_score, .start = ts->scratch.prev, .id = ts->scratch.next};
  return WK_OK;
}

static inline void offer(const Lattice *l, size_t at, size_t end, double score, uint32_t id) {
  if (l->start[end] == UINT32_MAX || score > l->score[end]) {
    l->score[end] = score;
    l->start[end] = (uint32_t)at;
    l->id[end] = id;
  }
}

static void viterbi(const Unigram *u, const Lattice *l, const uint8_t *piece, size_t n) {
  l->score[0] = 0;
  for (size_t i = 1; i <= n; i++) l->start[i] = UINT32_MAX;
  for (size_t at = 0; at < n;) {
    double here = l->score[at];
    size_t mblen = utf8_length(piece[at]);
    bool single = false;  /* a token is exactly this character */
    uint32_t node = 0;
    for (size_t end = at; end < n;) {
      const PairSlot *child = pairs_find(&u->trie, node, piece[end++]);
      if (!child) break;
      node = child->merged;
      uint32_t id = u->node_token[node];
      if (id == BPE_NO_TOKEN) continue;
      offer(l, at, end, u->score[id] + here, id);
      single = single || end - at == mblen;
    }
    if (!single) offer(l, at, at + mblen, u->unk_score + here, u->unk);
    at += mblen;
  }
}

static WkStatus push(WkTokenVec *out, uint32_t id) {
  WK_TRY(wk_token_vec_reserve(out, 1));
  out->data[out->length++] = id;
  return WK_OK;
}

/* A run of unk tokens, fused: a token when its string is one, else its bytes' fallback tokens when
 * all exist, else unk (Unigram::tokenize). Pushed backwards, as emit walks. */
static WkStatus push_unknown(const Bpe *bpe, const uint8_t *text, size_t n, WkTokenVec *out) {
  uint32_t id = vocab_find(&bpe->vocab, text, n);
  if (id != BPE_NO_TOKEN) return push(out, id);
  bool fallback = true;
  for (size_t i = 0; i < n && fallback; i++) fallback = bpe->fallback_token[text[i]] != BPE_NO_TOKEN;
  if (!fallback) return push(out, bpe->unigram->unk);
  WK_TRY(wk_token_vec_reserve(out, n));
  for (size_t i = n; i-- > 0;) out->data[out->length++] = bpe->fallback_token[text[i]];
  return WK_OK;
}

/* The best path's tokens: walked back from the end (lattice_start links each token to the one
 * before), then put in order. */
static WkStatus emit(const Bpe *bpe, const Lattice *l, const uint8_t *piece, size_t n, WkTokenVec *out) {
  uint32_t unk = bpe->unigram->unk;
  size_t first = out->length;
  for (size_t end = n; end > 0;) {
    size_t start = l->start[end];
    if (l->id[end] == unk) {
      while (start > 0 && l->id[start] == unk) start = l->start[start];
      WK_TRY(push_unknown(bpe, piece + start, end - start, out));
    } else {
      WK_TRY(push(out, l->id[end]));
    }
    end = start;
  }
  for (size_t i = first, j = out->length; i + 1 < j; i++, j--) {
    uint32_t t = out->data[i];
    out->data[i] = out->data[j - 1];
    out->data[j - 1] = t;
  }
  return WK_OK;
}

WkStatus unigram_piece(const Bpe *bpe, ThreadState *ts, const uint8_t *piece, size_t length, WkTokenVec *out) {
  if (length == 0) return WK_OK;
  uint64_t hash;
  bool hit;
  WK_TRY(piece_cache_lookup(ts, piece, length, &hash, &hit, out));
  if (hit) return WK_OK;
  Lattice l = {0};
  WK_TRY(lattice_of(ts, length + 1, &l));
  viterbi(bpe->unigram, &l, piece, length);
  size_t first = out->length;
  WK_TRY(emit(bpe, &l, piece, length, out));
  piece_cache_store(ts, piece, length, hash, out->data + first, out->length - first);
  return WK_OK;
}
