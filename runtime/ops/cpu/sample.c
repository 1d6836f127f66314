/*
 * sample.c — the next token from a row of logits: the argmax, or a draw after temperature, top-k
 * and top-p (wick.nn.generate's sampler; the logits are on the host by then, one row per sequence).
 *
 * A draw sorts the ids by logit (descending, the lower id first among equals), keeps the top_k,
 * weighs each exp((logit - max) / temperature) in double, cuts to the smallest prefix whose share
 * of the kept weight reaches top_p, and takes the first id whose running weight passes u times the
 * prefix's: the same seed (the same u) gives the same token.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "../../core/core.h"

static int by_logit(const void *a, const void *b, void *context) {
  const float *row = context;
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  if (row[x] != row[y]) return row[x] > row[y] ? -1 : 1;
  return x < y ? -1 : (x > y);
}

static int32_t argmax(const float *row, int64_t vocab) {
  int32_t best = 0;
  for (int64_t v = 1; v < vocab; v++)
    if (row[v] > row[best]) best = (int32_t)v;
  return best;
}

static int32_t draw(const float *row, const int32_t *order, int64_t keep, double temperature, double top_p, double u,
                    double *weights) {
  double total = 0;
  for (int64_t i = 0; i < keep; i++) {
    weights[i] = exp(((double)row[order[i]] - (double)row[order[0]]) / temperature);
    total += weights[i];
  }
  int64_t cut = keep;
  double mass = 0;
  for (int64_t i = 0; i < keep; i++) { /* the smallest prefix whose probability reaches top_p */
    mass += weights[i] / total;
    if (mass >= top_p) {
      cut = i + 1;
      break;
    }
  }
  double kept = 0;
  for (int64_t i = 0; i < cut; i++) kept += weights[i];
  double target = u * kept, acc = 0;
  for (int64_t i = 0; i < cut; i++) {
    acc += weights[i];
    if (target < acc) return order[i];
  }
  return order[cut - 1];
}

WkStatus wk_sample_token(const float *row, int64_t vocab, double temperature, int64_t top_k, double top_p, double u,
                         int32_t *order, double *weights, int32_t *out) {
  if (!row || !out || vocab < 1 || vocab > INT32_MAX || !(temperature >= 0) || isinf(temperature) || top_k < 0 ||
      !(top_p > 0 && top_p <= 1) || !(u >= 0 && u < 1) || (temperature > 0 && (!order || !weights)))
    return WK_FAIL(WK_ERR_INVALID_ARG, "sample_token: vocab %lld, temperature %g, top_k %lld, top_p %g, u %g, "
                   "scratch %s: out of range", (long long)vocab, temperature, (long long)top_k, top_p, u,
                   order && weights ? "given" : "missing");
  if (temperature == 0) {
    *out = argmax(row, vocab);
    return WK_OK;
  }
  for (int64_t v = 0; v < vocab; v++) order[v] = (int32_t)v;
  qsort_r(order, (size_t)vocab, sizeof *order, by_logit, (void *)row);
  int64_t keep = top_k > 0 && top_k < vocab ? top_k : vocab;
  *out = draw(row, order, keep, temperature, top_p, u, weights);
  return WK_OK;
}
