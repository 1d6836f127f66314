/*
 * tiktoken.c — tiktoken rank files (`<base64 token> <rank>` per line, rank = token id) with the
 * pattern and special tokens of their encoding: r50k (gpt2, r50k_base), p50k (p50k_base), cl100k
 * (cl100k_base), o200k (o200k_base). The encoding is named by the caller or by the file's name.
 *
 * tiktoken's rule: a piece that is a token is that token (ignore_merges); otherwise bytes merge by
 * the rank of the bytes they make, so the merge table holds every split of every token into two
 * tokens, ranked by the token they make.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>  /* XXH3_64bits_withSeed */

#include "bpe.h"

typedef struct {
  const char *text;
  uint32_t id;
} Special;

enum { MAX_SPECIALS = 5, PATH_BYTES = 4096 + 32 };

static const struct {
  const char *names[3];  /* what the caller or the file's name may call it */
  const char *pattern;   /* pretokenizer_pattern name */
  Special specials[MAX_SPECIALS];
} ENCODINGS[] = {
    {{"r50k", "r50k_base", "gpt2"}, "r50k", {{"<|endoftext|>", 50256}}},
    {{"p50k", "p50k_base", NULL}, "r50k", {{"<|endoftext|>", 50256}}},
    {{"cl100k", "cl100k_base", NULL},
     "cl100k",
     {{"<|endoftext|>", 100257}, {"<|fim_prefix|>", 100258}, {"<|fim_middle|>", 100259}, {"<|fim_suffix|>", 100260},
      {"<|endofprompt|>", 100276}}},
    {{"o200k", "o200k_base", NULL}, "o200k", {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}}},
};
enum { ENCODING_COUNT = sizeof ENCODINGS / sizeof ENCODINGS[0] };

static int encoding_named(const char *name, size_t length) {
  for (int e = 0; e < ENCODING_COUNT; e++)
    for (int k = 0; k < 3 && ENCODINGS[e].names[k]; k++)
      if (strlen(ENCODINGS[e].names[k]) == length && memcmp(ENCODINGS[e].names[k], name, length) == 0) return e;
  return -1;
}

/* "dir/cl100k_base.tiktoken" -> the encoding its stem names, or -1. */
static int encoding_of_path(const char *path) {
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  size_t length = strcspn(base, ".");
  return encoding_named(base, length);
}

static int base64_value(uint8_t c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

long base64_decode(const char *s, size_t length, uint8_t *out) {
  if (length == 0 || length % 4 != 0) return -1;
  size_t n = 0;
  for (size_t i = 0; i < length; i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; k++) {
      uint8_t c = (uint8_t)s[i + k];
      if (c == '=' && i + 4 == length && k >= 2) {
        v[k] = 0;
        pad++;
      } else {
        if (pad) return -1;
        v[k] = base64_value(c);
        if (v[k] < 0) return -1;
      }
    }
    uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
    out[n++] = (uint8_t)(w >> 16);
    if (pad < 2) out[n++] = (uint8_t)(w >> 8);
    if (pad < 1) out[n++] = (uint8_t)w;
  }
  return (long)n;
}

typedef struct {
  const char *token;
  size_t token_length;
  uint64_t rank;
} RankLine;

/* One line "token rank" (a final CR tolerated); false with a reason. */
static bool parse_line(const char *line, size_t length, RankLine *out, const char **why) {
  if (length && line[length - 1] == '\r') length--;
  const char *space = memchr(line, ' ', length);
  if (!space) return *why = "expected '<base64 token> <rank>'", false;
  out->token = line;
  out->token_length = (size_t)(space - line);
  const char *p = space + 1, *end = line + length;
  if (p == end) return *why = "missing rank", false;
  uint64_t rank = 0;
  for (; p < end; p++) {
    if (*p < '0' || *p > '9') return *why = "the rank is not a whole number", false;
    rank = rank * 10 + (uint64_t)(*p - '0');
    if (rank >= BPE_MAX_VOCAB) return *why = "the rank is too large (more than 2^22 tokens)", false;
  }
  out->rank = rank;
  return true;
}

/* The non-empty lines of a file, numbered from 1. */
typedef struct {
  const char *p, *end;
  uint64_t number;
} Lines;

static bool next_line(Lines *it, const char **line, size_t *length) {
  while (it->p < it->end) {
    const char *nl = memchr(it->p, '\n', (size_t)(it->end - it->p));
    *line = it->p;
    *length = (size_t)((nl ? nl : it->end) - it->p);
    it->number++;
    it->p = nl ? nl + 1 : it->end;
    if (*length > 1 || (*length == 1 && (*line)[0] != '\r')) return true;
  }
  return false;
}

