/*
 * test_tokenizer.c — the tokenizer's parts that the oracle specs (tests/tokenizer/tokenizer_spec.lua)
 * reach only through whole texts: the hand-written ASCII matchers (ascii.c) against PCRE2 running the same
 * patterns, on random text made of the characters where their alternatives meet; and encoding from
 * several threads at once (each with its own state, released as threads end) giving what one gives.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/bpe/bpe.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t next_random(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (uint32_t)(rng_state >> 11);
}

/* Where the alternatives of the patterns meet: quotes and contraction letters in both cases, every
 * kind of ASCII space, digits, punctuation, and non-ASCII letters, digits, spaces and symbols (the
 * matchers must hand those to PCRE2), including U+017F, which a caseless s matches. */
static const char *const FRAGMENTS[] = {
    "a", "Z", "s", "S", "t", "T", "l", "L", "e", "E", "r", "R", "v", "m", "d", "'", "'", "''", " ", " ", "  ",
    "\t", "\n", "\r", "\r\n", "\v", "\f", "\x1c", "\x7f", "0", "7", "123", "(", ".", "/", "_", "!?", "\xc3\xa9",
    "\xc5\xbf", "\xce\xa9", "\xd9\xa3", "\xc2\xb2", "\xc2\xa0", "\xe3\x80\x80", "\xe1\xa0\x8e", "\xf0\x9f\x98\x80",
    "\xe4\xb8\xad", "\xe2\x80\x99", "\xcc\x81"};
enum { FRAGMENT_COUNT = sizeof FRAGMENTS / sizeof FRAGMENTS[0], TEXTS = 20000, MAX_FRAGMENTS = 24, MAX_PIECES = 512 };

typedef struct {
  const uint8_t *base;
  size_t count;
  uint32_t start[MAX_PIECES], length[MAX_PIECES];
} Pieces;

static WkStatus collect(void *context, const uint8_t *piece, size_t length) {
  Pieces *p = context;
  if (p->count < MAX_PIECES) {
    p->start[p->count] = (uint32_t)(piece - p->base);
    p->length[p->count] = (uint32_t)length;
  }
  p->count++;
  return WK_OK;
}

static void pieces_of(const Pretokenizer *pt, PretokenizeState *s, const uint8_t *text, size_t n, Pieces *out) {
  memset(out, 0, sizeof *out);
  out->base = text;
  CHECK(pretokenize(pt, s, text, n, collect, out) == WK_OK);
}

static void test_ascii_matchers_agree_with_pcre2(void) {
  const char *names[] = {"bytelevel", "r50k", "cl100k", "llama3", "qwen2"};
  PretokenizeState *state = pretokenize_state_new();
  CHECK(state != NULL);
  for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
    const char *pattern = pretokenizer_pattern(names[k]);
    Pretokenizer fast = {0}, regex = {0};
    CHECK(pretokenizer_add(&fast, pattern, strlen(pattern), names[k]) == WK_OK);
    CHECK(pretokenizer_add(&regex, pattern, strlen(pattern), names[k]) == WK_OK);
    CHECK(fast.fast[0] != FAST_NONE);
    regex.fast[0] = FAST_NONE;
    int mismatches = 0;
    for (int t = 0; t < TEXTS && mismatches < 3; t++) {
      char text[MAX_FRAGMENTS * 8 + 1];
      size_t n = 0;
      for (uint32_t f = next_random() % MAX_FRAGMENTS; f > 0; f--) {
        const char *fragment = FRAGMENTS[next_random() % FRAGMENT_COUNT];
        memcpy(text + n, fragment, strlen(fragment));
        n += strlen(fragment);
      }
      Pieces a, b;
      pieces_of(&fast, state, (const uint8_t *)text, n, &a);
      pieces_of(&regex, state, (const uint8_t *)text, n, &b);
      bool same = a.count == b.count && a.count <= MAX_PIECES &&
                  memcmp(a.start, b.start, a.count * sizeof a.start[0]) == 0 &&
                  memcmp(a.length, b.length, a.count * sizeof a.length[0]) == 0;
      if (!same) {
        mismatches++;
        fprintf(stderr, "%s: the ASCII matcher and PCRE2 split \"", names[k]);
        for (size_t i = 0; i < n; i++) fprintf(stderr, (uint8_t)text[i] < 0x20 ? "\\x%02x" : "%c", (uint8_t)text[i]);
        fprintf(stderr, "\" differently:");
        for (size_t i = 0; i < a.count && i < MAX_PIECES; i++) fprintf(stderr, " %u+%u", a.start[i], a.length[i]);
        fprintf(stderr, " vs");
        for (size_t i = 0; i < b.count && i < MAX_PIECES; i++) fprintf(stderr, " %u+%u", b.start[i], b.length[i]);
        fprintf(stderr, "\n");
      }
    }
    CHECK(mismatches == 0);
    pretokenizer_free(&fast);
    pretokenizer_free(&regex);
  }
  pretokenize_state_free(state);
}

