/*
 * merge.c — byte-pair encoding of one piece: its bytes become single-byte tokens, then the adjacent
 * pair with the lowest merge rank is merged (the leftmost one on a tie) until no pair merges. That is
 * tiktoken's and Hugging Face's rule alike; they differ only in where the ranks come from (vocab.c).
 *
 * Short pieces (most of them) rescan an array for the lowest rank after each merge. Longer ones keep
 * their pairs in a binary heap keyed by (rank, position) over a linked list of symbols, so a piece of
 * n bytes costs O(n log n) whatever it holds (a megabyte of spaces or digits is not quadratic).
 * Stale heap entries (a symbol merged since) are recognised by the ids they were made with.
 *
 * Pieces of up to CACHE_PIECE_BYTES bytes are remembered, with their tokens, in the calling thread's
 * direct-mapped cache: real text repeats its words, and a hit costs one hash and one compare. The
 * Unigram model (../unigram/) caches its pieces there too.
 */
#include <stdlib.h>
#include <string.h>
#define XXH_INLINE_ALL  /* XXH3 inlined: a piece is a few bytes, the call would cost more than the hash */
#include <xxhash.h>

#include "bpe.h"

/* Pieces up to this many symbols are merged by rescanning an array; longer ones through the heap. */
enum { SCAN_MAX_SYMBOLS = 48 };

struct HeapEntry {
  uint64_t key;  /* rank << 32 | position of the left symbol: the lowest key merges first */
  uint32_t left, right;  /* the ids it was made with */
};
typedef struct HeapEntry HeapEntry;

void merge_scratch_free(MergeScratch *s) {
  free(s->symbol);
  free(s->rank);
  free(s->merged);
  free(s->prev);
  free(s->next);
  free(s->heap);
  memset(s, 0, sizeof *s);
}

WkStatus merge_scratch_reserve(MergeScratch *s, size_t n) {
  if (n <= s->capacity) return WK_OK;
  size_t cap = s->capacity ? s->capacity : 256;
  while (cap < n) cap *= 2;
  uint32_t **arrays[] = {&s->symbol, &s->rank, &s->merged, &s->prev, &s->next};
  for (size_t k = 0; k < sizeof arrays / sizeof arrays[0]; k++) {
    uint32_t *grown = realloc(*arrays[k], cap * sizeof **arrays[k]);
    if (!grown) return WK_FAIL(WK_ERR_NOMEM, "out of memory merging a piece of %zu bytes", n);
    *arrays[k] = grown;
  }
  s->capacity = cap;
  return WK_OK;
}

static WkStatus heap_reserve(MergeScratch *s, size_t n) {
  if (n <= s->heap_capacity) return WK_OK;
  size_t cap = s->heap_capacity ? s->heap_capacity : 256;
  while (cap < n) cap *= 2;
  HeapEntry *grown = realloc(s->heap, cap * sizeof *grown);
  if (!grown) return WK_FAIL(WK_ERR_NOMEM, "out of memory merging a piece (%zu heap entries)", n);
  s->heap = grown;
  s->heap_capacity = cap;
  return WK_OK;
}

static inline uint32_t rank_of(const PairTable *pairs, uint32_t left, uint32_t right, uint32_t *merged) {
  const PairSlot *s = pairs_find(pairs, left, right);
  if (!s) return BPE_NO_TOKEN;
  *merged = s->merged;
  return s->rank;
}

/* ---- short pieces: rescan ------------------------------------------------------------------- */

static size_t merge_scan(const PairTable *pairs, MergeScratch *s, size_t n) {
  uint32_t *sym = s->symbol, *rank = s->rank, *merged = s->merged;
  for (size_t i = 0; i + 1 < n; i++) rank[i] = rank_of(pairs, sym[i], sym[i + 1], &merged[i]);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; i++)
      if (rank[i] < rank[best]) best = i;
    if (rank[best] == BPE_NO_TOKEN) break;
    sym[best] = merged[best];
    size_t tail = n - best - 2;  /* symbols after the merged pair */
    memmove(sym + best + 1, sym + best + 2, tail * sizeof *sym);
    memmove(rank + best + 1, rank + best + 2, tail * sizeof *rank);
    memmove(merged + best + 1, merged + best + 2, tail * sizeof *merged);
    n--;
    if (best > 0) rank[best - 1] = rank_of(pairs, sym[best - 1], sym[best], &merged[best - 1]);
    if (best + 1 < n) rank[best] = rank_of(pairs, sym[best], sym[best + 1], &merged[best]);
  }
  return n;
}