static WkStatus read_ranks(Bpe *bpe, const char *path, const char *text, size_t length) {
  uint64_t max_rank = 0, count = 0;
  const char *line, *why;
  size_t line_length;
  RankLine r;
  for (Lines it = {text, text + length, 0}; next_line(&it, &line, &line_length); count++) {
    if (!parse_line(line, line_length, &r, &why))
      return WK_FAIL(WK_ERR_FORMAT, "%s:%llu: %s (not a tiktoken rank file?)", path, (unsigned long long)it.number,
                     why);
    if (r.rank > max_rank) max_rank = r.rank;
  }
  if (count == 0) return WK_FAIL(WK_ERR_FORMAT, "%s: no ranks (an empty tiktoken file)", path);
  WK_TRY(vocab_init(&bpe->vocab, (uint32_t)max_rank + 1));
  uint8_t *bytes = wk_malloc(length, "a decoded rank");
  if (!bytes) return wk_last_status();
  WkStatus status = WK_OK;
  for (Lines it = {text, text + length, 0}; status == WK_OK && next_line(&it, &line, &line_length);) {
    parse_line(line, line_length, &r, &why);
    long n = base64_decode(r.token, r.token_length, bytes);
    char where[PATH_BYTES];
    snprintf(where, sizeof where, "%s:%llu", path, (unsigned long long)it.number);
    if (n < 0) status = WK_FAIL(WK_ERR_FORMAT, "%s: the token is not base64", where);
    else status = vocab_set(&bpe->vocab, (uint32_t)r.rank, bytes, (size_t)n, where);
  }
  free(bytes);
  return status;
}

/* Every split of every token into two tokens, ranked by the token. */
static WkStatus build_merges(Bpe *bpe, const char *path) {
  const Vocab *v = &bpe->vocab;
  WK_TRY(pairs_init(&bpe->pairs, v->count * 2));
  for (uint32_t id = 0; id < v->count; id++) {
    if (!vocab_has(v, id)) continue;
    size_t n;
    const uint8_t *bytes = vocab_bytes(v, id, &n);
    for (size_t k = 1; k < n; k++) {
      uint32_t left = vocab_find(v, bytes, k), right = vocab_find(v, bytes + k, n - k);
      if (left != BPE_NO_TOKEN && right != BPE_NO_TOKEN) WK_TRY(pairs_put(&bpe->pairs, left, right, id, id));
    }
  }
  for (int b = 0; b < 256; b++) {
    uint8_t byte = (uint8_t)b;
    if (vocab_find(v, &byte, 1) == BPE_NO_TOKEN)
      return WK_FAIL(WK_ERR_FORMAT, "%s: no token for the single byte 0x%02x (every byte needs one)", path, b);
  }
  return WK_OK;
}

WkStatus bpe_load_tiktoken(const char *path, const char *text, size_t length, const char *pattern, Bpe **out) {
  *out = NULL;
  int e = pattern ? encoding_named(pattern, strlen(pattern)) : encoding_of_path(path);
  if (e < 0) {
    if (pattern)
      return WK_FAIL(WK_ERR_INVALID_ARG, "tiktoken encoding '%s' is not known (known: r50k (gpt2), p50k, cl100k, o200k)",
                     pattern);
    return WK_FAIL(WK_ERR_INVALID_ARG, "%s: which tiktoken encoding is it? Its name does not say (r50k_base, gpt2, "
                   "p50k_base, cl100k_base, o200k_base): name the pattern (r50k, p50k, cl100k, o200k)", path);
  }
  const char *base = strrchr(path, '/');
  Bpe *bpe = bpe_new(base ? base + 1 : path);
  if (!bpe) return wk_last_status();
  WkStatus status = read_ranks(bpe, path, text, length);
  if (status == WK_OK && (status = vocab_finish(&bpe->vocab)) != WK_OK) wk_error_context("%s", path);
  if (status == WK_OK) status = build_merges(bpe, path);
  const char *regex = pretokenizer_pattern(ENCODINGS[e].pattern);
  if (status == WK_OK) status = pretokenizer_add(&bpe->pre, regex, strlen(regex), ENCODINGS[e].names[0]);
  for (int k = 0; k < MAX_SPECIALS && status == WK_OK && ENCODINGS[e].specials[k].text; k++) {
    const Special *s = &ENCODINGS[e].specials[k];
    if (vocab_has(&bpe->vocab, s->id)) {
      status = WK_FAIL(WK_ERR_FORMAT, "%s: rank %u is a token, but %s's special token %s has that id", path, s->id,
                       ENCODINGS[e].names[0], s->text);
      break;
    }
    status = added_add(&bpe->added[0], s->id, (const uint8_t *)s->text, strlen(s->text), NULL, 0, true, false, false);
  }
  bpe->ignore_merges = true;
  if (status == WK_OK && (status = bpe_finish(bpe)) != WK_OK) wk_error_context("%s", path);
  if (status != WK_OK) {
    bpe_free(bpe);
    return status;
  }
  bpe->base.fingerprint = XXH3_64bits_withSeed(text, length, XXH3_64bits(ENCODINGS[e].names[0],
                                                                          strlen(ENCODINGS[e].names[0])));
  *out = bpe;
  return WK_OK;
}
