/*
 * decode.c — Hugging Face's decoders for SentencePiece-style vocabularies (Llama 2, Mistral, Gemma,
 * T5): the tokens' strings go through each decoder as a list, as `tokenizers` runs decode_chain, and
 * what is left is concatenated.
 *
 *   Replace       a string -> another in each token ("▁" -> " ")
 *   ByteFallback  each run of <0xNN> tokens -> its bytes when they are UTF-8, else one U+FFFD a byte
 *   Fuse          the tokens -> one
 *   Strip         up to `start` leading and `stop` trailing characters `content` off each token
 *   Metaspace     the replacement -> " ", dropped in the first token unless prepend_scheme is never
 *
 * Byte-level tokenizers have no decoder here: their tokens' bytes are the text (encode.c).
 */
#include <stdlib.h>
#include <string.h>

#include "bpe.h"
#include "../../core/json.h"  /* wk_utf8_valid_prefix */

WkStatus decoder_add(Decoder *d, const DecodeStep *step, const char *what) {
  if (d->count == DECODE_MAX_STEPS)
    return WK_FAIL(WK_ERR_UNSUPPORTED, "%s: more than %d decoders in a row", what, DECODE_MAX_STEPS);
  d->steps[d->count] = *step;
  WK_TRY(rewrite_copy(&d->steps[d->count].rewrite, &step->rewrite, what));
  d->count++;
  return WK_OK;
}

void decoder_free(Decoder *d) {
  for (int i = 0; i < d->count; i++) rewrite_free(&d->steps[i].rewrite);
  memset(d, 0, sizeof *d);
}

/* ---- a list of strings ------------------------------------------------------------------------- */

typedef struct {
  WkByteVec bytes;
  size_t *end;  /* string i is bytes[end[i - 1] (0 for the first), end[i]) */
  size_t count, capacity;
} Strings;

/* Ends a string at the bytes appended so far. */
static WkStatus strings_end(Strings *s) {
  if (s->count == s->capacity) {
    size_t cap = s->capacity ? 2 * s->capacity : 64;
    size_t *grown = realloc(s->end, cap * sizeof *grown);
    if (!grown) return WK_FAIL(WK_ERR_NOMEM, "out of memory decoding %zu tokens", cap);
    s->end = grown;
    s->capacity = cap;
  }
  s->end[s->count++] = s->bytes.length;
  return WK_OK;
}

static WkStatus strings_push(Strings *s, const void *bytes, size_t length) {
  WK_TRY(wk_byte_vec_append(&s->bytes, bytes, length));
  return strings_end(s);
}

static const uint8_t *string_at(const Strings *s, size_t i, size_t *length) {
  size_t start = i ? s->end[i - 1] : 0;
  *length = s->end[i] - start;
  return *length ? s->bytes.data + start : (const uint8_t *)"";  /* empty strings may have no bytes at all */
}

static void strings_free(Strings *s) {
  free(s->bytes.data);
  free(s->end);
}

/* ---- the decoders ------------------------------------------------------------------------------- */

static WkStatus replace_into(Strings *out, const uint8_t *t, size_t n, const uint8_t *from, size_t from_length,
                             const uint8_t *with, size_t with_length) {
  WK_TRY(replace_all(&out->bytes, t, n, from, from_length, with, with_length));
  return strings_end(out);
}