/* ---- long pieces: a heap over a linked list --------------------------------------------------- */

static void heap_push(HeapEntry *heap, size_t *size, HeapEntry e) {
  size_t i = (*size)++;
  while (i > 0) {
    size_t parent = (i - 1) / 2;
    if (heap[parent].key <= e.key) break;
    heap[i] = heap[parent];
    i = parent;
  }
  heap[i] = e;
}

static HeapEntry heap_pop(HeapEntry *heap, size_t *size) {
  HeapEntry top = heap[0], last = heap[--*size];
  size_t i = 0, n = *size;
  for (;;) {
    size_t child = 2 * i + 1;
    if (child >= n) break;
    if (child + 1 < n && heap[child + 1].key < heap[child].key) child++;
    if (last.key <= heap[child].key) break;
    heap[i] = heap[child];
    i = child;
  }
  if (n) heap[i] = last;
  return top;
}

static void push_pair(const PairTable *pairs, MergeScratch *s, size_t *size, uint32_t left_pos) {
  uint32_t right_pos = s->next[left_pos], merged = BPE_NO_TOKEN;
  uint32_t rank = rank_of(pairs, s->symbol[left_pos], s->symbol[right_pos], &merged);
  if (rank == BPE_NO_TOKEN) return;
  heap_push(s->heap, size, (HeapEntry){.key = (uint64_t)rank << 32 | left_pos, .left = s->symbol[left_pos],
                                       .right = s->symbol[right_pos]});
}

static WkStatus merge_heap(const PairTable *pairs, MergeScratch *s, size_t n, size_t *out_n) {
  const uint32_t end = (uint32_t)n;  /* "no symbol" in prev/next */
  /* Each merge pushes at most two new pairs; the first round pushes n - 1. */
  WK_TRY(heap_reserve(s, 3 * n));
  for (size_t i = 0; i < n; i++) {
    s->prev[i] = i ? (uint32_t)(i - 1) : end;
    s->next[i] = i + 1 < n ? (uint32_t)(i + 1) : end;
  }
  size_t size = 0, alive = n;
  for (size_t i = 0; i + 1 < n; i++) push_pair(pairs, s, &size, (uint32_t)i);
  while (size > 0) {
    HeapEntry e = heap_pop(s->heap, &size);
    uint32_t left = (uint32_t)e.key, right = s->next[left];
    /* Stale: the left symbol was merged into its neighbour or grew, or its right neighbour changed. */
    if (s->symbol[left] != e.left || right == end || s->symbol[right] != e.right) continue;
    uint32_t merged = BPE_NO_TOKEN;
    rank_of(pairs, e.left, e.right, &merged);
    s->symbol[left] = merged;
    s->symbol[right] = BPE_NO_TOKEN;
    s->next[left] = s->next[right];
    if (s->next[right] != end) s->prev[s->next[right]] = left;
    alive--;
    if (s->prev[left] != end) push_pair(pairs, s, &size, s->prev[left]);
    if (s->next[left] != end) push_pair(pairs, s, &size, left);
  }
  /* Compact the survivors in order. */
  size_t k = 0;
  for (uint32_t i = 0; i != end; i = s->next[i]) s->symbol[k++] = s->symbol[i];
  *out_n = alive;
  return WK_OK;
}

/* ---- the piece cache ------------------------------------------------------------------------- */

static const CacheEntry *cache_find(const ThreadState *ts, const uint8_t *piece, size_t length, uint64_t hash) {
  const CacheEntry *e = &ts->cache[hash & (CACHE_ENTRIES - 1)];
  if (e->hash == hash && e->length == length && memcmp(e->bytes, piece, length) == 0) return e;
  return NULL;
}

