/*
 * attention.c — causal multi-head self-attention on the CPU, materialising the [B,NH,T,T]
 * probabilities (fine for the small T of CPU training; the CUDA backend does the same).
 *
 * Each (batch, head) pair is a handful of GEMMs on strided views of qkv (row stride 3C), the pairs
 * split over the pool's threads (about one chunk and one scratch a thread): S = Q K^T, softmax,
 * O = P V; and backward dP = dO V^T, dV += P^T dO, dS = P * (dP - rowsum(P * dP)), dQ += dS K,
 * dK += dS^T Q. The GEMMs also compute the masked upper triangle (wasted, but far cheaper than
 * scalar loops); the softmax zeroes it.
 * qkv, out, att and their gradients may be stored in a 2-byte dtype (gemm.h reads and writes them):
 * the scores and their softmax are then computed in an f32 [T,T] scratch of the chunk and P is
 * rounded into att, and every product takes its square operand as stored: O = P V reads att, and
 * the backward rounds dS to the dtype before dQ += dS K and dK += dS^T Q (llm.c's design: the GPU
 * runs all six products on the tensor cores, straight from 2-byte operands, and this reference
 * computes the same values, since a product of two 2-byte values is exact in f32).
 */
#include <math.h>
#include <stdlib.h>

#include "../ops.h"
#include "exp.h"
#include "gemm.h"
#include "parallel.h"
#include "stored.h"

/* Causal softmax of each row t of S[T,T] over columns 0..t, in place; later columns become 0. */
STORED_RUN_CLONES static void causal_softmax(float *S, size_t T) {
  for (size_t t = 0; t < T; t++) {
    float *row = S + t * T, maxval = -INFINITY, sum = 0.0f;
    for (size_t t2 = 0; t2 <= t; t2++) maxval = row[t2] > maxval ? row[t2] : maxval;
    for (size_t t2 = 0; t2 <= t; t2++) {
      row[t2] = fast_expf(row[t2] - maxval);
      sum += row[t2];
    }
    for (size_t t2 = 0; t2 < T; t2++) row[t2] = t2 <= t ? row[t2] / sum : 0.0f;
  }
}

/* A stored matrix: a [T, hs] slice of q, k or v (row stride 3C), of out and dout (row stride C), or a
 * head's [T, T] probabilities in att (row stride T). */
static GemmOperand slice(const void *data, WkDType act, size_t ld, bool trans) { return (GemmOperand){data, act, ld, trans}; }
static GemmOperand square(const float *P, size_t T, bool trans) { return (GemmOperand){P, WK_F32, T, trans}; }

/* One job over the B * NH (batch, head) pairs, n = b * NH + h, in about one chunk a thread (a GEMM
 * inside a chunk runs on its thread alone: fewer pairs than threads leave threads idle). Each chunk
 * has its own f32 scratch of `scratch_floats` (its [T,T] matrices, then the GEMM tiles). */
typedef struct {
  void *out;                        /* forward: out; backward: dqkv */
  void *att;                        /* forward: the probabilities written */
  const void *qkv, *dout, *probs;   /* dout and probs (att as forward wrote it): backward */
  WkDType act;
  size_t T, C, NH, hs, scratch_floats;
  float *scratch;
} HeadsJob;

/* The [T,T] matrices a head needs in f32: forward the scores (att itself when f32); backward dP and,
 * when att is 2-byte, P widened. Then the tiles of a 2-byte GEMM: [T,T] x [T,hs] or [T,hs] x [hs,T]. */
static size_t head_scratch_floats(WkDType act, size_t T, size_t hs, bool backward) {
  if (act == WK_F32) return backward ? T * T : 0;
  size_t by_scores = cpu_gemm_tiles(T, T, hs), by_values = cpu_gemm_tiles(T, hs, T);
  return (backward ? 2 : 1) * T * T + (by_scores > by_values ? by_scores : by_values);
}

static float *chunk_scratch(const HeadsJob *j, size_t chunk) {
  return j->scratch ? j->scratch + chunk * j->scratch_floats : NULL;
}

static void heads_forward(void *ctx, size_t begin, size_t end, size_t chunk) {
  const HeadsJob *j = ctx;
  WkDType act = j->act;
  size_t T = j->T, C = j->C, hs = j->hs;
  float scale = 1.0f / sqrtf((float)hs), *mine = chunk_scratch(j, chunk), *tiles = act == WK_F32 ? NULL : mine + T * T;
  for (size_t n = begin; n < end; n++) {
    size_t b = n / j->NH, h = n % j->NH;
    const void *q = stored_at(j->qkv, act, b * T * 3 * C + h * hs), *k = stored_at(q, act, C), *v = stored_at(q, act, 2 * C);
    void *P = stored_at(j->att, act, n * T * T);
    float *S = act == WK_F32 ? P : mine;
    cpu_gemm_in(T, T, hs, scale, slice(q, act, 3 * C, false), slice(k, act, 3 * C, true), 0.0f, S, WK_F32, T, tiles);
    causal_softmax(S, T);
    if (act != WK_F32) stored_store_run(P, S, act, T * T);
    cpu_gemm_in(T, hs, T, 1.0f, slice(P, act, T, false), slice(v, act, 3 * C, false), 0.0f,
                stored_at(j->out, act, b * T * C + h * hs), act, C, tiles);  /* O = P V, P as att holds it */
  }
}

