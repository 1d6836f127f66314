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

/* log(sum(exp(row))) computed stably around the row maximum. */
static float log_sum_exp(const void *row, WkDType act, size_t V) {
  float maxval = -INFINITY;
  for (size_t v = 0; v < V; v++) {
    float x = stored_get(row, act, v);
    maxval = x > maxval ? x : maxval;
  }
  float sum = 0.0f;
  for (size_t v = 0; v < V; v++) sum += expf(stored_get(row, act, v) - maxval);
  return maxval + logf(sum);
}

static bool counted(const LossJob *j, size_t n) { return !j->mask || j->mask[n]; }
static int32_t target(const LossJob *j, size_t n) { return j->targets[wk_index_offset(j->at, (int64_t)n)]; }

static void loss_rows(void *ctx, size_t begin, size_t end, size_t chunk) {
  LossJob *j = ctx;
  double sum = 0.0;
  for (size_t n = begin; n < end; n++) {
    const void *row = stored_at(j->logits, j->act, n * j->V);
    j->losses[n] = counted(j, n) ? (log_sum_exp(row, j->act, j->V) - stored_get(row, j->act, (size_t)target(j, n))) / j->normalizer : 0.0f;
    sum += j->losses[n];
  }
  j->partial[chunk] = sum;
}

int64_t cpu_cross_entropy_forward(float *losses, const void *logits, WkDType act, const int32_t *targets,
                                  WkIndexLayout targets_layout, const uint8_t *mask, size_t N, size_t V,
                                  float normalizer, double *loss_sum) {
  LossJob job = {.losses = losses, .logits = logits, .act = act, .targets = targets, .at = targets_layout, .mask = mask,
                 .V = V, .normalizer = normalizer};
  for (size_t n = 0; n < N; n++)  /* masked-out targets may hold anything (padding, -1) */
    if (counted(&job, n) && (target(&job, n) < 0 || (size_t)target(&job, n) >= V)) return (int64_t)n;
  size_t grain = V >= PARALLEL_GRAIN ? 1 : PARALLEL_GRAIN / V, chunks = parallel_chunks(N, grain);
  parallel_for(N, grain, loss_rows, &job);
  double sum = 0.0;
  for (size_t c = 0; c < chunks; c++) sum += job.partial[c];
  *loss_sum = sum;
  return -1;
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
    float lse = log_sum_exp(row, j->act, j->V);
    size_t t = (size_t)target(j, n);
    for (size_t v = 0; v < j->V; v++) {
      float p = expf(stored_get(row, j->act, v) - lse);
      stored_put(drow, j->act, v, weight * (p - (t == v ? 1.0f : 0.0f)));
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
