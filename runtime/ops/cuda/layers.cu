/*
 * layers.cu — the CUDA mirror of runtime/ops/cpu/layers.c (less the matmuls, in blas.cu): embedding
 * and layernorm, forward (with the residual add before it when fused) and backward. Activations and
 * the tables or weights they read are stored f32, bf16 or f16 (computed in f32, rounded once on the
 * store); the parameter gradients and layernorm's mean and rstd are f32, as on the CPU.
 */
#include "common.cuh"

/* ---- embedding and layernorm ------------------------------------------------------------------------ */

template <typename Storage>
__global__ static void embedding_forward_kernel(Storage *out, const int32_t *idx, WkIndexLayout at, const Storage *wte,
                                                const Storage *wpe, size_t T, size_t C, size_t V, size_t n,
                                                WkStepStatus *status) {
  GRID_STRIDE(i, n) {
    size_t row = i / C, c = i % C;
    int32_t token = idx[wk_index_offset(at, (int64_t)row)];
    if (!wk_in_vocab(token, V)) {
      if (c == 0) mark_bad_id((unsigned long long *)&status->bad_token, &status->token_limit, row, token, V);
      out[i] = from_float<Storage>(0.0f);
    } else {
      out[i] = from_float<Storage>(to_float(wte[(size_t)token * C + c]) + to_float(wpe[(row % T) * C + c]));
    }
  }
}

template <typename Storage>
static WkStatus embedding_forward(Storage *out, const int32_t *idx, WkIndexLayout idx_layout, const Storage *wte,
                                  const Storage *wpe, size_t T, size_t C, size_t V, size_t n, WkStepStatus *status) {
  LAUNCH(embedding_forward_kernel<Storage>, n, out, idx, idx_layout, wte, wpe, T, C, V, n, status);
  return WK_OK;
}

/* out and the tables of dtype, as on the CPU: the sum is formed in f32 and rounded once. */
extern "C" WkStatus cuda_embedding_forward(WkDType dtype, void *out, const int32_t *idx, WkIndexLayout idx_layout,
                                           const void *wte, const void *wpe, size_t B, size_t T, size_t C, size_t V,
                                           WkStepStatus *status) {
  size_t n = B * T * C;
  if (n == 0) return WK_OK;
  STORAGE_DISPATCH(dtype, "embedding", embedding_forward((Storage *)out, idx, idx_layout, (const Storage *)wte,
                                                         (const Storage *)wpe, T, C, V, n, status));
}

/* Token rows scatter: two positions may hold the same token, so dwte takes atomics (contended only
 * as often as a token repeats within the batch). dout is of the activation dtype, dwte and dwpe f32. */
template <typename Storage>
__global__ static void token_gradient_kernel(float *dwte, const Storage *dout, const int32_t *idx, WkIndexLayout at,
                                             size_t C, size_t V, size_t n) {
  GRID_STRIDE(i, n) {
    size_t row = i / C, c = i % C;
    int32_t token = idx[wk_index_offset(at, (int64_t)row)];
    if (wk_in_vocab(token, V)) atomicAdd(&dwte[(size_t)token * C + c], to_float(dout[i]));  /* the forward marked the rest */
  }
}

/* Positions gather: dwpe[t, c] += the sum over b of dout[b, t, c], a thread per (t, c), in b order. */
template <typename Storage>
__global__ static void position_gradient_kernel(float *dwpe, const Storage *dout, size_t B, size_t T, size_t C) {
  GRID_STRIDE(i, T * C) {
    float sum = 0.0f;
    for (size_t b = 0; b < B; b++) sum += to_float(dout[b * T * C + i]);
    dwpe[i] += sum;
  }
}

template <typename Storage>
static WkStatus embedding_backward(float *dwte, float *dwpe, const Storage *dout, const int32_t *idx,
                                   WkIndexLayout idx_layout, size_t B, size_t T, size_t C, size_t V) {
  LAUNCH(token_gradient_kernel<Storage>, B * T * C, dwte, dout, idx, idx_layout, C, V, B * T * C);
  LAUNCH(position_gradient_kernel<Storage>, T * C, dwpe, dout, B, T, C);
  return WK_OK;
}

