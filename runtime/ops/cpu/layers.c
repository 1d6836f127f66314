/*
 * layers.c — CPU kernels for the embedding, layernorm and matmul (OpenBLAS sgemm) of GPT-2.
 * Row-parallel loops use OpenMP; parameter-gradient reductions run over columns so that threads
 * never write the same element.
 */
#include <cblas.h>  /* OpenBLAS */
#include <math.h>

#include "../ops.h"

int64_t cpu_embedding_forward(float *out, const int32_t *idx, const float *wte, const float *wpe,
                              size_t B, size_t T, size_t C, size_t V) {
  for (size_t n = 0; n < B * T; n++)
    if (idx[n] < 0 || (size_t)idx[n] >= V) return (int64_t)n;
#pragma omp parallel for if (B * T * C > 65536)
  for (size_t n = 0; n < B * T; n++) {
    const float *token = wte + (size_t)idx[n] * C, *position = wpe + (n % T) * C;
    for (size_t c = 0; c < C; c++) out[n * C + c] = token[c] + position[c];
  }
  return -1;
}

void cpu_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *idx,
                            size_t B, size_t T, size_t C) {
  for (size_t n = 0; n < B * T; n++) {
    float *token = dwte + (size_t)idx[n] * C, *position = dwpe + (n % T) * C;
    for (size_t c = 0; c < C; c++) {
      token[c] += dout[n * C + c];
      position[c] += dout[n * C + c];
    }
  }
}

void cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                           const float *bias, size_t N, size_t C, float eps) {
#pragma omp parallel for if (N * C > 65536)
  for (size_t n = 0; n < N; n++) {
    const float *x = inp + n * C;
    float m = 0.0f, var = 0.0f;
    for (size_t c = 0; c < C; c++) m += x[c];
    m /= (float)C;
    for (size_t c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m);
    float s = 1.0f / sqrtf(var / (float)C + eps);
    for (size_t c = 0; c < C; c++) out[n * C + c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

void cpu_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, const float *mean,
                            const float *rstd, size_t N, size_t C) {
#pragma omp parallel for if (N * C > 65536)
  for (size_t n = 0; n < N; n++) {
    const float *x = inp + n * C, *dy = dout + n * C;
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (size_t c = 0; c < C; c++) {
      float dnorm = weight[c] * dy[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * (x[c] - mean[n]) * rstd[n];
    }
    dnorm_mean /= (float)C;
    dnorm_norm_mean /= (float)C;
    for (size_t c = 0; c < C; c++) {
      float norm = (x[c] - mean[n]) * rstd[n];
      dinp[n * C + c] += (weight[c] * dy[c] - dnorm_mean - norm * dnorm_norm_mean) * rstd[n];
    }
  }
#pragma omp parallel for if (N * C > 65536)
  for (size_t c = 0; c < C; c++) {
    float dw = 0.0f, db = 0.0f;
    for (size_t n = 0; n < N; n++) {
      dw += dout[n * C + c] * (inp[n * C + c] - mean[n]) * rstd[n];
      db += dout[n * C + c];
    }
    dweight[c] += dw;
    dbias[c] += db;
  }
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
#pragma omp parallel for if (N * OC > 65536)
  for (size_t o = 0; o < OC; o++) {
    float sum = 0.0f;
    for (size_t n = 0; n < N; n++) sum += dout[n * OC + o];
    dbias[o] += sum;
  }
}
