/*
 * qkv_pack.c — grouped-query attention in front of the causal attention op: packs separate q
 * [B,T,NH*hs], k and v [B,T,KVH*hs] into the fused qkv [B,T,3*NH*hs] that wk_op_attention reads,
 * repeating each kv head for the NH/KVH query heads of its group; the backward splits dqkv back
 * and sums each group's gradient into its kv head. A copy of B*T*3C floats per layer is cheap
 * next to the attention's [T,T] products, and the attention kernels stay one implementation.
 */
#include <string.h>

#include "../ops.h"
#include "parallel.h"

typedef struct {
  float *qkv, *dq, *dk, *dv;
  const float *q, *k, *v, *dqkv;
  size_t NH, KVH, hs;
} PackJob;

static void pack_rows(void *ctx, size_t begin, size_t end, size_t chunk) {
  PackJob *j = ctx;
  size_t C = j->NH * j->hs, KC = j->KVH * j->hs, group = j->NH / j->KVH;
  for (size_t n = begin; n < end; n++) {
    float *row = j->qkv + n * 3 * C;
    memcpy(row, j->q + n * C, C * sizeof *row);
    for (size_t h = 0; h < j->NH; h++) {
      size_t kv = (h / group) * j->hs;
      memcpy(row + C + h * j->hs, j->k + n * KC + kv, j->hs * sizeof *row);
      memcpy(row + 2 * C + h * j->hs, j->v + n * KC + kv, j->hs * sizeof *row);
    }
  }
}

static void unpack_rows(void *ctx, size_t begin, size_t end, size_t chunk) {
  PackJob *j = ctx;
  size_t C = j->NH * j->hs, KC = j->KVH * j->hs, group = j->NH / j->KVH;
  for (size_t n = begin; n < end; n++) {
    const float *row = j->dqkv + n * 3 * C;
    for (size_t c = 0; c < C; c++) j->dq[n * C + c] += row[c];
    for (size_t h = 0; h < j->NH; h++) {
      float *dk = j->dk + n * KC + (h / group) * j->hs, *dv = j->dv + n * KC + (h / group) * j->hs;
      for (size_t i = 0; i < j->hs; i++) {
        dk[i] += row[C + h * j->hs + i];
        dv[i] += row[2 * C + h * j->hs + i];
      }
    }
  }
}

void cpu_qkv_pack(float *qkv, const float *q, const float *k, const float *v, size_t N, size_t NH, size_t KVH,
                  size_t hs) {
  PackJob job = {.qkv = qkv, .q = q, .k = k, .v = v, .NH = NH, .KVH = KVH, .hs = hs};
  parallel_for(N, parallel_row_grain(3 * NH * hs), pack_rows, &job);
}

void cpu_qkv_pack_backward(float *dq, float *dk, float *dv, const float *dqkv, size_t N, size_t NH, size_t KVH,
                           size_t hs) {
  PackJob job = {.dq = dq, .dk = dk, .dv = dv, .dqkv = dqkv, .NH = NH, .KVH = KVH, .hs = hs};
  parallel_for(N, parallel_row_grain(3 * NH * hs), unpack_rows, &job);
}
