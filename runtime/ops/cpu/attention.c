/*
 * attention.c — causal multi-head self-attention on the CPU, materialising the [B,NH,T,T]
 * probabilities (fine for the small T of CPU training; the CUDA backend does the same).
 *
 * Each (batch, head) pair is a handful of GEMMs on strided views of qkv (row stride 3C), run by
 * OpenBLAS on its own threads: S = Q K^T, softmax, O = P V; and backward dP = dO V^T,
 * dV += P^T dO, dS = P * (dP - rowsum(P * dP)), dQ += dS K, dK += dS^T Q. The GEMMs also compute
 * the masked upper triangle (wasted, but far cheaper than scalar loops); the softmax zeroes it.
 * qkv, out, att and their gradients may be stored in a 2-byte dtype (gemm.h reads and writes them):
 * the scores and their softmax are then computed in an f32 [T,T] scratch per (batch, head), and
 * O = P V uses the f32 probabilities before they are rounded into att, which backward reads.
 */
#include <math.h>
#include <stdlib.h>

#include "../ops.h"
#include "gemm.h"
#include "stored.h"

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

/* A [T, hs] slice of q, k or v (row stride 3C), or of out and dout (row stride C). */
static GemmOperand slice(const void *data, WkDType act, size_t ld, bool trans) { return (GemmOperand){data, act, ld, trans}; }
static GemmOperand square(const float *P, size_t T, bool trans) { return (GemmOperand){P, WK_F32, T, trans}; }

WkStatus cpu_attention_forward(void *out, void *att, const void *qkv, WkDType act, size_t B, size_t T, size_t C,
                               size_t NH) {
  size_t hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  float *scratch = NULL;  /* the scores of a head, when att is not f32 */
  if (act != WK_F32 && !(scratch = wk_malloc(T * T * sizeof *scratch, "attention scores"))) return wk_last_status();
  WkStatus status = WK_OK;
  for (size_t b = 0; b < B && status == WK_OK; b++) {
    for (size_t h = 0; h < NH && status == WK_OK; h++) {
      const void *q = stored_at(qkv, act, b * T * 3 * C + h * hs), *k = stored_at(q, act, C), *v = stored_at(q, act, 2 * C);
      void *P = stored_at(att, act, (b * NH + h) * T * T);
      float *S = act == WK_F32 ? P : scratch;
      status = cpu_gemm(T, T, hs, scale, slice(q, act, 3 * C, false), slice(k, act, 3 * C, true), 0.0f, S, WK_F32, T);
      if (status != WK_OK) break;
      causal_softmax(S, T);
      if (act != WK_F32) stored_store_run(P, S, act, T * T);
      status = cpu_gemm(T, hs, T, 1.0f, square(S, T, false), slice(v, act, 3 * C, false), 0.0f,
                        stored_at(out, act, b * T * C + h * hs), act, C);
    }
  }
  free(scratch);
  return status;
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

/* The five products of one (batch, head); P in f32. */
static WkStatus head_backward(void *dq, const void *dO, const void *q, const float *P, float *dP, WkDType act,
                              size_t T, size_t C, size_t hs, float scale) {
  const void *k = stored_at(q, act, C), *v = stored_at(q, act, 2 * C);
  void *dk = stored_at(dq, act, C), *dv = stored_at(dq, act, 2 * C);
  WK_TRY(cpu_gemm(T, T, hs, 1.0f, slice(dO, act, C, false), slice(v, act, 3 * C, true), 0.0f, dP, WK_F32, T));  /* dP = dO V^T */
  WK_TRY(cpu_gemm(T, hs, T, 1.0f, square(P, T, true), slice(dO, act, C, false), 1.0f, dv, act, 3 * C));         /* dV += P^T dO */
  softmax_backward(dP, P, T, scale);
  WK_TRY(cpu_gemm(T, hs, T, 1.0f, square(dP, T, false), slice(k, act, 3 * C, false), 1.0f, dq, act, 3 * C));    /* dQ += dS K */
  return cpu_gemm(T, hs, T, 1.0f, square(dP, T, true), slice(q, act, 3 * C, false), 1.0f, dk, act, 3 * C);      /* dK += dS^T Q */
}

WkStatus cpu_attention_backward(void *dqkv, const void *dout, const void *qkv, const void *att, WkDType act, size_t B,
                                size_t T, size_t C, size_t NH) {
  size_t hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  size_t matrices = act == WK_F32 ? 1 : 2;  /* dP, and P widened to f32 when att is not f32 */
  float *dP = wk_malloc(matrices * T * T * sizeof *dP, "attention backward scratch");
  if (!dP) return wk_last_status();
  float *P32 = dP + (matrices - 1) * T * T;
  WkStatus status = WK_OK;
  for (size_t b = 0; b < B && status == WK_OK; b++) {
    for (size_t h = 0; h < NH && status == WK_OK; h++) {
      size_t offset = b * T * 3 * C + h * hs;
      const void *P = stored_at(att, act, (b * NH + h) * T * T);
      if (act != WK_F32) stored_load_run(P32, P, act, T * T);
      status = head_backward(stored_at(dqkv, act, offset), stored_at(dout, act, b * T * C + h * hs),
                             stored_at(qkv, act, offset), act == WK_F32 ? P : P32, dP, act, T, C, hs, scale);
    }
  }
  free(dP);
  return status;
}
