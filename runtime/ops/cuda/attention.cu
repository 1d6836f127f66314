/*
 * attention.cu — the CUDA mirror of runtime/ops/cpu/attention.c: causal self-attention over a packed
 * [B, T, 3C] qkv, materialising the [B, NH, T, T] probabilities, forward and backward.
 *
 * The same plan as the CPU's, the dense work in cuBLAS: per batch row b, one strided-batched GEMM over
 * the NH heads for each product (a head's Q, K, V are [T, hs] views with row stride 3C, hs apart),
 *   forward   S = scale Q K^T, P = causal_softmax(S) into att, O = P V;
 *   backward  dP = dO V^T, dV += P^T dO, dS = P * (dP - rowsum(P * dP)) * scale, dQ += dS K,
 *             dK += dS^T Q;
 * and the row-wise softmax steps as kernels of one warp per row: lanes stride the row (coalesced),
 * the max and the sum come from one online pass (a running max rescales the running sum), so each
 * row of S is read twice and P written once. No atomics: every gradient is a GEMM's accumulate.
 * The GEMMs also compute the masked upper triangle (wasted, as on the CPU); the kernels zero it.
 * (A fused flash-style kernel would avoid the [B, NH, T, T] tensor, but the op's API hands P to the
 * backward, so it is materialised.)
 *
 * Storage: every product reads its operands as stored and writes (or accumulates into) its output as
 * stored, so on 2-byte storage (bf16, f16) all six run on the tensor cores, as llm.c's do: P is
 * rounded into att and O = P V reads att; dS is rounded into a 2-byte scratch before dQ += dS K and
 * dK += dS^T Q. The scores S and dP, the softmax and its backward are f32 (an f32 scratch of
 * [NH, T, T] per batch row); each output is rounded once, by its GEMM (fp32 arithmetic,
 * alpha AB + beta C rounded on the store), which is the CPU reference's rule, and a product of two
 * 16-bit values is exact in f32, so the CPU computes the same values up to the order of the sums.
 * On f32 storage S lives in att itself and dS overwrites dP: no scratch but dP.
 */
#include <type_traits>

#include "common.cuh"

/* Row r of the [rows, T] scores is query t = r % T; columns past t are masked. P may be S itself
 * (f32 storage): each lane reads an element before it writes it. */
template <typename Storage>
__global__ static void causal_softmax_kernel(Storage *P, const float *S, size_t rows, size_t T) {
  ROW_LOOP(r, rows) {
    const float *row = S + r * T;
    Storage *out = P + r * T;
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
    for (size_t t2 = lane(); t2 < T; t2 += WARP)
      out[t2] = from_float<Storage>(t2 <= t ? expf(row[t2] - row_max) / sum : 0.0f);
  }
}

/* dS = P * (dP - rowsum(P * dP)) * scale, rounded to Storage; dS may be dP itself (f32 storage). */
template <typename Storage>
__global__ static void softmax_backward_kernel(Storage *dS, const float *dP, const Storage *P, size_t rows, size_t T,
                                               float scale) {
  ROW_LOOP(r, rows) {
    const float *drow = dP + r * T;
    const Storage *row = P + r * T;
    Storage *out = dS + r * T;
    size_t t = r % T;
    float weighted = 0.0f;
    for (size_t t2 = lane(); t2 <= t; t2 += WARP) weighted += to_float(row[t2]) * drow[t2];
    weighted = warp_sum(weighted);
    for (size_t t2 = lane(); t2 < T; t2 += WARP)
      out[t2] = from_float<Storage>(t2 <= t ? to_float(row[t2]) * (drow[t2] - weighted) * scale : 0.0f);
  }
}

/* A head's [rows, hs] slices of a batch row stored as dtype, row stride ld, hs apart from head to head. */
static BatchOperand heads_of(const void *row, WkDType dtype, size_t ld, size_t hs) { return {row, dtype, ld, hs}; }
/* The heads' [T, T] matrices, T * T apart. */
static BatchOperand squares_of(const void *first, WkDType dtype, size_t T) { return {first, dtype, T, T * T}; }

/* One batch row's heads: S = scale Q K^T into the f32 scores S, P into att, O = P V into out. */
template <typename Storage>
static WkStatus forward_row(cublasHandle_t handle, float *S, Storage *out, Storage *att, const Storage *qkv, size_t T,
                            size_t C, size_t NH) {
  const WkDType dtype = storage_dtype<Storage>();
  size_t hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  WK_TRY(gemm_strided_batched(handle, NH, false, true, T, T, hs, scale, heads_of(qkv, dtype, 3 * C, hs),
                              heads_of(qkv + C, dtype, 3 * C, hs), 0.0f, {S, WK_F32, T, T * T}));
  LAUNCH_ROWS(causal_softmax_kernel<Storage>, NH * T, att, S, NH * T, T);
  return gemm_strided_batched(handle, NH, false, false, T, hs, T, 1.0f, squares_of(att, dtype, T),
                              heads_of(qkv + 2 * C, dtype, 3 * C, hs), 0.0f, {out, dtype, C, hs});
}

