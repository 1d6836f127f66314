/*
 * input_bin.c — .bin token files: llm.c's (256 x int32 header, magic 20240520, version 1, token count;
 * then uint16 GPT-2 tokens), or nanoGPT's headerless uint16 files when asked (a file without the magic
 * is refused otherwise: read as tokens, a damaged header would be silently wrong data). Cut into chunks
 * of tokens; documents are separated by <|endoftext|> (50256).
 */
#include <stdlib.h>
#include <string.h>

#include "convert.h"

enum {
  LLMC_HEADER_INTS = 256,
  LLMC_MAGIC_GPT2 = 20240520,
  LLMC_MAGIC_LLAMA3 = 20240801,
};

/* Where the tokens of an llm.c file start and how many there are, from its header. */
static WkStatus read_llmc_header(const Input *in, WkBlob *blob, uint64_t *offset, uint64_t *tokens) {
  int32_t header[LLMC_HEADER_INTS];
  uint64_t size = blob->size;
  if (size < sizeof header)
    return WK_FAIL(WK_ERR_FORMAT, "'%s': %llu bytes is shorter than llm.c's %zu-byte header (a headerless nanoGPT "
                   "file? convert it with --headerless-bin)", in->path, (unsigned long long)size, sizeof header);
  WK_TRY(blob->read_at(blob, 0, sizeof header, header));
  if (header[0] == LLMC_MAGIC_LLAMA3)
    return WK_FAIL(WK_ERR_UNSUPPORTED, "'%s': llm.c Llama-3 token file (uint32 tokens); only GPT-2 files are "
                   "supported so far", in->path);
  if (header[0] != LLMC_MAGIC_GPT2)
    return WK_FAIL(WK_ERR_FORMAT, "'%s' offset 0: magic %d is not llm.c's %d (a damaged file, or a headerless "
                   "nanoGPT file: convert it with --headerless-bin)", in->path, header[0], LLMC_MAGIC_GPT2);
  if (header[1] != 1)
    return WK_FAIL(WK_ERR_UNSUPPORTED, "'%s': llm.c token file version %d; only version 1 (GPT-2, uint16) is "
                   "supported", in->path, header[1]);
  if (header[2] < 0 || (uint64_t)header[2] * 2 + sizeof header != size)
    return WK_FAIL(WK_ERR_FORMAT, "'%s': llm.c header says %d tokens (%llu bytes) but the file has %llu bytes "
                   "(truncated?)", in->path, header[2], (unsigned long long)(int64_t)header[2] * 2 + sizeof header,
                   (unsigned long long)size);
  *offset = sizeof header;
  *tokens = (uint64_t)header[2];
  return WK_OK;
}

/* llm.c (header) or, when asked, nanoGPT (headerless) uint16 GPT-2 tokens. */
WkStatus convert_cut_tokens(const Input *in, uint32_t i, WkBlob *blob, const ChunkSizes *sizes, ChunkEmit emit,
                            void *arg, const atomic_bool *stop) {
  WkStatus status = WK_OK;
  uint64_t size = blob->size, offset = 0, tokens = size / 2;
  if (!in->headerless)
    WK_TRY(read_llmc_header(in, blob, &offset, &tokens));
  else if (size % 2 != 0)
    return WK_FAIL(WK_ERR_FORMAT, "'%s': %llu bytes is not a whole number of uint16 tokens (a nanoGPT .bin file is "
                   "uint16 tokens without header)", in->path, (unsigned long long)size);
  bool first = true;
  for (uint64_t done = 0; status == WK_OK && !atomic_load(stop) && (done < tokens || first);) {
    size_t n = tokens - done < sizes->bin_tokens ? (size_t)(tokens - done) : sizes->bin_tokens;
    uint8_t *data = malloc(n * 2 + 1);
    if (!data) { status = WK_FAIL(WK_ERR_NOMEM, "out of memory reading '%s'", in->path); break; }
    if (n && (status = blob->read_at(blob, offset + done * 2, n * 2, data)) != WK_OK) {
      free(data);
      break;
    }
    Chunk *c = NULL;
    if ((status = convert_chunk_new(i, data, n * 2, &c)) != WK_OK) { free(data); break; }
    c->offset = offset + done * 2;
    c->first = first;
    c->last = done + n == tokens;
    c->input_bytes = n * 2 + (first ? offset : 0);
    first = false;
    done += n;
    status = emit(arg, c);
  }
  return status;
}

WkStatus convert_process_tokens(const ChunkContext *ctx, const Input *in, Chunk *c) {
  size_t n = c->length / 2;
  WK_TRY(wk_token_vec_reserve(&c->tokens, n));
  uint32_t eos = ctx->tokenizer->eos, vocab = ctx->tokenizer->vocab_size;
  for (size_t k = 0; k < n; k++) {
    uint32_t t = (uint32_t)c->data[2 * k] | (uint32_t)c->data[2 * k + 1] << 8;
    if (t == eos) {
      WK_TRY(convert_chunk_end_document(c));
    } else if (t >= vocab) {
      return WK_FAIL(WK_ERR_FORMAT, "'%s': token %u at byte %llu is outside the %s vocabulary (%u); not GPT-2 "
                     "tokens?", in->path, t, (unsigned long long)(c->offset + k * 2), ctx->tokenizer->name, vocab);
    } else {
      c->tokens.data[c->tokens.length++] = t;
    }
  }
  return WK_OK;
}
