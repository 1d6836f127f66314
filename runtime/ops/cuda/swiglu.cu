/*
 * swiglu.cu — the CUDA mirror of runtime/ops/cpu/swiglu.c: out = silu(gate) * up elementwise, and its
 * backward dup += dout * silu(g), dgate += dout * up * sigmoid(g) * (1 + g * (1 - sigmoid(g))). All
 * are activations stored f32, bf16 or f16, computed in f32 and rounded once on the store.
 */
#include "common.cuh"

__device__ static inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

template <typename Storage>
__global__ static void swiglu_forward_kernel(Storage *out, const Storage *gate, const Storage *up, size_t n) {
  GRID_STRIDE(i, n) {
    float g = to_float(gate[i]);
    out[i] = from_float<Storage>(g * sigmoid(g) * to_float(up[i]));
  }
}

template <typename Storage>
__global__ static void swiglu_backward_kernel(Storage *dgate, Storage *dup, const Storage *dout, const Storage *gate,
                                              const Storage *up, size_t n) {
  GRID_STRIDE(i, n) {
    float g = to_float(gate[i]), s = sigmoid(g), dy = to_float(dout[i]);
    dup[i] = from_float<Storage>(to_float(dup[i]) + dy * g * s);
    dgate[i] = from_float<Storage>(to_float(dgate[i]) + dy * to_float(up[i]) * s * (1.0f + g * (1.0f - s)));
  }
}

template <typename Storage>
static WkStatus swiglu_forward(Storage *out, const Storage *gate, const Storage *up, size_t n) {
  LAUNCH(swiglu_forward_kernel<Storage>, n, out, gate, up, n);
  return WK_OK;
}

template <typename Storage>
static WkStatus swiglu_backward(Storage *dgate, Storage *dup, const Storage *dout, const Storage *gate,
                                const Storage *up, size_t n) {
  LAUNCH(swiglu_backward_kernel<Storage>, n, dgate, dup, dout, gate, up, n);
  return WK_OK;
}

extern "C" WkStatus cuda_swiglu_forward(WkDType dtype, void *out, const void *gate, const void *up, size_t n) {
  if (n == 0) return WK_OK;
  STORAGE_DISPATCH(dtype, "swiglu", swiglu_forward((Storage *)out, (const Storage *)gate, (const Storage *)up, n));
}

extern "C" WkStatus cuda_swiglu_backward(WkDType dtype, void *dgate, void *dup, const void *dout, const void *gate,
                                         const void *up, size_t n) {
  if (n == 0) return WK_OK;
  STORAGE_DISPATCH(dtype, "swiglu_backward", swiglu_backward((Storage *)dgate, (Storage *)dup, (const Storage *)dout,
                                                             (const Storage *)gate, (const Storage *)up, n));
}
