/*
 * device_copy.c — a ring slot's micro-batch as tensors, and its copy to the loader's device
 * (device_copy.h says how the slot moves between the reader threads, the copy stream and the
 * consumer). The loader calls in at five points: ring allocation (the tensors), before and after a
 * reader fills the slot (reuse, copy), next() (deliver) and taking the slot back (release); and
 * wk_loader_slot shows a slot's tensors to a binding (fields).
 */
#include <stdlib.h>

#include "device_copy.h"

struct WkDeviceCopy {
  int device;
  WkStream *stream;  /* the loader's own copy stream, shared by its reader threads */
};

/* Tokens are i32 or i64 by the loader's dtype. */
static const WkDType ARRAY_DTYPES[WK_BATCH_ARRAYS] = {
    [WK_BATCH_LOSS_MASK] = WK_U8, [WK_BATCH_DOC_IDS] = WK_I32, [WK_BATCH_POSITIONS] = WK_I32};
static const char *const ARRAY_NAMES[WK_BATCH_ARRAYS] = {"tokens", "loss_mask", "doc_ids", "positions"};

WkStatus wk_device_copy_check(int64_t device) {
  if (device == WK_LOADER_ON_CPU) return WK_OK;
  int count = wk_cuda_device_count();
  if (device < 0 || device >= count)
    return WK_FAIL(WK_ERR_UNSUPPORTED, "loader device cuda:%lld: this machine has %d CUDA device(s)%s", (long long)device,
                   count, count == 0 ? " (no GPU, no driver, or a libwick built without CUDA); leave the loader on "
                                       "the CPU (no device option) and copy batches to the model's device yourself"
                                     : "");
  return WK_OK;
}

WkStatus wk_device_copy_new(int64_t device, WkDeviceCopy **out) {
  *out = NULL;
  if (device == WK_LOADER_ON_CPU) return WK_OK;
  WK_TRY(wk_device_copy_check(device));
  WkDeviceCopy *copy = wk_calloc(1, sizeof *copy, "loader copy stage");
  if (!copy) return wk_last_status();
  copy->device = (int)device;
  copy->stream = wk_stream_new(WK_DEVICE_CUDA, copy->device);
  if (!copy->stream) {
    free(copy);
    return wk_error_context("the loader's copy stream");
  }
  *out = copy;
  return WK_OK;
}

void wk_device_copy_free(WkDeviceCopy *copy) {
  if (!copy) return;
  /* Queued copies read the pinned ring and write device tensors that may go back to the allocator. */
  if (wk_device_synchronize(WK_DEVICE_CUDA, copy->device) != WK_OK)
    wk_logf(WK_LOG_WARN, "loader copy stage on cuda:%d: %s", copy->device, wk_last_error());
  wk_stream_free(copy->stream);
  free(copy);
}

/* ---- a slot's tensors -------------------------------------------------------------------------- */

/* tokens[:, first : first + seq_len] of a [rows, seq_len + 1] tensor. */
static WkTensor *shifted_view(const WkTensor *tokens, int64_t first) {
  int64_t rows = wk_tensor_size(tokens, 0), width = wk_tensor_size(tokens, 1);
  int64_t shape[2] = {rows, width - 1}, strides[2] = {width, 1};
  return wk_tensor_view(tokens, wk_tensor_offset(tokens) + first, 2, shape, strides);
}

/* A u8 tensor of all of s. */
static WkTensor *storage_bytes(WkStorage *s) {
  int64_t shape[1] = {(int64_t)s->bytes};
  return wk_tensor_on_storage(s, 0, WK_U8, 1, shape);
}

/* The device storage of a slot: the pinned one's layout, so one copy moves every array. */
static WkStatus device_storage(WkBatchTensors *t, WkStorage *host, const WkDeviceCopy *copy, WkStorage **out) {
  WK_TRY(wk_storage_new(MEMORY_CUDA, copy->device, host->bytes, out));
  t->host_bytes = storage_bytes(host);
  t->device_bytes = t->host_bytes ? storage_bytes(*out) : NULL;
  t->copied = t->device_bytes ? wk_event_new(WK_DEVICE_CUDA, copy->device) : NULL;
  t->released = t->copied ? wk_event_new(WK_DEVICE_CUDA, copy->device) : NULL;
  return t->released ? WK_OK : wk_last_status();
}

/* The tensor over `array` (a place in storage) and, with a device, the same place of its storage. */
static WkStatus array_tensors(WkStorage *storage, WkStorage *device, const void *array, WkDType dtype, int ndim,
                              const int64_t *shape, WkTensor **host, WkTensor **on_device) {
  size_t offset = (size_t)((const char *)array - (const char *)storage->data);
  *host = wk_tensor_on_storage(storage, offset, dtype, ndim, shape);
  if (device && *host) *on_device = wk_tensor_on_storage(device, offset, dtype, ndim, shape);
  return *host && (!device || *on_device) ? WK_OK : wk_last_status();
}

