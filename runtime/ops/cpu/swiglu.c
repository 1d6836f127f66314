/*
 * swiglu.c — the gated product of a SwiGLU feed-forward on the CPU: out = silu(gate) * up, with
 * silu(g) = g * sigmoid(g), elementwise over the outputs of the gate and up projections. Backward:
 * dup += dout * silu(g), dgate += dout * up * sigmoid(g) * (1 + g * (1 - sigmoid(g))).
 * All of them are activations or their gradients, in their stored dtype (stored.h), computed in f32.
 */
#include "../ops.h"
#include "exp.h"
#include "parallel.h"
#include "stored.h"

typedef struct {
  void *out, *dgate, *dup;
  const void *gate, *up, *dout;
  WkDType act;
} SwigluJob;

static float sigmoid(float x) { return 1.0f / (1.0f + fast_expf(-x)); }

STORED_RUN_CLONES static void swiglu_run(float *restrict out, const float *restrict gate, const float *restrict up, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = gate[i] * sigmoid(gate[i]) * up[i];
}

STORED_RUN_CLONES static void swiglu_backward_run(float *restrict dgate, float *restrict dup, const float *restrict dout,
                                const float *restrict gate, const float *restrict up, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float g = gate[i], s = sigmoid(g);
    dup[i] += dout[i] * g * s;
    dgate[i] += dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
  }
}

static void swiglu_range(void *ctx, size_t begin, size_t end, size_t chunk) {
  SwigluJob *j = ctx;
  float out[STORED_RUN], gate[STORED_RUN], up[STORED_RUN];
  for (size_t i = begin; i < end; i += STORED_RUN) {
    size_t n = stored_run_length(i, end);
    stored_load_at(gate, j->gate, j->act, i, n);
    stored_load_at(up, j->up, j->act, i, n);
    swiglu_run(out, gate, up, n);
    stored_store_at(j->out, out, j->act, i, n);
  }
}

static void swiglu_backward_range(void *ctx, size_t begin, size_t end, size_t chunk) {
  SwigluJob *j = ctx;
  float dgate[STORED_RUN], dup[STORED_RUN], dout[STORED_RUN], gate[STORED_RUN], up[STORED_RUN];
  for (size_t i = begin; i < end; i += STORED_RUN) {
    size_t n = stored_run_length(i, end);
    stored_load_at(dgate, j->dgate, j->act, i, n);
    stored_load_at(dup, j->dup, j->act, i, n);
    stored_load_at(dout, j->dout, j->act, i, n);
    stored_load_at(gate, j->gate, j->act, i, n);
    stored_load_at(up, j->up, j->act, i, n);
    swiglu_backward_run(dgate, dup, dout, gate, up, n);
    stored_store_at(j->dgate, dgate, j->act, i, n);
    stored_store_at(j->dup, dup, j->act, i, n);
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
