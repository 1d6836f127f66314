/*
 * elementwise.c — CPU kernels that touch each element once: fill, scale, add, axpy, rounding to
 * bf16/f16, sum of squares, normal init, GELU (whose runs the matmul's GELU epilogue shares, gelu.h)
 * and the fused AdamW step. The ones that run every step on large tensors (GELU, AdamW, sum of
 * squares) are split over the worker pool. add, axpy and GELU read and write activations of any
 * float dtype (stored.h); the others work on f32 only.
 */
#include <math.h>

#include "../ops.h"
#include "exp.h"
#include "gelu.h"
#include "parallel.h"
#include "stored.h"

void cpu_fill(void *data, size_t n, size_t elem_size, const void *pattern) {
  static const unsigned char zero[8];
  if (memcmp(pattern, zero, elem_size) == 0) {  /* zeroing gradients every step: memset is faster */
    memset(data, 0, n * elem_size);
    return;
  }
  char *out = data;
  for (size_t i = 0; i < n; i++) memcpy(out + i * elem_size, pattern, elem_size);
}

void cpu_scale(float *x, size_t n, float alpha) {
  for (size_t i = 0; i < n; i++) x[i] *= alpha;
}

void cpu_add(void *out, const void *a, const void *b, WkDType act, size_t n) {
  for (size_t i = 0; i < n; i++) stored_add(out, a, b, act, i);
}

void cpu_axpy(void *y, float alpha, const void *x, WkDType act, size_t n) {
  for (size_t i = 0; i < n; i++) stored_put(y, act, i, stored_get(y, act, i) + alpha * stored_get(x, act, i));
}

void cpu_round(float *x, size_t n, WkDType dtype) {
  if (dtype == WK_BF16) {
    for (size_t i = 0; i < n; i++) x[i] = wk_bf16_to_f32(wk_f32_to_bf16(x[i]));
  } else if (dtype == WK_F16) {
    for (size_t i = 0; i < n; i++) x[i] = wk_f16_to_f32(wk_f32_to_f16(x[i]));
  }
}

typedef struct {
  const float *x;
  double partial[PARALLEL_MAX_CHUNKS];
} SumsqJob;

static void sumsq_chunk(void *ctx, size_t begin, size_t end, size_t chunk) {
  SumsqJob *job = ctx;
  double sum = 0.0;
  for (size_t i = begin; i < end; i++) sum += (double)job->x[i] * job->x[i];
  job->partial[chunk] = sum;
}

double cpu_sumsq(const float *x, size_t n) {
  SumsqJob job = {.x = x};
  size_t chunks = parallel_chunks(n, PARALLEL_GRAIN);
  parallel_for(n, PARALLEL_GRAIN, sumsq_chunk, &job);
  double sum = 0.0;
  for (size_t c = 0; c < chunks; c++) sum += job.partial[c];
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

typedef struct {
  void *out;
  const void *inp, *dout;
  WkDType act;
} GeluJob;

/* tanh(u) = 1 - 2 / (e^2u + 1): 4x faster than glibc's tanhf and within 2e-7 of it; the limits
 * come out exact (e^2u = inf gives 1, e^2u = 0 gives -1). */
static float gelu_tanh(float x) { return 1.0f - 2.0f / (fast_expf(2.0f * wk_gelu_tanh_arg(x)) + 1.0f); }

STORED_RUN_CLONES void cpu_gelu_run(float *restrict out, const float *restrict inp, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = wk_gelu(inp[i], gelu_tanh(inp[i]));
}

STORED_RUN_CLONES static void gelu_backward_run(float *restrict dinp, const float *restrict dout, const float *restrict inp, size_t n) {
  for (size_t i = 0; i < n; i++) dinp[i] += wk_gelu_derivative(inp[i], gelu_tanh(inp[i])) * dout[i];
}

STORED_RUN_CLONES void cpu_gelu_derivative_times_run(float *restrict d, const float *restrict inp, size_t n) {
  for (size_t i = 0; i < n; i++) d[i] = wk_gelu_derivative(inp[i], gelu_tanh(inp[i])) * d[i];
}

static void gelu_forward_chunk(void *ctx, size_t begin, size_t end, size_t chunk) {
  GeluJob *job = ctx;
  float out[STORED_RUN], inp[STORED_RUN];
  for (size_t i = begin; i < end; i += STORED_RUN) {
    size_t n = stored_run_length(i, end);
    stored_load_at(inp, job->inp, job->act, i, n);
    cpu_gelu_run(out, inp, n);
    stored_store_at(job->out, out, job->act, i, n);
  }
}

static void gelu_backward_chunk(void *ctx, size_t begin, size_t end, size_t chunk) {
  GeluJob *job = ctx;
  float dinp[STORED_RUN], dout[STORED_RUN], inp[STORED_RUN];
  for (size_t i = begin; i < end; i += STORED_RUN) {
    size_t n = stored_run_length(i, end);
    stored_load_at(dinp, job->out, job->act, i, n);
    stored_load_at(dout, job->dout, job->act, i, n);
    stored_load_at(inp, job->inp, job->act, i, n);
    gelu_backward_run(dinp, dout, inp, n);
    stored_store_at(job->out, dinp, job->act, i, n);
  }
}

void cpu_gelu_forward(void *out, const void *inp, WkDType act, size_t n) {
  GeluJob job = {.out = out, .inp = inp, .act = act};
  parallel_for(n, PARALLEL_GRAIN / 16, gelu_forward_chunk, &job);  /* an element costs ~16 multiply-adds */
}

void cpu_gelu_backward(void *dinp, const void *dout, const void *inp, WkDType act, size_t n) {
  GeluJob job = {.out = dinp, .inp = inp, .dout = dout, .act = act};
  parallel_for(n, PARALLEL_GRAIN / 16, gelu_backward_chunk, &job);
}

typedef struct {
  float *param, *m, *v;
  const float *grad;
  float lr, beta1, beta2, eps, weight_decay, m_correction, v_correction, grad_scale;
} AdamJob;

/* Four separate arrays (restrict), so the loop vectorizes. */
STORED_RUN_CLONES static void adamw_run(float *restrict param, const float *restrict grad, float *restrict m,
                                        float *restrict v, size_t n, const AdamJob *j) {
  for (size_t i = 0; i < n; i++) {
    float g = grad[i] * j->grad_scale;
    m[i] = j->beta1 * m[i] + (1.0f - j->beta1) * g;
    v[i] = j->beta2 * v[i] + (1.0f - j->beta2) * g * g;
    float update = (m[i] / j->m_correction) / (sqrtf(v[i] / j->v_correction) + j->eps);
    param[i] -= j->lr * (update + j->weight_decay * param[i]);
  }
}

static void adamw_chunk(void *ctx, size_t begin, size_t end, size_t chunk) {
  AdamJob *j = ctx;
  adamw_run(j->param + begin, j->grad + begin, j->m + begin, j->v + begin, end - begin, j);
}

void cpu_adamw(float *param, const float *grad, float *m, float *v, size_t n, float lr, float beta1,
               float beta2, float eps, float weight_decay, int64_t step, float grad_scale) {
  AdamJob job = {param, m, v, grad, lr, beta1, beta2, eps, weight_decay,
                 1.0f - powf(beta1, (float)step), 1.0f - powf(beta2, (float)step), grad_scale};
  parallel_for(n, PARALLEL_GRAIN, adamw_chunk, &job);
}
