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
 */
#include "common.cuh"

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

extern "C" WkStatus cuda_attention_forward(float *out, float *att, const float *qkv, size_t B, size_t T, size_t C,
                                           size_t NH) {
  if (B * T * C == 0) return WK_OK;
  cublasHandle_t handle;
  WK_TRY(cublas_for_current_device(&handle));
  size_t hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  for (size_t b = 0; b < B; b++) {
    const float *q = qkv + b * T * 3 * C, *k = q + C, *v = q + 2 * C;
    float *P = att + b * NH * T * T, *o = out + b * T * C;
    /* S = scale Q K^T, P = softmax(S), O = P V: [T, T] per head, T * T apart; a head's q, k, v, o hs apart */
    WK_TRY(gemm_strided_batched(handle, NH, false, true, T, T, hs, scale, q, 3 * C, hs, k, 3 * C, hs, 0.0f, P, T, T * T));
    LAUNCH_ROWS(causal_softmax_kernel, NH * T, P, NH * T, T);
    WK_TRY(gemm_strided_batched(handle, NH, false, false, T, hs, T, 1.0f, P, T, T * T, v, 3 * C, hs, 0.0f, o, C, hs));
  }
  return WK_OK;
}

/* The backward of batch row b's heads, with dP ([NH, T, T]) as scratch. */
static WkStatus attention_backward_row(cublasHandle_t handle, float *dP, float *dqkv, const float *dout,
                                       const float *qkv, const float *att, size_t b, size_t T, size_t C, size_t NH) {
  size_t hs = C / NH, offset = b * T * 3 * C;
  float scale = 1.0f / sqrtf((float)hs);
  const float *q = qkv + offset, *k = q + C, *v = q + 2 * C;
  float *dq = dqkv + offset, *dk = dq + C, *dv = dq + 2 * C;
  const float *P = att + b * NH * T * T, *dO = dout + b * T * C;
  WK_TRY(gemm_strided_batched(handle, NH, false, true, T, T, hs, 1.0f, dO, C, hs, v, 3 * C, hs, 0.0f, dP, T, T * T));
  WK_TRY(gemm_strided_batched(handle, NH, true, false, T, hs, T, 1.0f, P, T, T * T, dO, C, hs, 1.0f, dv, 3 * C, hs));
  LAUNCH_ROWS(softmax_backward_kernel, NH * T, dP, P, NH * T, T, scale);
  WK_TRY(gemm_strided_batched(handle, NH, false, false, T, hs, T, 1.0f, dP, T, T * T, k, 3 * C, hs, 1.0f, dq, 3 * C, hs));
  WK_TRY(gemm_strided_batched(handle, NH, true, false, T, hs, T, 1.0f, dP, T, T * T, q, 3 * C, hs, 1.0f, dk, 3 * C, hs));
  return WK_OK;
}

extern "C" WkStatus cuda_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att, size_t B,
                                            size_t T, size_t C, size_t NH) {
  if (B * T * C == 0) return WK_OK;
  cublasHandle_t handle;
  WK_TRY(cublas_for_current_device(&handle));
  DeviceScratch dP;
  WK_TRY(scratch_new(&dP, NH * T * T * sizeof(float)));
  WkStatus status = WK_OK;
  for (size_t b = 0; b < B && status == WK_OK; b++)
    status = attention_backward_row(handle, (float *)dP.ptr, dqkv, dout, qkv, att, b, T, C, NH);
  scratch_free(&dP);
  return status;
}
