/*
 * rmsnorm.c — CPU kernels of RMSNorm (Llama's norm): out = x / sqrt(mean(x^2) + eps) * weight over the
 * last dim C, with no mean subtracted and no bias. The f32 reciprocal rms of each row is kept for the
 * backward, which then needs no second pass over the squares. Rows are split over the worker pool;
 * the weight gradient is reduced over columns, so no two threads write the same element.
 */
#include <math.h>

#include "../ops.h"
#include "parallel.h"

typedef struct {
  float *out, *rstd, *dinp, *dweight;
  const float *inp, *weight, *dout, *saved_rstd;
  size_t N, C;
  float eps;
} RmsNormJob;

static void rmsnorm_rows(void *ctx, size_t begin, size_t end, size_t chunk) {
  RmsNormJob *j = ctx;
  size_t C = j->C;
  for (size_t n = begin; n < end; n++) {
    const float *x = j->inp + n * C;
    float sumsq = 0.0f;
    for (size_t c = 0; c < C; c++) sumsq += x[c] * x[c];
    float s = 1.0f / sqrtf(sumsq / (float)C + j->eps);
    for (size_t c = 0; c < C; c++) j->out[n * C + c] = x[c] * s * j->weight[c];
    j->rstd[n] = s;
  }
}

void cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, size_t N, size_t C,
                         float eps) {
  RmsNormJob job = {.out = out, .rstd = rstd, .inp = inp, .weight = weight, .C = C, .eps = eps};
  parallel_for(N, parallel_row_grain(3 * C), rmsnorm_rows, &job);
}

/* With xhat = x s and g = weight * dy: dx = s (g - xhat mean(g xhat)). */
static void rmsnorm_backward_rows(void *ctx, size_t begin, size_t end, size_t chunk) {
  RmsNormJob *j = ctx;
  size_t C = j->C;
  for (size_t n = begin; n < end; n++) {
    const float *x = j->inp + n * C, *dy = j->dout + n * C;
    float s = j->saved_rstd[n], g_xhat_mean = 0.0f;
    for (size_t c = 0; c < C; c++) g_xhat_mean += j->weight[c] * dy[c] * x[c] * s;
    g_xhat_mean /= (float)C;
    for (size_t c = 0; c < C; c++) j->dinp[n * C + c] += (j->weight[c] * dy[c] - x[c] * s * g_xhat_mean) * s;
  }
}

static void rmsnorm_backward_columns(void *ctx, size_t begin, size_t end, size_t chunk) {
  RmsNormJob *j = ctx;
  size_t C = j->C;
  for (size_t c = begin; c < end; c++) {
    float dw = 0.0f;
    for (size_t n = 0; n < j->N; n++) dw += j->dout[n * C + c] * j->inp[n * C + c] * j->saved_rstd[n];
    j->dweight[c] += dw;
  }
}

void cpu_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                          const float *rstd, size_t N, size_t C) {
  RmsNormJob job = {.dinp = dinp, .dweight = dweight, .inp = inp, .weight = weight, .dout = dout,
                    .saved_rstd = rstd, .N = N, .C = C};
  parallel_for(N, parallel_row_grain(5 * C), rmsnorm_backward_rows, &job);
  parallel_for(C, parallel_row_grain(3 * N), rmsnorm_backward_columns, &job);
}
