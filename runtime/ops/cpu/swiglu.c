/*
 * swiglu.c — the gated product of a SwiGLU feed-forward on the CPU: out = silu(gate) * up, with
 * silu(g) = g * sigmoid(g), elementwise over the outputs of the gate and up projections. Backward:
 * dup += dout * silu(g), dgate += dout * up * sigmoid(g) * (1 + g * (1 - sigmoid(g))).
 * All of them are activations or their gradients, in their stored dtype (stored.h), computed in f32.
 */
#include <math.h>

#include "../ops.h"
#include "parallel.h"
#include "stored.h"

typedef struct {
  void *out, *dgate, *dup;
  const void *gate, *up, *dout;
  WkDType act;
} SwigluJob;

static float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

static void swiglu_range(void *ctx, size_t begin, size_t end, size_t chunk) {
  SwigluJob *j = ctx;
  WkDType act = j->act;
  for (size_t i = begin; i < end; i++) {
    float g = stored_get(j->gate, act, i);
    stored_put(j->out, act, i, g * sigmoid(g) * stored_get(j->up, act, i));
  }
}

static void swiglu_backward_range(void *ctx, size_t begin, size_t end, size_t chunk) {
  SwigluJob *j = ctx;
  WkDType act = j->act;
  for (size_t i = begin; i < end; i++) {
    float g = stored_get(j->gate, act, i), s = sigmoid(g), dy = stored_get(j->dout, act, i);
    stored_put(j->dup, act, i, stored_get(j->dup, act, i) + dy * g * s);
    stored_put(j->dgate, act, i, stored_get(j->dgate, act, i) + dy * stored_get(j->up, act, i) * s * (1.0f + g * (1.0f - s)));
  }
}

void cpu_swiglu_forward(void *out, const void *gate, const void *up, WkDType act, size_t n) {
  SwigluJob job = {.out = out, .gate = gate, .up = up, .act = act};
  parallel_for(n, PARALLEL_GRAIN, swiglu_range, &job);
}

void cpu_swiglu_backward(void *dgate, void *dup, const void *dout, const void *gate, const void *up, WkDType act,
                         size_t n) {
  SwigluJob job = {.dgate = dgate, .dup = dup, .dout = dout, .gate = gate, .up = up, .act = act};
  parallel_for(n, PARALLEL_GRAIN, swiglu_backward_range, &job);
}
