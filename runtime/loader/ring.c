/*
 * ring.c — the loader's ring of micro-batch buffers: how many there are (prefetch, bounded by the memory
 * budget and by what each source's node cache can hold in flight) and each one's layout in pinned
 * memory (tokens, mask, info, doc ids and positions, then the columns asked for), with the tensors made
 * over it once (device_copy.c).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "loader.h"

static size_t align_up(size_t n) { return (n + BUFFER_ALIGNMENT - 1) / BUFFER_ALIGNMENT * BUFFER_ALIGNMENT; }

static uint32_t token_bytes(const WkLoader *loader) {
  return param(loader, WK_LOADER_DTYPE) == WK_I64 ? sizeof(int64_t) : sizeof(int32_t);
}

/* Bytes of the columns' arrays in a buffer: each column's rows, and a BYTES column's sizes. */
static size_t columns_size(const WkLoader *loader) {
  size_t bytes = 0, m = loader->rows;
  for (uint32_t c = 0; c < loader->column_count; c++) {
    WkRowColumn column;
    bytes += align_up(m * loader_column_row(loader, c, &column));
    if (column.kind == WK_COLUMN_BYTES) bytes += align_up(m * sizeof(int64_t));
  }
  return bytes;
}

static size_t buffer_size(const WkLoader *loader) {
  size_t m = loader->rows, L = (size_t)param(loader, WK_LOADER_SEQ_LEN);
  size_t bytes = align_up(m * (L + 1) * token_bytes(loader)) + align_up(m * L) + align_up(m * sizeof(WkSampleInfo));
  if (param(loader, WK_LOADER_DOCUMENT_IDS)) bytes += 2 * align_up(m * (L + 1) * sizeof(int32_t));
  return bytes + columns_size(loader);
}

/* Places the columns' arrays from p on (in the order columns_size counts them). */
static void place_columns(const WkLoader *loader, WkRows *rows, char *p) {
  size_t m = loader->rows;
  rows->column_count = loader->column_count;
  rows->mask_column = NULL;
  for (uint32_t c = 0; c < loader->column_count; c++) {
    WkRowColumn *column = &rows->columns[c];
    loader_column_row(loader, c, column);
    column->data = (uint8_t *)p;
    p += align_up(m * column->row_bytes);
    if (column->kind == WK_COLUMN_BYTES) {
      column->sizes = (int64_t *)p;
      p += align_up(m * sizeof(int64_t));
    }
    if (column->kind == WK_COLUMN_TOKEN_U8 && strcmp(loader->columns[c].name, "loss_mask") == 0)
      rows->mask_column = column->data;
  }
}

static WkStatus allocate_buffer(WkLoader *loader, Buffer *b) {
  size_t m = loader->rows, L = (size_t)param(loader, WK_LOADER_SEQ_LEN);
  /* Pinned when a GPU is present, so host-to-device copies of a batch run asynchronously. */
  WK_TRY(wk_storage_new(MEMORY_PINNED, 0, loader->buffer_bytes, &b->storage));
  char *p = b->storage->data;
  b->rows.tokens = p;
  b->rows.token_bytes = token_bytes(loader);
  p += align_up(m * (L + 1) * b->rows.token_bytes);
  b->rows.loss_mask = (uint8_t *)p;
  p += align_up(m * L);
  b->info = (WkSampleInfo *)p;
  p += align_up(m * sizeof(WkSampleInfo));
  if (param(loader, WK_LOADER_DOCUMENT_IDS)) {
    b->rows.doc_ids = (int32_t *)p;
    b->rows.positions = (int32_t *)(p + align_up(m * (L + 1) * sizeof(int32_t)));
    p += 2 * align_up(m * (L + 1) * sizeof(int32_t));
  }
  place_columns(loader, &b->rows, p);
  return wk_batch_tensors_new(&b->tensors, b->storage, &b->rows, loader->rows, (uint32_t)L, loader->device_copy);
}

void loader_free_buffer(Buffer *b) {
  wk_batch_tensors_free(&b->tensors);
  if (b->storage) wk_storage_release(b->storage);
  b->storage = NULL;
}

/* Buffers of source i live at once while `ring` micro-batches are in flight: in each partition, those an
 * interval of their draws can overlap (the steps they span and the step being planned, over the
 * source's mean buffer), plus one, as the interval rarely starts on a buffer's first draw. */