static int hex_digit(uint8_t c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* The byte of a token "<0xNN>" (Rust's u8::from_str_radix of NN: a '+' may stand first), or -1. */
static int fallback_byte(const uint8_t *t, size_t n) {
  if (n != 6 || memcmp(t, "<0x", 3) != 0 || t[5] != '>') return -1;
  int hi = hex_digit(t[3]), lo = hex_digit(t[4]);
  if (t[3] == '+' && lo >= 0) return lo;
  return hi < 0 || lo < 0 ? -1 : hi << 4 | lo;
}

static WkStatus flush_bytes(Strings *out, WkByteVec *run) {
  if (run->length == 0) return WK_OK;
  if (wk_utf8_valid_prefix(run->data, run->length) == run->length) {
    WK_TRY(strings_push(out, run->data, run->length));
  } else {
    for (size_t i = 0; i < run->length; i++) WK_TRY(strings_push(out, "\xEF\xBF\xBD", 3));
  }
  run->length = 0;
  return WK_OK;
}

static WkStatus byte_fallback(const Strings *in, Strings *out) {
  WkByteVec run = {0};
  WkStatus status = WK_OK;
  for (size_t i = 0; i < in->count && status == WK_OK; i++) {
    size_t n;
    const uint8_t *t = string_at(in, i, &n);
    int b = fallback_byte(t, n);
    if (b >= 0) {
      uint8_t byte = (uint8_t)b;
      status = wk_byte_vec_append(&run, &byte, 1);
    } else {
      status = flush_bytes(out, &run);
      if (status == WK_OK) status = strings_push(out, t, n);
    }
  }
  if (status == WK_OK) status = flush_bytes(out, &run);
  free(run.data);
  return status;
}

/* Up to start leading and stop trailing characters `content` off t. */
static WkStatus strip(Strings *out, const DecodeStep *step, const uint8_t *t, size_t n) {
  size_t from = 0, to = n;
  for (size_t k = 0; k < step->start && from < to; k++) {
    size_t c = utf8_length(t[from]);
    if (utf8_decode(t + from, c) != step->content) break;
    from += c;
  }
  for (size_t k = 0; k < step->stop && to > from; k++) {
    size_t start = to - 1;
    while (start > from && (t[start] & 0xC0) == 0x80) start--;
    if (utf8_decode(t + start, to - start) != step->content) break;
    to = start;
  }
  return strings_push(out, t + from, to - from);
}

static WkStatus run_step(const DecodeStep *step, const Strings *in, Strings *out) {
  if (step->kind == DECODE_BYTE_FALLBACK) return byte_fallback(in, out);
  if (step->kind == DECODE_FUSE) return strings_push(out, in->bytes.data, in->bytes.length);
  for (size_t i = 0; i < in->count; i++) {
    size_t n;
    const uint8_t *t = string_at(in, i, &n);
    if (step->kind == DECODE_STRIP) {
      WK_TRY(strip(out, step, t, n));
    } else if (step->kind == DECODE_REPLACE) {
      const Rewrite *r = &step->rewrite;
      WK_TRY(replace_into(out, t, n, r->text, r->text_length, r->with, r->with_length));
    } else { /* Metaspace */
      const Metaspace *m = &step->metaspace;
      bool drop = i == 0 && m->prepend != PREPEND_NEVER;
      WK_TRY(replace_into(out, t, n, m->replacement, m->replacement_length, (const uint8_t *)" ", drop ? 0 : 1));
    }
  }
  return WK_OK;
}

WkStatus decoder_run(const Decoder *d, const uint8_t *bytes, const size_t *ends, size_t count, WkByteVec *out) {
  Strings lists[2];
  memset(lists, 0, sizeof lists);
  WkStatus status = WK_OK;
  int k = 0;
  for (size_t i = 0; i < count && status == WK_OK; i++) {
    size_t start = i ? ends[i - 1] : 0;
    status = strings_push(&lists[0], bytes + start, ends[i] - start);
  }
  for (int i = 0; i < d->count && status == WK_OK; i++) {
    lists[k ^ 1].bytes.length = lists[k ^ 1].count = 0;
    status = run_step(&d->steps[i], &lists[k], &lists[k ^ 1]);
    k ^= 1;
  }
  if (status == WK_OK) status = wk_byte_vec_append(out, lists[k].bytes.data, lists[k].bytes.length);
  strings_free(&lists[0]);
  strings_free(&lists[1]);
  return status;
}
