/*
 * plan.c — planning a micro-batch, by the one reader thread holding the planner (outside the loader's
 * lock): the step's global batch from the mix (once per step), then this rank's rows located in their
 * sources' orders, and the units to read ahead when a row starts a new buffer.
 */
#include <stdio.h>
#include <string.h>

#include "loader.h"

/* ---- planning (by the planner, without the lock) --------------------------------------------------- */

static uint64_t hash_draws(const WkLoader *loader, uint64_t step) {
  uint64_t h = wk_mix64(step, loader->mix.global_batch);
  for (uint32_t j = 0; j < loader->mix.global_batch; j++) {
    const WkDraw *draw = &loader->draws[j];
    uint64_t source = draw->source == WK_DRAW_PAD ? 0 : wk_order_fingerprint(loader->sources[draw->source].order);
    h = wk_mix64(wk_mix64(h, source), draw->index);
  }
  return h;
}

static WkStatus plan_step(WkLoader *loader, uint64_t step) {
  memcpy(loader->step_before, loader->positions, sizeof loader->positions);
  WK_TRY(wk_mix_plan_step(&loader->mix, step, loader->positions, loader->draws));
  /* Published before any of the step's rows is read: no node cache entry this step may need is taken. */
  for (uint32_t i = 0; i < loader->mix.count; i++) wk_node_reader_plan(loader->sources[i].node_reader, loader->positions[i].draws);
  loader->have_step = true;
  loader->planned_step = step;
  loader->step_fingerprint = hash_draws(loader, step);
  return WK_OK;
}

/* Locates the rows of micro-batch b: this rank's slice of the step's global batch. */
static WkStatus plan_rows(WkLoader *loader, Buffer *b) {
  uint32_t first = (uint32_t)param(loader, WK_LOADER_RANK) * loader->per_rank + b->micro * loader->rows;
  b->ahead_count = 0;
  for (uint32_t r = 0; r < loader->rows; r++) {
    const WkDraw *draw = &loader->draws[first + r];
    WkSampleInfo *info = &b->info[r];
    memset(info, 0, sizeof *info);
    if (draw->source == WK_DRAW_PAD) {
      info->status = WK_SAMPLE_PADDING;
      continue;
    }
    uint64_t epoch_length = loader->mix.epoch_length[draw->source];
    uint64_t epoch = draw->index / epoch_length;
    Source *source = &loader->sources[draw->source];
    WK_TRY(wk_order_locate(source->order, epoch, draw->index % epoch_length, &b->locs[r]));
    if (source->ahead_from == NO_BUFFER || b->locs[r].buffer_from > source->ahead_from) {
      /* This row starts a buffer: ask for the next one (and for this one too when it is the stream's first,
       * so that its blocks come in parallel, not one read at a time). */
      for (uint32_t ahead = source->ahead_from == NO_BUFFER ? 0 : 1; ahead <= 1; ahead++) {
        WkUnitRef units[AHEAD_CAPACITY];
        uint32_t n = 0;
        WK_TRY(wk_order_units_after(source->order, epoch, draw->index % epoch_length, ahead, units,
                                    AHEAD_CAPACITY - b->ahead_count, &n));
        for (uint32_t u = 0; u < n; u++) b->ahead[b->ahead_count++] = (Ahead){draw->source, units[u]};
      }
      source->ahead_from = b->locs[r].buffer_from;
    }
    info->source = draw->source;
    info->shard = b->locs[r].shard;
    info->offset = b->locs[r].offset;
    info->length = b->locs[r].length;
    info->epoch = epoch;
  }
  return WK_OK;
}

/* Assigns the next micro-batch to buffer b. Returns false at the end of the stream. Runs without the
 * loader's lock, by the one thread holding the planner (loader->planning): what it reads and writes is
 * the planner's state, which nobody else touches (they see plan_low, published under the lock). */
bool loader_plan_next(WkLoader *loader, Buffer *b) {
  uint64_t seq = loader->next_seq;
  uint64_t absolute = loader->start.step * loader->micro_steps + loader->start.micro + seq;
  b->seq = seq;
  b->step = absolute / loader->micro_steps;
  b->micro = (uint32_t)(absolute % loader->micro_steps);
  b->status = WK_OK;
  b->skipped = 0;
  WkStatus status = WK_OK;
  if (!loader->have_step || loader->planned_step != b->step) status = plan_step(loader, b->step);
  if (status == WK_ERR_CLOSED) return false; /* the end of the stream, at micro-batch `seq` */
  if (status == WK_OK) status = plan_rows(loader, b);
  if (status != WK_OK) {
    b->status = status;
    snprintf(b->error, sizeof b->error, "%s", wk_last_error());
  }
  b->fingerprint = loader->step_fingerprint;
  memcpy(b->before, loader->step_before, sizeof b->before);
  memcpy(b->after, loader->positions, sizeof b->after);
  return true;
}
