/*
 * attention.cu — the CUDA mirror of runtime/ops/cpu/attention.c: causal self-attention over a packed
 * [B, T, 3C] qkv, forward and backward.
 */
#include "common.cuh"

/* ---- attention ------------------------------------------------------------------------------------ */

/* One thread per query (b, h, t): scores, softmax into its att row, then the weighted values. */
__global__ static void attention_forward_kernel(float *out, float *att, const float *qkv, size_t B, size_t T, size_t C,
                                                size_t NH) {
  size_t hs = C / NH;
  float scale = rsqrtf((float)hs);
  GRID_STRIDE(i, B * NH * T) {
    size_t t = i % T, h = (i / T) % NH, b = i / (T * NH);
    const float *q = qkv + (b * T + t) * 3 * C + h * hs;
    float *row = att + ((b * NH + h) * T + t) * T;
    float maxval = -INFINITY;
    for (size_t t2 = 0; t2 <= t; t2++) {
      const float *k = qkv + (b * T + t2) * 3 * C + C + h * hs;
      float dot = 0.0f;
      for (size_t j = 0; j < hs; j++) dot += q[j] * k[j];
      row[t2] = dot * scale;
      maxval = fmaxf(maxval, row[t2]);
    }
    float sum = 0.0f;
    for (size_t t2 = 0; t2 <= t; t2++) {
      row[t2] = expf(row[t2] - maxval);
      sum += row[t2];
    }
    for (size_t t2 = 0; t2 < T; t2++) row[t2] = t2 <= t ? row[t2] / sum : 0.0f;
    float *o = out + (b * T + t) * C + h * hs;
    for (size_t j = 0; j < hs; j++) {
      float acc = 0.0f;
      for (size_t t2 = 0; t2 <= t; t2++) acc += row[t2] * qkv[(b * T + t2) * 3 * C + 2 * C + h * hs + j];
      o[j] = acc;
    }
  }
}

__device__ static float dot_hs(const float *a, const float *b, size_t n) {
  float sum = 0.0f;
  for (size_t j = 0; j < n; j++) sum += a[j] * b[j];
  return sum;
}

/* One thread per query; key and value gradients of earlier positions are scattered with atomics. */
__global__ static void attention_backward_kernel(float *dqkv, const float *dout, const float *qkv, const float *att,
                                                 size_t B, size_t T, size_t C, size_t NH) {
  size_t hs = C / NH;
  float scale = rsqrtf((float)hs);
  GRID_STRIDE(i, B * NH * T) {
    size_t t = i % T, h = (i / T) % NH, b = i / (T * NH);
    const float *row = att + ((b * NH + h) * T + t) * T;
    const float *dy = dout + (b * T + t) * C + h * hs, *q = qkv + (b * T + t) * 3 * C + h * hs;
    float *dq = dqkv + (b * T + t) * 3 * C + h * hs;
    float weighted = 0.0f;
    for (size_t t2 = 0; t2 <= t; t2++) weighted += row[t2] * dot_hs(dy, qkv + (b * T + t2) * 3 * C + 2 * C + h * hs, hs);
    for (size_t t2 = 0; t2 <= t; t2++) {
      size_t base = (b * T + t2) * 3 * C + h * hs;
      const float *k = qkv + base + C, *v = qkv + base + 2 * C;
      float dpre = row[t2] * (dot_hs(dy, v, hs) - weighted) * scale;
      for (size_t j = 0; j < hs; j++) {
        atomicAdd(&dqkv[base + 2 * C + j], row[t2] * dy[j]);
        dq[j] += dpre * k[j];
        atomicAdd(&dqkv[base + C + j], dpre * q[j]);
      }
    }
  }
}

extern "C" WkStatus cuda_attention_forward(float *out, float *att, const float *qkv, size_t B, size_t T, size_t C,
                                           size_t NH) {
  if (B * NH * T) LAUNCH(attention_forward_kernel, B * NH * T, out, att, qkv, B, T, C, NH);
  return WK_OK;
}

extern "C" WkStatus cuda_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att, size_t B,
                                            size_t T, size_t C, size_t NH) {
  if (B * NH * T) LAUNCH(attention_backward_kernel, B * NH * T, dqkv, dout, qkv, att, B, T, C, NH);
  return WK_OK;
}
