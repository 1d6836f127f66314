/*
 * normalize.c — the normalizers of tokenizer.json files, as Hugging Face's `tokenizers` runs them on
 * each run of text between added tokens: NFC (Qwen 2), Prepend (Llama 2's "▁" in front of a run) and
 * Replace with a String pattern (Llama 2's and Gemma's " " -> "▁"), one after the other (a Sequence).
 *
 * Each step writes into one of the thread's two buffers and the next reads it, so a run costs one
 * pass per step and no allocation once the buffers have grown. NFC is skipped for text below U+0300,
 * which it leaves as it is.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <uninorm.h>  /* u8_normalize (libunistring) */

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
  n->count++;
  return WK_OK;
}

void normalizer_free(Normalizer *n) {
  for (int i = 0; i < n->count; i++) rewrite_free(&n->steps[i].rewrite);
  memset(n, 0, sizeof *n);
}

void normalize_scratch_free(NormalizeScratch *s) {
  free(s->buffer[0].data);
  free(s->buffer[1].data);
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

static WkStatus nfc(WkByteVec *out, const uint8_t *text, size_t length) {
  size_t n = out->capacity;
  uint8_t *result = u8_normalize(UNINORM_NFC, text, length, out->data, &n);
  if (!result) return WK_FAIL(WK_ERR_NOMEM, "NFC normalization of %zu bytes failed: %s", length, strerror(errno));
  if (result != out->data) { /* a larger buffer of its own: keep it for next time */
    free(out->data);
    out->data = result;
    out->capacity = n;
  }
  out->length = n;
  return WK_OK;
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
      WK_TRY(nfc(out, in, in_length));
      break;
    case NORMALIZE_PREPEND:
      if (in_length == 0) continue;
      WK_TRY(wk_byte_vec_append(out, r->text, r->text_length));
      WK_TRY(wk_byte_vec_append(out, in, in_length));
      break;
    case NORMALIZE_REPLACE:
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
