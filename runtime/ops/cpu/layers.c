/*
 * layers.c — CPU kernels for the embedding, layernorm and matmul (OpenBLAS sgemm) of GPT-2.
 * Row loops are split over the worker pool; parameter-gradient reductions are split over columns,
 * so that no two threads write the same element.
 */
#include <cblas.h>  /* OpenBLAS */
#include <math.h>

#include "../ops.h"
#include "parallel.h"

/* Rows per chunk so that a chunk holds about PARALLEL_GRAIN multiply-adds. */
static size_t row_grain(size_t work_per_row) { return work_per_row >= PARALLEL_GRAIN ? 1 : PARALLEL_GRAIN / (work_per_row ? work_per_row : 1); }

typedef struct {
  float *out;
  const int32_t *idx;
  WkIndexLayout at;
  const float *wte, *wpe;
  size_t T, C;
} EmbeddingJob;

static void embedding_rows(void *ctx, size_t begin, size_t end, size_t chunk) {
  EmbeddingJob *j = ctx;
  for (size_t n = begin; n < end; n++) {
    int32_t id = j->idx[wk_index_offset(j->at, (int64_t)n)];
    const float *token = j->wte + (size_t)id * j->C, *position = j->wpe + (n % j->T) * j->C;
    for (size_t c = 0; c < j->C; c++) j->out[n * j->C + c] = token[c] + position[c];
  }
}

int64_t cpu_embedding_forward(float *out, const int32_t *idx, WkIndexLayout idx_layout, const float *wte,
                              const float *wpe, size_t B, size_t T, size_t C, size_t V) {
  for (size_t n = 0; n < B * T; n++) {
    int32_t id = idx[wk_index_offset(idx_layout, (int64_t)n)];
    if (id < 0 || (size_t)id >= V) return (int64_t)n;
  }
  EmbeddingJob job = {out, idx, idx_layout, wte, wpe, T, C};
  parallel_for(B * T, row_grain(C), embedding_rows, &job);
  return -1;
}

/* Serial: rows scatter into shared token rows, and this is a small part of a step. */
void cpu_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *idx,
                            WkIndexLayout idx_layout, size_t B, size_t T, size_t C) {
  for (size_t n = 0; n < B * T; n++) {
    float *token = dwte + (size_t)idx[wk_index_offset(idx_layout, (int64_t)n)] * C, *position = dwpe + (n % T) * C;
    for (size_t c = 0; c < C; c++) {
      token[c] += dout[n * C + c];
      position[c] += dout[n * C + c];
    }
  }
}

typedef struct {
  float *out, *mean, *rstd, *dinp, *dweight, *dbias;
  const float *inp, *weight, *bias, *dout;
  const float *saved_mean, *saved_rstd;
  size_t C, N;
  float eps;
} LayerNormJob;

static void layernorm_rows(void *ctx, size_t begin, size_t end, size_t chunk) {
  LayerNormJob *j = ctx;
  size_t C = j->C;
  for (size_t n = begin; n < end; n++) {
    const float *x = j->inp + n * C;
    float m = 0.0f, var = 0.0f;
    for (size_t c = 0; c < C; c++) m += x[c];
    m /= (float)C;
    for (size_t c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m);
    float s = 1.0f / sqrtf(var / (float)C + j->eps);
    for (size_t c = 0; c < C; c++) j->out[n * C + c] = (x[c] - m) * s * j->weight[c] + j->bias[c];
    j->mean[n] = m;
    j->rstd[n] = s;
  }
}

void cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                           const float *bias, size_t N, size_t C, float eps) {
  LayerNormJob job = {.out = out, .mean = mean, .rstd = rstd, .inp = inp, .weight = weight, .bias = bias, .C = C, .eps = eps};
  parallel_for(N, row_grain(4 * C), layernorm_rows, &job);
}

