/*
 * rope.cu — the CUDA mirror of runtime/ops/cpu/rope.c: rotary position embeddings in the rotate-half
 * convention, elementwise over the (row, head, i < hs/2) pairs of q or k. The angle is the f32 product
 * position * inv_freq[i] with the f32 inverse frequencies ops.c computed on the host, as on the CPU;
 * the activations are stored f32, bf16 or f16 and rotated in f32. The backward rotates by -angle and
 * adds into the gradient.
 */
#include "common.cuh"

/* A thread per pair (x1, x2) = (x[i], x[i + hs/2]) of a head; sign -1 rotates back. */
template <typename Storage>
__global__ static void rope_kernel(Storage *out, const Storage *inp, const float *inv_freq, size_t T, size_t H,
                                   size_t hs, int64_t start, float sign, bool accumulate, size_t pairs) {
  size_t half = hs / 2;
  GRID_STRIDE(p, pairs) {
    size_t i = p % half, row = p / half / H;
    size_t first = (p / half) * hs + i, second = first + half;
    float angle = (float)(start + (int64_t)(row % T)) * inv_freq[i];
    float cos_a = cosf(angle), sin_a = sign * sinf(angle);
    float x1 = to_float(inp[first]), x2 = to_float(inp[second]);
    float y1 = accumulate ? to_float(out[first]) : 0.0f, y2 = accumulate ? to_float(out[second]) : 0.0f;
    out[first] = from_float<Storage>(y1 + (x1 * cos_a - x2 * sin_a));
    out[second] = from_float<Storage>(y2 + (x2 * cos_a + x1 * sin_a));
  }
}

template <typename Storage>
static WkStatus rope_apply(Storage *out, const Storage *inp, const float *inv_freq, size_t B, size_t T, size_t H,
                           size_t hs, int64_t start, float sign, bool accumulate) {
  size_t pairs = B * T * H * (hs / 2);
  LAUNCH(rope_kernel<Storage>, pairs, out, inp, inv_freq, T, H, hs, start, sign, accumulate, pairs);
  return WK_OK;
}

extern "C" WkStatus cuda_rope_forward(WkDType dtype, void *out, const void *inp, const float *inv_freq, size_t B,
                                      size_t T, size_t H, size_t hs, int64_t start) {
  if (B * T * H * hs == 0) return WK_OK;
  STORAGE_DISPATCH(dtype, "rope",
                   rope_apply((Storage *)out, (const Storage *)inp, inv_freq, B, T, H, hs, start, 1.0f, false));
}

extern "C" WkStatus cuda_rope_backward(WkDType dtype, void *dinp, const void *dout, const float *inv_freq, size_t B,
                                       size_t T, size_t H, size_t hs, int64_t start) {
  if (B * T * H * hs == 0) return WK_OK;
  STORAGE_DISPATCH(dtype, "rope_backward",
                   rope_apply((Storage *)dinp, (const Storage *)dout, inv_freq, B, T, H, hs, start, -1.0f, true));
}