/* ---- threads --------------------------------------------------------------------------------------- */

enum { THREADS = 4, DOCUMENTS = 200, DOCUMENT_BYTES = 600 };

static char documents[DOCUMENTS][DOCUMENT_BYTES + 1];
static WkTokenVec expected[DOCUMENTS];

typedef struct {
  const WkTokenizer *tokenizer;
  int mismatches;
} Worker;

static void *encode_all(void *arg) {
  Worker *w = arg;
  WkTokenVec v = {0};
  for (int round = 0; round < 3; round++)
    for (int d = 0; d < DOCUMENTS; d++) {
      v.length = 0;
      if (w->tokenizer->encode(w->tokenizer, (const uint8_t *)documents[d], strlen(documents[d]), &v) != WK_OK ||
          v.length != expected[d].length || memcmp(v.data, expected[d].data, v.length * sizeof *v.data) != 0)
        w->mismatches++;
    }
  free(v.data);
  return NULL;
}

/* A rank file: the 256 bytes, then merges that make common words, as base64. */
static void write_ranks(const char *path) {
  static const char *const WORDS[] = {"th", "the", " the", "in", "ing", " in", "er", "an", " a", "on", "at",
                                      "  ", "    ", "\n\n", "==", "ab", "abab", "12", "123"};
  static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  if (!f) return;
  int rank = 0;
  for (int b = 0; b < 256; b++) {
    uint8_t c = (uint8_t)b;
    fprintf(f, "%c%c== %d\n", B64[c >> 2], B64[(c & 3) << 4], rank++);
  }
  for (size_t w = 0; w < sizeof WORDS / sizeof WORDS[0]; w++) {
    const uint8_t *s = (const uint8_t *)WORDS[w];
    size_t n = strlen(WORDS[w]);
    char out[64];
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
      uint32_t v = (uint32_t)s[i] << 16 | (i + 1 < n ? (uint32_t)s[i + 1] << 8 : 0) | (i + 2 < n ? s[i + 2] : 0);
      out[o++] = B64[v >> 18 & 63];
      out[o++] = B64[v >> 12 & 63];
      out[o++] = i + 1 < n ? B64[v >> 6 & 63] : '=';
      out[o++] = i + 2 < n ? B64[v & 63] : '=';
    }
    out[o] = '\0';
    fprintf(f, "%s %d\n", out, rank++);
  }
  fclose(f);
}

static void test_threads_encode_alike(void) {
  char path[] = "/tmp/wick_test_ranksXXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  close(fd);
  write_ranks(path);
  WkTokenizer *t = wk_tokenizer_open(path, "r50k");
  CHECK(t != NULL);
  if (!t) {
    fprintf(stderr, "%s\n", wk_last_error());
    unlink(path);
    return;
  }
  static const char *const WORDS[] = {"the", " the", "thing", "in", "abab", "  ", "\n\n", "123", "x", "é", "==",
                                      "'s", "'LL", "    ", "😀"};
  for (int d = 0; d < DOCUMENTS; d++) {
    size_t n = 0;
    while (n < DOCUMENT_BYTES - 8) {
      const char *w = WORDS[next_random() % (sizeof WORDS / sizeof WORDS[0])];
      memcpy(documents[d] + n, w, strlen(w));
      n += strlen(w);
    }
    documents[d][n] = '\0';
    CHECK(t->encode(t, (const uint8_t *)documents[d], n, &expected[d]) == WK_OK);
    WkByteVec back = {0};
    CHECK(t->decode(t, expected[d].data, expected[d].length, &back) == WK_OK);
    CHECK(back.length == n && memcmp(back.data, documents[d], n) == 0);
    free(back.data);
  }
  Worker workers[THREADS];
  pthread_t ids[THREADS];
  for (int i = 0; i < THREADS; i++) {
    workers[i] = (Worker){.tokenizer = t};
    CHECK(pthread_create(&ids[i], NULL, encode_all, &workers[i]) == 0);
  }
  for (int i = 0; i < THREADS; i++) {
    pthread_join(ids[i], NULL);
    CHECK(workers[i].mismatches == 0);
  }
  /* A second generation of threads: the first ones' states were released as they ended. */
  for (int i = 0; i < THREADS; i++) CHECK(pthread_create(&ids[i], NULL, encode_all, &workers[i]) == 0);
  for (int i = 0; i < THREADS; i++) pthread_join(ids[i], NULL);
  wk_tokenizer_free(t);
  for (int d = 0; d < DOCUMENTS; d++) free(expected[d].data);
  unlink(path);
}

int main(void) {
  RUN_TEST(test_ascii_matchers_agree_with_pcre2);
  RUN_TEST(test_threads_encode_alike);
  return check_failures ? 1 : 0;
}
