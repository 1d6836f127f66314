/*
 * runtime/tokenizer — tokenizers behind one interface: text -> tokens, tokens -> bytes.
 *
 *   tokenizer.c   the interface's shared parts, the built-ins ("bytes", and "gpt2" that only describes
 *                 pre-tokenized .bin data), wk_tokenizer_open and the public wk_tokenizer_* functions
 *   template.c    a tokenizer.json's post_processor as the ids it puts around a text (WkTemplate)
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
#include "../core/json.h"  /* WkJson: a post_processor to read */

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

/* What Hugging Face's add_special_tokens puts around one text (the post_processor's single template,
 * e.g. Llama 3's <|begin_of_text|> before it, BERT's [CLS] before and [SEP] after): ids[0 .. prefix)
 * go before the text's own ids, ids[prefix .. prefix + suffix) after. Empty: none. */
enum { WK_TEMPLATE_MAX = 64 };  /* ids of a template, at most (a longer one is refused) */
typedef struct {
  uint32_t ids[WK_TEMPLATE_MAX];
  uint32_t prefix, suffix;
} WkTemplate;

typedef struct WkTokenizer WkTokenizer;
struct WkTokenizer {
  const char *name;      /* "bytes", "gpt2", or the file's name */
  uint32_t vocab_size;   /* every id encode can produce is below it */
  uint32_t eos;          /* the token separating documents, WK_TOKENIZER_NONE when it has none */
  uint64_t fingerprint;  /* identity of the mapping text <-> ids (a hash of the file and pattern) */
  bool honour_special;   /* special tokens written in text become their ids (default: plain text) */
  WkTemplate single;     /* the post_processor's template for one text; empty for the rest */
  bool bare;             /* encode without it (Hugging Face's add_special_tokens=False; default: with) */
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

/* Appends the ids of text with tpl around them (NULL: none), as the tokenizer encodes text. */
WkStatus wk_tokenizer_encode_with(const WkTokenizer *t, const WkTemplate *tpl, const uint8_t *text, size_t length,
                                  WkTokenVec *out);
/* t's own template when it encodes with it (not bare and not empty), else NULL. */
const WkTemplate *wk_tokenizer_template_of(const WkTokenizer *t);

/* A tokenizer.json's post_processor (template.c) -> *out: TemplateProcessing (its single template; the
 * pair template is checked, not kept), BertProcessing and RobertaProcessing (cls $A sep), ByteLevel
 * (nothing: it moves offsets only), and a Sequence of them, applied in order as Hugging Face does.
 * Every id must be below vocab_size; anything else is refused with a message naming path. */
WkStatus wk_template_read(const WkJson *post_processor, const char *path, uint32_t vocab_size, WkTemplate *out);

/* wk_tokenizer_open (wick.h) takes a built-in name, a tokenizer.json or a .tiktoken rank file. */

#ifdef __cplusplus
}
#endif
#endif /* WK_TOKENIZER_H */
