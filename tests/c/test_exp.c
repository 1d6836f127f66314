/*
 * test_exp.c — that fast_expf (runtime/ops/cpu/exp.h), which the CPU kernels' softmax, SiLU, GELU
 * and cross-entropy call, stays within 1 ulp of glibc's expf over a sweep of every sign and
 * exponent, and gives what expf gives at the limits: 1 at 0, 0 at -inf and far below, subnormals
 * near them, inf at and above ln(FLT_MAX), NaN for NaN.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ops/cpu/exp.h"

/* Floats as integers in their order: the distance of two is their difference in ulps. */
static int64_t ordinal(float f) {
  int32_t bits;
  memcpy(&bits, &f, sizeof bits);
  return bits < 0 ? -(int64_t)(bits & 0x7fffffff) : bits;
}

static int64_t ulps(float a, float b) { return llabs(ordinal(a) - ordinal(b)); }

static void test_sweep_within_one_ulp(void) {
  int64_t worst = 0;
  for (uint64_t u = 0; u <= UINT32_MAX; u += 4099) { /* a prime stride reaches every exponent and sign */
    uint32_t bits = (uint32_t)u;
    float x;
    memcpy(&x, &bits, sizeof x);
    if (isnan(x)) continue;
    int64_t d = ulps(fast_expf(x), expf(x));
    if (d > worst) worst = d;
  }
  CHECK(worst <= 1);
}

/* Every 17th float of magnitude 2^-10 to 16, both signs: where the softmax of logits lives. */
static void test_dense_where_softmax_lives(void) {
  int64_t worst = 0;
  for (float sign = -1.0f; sign <= 1.0f; sign += 2.0f)
    for (float m = 0x1p-10f; m <= 16.0f; m = nextafterf(m, INFINITY)) {
      int64_t d = ulps(fast_expf(sign * m), expf(sign * m));
      if (d > worst) worst = d;
      for (int skip = 0; skip < 16; skip++) m = nextafterf(m, INFINITY);
    }
  CHECK(worst <= 1);
}

static void test_limits(void) {
  CHECK(fast_expf(0.0f) == 1.0f && fast_expf(-0.0f) == 1.0f);
  CHECK(fast_expf(-INFINITY) == 0.0f && fast_expf(-1000.0f) == 0.0f && fast_expf(-104.0f) == 0.0f);
  CHECK(fast_expf(-100.0f) > 0.0f && fast_expf(-100.0f) < FLT_MIN); /* subnormal, as expf gives */
  CHECK(ulps(fast_expf(-100.0f), expf(-100.0f)) <= 1);
  CHECK(isinf(fast_expf(INFINITY)) && isinf(fast_expf(88.73f)) && isinf(fast_expf(1000.0f)));
  CHECK(fast_expf(88.72f) < INFINITY && ulps(fast_expf(88.72f), expf(88.72f)) <= 1);
  CHECK(isnan(fast_expf(NAN)) && isnan(fast_expf(-NAN)));
}

int main(void) {
  RUN_TEST(test_sweep_within_one_ulp);
  RUN_TEST(test_dense_where_softmax_lives);
  RUN_TEST(test_limits);
  return check_failures ? 1 : 0;
}
