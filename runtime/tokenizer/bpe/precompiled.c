/*
 * precompiled.c — SentencePiece's precompiled_charsmap, the normalizer of T5, ALBERT, XLNet and
 * mT5 files (Hugging Face's Precompiled): a darts-clone double-array trie over the UTF-8 of the
 * strings it rewrites, and the NUL-terminated strings they become.
 *
 * As `tokenizers` runs it (spm_precompiled): the text is cut into extended grapheme clusters; a
 * cluster of fewer than 6 bytes is looked up whole, and its first (shortest) prefix in the trie
 * replaces the whole cluster; otherwise, or when none is found, each of its characters is looked up
 * alone and replaced, or kept. Graphemes come from libunistring (its Unicode version may trail
 * Rust's unicode-segmentation on characters assigned since). Text below U+0080 is its own graphemes
 * but for CR LF, without asking libunistring.
 *
 * A unit: label (bits 0-7, bit 31 set on a value), has_leaf (bit 8), offset (bits 10-31, shifted 8
 * more when bit 9 is set). A position outside the trie or a string outside the blob, which would
 * make `tokenizers` panic, is read as no match.
 */
#include <stdlib.h>
#include <string.h>
#include <unigbrk.h>  /* u8_grapheme_breaks (libunistring) */

#include "bpe.h"
#include "../../core/json.h"  /* wk_utf8_valid_prefix */

struct Charsmap {
  uint32_t *units;
  size_t count;
  uint8_t *normalized;  /* the strings, NUL-terminated */
  size_t normalized_length;
};

enum { WHOLE_GRAPHEME_BYTES = 6 };  /* clusters shorter than this are looked up whole first */

WkStatus charsmap_load(const uint8_t *blob, size_t length, Charsmap **out, const char *what) {
  *out = NULL;
  if (length < 4)
    return WK_FAIL(WK_ERR_FORMAT, "%s: the charsmap is %zu bytes, too short for its trie's size", what, length);
  uint32_t trie_bytes = (uint32_t)blob[0] | (uint32_t)blob[1] << 8 | (uint32_t)blob[2] << 16 | (uint32_t)blob[3] << 24;
  if (trie_bytes < 4 || trie_bytes % 4 != 0 || trie_bytes > length - 4)
    return WK_FAIL(WK_ERR_FORMAT, "%s: the charsmap's trie is %u bytes, not a whole number of units within its %zu",
                   what, trie_bytes, length - 4);
  const uint8_t *strings = blob + 4 + trie_bytes;
  size_t strings_length = length - 4 - trie_bytes;
  size_t valid = wk_utf8_valid_prefix(strings, strings_length);
  if (valid < strings_length)
    return WK_FAIL(WK_ERR_FORMAT, "%s: the charsmap's normalized strings are not UTF-8 (at byte %zu of %zu)", what,
                   valid, strings_length);
  Charsmap *c = wk_calloc(1, sizeof *c, "a charsmap");
  if (!c) return wk_last_status();
  c->count = trie_bytes / 4;
  c->units = wk_malloc(trie_bytes, "a charsmap's trie");
  c->normalized = wk_malloc(strings_length + 1, "a charsmap's strings");
  if (!c->units || !c->normalized) {
    charsmap_free(c);
    return wk_last_status();
  }
  for (size_t i = 0; i < c->count; i++) {
    const uint8_t *u = blob + 4 + 4 * i;
    c->units[i] = (uint32_t)u[0] | (uint32_t)u[1] << 8 | (uint32_t)u[2] << 16 | (uint32_t)u[3] << 24;
  }
  if (strings_length) memcpy(c->normalized, strings, strings_length);
  c->normalized_length = strings_length;
  *out = c;
  return WK_OK;
}

void charsmap_free(Charsmap *c) {
  if (!c) return;
  free(c->units);
  free(c->normalized);
  free(c);
}

static uint64_t unit_offset(uint32_t unit) { return (uint64_t)(unit >> 10) << ((unit & (1u << 9)) >> 6); }

/* The string of key's shortest prefix in the trie (spm_precompiled's results[0]), or NULL. */
static const uint8_t *transform(const Charsmap *c, const uint8_t *key, size_t n, size_t *out_length) {
  uint64_t pos = unit_offset(c->units[0]);
  for (size_t i = 0; i < n && key[i]; i++) {
    pos ^= key[i];
    if (pos >= c->count) return NULL;
    uint32_t unit = c->units[pos];
    if ((unit & (1u << 31 | 0xFF)) != key[i]) return NULL;
    pos ^= unit_offset(unit);
    if (!((unit >> 8) & 1)) continue;
    if (pos >= c->count) return NULL;
    size_t at = c->units[pos] & ((1u << 31) - 1);
    /* Past the strings, or inside a character: tokenizers would panic slicing there. */
    if (at > c->normalized_length || (at < c->normalized_length && (c->normalized[at] & 0xC0) == 0x80)) return NULL;
    const uint8_t *end = memchr(c->normalized + at, 0, c->normalized_length - at);
    *out_length = (end ? (size_t)(end - c->normalized) : c->normalized_length) - at;
    return c->normalized + at;
  }
  return NULL;
}

/* One grapheme cluster, rewritten into out. */
static WkStatus rewrite_grapheme(const Charsmap *c, const uint8_t *g, size_t n, WkByteVec *out) {
  size_t length;
  const uint8_t *with = n < WHOLE_GRAPHEME_BYTES ? transform(c, g, n, &length) : NULL;
  if (with) return wk_byte_vec_append(out, with, length);
  for (size_t i = 0; i < n;) {
    size_t k = utf8_length(g[i]);
    with = transform(c, g + i, k, &length);
    WK_TRY(with ? wk_byte_vec_append(out, with, length) : wk_byte_vec_append(out, g + i, k));
    i += k;
  }
  return WK_OK;
}

static bool ascii(const uint8_t *text, size_t length) {
  for (size_t i = 0; i < length; i++)
    if (text[i] >= 0x80) return false;
  return true;
}

WkStatus charsmap_normalize(const Charsmap *c, NormalizeScratch *s, const uint8_t *text, size_t length,
                            WkByteVec *out) {
  if (ascii(text, length)) {
    for (size_t i = 0; i < length;) {
      size_t n = text[i] == '\r' && i + 1 < length && text[i + 1] == '\n' ? 2 : 1;
      WK_TRY(rewrite_grapheme(c, text + i, n, out));
      i += n;
    }
    return WK_OK;
  }
  if (length > s->breaks_capacity) {
    char *grown = realloc(s->breaks, length);
    if (!grown) return WK_FAIL(WK_ERR_NOMEM, "out of memory finding the graphemes of %zu bytes", length);
    s->breaks = grown;
    s->breaks_capacity = length;
  }
  u8_grapheme_breaks(text, length, s->breaks);
  size_t start = 0;
  for (size_t i = 1; i <= length; i++)
    if (i == length || s->breaks[i]) {
      WK_TRY(rewrite_grapheme(c, text + start, i - start, out));
      start = i;
    }
  return WK_OK;
}
