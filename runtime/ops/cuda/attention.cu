/*
 * attention.cu — the CUDA mirror of runtime/ops/cpu/attention.c: causal self-attention over a packed
 * [B, T, 3C] qkv, materialising the [B, NH, T, T] probabilities, forward and backward.
 *
 * The same plan as the CPU's, the dense work in cuBLAS: per batch row b, one strided-batched GEMM over
 * the NH heads for each product (a head's Q, K, V are [T, hs] views with row stride 3C, hs apart),
 *   forward   S = scale Q K^T, P = causal_softmax(S) in place, O = P V;
 *   backward  dP = dO V^T, dV += P^T dO, dS = P * (dP - rowsum(P * dP)) * scale, dQ += dS K,
 *             dK += dS^T Q;
 * and the row-wise softmax steps as kernels of one warp per row: lanes stride the row (coalesced),
 * the max and the sum come from one online pass (a running max rescales the running sum), so each
 * row of S is read twice and written once. No atomics: every gradient is a GEMM's accumulate.
 * The GEMMs also compute the masked upper triangle (wasted, as on the CPU); the kernels zero it.
 * dP needs [NH, T, T] of scratch, reused across b. (A fused flash-style kernel would avoid the
 * [B, NH, T, T] tensor, but the op's API hands P to the backward, so it is materialised.)
 *
 * 2-byte storage (bf16, f16) follows the CPU's arithmetic (runtime/ops/cpu/attention.c): the scores,
 * the softmax and O = P V are f32 over values widened exactly, P is rounded into att (which the
 * backward widens again), and each output is rounded once. So each batch row's qkv (and dout, att and
 * dqkv in the backward) is widened into f32 scratch, the f32 path runs on it, and the results are
 * rounded back; dq, dk and dv each take one product per head, so rounding the accumulated row once
 * is the CPU's one rounding per product. The GEMMs stay fp32 (cuBLAS has no product of f32
 * probabilities with 16-bit values): the tensor cores' speed here is later work.
 */
#include <type_traits>

#include "common.cuh"

/* ---- f32 views of stored rows -------------------------------------------------------------------- */

template <typename Storage>
__global__ static void widen_kernel(float *dst, const Storage *src, size_t n) {
  GRID_STRIDE(i, n) dst[i] = to_float(src[i]);
}
template <typename Storage>
__global__ static void narrow_kernel(Storage *dst, const float *src, size_t n) {
  GRID_STRIDE(i, n) dst[i] = from_float<Storage>(src[i]);
}

/* The f32 array the f32 path uses for n elements stored at data: data itself when Storage is f32,
 * else the next n floats of the scratch at *cursor, into which data is widened first when load (an
 * input, or an output accumulated into). */
template <typename Storage>
static WkStatus f32_view(float **view, const Storage *data, size_t n, float **cursor, bool load) {
  if constexpr (std::is_same<Storage, float>::value) {
    *view = const_cast<float *>(data);
  } else {
    *view = *cursor;
    *cursor += n;
    if (load && n) LAUNCH(widen_kernel<Storage>, n, *view, data, n);
  }
  return WK_OK;
}

/* Rounds an f32 view back into data (nothing to do when the view is data). */
template <typename Storage>
static WkStatus store_view(Storage *data, const float *view, size_t n) {
  if constexpr (!std::is_same<Storage, float>::value) {
    if (n) LAUNCH(narrow_kernel<Storage>, n, data, view, n);
  }
  return WK_OK;
}

/* f32 scratch for the views of one batch row (floats: their sizes' sum): none when Storage is f32. */
template <typename Storage>
static WkStatus views_new(DeviceScratch *s, size_t floats) {
  s->ptr = NULL;
  if (std::is_same<Storage, float>::value) return WK_OK;
  WkStatus status = scratch_new(s, floats * sizeof(float));
  if (status != WK_OK) s->ptr = NULL;  /* so that views_free has nothing to free */
  return status;
}
static void views_free(DeviceScratch *s) {
  if (s->ptr) scratch_free(s);
}

/* ---- the f32 path -------------------------------------------------------------------------------- */

