/*
 * normalize.c — the normalizers of tokenizer.json files, as Hugging Face's `tokenizers` runs them on
 * each run of text between added tokens, one after the other (a Sequence): NFC (Qwen 2), NFKC,
 * Prepend (Llama 2's "▁" in front of a run), Replace with a String (Llama 2's and Gemma's " " -> "▁")
 * or a Regex pattern (T5's " {2,}" -> "▁"), Strip, Lowercase and Precompiled (precompiled.c).
 *
 * Each step writes into one of the thread's two buffers and the next reads it, so a run costs one
 * pass per step and no allocation once the buffers have grown. NFC is skipped for text below U+0300
 * and NFKC for ASCII, which they leave as they are; Strip only moves the run's ends.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>    /* pcre2_match_data_free */
#include <unicase.h>  /* uc_tolower (libunistring) */
#include <uninorm.h>  /* u8_normalize */
#include <unistr.h>   /* u8_uctomb */

#include "bpe.h"

static WkStatus copy_bytes(uint8_t **out, const uint8_t *text, size_t length, const char *what) {
  *out = NULL;
  if (length == 0) return WK_OK;
  *out = wk_malloc(length, what);
  if (!*out) return wk_last_status();
  memcpy(*out, text, length);
  return WK_OK;
}

WkStatus rewrite_copy(Rewrite *to, const Rewrite *from, const char *what) {
  *to = *from;
  WK_TRY(copy_bytes(&to->text, from->text, from->text_length, what));
  WkStatus status = copy_bytes(&to->with, from->with, from->with_length, what);
  if (status != WK_OK) free(to->text);
  return status;
}

void rewrite_free(Rewrite *r) {
  free(r->text);
  free(r->with);
  memset(r, 0, sizeof *r);
}

WkStatus normalizer_add(Normalizer *n, const NormalizeStep *step, const char *what) {
  if (n->count == NORMALIZE_MAX_STEPS)
    return WK_FAIL(WK_ERR_UNSUPPORTED, "%s: more than %d normalizers in a row", what, NORMALIZE_MAX_STEPS);
  n->steps[n->count] = *step;
  WK_TRY(rewrite_copy(&n->steps[n->count].rewrite, &step->rewrite, what));
  n->count++; /* it owns the step's regex and charsmap from here */
  return WK_OK;
}

void normalizer_free(Normalizer *n) {
  for (int i = 0; i < n->count; i++) {
    rewrite_free(&n->steps[i].rewrite);
    if (n->steps[i].regex) normalize_regex_free(n->steps[i].regex);
    charsmap_free(n->steps[i].charsmap);
  }
  memset(n, 0, sizeof *n);
}

void normalize_scratch_free(NormalizeScratch *s) {
  free(s->buffer[0].data);
  free(s->buffer[1].data);
  free(s->breaks);
  pcre2_match_data_free(s->match);
  memset(s, 0, sizeof *s);
}

/* The first byte of a character from U+0300 on: below it, every character is NFC and starts none of
 * NFC's compositions. */
enum { FIRST_NFC_SENSITIVE_BYTE = 0xCC };

static bool nfc_stable(const uint8_t *text, size_t length) {
  for (size_t i = 0; i < length; i++)
    if (text[i] >= FIRST_NFC_SENSITIVE_BYTE) return false;
  return true;
}

static WkStatus unicode_form(uninorm_t form, WkByteVec *out, const uint8_t *text, size_t length) {
  size_t n = out->capacity;
  uint8_t *result = u8_normalize(form, text, length, out->data, &n);
  if (!result) return WK_FAIL(WK_ERR_NOMEM, "Unicode normalization of %zu bytes failed: %s", length, strerror(errno));
  if (result != out->data) { /* a larger buffer of its own: keep it for next time */
    free(out->data);
    out->data = result;
    out->capacity = n;
  }
  out->length = n;
  return WK_OK;
}

static bool ascii(const uint8_t *text, size_t length) {
  for (size_t i = 0; i < length; i++)
    if (text[i] >= 0x80) return false;
  return true;
}

