/*
 * runtime/convert — the converter: text corpora (local or remote) -> a dataset directory of shards.
 *
 * Owns its settings (settings.c), its pipeline (convert.c: threads; builder.c: ordering, shards,
 * progress, the index; converter.h is what those three share), its inputs (below, and
 * remote_input.c for http(s):// and s3:// inputs through runtime/io/remote), its output directory
 * (output.c: lock, staging directory, swap) and a Parquet reader of its own (parquet/). The shard
 * writer and the index are the format's (runtime/format/); tokenizers are runtime/tokenizer/'s.
 * Layer: above format/ and tokenizer/ (runtime/LAYERS); nothing in the read path includes it.
 *
 * convert.h — what convert.c (the pipeline) and convert_input.c (reading inputs) share.
 *
 * The converter turns inputs into a sequence of chunks with consecutive numbers. Worker threads turn
 * each chunk into tokens and document ends independently; the builder consumes chunk results in
 * number order, so the document sequence, and with it every shard, depends only on the inputs.
 *
 *   convert_input.c   listing inputs; the format table (CONVERT_INPUTS) and its dispatch; chunks
 *   input_text.c      text files: one document per file, paragraph or line
 *   input_jsonl.c     .jsonl and .jsonl.zst: one document per line's --field string
 *   input_bin.c       token files: llm.c and nanoGPT .bin, NumPy .npy
 *   records.c         chunks of records (one text per row or sample), for the readers below
 *   input_parquet.c   Parquet files: the --field column's strings (parquet/ reads the format)
 *   input_tar.c       WebDataset .tar shards (libarchive): the --field member of each sample
 *   column_spec.c     --column NAME=FIELD:KIND: what a column is and which field fills it
 *   column_value.c    a record's field values -> its tokens and its columns' values (or why the row is bad)
 */
#ifndef WK_CONVERT_H
#define WK_CONVERT_H

#include <stdatomic.h>
#include <stdio.h>

#include "../core/json.h"
#include "../format/index.h"
#include "../format/shard_writer.h"
#include "../tokenizer/tokenizer.h"

/* The converter's input formats, listed once: X(KIND, names, cut, process, reads). An input's kind is the
 * first format one of whose comma-separated names ("*.SUFFIX") its path matches; the last, TEXT, takes
 * the rest. cut is the producer's (it gets the input open as a blob; NULL: one chunk, which the worker
 * reads whole), process the worker's. names and reads are what `run -m wick.shard --help` lists
 * (wk_converter_input_format), and docs/data.md's list is checked against them (tests/convert/
 * formats_spec.lua). A new format is a line here, its reader (input_NAME.c) and that list in docs/data.md. */
#define CONVERT_INPUTS(X)                                                                                        \
  X(JSONL, "*.jsonl, *.ndjson", cut_lines_input, convert_process_lines,                                          \
    "one JSON object per line; the document is its --field string")                                              \
  X(JSONL_ZST, "*.jsonl.zst, *.ndjson.zst", cut_lines_input, convert_process_lines, "the same, zstd-compressed") \
  X(TOKENS_BIN, "*.bin", cut_tokens_input, convert_process_tokens,                                               \
    "llm.c (magic 20240520) uint16 tokens, or headerless nanoGPT uint16 tokens with --headerless-bin; GPT-2's "  \
    "unless --vocab-size and --eos declare others; documents separated by EOS")                                  \
  X(TOKENS_NPY, "*.npy", cut_tokens_input, convert_process_tokens,                                               \
    "NumPy 1-D arrays of token ids (<u2, <u4, <i4, <i8) with --vocab-size and --eos; documents separated by EOS") \
  X(PARQUET, "*.parquet", cut_parquet_input, convert_process_records,                                            \
    "the strings of the --field column, one document per row (null rows are counted and skipped); snappy, "      \
    "gzip, zstd; data pages v1 and v2")                                                                          \
  X(TAR, "*.tar, *.tar.gz, *.tgz", cut_tar_input, convert_process_records,                                       \
    "WebDataset shards: each sample's member with extension --field (txt, or json with --json-field naming "     \
    "its string)")                                                                                               \
  X(TEXT, "anything else", NULL, convert_process_text,                                                           \
    "text: one document per file (or per paragraph, or line: --split)")

#define CONVERT_INPUT_KIND(kind, names, cut, process, reads) INPUT_##kind,
typedef enum { CONVERT_INPUTS(CONVERT_INPUT_KIND) INPUT_KIND_COUNT } InputKind;
#undef CONVERT_INPUT_KIND

typedef struct WkRemote WkRemote;

