/*
 * added.c — added and special tokens found in text, by Hugging Face's rules (tiktoken's special
 * tokens are the case without options): scanning left to right, the leftmost token that matches,
 * the longest one there; a special token that is not honoured is left as plain text and the scan
 * goes on after it (it hides nothing else); lstrip and rstrip widen a match over the whitespace
 * (Unicode White_Space) before or after it.
 *
 * The scan looks at the first two bytes of each position before comparing any token, so text
 * without a token's prefix costs a table lookup per byte.
 */
#include <stdlib.h>
#include <string.h>

#include "bpe.h"

enum { PAIR_BITS = 1 << 16 };

WkStatus added_add(AddedSet *set, uint32_t id, const uint8_t *content, size_t content_length, const uint8_t *match,
                   size_t match_length, bool special, bool lstrip, bool rstrip) {
  if (!match) match = content, match_length = content_length;
  if (match_length == 0) return WK_FAIL(WK_ERR_FORMAT, "added token %u is empty", id);
  if (set->count == set->capacity) {
    size_t cap = set->capacity ? set->capacity * 2 : 16;
    AddedToken *grown = realloc(set->tokens, cap * sizeof *grown);
    if (!grown) return WK_FAIL(WK_ERR_NOMEM, "out of memory for %zu added tokens", cap);
    set->tokens = grown;
    set->capacity = cap;
  }
  uint8_t *copy = wk_malloc(match_length + content_length, "an added token");
  if (!copy) return wk_last_status();
  memcpy(copy, match, match_length);
  if (content_length) memcpy(copy + match_length, content, content_length);
  set->tokens[set->count++] = (AddedToken){.id = id, .bytes = copy, .length = match_length,
                                           .content = copy + match_length, .content_length = content_length,
                                           .special = special, .lstrip = lstrip, .rstrip = rstrip};
  set->plain += !special;
  return WK_OK;
}

static int by_first_then_longest(const void *a, const void *b) {
  const AddedToken *x = a, *y = b;
  if (x->bytes[0] != y->bytes[0]) return x->bytes[0] < y->bytes[0] ? -1 : 1;
  if (x->length != y->length) return x->length > y->length ? -1 : 1;
  return x->id < y->id ? -1 : x->id > y->id;
}

WkStatus added_finish(AddedSet *set) {
  if (set->count) qsort(set->tokens, set->count, sizeof *set->tokens, by_first_then_longest);
  set->pairs = wk_calloc(PAIR_BITS / 8, 1, "added token prefixes");
  if (!set->pairs) return wk_last_status();
  memset(set->begin, 0, sizeof set->begin);
  memset(set->single, 0, sizeof set->single);
  for (size_t i = 0; i < set->count; i++) {
    const AddedToken *t = &set->tokens[i];
    set->begin[t->bytes[0] + 1]++;
    if (t->length == 1) {
      set->single[t->bytes[0]] = 1;
    } else {
      unsigned pair = (unsigned)t->bytes[0] << 8 | t->bytes[1];
      set->pairs[pair / 8] |= (uint8_t)(1u << (pair % 8));
    }
  }
  for (int b = 0; b < 256; b++) set->begin[b + 1] += set->begin[b];
  return WK_OK;
}

void added_free(AddedSet *set) {
  for (size_t i = 0; i < set->count; i++) free(set->tokens[i].bytes);
  free(set->tokens);
  free(set->pairs);
  memset(set, 0, sizeof *set);
}

/* ---- whitespace (for lstrip / rstrip) --------------------------------------------------------- */

/* Where the whitespace that ends text[from, to) begins. */
static size_t whitespace_before(const uint8_t *text, size_t from, size_t to) {
  while (to > from) {
    size_t start = to - 1;
    while (start > from && (text[start] & 0xC0) == 0x80) start--;
    if (!white_space(utf8_decode(text + start, to - start))) break;
    to = start;
  }
  return to;
}

/* Where the whitespace that starts text[from, to) ends. */
static size_t whitespace_after(const uint8_t *text, size_t from, size_t to) {
  while (from < to) {
    size_t n = utf8_length(text[from]);
    if (n > to - from || !white_space(utf8_decode(text + from, n))) break;
    from += n;
  }
  return from;
}

/* ---- the scan ---------------------------------------------------------------------------------- */

/* The longest token at text[at], or NULL. */
static const AddedToken *match_at(const AddedSet *set, const uint8_t *text, size_t at, size_t length) {
  uint8_t b0 = text[at];
  if (at + 1 < length) {
    unsigned pair = (unsigned)b0 << 8 | text[at + 1];
    if (!(set->pairs[pair / 8] & (1u << (pair % 8))) && !set->single[b0]) return NULL;
  } else if (!set->single[b0]) {
    return NULL;
  }
  for (uint32_t i = set->begin[b0]; i < set->begin[b0 + 1]; i++) {
    const AddedToken *t = &set->tokens[i];
    if (t->length <= length - at && memcmp(text + at, t->bytes, t->length) == 0) return t;
  }
  return NULL;
}

WkStatus added_split(const AddedSet *set, bool honour_special, const uint8_t *text, size_t length,
                     SegmentFn segment, void *context) {
  bool any = set->count > 0 && (honour_special || set->plain > 0);
  size_t done = 0; /* text before it has been handed on */
  for (size_t at = 0; any && at < length;) {
    const AddedToken *t = match_at(set, text, at, length);
    if (!t) {
      at++;
      continue;
    }
    size_t start = at, stop = at + t->length;
    at = stop;
    if (t->special && !honour_special) continue;
    if (t->lstrip) start = whitespace_before(text, done, start);
    if (t->rstrip) stop = whitespace_after(text, stop, length);
    if (start > done) WK_TRY(segment(context, text + done, start - done, BPE_NO_TOKEN));
    WK_TRY(segment(context, text + start, stop - start, t->id));
    done = at = stop;
  }
  if (done < length) WK_TRY(segment(context, text + done, length - done, BPE_NO_TOKEN));
  return WK_OK;
}
