/*
 * attention_cached.c — causal grouped-query attention of new queries against a key/value cache, on
 * the CPU: generation's step, where the keys and values of earlier positions are kept rather than
 * recomputed. q, k and v [B,Tq,*] hold positions start..start+Tq-1: k and v are first written into the
 * caches [B,Tmax,KVH*hs] there, then every query attends to cache positions 0..its own. Query head h
 * reads kv head h/(NH/KVH).
 * Forward only: training runs the full-sequence attention op, whose backward exists.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../ops.h"
#include "parallel.h"

typedef struct {
  float *out, *scores;  /* scores: one row of Tmax floats per chunk */
  const float *q, *k, *v;
  size_t Tq, Tmax, NH, KVH, hs;
  int64_t start;
} CachedJob;

/* Rows n = ((b * Tq) + t) * NH + h: one query head of one new position. */
static void cached_rows(void *ctx, size_t begin, size_t end, size_t chunk) {
  CachedJob *j = ctx;
  size_t C = j->NH * j->hs, KC = j->KVH * j->hs, group = j->NH / j->KVH;
  float scale = 1.0f / sqrtf((float)j->hs), *s = j->scores + chunk * j->Tmax;
  for (size_t n = begin; n < end; n++) {
    size_t h = n % j->NH, t = (n / j->NH) % j->Tq, b = n / j->NH / j->Tq;
    size_t length = (size_t)j->start + t + 1;
    const float *q = j->q + (b * j->Tq + t) * C + h * j->hs;
    const float *k = j->k + b * j->Tmax * KC + (h / group) * j->hs, *v = j->v + b * j->Tmax * KC + (h / group) * j->hs;
    float maxval = -INFINITY, sum = 0.0f;
    for (size_t p = 0; p < length; p++) {
      float dot = 0.0f;
      for (size_t i = 0; i < j->hs; i++) dot += q[i] * k[p * KC + i];
      s[p] = dot * scale;
      maxval = s[p] > maxval ? s[p] : maxval;
    }
    for (size_t p = 0; p < length; p++) {
      s[p] = expf(s[p] - maxval);
      sum += s[p];
    }
    float *o = j->out + (b * j->Tq + t) * C + h * j->hs;
    for (size_t i = 0; i < j->hs; i++) o[i] = 0.0f;
    for (size_t p = 0; p < length; p++)
      for (size_t i = 0; i < j->hs; i++) o[i] += s[p] / sum * v[p * KC + i];
  }
}

WkStatus cpu_attention_cached(float *out, const float *q, const float *k, const float *v, float *k_cache,
                              float *v_cache, size_t B, size_t Tq, size_t Tmax, size_t NH, size_t KVH, size_t hs,
                              int64_t start) {
  size_t KC = KVH * hs;
  for (size_t b = 0; b < B; b++) {
    memcpy(k_cache + (b * Tmax + (size_t)start) * KC, k + b * Tq * KC, Tq * KC * sizeof *k);
    memcpy(v_cache + (b * Tmax + (size_t)start) * KC, v + b * Tq * KC, Tq * KC * sizeof *v);
  }
  size_t rows = B * Tq * NH, grain = parallel_row_grain(2 * ((size_t)start + Tq) * hs);
  if (rows == 0) return WK_OK;
  float *scores = wk_malloc(parallel_chunks(rows, grain) * Tmax * sizeof *scores, "cached attention scores");
  if (!scores) return wk_last_status();
  CachedJob job = {out, scores, q, k_cache, v_cache, Tq, Tmax, NH, KVH, hs, start};
  parallel_for(rows, grain, cached_rows, &job);
  free(scores);
  return WK_OK;
}