/* Rust's char::to_lowercase: the simple mapping, but for U+0130, whose lowercase is two characters. */
static WkStatus lowercase(WkByteVec *out, const uint8_t *text, size_t length) {
  WK_TRY(wk_byte_vec_reserve(out, length + 4));
  for (size_t i = 0; i < length;) {
    size_t k = utf8_length(text[i]);
    uint32_t c = utf8_decode(text + i, k);
    i += k;
    if (c == 0x130) {
      WK_TRY(wk_byte_vec_append(out, "i\xCC\x87", 3));
      continue;
    }
    uint8_t bytes[6];
    int n = u8_uctomb(bytes, c < 0x80 ? (uint32_t)(c >= 'A' && c <= 'Z' ? c + 32 : c) : uc_tolower(c), sizeof bytes);
    WK_TRY(wk_byte_vec_append(out, bytes, n > 0 ? (size_t)n : 0));
  }
  return WK_OK;
}

/* White_Space off the ends the step names (the text stays where it is). */
static void strip(const NormalizeStep *step, const uint8_t **text, size_t *length) {
  const uint8_t *t = *text;
  size_t from = 0, to = *length;
  while (step->left && from < to) {
    size_t k = utf8_length(t[from]);
    if (!white_space(utf8_decode(t + from, k))) break;
    from += k;
  }
  while (step->right && to > from) {
    size_t start = to - 1;
    while (start > from && (t[start] & 0xC0) == 0x80) start--;
    if (!white_space(utf8_decode(t + start, to - start))) break;
    to = start;
  }
  *text = t + from;
  *length = to - from;
}

WkStatus replace_all(WkByteVec *out, const uint8_t *text, size_t length, const uint8_t *from, size_t from_length,
                     const uint8_t *with, size_t with_length) {
  size_t at = 0;
  while (at < length) {
    const uint8_t *hit = memmem(text + at, length - at, from, from_length);
    size_t stop = hit ? (size_t)(hit - text) : length;
    WK_TRY(wk_byte_vec_append(out, text + at, stop - at));
    if (!hit) break;
    WK_TRY(wk_byte_vec_append(out, with, with_length));
    at = stop + from_length;
  }
  return WK_OK;
}

WkStatus normalize(const Normalizer *n, NormalizeScratch *s, const uint8_t **text, size_t *length) {
  const uint8_t *in = *text;
  size_t in_length = *length;
  int k = 0;  /* the buffer the next step writes */
  for (int i = 0; i < n->count; i++) {
    const NormalizeStep *step = &n->steps[i];
    const Rewrite *r = &step->rewrite;
    WkByteVec *out = &s->buffer[k];
    out->length = 0;
    switch (step->kind) {
    case NORMALIZE_NFC:
      if (nfc_stable(in, in_length)) continue;
      WK_TRY(unicode_form(UNINORM_NFC, out, in, in_length));
      break;
    case NORMALIZE_NFKC:
      if (ascii(in, in_length)) continue;
      WK_TRY(unicode_form(UNINORM_NFKC, out, in, in_length));
      break;
    case NORMALIZE_LOWERCASE:
      WK_TRY(lowercase(out, in, in_length));
      break;
    case NORMALIZE_STRIP:
      strip(step, &in, &in_length);
      continue;
    case NORMALIZE_PRECOMPILED:
      WK_TRY(charsmap_normalize(step->charsmap, s, in, in_length, out));
      break;
    case NORMALIZE_PREPEND:
      if (in_length == 0) continue;
      WK_TRY(wk_byte_vec_append(out, r->text, r->text_length));
      WK_TRY(wk_byte_vec_append(out, in, in_length));
      break;
    case NORMALIZE_REPLACE:
      if (step->regex) {
        WK_TRY(regex_replace_all(step->regex, &s->match, out, in, in_length, r->with, r->with_length));
        break;
      }
      if (!memmem(in, in_length, r->text, r->text_length)) continue;
      WK_TRY(replace_all(out, in, in_length, r->text, r->text_length, r->with, r->with_length));
      break;
    }
    in = out->data;
    in_length = out->length;
    k ^= 1;
  }
  *text = in;
  *length = in_length;
  return WK_OK;
}
