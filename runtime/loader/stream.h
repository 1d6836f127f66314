/*
 * runtime/loader — a dataset's tokens in the global sample order, batched ahead on C threads.
 *
 * Owns, bottom up (each file calls only the ones above it in this list):
 *   order.c       the global sample sequence: a pure function of (dataset, seed, epoch), in windows of
 *                 shards, buffers of units (blocks) and samples, with how long each sample's unit is held
 *   node_cache.c  the node's decoded units and straddler edges, shared by its ranks, held by the order
 *   node_reader.c a source's reads for the loader, through the node cache (zstd decoded, raw copied)
 *   pack.c        a sample's tokens in a row -> the row's mask, padding, doc ids and positions
 *   mix.c         several sources -> one deterministic stream with per-source cursors
 *   cursor.c      the stream's state as a short line of text
 *   loader.c      C threads that read, decode, pack and batch ahead into a bounded ring
 *                 (ring.c sizes and lays out the ring, plan.c plans each micro-batch, audit.c
 *                 writes the audit file; loader.h is what they share)
 *   device_copy.c a ring slot's batch as tensors, and its copy to the loader's device
 * Does not own the datasets it reads (runtime/dataset/) nor their format (runtime/format/). Of tensors
 * it knows only its batches (device_copy.c). Layer: the top of the read path (runtime/LAYERS).
 *
 * stream.h — the layers above WkDataset: order (which sample comes at each position of a source's
 * stream), mix (which source fills each draw of a global batch), pack (a sample -> one row of
 * tokens, mask, doc ids, positions) and the cursor that captures all of it in a few hundred bytes.
 *
 * Everything here is a pure function of its inputs and the cursor: no threads, no I/O except the
 * token reads of pack.c. The loader (loader.c) runs these on C threads.
 */
#ifndef WK_LOADER_STREAM_H
#define WK_LOADER_STREAM_H

#include "../dataset/dataset.h"

/* ---- order.c: a source's sample sequence --------------------------------------------------------- */

/* wk_permute and wk_mix64 (wick.h) with O(1) memory and time per element, so an epoch's shuffle needs
 * no index array; the inverse finds where the permutation put an element. */
uint64_t wk_permute_inverse(uint64_t key, uint64_t n, uint64_t i);

typedef enum { WK_PACK_PACKED = 0, WK_PACK_PAD = 1 } WkPackMode;

typedef struct {
  uint32_t seq_len;        /* tokens per sample = seq_len + 1 (inputs and shifted targets) */
  WkPackMode mode;
  uint64_t seed;
  bool shuffle;            /* false: shards, units and samples in stored order (debugging) */
  uint64_t window_tokens;  /* consecutive shards holding this many tokens have their units permuted together */
  uint64_t buffer_tokens;  /* units holding this many tokens have their samples permuted together: the working set */
  uint32_t partitions;     /* canonical partitions: disjoint shard sets, interleaved by chunk */
  uint32_t chunk;          /* consecutive draws taken from one partition before the next */
} WkOrderConfig;

/* An edge: the part, inside one unit, of a sample that straddles into a unit drawn in a later buffer.
 * The unit's decoder saves it, so the later buffer needs no second decode of this unit. */
typedef struct {
  uint64_t begin, end;     /* tokens of the shard's stream */
  uint32_t boundary;       /* the unit right of the boundary: (shard, boundary) names the edge */
  uint64_t hold_until;     /* absolute draw after which it is no longer needed */
} WkEdgeDuty;

/* The absolute draws of the source between which a unit is needed: its buffer's first and last. */
typedef struct {
  uint64_t from, until;
} WkHold;

/* A unit (a run of blocks of one shard) as one sample touches it. */
typedef struct {
  uint32_t unit;           /* unit index within the shard */
  bool from_edge;          /* the sample's part in this unit was saved as an edge in an earlier buffer */
  uint32_t duties;         /* edges to save when this unit is decoded */
  WkEdgeDuty duty[2];
  WkHold hold;
} WkUnitUse;

/* Where a sample lives: shard + first token + token count (packed: seq_len+1 tokens of the stream;
 * pad: a document without its EOS, at most seq_len+1 tokens), and, from wk_order_locate, the units it
 * lies in (1, or 2 for a straddler: units[0] holds its first token) and its absolute draw. */
