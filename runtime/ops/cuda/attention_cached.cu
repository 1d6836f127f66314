/*
 * attention_cached.cu — the CUDA mirror of runtime/ops/cpu/attention_cached.c: generation's causal
 * grouped-query attention of Tq new positions against a key/value cache [B, Tmax, KVH * hs]. k and v
 * are first copied into the caches at positions start..start+Tq-1 (one 2-D copy each: a row of Tq
 * positions per sequence), then every query row n = ((b * Tq) + t) * NH + h, which reads kv head
 * h / (NH / KVH), attends to cache positions 0..start+t:
 *   scores  one warp per (row, position): the lanes stride the head (coalesced), a warp sum, the f32
 *           score times 1/sqrt(hs) into f32 scratch [rows, start + Tq];
 *   output  one block per row: the row's max, its exponentials written back and their sum (block
 *           reductions), then thread i of the head sums p(position) v[position, i] (coalesced
 *           across the threads), rounded once into out.
 * As on the CPU the scores, softmax and weighted sum are f32 and each output is rounded once; the
 * reductions have a fixed order and no atomics, so a step is deterministic. A decoding step reads
 * every cached key and value once per query head: memory-bound, like the CPU's.
 */
#include "common.cuh"

template <typename Storage>
__global__ static void cached_scores_kernel(float *scores, const Storage *q, const Storage *k_cache, size_t Tq,
                                            size_t Tmax, size_t NH, size_t KVH, size_t hs, int64_t start, size_t span,
                                            size_t pairs) {
  size_t C = NH * hs, KC = KVH * hs, group = NH / KVH;
  float scale = 1.0f / sqrtf((float)hs);  /* the CPU's expression: rsqrtf is approximate */
  ROW_LOOP(pair, pairs) {
    size_t n = pair / span, position = pair % span;
    size_t h = n % NH, t = (n / NH) % Tq, b = n / NH / Tq;
    if (position > (size_t)start + t) continue;  /* after the query: masked (warp-uniform) */
    const Storage *qrow = q + (b * Tq + t) * C + h * hs;
    const Storage *krow = k_cache + (b * Tmax + position) * KC + (h / group) * hs;
    float dot = 0.0f;
    for (size_t i = lane(); i < hs; i += WARP) dot += to_float(qrow[i]) * to_float(krow[i]);
    dot = warp_sum(dot);
    if (lane() == 0) scores[pair] = dot * scale;
  }
}

template <typename Storage>
__global__ static void cached_output_kernel(Storage *out, float *scores, const Storage *v_cache, size_t Tq,
                                            size_t Tmax, size_t NH, size_t KVH, size_t hs, int64_t start, size_t span,
                                            size_t rows) {
  size_t C = NH * hs, KC = KVH * hs, group = NH / KVH;
  for (size_t n = blockIdx.x; n < rows; n += gridDim.x) {
    size_t h = n % NH, t = (n / NH) % Tq, b = n / NH / Tq;
    size_t length = (size_t)start + t + 1;
    float *s = scores + n * span;
    float maxval = -INFINITY;
    for (size_t p = threadIdx.x; p < length; p += blockDim.x) maxval = fmaxf(maxval, s[p]);
    maxval = block_max(maxval);
    float sum = 0.0f;
    for (size_t p = threadIdx.x; p < length; p += blockDim.x) {
      s[p] = expf(s[p] - maxval);
      sum += s[p];
    }
    sum = block_sum(sum);  /* its barrier also makes every thread's s[p] visible to the block */
    const Storage *v = v_cache + b * Tmax * KC + (h / group) * hs;
    for (size_t i = threadIdx.x; i < hs; i += blockDim.x) {
      float o = 0.0f;
      for (size_t p = 0; p < length; p++) o += s[p] / sum * to_float(v[p * KC + i]);
      out[(b * Tq + t) * C + h * hs + i] = from_float<Storage>(o);
    }
  }
}

/* Copies a [B, Tq, KC] tensor into the cache [B, Tmax, KC] at position start of each sequence. */
static WkStatus cache_write(void *cache, const void *src, size_t elem, size_t B, size_t Tq, size_t Tmax, size_t KC,
                            int64_t start) {
  size_t row = Tq * KC * elem;
  CUDA_TRY(cudaMemcpy2DAsync((char *)cache + (size_t)start * KC * elem, Tmax * KC * elem, src, row, row, B,
                             cudaMemcpyDeviceToDevice, current_stream()));
  return WK_OK;
}

template <typename Storage>
static WkStatus attention_cached(Storage *out, const Storage *q, const Storage *k, const Storage *v, Storage *k_cache,
                                 Storage *v_cache, size_t B, size_t Tq, size_t Tmax, size_t NH, size_t KVH, size_t hs,
                                 int64_t start) {
  size_t KC = KVH * hs, rows = B * Tq * NH, span = (size_t)start + Tq;
  WK_TRY(cache_write(k_cache, k, sizeof(Storage), B, Tq, Tmax, KC, start));
  WK_TRY(cache_write(v_cache, v, sizeof(Storage), B, Tq, Tmax, KC, start));
  DeviceScratch scores;
  WK_TRY(scratch_new(&scores, rows * span * sizeof(float)));
  float *s = (float *)scores.ptr;
  size_t pairs = rows * span;
  cached_scores_kernel<Storage><<<blocks_for(pairs, WARPS_PER_BLOCK), THREADS, 0, current_stream()>>>(
      s, q, k_cache, Tq, Tmax, NH, KVH, hs, start, span, pairs);
  WkStatus status = launch_status("attention_cached scores");
  if (status == WK_OK) {
    cached_output_kernel<Storage><<<blocks_for(rows, 1), THREADS, 0, current_stream()>>>(
        out, s, v_cache, Tq, Tmax, NH, KVH, hs, start, span, rows);
    status = launch_status("attention_cached output");
  }
  scratch_free(&scores);  /* stream-ordered: the kernels queued before it still see the memory */
  return status;
}

extern "C" WkStatus cuda_attention_cached(WkDType dtype, void *out, const void *q, const void *k, const void *v,
                                          void *k_cache, void *v_cache, size_t B, size_t Tq, size_t Tmax, size_t NH,
                                          size_t KVH, size_t hs, int64_t start) {
  if (B * Tq * NH * hs == 0) return WK_OK;
  STORAGE_DISPATCH(dtype, "attention_cached",
                   attention_cached((Storage *)out, (const Storage *)q, (const Storage *)k, (const Storage *)v,
                                    (Storage *)k_cache, (Storage *)v_cache, B, Tq, Tmax, NH, KVH, hs, start));
}