/* Inline here: the BPE's hot path; unigram.c calls the exported twins below. */
static inline WkStatus cache_lookup(const ThreadState *ts, const uint8_t *piece, size_t length, uint64_t *hash,
                                    bool *hit, WkTokenVec *out) {
  *hit = false;
  *hash = 0;
  if (length > CACHE_PIECE_BYTES) return WK_OK;
  *hash = XXH3_64bits(piece, length) | 1;
  const CacheEntry *e = cache_find(ts, piece, length, *hash);
  if (!e) return WK_OK;
  *hit = true;
  WK_TRY(wk_token_vec_reserve(out, e->count));
  if (e->count) memcpy(out->data + out->length, e->tokens, e->count * sizeof *e->tokens);
  out->length += e->count;
  return WK_OK;
}

static inline void cache_store(ThreadState *ts, const uint8_t *piece, size_t length, uint64_t hash,
                               const uint32_t *tokens, size_t count) {
  if (!hash || count > CACHE_PIECE_TOKENS) return;
  CacheEntry *e = &ts->cache[hash & (CACHE_ENTRIES - 1)];
  e->hash = hash;
  e->length = (uint8_t)length;
  e->count = (uint8_t)count;
  memcpy(e->bytes, piece, length);
  memcpy(e->tokens, tokens, count * sizeof *tokens);
}

WkStatus piece_cache_lookup(const ThreadState *ts, const uint8_t *piece, size_t length, uint64_t *hash, bool *hit,
                            WkTokenVec *out) {
  return cache_lookup(ts, piece, length, hash, hit, out);
}

void piece_cache_store(ThreadState *ts, const uint8_t *piece, size_t length, uint64_t hash, const uint32_t *tokens,
                       size_t count) {
  cache_store(ts, piece, length, hash, tokens, count);
}

/* ---- the first symbols -------------------------------------------------------------------------- */

/* Byte-level: a piece's bytes, each its token (unk, or dropped, when the model lacks it). */
static size_t byte_symbols(const Bpe *bpe, const uint8_t *piece, size_t length, uint32_t *symbol) {
  size_t n = 0;
  for (size_t i = 0; i < length; i++) {
    uint32_t id = bpe->byte_token[piece[i]];
    if (id == BPE_NO_TOKEN) id = bpe->unk;
    if (id != BPE_NO_TOKEN) symbol[n++] = id;
  }
  return n;
}

/* SentencePiece-style: a piece's characters, as Hugging Face's BPE::merge_word takes them. A pending
 * unk is written before the next character with a token, not before byte fallback tokens (theirs). */
static size_t char_symbols(const Bpe *bpe, const uint8_t *piece, size_t length, uint32_t *symbol) {
  size_t n = 0;
  bool unk_pending = false;
  for (size_t i = 0; i < length;) {
    size_t k = utf8_length(piece[i]);
    uint32_t id = k == 1 ? bpe->byte_token[piece[i]] : vocab_find(&bpe->vocab, piece + i, k);
    if (id != BPE_NO_TOKEN) {
      if (unk_pending) symbol[n++] = bpe->unk;
      unk_pending = false;
      symbol[n++] = id;
    } else {
      bool fallback = true;
      for (size_t j = 0; j < k; j++) fallback = fallback && bpe->fallback_token[piece[i + j]] != BPE_NO_TOKEN;
      if (fallback) {
        for (size_t j = 0; j < k; j++) symbol[n++] = bpe->fallback_token[piece[i + j]];
      } else if (bpe->unk != BPE_NO_TOKEN) {
        if (unk_pending && !bpe->fuse_unk) symbol[n++] = bpe->unk;
        unk_pending = true;
      }
    }
    i += k;
  }
  if (unk_pending) symbol[n++] = bpe->unk;
  return n;
}

/* ---- one piece ----------------------------------------------------------------------------------- */

