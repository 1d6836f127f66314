/*
 * tokenizer.c — tokenizers behind one interface (WkTokenizer in tokenizer.h).
 *
 *   bytes  every byte is its own token (0..255), EOS = 256, vocabulary 257. Lossless for any text.
 *   gpt2   describes GPT-2-tokenized data (vocabulary 50257, EOS = <|endoftext|> 50256) as found in
 *          llm.c/nanoGPT .bin files; it cannot encode text yet (BPE comes later, behind encode).
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

WkStatus wk_token_vec_reserve(WkTokenVec *v, size_t extra) {
  if (v->length + extra <= v->capacity) return WK_OK;
  size_t cap = v->capacity ? v->capacity : 1024;
  while (cap < v->length + extra) cap *= 2;
  uint32_t *d = realloc(v->data, cap * sizeof *d);
  if (!d) return WK_FAIL(WK_ERR_NOMEM, "out of memory growing a token buffer to %zu tokens", cap);
  v->data = d;
  v->capacity = cap;
  return WK_OK;
}

static WkStatus bytes_encode(const WkTokenizer *self, const uint8_t *text, size_t length, WkTokenVec *out) {
  if (length == 0) return WK_OK; /* an empty vector has no data pointer to offset */
  WK_TRY(wk_token_vec_reserve(out, length));
  uint32_t *dst = out->data + out->length;
  for (size_t i = 0; i < length; i++) dst[i] = text[i];
  out->length += length;
  return WK_OK;
}

static size_t bytes_decode(const WkTokenizer *self, uint32_t token, uint8_t *out) {
  if (token < 256) {
    out[0] = (uint8_t)token;
    return 1;
  }
  return 0; /* EOS and out-of-range tokens stand for no bytes */
}

static const WkTokenizer tokenizers[] = {
    {.name = "bytes", .vocab_size = 257, .eos = 256, .encode = bytes_encode, .decode = bytes_decode},
    {.name = "gpt2", .vocab_size = 50257, .eos = 50256, .encode = NULL, .decode = NULL},
};

const WkTokenizer *wk_tokenizer_find(const char *name) {
  for (size_t i = 0; i < sizeof tokenizers / sizeof tokenizers[0]; i++)
    if (name && strcmp(tokenizers[i].name, name) == 0) return &tokenizers[i];
  return NULL;
}