/* Row r of the [rows, T] scores is query t = r % T; columns past t are masked. */
__global__ static void causal_softmax_kernel(float *S, size_t rows, size_t T) {
  ROW_LOOP(r, rows) {
    float *row = S + r * T;
    size_t t = r % T;
    float maxval = -INFINITY, sum = 0.0f;
    for (size_t t2 = lane(); t2 <= t; t2 += WARP) {
      float x = row[t2];
      if (x > maxval) {
        sum = sum * expf(maxval - x) + 1.0f;
        maxval = x;
      } else {
        sum += expf(x - maxval);
      }
    }
    float row_max = warp_max(maxval);
    sum = warp_sum(maxval == -INFINITY ? 0.0f : sum * expf(maxval - row_max));
    for (size_t t2 = lane(); t2 < T; t2 += WARP) row[t2] = t2 <= t ? expf(row[t2] - row_max) / sum : 0.0f;
  }
}

/* dP becomes dS = P * (dP - rowsum(P * dP)) * scale, in place. */
__global__ static void softmax_backward_kernel(float *dP, const float *P, size_t rows, size_t T, float scale) {
  ROW_LOOP(r, rows) {
    float *drow = dP + r * T;
    const float *row = P + r * T;
    size_t t = r % T;
    float weighted = 0.0f;
    for (size_t t2 = lane(); t2 <= t; t2 += WARP) weighted += row[t2] * drow[t2];
    weighted = warp_sum(weighted);
    for (size_t t2 = lane(); t2 < T; t2 += WARP) drow[t2] = t2 <= t ? row[t2] * (drow[t2] - weighted) * scale : 0.0f;
  }
}

/* One batch row's heads: q [T, 3C] (q, k, v), P [NH, T, T], o [T, C]. */
static WkStatus forward_f32(cublasHandle_t handle, float *o, float *P, const float *q, size_t T, size_t C, size_t NH) {
  size_t hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  const float *k = q + C, *v = q + 2 * C;
  /* S = scale Q K^T, P = softmax(S), O = P V: [T, T] per head, T * T apart; a head's q, k, v, o hs apart */
  WK_TRY(gemm_strided_batched(handle, NH, false, true, T, T, hs, scale, q, 3 * C, hs, k, 3 * C, hs, 0.0f, P, T, T * T));
  LAUNCH_ROWS(causal_softmax_kernel, NH * T, P, NH * T, T);
  return gemm_strided_batched(handle, NH, false, false, T, hs, T, 1.0f, P, T, T * T, v, 3 * C, hs, 0.0f, o, C, hs);
}

/* One batch row's backward, with dP ([NH, T, T]) as scratch: dq [T, 3C] (dq, dk, dv) accumulates. */
static WkStatus backward_f32(cublasHandle_t handle, float *dP, float *dq, const float *dO, const float *q,
                             const float *P, size_t T, size_t C, size_t NH) {
  size_t hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  const float *k = q + C, *v = q + 2 * C;
  float *dk = dq + C, *dv = dq + 2 * C;
  WK_TRY(gemm_strided_batched(handle, NH, false, true, T, T, hs, 1.0f, dO, C, hs, v, 3 * C, hs, 0.0f, dP, T, T * T));
  WK_TRY(gemm_strided_batched(handle, NH, true, false, T, hs, T, 1.0f, P, T, T * T, dO, C, hs, 1.0f, dv, 3 * C, hs));
  LAUNCH_ROWS(softmax_backward_kernel, NH * T, dP, P, NH * T, T, scale);
  WK_TRY(gemm_strided_batched(handle, NH, false, false, T, hs, T, 1.0f, dP, T, T * T, k, 3 * C, hs, 1.0f, dq, 3 * C, hs));
  WK_TRY(gemm_strided_batched(handle, NH, true, false, T, hs, T, 1.0f, dP, T, T * T, q, 3 * C, hs, 1.0f, dk, 3 * C, hs));
  return WK_OK;
}

/* ---- the op, per batch row, on f32 views --------------------------------------------------------- */

/* The element counts of one batch row: qkv [T, 3C], att [NH, T, T], out [T, C]. */
struct RowSizes {
  size_t qkv, att, out;
};
static RowSizes row_sizes(size_t T, size_t C, size_t NH) { return {T * 3 * C, NH * T * T, T * C}; }