static WkStatus push_one(WkTokenVec *out, uint32_t id) {
  WK_TRY(wk_token_vec_reserve(out, 1));
  out->data[out->length++] = id;
  return WK_OK;
}

WkStatus bpe_merge_piece(const Bpe *bpe, ThreadState *ts, const uint8_t *piece, size_t length, WkTokenVec *out) {
  if (length == 0) return WK_OK;
  if (length == 1 && bpe->byte_token[piece[0]] != BPE_NO_TOKEN) return push_one(out, bpe->byte_token[piece[0]]);
  /* The thread's cache first: it is small and hot, the vocabulary index is neither. */
  uint64_t hash;
  bool hit;
  WK_TRY(cache_lookup(ts, piece, length, &hash, &hit, out));
  if (hit) return WK_OK;
  if (bpe->ignore_merges) {
    uint32_t id = vocab_find(&bpe->vocab, piece, length);
    if (id != BPE_NO_TOKEN) {
      cache_store(ts, piece, length, hash, &id, 1);
      return push_one(out, id);
    }
  }
  MergeScratch *s = &ts->scratch;
  WK_TRY(merge_scratch_reserve(s, length));
  size_t n = bpe->chars ? char_symbols(bpe, piece, length, s->symbol) : byte_symbols(bpe, piece, length, s->symbol);
  if (n > SCAN_MAX_SYMBOLS) WK_TRY(merge_heap(&bpe->pairs, s, n, &n));
  else n = merge_scan(&bpe->pairs, s, n);
  WK_TRY(wk_token_vec_reserve(out, n));
  if (n) memcpy(out->data + out->length, s->symbol, n * sizeof *s->symbol);
  out->length += n;
  cache_store(ts, piece, length, hash, s->symbol, n);
  return WK_OK;
}

/* ---- SentencePiece-style pieces, word by word ------------------------------------------------------ */

static bool starts_with(const uint8_t *s, size_t n, const uint8_t *prefix, size_t k) {
  return n >= k && memcmp(s, prefix, k) == 0;
}

void bpe_find_word_mark(Bpe *bpe) {
  const uint8_t *mark = bpe->metaspace.on ? bpe->metaspace.replacement : (const uint8_t *)"\xE2\x96\x81";
  size_t k = bpe->metaspace.on ? bpe->metaspace.replacement_length : 3;
  /* ignore_merges would look a whole piece up, which may hold marks after other characters. */
  if (!bpe->chars || bpe->ignore_merges || vocab_find(&bpe->vocab, mark, k) == BPE_NO_TOKEN) return;
  for (uint64_t i = 0; i <= bpe->pairs.mask; i++) {
    const PairSlot *p = &bpe->pairs.slots[i];
    if (p->key == UINT64_MAX) continue;
    size_t a, b;
    const uint8_t *left = vocab_bytes(&bpe->vocab, (uint32_t)(p->key >> 32), &a);
    const uint8_t *right = vocab_bytes(&bpe->vocab, (uint32_t)p->key, &b);
    bool left_ends_in_mark = a >= k && memcmp(left + a - k, mark, k) == 0;
    if (!left_ends_in_mark && starts_with(right, b, mark, k)) return;
  }
  memcpy(bpe->word_mark, mark, k);
  bpe->word_mark_length = k;
}

WkStatus bpe_merge_words(const Bpe *bpe, ThreadState *ts, const uint8_t *piece, size_t length, WkTokenVec *out) {
  size_t k = bpe->word_mark_length;
  if (!k) return bpe_merge_piece(bpe, ts, piece, length, out);
  const uint8_t *mark = bpe->word_mark;
  size_t start = 0;
  bool previous = false;  /* the character before is a mark */
  for (size_t at = 0; at < length;) {
    bool is_mark = starts_with(piece + at, length - at, mark, k);
    if (is_mark && !previous && at > start) {
      WK_TRY(bpe_merge_piece(bpe, ts, piece + start, at - start, out));
      start = at;
    }
    previous = is_mark;
    at += is_mark ? k : utf8_length(piece[at]);
  }
  return bpe_merge_piece(bpe, ts, piece + start, length - start, out);
}
