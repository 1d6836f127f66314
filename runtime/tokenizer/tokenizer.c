/*
 * tokenizer.c — tokenizers behind one interface (WkTokenizer in tokenizer.h): the built-ins, opening
 * a tokenizer by name or file, and the public wk_tokenizer_* functions of wick.h.
 *
 *   bytes  every byte is its own token (0..255), EOS = 256, vocabulary 257. Lossless for any text.
 *   gpt2   describes GPT-2-tokenized data (vocabulary 50257, EOS = <|endoftext|> 50256) as found in
 *          llm.c/nanoGPT .bin files; to encode text with GPT-2, open its rank file (gpt2.tiktoken or
 *          r50k_base.tiktoken) or its tokenizer.json.
 *   files  a Hugging Face tokenizer.json (BPE, byte-level or SentencePiece-style, or Unigram) or a
 *          tiktoken rank file (bpe/, unigram/).
 */
#include <stdlib.h>
#include <string.h>

#include "bpe/bpe.h"
#include "tokenizer.h"

/* ---- buffers ------------------------------------------------------------------------------------- */

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

WkStatus wk_byte_vec_reserve(WkByteVec *v, size_t extra) {
  if (v->length + extra <= v->capacity) return WK_OK;
  size_t cap = v->capacity ? v->capacity : 4096;
  while (cap < v->length + extra) cap *= 2;
  uint8_t *d = realloc(v->data, cap);
  if (!d) return WK_FAIL(WK_ERR_NOMEM, "out of memory growing a byte buffer to %zu bytes", cap);
  v->data = d;
  v->capacity = cap;
  return WK_OK;
}

WkStatus wk_byte_vec_append(WkByteVec *v, const void *bytes, size_t length) {
  WK_TRY(wk_byte_vec_reserve(v, length));
  if (length) memcpy(v->data + v->length, bytes, length);
  v->length += length;
  return WK_OK;
}

/* ---- built-ins ----------------------------------------------------------------------------------- */

enum { BYTES_EOS = 256 };

static WkStatus bytes_encode(const WkTokenizer *self, const uint8_t *text, size_t length, WkTokenVec *out) {
  if (length == 0) return WK_OK; /* an empty vector has no data pointer to offset */
  WK_TRY(wk_token_vec_reserve(out, length));
  uint32_t *dst = out->data + out->length;
  for (size_t i = 0; i < length; i++) dst[i] = text[i];
  out->length += length;
  return WK_OK;
}

static WkStatus bytes_decode(const WkTokenizer *self, const uint32_t *tokens, size_t count, WkByteVec *out) {
  WK_TRY(wk_byte_vec_reserve(out, count));
  for (size_t i = 0; i < count; i++) {
    if (tokens[i] == BYTES_EOS) continue; /* EOS stands for no bytes */
    if (tokens[i] > BYTES_EOS)
      return WK_FAIL(WK_ERR_INVALID_ARG, "tokenizer 'bytes': token %u (at %zu) is outside the vocabulary (257)",
                     tokens[i], i);
    out->data[out->length++] = (uint8_t)tokens[i];
  }
  return WK_OK;
}

static uint32_t bytes_token_id(const WkTokenizer *self, const uint8_t *bytes, size_t length) {
  return length == 1 ? bytes[0] : WK_TOKENIZER_NONE;
}

static const WkTokenizer builtins[] = {
    {.name = "bytes", .vocab_size = 257, .eos = BYTES_EOS, .fingerprint = 0x6279746573ull /* "bytes" */,
     .encode = bytes_encode, .decode = bytes_decode, .token_id = bytes_token_id},
    {.name = "gpt2", .vocab_size = 50257, .eos = 50256, .fingerprint = 0x67707432ull /* "gpt2" */},
};

const WkTokenizer *wk_tokenizer_find(const char *name) {
  for (size_t i = 0; i < sizeof builtins / sizeof builtins[0]; i++)
    if (name && strcmp(builtins[i].name, name) == 0) return &builtins[i];
  return NULL;
}

/* ---- opening ------------------------------------------------------------------------------------- */

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && strcmp(s + n - k, suffix) == 0;
}

static void free_copy(WkTokenizer *t) { free(t); }

WkTokenizer *wk_tokenizer_open(const char *source, const char *pattern) {
  if (!source) {
    WK_FAIL(WK_ERR_INVALID_ARG, "wk_tokenizer_open: source is NULL");
    return NULL;
  }
  const WkTokenizer *builtin = wk_tokenizer_find(source);
  if (builtin) {
    if (!builtin->encode) {
      WK_FAIL(WK_ERR_INVALID_ARG, "tokenizer '%s' only describes pre-tokenized data; to encode text open its rank "
              "file (gpt2.tiktoken, r50k_base.tiktoken) or its tokenizer.json", source);
      return NULL;
    }
    /* A copy: options are set on it, and it is freed like any other. */
    WkTokenizer *copy = wk_malloc(sizeof *copy, "a tokenizer");
    if (!copy) return NULL;
    *copy = *builtin;
    copy->free = free_copy;
    return copy;
  }
  bool json = ends_with(source, ".json");
  if (json && pattern) {
    WK_FAIL(WK_ERR_INVALID_ARG, "%s: a tokenizer.json has its own pre-tokenizer; a pattern ('%s') is for tiktoken "
            "rank files", source, pattern);
    return NULL;
  }
  char *text;
  size_t length;
  if (bpe_read_file(source, &text, &length) != WK_OK) {
    if (wk_last_status() == WK_ERR_IO)
      wk_error_context("tokenizer '%s' is neither a built-in (bytes) nor a readable file", source);
    return NULL;
  }
  Bpe *bpe = NULL;
  WkStatus status = json ? bpe_load_huggingface(source, text, length, &bpe)
                         : bpe_load_tiktoken(source, text, length, pattern, &bpe);
  free(text);
  return status == WK_OK ? &bpe->base : NULL;
}