typedef struct {
  uint32_t shard;
  uint64_t offset;
  uint64_t length;
  uint64_t item;  /* packed: window index in the shard; pad: document index */
  uint64_t draw;
  uint64_t buffer_from;    /* the first draw of the buffer that draws it: names the buffer */
  uint32_t unit_count;
  WkUnitUse units[2];
} WkSampleLoc;

/* The order of one source: knows its dataset's shape, caches one epoch's shard and window tables and
 * each partition's current window. */
typedef struct WkOrder WkOrder;

WkOrder *wk_order_new(WkDataset *ds, const WkOrderConfig *config);
void wk_order_free(WkOrder *order);
/* Samples per epoch (same for every epoch). 0 means the dataset is too small for one sample. */
uint64_t wk_order_epoch_length(const WkOrder *order);
/* The c-th sample (0 <= c < epoch length) of epoch `epoch`. Not thread-safe (caches the epoch). */
WkStatus wk_order_locate(WkOrder *order, uint64_t epoch, uint64_t c, WkSampleLoc *out);
/* The units of the buffer `ahead` buffers after the one holding draw c (0: that buffer itself), in the
 * same window (none past a window's end): what read-ahead asks for. Writes at most capacity. */
typedef struct {
  uint32_t shard, unit;
} WkUnitRef;
WkStatus wk_order_units_after(WkOrder *order, uint64_t epoch, uint64_t c, uint32_t ahead, WkUnitRef *out,
                              uint32_t capacity, uint32_t *count);
/* Item `item` of a shard (its place, without its hold), for tools and tests. */
WkStatus wk_order_item(WkOrder *order, uint32_t shard, uint64_t item, WkSampleLoc *out);
/* Identifies the dataset's content (shard names and sizes, block size): part of every shuffle key. */
uint64_t wk_order_fingerprint(const WkOrder *order);
uint64_t wk_order_unit_tokens(const WkOrder *order);   /* tokens per unit */
uint64_t wk_order_buffer_units(const WkOrder *order);  /* units per buffer */
uint64_t wk_order_total_units(const WkOrder *order);   /* units of all shards */
/* The most unit boundaries one window can hold: bounds the straddler edges in flight. */
uint64_t wk_order_max_window_boundaries(const WkOrder *order);



/* ---- mix.c: which source fills each draw of a global batch --------------------------------------- */

/* Piecewise-linear weight over steps: weight(step) interpolates between points, constant outside. */
enum { WK_SCHEDULE_MAX_POINTS = 64 };
typedef struct {
  uint32_t points;
  double steps[WK_SCHEDULE_MAX_POINTS];
  double weights[WK_SCHEDULE_MAX_POINTS];
} WkSchedule;

double wk_schedule_at(const WkSchedule *schedule, uint64_t step);

/* Per-source position of the stream: all a cursor needs besides the step. */
typedef struct {
  uint64_t draws;  /* samples drawn so far over all epochs: epoch = draws / epoch_length */
  double credit;   /* fractional share owed (or overdrawn) so proportions stay exact */
} WkSourcePosition;

enum { WK_MIX_MAX_SOURCES = 32 };
enum { WK_DRAW_PAD = 0xFFFFFFFFu };  /* a draw left empty at the end of the stream (masked) */

/* One place of a global batch: the source it is drawn from and which of that source's draws it is. */
typedef struct {
  uint32_t source;  /* index into the mix, or WK_DRAW_PAD */
  uint64_t index;   /* the source's draw index */
} WkDraw;

typedef struct {
  uint32_t count;
  WkSchedule weight[WK_MIX_MAX_SOURCES];
  uint64_t epoch_length[WK_MIX_MAX_SOURCES];
  uint64_t max_epochs[WK_MIX_MAX_SOURCES];  /* 0: unlimited (a source that runs out starts over) */
  uint64_t seed;
  uint32_t global_batch;
  bool pad_last;  /* at the end: pad the final partial batch with masked draws (else drop it) */
} WkMixConfig;