extern "C" WkStatus cuda_embedding_backward(WkDType dtype, float *dwte, float *dwpe, const void *dout,
                                            const int32_t *idx, WkIndexLayout idx_layout, size_t B, size_t T,
                                            size_t C, size_t V) {
  if (B * T * C == 0) return WK_OK;
  STORAGE_DISPATCH(dtype, "embedding_backward",
                   embedding_backward(dwte, dwpe, (const Storage *)dout, idx, idx_layout, B, T, C, V));
}

/* One warp per row (rows are short: C = 768 is 24 floats a lane, all in L1 for the second and third
 * passes); mean and rstd are kept in f32 for the backward. With a residual b (add_layernorm) the
 * first pass also forms the row's sum a + b, rounded into sum (norm_input), and the later passes
 * read the rounded row back from sum, the values the unfused layernorm would read: each lane reads
 * only the elements it wrote itself (the same c), so its own program order makes them visible with
 * no sync, and they come from cache, not DRAM. Kept in registers instead, the row would need C fixed
 * at compile time (24 floats a lane at GPT-2's 768, 128 at Llama's 4096: spilled). */
template <typename Storage>
__global__ static void layernorm_forward_kernel(Storage *sum, Storage *out, float *mean, float *rstd, const Storage *a,
                                                const Storage *b, const Storage *weight, const Storage *bias, size_t N,
                                                size_t C, float eps) {
  ROW_LOOP(n, N) {
    float total = 0.0f;
    for (size_t c = lane(); c < C; c += WARP) total += norm_input(sum, a, b, n * C + c);
    float m = warp_sum(total) / (float)C;
    const Storage *x = (b ? sum : a) + n * C;
    float var = 0.0f;
    for (size_t c = lane(); c < C; c += WARP) var += (to_float(x[c]) - m) * (to_float(x[c]) - m);
    float s = rsqrtf(warp_sum(var) / (float)C + eps);
    for (size_t c = lane(); c < C; c += WARP)
      out[n * C + c] = from_float<Storage>((to_float(x[c]) - m) * s * to_float(weight[c]) + to_float(bias[c]));
    if (lane() == 0) {
      mean[n] = m;
      rstd[n] = s;
    }
  }
}

template <typename Storage>
static WkStatus layernorm_forward(Storage *sum, Storage *out, float *mean, float *rstd, const Storage *a,
                                  const Storage *b, const Storage *weight, const Storage *bias, size_t N, size_t C,
                                  float eps) {
  LAUNCH_ROWS(layernorm_forward_kernel<Storage>, N, sum, out, mean, rstd, a, b, weight, bias, N, C, eps);
  return WK_OK;
}

/* b and sum NULL: the plain layernorm of a. */
extern "C" WkStatus cuda_add_layernorm_forward(WkDType dtype, void *sum, void *out, float *mean, float *rstd,
                                               const void *a, const void *b, const void *weight, const void *bias,
                                               size_t N, size_t C, float eps) {
  if (N == 0) return WK_OK;
  STORAGE_DISPATCH(dtype, "layernorm", layernorm_forward((Storage *)sum, (Storage *)out, mean, rstd, (const Storage *)a,
                                                         (const Storage *)b, (const Storage *)weight,
                                                         (const Storage *)bias, N, C, eps));
}

/* A block per row, grid-stride: the row's two sums are block reductions, and each thread keeps the
 * dweight and dbias of its own columns (c = threadIdx.x + k * THREADS, the same for every row) in
 * shared memory, so they need no atomics. Each block leaves its column sums in partial[block][2C]. */
