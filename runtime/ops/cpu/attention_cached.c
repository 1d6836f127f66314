/*
 * attention_cached.c — causal grouped-query attention of new queries against a key/value cache, on
 * the CPU: generation's step, where the keys and values of earlier positions are kept rather than
 * recomputed. q, k and v [B,Tq,*] hold positions start..start+Tq-1: k and v are first written into the
 * caches [B,Tmax,KVH*hs] there, then every query attends to cache positions 0..its own. Query head h
 * reads kv head h/(NH/KVH). q, k, v, the caches and out share one stored dtype (stored.h): scores,
 * softmax and the weighted sum are f32, and each output element is rounded once.
 * Forward only: training runs the full-sequence attention op, whose backward exists.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../ops.h"
#include "exp.h"
#include "parallel.h"
#include "stored.h"

typedef struct {
  void *out;
  float *scratch;  /* per chunk: Tmax scores, then hs sums of the output */
  const void *q, *k, *v;
  WkDType act;
  size_t Tq, Tmax, NH, KVH, hs;
  int64_t start;
} CachedJob;

/* Rows n = ((b * Tq) + t) * NH + h: one query head of one new position. */
static void cached_rows(void *ctx, size_t begin, size_t end, size_t chunk) {
  CachedJob *j = ctx;
  WkDType act = j->act;
  size_t C = j->NH * j->hs, KC = j->KVH * j->hs, group = j->NH / j->KVH;
  float scale = 1.0f / sqrtf((float)j->hs), *s = j->scratch + chunk * (j->Tmax + j->hs), *o = s + j->Tmax;
  for (size_t n = begin; n < end; n++) {
    size_t h = n % j->NH, t = (n / j->NH) % j->Tq, b = n / j->NH / j->Tq;
    size_t length = (size_t)j->start + t + 1;
    const void *q = stored_at(j->q, act, (b * j->Tq + t) * C + h * j->hs);
    size_t kv = b * j->Tmax * KC + (h / group) * j->hs;
    const void *k = stored_at(j->k, act, kv), *v = stored_at(j->v, act, kv);
    float maxval = -INFINITY, sum = 0.0f;
    for (size_t p = 0; p < length; p++) {
      float dot = 0.0f;
      for (size_t i = 0; i < j->hs; i++) dot += stored_get(q, act, i) * stored_get(k, act, p * KC + i);
      s[p] = dot * scale;
      maxval = s[p] > maxval ? s[p] : maxval;
    }
    for (size_t p = 0; p < length; p++) {
      s[p] = fast_expf(s[p] - maxval);
      sum += s[p];
    }
    for (size_t i = 0; i < j->hs; i++) o[i] = 0.0f;
    for (size_t p = 0; p < length; p++)
      for (size_t i = 0; i < j->hs; i++) o[i] += s[p] / sum * stored_get(v, act, p * KC + i);
    stored_store_run(stored_at(j->out, act, (b * j->Tq + t) * C + h * j->hs), o, act, j->hs);
  }
}

WkStatus cpu_attention_cached(void *out, const void *q, const void *k, const void *v, void *k_cache, void *v_cache,
                              WkDType act, size_t B, size_t Tq, size_t Tmax, size_t NH, size_t KVH, size_t hs,
                              int64_t start) {
  size_t KC = KVH * hs, bytes = Tq * KC * wk_dtype_size(act);
  for (size_t b = 0; b < B; b++) {
    memcpy(stored_at(k_cache, act, (b * Tmax + (size_t)start) * KC), stored_at(k, act, b * Tq * KC), bytes);
    memcpy(stored_at(v_cache, act, (b * Tmax + (size_t)start) * KC), stored_at(v, act, b * Tq * KC), bytes);
  }
  size_t rows = B * Tq * NH, grain = parallel_row_grain(2 * ((size_t)start + Tq) * hs);
  if (rows == 0) return WK_OK;
  float *scratch = wk_malloc(parallel_chunks(rows, grain) * (Tmax + hs) * sizeof *scratch, "cached attention scores");
  if (!scratch) return wk_last_status();
  CachedJob job = {out, scratch, q, k_cache, v_cache, act, Tq, Tmax, NH, KVH, hs, start};
  parallel_for(rows, grain, cached_rows, &job);
  free(scratch);
  return WK_OK;
}
