/*
 * swiglu.c — the gated product of a SwiGLU feed-forward on the CPU: out = silu(gate) * up, with
 * silu(g) = g * sigmoid(g), elementwise over the outputs of the gate and up projections. Backward:
 * dup += dout * silu(g), dgate += dout * up * sigmoid(g) * (1 + g * (1 - sigmoid(g))).
 */
#include <math.h>

#include "../ops.h"
#include "parallel.h"

typedef struct {
  float *out, *dgate, *dup;
  const float *gate, *up, *dout;
} SwigluJob;

static float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

static void swiglu_range(void *ctx, size_t begin, size_t end, size_t chunk) {
  SwigluJob *j = ctx;
  for (size_t i = begin; i < end; i++) j->out[i] = j->gate[i] * sigmoid(j->gate[i]) * j->up[i];
}

static void swiglu_backward_range(void *ctx, size_t begin, size_t end, size_t chunk) {
  SwigluJob *j = ctx;
  for (size_t i = begin; i < end; i++) {
    float g = j->gate[i], s = sigmoid(g);
    j->dup[i] += j->dout[i] * g * s;
    j->dgate[i] += j->dout[i] * j->up[i] * s * (1.0f + g * (1.0f - s));
  }
}

void cpu_swiglu_forward(float *out, const float *gate, const float *up, size_t n) {
  SwigluJob job = {.out = out, .gate = gate, .up = up};
  parallel_for(n, PARALLEL_GRAIN, swiglu_range, &job);
}

void cpu_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n) {
  SwigluJob job = {.dgate = dgate, .dup = dup, .dout = dout, .gate = gate, .up = up};
  parallel_for(n, PARALLEL_GRAIN, swiglu_backward_range, &job);
}