/* Plans global batch `step`: fills draws[global_batch] and advances positions. Returns
 * WK_ERR_CLOSED when every source is exhausted (nothing of this step is left to draw). */
WkStatus wk_mix_plan_step(const WkMixConfig *mix, uint64_t step, WkSourcePosition *positions, WkDraw *draws);

/* ---- pack.c: one sample -> one row ----------------------------------------------------------------- */

/* A column of the rows (wk_loader_add_column): row r is data[r * row_bytes ...], a tensor of `dtype` and
 * one row's `shape` (ndim 0: a scalar); a BYTES column also has each row's blob size. */
typedef struct {
  uint8_t *data;
  uint64_t row_bytes;
  uint32_t kind;   /* WkColumnKind */
  uint32_t dtype;  /* WkDType */
  uint32_t ndim;
  int64_t shape[WK_COLUMN_MAX_DIMS];
  int64_t *sizes;  /* BYTES: [rows], else NULL */
} WkRowColumn;

/* The rows of a micro-batch, all row-major with `rows` rows:
 *   tokens     int32 or int64 [rows, seq_len+1]   inputs are tokens[:, :-1], targets tokens[:, 1:]
 *   loss_mask  uint8 [rows, seq_len]     1 where target tokens[:, t+1] counts in the loss
 *   doc_ids    int32 [rows, seq_len+1]   document index within the row (for attention masks)
 *   positions  int32 [rows, seq_len+1]   position within its document
 * doc_ids and positions are NULL unless asked for: most recipes never read them; columns are those asked
 * for, read into the row with its tokens (loader.c). */
typedef struct {
  void *tokens;
  uint32_t token_bytes;  /* 4 (int32) or 8 (int64) */
  uint8_t *loss_mask;
  int32_t *doc_ids;
  int32_t *positions;
  uint32_t column_count;
  WkRowColumn columns[WK_BATCH_MAX_COLUMNS];
  const uint8_t *mask_column;  /* the "loss_mask" TOKEN_U8 column's data, folded into loss_mask, or NULL */
} WkRows;

/* Row `row`'s tokens: where a sample's loc->length tokens are read before wk_pack_row. */
void *wk_rows_tokens(const WkRows *rows, uint32_t seq_len, uint32_t row);
/* Completes row `row` around the sample's tokens (and columns) already read into it: mask, padding, doc
 * ids; a "loss_mask" column masks the targets where it is 0. */
void wk_pack_row(WkPackMode mode, uint32_t seq_len, uint32_t eos, const WkSampleLoc *loc, WkRows *rows,
                 uint32_t row);
/* An empty row: pad tokens, zero mask, zero columns (a skipped corrupt sample or end-of-stream padding). */
void wk_pack_empty_row(uint32_t seq_len, uint32_t pad_token, WkRows *rows, uint32_t row);

/* ---- cursor.c: the stream's whole state as a short line of text ------------------------------------ */

/* Never a list of consumed samples and never what was prefetched: just where the next batch
 * starts. The order settings are recorded so a resume with a different order is refused rather
 * than silently repeating or skipping samples. */
typedef struct {
  uint64_t step;          /* global step of the next micro-batch */
  uint32_t micro;         /* its micro-step within the step (resume onto another world: 0 only) */
  uint32_t world;
  uint32_t global_batch;
  uint32_t seq_len;
  uint64_t seed;
  WkPackMode mode;
  uint32_t shuffle;       /* 0 or 1 */
  uint64_t window_tokens, buffer_tokens;
  uint32_t partitions, chunk;
  uint64_t skipped;       /* corrupt samples masked so far on this rank (information) */
  uint32_t sources;
  uint64_t fingerprint[WK_MIX_MAX_SOURCES];
  WkSourcePosition position[WK_MIX_MAX_SOURCES];
} WkCursor;

/* 2: the block-buffer order (window and buffer in tokens). Version 1 was the shard-window order. */
enum { WK_CURSOR_VERSION = 2 };

WkStatus wk_cursor_format(const WkCursor *cursor, char *buffer, size_t capacity, size_t *length);
WkStatus wk_cursor_parse(const char *text, WkCursor *out);

#endif /* WK_LOADER_STREAM_H */