static void layernorm_backward_rows(void *ctx, size_t begin, size_t end, size_t chunk) {
  LayerNormJob *j = ctx;
  size_t C = j->C;
  for (size_t n = begin; n < end; n++) {
    const float *x = j->inp + n * C, *dy = j->dout + n * C;
    float m = j->saved_mean[n], s = j->saved_rstd[n], dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (size_t c = 0; c < C; c++) {
      float dnorm = j->weight[c] * dy[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * (x[c] - m) * s;
    }
    dnorm_mean /= (float)C;
    dnorm_norm_mean /= (float)C;
    for (size_t c = 0; c < C; c++) {
      float norm = (x[c] - m) * s;
      j->dinp[n * C + c] += (j->weight[c] * dy[c] - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
}

static void layernorm_backward_columns(void *ctx, size_t begin, size_t end, size_t chunk) {
  LayerNormJob *j = ctx;
  size_t C = j->C;
  for (size_t c = begin; c < end; c++) {
    float dw = 0.0f, db = 0.0f;
    for (size_t n = 0; n < j->N; n++) {
      dw += j->dout[n * C + c] * (j->inp[n * C + c] - j->saved_mean[n]) * j->saved_rstd[n];
      db += j->dout[n * C + c];
    }
    j->dweight[c] += dw;
    j->dbias[c] += db;
  }
}

void cpu_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, const float *mean,
                            const float *rstd, size_t N, size_t C) {
  LayerNormJob job = {.dinp = dinp, .dweight = dweight, .dbias = dbias, .inp = inp, .weight = weight,
                      .dout = dout, .saved_mean = mean, .saved_rstd = rstd, .C = C, .N = N};
  parallel_for(N, row_grain(6 * C), layernorm_backward_rows, &job);
  parallel_for(C, row_grain(4 * N), layernorm_backward_columns, &job);
}

/* w is [C, OC] (out = inp @ w) or, transposed, [OC, C] (out = inp @ w^T). */
void cpu_matmul_forward(float *out, const float *inp, const float *w, const float *bias, size_t N,
                        size_t C, size_t OC, int transpose_w) {
  float beta = 0.0f;
  if (bias) {
    for (size_t n = 0; n < N; n++) memcpy(out + n * OC, bias, OC * sizeof *bias);
    beta = 1.0f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, transpose_w ? CblasTrans : CblasNoTrans, (int)N, (int)OC,
              (int)C, 1.0f, inp, (int)C, w, transpose_w ? (int)C : (int)OC, beta, out, (int)OC);
}

typedef struct {
  float *dbias;
  const float *dout;
  size_t N, OC;
} BiasJob;

static void bias_columns(void *ctx, size_t begin, size_t end, size_t chunk) {
  BiasJob *j = ctx;
  for (size_t o = begin; o < end; o++) {
    float sum = 0.0f;
    for (size_t n = 0; n < j->N; n++) sum += j->dout[n * j->OC + o];
    j->dbias[o] += sum;
  }
}

void cpu_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                         const float *w, size_t N, size_t C, size_t OC, int transpose_w) {
  /* dinp[N,C] += dout[N,OC] @ w^T (or @ w when w is stored transposed) */
  cblas_sgemm(CblasRowMajor, CblasNoTrans, transpose_w ? CblasNoTrans : CblasTrans, (int)N, (int)C,
              (int)OC, 1.0f, dout, (int)OC, w, transpose_w ? (int)C : (int)OC, 1.0f, dinp, (int)C);
  if (transpose_w) /* dw[OC,C] += dout^T @ inp */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)OC, (int)C, (int)N, 1.0f, dout, (int)OC,
                inp, (int)C, 1.0f, dw, (int)C);
  else /* dw[C,OC] += inp^T @ dout */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)C, (int)OC, (int)N, 1.0f, inp, (int)C,
                dout, (int)OC, 1.0f, dw, (int)OC);
  if (!dbias) return;
  BiasJob job = {dbias, dout, N, OC};
  parallel_for(OC, row_grain(N), bias_columns, &job);
}
