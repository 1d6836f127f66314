/*
 * runtime/tokenizer/unigram/ — the Unigram model of SentencePiece (T5, ALBERT, XLNet, mT5 style
 * tokenizer.json files): a piece becomes the tokens of its most likely segmentation under the
 * vocabulary's scores. It plugs into the tokenizer.json tokenizer of ../bpe/ (added tokens,
 * normalizers, pre-tokenizers, decoders and thread state are those of bpe.h); the loader
 * (../bpe/huggingface.c) reads the file and calls unigram_new.
 *
 * Internal header of this folder and of ../bpe/.
 */
#ifndef WK_TOKENIZER_UNIGRAM_H
#define WK_TOKENIZER_UNIGRAM_H

#include "../bpe/bpe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The model over bpe->vocab (ids 0..count-1, every one present), with a score per id and the unk
 * id; byte fallback uses bpe->fallback_token. what names the model in errors. */
WkStatus unigram_new(const Bpe *bpe, const double *scores, uint32_t unk, const char *what, Unigram **out);
void unigram_free(Unigram *u);

/* One piece -> tokens, as Hugging Face's Unigram::encode_optimized and tokenize give them. */
WkStatus unigram_piece(const Bpe *bpe, ThreadState *ts, const uint8_t *piece, size_t length, WkTokenVec *out);

#ifdef __cplusplus
}
#endif
#endif /* WK_TOKENIZER_UNIGRAM_H */
