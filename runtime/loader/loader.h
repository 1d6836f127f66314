/*
 * loader.h — what the loader's files share (internal to runtime/loader; wick.h has the API): its state
 * (struct WkLoader, a source, a micro-batch buffer of the ring) and the calls between them:
 *   loader.c  configuration, start, the reader threads, consuming, the cursor, teardown
 *   ring.c    the ring of micro-batch buffers: how many fit the budgets, their layout in pinned memory
 *   plan.c    planning a micro-batch: the step's mix, then each row's sample located in its source's order
 *   audit.c   one line per delivered sample, appended to a file
 *   columns.c the columns asked for: checked against every source at start, read into each row
 */
#ifndef WK_LOADER_LOADER_H
#define WK_LOADER_LOADER_H

#include <pthread.h>

#include "device_copy.h"
#include "node_cache.h"

enum {
  MAX_THREADS = 64,
  BUFFER_ALIGNMENT = 64,  /* each array of a buffer starts on its own cache line */
  BUFFER_ERROR_CAPACITY = 1024,
  SKIP_LOG_LIMIT = 20,    /* distinct corrupt-data reasons logged before going quiet */
  DEFAULT_PREFETCH_PER_THREAD = 4, /* ring = 4 x (threads + 1) micro-batches unless set */
  MIN_RING = 2,                   /* one micro-batch consumed while the next is filled */
  MAX_DEVICE_INDEX = 1023,
  AHEAD_CAPACITY = 256,           /* units a micro-batch asks to be read ahead */
};

#define NO_BUFFER UINT64_MAX


typedef struct {
  char *path;
  WkDataset *ds;
  WkOrder *order;
  WkNodeReader *node_reader;  /* its reads through the node cache */
  uint64_t ahead_from;  /* the last buffer (by its first draw) whose successor was read ahead, or NO_BUFFER */
} Source;

/* A column asked for (wk_loader_add_column): its info (every source agrees on it) and its index in each source. */
typedef struct {
  char name[WK_COLUMN_NAME_BYTES];
  WkColumnInfo info;
  uint32_t index[WK_MIX_MAX_SOURCES];
} LoaderColumn;

typedef struct {
  uint32_t source;
  WkUnitRef unit;
} Ahead;

typedef enum { BUFFER_FREE, BUFFER_PLANNED, BUFFER_FILLING, BUFFER_READY } BufferState;

typedef struct {
  struct WkLoader *loader;
  WkNodeReaderThread *contexts[WK_MIX_MAX_SOURCES];
} Reader;

typedef struct {
  BufferState state;
  uint64_t seq;          /* micro-batch number since start */
  uint64_t step;
  uint32_t micro;
  uint64_t fingerprint;
  uint64_t skipped;
  WkStatus status;
  char error[BUFFER_ERROR_CAPACITY];
  WkRows rows;
  WkSampleInfo *info;
  WkSampleLoc *locs;
  Ahead ahead[AHEAD_CAPACITY]; /* units of the next buffers, read ahead when this micro-batch starts one */
  uint32_t ahead_count;
  WkSourcePosition before[WK_MIX_MAX_SOURCES]; /* at the start of `step` */
  WkSourcePosition after[WK_MIX_MAX_SOURCES];  /* after `step` */
  WkStorage *storage;   /* pinned: rows, then info */
  WkBatchTensors tensors;
} Buffer;

