/*
 * rmsnorm.c — CPU kernels of RMSNorm (Llama's norm): out = x / sqrt(mean(x^2) + eps) * weight over the
 * last dim C, with no mean subtracted and no bias. The f32 reciprocal rms of each row is kept for the
 * backward, which then needs no second pass over the squares. The forward may add a residual first
 * (add_rmsnorm: the sum rounded as add rounds it, stored.h). Rows are split over the worker pool;
 * the weight gradient is reduced over columns, so no two threads write the same element.
 * Activations, their gradients and the weight's compute copy are read and written in their stored
 * dtype (stored.h); rstd and the weight gradient are f32, as layernorm's statistics and gradients.
 */
#include <math.h>

#include "../ops.h"
#include "parallel.h"
#include "stored.h"

typedef struct {
  void *out, *dinp, *sum;
  float *rstd, *dweight;
  const void *inp, *b, *weight, *dout;  /* inp: forward's a, the input of the norm unless b is given */
  const float *saved_rstd;
  WkDType act;
  size_t N, C;
  float eps;
} RmsNormJob;

static void rmsnorm_rows(void *ctx, size_t begin, size_t end, size_t chunk) {
  RmsNormJob *j = ctx;
  size_t C = j->C;
  WkDType act = j->act;
  for (size_t n = begin; n < end; n++) {
    float sumsq = 0.0f;
    for (size_t c = 0; c < C; c++) {
      float v = stored_norm_input(j->sum, j->inp, j->b, act, n * C + c);
      sumsq += v * v;
    }
    const void *x = stored_at(j->b ? j->sum : j->inp, act, n * C);
    float s = 1.0f / sqrtf(sumsq / (float)C + j->eps);
    for (size_t c = 0; c < C; c++)
      stored_put(j->out, act, n * C + c, stored_get(x, act, c) * s * stored_get(j->weight, act, c));
    j->rstd[n] = s;
  }
}

void cpu_add_rmsnorm_forward(void *sum, void *out, float *rstd, const void *a, const void *b, const void *weight,
                             WkDType act, size_t N, size_t C, float eps) {
  RmsNormJob job = {.out = out, .sum = sum, .rstd = rstd, .inp = a, .b = b, .weight = weight, .act = act, .C = C,
                    .eps = eps};
  parallel_for(N, parallel_row_grain((b ? 4 : 3) * C), rmsnorm_rows, &job);
}

/* With xhat = x s and g = weight * dy: dx = s (g - xhat mean(g xhat)). */
static void rmsnorm_backward_rows(void *ctx, size_t begin, size_t end, size_t chunk) {
  RmsNormJob *j = ctx;
  size_t C = j->C;
  WkDType act = j->act;
  for (size_t n = begin; n < end; n++) {
    const void *x = stored_at(j->inp, act, n * C), *dy = stored_at(j->dout, act, n * C);
    void *dx = stored_at(j->dinp, act, n * C);
    float s = j->saved_rstd[n], g_xhat_mean = 0.0f;
    for (size_t c = 0; c < C; c++)
      g_xhat_mean += stored_get(j->weight, act, c) * stored_get(dy, act, c) * stored_get(x, act, c) * s;
    g_xhat_mean /= (float)C;
    for (size_t c = 0; c < C; c++) {
      float g = stored_get(j->weight, act, c) * stored_get(dy, act, c);
      stored_put(dx, act, c, stored_get(dx, act, c) + (g - stored_get(x, act, c) * s * g_xhat_mean) * s);
    }
  }
}

static void rmsnorm_backward_columns(void *ctx, size_t begin, size_t end, size_t chunk) {
  RmsNormJob *j = ctx;
  size_t C = j->C;
  WkDType act = j->act;
  for (size_t c = begin; c < end; c++) {
    float dw = 0.0f;
    for (size_t n = 0; n < j->N; n++)
      dw += stored_get(j->dout, act, n * C + c) * stored_get(j->inp, act, n * C + c) * j->saved_rstd[n];
    j->dweight[c] += dw;
  }
}

void cpu_rmsnorm_backward(void *dinp, float *dweight, const void *dout, const void *inp, const void *weight,
                          const float *rstd, WkDType act, size_t N, size_t C) {
  RmsNormJob job = {.dinp = dinp, .dweight = dweight, .inp = inp, .weight = weight, .dout = dout,
                    .saved_rstd = rstd, .act = act, .N = N, .C = C};
  parallel_for(N, parallel_row_grain(5 * C), rmsnorm_backward_rows, &job);
  parallel_for(C, parallel_row_grain(3 * N), rmsnorm_backward_columns, &job);
}