template <typename Storage>
__global__ static void layernorm_backward_kernel(Storage *dinp, float *partial, const Storage *dout, const Storage *inp,
                                                 const Storage *weight, const float *mean, const float *rstd, size_t N,
                                                 size_t C) {
  extern __shared__ float column_sums[];  /* [2C]: this block's dweight, then its dbias */
  float *dw = column_sums, *db = column_sums + C;
  for (size_t c = threadIdx.x; c < C; c += blockDim.x) dw[c] = db[c] = 0.0f;
  for (size_t n = blockIdx.x; n < N; n += gridDim.x) {
    const Storage *x = inp + n * C, *dy = dout + n * C;
    float m = mean[n], s = rstd[n], dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (size_t c = threadIdx.x; c < C; c += blockDim.x) {
      float dnorm = to_float(weight[c]) * to_float(dy[c]);
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * (to_float(x[c]) - m) * s;
    }
    dnorm_mean = block_sum(dnorm_mean) / (float)C;
    dnorm_norm_mean = block_sum(dnorm_norm_mean) / (float)C;
    for (size_t c = threadIdx.x; c < C; c += blockDim.x) {
      float norm = (to_float(x[c]) - m) * s, g = to_float(dy[c]);
      float d = (to_float(weight[c]) * g - dnorm_mean - norm * dnorm_norm_mean) * s;
      dinp[n * C + c] = from_float<Storage>(to_float(dinp[n * C + c]) + d);
      dw[c] += g * norm;
      db[c] += g;
    }
  }
  __syncthreads();  /* the copy-out below reads dbias entries that other threads own */
  for (size_t c = threadIdx.x; c < 2 * C; c += blockDim.x) partial[blockIdx.x * 2 * C + c] = column_sums[c];
}

/* dweight and dbias (f32, the parameter gradients) += the blocks' column sums, in block order
 * (deterministic). */
__global__ static void layernorm_column_sums_kernel(float *dweight, float *dbias, const float *partial, size_t blocks,
                                                    size_t C) {
  GRID_STRIDE(i, 2 * C) {
    float sum = 0.0f;
    for (size_t b = 0; b < blocks; b++) sum += partial[b * 2 * C + i];
    *(i < C ? dweight + i : dbias + (i - C)) += sum;
  }
}

template <typename Storage>
static WkStatus layernorm_backward(Storage *dinp, float *dweight, float *dbias, const Storage *dout,
                                   const Storage *inp, const Storage *weight, const float *mean, const float *rstd,
                                   size_t N, size_t C) {
  int device = 0, sms = 0, shared_limit = 0;
  CUDA_TRY(cudaGetDevice(&device));
  CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  CUDA_TRY(cudaDeviceGetAttribute(&shared_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  size_t shared = 2 * C * sizeof(float);
  if (shared > (size_t)shared_limit)
    return WK_FAIL(WK_ERR_UNSUPPORTED, "layernorm_backward: C = %zu needs %zu bytes of shared memory, cuda:%d has %d",
                   C, shared, device, shared_limit);
  CUDA_TRY(cudaFuncSetAttribute(layernorm_backward_kernel<Storage>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)shared));
  size_t blocks = N < (size_t)(4 * sms) ? N : (size_t)(4 * sms);  /* a few resident blocks per SM */
  DeviceScratch partial;
  WK_TRY(scratch_new(&partial, blocks * shared));
  layernorm_backward_kernel<Storage><<<(unsigned)blocks, THREADS, shared, current_stream()>>>(
      dinp, (float *)partial.ptr, dout, inp, weight, mean, rstd, N, C);
  WkStatus status = launch_status("layernorm backward");
  if (status == WK_OK) {
    layernorm_column_sums_kernel<<<blocks_for(2 * C, THREADS), THREADS, 0, current_stream()>>>(
        dweight, dbias, (float *)partial.ptr, blocks, C);
    status = launch_status("layernorm column sums");
  }
  scratch_free(&partial);
  return status;
}

extern "C" WkStatus cuda_layernorm_backward(WkDType dtype, void *dinp, float *dweight, float *dbias, const void *dout,
                                            const void *inp, const void *weight, const float *mean, const float *rstd,
                                            size_t N, size_t C) {
  if (N == 0 || C == 0) return WK_OK;
  STORAGE_DISPATCH(dtype, "layernorm_backward",
                   layernorm_backward((Storage *)dinp, dweight, dbias, (const Storage *)dout,
                                      (const Storage *)inp, (const Storage *)weight, mean, rstd, N, C));
}
