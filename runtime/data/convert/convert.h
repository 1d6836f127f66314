/*
 * convert.h — what convert.c (the pipeline) and convert_input.c (reading inputs) share.
 *
 * The converter turns inputs into a sequence of chunks with consecutive numbers. Worker threads turn
 * each chunk into tokens and document ends independently; the builder consumes chunk results in
 * number order, so the document sequence, and with it every shard, depends only on the inputs.
 */
#ifndef WK_DATA_CONVERT_H
#define WK_DATA_CONVERT_H

#include <stdatomic.h>
#include <stdio.h>

#include "../../core/json.h"
#include "../index.h"
#include "../tokenizer.h"
#include "shard_writer.h"

typedef enum { INPUT_TEXT, INPUT_JSONL, INPUT_JSONL_ZST, INPUT_TOKENS_BIN } InputKind;

typedef struct WkRemote WkRemote;

typedef struct {
  char *path;
  InputKind kind;
  uint64_t size;
  WkRemote *remote;  /* the converter's remote context for a URL (remote_input.c); NULL: a local file */
} Input;

typedef struct {
  uint64_t line;   /* 1-based, relative to the chunk's first line */
  char reason[128];
} BadLine;

typedef enum { JOB_CHUNK, JOB_PIECE } JobKind;

/* One piece of one input, and what a worker made of it. */
typedef struct {
  JobKind kind;
  uint64_t seq;
  uint32_t input;
  bool first, last;      /* first/last chunk of its input */
  uint8_t *data;         /* owned bytes (lines, or .bin tokens); NULL for a text file (read by the worker) */
  size_t length;
  uint64_t offset;       /* .bin: where data starts in the file (for messages) */
  uint64_t input_bytes;  /* progress made when this chunk is consumed */
  /* results */
  bool done;
  WkStatus status;
  char message[1024];
  WkTokenVec tokens;
  uint64_t *doc_ends;    /* exclusive ends in tokens; the part after the last end continues (.bin) */
  size_t doc_count, doc_capacity;
  uint64_t lines;        /* lines in the chunk, for numbering the next one */
  BadLine *bad;
  size_t bad_count, bad_capacity;
} Chunk;

/* Settings a worker needs. */
typedef struct {
  const WkTokenizer *tokenizer;
  const char *field;
  WkTextSplit split;
  const Input *inputs;
} ChunkContext;

/* Worker side: fills the chunk's results (never fails the thread: errors go into status/message). */
void convert_process_chunk(const ChunkContext *ctx, Chunk *chunk);
void convert_chunk_free(Chunk *chunk);

/* Producer side: cuts input i into chunks, handing each to emit (which may block for backpressure
 * and returns non-OK to stop). */
typedef WkStatus (*ChunkEmit)(void *arg, Chunk *chunk);
WkStatus convert_cut_input(const Input *inputs, uint32_t i, ChunkEmit emit, void *arg, const atomic_bool *stop);

/* The same for a .jsonl, .jsonl.zst or .bin input already open as blob, cut into pieces of about
 * sizes (the converter's: 1 MiB of lines, 1 Mi tokens; tests/fuzz/fuzz_inputs.c cuts tiny ones so
 * that every chunk boundary is reached). */
typedef struct {
  size_t line_bytes;  /* .jsonl: a chunk ends at the last newline before this many bytes (>= 1) */
  size_t bin_tokens;  /* .bin: tokens per chunk (>= 1) */
  size_t max_line_bytes; /* .jsonl: a line found longer than this fails the input (memory stays bounded) */
} ChunkSizes;
WkStatus convert_cut_blob(const Input *in, uint32_t i, WkBlob *blob, const ChunkSizes *sizes, ChunkEmit emit,
                          void *arg, const atomic_bool *stop);

/* Adds path (file or directory, walked in sorted order; patterns: NULL-terminated fnmatch globs a
 * walked file's name must match, NULL for all; out_dir is never walked into) to the list. */
WkStatus convert_list_inputs(const char *path, const char *const *patterns, const char *out_dir, Input **inputs,
                             size_t *count, size_t *capacity);

/* The output directory (output.c): locked for the run, written through a staging directory next to
 * it, published by a swap. */
typedef struct {
  char *dir;        /* the output directory, absolute and resolved */
  char *staging;    /* where this run writes: <parent>/.<name>.converting */
  char *old;        /* the replaced dataset until it is removed: <parent>/.<name>.old */
  char *lock_path;  /* <parent>/.<name>.lock */
  int lock_fd;      /* -1 unless held */
  bool published;
} ConvertOutput;

/* Resolves and locks out_dir (failing at once, naming the holder's pid, when another converter has
 * it), finishes the cleanup a killed run left, and prepares the staging directory: emptied, or with
 * resume only of its temporaries (its shards are candidates for reuse). */
WkStatus convert_output_open(const char *out_dir, bool resume, ConvertOutput *o);
/* The path of name in the staging directory (malloc'd; NULL when out of memory). */
char *convert_output_path(const ConvertOutput *o, const char *name);
/* Resuming: makes the current dataset's file name part of the staging directory too (a hard link). */
WkStatus convert_output_adopt(const ConvertOutput *o, const char *name);
/* Swaps the staging directory (holding shards 0..shards-1 and index.json) in for the output. */
WkStatus convert_output_publish(ConvertOutput *o, uint32_t shards);
/* Unlocks and frees; after a failure also removes the staging directory's temporaries. */
void convert_output_close(ConvertOutput *o, bool failed);

/* An input's kind, by its name's suffix (convert_input.c). */
InputKind convert_input_kind(const char *path);
/* Whether a file found in a directory (or under a prefix) is read: its name matches a pattern (or none
 * are set). */
bool convert_input_wanted(const char *path, const char *const *patterns);

/* ---- remote_input.c ---- */

/* Lists a http(s):// or s3:// input: one object (its size asked of the server), or for an
 * s3://bucket/prefix/ (ending in '/') every object under it, byte-wise sorted, like a directory's files
 * (hidden names and names no pattern matches skipped). *remote is the converter's remote context,
 * opened at its first URL (close it with convert_remote_close). */
WkStatus convert_add_remote_input(WkRemote **remote, const char *location, const char *const *patterns,
                                  Input **inputs, size_t *count, size_t *capacity);
/* An input's bytes: a local file, or a remote object read by range (not cached, read once). */
WkBlob *convert_open_input(const Input *in);
void convert_remote_close(WkRemote *remote);

#endif /* WK_DATA_CONVERT_H */