template <typename Storage>
static WkStatus forward_row(cublasHandle_t handle, float *wide, Storage *out, Storage *att, const Storage *qkv,
                            size_t T, size_t C, size_t NH) {
  RowSizes n = row_sizes(T, C, NH);
  float *q, *P, *o, *cursor = wide;
  WK_TRY(f32_view(&q, qkv, n.qkv, &cursor, true));
  WK_TRY(f32_view(&P, att, n.att, &cursor, false));
  WK_TRY(f32_view(&o, out, n.out, &cursor, false));
  WK_TRY(forward_f32(handle, o, P, q, T, C, NH));
  WK_TRY(store_view(att, P, n.att));
  return store_view(out, o, n.out);
}

template <typename Storage>
static WkStatus attention_forward(Storage *out, Storage *att, const Storage *qkv, size_t B, size_t T, size_t C,
                                  size_t NH) {
  cublasHandle_t handle;
  WK_TRY(cublas_for_current_device(&handle));
  RowSizes n = row_sizes(T, C, NH);
  DeviceScratch wide;
  WK_TRY(views_new<Storage>(&wide, n.qkv + n.att + n.out));
  WkStatus status = WK_OK;
  for (size_t b = 0; b < B && status == WK_OK; b++)
    status = forward_row(handle, (float *)wide.ptr, out + b * n.out, att + b * n.att, qkv + b * n.qkv, T, C, NH);
  views_free(&wide);
  return status;
}

extern "C" WkStatus cuda_attention_forward(WkDType dtype, void *out, void *att, const void *qkv, size_t B, size_t T,
                                           size_t C, size_t NH) {
  if (B * T * C == 0) return WK_OK;
  STORAGE_DISPATCH(dtype, "attention",
                   attention_forward((Storage *)out, (Storage *)att, (const Storage *)qkv, B, T, C, NH));
}

template <typename Storage>
static WkStatus backward_row(cublasHandle_t handle, float *dP, float *wide, Storage *dqkv, const Storage *dout,
                             const Storage *qkv, const Storage *att, size_t T, size_t C, size_t NH) {
  RowSizes n = row_sizes(T, C, NH);
  float *q, *dO, *P, *dq, *cursor = wide;
  WK_TRY(f32_view(&q, qkv, n.qkv, &cursor, true));
  WK_TRY(f32_view(&dO, dout, n.out, &cursor, true));
  WK_TRY(f32_view(&P, att, n.att, &cursor, true));
  WK_TRY(f32_view(&dq, dqkv, n.qkv, &cursor, true));  /* accumulated into */
  WK_TRY(backward_f32(handle, dP, dq, dO, q, P, T, C, NH));
  return store_view(dqkv, dq, n.qkv);
}

template <typename Storage>
static WkStatus attention_backward(Storage *dqkv, const Storage *dout, const Storage *qkv, const Storage *att,
                                   size_t B, size_t T, size_t C, size_t NH) {
  cublasHandle_t handle;
  WK_TRY(cublas_for_current_device(&handle));
  RowSizes n = row_sizes(T, C, NH);
  DeviceScratch dP, wide;
  WK_TRY(scratch_new(&dP, n.att * sizeof(float)));
  WkStatus status = views_new<Storage>(&wide, 2 * n.qkv + n.out + n.att);
  for (size_t b = 0; b < B && status == WK_OK; b++)
    status = backward_row(handle, (float *)dP.ptr, (float *)wide.ptr, dqkv + b * n.qkv, dout + b * n.out,
                          qkv + b * n.qkv, att + b * n.att, T, C, NH);
  views_free(&wide);
  scratch_free(&dP);
  return status;
}

extern "C" WkStatus cuda_attention_backward(WkDType dtype, void *dqkv, const void *dout, const void *qkv,
                                            const void *att, size_t B, size_t T, size_t C, size_t NH) {
  if (B * T * C == 0) return WK_OK;
  STORAGE_DISPATCH(dtype, "attention_backward",
                   attention_backward((Storage *)dqkv, (const Storage *)dout, (const Storage *)qkv,
                                      (const Storage *)att, B, T, C, NH));
}
