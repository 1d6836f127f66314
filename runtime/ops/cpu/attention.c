/*
 * attention.c — causal multi-head self-attention on the CPU, materialising the [B,NH,T,T]
 * probabilities (fine for the small T of CPU training; the CUDA backend does the same).
 * The forward is parallel over (b, t, h); the backward over (b, h), because every query t
 * writes the key and value gradients of all earlier positions.
 */
#include <math.h>

#include "../ops.h"

void cpu_attention_forward(float *out, float *att, const float *qkv, size_t B, size_t T, size_t C,
                           size_t NH) {
  size_t hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(3) if (B * T * T * C > 65536)
  for (size_t b = 0; b < B; b++) {
    for (size_t t = 0; t < T; t++) {
      for (size_t h = 0; h < NH; h++) {
        const float *q = qkv + (b * T + t) * 3 * C + h * hs;
        float *row = att + ((b * NH + h) * T + t) * T;
        float maxval = -INFINITY;
        for (size_t t2 = 0; t2 <= t; t2++) {
          const float *k = qkv + (b * T + t2) * 3 * C + C + h * hs;
          float dot = 0.0f;
          for (size_t i = 0; i < hs; i++) dot += q[i] * k[i];
          row[t2] = dot * scale;
          if (row[t2] > maxval) maxval = row[t2];
        }
        float sum = 0.0f;
        for (size_t t2 = 0; t2 <= t; t2++) {
          row[t2] = expf(row[t2] - maxval);
          sum += row[t2];
        }
        for (size_t t2 = 0; t2 < T; t2++) row[t2] = t2 <= t ? row[t2] / sum : 0.0f;
        float *o = out + (b * T + t) * C + h * hs;
        for (size_t i = 0; i < hs; i++) o[i] = 0.0f;
        for (size_t t2 = 0; t2 <= t; t2++) {
          const float *v = qkv + (b * T + t2) * 3 * C + 2 * C + h * hs;
          for (size_t i = 0; i < hs; i++) o[i] += row[t2] * v[i];
        }
      }
    }
  }
}

static float dot(const float *a, const float *b, size_t n) {
  float sum = 0.0f;
  for (size_t i = 0; i < n; i++) sum += a[i] * b[i];
  return sum;
}

void cpu_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                            size_t B, size_t T, size_t C, size_t NH) {
  size_t hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2) if (B * T * T * C > 65536)
  for (size_t b = 0; b < B; b++) {
    for (size_t h = 0; h < NH; h++) {
      for (size_t t = 0; t < T; t++) {
        const float *row = att + ((b * NH + h) * T + t) * T;
        const float *dy = dout + (b * T + t) * C + h * hs;
        const float *q = qkv + (b * T + t) * 3 * C + h * hs;
        float *dq = dqkv + (b * T + t) * 3 * C + h * hs;
        /* softmax backward needs sum_t2 att * datt first; datt[t2] = dy . v[t2] is recomputed
         * in the second pass rather than stored */
        float weighted = 0.0f;
        for (size_t t2 = 0; t2 <= t; t2++)
          weighted += row[t2] * dot(dy, qkv + (b * T + t2) * 3 * C + 2 * C + h * hs, hs);
        for (size_t t2 = 0; t2 <= t; t2++) {
          size_t base = (b * T + t2) * 3 * C + h * hs;
          const float *k = qkv + base + C, *v = qkv + base + 2 * C;
          float *dk = dqkv + base + C, *dv = dqkv + base + 2 * C;
          float dpre = row[t2] * (dot(dy, v, hs) - weighted) * scale;
          for (size_t i = 0; i < hs; i++) {
            dv[i] += row[t2] * dy[i];
            dq[i] += dpre * k[i];
            dk[i] += dpre * q[i];
          }
        }
      }
    }
  }
}
