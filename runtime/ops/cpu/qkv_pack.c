/*
 * qkv_pack.c — grouped-query attention in front of the causal attention op: packs separate q
 * [B,T,NH*hs], k and v [B,T,KVH*hs] into the fused qkv [B,T,3*NH*hs] that wk_op_attention reads,
 * repeating each kv head for the NH/KVH query heads of its group; the backward splits dqkv back
 * and sums each group's gradient into its kv head. A copy of B*T*3C elements per layer is cheap
 * next to the attention's [T,T] products, and the attention kernels stay one implementation.
 * All are activations of one stored dtype (stored.h): the pack copies their bytes; the backward
 * sums a group in f32 and rounds the kv head's gradient once.
 */
#include <string.h>

#include "../ops.h"
#include "parallel.h"
#include "stored.h"

typedef struct {
  void *qkv, *dq, *dk, *dv;
  const void *q, *k, *v, *dqkv;
  WkDType act;
  size_t NH, KVH, hs;
} PackJob;

static void pack_rows(void *ctx, size_t begin, size_t end, size_t chunk) {
  PackJob *j = ctx;
  WkDType act = j->act;
  size_t C = j->NH * j->hs, KC = j->KVH * j->hs, group = j->NH / j->KVH, head_bytes = j->hs * wk_dtype_size(act);
  for (size_t n = begin; n < end; n++) {
    void *row = stored_at(j->qkv, act, n * 3 * C);
    memcpy(row, stored_at(j->q, act, n * C), C * wk_dtype_size(act));
    for (size_t h = 0; h < j->NH; h++) {
      size_t kv = n * KC + (h / group) * j->hs;
      memcpy(stored_at(row, act, C + h * j->hs), stored_at(j->k, act, kv), head_bytes);
      memcpy(stored_at(row, act, 2 * C + h * j->hs), stored_at(j->v, act, kv), head_bytes);
    }
  }
}

/* grad[i] += the sum over the group's query heads of part (the k or the v third of a dqkv row). */
static void sum_group(void *grad, const void *part, WkDType act, size_t first_head, size_t group, size_t hs) {
  for (size_t i = 0; i < hs; i++) {
    float sum = stored_get(grad, act, i);
    for (size_t h = first_head; h < first_head + group; h++) sum += stored_get(part, act, h * hs + i);
    stored_put(grad, act, i, sum);
  }
}

static void unpack_rows(void *ctx, size_t begin, size_t end, size_t chunk) {
  PackJob *j = ctx;
  WkDType act = j->act;
  size_t C = j->NH * j->hs, KC = j->KVH * j->hs, group = j->NH / j->KVH;
  for (size_t n = begin; n < end; n++) {
    const void *row = stored_at(j->dqkv, act, n * 3 * C);
    for (size_t c = 0; c < C; c++) stored_put(j->dq, act, n * C + c, stored_get(j->dq, act, n * C + c) + stored_get(row, act, c));
    for (size_t g = 0; g < j->KVH; g++) {
      size_t kv = n * KC + g * j->hs;
      sum_group(stored_at(j->dk, act, kv), stored_at(row, act, C), act, g * group, group, j->hs);
      sum_group(stored_at(j->dv, act, kv), stored_at(row, act, 2 * C), act, g * group, group, j->hs);
    }
  }
}

void cpu_qkv_pack(void *qkv, const void *q, const void *k, const void *v, WkDType act, size_t N, size_t NH,
                  size_t KVH, size_t hs) {
  PackJob job = {.qkv = qkv, .q = q, .k = k, .v = v, .act = act, .NH = NH, .KVH = KVH, .hs = hs};
  parallel_for(N, parallel_row_grain(3 * NH * hs), pack_rows, &job);
}

void cpu_qkv_pack_backward(void *dq, void *dk, void *dv, const void *dqkv, WkDType act, size_t N, size_t NH,
                           size_t KVH, size_t hs) {
  PackJob job = {.dq = dq, .dk = dk, .dv = dv, .dqkv = dqkv, .act = act, .NH = NH, .KVH = KVH, .hs = hs};
  parallel_for(N, parallel_row_grain(3 * NH * hs), unpack_rows, &job);
}