typedef struct {
  char *path;
  InputKind kind;
  uint64_t size;
  WkRemote *remote;  /* the converter's remote context for a URL (remote_input.c); NULL: a local file */
  bool headerless;   /* .bin: nanoGPT's uint16 tokens, no llm.c header (WK_CONVERT_HEADERLESS_BIN) */
} Input;

typedef struct {
  uint64_t line;   /* 1-based, relative to the chunk's first line */
  char reason[256];
} BadLine;

/* ---- columns (column_spec.c) ---------------------------------------------------------------------- */

/* What a --column's values are read as. TOKENS is the token stream itself (column 0, named "tokens"): a
 * string tokenized as text is, or a list of ids; MASK and TOKEN_U8 are stored as the format's TOKEN_U8. */
#define COLUMN_KINDS(X) X(TOKENS, "tokens") X(MASK, "mask") X(TOKEN_U8, "token_u8") X(I64, "i64") X(F32, "f32") \
  X(BYTES, "bytes") X(TENSOR, "tensor")
#define COLUMN_KIND_ENUM(kind, name) COLUMN_##kind,
typedef enum { COLUMN_KINDS(COLUMN_KIND_ENUM) COLUMN_KIND_COUNT } ColumnKind;
#undef COLUMN_KIND_ENUM

enum { COLUMN_NAME_BYTES = WK_COLUMN_NAME_BYTES, COLUMN_FIELD_BYTES = 128, COLUMN_MAX_DIMS = WK_COLUMN_MAX_DIMS,
       COLUMN_MAX = WK_MAX_COLUMNS - 1 /* besides the tokens */ };

typedef struct {
  char name[COLUMN_NAME_BYTES];    /* [A-Za-z_][A-Za-z0-9_]*, unique */
  char field[COLUMN_FIELD_BYTES];  /* the input's field (JSON member, Parquet column, tar extension) */
  ColumnKind kind;
  uint32_t dtype;                  /* TENSOR: its elements' WkDType (f32, i32, i64, u8) */
  uint32_t ndim;                   /* TENSOR: 1..4 */
  uint32_t shape[COLUMN_MAX_DIMS];
  uint64_t elements;               /* TENSOR: the product of shape */
  uint64_t element_bytes;          /* bytes of one stored row: 1 per token (MASK, TOKEN_U8), 8 I64, 4 F32, the
                                      tensor's bytes; 0 for TOKENS and BYTES */
} ColumnSpec;

/* Parses "NAME=FIELD:KIND" (KIND: tokens, mask, token_u8, i64, f32, bytes, or DTYPE[d0,d1,...] with DTYPE f32,
 * i32, i64 or u8) into *out; a bad spec is WK_ERR_INVALID_ARG saying what is wrong and the expected form. */
WkStatus column_spec_parse(const char *spec, ColumnSpec *out);
const char *column_kind_name(ColumnKind kind);
/* The column as the format stores it (MASK is a TOKEN_U8 column). */
void column_spec_info(const ColumnSpec *col, WkColumnInfo *out);
/* A tensor column's element type (f32, i32, i64, u8): its name and size. */
const char *column_dtype_name(uint32_t dtype);
size_t column_dtype_size(uint32_t dtype);

/* One column's values in a chunk (or a shard being built), aligned with its documents: MASK and TOKEN_U8 one
 * byte per token (EOS not included in a chunk), I64, F32, TENSOR element_bytes per document, BYTES the blobs
 * concatenated with each document's end offset (u64) in ends. */
typedef struct {
  WkByteVec data;
  WkByteVec ends;
} ColumnData;

typedef enum { JOB_CHUNK, JOB_PIECE } JobKind;

/* One piece of one input, and what a worker made of it. */
typedef struct {
  JobKind kind;
  uint64_t seq;
  uint32_t input;
  bool first, last;      /* first/last chunk of its input */
  uint8_t *data;         /* owned bytes (lines, or .bin tokens); NULL for a text file (read by the worker) */
  size_t length;
  uint64_t offset;       /* token files: where data starts in the file (for messages) */
  uint8_t token_bytes;   /* token files: bytes per id in data (2, 4 or 8, little-endian) */
  bool token_signed;     /* token files: the ids are signed (a negative one is an error) */
  uint64_t input_bytes;  /* progress made when this chunk is consumed */
  /* results */
  bool done;
  WkStatus status;
  char message[1024];
  WkTokenVec tokens;
  uint64_t *doc_ends;    /* exclusive ends in tokens; the part after the last end continues (.bin) */
  size_t doc_count, doc_capacity;
  uint64_t lines;        /* lines (rows, samples) in the chunk, for numbering the next one */
  uint64_t nulls;        /* Parquet: null rows skipped */
  BadLine *bad;
  size_t bad_count, bad_capacity;
  ColumnData *columns;   /* ChunkContext.column_count of them (NULL without --column) */
  uint32_t column_count;
} Chunk;