/* A column's [rows, shape...] tensors, and a BYTES column's [rows] sizes. */
static WkStatus column_tensors(WkBatchTensors *t, WkStorage *storage, WkStorage *device, const WkRowColumn *column,
                               uint32_t c, int64_t row_count) {
  int64_t shape[1 + WK_COLUMN_MAX_DIMS] = {row_count};
  for (uint32_t d = 0; d < column->ndim; d++) shape[1 + d] = column->shape[d];
  WK_TRY(array_tensors(storage, device, column->data, (WkDType)column->dtype, 1 + (int)column->ndim, shape,
                       &t->host_columns[c], &t->device_columns[c]));
  if (!column->sizes) return WK_OK;
  return array_tensors(storage, device, column->sizes, WK_I64, 1, shape, &t->host_sizes[c], &t->device_sizes[c]);
}

WkStatus wk_batch_tensors_new(WkBatchTensors *t, WkStorage *storage, const WkRows *rows, uint32_t row_count,
                              uint32_t seq_len, const WkDeviceCopy *copy) {
  memset(t, 0, sizeof *t);
  WkStorage *device = NULL;
  if (copy && device_storage(t, storage, copy, &device) != WK_OK) {
    if (device) wk_storage_release(device);
    return wk_error_context("loader ring slot on cuda:%d", copy->device);
  }
  const void *arrays[WK_BATCH_ARRAYS] = {rows->tokens, rows->loss_mask, rows->doc_ids, rows->positions};
  const int64_t widths[WK_BATCH_ARRAYS] = {seq_len + 1, seq_len, seq_len + 1, seq_len + 1};
  WkStatus status = WK_OK;
  for (int a = 0; a < WK_BATCH_ARRAYS && status == WK_OK; a++) {
    if (!arrays[a]) continue;
    WkDType dtype = a != WK_BATCH_TOKENS ? ARRAY_DTYPES[a] : rows->token_bytes == sizeof(int64_t) ? WK_I64 : WK_I32;
    int64_t shape[2] = {row_count, widths[a]};
    if (array_tensors(storage, device, arrays[a], dtype, 2, shape, &t->host[a], &t->device[a]) != WK_OK)
      status = wk_error_context("loader batch %s", ARRAY_NAMES[a]);
  }
  t->column_count = rows->column_count;
  for (uint32_t c = 0; c < rows->column_count && status == WK_OK; c++)
    if (column_tensors(t, storage, device, &rows->columns[c], c, row_count) != WK_OK)
      status = wk_error_context("loader batch column %u", c);
  if (device) wk_storage_release(device); /* the tensors hold it now */
  if (status != WK_OK) return status;
  const WkTensor *tokens = device ? t->device[WK_BATCH_TOKENS] : t->host[WK_BATCH_TOKENS];
  t->inputs = shifted_view(tokens, 0);
  t->targets = t->inputs ? shifted_view(tokens, 1) : NULL;
  return t->targets ? WK_OK : wk_error_context("loader batch inputs and targets");
}

void wk_batch_tensors_free(WkBatchTensors *t) {
  for (int a = 0; a < WK_BATCH_ARRAYS; a++) {
    wk_tensor_free(t->host[a]);
    wk_tensor_free(t->device[a]);
  }
  for (uint32_t c = 0; c < WK_BATCH_MAX_COLUMNS; c++) {
    WkTensor *column[] = {t->host_columns[c], t->device_columns[c], t->host_sizes[c], t->device_sizes[c]};
    for (size_t i = 0; i < sizeof column / sizeof column[0]; i++) wk_tensor_free(column[i]);
  }
  WkTensor *others[] = {t->inputs, t->targets, t->host_bytes, t->device_bytes};
  for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) wk_tensor_free(others[i]);
  wk_event_free(t->copied);
  wk_event_free(t->released);
  memset(t, 0, sizeof *t);
}

/* ---- the slot's way through the threads -------------------------------------------------------- */

WkStatus wk_batch_tensors_reuse(WkBatchTensors *t) {
  return t->copied ? wk_event_synchronize(t->copied) : WK_OK;
}

WkStatus wk_batch_tensors_copy(WkBatchTensors *t, WkDeviceCopy *copy) {
  if (!copy) return WK_OK;
  WK_TRY(wk_stream_wait_event(copy->stream, t->released));
  WK_TRY(wk_tensor_copy_async(t->device_bytes, t->host_bytes, copy->stream));
  return wk_event_record(t->copied, copy->stream);
}

void wk_batch_tensors_fields(const WkBatchTensors *t, WkBatch *out) {
  WkTensor *const *delivered = t->copied ? t->device : t->host;
  out->tokens = delivered[WK_BATCH_TOKENS];
  out->loss_mask = delivered[WK_BATCH_LOSS_MASK];
  out->doc_ids = delivered[WK_BATCH_DOC_IDS];
  out->positions = delivered[WK_BATCH_POSITIONS];
  out->inputs = t->inputs;
  out->targets = t->targets;
  out->column_count = t->column_count;
  for (uint32_t c = 0; c < t->column_count; c++) {
    out->columns[c] = t->copied ? t->device_columns[c] : t->host_columns[c];
    out->column_sizes[c] = t->copied ? t->device_sizes[c] : t->host_sizes[c];
  }
}

WkStatus wk_batch_tensors_deliver(WkBatchTensors *t, WkBatch *out) {
  wk_batch_tensors_fields(t, out);
  return t->copied ? wk_stream_wait_event(NULL, t->copied) : WK_OK;
}

WkStatus wk_batch_tensors_release(WkBatchTensors *t) {
  return t->released ? wk_event_record(t->released, NULL) : WK_OK;
}
