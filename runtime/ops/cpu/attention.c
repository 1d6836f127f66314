/*
 * attention.c — causal multi-head self-attention on the CPU, materialising the [B,NH,T,T]
 * probabilities (fine for the small T of CPU training; the CUDA backend does the same).
 * The forward is split over queries (b, h, t); the backward over (b, h) pairs, because every
 * query t writes the key and value gradients of all earlier positions.
 */
#include <math.h>

#include "../ops.h"
#include "parallel.h"

typedef struct {
  float *out, *dqkv;
  const float *qkv, *att, *dout;
  float *att_out;
  size_t T, C, NH, hs;
  float scale;
} AttentionJob;

static float dot(const float *a, const float *b, size_t n) {
  float sum = 0.0f;
  for (size_t i = 0; i < n; i++) sum += a[i] * b[i];
  return sum;
}

/* Query item i = (b * NH + h) * T + t: its softmax row of att and its head slice of out. */
static void attention_queries(void *ctx, size_t begin, size_t end, size_t chunk) {
  AttentionJob *j = ctx;
  size_t T = j->T, C = j->C, NH = j->NH, hs = j->hs;
  for (size_t i = begin; i < end; i++) {
    size_t t = i % T, h = (i / T) % NH, b = i / (T * NH);
    const float *q = j->qkv + (b * T + t) * 3 * C + h * hs;
    float *row = j->att_out + i * T;
    float maxval = -INFINITY;
    for (size_t t2 = 0; t2 <= t; t2++) {
      row[t2] = dot(q, j->qkv + (b * T + t2) * 3 * C + C + h * hs, hs) * j->scale;
      if (row[t2] > maxval) maxval = row[t2];
    }
    float sum = 0.0f;
    for (size_t t2 = 0; t2 <= t; t2++) {
      row[t2] = expf(row[t2] - maxval);
      sum += row[t2];
    }
    for (size_t t2 = 0; t2 < T; t2++) row[t2] = t2 <= t ? row[t2] / sum : 0.0f;
    float *o = j->out + (b * T + t) * C + h * hs;
    for (size_t k = 0; k < hs; k++) o[k] = 0.0f;
    for (size_t t2 = 0; t2 <= t; t2++) {
      const float *v = j->qkv + (b * T + t2) * 3 * C + 2 * C + h * hs;
      for (size_t k = 0; k < hs; k++) o[k] += row[t2] * v[k];
    }
  }
}

void cpu_attention_forward(float *out, float *att, const float *qkv, size_t B, size_t T, size_t C,
                           size_t NH) {
  size_t hs = C / NH;
  AttentionJob job = {.out = out, .att_out = att, .qkv = qkv, .T = T, .C = C, .NH = NH, .hs = hs,
                      .scale = 1.0f / sqrtf((float)hs)};
  size_t work = T * hs;  /* per query: about T/2 keys and T/2 values of hs each */
  parallel_for(B * NH * T, work >= PARALLEL_GRAIN ? 1 : PARALLEL_GRAIN / work, attention_queries, &job);
}

/* Pair item i = b * NH + h: all of its queries, newest first or not, touch only its own slices. */
static void attention_backward_pairs(void *ctx, size_t begin, size_t end, size_t chunk) {
  AttentionJob *j = ctx;
  size_t T = j->T, C = j->C, NH = j->NH, hs = j->hs;
  for (size_t i = begin; i < end; i++) {
    size_t b = i / NH, h = i % NH;
    for (size_t t = 0; t < T; t++) {
      const float *row = j->att + (i * T + t) * T;
      const float *dy = j->dout + (b * T + t) * C + h * hs;
      const float *q = j->qkv + (b * T + t) * 3 * C + h * hs;
      float *dq = j->dqkv + (b * T + t) * 3 * C + h * hs;
      /* softmax backward needs sum_t2 att * datt first; datt[t2] = dy . v[t2] is recomputed
       * in the second pass rather than stored */
      float weighted = 0.0f;
      for (size_t t2 = 0; t2 <= t; t2++) weighted += row[t2] * dot(dy, j->qkv + (b * T + t2) * 3 * C + 2 * C + h * hs, hs);
      for (size_t t2 = 0; t2 <= t; t2++) {
        size_t base = (b * T + t2) * 3 * C + h * hs;
        const float *k = j->qkv + base + C, *v = j->qkv + base + 2 * C;
        float *dk = j->dqkv + base + C, *dv = j->dqkv + base + 2 * C;
        float dpre = row[t2] * (dot(dy, v, hs) - weighted) * j->scale;
        for (size_t k2 = 0; k2 < hs; k2++) {
          dv[k2] += row[t2] * dy[k2];
          dq[k2] += dpre * k[k2];
          dk[k2] += dpre * q[k2];
        }
      }
    }
  }
}

void cpu_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                            size_t B, size_t T, size_t C, size_t NH) {
  size_t hs = C / NH;
  AttentionJob job = {.dqkv = dqkv, .dout = dout, .qkv = qkv, .att = att, .T = T, .C = C, .NH = NH,
                      .hs = hs, .scale = 1.0f / sqrtf((float)hs)};
  parallel_for(B * NH, 1, attention_backward_pairs, &job);
}
