/*
 * loss.c — softmax cross-entropy over a loss mask, normalised by a caller-given token count
 * (docs/loss.md: the global count of target tokens, so accumulation and world size never change the
 * gradient). The backward recomputes the softmax from the logits instead of keeping [N,V] probs,
 * and writes the gradient (never adds to it), so it may replace the logits in place: a row is read
 * whole for its log-sum-exp before any of it is written, and then each value right before its own.
 * The logits and their gradient may be stored in a 2-byte dtype (stored.h); the losses, the
 * log-sum-exp and the sum stay f32 and double, since a loss is a value the run reports.
 */
#include <math.h>

#include "../ops.h"
#include "exp.h"
#include "parallel.h"
#include "stored.h"

typedef struct {
  float *losses;
  void *dlogits;
  const void *logits;
  WkDType act;
  const int32_t *targets;
  WkIndexLayout at;
  const uint8_t *mask;
  size_t V;
  float normalizer, dloss;
  double partial[PARALLEL_MAX_CHUNKS];
} LossJob;

enum { LANES = 8 };  /* the partial sums and maxima of a run, that its loops vectorize */

STORED_RUN_CLONES static float run_max(const float *restrict x, size_t n, float maxval) {
  float lanes[LANES];
  for (size_t l = 0; l < LANES; l++) lanes[l] = maxval;
  size_t i = 0;
  for (; i + LANES <= n; i += LANES)
    for (size_t l = 0; l < LANES; l++) lanes[l] = x[i + l] > lanes[l] ? x[i + l] : lanes[l];
  for (; i < n; i++) maxval = x[i] > maxval ? x[i] : maxval;
  for (size_t l = 0; l < LANES; l++) maxval = lanes[l] > maxval ? lanes[l] : maxval;
  return maxval;
}

/* The sum of e^(x - shift) over a run, the exps in e. */
STORED_RUN_CLONES static float run_sum_exp(float *restrict e, const float *restrict x, size_t n, float shift) {
  for (size_t i = 0; i < n; i++) e[i] = fast_expf(x[i] - shift);
  float lanes[LANES] = {0}, sum = 0.0f;
  size_t i = 0;
  for (; i + LANES <= n; i += LANES)
    for (size_t l = 0; l < LANES; l++) lanes[l] += e[i + l];
  for (; i < n; i++) sum += e[i];
  for (size_t l = 0; l < LANES; l++) sum += lanes[l];
  return sum;
}

/* The softmax of a run times weight, given its row's log-sum-exp (the target's 1 comes after). */
STORED_RUN_CLONES static void gradient_run(float *restrict d, const float *restrict x, size_t n, float lse, float weight) {
  for (size_t i = 0; i < n; i++) d[i] = weight * fast_expf(x[i] - lse);
}

/* log(sum(exp(row))) computed stably around the row maximum, in runs of the row widened to f32. */
static float log_sum_exp(const void *row, WkDType act, size_t V) {
  float x[STORED_RUN], e[STORED_RUN], maxval = -INFINITY, sum = 0.0f;
  for (size_t v = 0; v < V; v += STORED_RUN) {
    size_t n = stored_run_length(v, V);
    stored_load_at(x, row, act, v, n);
    maxval = run_max(x, n, maxval);
  }
  for (size_t v = 0; v < V; v += STORED_RUN) {
    size_t n = stored_run_length(v, V);
    stored_load_at(x, row, act, v, n);
    sum += run_sum_exp(e, x, n, maxval);
  }
  return maxval + logf(sum);
}

static bool counted(const LossJob *j, size_t n) { return !j->mask || j->mask[n]; }
static int32_t target(const LossJob *j, size_t n) { return j->targets[wk_index_offset(j->at, (int64_t)n)]; }

static void loss_rows(void *ctx, size_t begin, size_t end, size_t chunk) {
  LossJob *j = ctx;
  double sum = 0.0;
  for (size_t n = begin; n < end; n++) {
    const void *row = stored_at(j->logits, j->act, n * j->V);
    int32_t t = target(j, n);
    bool scored = counted(j, n) && wk_in_vocab(t, j->V);  /* a bad target is marked, and scores nothing */
    j->losses[n] = scored ? (log_sum_exp(row, j->act, j->V) - stored_get(row, j->act, (size_t)t)) / j->normalizer : 0.0f;
    sum += j->losses[n];
  }
  j->partial[chunk] = sum;
}

void cpu_cross_entropy_forward(float *losses, const void *logits, WkDType act, const int32_t *targets,
                               WkIndexLayout targets_layout, const uint8_t *mask, size_t N, size_t V, float normalizer,
                               WkStepStatus *status) {
  LossJob job = {.losses = losses, .logits = logits, .act = act, .targets = targets, .at = targets_layout, .mask = mask,
                 .V = V, .normalizer = normalizer};
  /* masked-out targets may hold anything (padding, -1) */
  cpu_mark_bad_ids(&status->bad_target, &status->target_limit, targets, targets_layout, mask, N, V);
  size_t grain = V >= PARALLEL_GRAIN ? 1 : PARALLEL_GRAIN / V, chunks = parallel_chunks(N, grain);
  parallel_for(N, grain, loss_rows, &job);
  double sum = 0.0;
  for (size_t c = 0; c < chunks; c++) sum += job.partial[c];
  status->loss_sum += sum;
}

static void loss_backward_rows(void *ctx, size_t begin, size_t end, size_t chunk) {
  LossJob *j = ctx;
  float weight = j->dloss / j->normalizer;
  for (size_t n = begin; n < end; n++) {
    const void *row = stored_at(j->logits, j->act, n * j->V);
    void *drow = stored_at(j->dlogits, j->act, n * j->V);
    if (!counted(j, n)) {
      for (size_t v = 0; v < j->V; v++) stored_put(drow, j->act, v, 0.0f);
      continue;
    }
    float lse = log_sum_exp(row, j->act, j->V), x[STORED_RUN], d[STORED_RUN];
    size_t t = (size_t)target(j, n);
    for (size_t v = 0; v < j->V; v += STORED_RUN) {
      size_t len = stored_run_length(v, j->V);
      stored_load_at(x, row, j->act, v, len);
      gradient_run(d, x, len, lse, weight);
      if (t >= v && t < v + len) d[t - v] = weight * (fast_expf(x[t - v] - lse) - 1.0f);
      stored_store_at(drow, d, j->act, v, len);
    }
  }
}

void cpu_cross_entropy_backward(void *dlogits, const void *logits, WkDType act, const int32_t *targets,
                                WkIndexLayout targets_layout, const uint8_t *mask, size_t N, size_t V,
                                float normalizer, float dloss) {
  LossJob job = {.dlogits = dlogits, .logits = logits, .act = act, .targets = targets, .at = targets_layout,
                 .mask = mask, .V = V, .normalizer = normalizer, .dloss = dloss};
  parallel_for(N, V >= PARALLEL_GRAIN ? 1 : PARALLEL_GRAIN / V, loss_backward_rows, &job);
}
