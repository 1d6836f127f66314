/*
 * converter.h — what the converter's own files share (internal to runtime/convert): the converter's
 * settings (struct WkConverter) and a run's state (chunks in flight, shard jobs, reusable buffers), and
 * the calls between
 *   settings.c  the converter and its settings: parameters, field names, include patterns, inputs
 *   convert.c   a run: the producer and worker threads, and wk_converter_run, which drives them
 *   builder.c   the calling thread's part: chunk results in order -> documents -> shards, the progress
 *               bar, the index
 */
#ifndef WK_CONVERT_CONVERTER_H
#define WK_CONVERT_CONVERTER_H

#include <pthread.h>

#include "../core/core.h"
#include "convert.h"

enum {
  MAX_THREADS = 64,
  MAX_BAD_KEPT = 1000,
  MAX_SHARDS_IN_FLIGHT = 2,  /* one being compressed while the next is built */
  MAX_DECLARED_VOCAB = INT32_MAX,  /* WK_CONVERT_VOCAB_SIZE: ids below 2^31 (an embedding's rows) */
  MAX_SHARD_COLUMN_BYTES = 1 << 30, /* a shard also closes once its columns hold this much (images) */
};

struct WkConverter {
  char *out_dir;
  const WkTokenizer *tokenizer;  /* NULL: decided by the inputs (bytes for text, gpt2 for .bin) */
  WkTokenizer *owned;            /* the tokenizer file wk_converter_new opened, freed with the converter */
  char *field;
  char *json_field;
  ColumnSpec tokens;                /* --column tokens=FIELD:tokens, when has_tokens */
  bool has_tokens;
  ColumnSpec columns[COLUMN_MAX];   /* the other --columns, in the order added (the dataset's 1, 2, ...) */
  uint32_t column_count;
  int64_t params[WK_CONVERT_PARAM_COUNT];
  char **include;  /* NULL-terminated globs for files found in directories; NULL: all */
  Input *inputs;
  size_t input_count, input_capacity;
  WkRemote *remote;  /* opened at the first URL input (remote_input.c) */
  uint64_t total_input_bytes;
  WkConvertStats stats;
  char **bad_lines;
  size_t bad_kept;
};

static inline int64_t param(const WkConverter *cv, WkConvertParam p) { return cv->params[p]; }

typedef struct ShardJob ShardJob;

/* A range of a shard's blocks, compressed by whichever worker takes it. */
typedef struct {
  JobKind kind;
  ShardJob *shard;
  WkShardPiece piece;
  uint32_t first_block, block_count;
  WkStatus status;
  char message[1024];
} PieceJob;

/* A finished shard: its pieces are compressed in parallel; the worker finishing the last one writes
 * the file. */
struct ShardJob {
  uint32_t index;
  char *path;
  uint8_t *tokens;  /* stored width */
  uint64_t token_count, token_capacity;
  uint64_t *doc_starts;
  uint64_t doc_count, doc_capacity;
  ColumnData *columns;  /* the --columns' values of the shard, or NULL */
  uint32_t column_count;
  PieceJob *pieces;
  uint32_t piece_count, pieces_left;
  bool done;
  WkStatus status;
  char message[1024];
  WkShardWritten written;
};

/* Buffers handed back for reuse: fresh memory costs a page fault and a page clear per 4 KiB, which
 * was the converter's largest cost. Lock held when used. */
enum { POOL_SLOTS = 8 };
typedef struct {
  void *data[POOL_SLOTS];
  uint64_t capacity[POOL_SLOTS];
  uint32_t count;
} Pool;

typedef struct {
  WkConverter *cv;
  const WkTokenizer *tokenizer;
  WkTokenizer declared;  /* the "ids" of token files whose vocabulary and EOS were declared */
  WkTemplate template;  /* the tokenizer's, less an EOS that ends it (each document ends with one anyway) */
  int template_state;   /* WK_INDEX_TEMPLATE_*: NONE for token files and tokenizers without one */
  ChunkContext context;
  WkShardWriteOptions write_options;
  uint32_t threads;
  WkQueue *jobs;
  pthread_mutex_t lock;
  pthread_cond_t changed;
  /* chunks: produced with consecutive numbers, consumed in order */
  Chunk **ring;
  uint64_t ring_size;
  uint64_t produced, consumed;
  bool producer_done;
  WkStatus producer_status;
  char producer_message[1024];
  atomic_bool stop;
  /* shards: at most MAX_SHARDS_IN_FLIGHT finished shards wait for or undergo compression */
  ShardJob **shards;
  uint32_t shard_count, shard_capacity, shards_in_flight;
  Pool shard_buffers, shard_starts, chunk_tokens;
  /* the shard being built */
  uint8_t *buffer;
  uint64_t buffer_tokens, buffer_capacity;
  uint64_t *starts;
  uint64_t start_count, start_capacity;
  ColumnData columns[COLUMN_MAX];  /* its --columns' values (ColumnData, shard-wide: ends are shard offsets) */
  bool doc_open;        /* a document (of a .bin input) continues into the next chunk */
  uint64_t line_base;   /* lines of the current input before the chunk being consumed */
  uint64_t last_draw_ns, start_ns;
  ConvertOutput out;
} Run;

/* ---- convert.c ------------------------------------------------------------------------------------- */

/* A pool's buffers (lock held): put keeps or frees one, take returns one (NULL: none), free empties it. */
void convert_pool_put(Pool *p, void *data, uint64_t capacity);
void *convert_pool_take(Pool *p, uint64_t *capacity);
void convert_pool_free(Pool *p);
/* Returns a written shard's buffers to the pools (or frees them when r is NULL). Lock not held. */
void convert_free_shard_inputs(Run *r, ShardJob *job);

/* ---- builder.c ------------------------------------------------------------------------------------- */

/* Takes the chunk results in order into shards until the input ends; the last shard is handed on too. */
WkStatus convert_build(Run *r);
/* A run that found no document writes no dataset (the first line skipped says why). */
WkStatus convert_require_documents(const WkConverter *cv);
/* Writes index.json into the staging directory, from the finished shards. */
WkStatus convert_write_index(Run *r);
void convert_draw_progress(Run *r, bool final);

#endif /* WK_CONVERT_CONVERTER_H */
