/*
 * tokenizer.h — tokenizers behind one interface: text -> tokens, token -> bytes (tokenizer.c).
 *
 * Internal header: runtime/data/ code and tests include it; Lua never sees it.
 */
#ifndef WK_DATA_TOKENIZER_H
#define WK_DATA_TOKENIZER_H

#include "data.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- tokenizers ------------------------------------------------------------------------------------ */

/* A growable array of tokens (realloc). */
typedef struct {
  uint32_t *data;
  size_t length, capacity;
} WkTokenVec;

WkStatus wk_token_vec_reserve(WkTokenVec *v, size_t extra);

typedef struct WkTokenizer WkTokenizer;
struct WkTokenizer {
  const char *name;
  uint32_t vocab_size;
  uint32_t eos;
  /* Appends the tokens of UTF-8 text; NULL for tokenizers that only describe pre-tokenized data. */
  WkStatus (*encode)(const WkTokenizer *self, const uint8_t *text, size_t length, WkTokenVec *out);
  /* Appends the bytes a token stands for to out (capacity >= 64); returns how many. */
  size_t (*decode)(const WkTokenizer *self, uint32_t token, uint8_t *out);
};

/* "bytes" (vocab 257, EOS 256) or "gpt2" (pre-tokenized only: vocab 50257, EOS 50256). */
const WkTokenizer *wk_tokenizer_find(const char *name);

#ifdef __cplusplus
}
#endif
#endif /* WK_DATA_TOKENIZER_H */
