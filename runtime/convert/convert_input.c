/*
 * convert_input.c — the converter's inputs: listing them, cutting them into chunks (producer
 * thread), and turning a chunk into tokens and document ends (worker threads).
 *
 * The formats are listed once, in convert.h (CONVERT_INPUTS): the table at the end of this file is made
 * from that list, and the two dispatchers (convert_cut_input, convert_process_chunk) read it. The .jsonl
 * and .bin cutters and workers are here; Parquet and tar are input_parquet.c and input_tar.c.
 * .bin files are llm.c's (256 x int32 header, magic 20240520, version 1, token count; then uint16
 * tokens), or nanoGPT's headerless uint16 files when asked (a file without the magic is refused
 * otherwise: read as tokens, a damaged header would be silently wrong data); their documents are
 * separated by <|endoftext|> (50256).
 * Directories are walked recursively in byte-wise sorted order, skipping hidden entries and, when
 * include patterns are set, files whose name matches none of them.
 */
#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <limits.h>  /* PATH_MAX */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>  /* read, close */
#include <zstd.h>  /* ZSTD_decompressStream for .jsonl.zst */

#include "convert.h"

enum {
  LINE_CHUNK_BYTES = 1 << 20,   /* lines are cut into ~1 MiB chunks */
  BIN_CHUNK_TOKENS = 1 << 20,   /* .bin files into 1 Mi-token chunks */
  LLMC_HEADER_INTS = 256,
  LLMC_MAGIC_GPT2 = 20240520,
  LLMC_MAGIC_LLAMA3 = 20240801,
  MAX_WALK_DEPTH = 64,
  MAX_LINE_BYTES = 1 << 30,     /* a longer .jsonl line is refused rather than buffered */
  INDEX_HEAD_BYTES = 256,       /* where an index.json says its format (the converter writes it first) */
};

