/*
 * exp.h — e^x in straight-line f32 arithmetic, so that the loops calling it vectorize.
 *
 * glibc's expf is a function call, which keeps every softmax, SiLU, GELU and cross-entropy loop
 * scalar. This is Cephes' expf without its branches: x = n ln2 + r with |r| <= ln2 / 2, a degree-7
 * polynomial for e^r, and 2^n written into exponent bits in two halves, so that n from -152 to 128
 * needs no case of its own: results below FLT_MIN come out subnormal or 0 and those above FLT_MAX
 * inf, as from expf; NaN stays NaN. Within 1 ulp of glibc's expf on normal results (tests/c).
 * The loops vectorize with -fno-trapping-math (Makefile): otherwise gcc may not evaluate the
 * clamps' both sides.
 */
#ifndef WK_OPS_CPU_EXP_H
#define WK_OPS_CPU_EXP_H

#include <stdint.h>

/* 2^k for k in [-126, 127]. */
static inline float exp_pow2(int32_t k) {
  union { int32_t bits; float value; } pow2 = {.bits = (k + 127) << 23};
  return pow2.value;
}

static inline float fast_expf(float x) {
  float clamped = x > -105.0f ? x : -105.0f; /* NaN too, so that n stays an integer */
  clamped = clamped < 89.0f ? clamped : 89.0f;
  const float round_shift = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
  float n = (clamped * 1.44269504088896341f + round_shift) - round_shift;
  float r = clamped - n * 0.693359375f; /* ln 2 in two parts: the first times n is exact */
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t k = (int32_t)n, half = k >> 1; /* arithmetic shift: floor(k / 2) */
  float e = p * exp_pow2(half) * exp_pow2(k - half);
  return x != x ? x : e;
}

#endif /* WK_OPS_CPU_EXP_H */
