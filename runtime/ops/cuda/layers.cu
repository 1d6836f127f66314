/*
 * layers.cu — the CUDA mirror of runtime/ops/cpu/layers.c (less the matmuls, in blas.cu): embedding
 * and layernorm, forward and backward.
 */
#include "common.cuh"

/* ---- embedding and layernorm ------------------------------------------------------------------------ */

__global__ static void embedding_forward_kernel(float *out, const int32_t *idx, WkIndexLayout at, const float *wte,
                                                const float *wpe, size_t T, size_t C, size_t V, size_t n, int *bad) {
  GRID_STRIDE(i, n) {
    size_t row = i / C, c = i % C;
    int32_t token = idx[wk_index_offset(at, (int64_t)row)];
    if (token < 0 || (size_t)token >= V) {
      *bad = 1;
      out[i] = 0.0f;
    } else {
      out[i] = wte[(size_t)token * C + c] + wpe[(row % T) * C + c];
    }
  }
}


extern "C" WkStatus cuda_embedding_forward(float *out, const int32_t *idx, WkIndexLayout idx_layout, const float *wte,
                                           const float *wpe, size_t B, size_t T, size_t C, size_t V) {
  size_t n = B * T * C;
  DeviceScalar flag;
  WK_TRY(scalar_new(&flag, sizeof(int)));
  if (n) {
    embedding_forward_kernel<<<blocks_for(n, THREADS), THREADS, 0, current_stream()>>>(
        out, idx, idx_layout, wte, wpe, T, C, V, n, (int *)flag.ptr);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
      cuda_release(flag.device, flag.ptr);
      return WK_FAIL(WK_ERR_DEVICE, "embedding kernel: %s", cudaGetErrorString(err));
    }
  }
  return check_flag(&flag, "embedding");
}

__global__ static void embedding_backward_kernel(float *dwte, float *dwpe, const float *dout, const int32_t *idx,
                                                 WkIndexLayout at, size_t T, size_t C, size_t n) {
  GRID_STRIDE(i, n) {
    size_t row = i / C, c = i % C;
    atomicAdd(&dwte[(size_t)idx[wk_index_offset(at, (int64_t)row)] * C + c], dout[i]);
    atomicAdd(&dwpe[(row % T) * C + c], dout[i]);
  }
}

extern "C" WkStatus cuda_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *idx,
                                            WkIndexLayout idx_layout, size_t B, size_t T, size_t C) {
  size_t n = B * T * C;
  if (n) LAUNCH(embedding_backward_kernel, n, dwte, dwpe, dout, idx, idx_layout, T, C, n);
  return WK_OK;
}

__global__ static void layernorm_forward_kernel(float *out, float *mean, float *rstd, const float *inp,
                                                const float *weight, const float *bias, size_t N, size_t C, float eps) {
  ROW_LOOP(n, N) {
    const float *x = inp + n * C;
    float sum = 0.0f;
    for (size_t c = lane(); c < C; c += WARP) sum += x[c];
    float m = warp_sum(sum) / (float)C;
    float var = 0.0f;
    for (size_t c = lane(); c < C; c += WARP) var += (x[c] - m) * (x[c] - m);
    float s = rsqrtf(warp_sum(var) / (float)C + eps);
    for (size_t c = lane(); c < C; c += WARP) out[n * C + c] = (x[c] - m) * s * weight[c] + bias[c];
    if (lane() == 0) {
      mean[n] = m;
      rstd[n] = s;
    }
  }
}

extern "C" WkStatus cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                                           const float *bias, size_t N, size_t C, float eps) {
  if (N) LAUNCH_ROWS(layernorm_forward_kernel, N, out, mean, rstd, inp, weight, bias, N, C, eps);
  return WK_OK;
}

__global__ static void layernorm_backward_kernel(float *dinp, float *dweight, float *dbias, const float *dout,
                                                 const float *inp, const float *weight, const float *mean,
                                                 const float *rstd, size_t N, size_t C) {
  ROW_LOOP(n, N) {
    const float *x = inp + n * C, *dy = dout + n * C;
    float m = mean[n], s = rstd[n], dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (size_t c = lane(); c < C; c += WARP) {
      float dnorm = weight[c] * dy[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * (x[c] - m) * s;
    }
    dnorm_mean = warp_sum(dnorm_mean) / (float)C;
    dnorm_norm_mean = warp_sum(dnorm_norm_mean) / (float)C;
    for (size_t c = lane(); c < C; c += WARP) {
      float norm = (x[c] - m) * s;
      dinp[n * C + c] += (weight[c] * dy[c] - dnorm_mean - norm * dnorm_norm_mean) * s;
      atomicAdd(&dweight[c], dy[c] * norm);
      atomicAdd(&dbias[c], dy[c]);
    }
  }
}

extern "C" WkStatus cuda_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                            const float *inp, const float *weight, const float *mean,
                                            const float *rstd, size_t N, size_t C) {
  if (N) LAUNCH_ROWS(layernorm_backward_kernel, N, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  return WK_OK;
}
