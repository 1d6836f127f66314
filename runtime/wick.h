/*
 * wick.h — the one public header of libwick.
 *
 * Everything between WK_CDEF_BEGIN and WK_CDEF_END is fed, after the C preprocessor, to LuaJIT's
 * ffi.cdef by a build step (build/lua/wick/cdef.lua), so that region stays FFI-clean: opaque
 * handles, plain structs with explicit sizes, enums instead of #defines, no inline code.
 *
 * Conventions (docs/errors.md):
 *   - every fallible function returns WkStatus (0 = WK_OK) or a handle that is NULL on failure;
 *     the reason is then in wk_last_error() (thread-local, valid until the next failing call);
 *   - argument order is (handle, inputs, outputs, options); out-pointers come last;
 *   - the library never exits, aborts or longjmps on bad input.
 */
#ifndef WICK_H
#define WICK_H

#include <stddef.h>   /* size_t */
#include <stdint.h>   /* int64_t, uint32_t ... */

#ifdef __cplusplus
extern "C" {
#endif

#ifndef WK_API
#define WK_API __attribute__((visibility("default")))
#endif

/* Bumped on any change of the declarations below; Lua refuses a library whose major differs. */
#define WK_VERSION_MAJOR 0
#define WK_VERSION_MINOR 4
#define WK_VERSION_PATCH 0

/* WK_CDEF_BEGIN */

/* ---- status codes and errors ------------------------------------------------------------- */
typedef enum {
  WK_OK = 0,
  WK_ERR_INVALID_ARG = 1,  /* the caller passed something out of range or inconsistent */
  WK_ERR_IO = 2,           /* open/read/write/mmap failed; the message names the path */
  WK_ERR_NOMEM = 3,        /* an allocation failed or a configured budget is exceeded */
  WK_ERR_FORMAT = 4,       /* bad magic, version, checksum or truncation in an input file */
  WK_ERR_TIMEOUT = 5,      /* a wait ran past its deadline (peer, server, queue) */
  WK_ERR_CLOSED = 6,       /* the object was closed or the stream has ended */
  WK_ERR_UNSUPPORTED = 7,  /* a feature not compiled in or not available on this machine */
  WK_ERR_DEVICE = 8,       /* CUDA, cuBLAS or NCCL reported an error */
  WK_ERR_NETWORK = 9,      /* a remote transfer failed after its retries */
  WK_ERR_INTERNAL = 10     /* a broken invariant inside Wick: please report it */
} WkStatus;

WK_API const char *wk_last_error(void);       /* message of the last failure on this thread, "" if none */
WK_API WkStatus wk_last_status(void);         /* status of the last failure on this thread */
WK_API const char *wk_last_error_site(void);  /* "runtime/x/y.c:123" where it was raised */
WK_API void wk_clear_error(void);
WK_API const char *wk_status_name(WkStatus status);  /* "WK_ERR_IO", ... */

/* ---- logging ------------------------------------------------------------------------------ */
typedef enum { WK_LOG_ERROR = 0, WK_LOG_WARN = 1, WK_LOG_INFO = 2, WK_LOG_DEBUG = 3 } WkLogLevel;

WK_API WkLogLevel wk_log_level(void);             /* from WICK_LOG at first use, default warn */
WK_API WkStatus wk_set_log_level(WkLogLevel level);
WK_API WkStatus wk_parse_log_level(const char *name, WkLogLevel *out);
WK_API void wk_log_message(WkLogLevel level, const char *message);  /* no formatting: safe for Lua */

/* ---- version and build ---------------------------------------------------------------------- */
typedef struct {
  uint32_t major, minor, patch;
  uint32_t has_cuda;        /* 1 when the CUDA backend was compiled in */
  const char *compiler;     /* e.g. "gcc 12.2.0" */
  const char *build_flags;  /* e.g. "release" or "asan+ubsan" */
} WkBuildInfo;

WK_API uint32_t wk_version(void);  /* major * 10000 + minor * 100 + patch */
WK_API void wk_build_info(WkBuildInfo *out);
WK_API int wk_cuda_device_count(void);  /* 0 without the CUDA backend, a driver, or a GPU */
/* The GPU of this process (a rank's cuda:LOCAL_RANK): where a thread that has not yet run work on a
 * device makes its pinned memory, so no rank makes a context on GPU 0. Set it before any CUDA work. */
WK_API WkStatus wk_cuda_set_default_device(int device_index);
WK_API int wk_cuda_default_device(void);  /* what the device 'cuda' without an index names; 0 until set */
WK_API uint64_t wk_now_ns(void);         /* CLOCK_MONOTONIC in nanoseconds */

/* Layout of every struct declared here, as C sees it, so Lua can prove its ffi.cdef agrees.
 * field == NULL asks for sizeof(struct); returns -1 for an unknown struct or field. */
WK_API int64_t wk_abi_layout(const char *struct_name, const char *field);

/* ---- TensorBoard event files (runtime/core/tfevents.c) ------------------------------------------ */
/* TFRecords of Event protobufs, as TensorBoard (and W&B's import) read them: a file version record,
 * then one Event per call holding a Summary of simple (float) values. Each record is one write(2):
 * a TensorBoard following the directory sees it at once. */
typedef struct WkEvents WkEvents;

/* Creates dir (its parent must exist) and in it a new events.out.tfevents.<wall_time>.<host>.<pid>,
 * whose first record is the file version. wall_time: seconds since the epoch. NULL on failure. */
WK_API WkEvents *wk_events_open(const char *dir, double wall_time);
WK_API const char *wk_events_path(const WkEvents *w);
/* One Event at step (>= 0) and wall_time whose Summary holds count values (tags non-empty, at most
 * 1024 bytes each). */
WK_API WkStatus wk_events_write_scalars(WkEvents *w, int64_t step, double wall_time, uint32_t count,
                                        const char *const *tags, const float *values);
WK_API WkStatus wk_events_close(WkEvents *w);  /* NULL is fine */
/* Cuts an event file before its first record of a step after `step` (a resumed run writes those steps
 * again), and a partial record at its end (a writer killed mid-record); *removed = whole records cut.
 * A damaged record before the end is WK_ERR_FORMAT naming the file and its offset; a symbolic link or
 * a file of another user is refused (WK_ERR_IO), never cut. */
WK_API WkStatus wk_events_truncate(const char *path, int64_t step, uint64_t *removed);
/* wk_events_truncate of every events.out.tfevents.* file in dir (none when dir is missing). */
WK_API WkStatus wk_events_truncate_dir(const char *dir, int64_t step, uint64_t *removed);
/* CRC-32C (Castagnoli), as TFRecord frames use it (before its mask). */
WK_API uint32_t wk_crc32c(const void *data, size_t length);

/* ---- data: datasets, converter, loader (runtime/dataset, loader, convert) ---------------------- */

/* Datasets: an index (index.json, read at open) plus shards read lazily; format in
 * runtime/format/FORMAT.md. Tokens come out as uint32 whatever the stored width. */
typedef struct WkDataset WkDataset;

typedef struct {
  const char *name;     /* shard file name relative to the dataset directory */
  uint64_t tokens;      /* tokens in the shard's stream, EOS separators included */
  uint64_t documents;   /* documents in the shard */
  uint64_t bytes;       /* shard file size */
} WkShardInfo;

/* path is a dataset directory (holding index.json) or the index file itself: a local path, file://,
 * http://, https:// or s3://bucket/prefix. NULL on failure. Remote datasets are read by range through
 * an on-disk cache shared by the node's processes; wk_dataset_open uses the default options. */
WK_API WkDataset *wk_dataset_open(const char *path);

/* How remote datasets are fetched and cached (runtime/io/remote). Start from the defaults. */
typedef struct {
  const char *cache_dir;        /* NULL: WICK_CACHE_DIR, else $XDG_CACHE_HOME/wick, else $HOME/.cache/wick */
  int64_t cache_disk_bytes;     /* the cache directory's budget, all datasets together (16 GiB; 0 caches
                                   nothing) */
  int64_t prefetch_bytes;       /* read-ahead queued or in transfer at once, per dataset (64 MiB) */
  int64_t max_transfers;        /* parallel transfers per dataset (16) */
  int64_t connect_timeout_ms;   /* a connection not made by then is retried (10 s) */
  int64_t stall_timeout_ms;     /* a transfer that receives nothing this long is cut and retried (30 s) */
  int64_t request_timeout_ms;   /* one request's whole time, all its attempts and the waits between them
                                   (10 min) */
  int64_t retries;              /* attempts after the first, with backoff; 403/404 are never retried (5) */
  int64_t low_speed_bytes_per_s; /* a transfer receiving less than this over a window is cut and retried;
                                    an attempt's deadline is its bytes at this rate plus the connect timeout
                                    and one window (1024) */
  int64_t low_speed_window_ms;  /* the window of low_speed_bytes_per_s (30 s) */
} WkRemoteOptions;
WK_API void wk_remote_options_default(WkRemoteOptions *out);
/* The integer options by number, for their bounds (zstd style, as the other parameter tables). */
typedef enum {
  WK_REMOTE_CACHE_DISK_BYTES = 0,
  WK_REMOTE_PREFETCH_BYTES,
  WK_REMOTE_MAX_TRANSFERS,
  WK_REMOTE_CONNECT_TIMEOUT_MS,
  WK_REMOTE_STALL_TIMEOUT_MS,
  WK_REMOTE_REQUEST_TIMEOUT_MS,
  WK_REMOTE_RETRIES,
  WK_REMOTE_LOW_SPEED_BYTES_PER_S,
  WK_REMOTE_LOW_SPEED_WINDOW_MS,
  WK_REMOTE_PARAM_COUNT
} WkRemoteParam;
WK_API WkStatus wk_remote_param_bounds(WkRemoteParam param, int64_t *min, int64_t *max);
/* wk_dataset_open with remote options (NULL: the defaults); a local dataset ignores them. */
WK_API WkDataset *wk_dataset_open_with(const char *path, const WkRemoteOptions *remote);

/* Counters of a remote dataset's fetches (zeros for a local one). */
typedef struct {
  uint64_t requests;           /* HTTP requests sent, retries and the index check included */
  uint64_t bytes_fetched;      /* response bytes received */
  uint64_t cache_hits;         /* reads served by the on-disk cache */
  uint64_t cache_misses;       /* reads that waited for a download (this process's or a local peer's) */
  uint64_t prefetched;         /* ranges stored ahead of their first read */
  uint64_t prefetch_dropped;   /* read-ahead not fetched: already claimed by a peer, or no room */
  uint64_t retries_connect;    /* by cause: connection errors */
  uint64_t retries_reset;      /* resets and bodies cut short (resumed by Range) */
  uint64_t retries_timeout;    /* stalls and request timeouts */
  uint64_t retries_server;     /* 5xx */
  uint64_t retries_throttle;   /* 429 and 503 with Retry-After */
  uint64_t retries_corrupt;    /* blocks fetched again after a checksum mismatch */
  uint64_t rate_bytes_per_s;   /* download rate over the last second */
  uint64_t wait_ns;            /* time readers waited for the network */
  uint64_t disk_bytes;         /* the cache directory's usage now (every process using it) */
  uint64_t evicted_bytes;      /* evicted by this process to stay within the budget */
} WkRemoteStats;
WK_API void wk_dataset_remote_stats(WkDataset *ds, WkRemoteStats *out);
WK_API void wk_dataset_close(WkDataset *ds);

WK_API const char *wk_dataset_name(const WkDataset *ds);         /* the path it was opened from */
WK_API uint32_t wk_dataset_shard_count(const WkDataset *ds);
WK_API uint64_t wk_dataset_token_count(const WkDataset *ds);     /* all shards */
WK_API uint64_t wk_dataset_document_count(const WkDataset *ds);  /* all shards */
WK_API uint32_t wk_dataset_vocab_size(const WkDataset *ds);
WK_API uint32_t wk_dataset_eos(const WkDataset *ds);             /* the EOS token id separating documents */
WK_API uint32_t wk_dataset_token_bytes(const WkDataset *ds);     /* stored width: 2 or 4 */
WK_API const char *wk_dataset_tokenizer(const WkDataset *ds);    /* "bytes", "gpt2", ... */
/* The identity of the tokenizer that made the ids (wk_tokenizer_fingerprint); 0 when unknown (an index
 * from before it was recorded, made with a tokenizer file). */
WK_API uint64_t wk_dataset_tokenizer_fingerprint(const WkDataset *ds);
/* The ids the converter put around each document's text, from its tokenizer's post_processor (Llama
 * 3's <|begin_of_text|>, BERT's [CLS]): (*ids)[0 .. *prefix) start every document, the *suffix after
 * them end its text, before its EOS. Returns 1 when they were applied, 0 when the converter was told
 * not to (--no-special-tokens: the ids are those it would have put), -1 when the index records none
 * (documents hold their text's ids only: no template, token files, or an index from before). */
WK_API int wk_dataset_template(const WkDataset *ds, const uint32_t **ids, uint32_t *prefix, uint32_t *suffix);
WK_API WkStatus wk_dataset_shard_info(const WkDataset *ds, uint32_t shard, WkShardInfo *out);

/* The shard's token stream is its documents, each followed by one EOS token. Reads tokens
 * [offset, offset+count) of that stream, verifying and decoding every block it touches.
 * Thread-safe. Bad data -> WK_ERR_FORMAT with a message naming the file, the block and the reason. */
WK_API WkStatus wk_dataset_read(WkDataset *ds, uint32_t shard, uint64_t offset, uint64_t count, uint32_t *out);

/* Document doc of a shard spans tokens [*start, *start + *length) of its stream, EOS excluded. */
WK_API WkStatus wk_dataset_document(WkDataset *ds, uint32_t shard, uint64_t doc, uint64_t *start,
                                    uint64_t *length);

/* The document of a shard whose span (or terminating EOS) holds stream token `token`. */
WK_API WkStatus wk_dataset_document_at(WkDataset *ds, uint32_t shard, uint64_t token, uint64_t *doc);

/* Opens the shard now (header, block table and document index verified against the index)
 * instead of at its first read; a cheap way to check a dataset or warm it up. */
WK_API WkStatus wk_dataset_check_shard(WkDataset *ds, uint32_t shard);

/* Columns (format version 2): a dataset's records are the documents of its token stream; column 0 is
 * always `tokens` (that stream), the others hold one value per stream position (TOKEN_U8: EOS positions
 * included, each the value of its record's last token, 0 for an empty record) or per record. A version 1
 * dataset has the tokens column only. */
typedef enum {
  WK_COLUMN_TOKENS = 0,    /* the token stream (u16 or u32 stored) */
  WK_COLUMN_TOKEN_U8 = 1,  /* one byte per stream position, aligned with the tokens (a loss mask) */
  WK_COLUMN_I64 = 2,       /* one int64 per record (a label) */
  WK_COLUMN_F32 = 3,       /* one float per record (a score) */
  WK_COLUMN_TENSOR = 4,    /* one fixed-shape tensor per record: f32, i32, i64 or u8, 1..4 dims */
  WK_COLUMN_BYTES = 5,     /* one blob per record (an encoded image), < 4 GiB */
  WK_COLUMN_KIND_COUNT
} WkColumnKind;
enum { WK_COLUMN_NAME_BYTES = 48, WK_COLUMN_MAX_DIMS = 4, WK_MAX_COLUMNS = 32 };
typedef struct {
  char name[WK_COLUMN_NAME_BYTES];  /* NUL-terminated, [A-Za-z_][A-Za-z0-9_]*, unique in a dataset */
  uint32_t kind;           /* WkColumnKind */
  uint32_t dtype;          /* WkDType of an element: TOKENS U16 or I32 (the stored width); TOKEN_U8 U8; I64 I64;
                              F32 F32; TENSOR its dtype; BYTES U8 */
  uint32_t ndim;           /* TENSOR: 1..4, else 0 */
  uint32_t shape[WK_COLUMN_MAX_DIMS];
  uint64_t element_bytes;  /* bytes of one row (a stream position for TOKENS and TOKEN_U8, a record otherwise); 0
                              for BYTES */
} WkColumnInfo;
/* "tokens", "token_u8", "i64", "f32", "tensor", "bytes" (as index.json, the converter and Lua spell them); "?"
 * out of range. */
WK_API const char *wk_column_kind_name(uint32_t kind);
WK_API uint32_t wk_dataset_column_count(const WkDataset *ds);  /* 1 for a version 1 dataset */
WK_API WkStatus wk_dataset_column_info(const WkDataset *ds, uint32_t column, WkColumnInfo *out);
/* The column of that name; WK_ERR_INVALID_ARG whose message lists the dataset's columns. */
WK_API WkStatus wk_dataset_column_find(const WkDataset *ds, const char *name, uint32_t *column);
/* Rows [first, first + count) of a shard's fixed-width column (TOKEN_U8: stream positions; I64, F32, TENSOR:
 * records; TOKENS: the stored u16 or u32 tokens) into out (count x element_bytes), checksum-verified, through
 * the block cache. A BYTES column is WK_ERR_INVALID_ARG (wk_dataset_read_blob reads it). */
WK_API WkStatus wk_dataset_read_column(WkDataset *ds, uint32_t column, uint32_t shard, uint64_t first,
                                       uint64_t count, void *out);
/* Record `record`'s blob of a BYTES column: *size always; its bytes copied into out when out != NULL and
 * capacity >= size (else WK_ERR_INVALID_ARG saying the blob's size). */
WK_API WkStatus wk_dataset_read_blob(WkDataset *ds, uint32_t column, uint32_t shard, uint64_t record, void *out,
                                     uint64_t capacity, uint64_t *size);

/* Knobs (zstd style): set any time; a smaller budget evicts at the next read. */
typedef enum {
  WK_DATASET_BLOCK_CACHE_BYTES = 0, /* decoded-block cache budget (default 64 MiB; 0 = no cache) */
  WK_DATASET_MAX_OPEN_SHARDS = 1,   /* shards kept open (mapped) at once (default 64, min 1) */
  WK_DATASET_PARAM_COUNT,
  WK_DATASET_CACHE_BYTES = WK_DATASET_BLOCK_CACHE_BYTES  /* its old name, for one release */
} WkDatasetParam;
WK_API WkStatus wk_dataset_set(WkDataset *ds, WkDatasetParam param, int64_t value);
/* What wk_dataset_set accepts for param. */
WK_API WkStatus wk_dataset_param_bounds(WkDatasetParam param, int64_t *min, int64_t *max);
WK_API int64_t wk_dataset_get(const WkDataset *ds, WkDatasetParam param);

typedef struct {
  uint64_t cache_bytes;        /* decoded bytes held by the block cache now */
  uint64_t cache_peak_bytes;   /* the most it ever held */
  uint64_t cache_budget;       /* its budget */
  uint64_t cache_hits;
  uint64_t cache_misses;
  uint64_t blocks_decoded;     /* zstd blocks decompressed (cached or not) */
  uint64_t blocks_verified;    /* block checksums computed */
  uint64_t open_shards;        /* shards open now */
} WkDatasetStats;
WK_API void wk_dataset_stats(WkDataset *ds, WkDatasetStats *out);

/* The counter-based permutations the sample order is made of, for tools that reason about orders:
 * wk_permute is a bijection of [0, n) keyed by key (a Feistel network with cycle walking), wk_mix64 the
 * 64-bit mixing every key is derived with. */
WK_API uint64_t wk_permute(uint64_t key, uint64_t n, uint64_t i);
WK_API uint64_t wk_mix64(uint64_t a, uint64_t b);

/* ---- tokenizers (runtime/tokenizer/) ----------------------------------------------------------- */

/* Text <-> token ids. A Hugging Face tokenizer.json with a BPE model, byte-level (GPT-2, Llama 3, Qwen
 * style) or SentencePiece-style (Llama 2, Mistral, Gemma), or a Unigram model (T5), a tiktoken rank
 * file (r50k/gpt2, p50k, cl100k, o200k), or the built-in "bytes". Encoding is thread-safe; free a
 * tokenizer after the threads that encoded with it are done. */
typedef struct WkTokenizer WkTokenizer;

/* source: "bytes", a tokenizer.json, or a .tiktoken rank file. pattern: the encoding of a rank file
 * ("r50k" (= "gpt2"), "p50k", "cl100k", "o200k"), NULL to take it from the file's name
 * (cl100k_base.tiktoken); NULL for the others. NULL on failure, with a message naming the file and
 * the unsupported component or the bad line. */
WK_API WkTokenizer *wk_tokenizer_open(const char *source, const char *pattern);
WK_API void wk_tokenizer_free(WkTokenizer *t);
WK_API const char *wk_tokenizer_name(const WkTokenizer *t);       /* "bytes", "llama3/tokenizer.json", ... */
WK_API uint32_t wk_tokenizer_vocab_size(const WkTokenizer *t);     /* every id is below it */
WK_API uint32_t wk_tokenizer_eos(const WkTokenizer *t);            /* 0xFFFFFFFF when it names none */
WK_API uint64_t wk_tokenizer_fingerprint(const WkTokenizer *t);    /* identity: a hash of the file (+ pattern) */

typedef enum {
  WK_TOKENIZER_SPECIAL = 0,  /* 1: special tokens written in text become their ids; 0 (default): plain
                                text, as tiktoken's encode_ordinary */
  WK_TOKENIZER_EOS = 1,      /* the EOS id (default: tokenizer_config.json's eos_token beside a
                                tokenizer.json, else a token named <|endoftext|>, <|end_of_text|>, </s>) */
  WK_TOKENIZER_ADD_SPECIAL_TOKENS = 2, /* 1 (default): encoding puts the tokenizer.json post_processor's
                                tokens around the text (Llama 3's <|begin_of_text|>, BERT's [CLS] and
                                [SEP]), as Hugging Face's encode(text, add_special_tokens=True); 0: not */
  WK_TOKENIZER_PARAM_COUNT
} WkTokenizerParam;
WK_API WkStatus wk_tokenizer_set(WkTokenizer *t, WkTokenizerParam param, int64_t value);
/* What wk_tokenizer_set accepts for param on t (EOS: its vocabulary), or on any tokenizer when t is NULL. */
WK_API WkStatus wk_tokenizer_param_bounds(const WkTokenizer *t, WkTokenizerParam param, int64_t *min, int64_t *max);

/* The ids the post_processor puts around a text: (*ids)[0 .. *prefix) before it, then *suffix after
 * it (0 and 0: none; whether encoding adds them is WK_TOKENIZER_ADD_SPECIAL_TOKENS). *ids lives as
 * long as t. */
WK_API void wk_tokenizer_template(const WkTokenizer *t, const uint32_t **ids, uint32_t *prefix, uint32_t *suffix);

/* The token that is exactly these bytes (an added or special token, or a vocabulary entry), or
 * 0xFFFFFFFF. */
WK_API uint32_t wk_tokenizer_token_id(const WkTokenizer *t, const char *text, size_t length);

/* UTF-8 text -> ids in out[0 .. *count), with the template's around them (WK_TOKENIZER_ADD_SPECIAL_TOKENS).
 * When they do not fit in capacity, WK_ERR_INVALID_ARG with *count = how many there are (2 * length + 1
 * plus the template's fits unless NFC lengthens the text). Invalid UTF-8 is WK_ERR_FORMAT. */
WK_API WkStatus wk_tokenizer_encode(const WkTokenizer *t, const char *text, size_t length, uint32_t *out,
                                    size_t capacity, size_t *count);
/* ids -> the bytes they stand for (UTF-8 when the ids came from text and are whole), in
 * out[0 .. *length); too small a capacity is WK_ERR_INVALID_ARG with *length = the size needed. */
WK_API WkStatus wk_tokenizer_decode(const WkTokenizer *t, const uint32_t *tokens, size_t count, char *out,
                                    size_t capacity, size_t *length);

/* JSONL <-> JSONL on all cores, output in input order (run -m wick.data.tokenize): encoding reads the
 * string member `field` of each line's object and writes one JSON array of ids per line; decoding
 * reads one array per line and writes {"<field>": "text"} (bytes that are not UTF-8 become U+FFFD,
 * as Python's decode(errors="replace") does). input and output are paths, "-" for stdin / stdout.
 * A bad line fails the run with "file:line: reason". */
typedef struct {
  uint64_t lines;        /* lines read */
  uint64_t text_bytes;   /* bytes of text encoded or decoded (UTF-8) */
  uint64_t tokens;       /* ids written or read */
  double seconds;        /* wall time of the run */
  double cpu_seconds;    /* CPU time of the workers, summed */
  uint32_t threads;      /* workers used */
} WkTokenizeStats;

WK_API WkStatus wk_tokenize_jsonl(const WkTokenizer *t, const char *input, const char *output, const char *field,
                                  int decode, int threads, WkTokenizeStats *stats);
/* What wk_tokenize_jsonl accepts for its parameters (threads: 0 for all CPUs). */
typedef enum { WK_TOKENIZE_THREADS = 0, WK_TOKENIZE_PARAM_COUNT } WkTokenizeParam;
WK_API WkStatus wk_tokenize_param_bounds(WkTokenizeParam param, int64_t *min, int64_t *max);

/* Converter: the input formats of wk_converter_input_format (text, JSONL, llm.c/nanoGPT tokens, Parquet,
 * WebDataset tar, ...) -> a dataset directory. Deterministic: the same inputs give byte-identical shards
 * and index whatever the thread count. */
typedef struct WkConverter WkConverter;

/* The i-th input format, in the order a file's name is tried against them: its names ("*.jsonl, *.ndjson";
 * the last one is "anything else": text) and, in *reads, what the converter reads from such a file. NULL
 * past the end. */
WK_API const char *wk_converter_input_format(uint32_t i, const char **reads);

typedef enum {
  WK_CONVERT_THREADS = 0,       /* worker threads (default: online CPUs, at most 64) */
  WK_CONVERT_SHARD_TOKENS = 1,  /* a shard is closed after the document that reaches this (default 2^26) */
  WK_CONVERT_BLOCK_TOKENS = 2,  /* tokens per block (default 65536) */
  WK_CONVERT_COMPRESSION = 3,   /* 0 none (raw, mmap-able), 1 zstd (default) */
  WK_CONVERT_LEVEL = 4,         /* zstd level (default 3) */
  WK_CONVERT_STRICT = 5,        /* 1: the first bad line or document fails the conversion */
  WK_CONVERT_PROGRESS = 6,      /* 1: draw a progress bar on stderr */
  WK_CONVERT_RESUME = 7,        /* 1: keep shards already in the output that hold exactly the tokens
                                   this run would write there (an interrupted run resumes) */
  WK_CONVERT_TEXT_SPLIT = 8,    /* a WkTextSplit: how text files become documents (default FILE) */
  WK_CONVERT_HEADERLESS_BIN = 9, /* 1: .bin inputs are nanoGPT's uint16 tokens without a header; 0 (default):
                                   llm.c files, and a file without llm.c's magic is refused */
  WK_CONVERT_VOCAB_SIZE = 10,   /* token files (.bin, .npy) hold ids of a vocabulary of this size, whose EOS is
                                   WK_CONVERT_EOS (the index's tokenizer is then "ids"); 0 (default): .bin files
                                   hold GPT-2's, and .npy files must declare theirs */
  WK_CONVERT_EOS = 11,          /* the EOS id separating documents in token files, with WK_CONVERT_VOCAB_SIZE
                                   (-1: not declared) */
  WK_CONVERT_NO_TEXT = 12,      /* 1: records have no text (images and labels): each is its columns and its EOS
                                   alone; needs a column (wk_converter_add_column) and no tokens column. 0 (default):
                                   a record without its text field is a bad row */
  WK_CONVERT_PARAM_COUNT
} WkConvertParam;

typedef enum {
  WK_TEXT_SPLIT_FILE = 0,       /* the whole file is one document */
  WK_TEXT_SPLIT_PARAGRAPH = 1,  /* each run of non-blank lines is one (blank lines dropped) */
  WK_TEXT_SPLIT_LINE = 2        /* each non-blank line is one (its newline dropped) */
} WkTextSplit;

typedef struct {
  uint64_t inputs;          /* input files */
  uint64_t input_bytes;     /* bytes read from them (compressed size for .zst) */
  uint64_t documents;       /* documents written */
  uint64_t tokens;          /* tokens written, EOS included */
  uint64_t shards;
  uint64_t output_bytes;
  uint64_t bad;             /* bad lines/documents skipped */
  uint64_t empty;           /* empty documents skipped */
  double seconds;
  uint64_t reused;          /* shards kept from an earlier run (WK_CONVERT_RESUME) */
  uint64_t nulls;           /* null rows (Parquet) skipped */
} WkConvertStats;

/* tokenizer: "bytes" (default for text when NULL), "gpt2" (pre-tokenized .bin inputs only; their
 * default), or a tokenizer.json / .tiktoken file, opened here (a bad file fails here). The index
 * records its name, fingerprint, vocabulary and EOS; text needs a tokenizer with an EOS. */
WK_API WkConverter *wk_converter_new(const char *out_dir, const char *tokenizer);
/* Encodes with t instead (one opened with options: wk_tokenizer_set), borrowed: keep it open until
 * the run returns. NULL goes back to the default. */
WK_API WkStatus wk_converter_use_tokenizer(WkConverter *cv, const WkTokenizer *t);
WK_API void wk_converter_free(WkConverter *cv);
WK_API WkStatus wk_converter_set(WkConverter *cv, WkConvertParam param, int64_t value);
/* What wk_converter_set accepts for param (zstd style: ZSTD_cParam_getBounds). */
WK_API WkStatus wk_converter_param_bounds(WkConvertParam param, int64_t *min, int64_t *max);
/* Its default (THREADS: 0, the online CPUs counted when a converter is made). */
WK_API WkStatus wk_converter_param_default(WkConvertParam param, int64_t *value);
/* The text of each document, default "text": the string member of a .jsonl line, the column of a
 * .parquet file, the member extension of a WebDataset .tar sample ("txt", or "json": see below). */
WK_API WkStatus wk_converter_set_field(WkConverter *cv, const char *field);
/* The string member of a tar sample's .json member when the field is "json" (default "text"). */
WK_API WkStatus wk_converter_set_json_field(WkConverter *cv, const char *field);
/* A column of the dataset filled from a field of each record, "NAME=FIELD:KIND" (the command line's --column):
 * KIND tokens (NAME tokens: the token stream from a string, tokenized, or a list of ids; without it the
 * --field text is), mask (a list aligned with the tokens, Hugging Face labels: -100 -> 0, else 1), token_u8
 * (a list of 0..255 aligned with the tokens), i64, f32, bytes (a string's, binary's or tar member's bytes), or
 * a tensor DTYPE[d0,...] (f32, i32, i64, u8; nested lists). A record whose field does not fit is a bad line.
 * JSONL, Parquet and tar inputs; a text file has only its text (the --field). Call before the run. */
WK_API WkStatus wk_converter_add_column(WkConverter *cv, const char *spec);
/* Comma-separated fnmatch globs ("*.py,*.txt") a file found in a directory must match to be read
 * (files named directly always are); NULL or "" for all. Applies to inputs added after it. */
WK_API WkStatus wk_converter_set_include(WkConverter *cv, const char *patterns);
/* A file, or a directory walked recursively in byte-wise sorted order (hidden entries skipped). */
WK_API WkStatus wk_converter_add_input(WkConverter *cv, const char *path);
WK_API WkStatus wk_converter_run(WkConverter *cv);
WK_API void wk_converter_stats(const WkConverter *cv, WkConvertStats *out);
/* The i-th reported bad line as "file:line: reason" (the first 1000 are kept), NULL past the end. */
WK_API const char *wk_converter_bad_line(const WkConverter *cv, uint64_t i);

/* The loader: sources -> order -> mix -> packed rows, on C threads, into a bounded ring of batches.
 * Configure with wk_loader_set and wk_loader_add_source, optionally wk_loader_restore a cursor,
 * then wk_loader_start and call wk_loader_next once per micro-batch. */
typedef struct WkLoader WkLoader;

typedef enum {
  WK_LOADER_SEQ_LEN = 0,       /* tokens per sample minus one (default 1024) */
  WK_LOADER_GLOBAL_BATCH,      /* samples per optimizer step over all ranks (default 8) */
  WK_LOADER_MICRO_BATCH,       /* rows per wk_loader_next on this rank (default: global / world) */
  WK_LOADER_WORLD_SIZE,        /* ranks sharing the stream (default 1) */
  WK_LOADER_RANK,              /* this rank (default 0) */
  WK_LOADER_SEED,              /* shuffle seed (default 0) */
  WK_LOADER_SHUFFLE,           /* 1: hierarchical shuffle, 0: stored order (default 1) */
  WK_LOADER_WINDOW_TOKENS,     /* shards holding this many tokens have their units permuted together (2^29) */
  WK_LOADER_POOL_TOKENS,       /* the shuffle pool: units holding this many tokens have their samples
                                  shuffled together, the working set (default 2^22) */
  WK_LOADER_PARTITIONS,        /* canonical partitions, e.g. the number of nodes (default 1) */
  WK_LOADER_CHUNK,             /* draws per partition turn, e.g. global / partitions (default 1) */
  WK_LOADER_MODE,              /* 0 packed windows, 1 one padded document per row (default 0) */
  WK_LOADER_THREADS,           /* reader threads (default 2) */
  WK_LOADER_PREFETCH,          /* micro-batches buffered ahead (default 4 x (threads + 1)) */
  WK_LOADER_ON_CORRUPT,        /* 0 error, 1 skip: mask the sample, count and log it (default 0) */
  WK_LOADER_PAD_LAST,          /* at the end of finite sources: 1 pad the last batch, 0 drop it */
  WK_LOADER_DOCUMENT_IDS,      /* 1: also fill doc_ids and positions (default 0) */
  WK_LOADER_MEMORY_BUDGET,     /* bytes for the batch ring; 0: no limit (default 0) */
  WK_LOADER_NODE_CACHE_BYTES,  /* node cache of decoded units per source, shared by the node's local
                                  ranks (default 64 MiB; at least two buffers plus a window's edges); a
                                  unit holds the per-token columns asked for too, a byte a token each */
  WK_LOADER_DTYPE,             /* tokens as WK_I32 (default) or WK_I64 (written so by the reader threads) */
  WK_LOADER_DEVICE,            /* WK_LOADER_ON_CPU: CPU tensors over the pinned ring (default); N: tensors on
                                  cuda:N, copied from the ring on the loader's copy stream (refused when this
                                  machine has no such device) */
  WK_LOADER_MIXED_TOKENIZERS,  /* 1: sources whose ids come from different tokenizers (fingerprint, vocabulary
                                  or EOS), or with different tokens around their documents (the template the
                                  converter applied), may be mixed; 0 (default): start refuses such a mix,
                                  naming both */
  WK_LOADER_BLOB_BYTES,        /* bytes a row holds of a BYTES column (default 1 MiB); a larger blob fails the
                                  batch, naming the file and the record */
  WK_LOADER_PARAM_COUNT,
  WK_LOADER_CACHE_BYTES = WK_LOADER_NODE_CACHE_BYTES,  /* old names, for one release */
  WK_LOADER_BUFFER_TOKENS = WK_LOADER_POOL_TOKENS
} WkLoaderParam;

enum { WK_LOADER_ON_CPU = -1 };  /* WK_LOADER_DEVICE for CPU tensors */
enum { WK_BATCH_MAX_COLUMNS = 8 }; /* columns a loader may add (wk_loader_add_column) */

/* A micro-batch as tensors of the loader (wk_tensor_* reads them; never free them): made once per
 * slot of its ring, on its device (WK_LOADER_DEVICE), so `slot` names the same tensors every time.
 * They stay valid until the next wk_loader_next that starts another step (the micro-batches of one
 * step can be held together), and until wk_loader_free; a view of them keeps their memory alive
 * but not their contents. On a device they are ready for work queued on the calling thread's
 * current stream (it waits for the copy; the host does not). */
typedef struct {
  struct WkTensor *tokens;     /* [rows, seq_len + 1] i32 or i64 (WK_LOADER_DTYPE) */
  struct WkTensor *inputs;     /* tokens[:, :-1], a view: the model's input ids */
  struct WkTensor *targets;    /* tokens[:, 1:], a view: the next-token targets */
  struct WkTensor *loss_mask;  /* u8 [rows, seq_len]: 1 where targets[:, t] counts */
  struct WkTensor *doc_ids;    /* i32 [rows, seq_len + 1] or NULL (WK_LOADER_DOCUMENT_IDS) */
  struct WkTensor *positions;  /* i32 [rows, seq_len + 1] or NULL */
  /* The columns asked for (wk_loader_add_column), in that order: TOKEN_U8 u8 [rows, seq_len + 1] aligned
   * with tokens (0 past a row's sample); I64 i64 [rows]; F32 f32 [rows]; TENSOR [rows, shape...] of its
   * dtype; BYTES u8 [rows, WK_LOADER_BLOB_BYTES] (the blob, then zeros) with column_sizes[i] i64 [rows]
   * (its bytes), NULL for the other kinds. A padding or skipped row is zeros. */
  uint32_t column_count;
  struct WkTensor *columns[WK_BATCH_MAX_COLUMNS];
  struct WkTensor *column_sizes[WK_BATCH_MAX_COLUMNS];
  uint32_t slot;         /* the ring slot these tensors belong to: 0 .. buffers - 1 */
  uint32_t rows;
  uint32_t seq_len;
  uint64_t step;         /* global step this micro-batch belongs to */
  uint32_t micro_step;   /* 0 .. micro_steps - 1 */
  uint32_t micro_steps;  /* accumulation steps per global step on this world size */
  uint64_t fingerprint;  /* hash of the sample identities of the whole global batch of `step` */
  uint64_t wait_ns;      /* how long this call waited for the batch (data stall) */
} WkBatch;

typedef enum { WK_SAMPLE_OK = 0, WK_SAMPLE_SKIPPED = 1, WK_SAMPLE_PADDING = 2 } WkSampleStatus;

typedef struct {
  uint32_t source;       /* index of the source in the order added */
  uint32_t shard;
  uint64_t offset;       /* first token in the shard's stream */
  uint64_t length;       /* tokens taken */
  uint64_t epoch;        /* of the source */
  uint64_t token_hash;   /* XXH3-64 of the row's tokens (in the loader's dtype) */
  uint32_t status;       /* WkSampleStatus: skipped = corrupt data, masked; padding = end of stream */
} WkSampleInfo;

typedef struct {
  uint64_t batches;        /* micro-batches returned */
  uint64_t wait_ns;        /* total time next() waited */
  uint64_t skipped;        /* corrupt samples masked */
  uint64_t buffers;        /* micro-batches in the ring */
  uint64_t buffer_bytes;   /* bytes of one micro-batch buffer */
  /* Decode amplification = decoded / delivered (stored bytes of the tokens and the per-token columns
   * asked for, all sources): ~1.0 when every unit is decoded once. node_* count every local rank sharing
   * the node caches. */
  uint64_t decoded_bytes, delivered_bytes;
  uint64_t node_decoded_bytes, node_delivered_bytes;
  uint64_t node_private_decodes;  /* units the node's slowest reader decoded outside a full cache */
  uint64_t node_edges_saved, node_edges_used, node_edges_missing, node_edges_dropped;
  uint64_t node_waits;     /* reads that waited for another rank's decode or for room */
  uint64_t node_steals;    /* slots the slowest rank took from units needed later (re-decoded then) */
  WkRemoteStats remote;    /* remote sources' fetches, summed (disk_bytes: the largest cache's usage) */
} WkLoaderStats;

WK_API WkLoader *wk_loader_new(void);
WK_API void wk_loader_free(WkLoader *loader);
WK_API WkStatus wk_loader_set(WkLoader *loader, WkLoaderParam param, int64_t value);
WK_API WkStatus wk_loader_param_bounds(WkLoaderParam param, int64_t *min, int64_t *max);
/* Its default (0 for MICRO_BATCH and PREFETCH: derived at start). */
WK_API WkStatus wk_loader_param_default(WkLoaderParam param, int64_t *value);
/* How remote sources added after this are fetched and cached (copied, cache_dir too; NULL: the defaults). */
WK_API WkStatus wk_loader_set_remote(WkLoader *loader, const WkRemoteOptions *remote);
/* max_epochs 0: the source starts a new epoch (new shuffle) whenever it runs out. */
WK_API WkStatus wk_loader_add_source(WkLoader *loader, const char *path, uint64_t max_epochs, uint32_t *index);
/* Piecewise-linear weight over steps (points sorted by step); one point = a constant. */
WK_API WkStatus wk_loader_set_weight(WkLoader *loader, uint32_t source, const double *steps,
                                     const double *weights, uint32_t points);
WK_API WkStatus wk_loader_restore(WkLoader *loader, const char *cursor);
/* Asks for a column of every source by name (before start); the batch then carries it, in the order
 * asked (WkBatch.columns). Start refuses a source without it (naming the source's columns), sources
 * that disagree on its kind, dtype or shape, and a per-record column (I64, F32, TENSOR, BYTES) in packed
 * mode. A TOKEN_U8 column named "loss_mask" also folds into the batch's loss_mask: a target counts
 * where the pack counts it and the column is not 0 at the target's position. */
WK_API WkStatus wk_loader_add_column(WkLoader *loader, const char *name);
WK_API WkStatus wk_loader_start(WkLoader *loader);
/* What wk_loader_start would refuse (the batch shape, a source too small for one epoch, the cursor,
 * a source cache too small for the ring), found without allocating the ring or starting a thread: a
 * dry run's check. *ring_bytes: the memory the ring of micro-batches would take. */
WK_API WkStatus wk_loader_check(WkLoader *loader, uint64_t *ring_bytes);
/* The next micro-batch of this rank (see WkBatch for how long it stays valid). WK_ERR_CLOSED at the end. */
WK_API WkStatus wk_loader_next(WkLoader *loader, WkBatch *out);
/* The tensor fields (and slot) of ring slot `slot` (0 .. WkLoaderStats.buffers - 1), the very tensors
 * wk_loader_next hands out with that slot: for a binding that makes its handles on them once, at
 * start. Their contents are whatever the slot last held. Known once the loader has started. */
WK_API WkStatus wk_loader_slot(WkLoader *loader, uint32_t slot, WkBatch *out);
/* Cursor after the last batch returned by wk_loader_next (text, a few hundred bytes). */
WK_API WkStatus wk_loader_state(WkLoader *loader, char *buffer, size_t capacity, size_t *length);
WK_API WkStatus wk_loader_sample_info(WkLoader *loader, uint32_t row, WkSampleInfo *out);
WK_API WkStatus wk_loader_source_epoch_length(WkLoader *loader, uint32_t source, uint64_t *out);
/* What a model needs from the data, read from the sources' indexes (no start needed): the largest
 * vocabulary of the sources (every token id is below it) and the EOS id that pads rows (the first
 * source's). WK_ERR_INVALID_ARG for a loader without sources. */
WK_API WkStatus wk_loader_vocab(const WkLoader *loader, uint32_t *vocab_size, uint32_t *eos);
WK_API uint32_t wk_loader_source_count(const WkLoader *loader);
/* Samples drawn from a source for the batches returned so far, as the cursor counts them (a restored
 * cursor's included): the realized proportions of a mix. Known once the loader has started. */
WK_API WkStatus wk_loader_source_draws(WkLoader *loader, uint32_t source, uint64_t *out);
WK_API void wk_loader_stats(WkLoader *loader, WkLoaderStats *out);
/* Audit mode: from now on, appends one line per sample returned by wk_loader_next to path:
 * "step=S micro=M rank=R row=I id=SOURCE:SHARD:OFFSET epoch=E hash=H status=ok|skipped|padding".
 * Lines of several ranks can share one file (appends of whole lines). */
WK_API WkStatus wk_loader_audit(WkLoader *loader, const char *path);

/* ---- tensors and ops (runtime/tensor, runtime/ops) --------------------------------------------- */

/* A tensor is (storage, dtype, shape, strides, offset, device). Storage is reference-counted: views
 * share it, and it is freed with the last tensor that uses it. Shapes and strides are in elements.
 * Ops take contiguous tensors unless said otherwise; wk_tensor_copy makes a strided view contiguous. */
typedef enum {
  WK_F32 = 0, WK_BF16 = 1, WK_F16 = 2, WK_I32 = 3, WK_I64 = 4, WK_U16 = 5, WK_U8 = 6,
  WK_DTYPE_COUNT = 7
} WkDType;

typedef enum { WK_DEVICE_CPU = 0, WK_DEVICE_CUDA = 1 } WkDeviceType;

enum { WK_MAX_DIMS = 8 };

typedef struct WkTensor WkTensor;
typedef struct WkStream WkStream;
typedef struct WkEvent WkEvent;

/* Counters of one device's allocator; the CUDA caching allocator proves steady-state training never
 * calls cudaMalloc by a device_allocs count that stops growing. */
typedef struct {
  uint64_t bytes_in_use;   /* held by live storages */
  uint64_t bytes_cached;   /* freed by tensors, kept for reuse (CUDA only) */
  uint64_t device_allocs;  /* calls to the underlying allocator (posix_memalign or cudaMalloc) */
  uint64_t cache_hits;     /* allocations served from the cache */
  uint64_t bytes_peak;     /* the most bytes_in_use since the last wk_allocator_reset_peak */
} WkAllocatorStats;

WK_API const char *wk_dtype_name(WkDType dtype);  /* "f32", "bf16", ...; "?" when out of range */
WK_API size_t wk_dtype_size(WkDType dtype);       /* bytes per element, 0 when out of range */

/* New contiguous tensor, uninitialised. device_index is ignored for the CPU. NULL on failure. */
WK_API WkTensor *wk_tensor_empty(WkDType dtype, int ndim, const int64_t *shape, WkDeviceType device,
                                 int device_index);
/* Same, in page-locked host memory (fast async copies) when CUDA is usable, else ordinary memory. */
WK_API WkTensor *wk_tensor_empty_pinned(WkDType dtype, int ndim, const int64_t *shape);
/* A contiguous CPU tensor over memory Wick does not own (another library's buffer): no copy, and
 * freeing the tensor leaves the memory alone, so the caller keeps it alive while the tensor is used. */
WK_API WkTensor *wk_tensor_borrow(void *data, WkDType dtype, int ndim, const int64_t *shape);
/* A view of t's storage: offset and strides in elements, checked against the storage's extent. */
WK_API WkTensor *wk_tensor_view(const WkTensor *t, int64_t offset, int ndim, const int64_t *shape,
                                const int64_t *strides);
/* A new handle with t's dtype, shape, strides and offset, holding its own reference to t's storage:
 * how a binding owns a tensor that C code owns (a loader batch's). NULL on failure. */
WK_API WkTensor *wk_tensor_share(const WkTensor *t);
WK_API void wk_tensor_free(WkTensor *t);  /* NULL is fine */

WK_API WkDType wk_tensor_dtype(const WkTensor *t);
WK_API WkDeviceType wk_tensor_device(const WkTensor *t);
WK_API int wk_tensor_device_index(const WkTensor *t);
WK_API int wk_tensor_ndim(const WkTensor *t);
WK_API int64_t wk_tensor_size(const WkTensor *t, int dim);
WK_API int64_t wk_tensor_stride(const WkTensor *t, int dim);
WK_API int64_t wk_tensor_offset(const WkTensor *t);
WK_API int64_t wk_tensor_numel(const WkTensor *t);
WK_API int wk_tensor_is_contiguous(const WkTensor *t);
WK_API void *wk_tensor_data(const WkTensor *t);  /* address of element 0 (device address on CUDA) */
WK_API int wk_tensor_same_storage(const WkTensor *a, const WkTensor *b);

/* dst = src converted to dst's dtype, across devices; src may be strided, dst must be contiguous.
 * With a stream, device copies are queued on it (asynchronous for pinned host memory). */
WK_API WkStatus wk_tensor_copy(WkTensor *dst, const WkTensor *src);
WK_API WkStatus wk_tensor_copy_async(WkTensor *dst, const WkTensor *src, WkStream *stream);
/* Debug element access by flat index into a CPU tensor's logical (row-major) order, as a double. */
WK_API WkStatus wk_tensor_get(const WkTensor *t, int64_t index, double *out);
WK_API WkStatus wk_tensor_set(WkTensor *t, int64_t index, double value);

WK_API void wk_allocator_stats(WkDeviceType device, int device_index, WkAllocatorStats *out);
WK_API void wk_allocator_reset_peak(WkDeviceType device, int device_index);  /* bytes_peak = bytes_in_use */
WK_API WkStatus wk_cuda_empty_cache(int device_index);  /* returns cached blocks to the driver */

/* Streams and events order work on a CUDA device; on the CPU they are synchronous no-ops. Ops run
 * on the calling thread's current stream (NULL: the device's default stream). */
WK_API WkStream *wk_stream_new(WkDeviceType device, int device_index);
WK_API void wk_stream_free(WkStream *stream);
WK_API WkStatus wk_stream_synchronize(WkStream *stream);
WK_API void wk_stream_set_current(WkStream *stream);
WK_API WkEvent *wk_event_new(WkDeviceType device, int device_index);
WK_API void wk_event_free(WkEvent *event);
WK_API WkStatus wk_event_record(WkEvent *event, WkStream *stream);
WK_API WkStatus wk_event_synchronize(WkEvent *event);
WK_API WkStatus wk_stream_wait_event(WkStream *stream, WkEvent *event);
WK_API WkStatus wk_device_synchronize(WkDeviceType device, int device_index);

/* Ops. Float tensors are f32 unless noted; index tensors i32; a loss mask is u8 (1 = counted).
 * Gradient outputs of *_backward are ACCUMULATED (+=), so residual branches and gradient
 * accumulation need no extra adds; zero them with wk_op_fill first. Letters: B batch, T time,
 * C channels, V vocabulary, NH heads, N = B*T rows. */
WK_API WkStatus wk_op_fill(WkTensor *t, double value);               /* any dtype, contiguous */
WK_API WkStatus wk_op_scale(WkTensor *t, float alpha);               /* t *= alpha */
WK_API WkStatus wk_op_add(WkTensor *out, const WkTensor *a, const WkTensor *b);  /* out = a + b */
WK_API WkStatus wk_op_axpy(WkTensor *y, float alpha, const WkTensor *x);         /* y += alpha x */
/* Rounds f32 values in place to the nearest dtype value (bf16 or f16), as a store and load would. */
WK_API WkStatus wk_op_round(WkTensor *t, WkDType dtype);
/* *out = sum of squares in double; +inf or nan when t holds an inf or nan (overflow detection). */
WK_API WkStatus wk_op_sumsq(const WkTensor *t, double *out);
/* Normal(mean, std) values from a counter-based generator: same seed, same values on any device. */
WK_API WkStatus wk_op_normal(WkTensor *t, uint64_t seed, float mean, float std);

/* A step's status: what its embedding and cross-entropy ops find, kept where they run, so that a
 * step on a GPU has no host sync inside it. Both ops check every index against the vocabulary. Given
 * no status they report a bad one at once (on a GPU: a flag read back, a host sync per call). Given
 * one, a tensor of sizeof(WkStepStatus) u8 on their device that is zeroed when the step starts
 * (wk_op_fill), they mark the first bad index there and go on (zeros for its row; the backward ops
 * skip ids outside the table), and cross-entropy adds its loss sum there: wk_op_step_status reads it
 * once, after the step's last backward, before the update. */
typedef struct {
  double loss_sum;                 /* every cross-entropy's, added in the order they ran */
  uint64_t bad_token, bad_target;  /* 0, or the mark of the first bad embedding id or target */
  int64_t token_limit, target_limit;  /* the vocabulary the bad one was checked against */
} WkStepStatus;
/* Reads a step's status (a host sync on a GPU): *loss_sum (may be NULL) gets its sum; a bad index
 * marked in it gives the error its op would have given at once. */
WK_API WkStatus wk_op_step_status(const WkTensor *status, double *loss_sum);

/* out[B,T,C] = wte[idx[b,t]] + wpe[t]; status may be NULL (see WkStepStatus). */
WK_API WkStatus wk_op_embedding(WkTensor *out, const WkTensor *idx, const WkTensor *wte,
                                const WkTensor *wpe, WkTensor *status);
WK_API WkStatus wk_op_embedding_backward(WkTensor *dwte, WkTensor *dwpe, const WkTensor *dout,
                                         const WkTensor *idx);
/* Over the last dim C; mean and rstd [N] are saved for the backward. */
WK_API WkStatus wk_op_layernorm(WkTensor *out, WkTensor *mean, WkTensor *rstd, const WkTensor *inp,
                                const WkTensor *weight, const WkTensor *bias, float eps);
/* A residual add and the layernorm after it, in one pass over the rows (llm.c's fused residual
 * forward): sum = a + b, rounded to the activation dtype as wk_op_add rounds it, then out, mean and
 * rstd the layernorm of that rounded sum: the very values of wk_op_add then wk_op_layernorm. */
WK_API WkStatus wk_op_add_layernorm(WkTensor *sum, WkTensor *out, WkTensor *mean, WkTensor *rstd,
                                    const WkTensor *a, const WkTensor *b, const WkTensor *weight,
                                    const WkTensor *bias, float eps);
WK_API WkStatus wk_op_layernorm_backward(WkTensor *dinp, WkTensor *dweight, WkTensor *dbias,
                                         const WkTensor *dout, const WkTensor *inp,
                                         const WkTensor *weight, const WkTensor *mean,
                                         const WkTensor *rstd);
/* The next token from the logits row[0 .. vocab) (f32, host memory): temperature 0 takes the most
 * likely (the first of equals, as transformers' greedy generate); else softmax(row / temperature)
 * over the top_k most likely (0: all), cut to the smallest prefix whose probability reaches top_p,
 * and drawn with u in [0, 1). order and weights: the caller's scratch of vocab entries each, made
 * once for a whole generation (NULL at temperature 0). *out gets the id. */
WK_API WkStatus wk_sample_token(const float *row, int64_t vocab, double temperature, int64_t top_k, double top_p,
                                double u, int32_t *order, double *weights, int32_t *out);
/* The CPU's products run on OpenBLAS, which picks its kernels by CPU model when it loads: a CPU it
 * does not know (a VM's "Intel Xeon Processor") gets its SSE3 "Prescott" kernels, a third of the
 * speed of the AVX-512 ones on such a machine. wk_blas_kernels: the kernels it picked;
 * wk_blas_better_kernels: the OPENBLAS_CORETYPE this CPU's features run faster ("SkylakeX" for
 * AVX-512, "Haswell" for AVX2 and FMA) when it fell back to pre-AVX2 kernels, else NULL (also when
 * OPENBLAS_CORETYPE is set: the user's choice stands). `run` starts itself again with it. */
WK_API const char *wk_blas_kernels(void);
WK_API const char *wk_blas_better_kernels(void);
/* out[N,OC] = inp[N,C] @ w + bias; w is [C,OC] (Hugging Face Conv1D layout) or, with
 * transpose_w, [OC,C] (a tied embedding). bias may be NULL. */
WK_API WkStatus wk_op_matmul(WkTensor *out, const WkTensor *inp, const WkTensor *w,
                             const WkTensor *bias, int transpose_w);
WK_API WkStatus wk_op_matmul_backward(WkTensor *dinp, WkTensor *dw, WkTensor *dbias,
                                      const WkTensor *dout, const WkTensor *inp, const WkTensor *w,
                                      int transpose_w);
WK_API WkStatus wk_op_gelu(WkTensor *out, const WkTensor *inp);  /* tanh approximation */
WK_API WkStatus wk_op_gelu_backward(WkTensor *dinp, const WkTensor *dout, const WkTensor *inp);
/* The MLP's up-projection with GELU fused into the GEMM (cuBLASLt's GELU_AUX epilogue on a GPU):
 * pre = inp @ w + bias as wk_op_matmul gives it, and out = gelu of that value before its rounding to
 * the activation dtype (pre and out each rounded once); both [N, OC] of inp's dtype, and apart.
 * bias may be NULL. On f32 the CPU computes exactly wk_op_matmul then wk_op_gelu. */
WK_API WkStatus wk_op_matmul_gelu(WkTensor *out, WkTensor *pre, const WkTensor *inp, const WkTensor *w,
                                  const WkTensor *bias, int transpose_w);
/* The backward of a matmul whose input is inp = gelu(pre) (the down-projection), through the GELU:
 * dw and dbias (may be NULL) accumulate as wk_op_matmul_backward's, and dpre = gelu'(pre) times
 * dout @ w^T (transposed as for wk_op_matmul_backward), rounded once. dpre is WRITTEN, not added to
 * (so it needs no zeroing), the exception with cross-entropy's dlogits; it may share no memory with
 * pre, inp or dout. */
WK_API WkStatus wk_op_matmul_backward_gelu(WkTensor *dpre, WkTensor *dw, WkTensor *dbias, const WkTensor *dout,
                                           const WkTensor *inp, const WkTensor *w, const WkTensor *pre,
                                           int transpose_w);
/* Causal self-attention: qkv [B,T,3C] (q, k, v blocks of C, NH heads each) -> out [B,T,C];
 * att [B,NH,T,T] keeps the softmax probabilities for the backward. */
WK_API WkStatus wk_op_attention(WkTensor *out, WkTensor *att, const WkTensor *qkv, int heads);
WK_API WkStatus wk_op_attention_backward(WkTensor *dqkv, const WkTensor *dout, const WkTensor *qkv,
                                         const WkTensor *att, int heads);
/* losses[N] = mask * -log softmax(logits)[target] / normalizer; their sum (the mean loss when
 * normalizer is the count of masked-in targets) goes to *loss_sum or, given a status instead, is
 * added to it (one of the two, see WkStepStatus). mask may be NULL (all counted); targets under a 0
 * mask are ignored, so they may hold padding or -1. */
WK_API WkStatus wk_op_cross_entropy(WkTensor *losses, const WkTensor *logits, const WkTensor *targets,
                                    const WkTensor *mask, float normalizer, double *loss_sum, WkTensor *status);
/* dlogits = dloss * mask * (softmax(logits) - onehot(target)) / normalizer, written (not added to),
 * so dlogits may be logits itself: the gradient then replaces the logits in place (no second
 * [N,V] buffer). Any other overlap of the two is refused. */
WK_API WkStatus wk_op_cross_entropy_backward(WkTensor *dlogits, const WkTensor *logits,
                                             const WkTensor *targets, const WkTensor *mask,
                                             float normalizer, float dloss);
/* One fused AdamW step (decoupled weight decay) over f32 param/grad/m/v of the same shape; the
 * gradient is multiplied by grad_scale first (loss-scale undo and norm clipping in one pass). */
WK_API WkStatus wk_op_adamw(WkTensor *param, const WkTensor *grad, WkTensor *m, WkTensor *v, float lr,
                            float beta1, float beta2, float eps, float weight_decay, int64_t step,
                            float grad_scale);

/* Llama-family ops: RMSNorm, rotary position embeddings, the SwiGLU gate and grouped-query attention's
 * q/k/v packing, on either device (same dtypes as the GPT-2 ops). */
/* Over the last dim C: out = inp / sqrt(mean(inp^2) + eps) * weight; rstd [N] (f32) is kept for the backward. */
WK_API WkStatus wk_op_rmsnorm(WkTensor *out, WkTensor *rstd, const WkTensor *inp, const WkTensor *weight,
                              float eps);
/* As wk_op_add_layernorm, with RMSNorm: sum = a + b rounded as wk_op_add rounds it, then out and rstd
 * the RMSNorm of that rounded sum, the very values of wk_op_add then wk_op_rmsnorm. */
WK_API WkStatus wk_op_add_rmsnorm(WkTensor *sum, WkTensor *out, WkTensor *rstd, const WkTensor *a,
                                  const WkTensor *b, const WkTensor *weight, float eps);
WK_API WkStatus wk_op_rmsnorm_backward(WkTensor *dinp, WkTensor *dweight, const WkTensor *dout,
                                       const WkTensor *inp, const WkTensor *weight, const WkTensor *rstd);
/* RoPE's inverse frequencies inv_freq [hs/2] from theta: plain, `linear` (divided by factor) or
 * Llama 3's scaling (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings;
 * the arguments a kind does not use are ignored). */
typedef enum { WK_ROPE_DEFAULT = 0, WK_ROPE_LINEAR = 1, WK_ROPE_LLAMA3 = 2 } WkRopeKind;
WK_API WkStatus wk_op_rope_frequencies(WkTensor *inv_freq, WkRopeKind kind, double theta, double factor,
                                       double low_freq_factor, double high_freq_factor,
                                       double original_max_position_embeddings);
/* Rotates each head of inp [B,T,heads*hs] at positions start..start+T-1 (HF's rotate-half). */
WK_API WkStatus wk_op_rope(WkTensor *out, const WkTensor *inp, const WkTensor *inv_freq, int heads,
                           int64_t start);
WK_API WkStatus wk_op_rope_backward(WkTensor *dinp, const WkTensor *dout, const WkTensor *inv_freq,
                                    int heads, int64_t start);
/* out = silu(gate) * up, elementwise. */
WK_API WkStatus wk_op_swiglu(WkTensor *out, const WkTensor *gate, const WkTensor *up);
WK_API WkStatus wk_op_swiglu_backward(WkTensor *dgate, WkTensor *dup, const WkTensor *dout,
                                      const WkTensor *gate, const WkTensor *up);
/* qkv [B,T,3*heads*hs] for wk_op_attention from q [B,T,heads*hs], k and v [B,T,kv_heads*hs], each kv
 * head repeated for the heads/kv_heads query heads of its group; the backward sums each group. */
WK_API WkStatus wk_op_qkv_pack(WkTensor *qkv, const WkTensor *q, const WkTensor *k, const WkTensor *v,
                               int heads, int kv_heads);
WK_API WkStatus wk_op_qkv_pack_backward(WkTensor *dq, WkTensor *dk, WkTensor *dv, const WkTensor *dqkv,
                                        int heads, int kv_heads);
/* Generation's attention: k and v [B,Tq,kv_heads*hs] of positions start..start+Tq-1 are written into
 * the caches [B,Tmax,kv_heads*hs] there, then the queries q [B,Tq,heads*hs] of those positions attend
 * causally to cache positions 0..their own -> out [B,Tq,heads*hs] (grouped as in qkv_pack). Forward only. */
WK_API WkStatus wk_op_attention_cached(WkTensor *out, const WkTensor *q, const WkTensor *k, const WkTensor *v,
                                       WkTensor *k_cache, WkTensor *v_cache, int heads, int kv_heads,
                                       int64_t start);


/* safetensors (Hugging Face weights files): open parses and checks the header; read fills a
 * contiguous CPU tensor of the entry's dtype and size straight from the file; save writes tensors
 * of any device and layout (in the order given) and renames the file into place. */
typedef struct WkSafetensors WkSafetensors;
typedef struct {
  const char *name;
  WkDType dtype;
  int32_t ndim;
  int64_t shape[WK_MAX_DIMS];
  uint64_t offset;  /* from the start of the data section */
  uint64_t bytes;
} WkSafetensorsEntry;

WK_API WkSafetensors *wk_safetensors_open(const char *path);
WK_API void wk_safetensors_close(WkSafetensors *f);
WK_API uint32_t wk_safetensors_count(const WkSafetensors *f);
WK_API WkStatus wk_safetensors_entry(const WkSafetensors *f, uint32_t i, WkSafetensorsEntry *out);
WK_API WkStatus wk_safetensors_read(WkSafetensors *f, uint32_t i, WkTensor *dst);
/* Entry i where it lies in a private mapping of the file (a copy only when its offset is not aligned
 * to its dtype); free the tensor before closing the file. NULL and the error on failure. */
WK_API WkTensor *wk_safetensors_view(WkSafetensors *f, uint32_t i);
WK_API uint32_t wk_safetensors_metadata_count(const WkSafetensors *f);
WK_API WkStatus wk_safetensors_metadata(const WkSafetensors *f, uint32_t i, const char **key, const char **value);
WK_API WkStatus wk_safetensors_save(const char *path, uint32_t count, const char *const *names,
                                    WkTensor *const *tensors, uint32_t meta_count, const char *const *meta_keys,
                                    const char *const *meta_values);
/* One file written in parts, by whoever holds each (the ranks of a sharded run write their slices of
 * a checkpoint's weights in parallel): wk_safetensors_create writes the header wk_safetensors_save
 * would write for `shapes` in the given order, every entry of `dtype`, and sizes the file for all of
 * them (unwritten bytes read as zeros); wk_safetensors_write_at then writes t's bytes (t of that
 * dtype) at `offset` bytes into the data section, which it must fit. */
WK_API WkStatus wk_safetensors_create(const char *path, uint32_t count, const char *const *names,
                                      WkTensor *const *shapes, WkDType dtype, uint32_t meta_count,
                                      const char *const *meta_keys, const char *const *meta_values);
WK_API WkStatus wk_safetensors_write_at(const char *path, uint64_t offset, const WkTensor *t);

/* ==== distributed (runtime/dist) ================================================================
 * Kept apart from the rest: the world, the rendezvous store and the collectives. Every call that
 * waits for another rank takes or inherits a timeout; none waits forever. */

/* ---- the world: who this process is ------------------------------------------------------------ */
typedef enum { WK_WORLD_SINGLE = 0, WK_WORLD_TORCHRUN = 1, WK_WORLD_SLURM = 2 } WkWorldSource;

enum { WK_HOST_CAPACITY = 256 };

/* The bounds of a job, checked where each value enters: the environment, the store's messages, the
 * Lua options and a checkpoint's world. */
enum {
  WK_DIST_MAX_WORLD = 1 << 24,            /* ranks in a job */
  WK_DIST_MAX_TIMEOUT_S = 7 * 24 * 3600   /* a wait of a week: longer is a mistake */
};

typedef struct {
  int32_t rank;
  int32_t world_size;
  int32_t local_rank;
  int32_t local_world_size;
  int32_t master_port;
  int32_t source;                     /* WkWorldSource: where the values came from */
  char master_addr[WK_HOST_CAPACITY]; /* rank 0's host; "" for a world of 1 */
} WkWorld;

/* From torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, else
 * SLURM's SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_JOB_NODELIST (first host; MASTER_ADDR
 * and MASTER_PORT override, the port defaults to 29500), else a world of 1. A partial or
 * out-of-range set of variables is WK_ERR_INVALID_ARG naming the variable. */
WK_API WkStatus wk_world_from_env(WkWorld *out);

/* ---- the rendezvous store: a TCP key-value store rank 0 serves -------------------------------- */
typedef struct WkStore WkStore;
typedef struct WkStoreServer WkStoreServer;

/* Serves at host:port (host: the address the ranks reach it at, MASTER_ADDR; port 0: any free
 * port, see wk_store_server_port) for a job of world_size ranks, on a thread of its own. Only
 * connections proving the job's secret (WICK_STORE_SECRET or WICK_STORE_SECRET_FILE) are served;
 * without one it is unauthenticated and says so once. NULL on failure (port in use, ...). */
WK_API WkStoreServer *wk_store_server_start(const char *host, int port, int world_size);
WK_API int wk_store_server_port(const WkStoreServer *server);
/* Waits up to timeout_ms for every rank that said hello to say bye or drop, then stops. */
WK_API void wk_store_server_stop(WkStoreServer *server, int64_t timeout_ms);

/* Connects (retrying while the server is not up yet) and says hello as rank of world_size (-1 and
 * 0: anonymous), proving the job's secret and checking the server's proof of it. A server that
 * refuses (another world size, the rank connected already, another secret) fails the call with its
 * reason as WK_ERR_NETWORK. timeout_ms bounds the connection and every later request that takes no
 * timeout of its own. */
WK_API WkStore *wk_store_connect(const char *host, int port, int rank, int world_size, int64_t timeout_ms);
WK_API void wk_store_close(WkStore *store);  /* says bye; NULL is fine */

/* Values are bytes. A get waits up to timeout_ms (0: do not wait) for the key and copies at most
 * capacity bytes: *length is the full length, and a value longer than capacity is
 * WK_ERR_INVALID_ARG (call again with a larger buffer). A key missing at the deadline is
 * WK_ERR_TIMEOUT. */
WK_API WkStatus wk_store_set(WkStore *store, const char *key, const void *value, size_t length);
WK_API WkStatus wk_store_get(WkStore *store, const char *key, int64_t timeout_ms, void *buffer, size_t capacity,
                             size_t *length);
WK_API WkStatus wk_store_wait(WkStore *store, const char *const *keys, uint32_t count, int64_t timeout_ms);
/* The value (decimal text, 0 when absent) plus delta; *value is the result. */
WK_API WkStatus wk_store_add(WkStore *store, const char *key, int64_t delta, int64_t *value);
/* Sets desired when the value equals expected, or when the key is absent and expected is empty.
 * The value after the call lands in buffer as for get; *swapped says whether desired was set. */
WK_API WkStatus wk_store_compare_set(WkStore *store, const char *key, const void *expected, size_t expected_length,
                                     const void *desired, size_t desired_length, void *buffer, size_t capacity,
                                     size_t *length, int *swapped);

/* ---- collectives ---------------------------------------------------------------------------------
 * One process group per process. CPU tensors go through Gloo (TCP), CUDA tensors through NCCL
 * (when built with it); a world of 1 needs neither. Tensors are contiguous; f32, bf16, f16, i32
 * and i64. `site` ("recipe.lua:31", may be NULL) is quoted by the hang report: when a peer dies or
 * falls behind, the call fails within the timeout naming the missing ranks, where they were, and
 * the collective (name, sequence number, size) this rank waited in. */
typedef struct WkDist WkDist;
typedef struct WkWork WkWork;

typedef enum { WK_REDUCE_SUM = 0, WK_REDUCE_AVG = 1, WK_REDUCE_MAX = 2, WK_REDUCE_MIN = 3 } WkReduceOp;

typedef struct {
  uint64_t collectives;  /* collectives started */
  uint64_t bytes;        /* bytes of the tensors they covered */
  uint64_t wait_ns;      /* time callers blocked in collectives and wk_work_wait */
} WkDistStats;

WK_API WkDist *wk_dist_init(const WkWorld *world, int64_t timeout_ms);
/* Leaves the group (rank 0 keeps serving the store until the others leave, within the timeout). */
WK_API void wk_dist_close(WkDist *dist);
WK_API WkStore *wk_dist_store(WkDist *dist);  /* NULL for a world of 1 */
WK_API void wk_dist_stats(const WkDist *dist, WkDistStats *out);

WK_API WkStatus wk_dist_all_reduce(WkDist *dist, WkTensor *t, WkReduceOp op, const char *site);
WK_API WkStatus wk_dist_broadcast(WkDist *dist, WkTensor *t, int root, const char *site);
/* out holds world_size * numel(t) elements, rank r's t at r * numel(t). */
WK_API WkStatus wk_dist_all_gather(WkDist *dist, WkTensor *out, const WkTensor *t, const char *site);
/* t holds world_size * numel(out) elements; out gets the reduction of block `rank`. */
WK_API WkStatus wk_dist_reduce_scatter(WkDist *dist, WkTensor *out, const WkTensor *t, WkReduceOp op,
                                       const char *site);
WK_API WkStatus wk_dist_barrier(WkDist *dist, const char *site);

/* Starts an all-reduce on the group's worker and returns at once (NULL on failure to start); t
 * must stay alive and untouched until wk_work_wait, which returns its status and frees the work.
 * Collectives run in the order they were started, synchronous ones after every pending one. */
WK_API WkWork *wk_dist_all_reduce_start(WkDist *dist, WkTensor *t, WkReduceOp op, const char *site);
/* The same for an all-gather and a reduce-scatter (out and t as the blocking calls take them, both
 * untouched until the wait). */
WK_API WkWork *wk_dist_all_gather_start(WkDist *dist, WkTensor *out, const WkTensor *t, const char *site);
WK_API WkWork *wk_dist_reduce_scatter_start(WkDist *dist, WkTensor *out, const WkTensor *t, WkReduceOp op,
                                            const char *site);
WK_API WkStatus wk_work_wait(WkWork *work);

/* WK_CDEF_END */

#ifdef __cplusplus
}
#endif
#endif /* WICK_H */