/* Runs body over the B * NH heads with a scratch of scratch_floats a chunk. */
static WkStatus run_heads(HeadsJob *job, size_t B, ParallelBody body, const char *what) {
  size_t heads = B * job->NH, threads = parallel_threads();
  if (heads == 0) return WK_OK;
  size_t grain = heads / threads, chunks = parallel_chunks(heads, grain);
  if (job->scratch_floats > 0 && !(job->scratch = wk_malloc(chunks * job->scratch_floats * sizeof(float), what)))
    return wk_last_status();
  parallel_for(heads, grain, body, job);
  free(job->scratch);
  return WK_OK;
}

WkStatus cpu_attention_forward(void *out, void *att, const void *qkv, WkDType act, size_t B, size_t T, size_t C,
                               size_t NH) {
  HeadsJob job = {out, att, qkv, NULL, NULL, act, T, C, NH, C / NH, head_scratch_floats(act, T, C / NH, false), NULL};
  return run_heads(&job, B, heads_forward, "attention scores");
}

/* dP becomes dS = P * (dP - rowsum(P * dP)) * scale: the softmax backward, scaled for Q K^T. */
STORED_RUN_CLONES static void softmax_backward(float *dP, const float *P, size_t T, float scale) {
  for (size_t t = 0; t < T; t++) {
    float *drow = dP + t * T;
    const float *row = P + t * T;
    float weighted = 0.0f;
    for (size_t t2 = 0; t2 <= t; t2++) weighted += row[t2] * drow[t2];
    for (size_t t2 = 0; t2 < T; t2++) drow[t2] = row[t2] * (drow[t2] - weighted) * scale;
  }
}

/* The five products of each head; P in f32 (att's values widened), dS rounded to act as stored. */
static void heads_backward(void *ctx, size_t begin, size_t end, size_t chunk) {
  const HeadsJob *j = ctx;
  WkDType act = j->act;
  size_t T = j->T, C = j->C, hs = j->hs;
  float scale = 1.0f / sqrtf((float)hs), *dP = chunk_scratch(j, chunk);
  float *P32 = act == WK_F32 ? NULL : dP + T * T, *tiles = act == WK_F32 ? NULL : P32 + T * T;
  for (size_t n = begin; n < end; n++) {
    size_t b = n / j->NH, h = n % j->NH, offset = b * T * 3 * C + h * hs;
    const void *q = stored_at(j->qkv, act, offset), *k = stored_at(q, act, C), *v = stored_at(q, act, 2 * C);
    const void *dO = stored_at(j->dout, act, b * T * C + h * hs), *stored_P = stored_at(j->probs, act, n * T * T);
    void *dq = stored_at(j->out, act, offset), *dk = stored_at(dq, act, C), *dv = stored_at(dq, act, 2 * C);
    const float *P = act == WK_F32 ? stored_P : P32;
    if (act != WK_F32) stored_load_run(P32, stored_P, act, T * T);
    cpu_gemm_in(T, T, hs, 1.0f, slice(dO, act, C, false), slice(v, act, 3 * C, true), 0.0f, dP, WK_F32, T, tiles);  /* dP = dO V^T */
    cpu_gemm_in(T, hs, T, 1.0f, square(P, T, true), slice(dO, act, C, false), 1.0f, dv, act, 3 * C, tiles);         /* dV += P^T dO */
    softmax_backward(dP, P, T, scale);
    cpu_round(dP, T * T, act);  /* dS as the 2-byte operand of its products */
    cpu_gemm_in(T, hs, T, 1.0f, square(dP, T, false), slice(k, act, 3 * C, false), 1.0f, dq, act, 3 * C, tiles);    /* dQ += dS K */
    cpu_gemm_in(T, hs, T, 1.0f, square(dP, T, true), slice(q, act, 3 * C, false), 1.0f, dk, act, 3 * C, tiles);     /* dK += dS^T Q */
  }
}

WkStatus cpu_attention_backward(void *dqkv, const void *dout, const void *qkv, const void *att, WkDType act, size_t B,
                                size_t T, size_t C, size_t NH) {
  HeadsJob job = {dqkv, NULL, qkv, dout, att, act, T, C, NH, C / NH, head_scratch_floats(act, T, C / NH, true), NULL};
  return run_heads(&job, B, heads_backward, "attention backward scratch");
}