/* ---- the public interface (wick.h) ---------------------------------------------------------------- */

void wk_tokenizer_free(WkTokenizer *t) {
  if (t && t->free) t->free(t);
}

const char *wk_tokenizer_name(const WkTokenizer *t) { return t->name; }
uint32_t wk_tokenizer_vocab_size(const WkTokenizer *t) { return t->vocab_size; }
uint32_t wk_tokenizer_eos(const WkTokenizer *t) { return t->eos; }
uint64_t wk_tokenizer_fingerprint(const WkTokenizer *t) { return t->fingerprint; }

/* EOS's static bound is any id but WK_TOKENIZER_NONE; an open tokenizer narrows it to its vocabulary.
 * Neither default is used: a tokenizer's EOS comes from its files, special is off when it opens. */
static const WkParamSpec PARAM_SPECS[WK_TOKENIZER_PARAM_COUNT] = {
    [WK_TOKENIZER_SPECIAL] = {0, 1, 0, "special"},
    [WK_TOKENIZER_EOS] = {0, WK_TOKENIZER_NONE - 1, WK_TOKENIZER_NONE, "eos"},
    [WK_TOKENIZER_ADD_SPECIAL_TOKENS] = {0, 1, 1, "add_special_tokens"},
};
static const WkParamTable PARAMS = {"tokenizer", PARAM_SPECS, WK_TOKENIZER_PARAM_COUNT};

WkStatus wk_tokenizer_param_bounds(const WkTokenizer *t, WkTokenizerParam param, int64_t *min, int64_t *max) {
  WK_TRY(wk_param_bounds(&PARAMS, (int)param, min, max));
  if (t && param == WK_TOKENIZER_EOS) *max = (int64_t)t->vocab_size - 1;
  return WK_OK;
}

WkStatus wk_tokenizer_set(WkTokenizer *t, WkTokenizerParam param, int64_t value) {
  int64_t min, max;
  WK_TRY(wk_tokenizer_param_bounds(t, param, &min, &max));
  WK_TRY(wk_param_check(&PARAMS, (int)param, value, min, max));
  if (param == WK_TOKENIZER_SPECIAL) t->honour_special = value == 1;
  else if (param == WK_TOKENIZER_ADD_SPECIAL_TOKENS) t->bare = value == 0;
  else t->eos = (uint32_t)value;
  return WK_OK;
}

void wk_tokenizer_template(const WkTokenizer *t, const uint32_t **ids, uint32_t *prefix, uint32_t *suffix) {
  *ids = t->single.ids;
  *prefix = t->single.prefix;
  *suffix = t->single.suffix;
}

uint32_t wk_tokenizer_token_id(const WkTokenizer *t, const char *text, size_t length) {
  return t->token_id ? t->token_id(t, (const uint8_t *)text, length) : WK_TOKENIZER_NONE;
}

WkStatus wk_tokenizer_encode(const WkTokenizer *t, const char *text, size_t length, uint32_t *out, size_t capacity,
                             size_t *count) {
  *count = 0;
  WkTokenVec v = {0};
  WkStatus status = wk_tokenizer_encode_with(t, wk_tokenizer_template_of(t), (const uint8_t *)text, length, &v);
  if (status == WK_OK) {
    *count = v.length;
    if (v.length > capacity)
      status = WK_FAIL(WK_ERR_INVALID_ARG, "wk_tokenizer_encode: %zu tokens do not fit in %zu", v.length, capacity);
    else if (v.length) memcpy(out, v.data, v.length * sizeof *v.data); /* an empty vector has no data */
  }
  free(v.data);
  return status;
}

WkStatus wk_tokenizer_decode(const WkTokenizer *t, const uint32_t *tokens, size_t count, char *out, size_t capacity,
                             size_t *length) {
  *length = 0;
  if (!t->decode) return WK_FAIL(WK_ERR_UNSUPPORTED, "tokenizer '%s' cannot decode tokens", t->name);
  WkByteVec v = {0};
  WkStatus status = t->decode(t, tokens, count, &v);
  if (status == WK_OK) {
    *length = v.length;
    if (v.length > capacity)
      status = WK_FAIL(WK_ERR_INVALID_ARG, "wk_tokenizer_decode: %zu bytes do not fit in %zu", v.length, capacity);
    else if (v.length) memcpy(out, v.data, v.length); /* an empty vector has no data */
  }
  free(v.data);
  return status;
}
