/*
 * input_bin.c — token files, cut into chunks of ids:
 *   .bin  llm.c's (256 x int32 header, magic 20240520, version 1, token count; then uint16 tokens), or
 *         nanoGPT's headerless uint16 files when asked (a file without the magic is refused otherwise:
 *         read as tokens, a damaged header would be silently wrong data)
 *   .npy  NumPy's format (magic, version 1-3, a header dict): a 1-D C-order array of <u2, <u4, <i4 or
 *         <i8; anything else is refused in one line
 * Documents are separated by the EOS of the run's tokenizer: GPT-2's <|endoftext|> (50256) by default,
 * or the one --eos declares with --vocab-size. Every id is checked to be in the vocabulary; a bad one
 * is an error naming the file and its byte offset.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert.h"

enum {
  LLMC_HEADER_INTS = 256,
  LLMC_MAGIC_GPT2 = 20240520,
  LLMC_MAGIC_LLAMA3 = 20240801,
  NPY_PREFIX_BYTES = 12,          /* magic (6), version (2), header length (2 or 4) */
  NPY_MAX_HEADER_BYTES = 1 << 16, /* NumPy writes a few hundred; more is not a token array */
};

/* Where the ids of a file start, how many there are, and their type. */
typedef struct {
  uint64_t offset, count;
  uint8_t width;
  bool is_signed;
} IdLayout;

/* ---- llm.c ------------------------------------------------------------------------------------- */

/* Where the tokens of an llm.c file start and how many there are, from its header. */
static WkStatus read_llmc_header(const Input *in, WkBlob *blob, IdLayout *ids) {
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
  *ids = (IdLayout){.offset = sizeof header, .count = (uint64_t)header[2], .width = 2};
  return WK_OK;
}

static WkStatus read_bin_layout(const Input *in, WkBlob *blob, IdLayout *ids) {
  if (!in->headerless) return read_llmc_header(in, blob, ids);
  if (blob->size % 2 != 0)
    return WK_FAIL(WK_ERR_FORMAT, "'%s': %llu bytes is not a whole number of uint16 tokens (a nanoGPT .bin file is "
                   "uint16 tokens without header)", in->path, (unsigned long long)blob->size);
  *ids = (IdLayout){.offset = 0, .count = blob->size / 2, .width = 2};
  return WK_OK;
}

/* ---- NumPy .npy ---------------------------------------------------------------------------------- */

/* The value of 'key' in a NumPy header dict ("{'descr': '<u2', 'fortran_order': False, 'shape': (5,), }"):
 * where it starts, or NULL. */
static const char *npy_value(const char *header, const char *key) {
  char quoted[32];
  snprintf(quoted, sizeof quoted, "'%s'", key);
  const char *at = strstr(header, quoted);
  if (!at) return NULL;
  at += strlen(quoted);
  while (*at == ' ') at++;
  if (*at++ != ':') return NULL;
  while (*at == ' ') at++;
  return at;
}

static const struct {
  const char *descr;
  uint8_t width;
  bool is_signed;
} NPY_TYPES[] = {{"'<u2'", 2, false}, {"'<u4'", 4, false}, {"'<i4'", 4, true}, {"'<i8'", 8, true}};

static WkStatus npy_fail(const Input *in, const char *what) {
  return WK_FAIL(WK_ERR_UNSUPPORTED, "'%s': %s (token ids must be a 1-D C-order NumPy array of <u2, <u4, <i4 or <i8)",
                 in->path, what);
}

static WkStatus read_npy_layout(const Input *in, WkBlob *blob, IdLayout *ids) {
  uint8_t prefix[NPY_PREFIX_BYTES];
  if (blob->size < sizeof prefix) return npy_fail(in, "too short for a NumPy header");
  WK_TRY(blob->read_at(blob, 0, sizeof prefix, prefix));
  if (memcmp(prefix, "\x93NUMPY", 6) != 0) return npy_fail(in, "no NumPy magic at offset 0 (not a .npy file)");
  uint8_t major = prefix[6];
  if (major < 1 || major > 3) {
    char what[64];
    snprintf(what, sizeof what, "NumPy format version %u.%u is not one of 1, 2, 3", major, prefix[7]);
    return npy_fail(in, what);
  }
  uint64_t length = major == 1 ? (uint64_t)prefix[8] | (uint64_t)prefix[9] << 8
                               : (uint64_t)prefix[8] | (uint64_t)prefix[9] << 8 | (uint64_t)prefix[10] << 16 |
                                     (uint64_t)prefix[11] << 24;
  uint64_t start = major == 1 ? 10 : 12;
  if (length > NPY_MAX_HEADER_BYTES || start + length > blob->size)
    return npy_fail(in, "the NumPy header's length runs past the file (truncated?)");
  char *header = malloc(length + 1);
  if (!header) return WK_FAIL(WK_ERR_NOMEM, "out of memory reading '%s'", in->path);
  WkStatus status = blob->read_at(blob, start, length, header);
  header[length] = '\0';
  const char *descr = status == WK_OK ? npy_value(header, "descr") : NULL;
  const char *order = status == WK_OK ? npy_value(header, "fortran_order") : NULL;
  const char *shape = status == WK_OK ? npy_value(header, "shape") : NULL;
  int type = -1;
  for (int k = 0; descr && k < (int)(sizeof NPY_TYPES / sizeof NPY_TYPES[0]); k++)
    if (strncmp(descr, NPY_TYPES[k].descr, strlen(NPY_TYPES[k].descr)) == 0) type = k;
  unsigned long long count = 0;
  int used = 0;
  char what[160];
  if (status != WK_OK) {
    /* the read's own error */
  } else if (!descr || !order || !shape) {
    status = npy_fail(in, "the NumPy header lacks 'descr', 'fortran_order' or 'shape'");
  } else if (type < 0) {
    snprintf(what, sizeof what, "dtype %.*s is not supported", (int)strcspn(descr, ",}"), descr);
    status = npy_fail(in, what);
  } else if (strncmp(order, "False", 5) != 0) {
    status = npy_fail(in, "a Fortran-order array is not supported");
  } else if (sscanf(shape, "(%llu,)%n", &count, &used) != 1 || used == 0) {
    snprintf(what, sizeof what, "shape %.*s is not 1-D", (int)strcspn(shape, ")") + 1, shape);
    status = npy_fail(in, what);
  } else if (start + length + count * NPY_TYPES[type].width != blob->size) {
    snprintf(what, sizeof what, "the header says %llu ids (%llu bytes after it) but the file has %llu (truncated?)",
             count, count * NPY_TYPES[type].width, (unsigned long long)(blob->size - start - length));
    status = WK_FAIL(WK_ERR_FORMAT, "'%s': %s", in->path, what);
  }
  free(header);
  if (status == WK_OK)
    *ids = (IdLayout){.offset = start + length, .count = count, .width = NPY_TYPES[type].width,
                      .is_signed = NPY_TYPES[type].is_signed};
  return status;
}

