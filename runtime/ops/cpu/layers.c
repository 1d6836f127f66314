/*
 * layers.c — CPU kernels for the embedding, layernorm and matmul (OpenBLAS sgemm) of GPT-2, the
 * matmul also with GELU in its epilogue (the MLP's two products, as cuBLASLt fuses them), the
 * layernorm forward also with a residual add before it (add_layernorm: the block's x1 = x + attn
 * and ln_2 of it in one pass over the rows, the sum rounded as add rounds it, stored.h).
 * Row loops are split over the worker pool; parameter-gradient reductions are split over columns,
 * so that no two threads write the same element. Activations and the weights' compute copy are read
 * and written in their stored dtype (stored.h); the parameter gradients and the layernorm
 * statistics are f32.
 */
#include <math.h>

#include "../ops.h"
#include "gelu.h"
#include "gemm.h"
#include "parallel.h"
#include "stored.h"

/* Rows per chunk so that a chunk holds about PARALLEL_GRAIN multiply-adds. */
static size_t row_grain(size_t work_per_row) { return work_per_row >= PARALLEL_GRAIN ? 1 : PARALLEL_GRAIN / (work_per_row ? work_per_row : 1); }

typedef struct {
  void *out;
  const int32_t *idx;
  WkIndexLayout at;
  const void *wte, *wpe;
  WkDType act;
  size_t T, C, V;
} EmbeddingJob;

static int32_t id_at(const int32_t *idx, WkIndexLayout at, size_t n) { return idx[wk_index_offset(at, (int64_t)n)]; }

static void embedding_rows(void *ctx, size_t begin, size_t end, size_t chunk) {
  EmbeddingJob *j = ctx;
  for (size_t n = begin; n < end; n++) {
    int32_t id = id_at(j->idx, j->at, n);
    size_t token = (size_t)id * j->C, position = (n % j->T) * j->C;
    for (size_t c = 0; c < j->C; c++)
      stored_put(j->out, j->act, n * j->C + c,
                 wk_in_vocab(id, j->V) ? stored_get(j->wte, j->act, token + c) + stored_get(j->wpe, j->act, position + c) : 0.0f);
  }
}

/* Marks the first id of idx[0, n) outside [0, V) in *mark and *limit (kept if an earlier op marked one). */
void cpu_mark_bad_ids(uint64_t *mark, int64_t *limit, const int32_t *idx, WkIndexLayout at, const uint8_t *mask,
                      size_t n, size_t V) {
  for (size_t i = 0; i < n; i++) {
    int32_t id = id_at(idx, at, i);
    if ((mask && !mask[i]) || wk_in_vocab(id, V)) continue;
    if (wk_bad_mark(i, id) > *mark) {
      *mark = wk_bad_mark(i, id);
      *limit = (int64_t)V;
    }
    return;
  }
}

void cpu_embedding_forward(void *out, const int32_t *idx, WkIndexLayout idx_layout, const void *wte, const void *wpe,
                           WkDType act, size_t B, size_t T, size_t C, size_t V, WkStepStatus *status) {
  cpu_mark_bad_ids(&status->bad_token, &status->token_limit, idx, idx_layout, NULL, B * T, V);
  EmbeddingJob job = {out, idx, idx_layout, wte, wpe, act, T, C, V};
  parallel_for(B * T, row_grain(C), embedding_rows, &job);
}

/* Serial: rows scatter into shared token rows, and this is a small part of a step. */
void cpu_embedding_backward(float *dwte, float *dwpe, const void *dout, WkDType act, const int32_t *idx,
                            WkIndexLayout idx_layout, size_t B, size_t T, size_t C, size_t V) {
  for (size_t n = 0; n < B * T; n++) {
    int32_t id = id_at(idx, idx_layout, n);
    float *token = wk_in_vocab(id, V) ? dwte + (size_t)id * C : NULL, *position = dwpe + (n % T) * C;
    for (size_t c = 0; c < C; c++) {
      float g = stored_get(dout, act, n * C + c);
      if (token) token[c] += g;
      position[c] += g;
    }
  }
}

typedef struct {
  void *out, *dinp, *sum;
  float *mean, *rstd, *dweight, *dbias;
  const void *inp, *b, *weight, *bias, *dout;  /* inp: forward's a, the input of the norm unless b is given */
  const float *saved_mean, *saved_rstd;
  WkDType act;
  size_t C, N;
  float eps;
} LayerNormJob;

static void layernorm_rows(void *ctx, size_t begin, size_t end, size_t chunk) {
  LayerNormJob *j = ctx;
  size_t C = j->C;
  WkDType act = j->act;
  for (size_t n = begin; n < end; n++) {
    float m = 0.0f, var = 0.0f;
    for (size_t c = 0; c < C; c++) m += stored_norm_input(j->sum, j->inp, j->b, act, n * C + c);
    m /= (float)C;
    const void *x = stored_at(j->b ? j->sum : j->inp, act, n * C);
    for (size_t c = 0; c < C; c++) var += (stored_get(x, act, c) - m) * (stored_get(x, act, c) - m);
    float s = 1.0f / sqrtf(var / (float)C + j->eps);
    for (size_t c = 0; c < C; c++)
      stored_put(j->out, act, n * C + c,
                 (stored_get(x, act, c) - m) * s * stored_get(j->weight, act, c) + stored_get(j->bias, act, c));
    j->mean[n] = m;
    j->rstd[n] = s;
  }
}

