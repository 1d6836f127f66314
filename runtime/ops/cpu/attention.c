/*
 * attention.c — causal multi-head self-attention on the CPU, materialising the [B,NH,T,T]
 * probabilities (fine for the small T of CPU training; the CUDA backend does the same).
 *
 * Each (batch, head) pair is a handful of GEMMs on strided views of qkv (row stride 3C), run by
 * OpenBLAS on its own threads: S = Q K^T, softmax, O = P V; and backward dP = dO V^T,
 * dV += P^T dO, dS = P * (dP - rowsum(P * dP)), dQ += dS K, dK += dS^T Q. The GEMMs also compute
 * the masked upper triangle (wasted, but far cheaper than scalar loops); the softmax zeroes it.
 */
#include <cblas.h>  /* OpenBLAS */
#include <math.h>
#include <stdlib.h>

#include "../ops.h"

/* Row-major C[M,N] = alpha op(A) op(B) + beta C, with explicit leading dimensions. */
static void gemm(bool trans_a, bool trans_b, size_t M, size_t N, size_t K, float alpha, const float *A, size_t lda,
                 const float *B, size_t ldb, float beta, float *Cm, size_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (int)M,
              (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, Cm, (int)ldc);
}

/* Causal softmax of each row t of S[T,T] over columns 0..t, in place; later columns become 0. */
static void causal_softmax(float *S, size_t T) {
  for (size_t t = 0; t < T; t++) {
    float *row = S + t * T, maxval = -INFINITY, sum = 0.0f;
    for (size_t t2 = 0; t2 <= t; t2++) maxval = row[t2] > maxval ? row[t2] : maxval;
    for (size_t t2 = 0; t2 <= t; t2++) {
      row[t2] = expf(row[t2] - maxval);
      sum += row[t2];
    }
    for (size_t t2 = 0; t2 < T; t2++) row[t2] = t2 <= t ? row[t2] / sum : 0.0f;
  }
}

void cpu_attention_forward(float *out, float *att, const float *qkv, size_t B, size_t T, size_t C,
                           size_t NH) {
  size_t hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  for (size_t b = 0; b < B; b++) {
    for (size_t h = 0; h < NH; h++) {
      const float *q = qkv + b * T * 3 * C + h * hs, *k = q + C, *v = q + 2 * C;
      float *P = att + (b * NH + h) * T * T;
      gemm(false, true, T, T, hs, scale, q, 3 * C, k, 3 * C, 0.0f, P, T);
      causal_softmax(P, T);
      gemm(false, false, T, hs, T, 1.0f, P, T, v, 3 * C, 0.0f, out + b * T * C + h * hs, C);
    }
  }
}

/* dP becomes dS = P * (dP - rowsum(P * dP)) * scale: the softmax backward, scaled for Q K^T. */
static void softmax_backward(float *dP, const float *P, size_t T, float scale) {
  for (size_t t = 0; t < T; t++) {
    float *drow = dP + t * T;
    const float *row = P + t * T;
    float weighted = 0.0f;
    for (size_t t2 = 0; t2 <= t; t2++) weighted += row[t2] * drow[t2];
    for (size_t t2 = 0; t2 < T; t2++) drow[t2] = row[t2] * (drow[t2] - weighted) * scale;
  }
}

WkStatus cpu_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                                size_t B, size_t T, size_t C, size_t NH) {
  size_t hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  float *dP = wk_malloc(T * T * sizeof *dP, "attention backward scratch");
  if (!dP) return wk_last_status();
  for (size_t b = 0; b < B; b++) {
    for (size_t h = 0; h < NH; h++) {
      size_t offset = b * T * 3 * C + h * hs;
      const float *q = qkv + offset, *k = q + C, *v = q + 2 * C;
      float *dq = dqkv + offset, *dk = dq + C, *dv = dq + 2 * C;
      const float *P = att + (b * NH + h) * T * T, *dO = dout + b * T * C + h * hs;
      gemm(false, true, T, T, hs, 1.0f, dO, C, v, 3 * C, 0.0f, dP, T);   /* dP = dO V^T */
      gemm(true, false, T, hs, T, 1.0f, P, T, dO, C, 1.0f, dv, 3 * C);   /* dV += P^T dO */
      softmax_backward(dP, P, T, scale);
      gemm(false, false, T, hs, T, 1.0f, dP, T, k, 3 * C, 1.0f, dq, 3 * C);  /* dQ += dS K */
      gemm(true, false, T, hs, T, 1.0f, dP, T, q, 3 * C, 1.0f, dk, 3 * C);   /* dK += dS^T Q */
    }
  }
  free(dP);
  return WK_OK;
}
