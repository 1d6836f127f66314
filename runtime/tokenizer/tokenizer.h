/*
 * runtime/tokenizer — tokenizers behind one interface: text -> tokens, tokens -> bytes.
 *
 *   tokenizer.c   the interface's shared parts, the built-ins ("bytes", and "gpt2" that only describes
 *                 pre-tokenized .bin data), wk_tokenizer_open and the public wk_tokenizer_* functions
 *   bpe/          BPE: Hugging Face tokenizer.json (byte-level or SentencePiece-style) and tiktoken
 *                 rank files (bpe/bpe.h)
 *   unigram/      the Unigram model of SentencePiece-style tokenizer.json files (T5)
 *   tokenize.c    the JSONL tool: a .jsonl field -> a .bin of tokens on C threads (wk_tokenize_jsonl)
 *
 * Layer: above core/ and io/ (tokenizer files are read as blobs; runtime/LAYERS). Internal header:
 * runtime/ code above tokenizer/ and tests include it; Lua sees the wk_tokenizer_* functions of wick.h
 * only.
 */
#ifndef WK_TOKENIZER_H
#define WK_TOKENIZER_H

#include "../core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- growable buffers ------------------------------------------------------------------------ */

/* A growable array of tokens (realloc). */
typedef struct {
  uint32_t *data;
  size_t length, capacity;
} WkTokenVec;

WkStatus wk_token_vec_reserve(WkTokenVec *v, size_t extra);

/* A growable run of bytes (realloc). */
typedef struct {
  uint8_t *data;
  size_t length, capacity;
} WkByteVec;

WkStatus wk_byte_vec_reserve(WkByteVec *v, size_t extra);
WkStatus wk_byte_vec_append(WkByteVec *v, const void *bytes, size_t length);

/* ---- tokenizers ------------------------------------------------------------------------------ */

/* The token id that stands for "none" (no EOS, no such token). */
#define WK_TOKENIZER_NONE UINT32_MAX

typedef struct WkTokenizer WkTokenizer;
struct WkTokenizer {
  const char *name;      /* "bytes", "gpt2", or the file's name */
  uint32_t vocab_size;   /* every id encode can produce is below it */
  uint32_t eos;          /* the token separating documents, WK_TOKENIZER_NONE when it has none */
  uint64_t fingerprint;  /* identity of the mapping text <-> ids (a hash of the file and pattern) */
  bool honour_special;   /* special tokens written in text become their ids (default: plain text) */
  /* Appends the tokens of valid UTF-8 text (invalid UTF-8 is WK_ERR_FORMAT); NULL for tokenizers
   * that only describe pre-tokenized data. Thread-safe. */
  WkStatus (*encode)(const WkTokenizer *self, const uint8_t *text, size_t length, WkTokenVec *out);
  /* Appends the bytes the tokens stand for (an id outside the vocabulary is WK_ERR_INVALID_ARG). */
  WkStatus (*decode)(const WkTokenizer *self, const uint32_t *tokens, size_t count, WkByteVec *out);
  /* The one token that is exactly these bytes (an added or special token, or a vocabulary entry). */
  uint32_t (*token_id)(const WkTokenizer *self, const uint8_t *bytes, size_t length);
  void (*free)(WkTokenizer *self);  /* NULL for the built-ins */
};

/* The built-ins: "bytes" (vocab 257, EOS 256) or "gpt2" (pre-tokenized only: vocab 50257, EOS 50256). */
const WkTokenizer *wk_tokenizer_find(const char *name);

/* wk_tokenizer_open (wick.h) takes a built-in name, a tokenizer.json or a .tiktoken rank file. */

#ifdef __cplusplus
}
#endif
#endif /* WK_TOKENIZER_H */
