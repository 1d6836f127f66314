/*
 * mix.c — deterministic interleaving of sources at sample granularity.
 *
 * Each step's global batch gets n_i samples of source i with n_i = floor(credit_i + w_i * G),
 * topped up by largest remainder so the counts sum to G; the unrounded rest stays as credit. So
 * over any run of steps each source's realized count is within one sample of its weighted share:
 * exact per block, not only on average, also while weights follow a schedule. The n_i labels are
 * then spread over the batch's G draws by a keyed permutation, so every rank's slice sees the mix.
 *
 * Each source keeps its own draw counter: re-weighting or adding a source at resume time changes
 * only future draws. A source with max_epochs stops when its draws run out; its share moves to
 * the others.
 */
#include <math.h>
#include <string.h>

#include "stream.h"

double wk_schedule_at(const WkSchedule *schedule, uint64_t step) {
  uint32_t n = schedule->points;
  double x = (double)step;
  if (n == 0) return 0.0;
  if (x <= schedule->steps[0]) return schedule->weights[0];
  for (uint32_t i = 1; i < n; i++) {
    if (x <= schedule->steps[i]) {
      double span = schedule->steps[i] - schedule->steps[i - 1];
      double t = span > 0 ? (x - schedule->steps[i - 1]) / span : 1.0;
      return schedule->weights[i - 1] + t * (schedule->weights[i] - schedule->weights[i - 1]);
    }
  }
  return schedule->weights[n - 1];
}

static uint64_t available_draws(const WkMixConfig *mix, uint32_t i, const WkSourcePosition *p) {
  if (mix->max_epochs[i] == 0) return UINT64_MAX;
  uint64_t limit = mix->max_epochs[i] * mix->epoch_length[i];
  return p[i].draws < limit ? limit - p[i].draws : 0;
}

/* Counts per source for one step; returns how many draws could be filled (< G only at the end). */
static uint32_t allocate(const WkMixConfig *mix, uint64_t step, WkSourcePosition *p, uint32_t *counts) {
  uint32_t G = mix->global_batch, n = mix->count;
  double weight[WK_MIX_MAX_SOURCES], share[WK_MIX_MAX_SOURCES];
  uint64_t room[WK_MIX_MAX_SOURCES];
  uint32_t filled = 0;
  memset(counts, 0, sizeof(uint32_t) * n);
  for (uint32_t i = 0; i < n; i++) room[i] = available_draws(mix, i, p);
  /* Rounds: give each open source its share of what is left; a source that hits its limit is
   * closed and the next round spreads the rest over the others. */
  for (uint32_t round = 0; round <= n && filled < G; round++) {
    double total = 0;
    for (uint32_t i = 0; i < n; i++) {
      weight[i] = room[i] > counts[i] ? fmax(0.0, wk_schedule_at(&mix->weight[i], step)) : 0.0;
      total += weight[i];
    }
    if (total <= 0) break;
    uint32_t left = G - filled, given = 0;
    for (uint32_t i = 0; i < n; i++) {
      double exact = (round == 0 ? p[i].credit : 0.0) + weight[i] / total * left;
      double whole = fmax(0.0, floor(exact));
      share[i] = weight[i] > 0 ? exact - whole : -INFINITY;
      uint64_t take = (uint64_t)whole;
      if (take > room[i] - counts[i]) take = room[i] - counts[i];
      if (take > left - given) take = left - given;
      counts[i] += (uint32_t)take;
      given += (uint32_t)take;
      if (round == 0) p[i].credit = exact - (double)take;
    }
    /* Largest remainders get the draws rounding left over (ties: lower source index). */
    while (given < left) {
      uint32_t best = n;
      for (uint32_t i = 0; i < n; i++)
        if (share[i] > -INFINITY && counts[i] < room[i] && (best == n || share[i] > share[best])) best = i;
      if (best == n) break;
      counts[best]++;
      share[best] = -INFINITY;
      if (round == 0) p[best].credit -= 1.0;
      given++;
    }
    filled += given;
  }
  return filled;
}

WkStatus wk_mix_plan_step(const WkMixConfig *mix, uint64_t step, WkSourcePosition *positions, WkDraw *draws) {
  uint32_t G = mix->global_batch;
  uint32_t counts[WK_MIX_MAX_SOURCES];
  WkSourcePosition before[WK_MIX_MAX_SOURCES];
  memcpy(before, positions, sizeof(WkSourcePosition) * mix->count);
  uint32_t filled = allocate(mix, step, positions, counts);
  bool exhausted = true;
  for (uint32_t i = 0; i < mix->count; i++) exhausted = exhausted && available_draws(mix, i, positions) == 0;
  if (filled == 0 && !exhausted) {
    memcpy(positions, before, sizeof(WkSourcePosition) * mix->count);
    return WK_FAIL(WK_ERR_INVALID_ARG, "every weight of the mix is 0 at step %llu (check the weight schedules)",
                   (unsigned long long)step);
  }
  if (filled == 0 || (filled < G && !mix->pad_last)) {
    memcpy(positions, before, sizeof(WkSourcePosition) * mix->count);
    return WK_FAIL(WK_ERR_CLOSED, "the data stream ended at step %llu (every source used its epochs)",
                   (unsigned long long)step);
  }
  /* Draw j takes the label at permuted position perm(j) of [source 0 x n_0, source 1 x n_1, ...,
   * pad x (G - filled)]; its index is the next draw of that source in batch order. */
  uint64_t key = wk_mix64(wk_mix64(mix->seed, 0x6d6978 /* "mix" */), step);
  uint64_t next_draw[WK_MIX_MAX_SOURCES];
  for (uint32_t i = 0; i < mix->count; i++) next_draw[i] = before[i].draws;
  for (uint32_t j = 0; j < G; j++) {
    uint64_t label = mix->count == 1 ? j : wk_permute(key, G, j);
    uint32_t source = 0;
    while (source < mix->count && label >= counts[source]) label -= counts[source++];
    if (source == mix->count) {
      draws[j] = (WkDraw){.source = WK_DRAW_PAD, .index = 0};
    } else {
      draws[j] = (WkDraw){.source = source, .index = next_draw[source]++};
    }
  }
  for (uint32_t i = 0; i < mix->count; i++) positions[i].draws = next_draw[i];
  return WK_OK;
}
