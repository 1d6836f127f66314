/*
 * loss.c — softmax cross-entropy over a loss mask, normalised by a caller-given token count
 * (DESIGN §7: the global count of target tokens, so accumulation and world size never change the
 * gradient). The backward recomputes the softmax from the logits instead of keeping [N,V] probs.
 */
#include <math.h>

#include "../ops.h"

/* log(sum(exp(row))) computed stably around the row maximum. */
static float log_sum_exp(const float *row, size_t V) {
  float maxval = -INFINITY;
  for (size_t v = 0; v < V; v++) maxval = row[v] > maxval ? row[v] : maxval;
  float sum = 0.0f;
  for (size_t v = 0; v < V; v++) sum += expf(row[v] - maxval);
  return maxval + logf(sum);
}

int64_t cpu_cross_entropy_forward(float *losses, const float *logits, const int32_t *targets,
                                  const uint8_t *mask, size_t N, size_t V, float normalizer,
                                  double *loss_sum) {
  for (size_t n = 0; n < N; n++)  /* masked-out targets may hold anything (padding, -1) */
    if ((!mask || mask[n]) && (targets[n] < 0 || (size_t)targets[n] >= V)) return (int64_t)n;
  double sum = 0.0;
#pragma omp parallel for reduction(+ : sum) if (N * V > 65536)
  for (size_t n = 0; n < N; n++) {
    float weight = (mask && !mask[n]) ? 0.0f : 1.0f / normalizer;
    const float *row = logits + n * V;
    losses[n] = weight == 0.0f ? 0.0f : (log_sum_exp(row, V) - row[targets[n]]) * weight;
    sum += losses[n];
  }
  *loss_sum = sum;
  return -1;
}

void cpu_cross_entropy_backward(float *dlogits, const float *logits, const int32_t *targets,
                                const uint8_t *mask, size_t N, size_t V, float normalizer,
                                float dloss) {
#pragma omp parallel for if (N * V > 65536)
  for (size_t n = 0; n < N; n++) {
    if (mask && !mask[n]) continue;
    const float *row = logits + n * V;
    float lse = log_sum_exp(row, V), weight = dloss / normalizer;
    for (size_t v = 0; v < V; v++) {
      float p = expf(row[v] - lse);
      dlogits[n * V + v] += weight * (p - ((size_t)targets[n] == v ? 1.0f : 0.0f));
    }
  }
}