static uint64_t buffers_in_flight(const WkLoader *loader, uint32_t i, uint32_t ring) {
  const WkOrder *order = loader->sources[i].order;
  uint64_t partitions = (uint64_t)param(loader, WK_LOADER_PARTITIONS);
  uint64_t draws = ((ring + loader->micro_steps - 1) / loader->micro_steps + 1) * loader->mix.global_batch;
  double per_buffer = (double)wk_order_buffer_units(order) * (double)wk_order_epoch_length(order) /
                      (double)(wk_order_total_units(order) ? wk_order_total_units(order) : 1);
  if (per_buffer < 1) per_buffer = 1;
  return partitions * ((uint64_t)ceil((double)draws / (double)partitions / per_buffer) + 1);
}

/* The ring: `prefetch` micro-batches (default 4 per thread + 4), fewer when the memory budget or a
 * source's node cache cannot hold what that many in flight need, and never fewer than two; plus the
 * earlier micro-batches of a step, held while its later ones are taken (readers never go more than
 * the prefetch ahead: see ahead_limit). */
static WkStatus ring_size(WkLoader *loader, uint32_t *count) {
  uint32_t threads = (uint32_t)param(loader, WK_LOADER_THREADS), held = loader->micro_steps - 1;
  uint32_t n = param(loader, WK_LOADER_PREFETCH) ? (uint32_t)param(loader, WK_LOADER_PREFETCH)
                                                 : DEFAULT_PREFETCH_PER_THREAD * (threads + 1);
  int64_t budget = param(loader, WK_LOADER_MEMORY_BUDGET);
  if (budget > 0 && (uint64_t)(n + held) * loader->buffer_bytes > (uint64_t)budget) {
    uint64_t fit = (uint64_t)budget / loader->buffer_bytes;
    if (fit < MIN_RING + held)
      return WK_FAIL(WK_ERR_NOMEM, "memory budget %lld bytes holds fewer than %u micro-batches of %zu bytes (2 in "
                     "flight, and the %u earlier ones of a step, held while its last is taken)", (long long)budget,
                     MIN_RING + held, loader->buffer_bytes, held);
    n = (uint32_t)(fit - held);
  }
  for (uint32_t i = 0; i < loader->mix.count; i++) {
    WkNodeReader *r = loader->sources[i].node_reader;
    uint64_t room = wk_node_reader_buffers_room(r);
    while (n > MIN_RING && buffers_in_flight(loader, i, n) > room) n--;
    uint64_t need = buffers_in_flight(loader, i, n);
    if (need > room)
      return WK_FAIL(WK_ERR_INVALID_ARG, "source '%s': node_cache_bytes %lld holds %llu shuffle pools of %llu units but "
                     "%llu are in use at once (%u micro-batches in flight, global batch %u, plus the straddling edges "
                     "of a window); it needs at least %llu bytes (raise node_cache_bytes, or lower shuffle.pool_tokens)",
                     loader->sources[i].path, (long long)param(loader, WK_LOADER_NODE_CACHE_BYTES), (unsigned long long)room,
                     (unsigned long long)wk_order_buffer_units(loader->sources[i].order), (unsigned long long)need,
                     n, loader->mix.global_batch, (unsigned long long)wk_node_reader_cache_bytes_for(r, need));
  }
  *count = n + held;
  return WK_OK;
}

WkStatus loader_size_ring(WkLoader *loader, uint32_t *count) {
  loader->buffer_bytes = buffer_size(loader);
  return ring_size(loader, count);
}

WkStatus loader_allocate_ring(WkLoader *loader) {
  if (loader->buffers) return WK_OK; /* allocated by an earlier start that failed later on */
  uint32_t count = 0;
  WK_TRY(loader_size_ring(loader, &count));
  Buffer *buffers = wk_calloc(count, sizeof(Buffer), "loader ring");
  /* Where each row's sample lives: planning metadata, kept out of the (pinned) batch memory. */
  WkSampleLoc *locs = wk_calloc((size_t)count * loader->rows, sizeof(WkSampleLoc), "loader sample locations");
  WkStatus status = buffers && locs ? WK_OK : wk_last_status();
  uint32_t made = 0;
  for (; status == WK_OK && made < count; made++) {
    buffers[made].locs = locs + (size_t)made * loader->rows;
    status = allocate_buffer(loader, &buffers[made]);
  }
  if (status != WK_OK) {
    for (uint32_t j = 0; buffers && j < made; j++) loader_free_buffer(&buffers[j]);
    free(buffers);
    free(locs);
    return status;
  }
  loader->buffers = buffers;
  loader->locs = locs;
  loader->buffer_count = count;
  loader->draws = wk_calloc(loader->mix.global_batch, sizeof(WkDraw), "loader step plan");
  return loader->draws ? WK_OK : wk_last_status();
}