/* ---- chunks ------------------------------------------------------------------------------------- */

WkStatus convert_cut_tokens(const Input *in, uint32_t i, WkBlob *blob, const ChunkSizes *sizes, ChunkEmit emit,
                            void *arg, const atomic_bool *stop) {
  IdLayout ids;
  WK_TRY(in->kind == INPUT_TOKENS_NPY ? read_npy_layout(in, blob, &ids) : read_bin_layout(in, blob, &ids));
  WkStatus status = WK_OK;
  bool first = true;
  for (uint64_t done = 0; status == WK_OK && !atomic_load(stop) && (done < ids.count || first);) {
    size_t n = ids.count - done < sizes->bin_tokens ? (size_t)(ids.count - done) : sizes->bin_tokens;
    uint8_t *data = malloc(n * ids.width + 1);
    if (!data) { status = WK_FAIL(WK_ERR_NOMEM, "out of memory reading '%s'", in->path); break; }
    if (n && (status = blob->read_at(blob, ids.offset + done * ids.width, n * ids.width, data)) != WK_OK) {
      free(data);
      break;
    }
    Chunk *c = NULL;
    if ((status = convert_chunk_new(i, data, n * ids.width, &c)) != WK_OK) { free(data); break; }
    c->offset = ids.offset + done * ids.width;
    c->token_bytes = ids.width;
    c->token_signed = ids.is_signed;
    c->first = first;
    c->last = done + n == ids.count;
    c->input_bytes = n * ids.width + (first ? ids.offset : 0);
    first = false;
    done += n;
    status = emit(arg, c);
  }
  return status;
}

static inline uint64_t little_endian(const uint8_t *p, unsigned width) {
  uint64_t v = 0;
  for (unsigned b = width; b-- > 0;) v = v << 8 | p[b];
  return v;
}

/* The chunk's ids of `width` bytes -> tokens and document ends. Inlined for each width, so that reading an
 * id is one load (as fast as the uint16-only loop it replaced). */
static inline __attribute__((always_inline)) WkStatus scan_ids(const ChunkContext *ctx, const Input *in, Chunk *c,
                                                               const unsigned width) {
  size_t n = c->length / width;
  WK_TRY(wk_token_vec_reserve(&c->tokens, n));
  uint32_t eos = ctx->tokenizer->eos, vocab = ctx->tokenizer->vocab_size;
  uint64_t sign = c->token_signed ? UINT64_C(1) << (8 * width - 1) : 0;
  for (size_t k = 0; k < n; k++) {
    uint64_t t = little_endian(c->data + k * width, width);
    if (t == eos) {
      WK_TRY(convert_chunk_end_document(c));
    } else if (t & sign) {
      return WK_FAIL(WK_ERR_FORMAT, "'%s': token %lld at byte %llu is negative", in->path,
                     (long long)(t | (width == 8 ? 0 : ~UINT64_C(0) << (8 * width))),
                     (unsigned long long)(c->offset + k * width));
    } else if (t >= vocab) {
      return WK_FAIL(WK_ERR_FORMAT, "'%s': token %llu at byte %llu is outside the %s vocabulary (%u)%s", in->path,
                     (unsigned long long)t, (unsigned long long)(c->offset + k * width), ctx->tokenizer->name, vocab,
                     strcmp(ctx->tokenizer->name, "gpt2") == 0
                         ? "; not GPT-2 tokens? declare their vocabulary with --vocab-size and --eos"
                         : " declared by --vocab-size");
    } else {
      c->tokens.data[c->tokens.length++] = (uint32_t)t;
    }
  }
  return WK_OK;
}

WkStatus convert_process_tokens(const ChunkContext *ctx, const Input *in, Chunk *c) {
  switch (c->token_bytes) {
    case 2: return scan_ids(ctx, in, c, 2);
    case 4: return scan_ids(ctx, in, c, 4);
    case 8: return scan_ids(ctx, in, c, 8);
    default: return WK_FAIL(WK_ERR_INTERNAL, "'%s': a chunk of %u-byte ids", in->path, c->token_bytes);
  }
}
