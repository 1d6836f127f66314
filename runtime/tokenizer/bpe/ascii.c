/*
 * ascii.c — hand-written matchers of the pre-tokenizer patterns most models use, for ASCII text:
 * GPT-2's (Hugging Face's ByteLevel regex and tiktoken's r50k/p50k), cl100k's, Llama 3's and
 * Qwen 2's. Each gives the end of the match at a position exactly as the regex would (the first
 * alternative that matches, each run as long as it goes, the lookahead and `$` as written), or 0
 * when that depends on a character that is not ASCII (a letter? a number? White_Space? a case
 * fold of s?): pretokenize.c then asks PCRE2 for that one match. Most text is ASCII, and a regex
 * engine spends most of its time on alternatives and Unicode properties this does with one table
 * lookup per byte.
 *
 * tests/c/test_tokenizer.c checks every matcher against PCRE2 on random text of the characters
 * where the alternatives meet (quotes, case, CR/LF, tabs, spaces, digits, and non-ASCII letters,
 * digits and spaces next to them).
 */
#include "bpe.h"

enum { LETTER = 1, NUMBER = 2, SPACE = 3, OTHER = 4, NOT_ASCII = 0 };

/* The class of each byte: \p{L}, \p{N}, White_Space, anything else; NOT_ASCII for 0x80 and up. */
static const uint8_t CLASS[256] = {
    [0x00 ... 0x08] = OTHER, [0x09 ... 0x0D] = SPACE, [0x0E ... 0x1F] = OTHER, [' '] = SPACE,
    ['!' ... '/'] = OTHER,   ['0' ... '9'] = NUMBER,  [':' ... '@'] = OTHER,   ['A' ... 'Z'] = LETTER,
    ['[' ... '`'] = OTHER,   ['a' ... 'z'] = LETTER,  ['{' ... 0x7F] = OTHER,
};

/* The end of the run of class k from i; *unknown when it stops at a byte that is not ASCII (which
 * might have continued it). */
static inline size_t run_end(const uint8_t *t, size_t n, size_t i, uint8_t k, bool *unknown) {
  while (i < n && CLASS[t[i]] == k) i++;
  if (i < n && CLASS[t[i]] == NOT_ASCII) *unknown = true;
  return i;
}

static inline uint8_t lower(uint8_t c) { return CLASS[c] == LETTER ? (uint8_t)(c | 0x20) : c; }

/* 's 't 're 've 'm 'll 'd at t[i] == '\'' (case-insensitive or not): the end, 0 when none, or
 * SIZE_MAX when a byte that is not ASCII decides (a caseless s also matches U+017F). */
static size_t contraction(const uint8_t *t, size_t n, size_t i, bool caseless) {
  if (i + 1 >= n) return 0;
  uint8_t a = t[i + 1], b = i + 2 < n ? t[i + 2] : 0;
  if (CLASS[a] == NOT_ASCII) return SIZE_MAX;
  if (caseless) a = lower(a);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
  if (a != 'r' && a != 'v' && a != 'l') return 0;
  if (i + 2 >= n) return 0;
  if (CLASS[b] == NOT_ASCII) return SIZE_MAX;
  if (caseless) b = lower(b);
  return (a == 'l' && b == 'l') || (a != 'l' && b == 'e') ? i + 3 : 0;
}

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t match_gpt2(const uint8_t *t, size_t n, size_t i) {
  uint8_t c = t[i], k = CLASS[c];
  bool unknown = false;
  if (c == '\'') {
    size_t end = contraction(t, n, i, false);
    if (end == SIZE_MAX) return 0;
    if (end) return end;
  }
  if (c == ' ' && i + 1 < n) {
    uint8_t next = CLASS[t[i + 1]];
    if (next == NOT_ASCII) return 0;
    if (next != SPACE) i++, k = next; /* the space leads a run of letters, numbers or others */
  }
  if (k == LETTER || k == NUMBER || k == OTHER) {
    size_t end = run_end(t, n, i + 1, k, &unknown);
    return unknown ? 0 : end;
  }
  if (k != SPACE) return 0;
  size_t end = run_end(t, n, i, SPACE, &unknown);
  if (unknown) return 0;
  if (end == n) return n;          /* \s+(?!\S) to the end */
  if (end - i >= 2) return end - 1; /* \s+(?!\S): all but the last, which leads what follows */
  return i + 1;                     /* \s+ of one */
}

/* cl100k:  '(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|
 *          \s++$|\s*[\r\n]|\s+(?!\S)|\s
 * Llama 3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 *          \s*[\r\n]+|\s+(?!\S)|\s+
 * Qwen 2:  Llama 3's with \p{N} for \p{N}{1,3}.
 * They differ in the digits of a number and in a run of whitespace that ends the text: cl100k takes
 * it whole (\s++$), the others stop after its last newline. */
static size_t match_cl100k(const uint8_t *t, size_t n, size_t i, size_t max_digits, bool whole_final_space) {
  uint8_t c = t[i], k = CLASS[c];
  bool unknown = false;
  if (c == '\'') {
    size_t end = contraction(t, n, i, true);
    if (end == SIZE_MAX) return 0;
    if (end) return end;
  }
  if (k == LETTER) {
    size_t end = run_end(t, n, i + 1, LETTER, &unknown);
    return unknown ? 0 : end;
  }
  if (c != '\r' && c != '\n' && k != NUMBER && i + 1 < n) { /* one leading non-letter, non-number */
    uint8_t next = CLASS[t[i + 1]];
    if (next == NOT_ASCII) return 0;
    if (next == LETTER) {
      size_t end = run_end(t, n, i + 2, LETTER, &unknown);
      return unknown ? 0 : end;
    }
  }
  if (k == NUMBER) {
    size_t end = i + 1;
    while (end < n && end - i < max_digits && CLASS[t[end]] == NUMBER) end++;
    if (end - i < max_digits && end < n && CLASS[t[end]] == NOT_ASCII) return 0;
    return end;
  }
  size_t p = c == ' ' && i + 1 < n && CLASS[t[i + 1]] == OTHER ? i + 1 : i;
  if (CLASS[t[p]] == OTHER) {
    size_t end = run_end(t, n, p + 1, OTHER, &unknown);
    if (unknown) return 0;
    while (end < n && (t[end] == '\r' || t[end] == '\n')) end++;
    return end;
  }
  if (k != SPACE) return 0;
  size_t end = run_end(t, n, i, SPACE, &unknown);
  if (unknown) return 0;
  if (end == n && whole_final_space) return n;
  for (size_t q = end; q > i; q--) /* \s*[\r\n]: up to the last newline of the run */
    if (t[q - 1] == '\r' || t[q - 1] == '\n') return q;
  if (end == n) return n;
  if (end - i >= 2) return end - 1;
  return i + 1;
}

size_t fast_match(FastPattern kind, const uint8_t *text, size_t length, size_t at) {
  if (CLASS[text[at]] == NOT_ASCII) return 0;
  switch (kind) {
    case FAST_GPT2: return match_gpt2(text, length, at);
    case FAST_CL100K: return match_cl100k(text, length, at, 3, true);
    case FAST_LLAMA3: return match_cl100k(text, length, at, 3, false);
    case FAST_QWEN2: return match_cl100k(text, length, at, 1, false);
    case FAST_NONE: break;
  }
  return 0;
}