/* Settings a worker needs. */
typedef struct {
  const WkTokenizer *tokenizer;
  const WkTemplate *template;  /* put around each document's text (the tokenizer's); NULL: none */
  const char *field;       /* .jsonl: the string member; Parquet: the column; tar: the member extension */
  const char *json_field;  /* tar: the string member of a .json member (field "json") */
  WkTextSplit split;
  const Input *inputs;
  /* --column: records carry fields (records mode; an empty record is kept as a document of its EOS alone) */
  bool records;            /* any --column given */
  const ColumnSpec *tokens;  /* the tokens column; NULL: the text field's text is tokenized */
  bool no_text;            /* records have no text: each is its columns and an EOS (WK_CONVERT_NO_TEXT) */
  const ColumnSpec *columns; /* the other columns, in the dataset's order (column 1 on) */
  uint32_t column_count;
} ChunkContext;

/* Worker side: fills the chunk's results (never fails the thread: errors go into status/message). */
void convert_process_chunk(const ChunkContext *ctx, Chunk *chunk);
/* What workers collect into a chunk (records.c): a bad line (line numbered within the chunk), the end
 * of a document at the chunk's current token count. */
WkStatus convert_bad_add(BadLine **bad, size_t *count, size_t *capacity, uint64_t line, const char *reason);
WkStatus convert_chunk_end_document(Chunk *c);
/* A document of text (valid UTF-8): its ids, with the template around them unless it is empty (an
 * empty document stays empty, and is skipped), then its end. */
WkStatus convert_chunk_add_text(const ChunkContext *ctx, Chunk *c, const uint8_t *text, size_t length);
/* ---- a record's fields (column_value.c) ------------------------------------------------------------ */

/* A field of a record as its reader found it. MEMBER is a tar member's bytes: text that may hold a number
 * (a .cls label), or bytes. LIST and OBJECT point into a parsed JSON tree. */
typedef enum { VALUE_MISSING, VALUE_NULL, VALUE_BOOL, VALUE_NUMBER, VALUE_STRING, VALUE_BINARY, VALUE_MEMBER,
               VALUE_LIST, VALUE_OBJECT } ValueType;
typedef struct {
  ValueType type;
  const uint8_t *bytes;  /* STRING, BINARY, MEMBER; NUMBER: its text (JSON's) */
  size_t length;
  bool truth;            /* BOOL */
  const WkJson *json;    /* LIST, OBJECT */
} Value;

/* A JSON value as a field (NULL: missing). */
Value value_of_json(const WkJson *json);
/* The named field of a record given as a JSON object (MISSING when absent or when record is no object). */
Value value_of_member(const WkJson *record, const char *field);
/* A record -> the chunk's next document: its tokens from `text` (the tokens column's field, or the text field:
 * a string is tokenized, a list holds ids; missing: a bad row; none read with no_text) and each
 * column's value from columns[k]. A field that does not fit its column makes the row bad (line, within the
 * chunk): reported, nothing of it kept. Non-OK only for a failure of the run itself (memory, tokenizer). */
WkStatus convert_chunk_add_record(const ChunkContext *ctx, Chunk *c, const Value *text, const Value *columns,
                                  uint64_t line);
/* The fields a record of this run reads: the text (or tokens column) field first, then each column's. */
uint32_t convert_record_fields(const ChunkContext *ctx, const char **fields, uint32_t capacity);

/* A new chunk of input `input` owning data (NULL for a text file: the worker reads it), and a bad line
 * (numbered within the chunk) reported by a worker. */
WkStatus convert_chunk_new(uint32_t input, uint8_t *data, size_t length, Chunk **out);
WkStatus convert_chunk_bad_line(Chunk *c, uint64_t line, const char *reason);
void convert_chunk_free(Chunk *chunk);

/* Producer side: cuts input i into chunks, handing each to emit (which may block for backpressure
 * and returns non-OK to stop). */
typedef WkStatus (*ChunkEmit)(void *arg, Chunk *chunk);
WkStatus convert_cut_input(const ChunkContext *ctx, uint32_t i, ChunkEmit emit, void *arg, const atomic_bool *stop);

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

/* ---- the readers of CONVERT_INPUTS: input_jsonl.c, input_bin.c, input_text.c ----------------------- */