struct WkLoader {
  int64_t params[WK_LOADER_PARAM_COUNT];
  Source sources[WK_MIX_MAX_SOURCES];
  WkMixConfig mix;
  LoaderColumn columns[WK_BATCH_MAX_COLUMNS];
  uint32_t column_count;
  WkCursor start;       /* where the stream starts: zero or a restored cursor */
  bool restored;
  /* derived at start */
  uint32_t rows, per_rank, micro_steps;
  size_t buffer_bytes;
  /* planner: touched only by the thread holding `planning` */
  uint64_t next_seq;
  bool have_step;
  uint64_t planned_step;
  WkDraw *draws;        /* the planned step's global batch */
  uint64_t step_fingerprint;
  WkSourcePosition positions[WK_MIX_MAX_SOURCES];
  WkSourcePosition step_before[WK_MIX_MAX_SOURCES];
  WkSourcePosition start_positions[WK_MIX_MAX_SOURCES]; /* at the start step (restored or zero) */
  bool ended;             /* under the lock, like what follows */
  uint64_t end_seq;
  bool planning;          /* a reader is planning the next micro-batch (outside the lock) */
  uint64_t plan_low[WK_MIX_MAX_SOURCES]; /* each source's first draw of the step last planned */
  /* ring */
  Buffer *buffers;
  WkSampleLoc *locs;         /* [buffer_count x rows] */
  uint32_t buffer_count;
  pthread_mutex_t lock;
  pthread_cond_t ready;      /* the consumer waits here for filled buffers */
  pthread_cond_t free;       /* readers wait here for empty buffers (or for the end) */
  uint32_t readers_waiting;
  uint64_t wake_consumer_at; /* the consumer sleeps until this micro-batch is ready */
  pthread_t threads[MAX_THREADS];
  Reader readers[MAX_THREADS];
  uint32_t thread_count;
  bool started, stopping;
  WkDeviceCopy *device_copy;  /* NULL: batches stay on the CPU */
  /* consumer */
  uint64_t consumed;
  uint32_t frees;             /* chances to fill given to the readers since the consumer last woke them */
  Buffer *held;               /* the last micro-batch returned */
  uint64_t held_from;         /* the first micro-batch of its step still held */
  bool failed;
  WkStatus failure;
  char failure_message[BUFFER_ERROR_CAPACITY];
  uint64_t skipped;
  WkLoaderStats stats;
  uint32_t skip_logs;
  char last_skip_reason[BUFFER_ERROR_CAPACITY];
  int audit_fd;  /* -1 unless wk_loader_audit */
  char *audit_path;
  WkRemoteOptions remote;  /* how remote sources are fetched; its cache_dir is ours (cache_dir below) */
  char *cache_dir;
};

static inline int64_t param(const WkLoader *loader, WkLoaderParam p) { return loader->params[p]; }

/* ---- ring.c ---------------------------------------------------------------------------------------- */

/* The ring's buffers: how many (prefetch, bounded by the memory budget and each source's node cache)
 * and, in loader->buffer_bytes, the size of each. */
WkStatus loader_size_ring(WkLoader *loader, uint32_t *count);
/* Allocates them and the step plan; a no-op when an earlier start that failed later on made them. */
WkStatus loader_allocate_ring(WkLoader *loader);
void loader_free_buffer(Buffer *b);

/* ---- plan.c ---------------------------------------------------------------------------------------- */

/* Plans micro-batch loader->next_seq into b; false at the end of the stream. */
bool loader_plan_next(WkLoader *loader, Buffer *b);

/* ---- columns.c ------------------------------------------------------------------------------------- */

/* Finds each column in every source and checks it fits the batch (start and check call it). */
WkStatus loader_resolve_columns(WkLoader *loader);
/* Bytes of one row of column c in a micro-batch buffer; its row's tensor shape and dtype into *out
 * (data and sizes left for the ring to place). */
uint64_t loader_column_row(const WkLoader *loader, uint32_t c, WkRowColumn *out);
/* The indices in source s of the per-token columns (per_token: the node reader reads them with the
 * tokens) or of the per-record ones, in the order asked: their count. */
uint32_t loader_source_columns(const WkLoader *loader, uint32_t s, bool per_token, uint32_t *out);
/* Row r's rows of the per-token columns in that order, where the node reader reads the sample at loc;
 * returns how many positions past the sample they hold (pad mode: the record's EOS, when the row has room). */
uint32_t loader_token_column_rows(const WkLoader *loader, const WkRows *rows, const WkSampleLoc *loc, uint32_t r,
                                  uint8_t **out);
/* Reads the per-record columns of source s's sample at loc into row r, and zeroes the per-token ones past
 * the sample (after the node reader, before wk_pack_row). */
WkStatus loader_read_columns(WkLoader *loader, uint32_t s, const WkSampleLoc *loc, WkRows *rows, uint32_t r);

/* ---- audit.c --------------------------------------------------------------------------------------- */

/* Appends the batch's lines to the audit file (wk_loader_audit). */
WkStatus loader_audit_batch(WkLoader *loader, const WkBatch *batch);

#endif /* WK_LOADER_LOADER_H */
