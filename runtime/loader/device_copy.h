/*
 * device_copy.h — a ring slot's micro-batch as tensors, and the stage that copies it to the loader's
 * device (docs/pipeline.md: rows packed into pinned host buffers, then copied on a copy stream).
 *
 * Every slot of the loader's ring (loader.c) is one pinned storage that the reader threads write
 * (tokens, loss mask, optional doc ids and positions, the columns asked for: WkRows). Its tensors are made once, when the
 * ring is allocated: views of that storage on a CPU loader; with a device, tensors of the device
 * that a reader fills, once the slot is written, by an asynchronous copy on the loader's copy stream.
 * Two events order the slot between the threads without blocking the consumer:
 *   copied    recorded on the copy stream after the slot's copy; next() makes the consumer's current
 *             stream wait for it, and a reader waits for it before writing the pinned memory again;
 *   released  recorded on the consumer's stream when the loader takes the slot back; the copy stream
 *             waits for it before overwriting the device tensors the consumer's queued work may
 *             still read.
 * On a machine without a GPU the same code runs with no device: every step here is then a no-op.
 */
#ifndef WK_LOADER_DEVICE_COPY_H
#define WK_LOADER_DEVICE_COPY_H

#include "../tensor/tensor.h"
#include "stream.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { WK_BATCH_TOKENS, WK_BATCH_LOSS_MASK, WK_BATCH_DOC_IDS, WK_BATCH_POSITIONS, WK_BATCH_ARRAYS } WkBatchArray;

typedef struct {
  WkTensor *host[WK_BATCH_ARRAYS];    /* views of the slot's pinned storage (NULL: not asked for) */
  WkTensor *device[WK_BATCH_ARRAYS];  /* the same arrays in a device storage of the same layout */
  WkTensor *inputs, *targets;         /* the delivered tokens[:, :-1] and tokens[:, 1:] */
  uint32_t column_count;              /* the columns asked for, host and device as above */
  WkTensor *host_columns[WK_BATCH_MAX_COLUMNS], *device_columns[WK_BATCH_MAX_COLUMNS];
  WkTensor *host_sizes[WK_BATCH_MAX_COLUMNS], *device_sizes[WK_BATCH_MAX_COLUMNS]; /* BYTES columns only */
  /* With a device only (else NULL): both storages whole, as bytes (one copy moves the slot), and the
   * events above. */
  WkTensor *host_bytes, *device_bytes;
  WkEvent *copied, *released;
} WkBatchTensors;

typedef struct WkDeviceCopy WkDeviceCopy;

/* WK_LOADER_ON_CPU, or the index of a CUDA device this machine has (else why not, and what to do). */
WkStatus wk_device_copy_check(int64_t device);
/* The copy stage of a loader on `device` (its copy stream); *out = NULL for WK_LOADER_ON_CPU. */
WkStatus wk_device_copy_new(int64_t device, WkDeviceCopy **out);
/* Waits for every copy it queued, then frees it. NULL is fine. */
void wk_device_copy_free(WkDeviceCopy *copy);

/* The tensors of a slot whose arrays `rows` points into `storage` ([row_count, seq_len + 1] tokens and
 * so on), on copy's device or over the storage itself without one; they hold references to the
 * storages. After a failure, wk_batch_tensors_free releases what was made. */
WkStatus wk_batch_tensors_new(WkBatchTensors *t, WkStorage *storage, const WkRows *rows, uint32_t row_count,
                              uint32_t seq_len, const WkDeviceCopy *copy);
void wk_batch_tensors_free(WkBatchTensors *t);

/* Reader thread, before writing the slot's pinned memory: the previous copy out of it has finished. */
WkStatus wk_batch_tensors_reuse(WkBatchTensors *t);
/* Reader thread, once the slot is written: queues its copy to the device after `released`. */
WkStatus wk_batch_tensors_copy(WkBatchTensors *t, WkDeviceCopy *copy);
/* The tensors the consumer gets (the device ones with a device): out's tensor fields. */
void wk_batch_tensors_fields(const WkBatchTensors *t, WkBatch *out);
/* Consumer thread, in next(): the fields, and its current stream waits for the copy. */
WkStatus wk_batch_tensors_deliver(WkBatchTensors *t, WkBatch *out);
/* Consumer thread, when the loader takes the slot back: records `released` on its current stream. */
WkStatus wk_batch_tensors_release(WkBatchTensors *t);

#ifdef __cplusplus
}
#endif
#endif /* WK_LOADER_DEVICE_COPY_H */