/* .jsonl(.zst): newline-terminated chunks of about sizes->line_bytes; each line's field -> a document. */
WkStatus convert_cut_lines(const Input *in, uint32_t i, WkBlob *blob, const ChunkSizes *sizes, ChunkEmit emit,
                           void *arg, const atomic_bool *stop);
WkStatus convert_process_lines(const ChunkContext *ctx, const Input *in, Chunk *c);
/* Token files (.bin, .npy): chunks of sizes->bin_tokens tokens (after the file's header: llm.c's unless
 * headerless, NumPy's). */
WkStatus convert_cut_tokens(const Input *in, uint32_t i, WkBlob *blob, const ChunkSizes *sizes, ChunkEmit emit,
                            void *arg, const atomic_bool *stop);
WkStatus convert_process_tokens(const ChunkContext *ctx, const Input *in, Chunk *c);
/* Text: the worker reads the whole file and splits it (WkTextSplit). */
WkStatus convert_process_text(const ChunkContext *ctx, const Input *in, Chunk *c);

/* ---- records (records.c): chunks of Parquet rows and tar samples ------------------------------- */

/* A chunk's data is a run of records: u64 row (within the chunk, from 0), then each field: u8 SlotType, u32
 * length, the bytes. A record has one field (the text) without --column, else convert_record_fields' fields.
 * The reader adds rows; a full chunk is emitted at once. */
typedef enum {
  SLOT_MISSING,      /* the record has no such field */
  SLOT_NULL,         /* a null (Parquet) */
  SLOT_STRING,       /* text (a Parquet string) */
  SLOT_BINARY,       /* bytes that are no text (Parquet binary, the Hugging Face Image struct's bytes) */
  SLOT_MEMBER,       /* a tar member's bytes: text, a number's text (.cls), or bytes */
  SLOT_JSON,         /* a JSON value's text (a Parquet number or boolean, a tar .json member for json.NAME) */
} SlotType;
typedef struct {
  SlotType type;
  const uint8_t *bytes;
  size_t length;
} RecordSlot;

typedef struct {
  uint32_t input;
  ChunkEmit emit;
  void *arg;
  size_t chunk_bytes;   /* a chunk is emitted once its records reach this */
  WkByteVec data;
  uint64_t rows, nulls;
  BadLine *bad;
  size_t bad_count, bad_capacity;
  bool first;
  uint64_t progress, reported;  /* input bytes read so far, and those reported with chunks */
} RecordCutter;

void record_cutter_init(RecordCutter *rc, uint32_t input, size_t chunk_bytes, ChunkEmit emit, void *arg);
WkStatus record_cutter_add(RecordCutter *rc, const RecordSlot *slots, uint32_t count);
WkStatus record_cutter_nulls(RecordCutter *rc, uint64_t count);
/* A row that has no document, for a reason the reader found (reported as file:row: reason). */
WkStatus record_cutter_bad(RecordCutter *rc, const char *reason);
/* Emits what is held (an empty last chunk too, so the input's progress is counted). */
WkStatus record_cutter_flush(RecordCutter *rc, bool last);
void record_cutter_free(RecordCutter *rc);

/* Worker side: each record -> a document (UTF-8 checked; a tar .json member's json_field taken). */
WkStatus convert_process_records(const ChunkContext *ctx, const Input *in, Chunk *c);

/* The readers (producer thread): the chunks of a Parquet file or a WebDataset tar open as blob. */
typedef struct {
  size_t chunk_bytes;        /* records per chunk, in bytes */
  uint64_t max_footer_bytes; /* Parquet: a longer footer is refused */
  uint64_t max_page_bytes;   /* Parquet: a larger page is refused */
  uint64_t max_member_bytes; /* tar: a larger member is refused */
} RecordLimits;
WkStatus convert_cut_parquet(const ChunkContext *ctx, uint32_t i, WkBlob *blob, const RecordLimits *limits,
                             ChunkEmit emit, void *arg);
WkStatus convert_cut_tar(const ChunkContext *ctx, uint32_t i, WkBlob *blob, const RecordLimits *limits, ChunkEmit emit,
                         void *arg);
extern const RecordLimits CONVERT_RECORD_LIMITS;  /* the converter's */

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

/* An input's kind, by its name's suffix (CONVERT_INPUTS). */
InputKind convert_input_kind(const char *path);
/* Whether inputs of the kind hold token ids (.bin, .npy) rather than text. */
static inline bool convert_input_is_tokens(InputKind kind) { return kind == INPUT_TOKENS_BIN || kind == INPUT_TOKENS_NPY; }
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

#endif /* WK_CONVERT_H */