/* The scores S of a batch row: in att itself on f32 storage, else in f32 scratch of [NH, T, T]. */
template <typename Storage>
static WkStatus attention_forward(Storage *out, Storage *att, const Storage *qkv, size_t B, size_t T, size_t C,
                                  size_t NH) {
  cublasHandle_t handle;
  WK_TRY(cublas_for_current_device(&handle));
  size_t squares = NH * T * T;
  WkStatus status = WK_OK;
  if constexpr (std::is_same<Storage, float>::value) {
    for (size_t b = 0; b < B && status == WK_OK; b++)
      status = forward_row(handle, att + b * squares, out + b * T * C, att + b * squares, qkv + b * T * 3 * C, T, C, NH);
  } else {
    DeviceScratch S;
    WK_TRY(scratch_new(&S, squares * sizeof(float)));
    for (size_t b = 0; b < B && status == WK_OK; b++)
      status = forward_row(handle, (float *)S.ptr, out + b * T * C, att + b * squares, qkv + b * T * 3 * C, T, C, NH);
    scratch_free(&S);
  }
  return status;
}

extern "C" WkStatus cuda_attention_forward(WkDType dtype, void *out, void *att, const void *qkv, size_t B, size_t T,
                                           size_t C, size_t NH) {
  if (B * T * C == 0) return WK_OK;
  STORAGE_DISPATCH(dtype, "attention",
                   attention_forward((Storage *)out, (Storage *)att, (const Storage *)qkv, B, T, C, NH));
}

/* One batch row's backward, with dP ([NH, T, T], f32) and dS (the same as stored; dP itself on f32
 * storage) as scratch; dqkv [T, 3C] (dq, dk and dv, C apart) is accumulated into. */
template <typename Storage>
static WkStatus backward_row(cublasHandle_t handle, float *dP, Storage *dS, Storage *dqkv, const Storage *dout,
                             const Storage *qkv, const Storage *att, size_t T, size_t C, size_t NH) {
  const WkDType dtype = storage_dtype<Storage>();
  size_t hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  BatchOperand dO = heads_of(dout, dtype, C, hs);
  WK_TRY(gemm_strided_batched(handle, NH, false, true, T, T, hs, 1.0f, dO, heads_of(qkv + 2 * C, dtype, 3 * C, hs),
                              0.0f, {dP, WK_F32, T, T * T}));  /* dP = dO V^T */
  WK_TRY(gemm_strided_batched(handle, NH, true, false, T, hs, T, 1.0f, squares_of(att, dtype, T), dO, 1.0f,
                              {dqkv + 2 * C, dtype, 3 * C, hs}));  /* dV += P^T dO */
  LAUNCH_ROWS(softmax_backward_kernel<Storage>, NH * T, dS, dP, att, NH * T, T, scale);
  WK_TRY(gemm_strided_batched(handle, NH, false, false, T, hs, T, 1.0f, squares_of(dS, dtype, T),
                              heads_of(qkv + C, dtype, 3 * C, hs), 1.0f, {dqkv, dtype, 3 * C, hs}));  /* dQ += dS K */
  return gemm_strided_batched(handle, NH, true, false, T, hs, T, 1.0f, squares_of(dS, dtype, T),
                              heads_of(qkv, dtype, 3 * C, hs), 1.0f, {dqkv + C, dtype, 3 * C, hs});  /* dK += dS^T Q */
}

template <typename Storage>
static WkStatus attention_backward(Storage *dqkv, const Storage *dout, const Storage *qkv, const Storage *att,
                                   size_t B, size_t T, size_t C, size_t NH) {
  cublasHandle_t handle;
  WK_TRY(cublas_for_current_device(&handle));
  size_t squares = NH * T * T;
  DeviceScratch dP, dS;
  WK_TRY(scratch_new(&dP, squares * sizeof(float)));
  WkStatus status = WK_OK;
  Storage *ds = (Storage *)dP.ptr;  /* f32 storage: dS overwrites dP */
  if constexpr (!std::is_same<Storage, float>::value) {
    status = scratch_new(&dS, squares * sizeof(Storage));
    ds = status == WK_OK ? (Storage *)dS.ptr : NULL;
  }
  for (size_t b = 0; b < B && status == WK_OK; b++)
    status = backward_row(handle, (float *)dP.ptr, ds, dqkv + b * T * 3 * C, dout + b * T * C, qkv + b * T * 3 * C,
                          att + b * squares, T, C, NH);
  if constexpr (!std::is_same<Storage, float>::value) {
    if (ds) scratch_free(&dS);
  }
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
