/*
 * fuzz_tokenizer.c — libFuzzer target for the tokenizer file readers (tokenizer.json and tiktoken rank
 * files: downloaded from hubs, so untrusted) and for encoding with whatever they accept. The first
 * byte picks the reader; the rest is the file. A tokenizer that loads must encode a few texts and the
 * input itself (when it is UTF-8) into ids below its vocabulary size, and decode them.
 *
 *   make fuzz && build/fuzz/fuzz_tokenizer -max_total_time=60 /tmp/new-inputs tests/fuzz/corpus/tokenizer
 */
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "tokenizer/bpe/bpe.h"

static void exercise(const WkTokenizer *t, const uint8_t *text, size_t length) {
  WkTokenVec ids = {0};
  WkByteVec bytes = {0};
  if (t->encode(t, text, length, &ids) == WK_OK) {
    for (size_t i = 0; i < ids.length; i++)
      if (ids.data[i] >= t->vocab_size) abort();
    if (t->decode(t, ids.data, ids.length, &bytes) != WK_OK) abort();
  }
  free(ids.data);
  free(bytes.data);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const char *text = (const char *)data + 1;
  size_t length = size - 1;
  Bpe *bpe = NULL;
  WkStatus status = data[0] & 1 ? bpe_load_tiktoken("fuzz.tiktoken", text, length, data[0] & 2 ? "cl100k" : "r50k", &bpe)
                                : bpe_load_huggingface("fuzz/tokenizer.json", text, length, &bpe);
  if (status != WK_OK) return 0;
  static const char *const TEXTS[] = {"", "hello world", "  ab\r\n\tab's 123 <|endoftext|>", "\xc3\xa9\xe4\xb8\xad"};
  bpe->base.honour_special = data[0] & 4;
  for (size_t i = 0; i < sizeof TEXTS / sizeof TEXTS[0]; i++) exercise(&bpe->base, (const uint8_t *)TEXTS[i], strlen(TEXTS[i]));
  if (wk_utf8_valid_prefix(data + 1, length) == length) exercise(&bpe->base, data + 1, length);
  bpe_free(bpe);
  return 0;
}