/* ---- listing -------------------------------------------------------------------------------- */

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int compare_strings(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

typedef struct {
  const char *const *patterns;
  const struct stat *skip_dir;  /* the output directory, when it exists */
} ListOptions;

/* Files met while walking a directory are kept when their name matches one of the patterns (all
 * are kept without patterns); files named on the command line always are. */
bool convert_input_wanted(const char *path, const char *const *patterns) {
  if (!patterns || !patterns[0]) return true;
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  for (size_t i = 0; patterns[i]; i++)
    if (fnmatch(patterns[i], base, 0) == 0) return true;
  return false;
}

/* Whether a directory holds a Wick dataset: an index.json that says so where the converter writes its
 * format. A dataset's index and shards are no text to convert. */
static bool holds_dataset(const char *dir) {
  char index[PATH_MAX];
  struct stat st;
  if (snprintf(index, sizeof index, "%s/index.json", dir) >= (int)sizeof index) return false;
  if (stat(index, &st) != 0 || !S_ISREG(st.st_mode)) return false;
  int fd;
  uint64_t size;
  if (wk_open_regular(index, "dataset indexes", &fd, &size) != WK_OK) return false;
  char head[INDEX_HEAD_BYTES];
  ssize_t n = read(fd, head, sizeof head);
  close(fd);
  return n > 0 && memmem(head, (size_t)n, "\"format\": \"wick-dataset\"", sizeof "\"format\": \"wick-dataset\"" - 1);
}

static WkStatus add_path(const char *path, int depth, const ListOptions *opt, Input **inputs, size_t *count,
                         size_t *capacity) {
  struct stat st;
  if (stat(path, &st) != 0) return WK_FAIL_ERRNO("input", path);
  /* Never read the converter's own output (a rerun into a folder under its input). */
  if (opt->skip_dir && st.st_dev == opt->skip_dir->st_dev && st.st_ino == opt->skip_dir->st_ino) {
    if (depth == 0)
      return WK_FAIL(WK_ERR_INVALID_ARG, "input '%s' is the output directory (-o): write the dataset elsewhere", path);
    wk_logf(WK_LOG_INFO, "converter: not reading '%s': it is the output directory", path);
    return WK_OK;
  }
  if (S_ISREG(st.st_mode)) {
    if (depth > 0 && !convert_input_wanted(path, opt->patterns)) return WK_OK;
    if (*count == *capacity) {
      size_t cap = *capacity ? *capacity * 2 : 64;
      Input *grown = realloc(*inputs, cap * sizeof *grown);
      if (!grown) return WK_FAIL(WK_ERR_NOMEM, "out of memory listing inputs");
      *inputs = grown;
      *capacity = cap;
    }
    char *copy = strdup(path);
    if (!copy) return WK_FAIL(WK_ERR_NOMEM, "out of memory listing inputs");
    (*inputs)[(*count)++] = (Input){.path = copy, .kind = convert_input_kind(path), .size = (uint64_t)st.st_size};
    return WK_OK;
  }
  if (!S_ISDIR(st.st_mode))
    return WK_FAIL(WK_ERR_INVALID_ARG, "input '%s' is %s: only regular files and directories can be converted", path,
                   wk_file_kind((unsigned)st.st_mode));
  if (depth > MAX_WALK_DEPTH)
    return WK_FAIL(WK_ERR_INVALID_ARG, "input '%s': directories nested deeper than %d (a symlink loop?)", path,
                   MAX_WALK_DEPTH);
  if (holds_dataset(path)) { /* an earlier converter output */
    if (depth == 0)
      return WK_FAIL(WK_ERR_INVALID_ARG, "input '%s' is a Wick dataset (its index.json says so): it is converted "
                     "already; name the inputs it was made from", path);
    wk_logf(WK_LOG_WARN, "converter: skipping '%s': it holds a Wick dataset (an earlier converter output)", path);
    return WK_OK;
  }
  DIR *dir = opendir(path);
  if (!dir) return WK_FAIL_ERRNO("open directory", path);
  char **names = NULL;
  size_t n = 0, cap = 0;
  WkStatus status = WK_OK;
  struct dirent *entry;
  while (status == WK_OK && (errno = 0, entry = readdir(dir)) != NULL) {
    if (entry->d_name[0] == '.') continue; /* hidden files, '.', '..' */
    if (n == cap) {
      cap = cap ? cap * 2 : 64;
      char **grown = realloc(names, cap * sizeof *grown);
      if (!grown) { status = WK_FAIL(WK_ERR_NOMEM, "out of memory listing '%s'", path); break; }
      names = grown;
    }
    size_t length = strlen(path) + strlen(entry->d_name) + 2;
    names[n] = malloc(length);
    if (!names[n]) { status = WK_FAIL(WK_ERR_NOMEM, "out of memory listing '%s'", path); break; }
    snprintf(names[n], length, "%s%s%s", path, ends_with(path, "/") ? "" : "/", entry->d_name);
    n++;
  }
  if (status == WK_OK && errno != 0) status = WK_FAIL_ERRNO("read directory", path);
  closedir(dir);
  if (status == WK_OK) qsort(names, n, sizeof *names, compare_strings);
  for (size_t i = 0; i < n; i++) {
    if (status == WK_OK) status = add_path(names[i], depth + 1, opt, inputs, count, capacity);
    free(names[i]);
  }
  free(names);
  return status;
}

WkStatus convert_list_inputs(const char *path, const char *const *patterns, const char *out_dir, Input **inputs,
                             size_t *count, size_t *capacity) {
  struct stat out;
  ListOptions opt = {.patterns = patterns, .skip_dir = stat(out_dir, &out) == 0 ? &out : NULL};
  return add_path(path, 0, &opt, inputs, count, capacity);
}

/* ---- cutting: a byte stream, plain or zstd ---------------------------------------------------- */

/* Inputs are read through WkBlob (blob.c), which refuses anything but a regular file before reading:
 * a file replaced by a FIFO after listing fails instead of blocking. */
typedef struct {
  WkBlob *blob;
  const char *path;
  ZSTD_DStream *zstd;   /* NULL for plain files */
  uint8_t *in;
  ZSTD_inBuffer input;
  size_t in_capacity;
  size_t frame_left;    /* last ZSTD_decompressStream hint: 0 at a frame boundary */
  uint64_t consumed;    /* bytes read from the file */
  bool eof;
} Stream;

/* Up to capacity bytes of the file at s->consumed (0 at its end). */
static WkStatus file_read(Stream *s, uint8_t *dst, size_t capacity, size_t *got) {
  uint64_t left = s->blob->size - s->consumed;
  size_t n = left < capacity ? (size_t)left : capacity;
  *got = 0;
  if (n) WK_TRY(s->blob->read_at(s->blob, s->consumed, n, dst));
  s->consumed += n;
  *got = n;
  return WK_OK;
}

static WkStatus stream_read(Stream *s, uint8_t *dst, size_t capacity, size_t *got) {
  *got = 0;
  if (!s->zstd) return file_read(s, dst, capacity, got);
  ZSTD_outBuffer output = {dst, capacity, 0};
  while (output.pos == 0) {
    if (s->input.pos == s->input.size) {
      if (s->eof) {
        if (s->frame_left != 0)
          return WK_FAIL(WK_ERR_FORMAT, "'%s': zstd stream ends inside a frame (file truncated?)", s->path);
        break;
      }
      size_t n = 0;
      WK_TRY(file_read(s, s->in, s->in_capacity, &n));
      if (n == 0) { s->eof = true; continue; }
      s->input = (ZSTD_inBuffer){s->in, n, 0};
    }
    size_t r = ZSTD_decompressStream(s->zstd, &output, &s->input);
    if (ZSTD_isError(r))
      return WK_FAIL(WK_ERR_FORMAT, "'%s': zstd: %s (file corrupted or not zstd)", s->path, ZSTD_getErrorName(r));
    s->frame_left = r;
  }
  *got = output.pos;
  return WK_OK;
}

static WkStatus new_chunk(uint32_t input, uint8_t *data, size_t length, Chunk **out) {
  Chunk *c = calloc(1, sizeof *c);
  if (!c) return WK_FAIL(WK_ERR_NOMEM, "out of memory allocating a chunk");
  c->kind = JOB_CHUNK;
  c->input = input;
  c->data = data;
  c->length = length;
  *out = c;
  return WK_OK;
}

/* Emits newline-terminated pieces of about sizes->line_bytes (a longer line makes a longer chunk). */
static WkStatus cut_lines(const Input *in, uint32_t i, WkBlob *blob, const ChunkSizes *sizes, ChunkEmit emit,
                          void *arg, const atomic_bool *stop) {
  Stream s = {.blob = blob, .path = in->path};
  WkStatus status = WK_OK;
  if (in->kind == INPUT_JSONL_ZST) {
    s.zstd = ZSTD_createDStream();
    s.in_capacity = ZSTD_DStreamInSize();
    s.in = malloc(s.in_capacity);
    if (!s.zstd || !s.in) status = WK_FAIL(WK_ERR_NOMEM, "out of memory opening '%s'", in->path);
  }
  size_t capacity = 2 * sizes->line_bytes, have = 0;
  uint8_t *buffer = malloc(capacity);
  if (!buffer && status == WK_OK) status = WK_FAIL(WK_ERR_NOMEM, "out of memory reading '%s'", in->path);
  uint64_t reported = 0, emitted = 0;
  bool first = true, eof = false;
  while (status == WK_OK && !atomic_load(stop)) {
    while (!eof && have < sizes->line_bytes) {
      size_t got = 0;
      if ((status = stream_read(&s, buffer + have, capacity - have, &got)) != WK_OK) break;
      if (got == 0) eof = true;
      have += got;
    }
    if (status != WK_OK) break;
    if (have == 0) break;
    size_t cut = have;
    if (!eof) {
      while (cut > 0 && buffer[cut - 1] != '\n') cut--;
      if (cut == 0) { /* one line longer than the buffer: grow and read on */
        if (have >= sizes->max_line_bytes) {
          status = WK_FAIL(WK_ERR_FORMAT, "'%s': the line starting at byte %llu%s is longer than %zu bytes (is "
                           "it line-delimited JSON?)", in->path, (unsigned long long)emitted,
                           s.zstd ? " of the decompressed stream" : "", sizes->max_line_bytes);
          break;
        }
        capacity *= 2;
        uint8_t *grown = realloc(buffer, capacity);
        if (!grown) { status = WK_FAIL(WK_ERR_NOMEM, "out of memory: a line of '%s' is over %zu bytes", in->path, have); break; }
        buffer = grown;
        size_t got = 0;
        if ((status = stream_read(&s, buffer + have, capacity - have, &got)) != WK_OK) break;
        if (got == 0) eof = true;
        have += got;
        continue;
      }
    }
    uint8_t *rest = malloc(capacity);
    if (!rest) { status = WK_FAIL(WK_ERR_NOMEM, "out of memory reading '%s'", in->path); break; }
    memcpy(rest, buffer + cut, have - cut);
    Chunk *c = NULL;
    if ((status = new_chunk(i, buffer, cut, &c)) != WK_OK) { free(rest); break; }
    c->first = first;
    c->last = eof && cut == have;
    c->input_bytes = s.consumed - reported;
    reported = s.consumed;
    first = false;
    buffer = rest;
    have -= cut;
    emitted += cut;
    if ((status = emit(arg, c)) != WK_OK) break;
    if (eof && have == 0) break;
  }
  free(buffer);
  free(s.in);
  ZSTD_freeDStream(s.zstd);
  return status;
}

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
static WkStatus cut_tokens(const Input *in, uint32_t i, WkBlob *blob, const ChunkSizes *sizes, ChunkEmit emit,
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
    if ((status = new_chunk(i, data, n * 2, &c)) != WK_OK) { free(data); break; }
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

static const ChunkSizes CHUNK_SIZES = {.line_bytes = LINE_CHUNK_BYTES, .bin_tokens = BIN_CHUNK_TOKENS,
                                       .max_line_bytes = MAX_LINE_BYTES};

WkStatus convert_cut_blob(const Input *in, uint32_t i, WkBlob *blob, const ChunkSizes *sizes, ChunkEmit emit,
                          void *arg, const atomic_bool *stop) {
  if (in->kind == INPUT_JSONL || in->kind == INPUT_JSONL_ZST) return cut_lines(in, i, blob, sizes, emit, arg, stop);
  if (in->kind == INPUT_TOKENS_BIN) return cut_tokens(in, i, blob, sizes, emit, arg, stop);
  return WK_FAIL(WK_ERR_INTERNAL, "input kind %d is not cut from a blob", (int)in->kind);
}

/* ---- processing (worker threads) ------------------------------------------------------------- */

static WkStatus end_document(Chunk *c) { return convert_chunk_end_document(c); }

static WkStatus bad_line(Chunk *c, uint64_t line, const char *reason) {
  return convert_bad_add(&c->bad, &c->bad_count, &c->bad_capacity, line, reason);
}

/* One text document, checked for UTF-8 (a bad one is skipped and reported at its line). */
static WkStatus text_document(const ChunkContext *ctx, Chunk *c, const uint8_t *text, size_t length,
                              uint64_t first_line) {
  size_t valid = wk_utf8_valid_prefix(text, length);
  if (valid < length) {
    uint64_t line = first_line;
    for (size_t k = 0; k < valid; k++) line += text[k] == '\n';
    char reason[128];
    snprintf(reason, sizeof reason, "invalid UTF-8 at byte %zu of the document (document skipped)", valid);
    return bad_line(c, line, reason);
  }
  WK_TRY(ctx->tokenizer->encode(ctx->tokenizer, text, length, &c->tokens));
  return end_document(c);
}

static bool is_blank(const uint8_t *p, const uint8_t *end) {
  for (; p < end; p++)
    if (*p != ' ' && *p != '\t') return false;
  return true;
}

/* Splits a text file into documents: the whole file, or paragraphs (runs of non-blank lines, blank
 * lines between them dropped), or non-blank lines (newlines and a CR before them dropped). */
static WkStatus split_text(const ChunkContext *ctx, Chunk *c, const uint8_t *text, size_t length) {
  if (ctx->split == WK_TEXT_SPLIT_FILE) return text_document(ctx, c, text, length, 1);
  const uint8_t *p = text, *end = text + length, *doc = NULL, *doc_end = NULL;
  uint64_t line = 1, doc_line = 1;
  WkStatus status = WK_OK;
  while (p < end && status == WK_OK) {
    const uint8_t *nl = memchr(p, '\n', (size_t)(end - p));
    const uint8_t *line_end = nl ? nl : end;
    if (line_end > p && line_end[-1] == '\r') line_end--;
    bool blank = is_blank(p, line_end);
    if (ctx->split == WK_TEXT_SPLIT_LINE) {
      if (!blank) status = text_document(ctx, c, p, (size_t)(line_end - p), line);
    } else if (blank) {
      if (doc) status = text_document(ctx, c, doc, (size_t)(doc_end - doc), doc_line);
      doc = NULL;
    } else {
      if (!doc) doc = p, doc_line = line;
      doc_end = line_end;
    }
    line++;
    p = nl ? nl + 1 : end;
  }
  if (status == WK_OK && doc) status = text_document(ctx, c, doc, (size_t)(doc_end - doc), doc_line);
  return status;
}

static WkStatus process_text(const ChunkContext *ctx, const Input *in, Chunk *c) {
  WkBlob *src = convert_open_input(in);
  if (!src) return wk_last_status();
  WkStatus status = WK_OK;
  uint8_t *copy = NULL;
  const uint8_t *text = src->size ? src->map(src, 0, (size_t)src->size) : (const uint8_t *)"";
  if (!text) {
    copy = malloc((size_t)src->size);
    if (!copy) status = WK_FAIL(WK_ERR_NOMEM, "out of memory reading '%s'", in->path);
    else status = src->read_at(src, 0, (size_t)src->size, copy);
    text = copy;
  }
  if (status == WK_OK) status = split_text(ctx, c, text, (size_t)src->size);
  free(copy);
  src->close(src);
  return status;
}

static WkStatus process_lines(const ChunkContext *ctx, const Input *in, Chunk *c) {
  (void)in; /* a line numbers itself within the chunk */
  WkScratch scratch = {0};
  WkStatus status = WK_OK;
  const uint8_t *p = c->data, *end = c->data + c->length;
  uint64_t line = 0;
  while (p < end && status == WK_OK) {
    const uint8_t *nl = memchr(p, '\n', (size_t)(end - p));
    const uint8_t *line_end = nl ? nl : end;
    line++;
    size_t n = (size_t)(line_end - p);
    if (n > 0 && p[n - 1] == '\r') n--;
    bool blank = true;
    for (size_t k = 0; k < n && blank; k++) blank = p[k] == ' ' || p[k] == '\t';
    if (!blank) {
      const char *text;
      size_t text_length;
      char reason[128];
      if (wk_json_line_field((const char *)p, n, ctx->field, &scratch, &text, &text_length, reason)) {
        status = ctx->tokenizer->encode(ctx->tokenizer, (const uint8_t *)text, text_length, &c->tokens);
        if (status == WK_OK) status = end_document(c);
      } else {
        status = bad_line(c, line, reason);
      }
    }
    p = nl ? nl + 1 : end;
  }
  c->lines = line;
  free(scratch.data);
  return status;
}

static WkStatus process_tokens(const ChunkContext *ctx, const Input *in, Chunk *c) {
  size_t n = c->length / 2;
  WK_TRY(wk_token_vec_reserve(&c->tokens, n));
  uint32_t eos = ctx->tokenizer->eos, vocab = ctx->tokenizer->vocab_size;
  for (size_t k = 0; k < n; k++) {
    uint32_t t = (uint32_t)c->data[2 * k] | (uint32_t)c->data[2 * k + 1] << 8;
    if (t == eos) {
      WK_TRY(end_document(c));
    } else if (t >= vocab) {
      return WK_FAIL(WK_ERR_FORMAT, "'%s': token %u at byte %llu is outside the %s vocabulary (%u); not GPT-2 "
                     "tokens?", in->path, t, (unsigned long long)(c->offset + k * 2), ctx->tokenizer->name, vocab);
    } else {
      c->tokens.data[c->tokens.length++] = t;
    }
  }
  return WK_OK;
}

void convert_chunk_free(Chunk *c) {
  if (!c) return;
  free(c->data);
  free(c->tokens.data);
  free(c->doc_ends);
  free(c->bad);
  free(c);
}

/* ---- the formats (CONVERT_INPUTS) ----------------------------------------------------------- */

/* The cutters as the table calls them: the input open as a blob, the converter's own sizes and limits. */
typedef WkStatus (*InputCut)(const ChunkContext *ctx, uint32_t i, WkBlob *blob, ChunkEmit emit, void *arg,
                             const atomic_bool *stop);
typedef WkStatus (*InputProcess)(const ChunkContext *ctx, const Input *in, Chunk *c);

static WkStatus cut_lines_input(const ChunkContext *ctx, uint32_t i, WkBlob *blob, ChunkEmit emit, void *arg,
                                const atomic_bool *stop) {
  return cut_lines(&ctx->inputs[i], i, blob, &CHUNK_SIZES, emit, arg, stop);
}

static WkStatus cut_tokens_input(const ChunkContext *ctx, uint32_t i, WkBlob *blob, ChunkEmit emit, void *arg,
                                 const atomic_bool *stop) {
  return cut_tokens(&ctx->inputs[i], i, blob, &CHUNK_SIZES, emit, arg, stop);
}

static WkStatus cut_parquet_input(const ChunkContext *ctx, uint32_t i, WkBlob *blob, ChunkEmit emit, void *arg,
                                  const atomic_bool *stop) {
  (void)stop; /* a row group is read whole; the emit callback stops it */
  return convert_cut_parquet(ctx, i, blob, &CONVERT_RECORD_LIMITS, emit, arg);
}

static WkStatus cut_tar_input(const ChunkContext *ctx, uint32_t i, WkBlob *blob, ChunkEmit emit, void *arg,
                              const atomic_bool *stop) {
  (void)stop;
  return convert_cut_tar(ctx, i, blob, &CONVERT_RECORD_LIMITS, emit, arg);
}

typedef struct {
  const char *names;  /* "*.jsonl, *.ndjson" */
  InputCut cut;
  InputProcess process;
  const char *reads;
} InputFormat;

_Static_assert(INPUT_TEXT == INPUT_KIND_COUNT - 1, "TEXT, which takes what no other format names, is the last");

#define CONVERT_INPUT_ROW(kind, names, cut, process, reads) [INPUT_##kind] = {names, cut, process, reads},
static const InputFormat FORMATS[INPUT_KIND_COUNT] = {CONVERT_INPUTS(CONVERT_INPUT_ROW)};
#undef CONVERT_INPUT_ROW

/* Whether path ends with one of the "*.SUFFIX" names of a comma-separated list. */
static bool matches_names(const char *path, const char *names) {
  for (const char *p = names; *p;) {
    size_t n = strcspn(p, ",");
    if (p[0] == '*') {
      size_t length = strlen(path), m = n - 1;
      if (length >= m && strncmp(path + length - m, p + 1, m) == 0) return true;
    }
    p += n;
    p += strspn(p, ", ");
  }
  return false;
}

InputKind convert_input_kind(const char *path) {
  for (int k = 0; k < INPUT_TEXT; k++)
    if (matches_names(path, FORMATS[k].names)) return (InputKind)k;
  return INPUT_TEXT;
}

const char *wk_converter_input_format(uint32_t i, const char **reads) {
  if (i >= INPUT_KIND_COUNT) return NULL;
  if (reads) *reads = FORMATS[i].reads;
  return FORMATS[i].names;
}

WkStatus convert_cut_input(const ChunkContext *ctx, uint32_t i, ChunkEmit emit, void *arg, const atomic_bool *stop) {
  const Input *in = &ctx->inputs[i];
  if (!FORMATS[in->kind].cut) { /* one chunk: the worker reads the file */
    Chunk *c = NULL;
    WK_TRY(new_chunk(i, NULL, 0, &c));
    c->first = c->last = true;
    c->input_bytes = in->size;
    return emit(arg, c);
  }
  WkBlob *blob = convert_open_input(in);
  if (!blob) return wk_last_status();
  WkStatus status = FORMATS[in->kind].cut(ctx, i, blob, emit, arg, stop);
  blob->close(blob);
  return status;
}

void convert_process_chunk(const ChunkContext *ctx, Chunk *c) {
  const Input *in = &ctx->inputs[c->input];
  WkStatus status = FORMATS[in->kind].process(ctx, in, c);
  c->status = status;
  if (status != WK_OK) snprintf(c->message, sizeof c->message, "%s", wk_last_error());
  free(c->data); /* the input bytes are no longer needed */
  c->data = NULL;
}
