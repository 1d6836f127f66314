/*
 * convert_input.c — the converter's inputs: listing them, cutting them into chunks (producer
 * thread), and turning a chunk into tokens and document ends (worker threads).
 *
 * The formats are listed once, in convert.h (CONVERT_INPUTS): the table at the end of this file is made
 * from that list, and the two dispatchers (convert_cut_input, convert_process_chunk) read it. Each
 * format's reader is a file of its own: input_text.c, input_jsonl.c, input_bin.c, input_parquet.c,
 * input_tar.c.
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

#include "convert.h"

enum {
  LINE_CHUNK_BYTES = 1 << 20,   /* lines are cut into ~1 MiB chunks */
  BIN_CHUNK_TOKENS = 1 << 20,   /* .bin files into 1 Mi-token chunks */
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

static const ChunkSizes CHUNK_SIZES = {.line_bytes = LINE_CHUNK_BYTES, .bin_tokens = BIN_CHUNK_TOKENS,
                                       .max_line_bytes = MAX_LINE_BYTES};

WkStatus convert_cut_blob(const Input *in, uint32_t i, WkBlob *blob, const ChunkSizes *sizes, ChunkEmit emit,
                          void *arg, const atomic_bool *stop) {
  if (in->kind == INPUT_JSONL || in->kind == INPUT_JSONL_ZST)
    return convert_cut_lines(in, i, blob, sizes, emit, arg, stop);
  if (convert_input_is_tokens(in->kind)) return convert_cut_tokens(in, i, blob, sizes, emit, arg, stop);
  return WK_FAIL(WK_ERR_INTERNAL, "input kind %d is not cut from a blob", (int)in->kind);
}

/* ---- chunks ------------------------------------------------------------------------------------ */

WkStatus convert_chunk_new(uint32_t input, uint8_t *data, size_t length, Chunk **out) {
  Chunk *c = calloc(1, sizeof *c);
  if (!c) return WK_FAIL(WK_ERR_NOMEM, "out of memory allocating a chunk");
  c->kind = JOB_CHUNK;
  c->input = input;
  c->data = data;
  c->length = length;
  *out = c;
  return WK_OK;
}

WkStatus convert_chunk_bad_line(Chunk *c, uint64_t line, const char *reason) {
  return convert_bad_add(&c->bad, &c->bad_count, &c->bad_capacity, line, reason);
}

void convert_chunk_free(Chunk *c) {
  if (!c) return;
  free(c->data);
  free(c->tokens.data);
  free(c->doc_ends);
  free(c->bad);
  for (uint32_t k = 0; k < c->column_count; k++) free(c->columns[k].data.data), free(c->columns[k].ends.data);
  free(c->columns);
  free(c);
}

/* ---- the formats (CONVERT_INPUTS) ----------------------------------------------------------- */

/* The cutters as the table calls them: the input open as a blob, the converter's own sizes and limits. */
typedef WkStatus (*InputCut)(const ChunkContext *ctx, uint32_t i, WkBlob *blob, ChunkEmit emit, void *arg,
                             const atomic_bool *stop);
typedef WkStatus (*InputProcess)(const ChunkContext *ctx, const Input *in, Chunk *c);

static WkStatus cut_lines_input(const ChunkContext *ctx, uint32_t i, WkBlob *blob, ChunkEmit emit, void *arg,
                                const atomic_bool *stop) {
  return convert_cut_lines(&ctx->inputs[i], i, blob, &CHUNK_SIZES, emit, arg, stop);
}

static WkStatus cut_tokens_input(const ChunkContext *ctx, uint32_t i, WkBlob *blob, ChunkEmit emit, void *arg,
                                 const atomic_bool *stop) {
  return convert_cut_tokens(&ctx->inputs[i], i, blob, &CHUNK_SIZES, emit, arg, stop);
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
    WK_TRY(convert_chunk_new(i, NULL, 0, &c));
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