void cpu_add_layernorm_forward(void *sum, void *out, float *mean, float *rstd, const void *a, const void *b,
                               const void *weight, const void *bias, WkDType act, size_t N, size_t C, float eps) {
  LayerNormJob job = {.out = out, .sum = sum, .mean = mean, .rstd = rstd, .inp = a, .b = b, .weight = weight,
                      .bias = bias, .act = act, .C = C, .eps = eps};
  parallel_for(N, row_grain((b ? 5 : 4) * C), layernorm_rows, &job);
}

static void layernorm_backward_rows(void *ctx, size_t begin, size_t end, size_t chunk) {
  LayerNormJob *j = ctx;
  size_t C = j->C;
  WkDType act = j->act;
  for (size_t n = begin; n < end; n++) {
    const void *x = stored_at(j->inp, act, n * C), *dy = stored_at(j->dout, act, n * C);
    void *dx = stored_at(j->dinp, act, n * C);
    float m = j->saved_mean[n], s = j->saved_rstd[n], dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (size_t c = 0; c < C; c++) {
      float dnorm = stored_get(j->weight, act, c) * stored_get(dy, act, c);
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * (stored_get(x, act, c) - m) * s;
    }
    dnorm_mean /= (float)C;
    dnorm_norm_mean /= (float)C;
    for (size_t c = 0; c < C; c++) {
      float norm = (stored_get(x, act, c) - m) * s;
      float dnorm = stored_get(j->weight, act, c) * stored_get(dy, act, c);
      stored_put(dx, act, c, stored_get(dx, act, c) + (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s);
    }
  }
}

static void layernorm_backward_columns(void *ctx, size_t begin, size_t end, size_t chunk) {
  LayerNormJob *j = ctx;
  size_t C = j->C;
  WkDType act = j->act;
  for (size_t c = begin; c < end; c++) {
    float dw = 0.0f, db = 0.0f;
    for (size_t n = 0; n < j->N; n++) {
      float dy = stored_get(j->dout, act, n * C + c);
      dw += dy * (stored_get(j->inp, act, n * C + c) - j->saved_mean[n]) * j->saved_rstd[n];
      db += dy;
    }
    j->dweight[c] += dw;
    j->dbias[c] += db;
  }
}

void cpu_layernorm_backward(void *dinp, float *dweight, float *dbias, const void *dout, const void *inp,
                            const void *weight, const float *mean, const float *rstd, WkDType act, size_t N,
                            size_t C) {
  LayerNormJob job = {.dinp = dinp, .dweight = dweight, .dbias = dbias, .inp = inp, .weight = weight,
                      .dout = dout, .saved_mean = mean, .saved_rstd = rstd, .act = act, .C = C, .N = N};
  parallel_for(N, row_grain(6 * C), layernorm_backward_rows, &job);
  parallel_for(C, row_grain(4 * N), layernorm_backward_columns, &job);
}

/* w is [C, OC] (out = inp @ w) or, transposed, [OC, C] (out = inp @ w^T). */
static GemmOperand weight_operand(const void *w, WkDType act, size_t C, size_t OC, int transpose_w, bool trans) {
  return (GemmOperand){w, act, transpose_w ? C : OC, trans};
}

/* out[N,OC] = inp @ w + bias, the epilogue over the unrounded values. */
static WkStatus matmul_forward(void *out, const void *inp, const void *w, const void *bias, WkDType act, size_t N,
                               size_t C, size_t OC, int transpose_w, GemmEpilogue epilogue) {
  float beta = 0.0f;
  if (bias) {
    size_t row_bytes = OC * wk_dtype_size(act);  /* bias and out share the dtype: rows copy as bytes */
    for (size_t n = 0; n < N; n++) memcpy(stored_at(out, act, n * OC), bias, row_bytes);
    beta = 1.0f;
  }
  return cpu_gemm_epilogue(N, OC, C, 1.0f, (GemmOperand){inp, act, C, false},
                           weight_operand(w, act, C, OC, transpose_w, transpose_w), beta, out, act, OC, epilogue);
}

WkStatus cpu_matmul_forward(void *out, const void *inp, const void *w, const void *bias, WkDType act, size_t N,
                            size_t C, size_t OC, int transpose_w) {
  return matmul_forward(out, inp, w, bias, act, N, C, OC, transpose_w, GEMM_NO_EPILOGUE);
}

/* The GELU epilogues, run by run (STORED_RUN values of a block's row): forward, out = gelu of the
 * product (pre, which the GEMM stores itself); backward, the product times gelu'(pre), pre as
 * stored. out and pre are [rows, width] of dtype act. */
typedef struct GeluEpilogue {
  void (*each)(const struct GeluEpilogue *e, float *values, size_t at, size_t n);  /* n values, elements at.. of out, pre */
  void *out;
  const void *pre;
  WkDType act;
  size_t width;
} GeluEpilogue;

static void gelu_block(void *ctx, float *block, size_t ld, size_t row, size_t col, size_t rows, size_t cols) {
  const GeluEpilogue *e = ctx;
  for (size_t r = 0; r < rows; r++)
    for (size_t c = 0; c < cols; c += STORED_RUN)
      e->each(e, block + r * ld + c, (row + r) * e->width + col + c, stored_run_length(c, cols));
}

static void epilogue_gelu(const GeluEpilogue *e, float *values, size_t at, size_t n) {
  float out[STORED_RUN];
  cpu_gelu_run(out, values, n);
  stored_store_at(e->out, out, e->act, at, n);
}

static void epilogue_gelu_derivative(const GeluEpilogue *e, float *values, size_t at, size_t n) {
  float pre[STORED_RUN];
  stored_load_at(pre, e->pre, e->act, at, n);
  cpu_gelu_derivative_times_run(values, pre, n);
}

WkStatus cpu_matmul_gelu_forward(void *out, void *pre, const void *inp, const void *w, const void *bias, WkDType act,
                                 size_t N, size_t C, size_t OC, int transpose_w) {
  GeluEpilogue gelu = {.each = epilogue_gelu, .out = out, .act = act, .width = OC};
  return matmul_forward(pre, inp, w, bias, act, N, C, OC, transpose_w, (GemmEpilogue){gelu_block, &gelu});
}

typedef struct {
  float *dbias;
  const void *dout;
  WkDType act;
  size_t N, OC;
} BiasJob;

static void bias_columns(void *ctx, size_t begin, size_t end, size_t chunk) {
  BiasJob *j = ctx;
  for (size_t o = begin; o < end; o++) {
    float sum = 0.0f;
    for (size_t n = 0; n < j->N; n++) sum += stored_get(j->dout, j->act, n * j->OC + o);
    j->dbias[o] += sum;
  }
}

/* dinp[N,C] = dout[N,OC] @ w^T (or @ w when w is stored transposed) + beta dinp, the epilogue over
 * the unrounded values. */
static WkStatus input_gradient(void *dinp, float beta, const void *dout, const void *w, WkDType act, size_t N, size_t C,
                               size_t OC, int transpose_w, GemmEpilogue epilogue) {
  return cpu_gemm_epilogue(N, C, OC, 1.0f, (GemmOperand){dout, act, OC, false},
                           weight_operand(w, act, C, OC, transpose_w, !transpose_w), beta, dinp, act, C, epilogue);
}

/* dw += and dbias += (when given). */
static WkStatus parameter_gradients(float *dw, float *dbias, const void *dout, const void *inp, WkDType act, size_t N,
                                    size_t C, size_t OC, int transpose_w) {
  GemmOperand dy = {dout, act, OC, false}, dy_t = {dout, act, OC, true}, x = {inp, act, C, false}, x_t = {inp, act, C, true};
  if (transpose_w) WK_TRY(cpu_gemm(OC, C, N, 1.0f, dy_t, x, 1.0f, dw, WK_F32, C));  /* dw[OC,C] += dout^T @ inp */
  else WK_TRY(cpu_gemm(C, OC, N, 1.0f, x_t, dy, 1.0f, dw, WK_F32, OC));              /* dw[C,OC] += inp^T @ dout */
  if (!dbias) return WK_OK;
  BiasJob job = {dbias, dout, act, N, OC};
  parallel_for(OC, row_grain(N), bias_columns, &job);
  return WK_OK;
}

WkStatus cpu_matmul_backward(void *dinp, float *dw, float *dbias, const void *dout, const void *inp, const void *w,
                             WkDType act, size_t N, size_t C, size_t OC, int transpose_w) {
  WK_TRY(input_gradient(dinp, 1.0f, dout, w, act, N, C, OC, transpose_w, GEMM_NO_EPILOGUE));
  return parameter_gradients(dw, dbias, dout, inp, act, N, C, OC, transpose_w);
}

/* dpre is written (beta 0): the GEMM's product goes through gelu' before its one rounding. */
WkStatus cpu_matmul_backward_gelu(void *dpre, float *dw, float *dbias, const void *dout, const void *inp,
                                  const void *w, const void *pre, WkDType act, size_t N, size_t C, size_t OC,
                                  int transpose_w) {
  GeluEpilogue gelu = {.each = epilogue_gelu_derivative, .pre = pre, .act = act, .width = C};
  WK_TRY(input_gradient(dpre, 0.0f, dout, w, act, N, C, OC, transpose_w, (GemmEpilogue){gelu_block, &gelu}));
  return parameter_gradients(dw, dbias, dout, inp, act, N, C, OC, transpose_w);
}
