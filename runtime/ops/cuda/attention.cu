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
 * backward widens again), and each output is rounded once. The products of two stored operands,
 * S = Q K^T, dP = dO V^T and dV += P^T dO (P as att holds it), run on the tensor cores straight from
 * storage: a product of two 16-bit values is exact in f32 and the sums are f32, as the CPU's over the
 * widened values. The three with an f32 operand (O = P V on the unrounded P, dQ += dS K and
 * dK += dS^T Q) are fp32 GEMMs on f32 views: each batch row's qkv (and att and dqkv in the backward)
 * is widened into scratch and the results rounded back; dq, dk and dv each take one product per head,
 * so rounding the accumulated row once is the CPU's one rounding per product.
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

/* A head's [rows, hs] slices of a batch row stored as dtype, row stride ld, hs apart from head to head. */
static BatchOperand heads_of(const void *row, WkDType dtype, size_t ld, size_t hs) { return {row, dtype, ld, hs}; }
/* The heads' [T, T] matrices, T * T apart. */
static BatchOperand squares_of(const void *first, WkDType dtype, size_t T) { return {first, dtype, T, T * T}; }
static const void *element(const void *row, WkDType dtype, size_t i) {
  return (const char *)row + i * wk_dtype_size(dtype);
}

/* One batch row's heads. q: the row [T, 3C] (q, k, v) in f32; stored: the same row as stored (dtype),
 * which S = scale Q K^T reads on the tensor cores (products of stored values, as the CPU's of the
 * same values widened); P [NH, T, T] and o [T, C] in f32. O = P V multiplies the unrounded f32 P. */
static WkStatus forward_f32(cublasHandle_t handle, float *o, float *P, const float *q, const void *stored, WkDType dtype,
                            size_t T, size_t C, size_t NH) {
  size_t hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  WK_TRY(gemm_strided_batched(handle, NH, false, true, T, T, hs, scale, heads_of(stored, dtype, 3 * C, hs),
                              heads_of(element(stored, dtype, C), dtype, 3 * C, hs), 0.0f, P, T, T * T));
  LAUNCH_ROWS(causal_softmax_kernel, NH * T, P, NH * T, T);
  return gemm_strided_batched(handle, NH, false, false, T, hs, T, 1.0f, squares_of(P, WK_F32, T),
                              heads_of(q + 2 * C, WK_F32, 3 * C, hs), 0.0f, o, C, hs);
}

/* What the backward of one batch row reads as stored (dtype): its qkv row, dout row and att. */
struct StoredRow {
  const void *qkv, *dout, *att;
  WkDType dtype;
};

/* One batch row's backward, with dP ([NH, T, T]) as scratch: dq [T, 3C] (dq, dk, dv) accumulates in
 * f32; q and P are f32 views. dP = dO V^T and dV += P^T dO read their operands as stored, on the
 * tensor cores; dQ and dK multiply the f32 dS. */
static WkStatus backward_f32(cublasHandle_t handle, float *dP, float *dq, const float *q, const float *P,
                             StoredRow stored, size_t T, size_t C, size_t NH) {
  size_t hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  WkDType dtype = stored.dtype;
  BatchOperand dO = heads_of(stored.dout, dtype, C, hs);
  float *dk = dq + C, *dv = dq + 2 * C;
  WK_TRY(gemm_strided_batched(handle, NH, false, true, T, T, hs, 1.0f, dO,
                              heads_of(element(stored.qkv, dtype, 2 * C), dtype, 3 * C, hs), 0.0f, dP, T, T * T));
  WK_TRY(gemm_strided_batched(handle, NH, true, false, T, hs, T, 1.0f, squares_of(stored.att, dtype, T), dO, 1.0f, dv,
                              3 * C, hs));
  LAUNCH_ROWS(softmax_backward_kernel, NH * T, dP, P, NH * T, T, scale);
  WK_TRY(gemm_strided_batched(handle, NH, false, false, T, hs, T, 1.0f, squares_of(dP, WK_F32, T),
                              heads_of(q + C, WK_F32, 3 * C, hs), 1.0f, dq, 3 * C, hs));
  return gemm_strided_batched(handle, NH, true, false, T, hs, T, 1.0f, squares_of(dP, WK_F32, T),
                              heads_of(q, WK_F32, 3 * C, hs), 1.0f, dk, 3 * C, hs);
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
  WK_TRY(forward_f32(handle, o, P, q, qkv, storage_dtype<Storage>(), T, C, NH));
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
  float *q, *P, *dq, *cursor = wide;
  WK_TRY(f32_view(&q, qkv, n.qkv, &cursor, true));
  WK_TRY(f32_view(&P, att, n.att, &cursor, true));
  WK_TRY(f32_view(&dq, dqkv, n.qkv, &cursor, true));  /* accumulated into */
  WK_TRY(backward_f32(handle, dP, dq, q, P, {qkv, dout, att, storage_dtype<Storage>()}, T, C, NH));
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
  WkStatus status = views_new<Storage>(&wide, 2 * n.qkv + n.att);
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
