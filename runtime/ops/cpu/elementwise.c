/*
 * elementwise.c — CPU kernels that touch each element once: fill, scale, add, axpy, rounding to
 * bf16/f16, sum of squares, normal init, GELU and the fused AdamW step.
 */
#include <math.h>

#include "../ops.h"

void cpu_fill(void *data, size_t n, size_t elem_size, const void *pattern) {
  char *out = data;
  for (size_t i = 0; i < n; i++) memcpy(out + i * elem_size, pattern, elem_size);
}

void cpu_scale(float *x, size_t n, float alpha) {
  for (size_t i = 0; i < n; i++) x[i] *= alpha;
}

void cpu_add(float *out, const float *a, const float *b, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void cpu_axpy(float *y, float alpha, const float *x, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] += alpha * x[i];
}

void cpu_round(float *x, size_t n, WkDType dtype) {
  if (dtype == WK_BF16) {
    for (size_t i = 0; i < n; i++) x[i] = wk_bf16_to_f32(wk_f32_to_bf16(x[i]));
  } else if (dtype == WK_F16) {
    for (size_t i = 0; i < n; i++) x[i] = wk_f16_to_f32(wk_f32_to_f16(x[i]));
  }
}

double cpu_sumsq(const float *x, size_t n) {
  double sum = 0.0;
#pragma omp parallel for reduction(+ : sum) if (n > 65536)
  for (size_t i = 0; i < n; i++) sum += (double)x[i] * x[i];
  return sum;
}

/* splitmix64: a counter-based generator, so element i depends only on (seed, i). */
static uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static double uniform_open(uint64_t bits) { return ((double)(bits >> 11) + 0.5) / 9007199254740992.0; }

void cpu_normal(float *x, size_t n, uint64_t seed, float mean, float std) {
  uint64_t key = mix64(seed);
  for (size_t i = 0; i < n; i++) {
    double u1 = uniform_open(mix64(key ^ (2 * i))), u2 = uniform_open(mix64(key ^ (2 * i + 1)));
    x[i] = mean + std * (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));  /* Box-Muller */
  }
}

void cpu_gelu_forward(float *out, const float *inp, size_t n) {
#pragma omp parallel for if (n > 65536)
  for (size_t i = 0; i < n; i++) {
    float x = inp[i];
    out[i] = 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + GELU_CUBE * x * x * x)));
  }
}

void cpu_gelu_backward(float *dinp, const float *dout, const float *inp, size_t n) {
#pragma omp parallel for if (n > 65536)
  for (size_t i = 0; i < n; i++) {
    float x = inp[i];
    float th = tanhf(GELU_SCALE * (x + GELU_CUBE * x * x * x));
    float sech2 = 1.0f - th * th;
    float local = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * x * x);
    dinp[i] += local * dout[i];
  }
}

void cpu_adamw(float *param, const float *grad, float *m, float *v, size_t n, float lr, float beta1,
               float beta2, float eps, float weight_decay, int64_t step, float grad_scale) {
  float m_correction = 1.0f - powf(beta1, (float)step), v_correction = 1.0f - powf(beta2, (float)step);
#pragma omp parallel for if (n > 65536)
  for (size_t i = 0; i < n; i++) {
    float g = grad[i] * grad_scale;
    m[i] = beta1 * m[i] + (1.0f - beta1) * g;
    v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
    float update = (m[i] / m_correction) / (sqrtf(v[i] / v_correction) + eps);
    param[i] -= lr * (update + weight_decay * param[i]);
  }
}
