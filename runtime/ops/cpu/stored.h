/*
 * stored.h — reading and writing activations in the dtype they are stored in (f32, bf16 or f16).
 *
 * Under a bf16/fp16 policy the activations, their gradients and the compute copy of the weights are
 * 2-byte arrays; the CPU kernels still compute in f32. Each element is widened exactly when it is
 * read and rounded to nearest even when it is written (wk_f32_to_bf16, wk_f32_to_f16: the rules of
 * every dtype cast), so the arithmetic between a load and a store is that of the f32 kernels. The
 * dtype is a loop invariant: gcc -O3 unswitches the small loops, so the f32 path keeps its plain
 * loads. A kernel whose loop must vectorize (an exp per element) instead works in runs: STORED_RUN
 * elements loaded into f32 buffers on the stack, one f32 loop over restrict pointers, the results
 * stored back; an f32 run is a memcpy each way, a few percent of the exps between.
 */
#ifndef WK_OPS_CPU_STORED_H
#define WK_OPS_CPU_STORED_H

#include "../ops.h"

/* Element i of data (of dtype f32, bf16 or f16) as f32, exactly. */
static inline float stored_get(const void *data, WkDType dtype, size_t i) {
  if (dtype == WK_BF16) return wk_bf16_to_f32(((const uint16_t *)data)[i]);
  if (dtype == WK_F16) return wk_f16_to_f32(((const uint16_t *)data)[i]);
  return ((const float *)data)[i];
}

/* Writes value into element i, rounded to nearest even when the dtype is 2-byte. */
static inline void stored_put(void *data, WkDType dtype, size_t i, float value) {
  if (dtype == WK_BF16) ((uint16_t *)data)[i] = wk_f32_to_bf16(value);
  else if (dtype == WK_F16) ((uint16_t *)data)[i] = wk_f32_to_f16(value);
  else ((float *)data)[i] = value;
}

/* The address of element i. */
static inline void *stored_at(const void *data, WkDType dtype, size_t i) {
  return (char *)data + i * wk_dtype_size(dtype);
}

/* sum[i] = a[i] + b[i], the f32 sum rounded once on the store (add's rule, which the fused residual
 * norms share, so that the sum they write is add's to the bit); returns the value stored, as f32. */
static inline float stored_add(void *sum, const void *a, const void *b, WkDType dtype, size_t i) {
  stored_put(sum, dtype, i, stored_get(a, dtype, i) + stored_get(b, dtype, i));
  return stored_get(sum, dtype, i);
}

/* Element i of a norm's input on the first pass over its row: a[i], or with a residual b the sum
 * a + b rounded into sum (stored_add). The later passes read the row from sum (or a). */
static inline float stored_norm_input(void *sum, const void *a, const void *b, WkDType dtype, size_t i) {
  return b ? stored_add(sum, a, b, dtype, i) : stored_get(a, dtype, i);
}

/* n elements from src into f32 dst, and back: one loop per dtype, so that each vectorizes. */
static inline void stored_load_run(float *restrict dst, const void *restrict src, WkDType dtype, size_t n) {
  const uint16_t *half = src;
  if (dtype == WK_BF16) {
    for (size_t i = 0; i < n; i++) dst[i] = wk_bf16_to_f32(half[i]);
  } else if (dtype == WK_F16) {
    for (size_t i = 0; i < n; i++) dst[i] = wk_f16_to_f32(half[i]);
  } else {
    memcpy(dst, src, n * sizeof *dst);
  }
}

static inline void stored_store_run(void *restrict dst, const float *restrict src, WkDType dtype, size_t n) {
  uint16_t *half = dst;
  if (dtype == WK_BF16) {
    for (size_t i = 0; i < n; i++) half[i] = wk_f32_to_bf16(src[i]);
  } else if (dtype == WK_F16) {
    for (size_t i = 0; i < n; i++) half[i] = wk_f32_to_f16(src[i]);
  } else {
    memcpy(dst, src, n * sizeof *src);
  }
}

enum { STORED_RUN = 256 };

/* A run's loop compiled for AVX-512, for AVX2 and for the x86-64 baseline, the version for the CPU
 * chosen when the library loads (an ifunc): the baseline alone runs 4 floats an instruction. -std=c11
 * never contracts a * b + c into an FMA, and sums keep their order, so every version computes the
 * same values. */
#if defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define STORED_RUN_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
#endif
#ifndef STORED_RUN_CLONES
#define STORED_RUN_CLONES
#endif

/* The length of the run at start of [start, end). */
static inline size_t stored_run_length(size_t start, size_t end) {
  return end - start < STORED_RUN ? end - start : STORED_RUN;
}

/* Elements [start, start + n) of data into the f32 run dst, and back. */
static inline void stored_load_at(float *restrict dst, const void *restrict data, WkDType dtype, size_t start, size_t n) {
  stored_load_run(dst, stored_at(data, dtype, start), dtype, n);
}

static inline void stored_store_at(void *restrict data, const float *restrict src, WkDType dtype, size_t start, size_t n) {
  stored_store_run(stored_at(data, dtype, start), src, dtype, n);
}

#endif /* WK_OPS_CPU_STORED_H */
