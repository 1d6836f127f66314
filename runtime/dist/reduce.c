/*
 * reduce.c — the element-wise combinations the collectives apply: sum, max and min (avg combines
 * as sum and is divided by the world size once, at the end) over f32, bf16, f16, i32, i64 and u8:
 * the dtypes both backends reduce (NCCL has no 16-bit integer, so u16 is refused for either).
 *
 * bf16 and f16 are combined in f32 and rounded back (round to nearest even), as NCCL does. max and
 * min propagate NaN: a NaN in one rank's gradients must not vanish in the reduction. Integer sums
 * wrap around like two's complement (computed unsigned, so no undefined overflow); an integer avg
 * is the sum divided by the world size, truncated toward zero.
 */
#include <math.h>

#include "../tensor/tensor.h"
#include "dist.h"

static inline float f32_max(float a, float b) { return a > b || isnan(a) ? a : b; }
static inline float f32_min(float a, float b) { return a < b || isnan(a) ? a : b; }

/* Integer loops: sum wraps, max/min compare. */
#define INT_LOOPS(T, U)                                                          \
  do {                                                                           \
    T *o = out;                                                                  \
    const T *a = a_, *b = b_;                                                    \
    switch (op) {                                                                \
      case WK_REDUCE_SUM: case WK_REDUCE_AVG:                                    \
        for (size_t i = 0; i < n; i++) o[i] = (T)((U)a[i] + (U)b[i]);            \
        break;                                                                   \
      case WK_REDUCE_MAX: for (size_t i = 0; i < n; i++) o[i] = a[i] > b[i] ? a[i] : b[i]; break; \
      case WK_REDUCE_MIN: for (size_t i = 0; i < n; i++) o[i] = a[i] < b[i] ? a[i] : b[i]; break; \
    }                                                                            \
  } while (0)

/* 16-bit float loops: widen, combine, round back. */
#define HALF_LOOPS(TO_F32, FROM_F32)                                             \
  do {                                                                           \
    uint16_t *o = out;                                                           \
    const uint16_t *a = a_, *b = b_;                                             \
    for (size_t i = 0; i < n; i++) {                                             \
      float x = TO_F32(a[i]), y = TO_F32(b[i]);                                  \
      float r = op == WK_REDUCE_MAX ? f32_max(x, y) : op == WK_REDUCE_MIN ? f32_min(x, y) : x + y; \
      o[i] = FROM_F32(r);                                                        \
    }                                                                            \
  } while (0)

void dist_reduce(void *out, const void *a_, const void *b_, size_t n, WkDType dtype, WkReduceOp op) {
  switch (dtype) {
    case WK_F32: {
      float *o = out;
      const float *a = a_, *b = b_;
      switch (op) {
        case WK_REDUCE_SUM: case WK_REDUCE_AVG: for (size_t i = 0; i < n; i++) o[i] = a[i] + b[i]; break;
        case WK_REDUCE_MAX: for (size_t i = 0; i < n; i++) o[i] = f32_max(a[i], b[i]); break;
        case WK_REDUCE_MIN: for (size_t i = 0; i < n; i++) o[i] = f32_min(a[i], b[i]); break;
      }
      break;
    }
    case WK_BF16: HALF_LOOPS(wk_bf16_to_f32, wk_f32_to_bf16); break;
    case WK_F16: HALF_LOOPS(wk_f16_to_f32, wk_f32_to_f16); break;
    case WK_I32: INT_LOOPS(int32_t, uint32_t); break;
    case WK_I64: INT_LOOPS(int64_t, uint64_t); break;
    case WK_U8: INT_LOOPS(uint8_t, uint8_t); break;
    default: break; /* dist_dtype_supported is checked before any reduction */
  }
}

void dist_finish_average(void *data, size_t n, WkDType dtype, int world_size) {
  if (world_size == 1) return;
  switch (dtype) {
    case WK_F32: {
      float *x = data;
      for (size_t i = 0; i < n; i++) x[i] /= (float)world_size;
      break;
    }
    case WK_BF16: {
      uint16_t *x = data;
      for (size_t i = 0; i < n; i++) x[i] = wk_f32_to_bf16(wk_bf16_to_f32(x[i]) / (float)world_size);
      break;
    }
    case WK_F16: {
      uint16_t *x = data;
      for (size_t i = 0; i < n; i++) x[i] = wk_f32_to_f16(wk_f16_to_f32(x[i]) / (float)world_size);
      break;
    }
    case WK_I32: {
      int32_t *x = data;
      for (size_t i = 0; i < n; i++) x[i] /= world_size;
      break;
    }
    case WK_I64: {
      int64_t *x = data;
      for (size_t i = 0; i < n; i++) x[i] /= world_size;
      break;
    }
    case WK_U8: {
      uint8_t *x = data;
      for (size_t i = 0; i < n; i++) x[i] = (uint8_t)(x[i] / world_size);
      break;
    }
    default: break;
  }
}

bool dist_dtype_supported(WkDType dtype) {
  return dtype == WK_F32 || dtype == WK_BF16 || dtype == WK_F16 || dtype == WK_I32 || dtype == WK_I64 || dtype == WK_U8;
}
