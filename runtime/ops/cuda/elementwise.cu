/*
 * runtime/ops/cuda — the ops half of the CUDA module: kernels (here) and cuBLAS matmuls (blas.cu),
 * entered through the module's table (runtime/tensor/cuda_module.h) after ops.c checked the arguments.
 *
 * kernels.cu — the CUDA mirror of runtime/ops/cpu, kernel for kernel, in fp32 arithmetic.
 *
 * Kept deliberately plain (grid-stride loops, a warp per row for the row reductions, one thread
 * per (b, h, t) query in attention, atomics for gradient scatters): correctness first, checked
 * against the CPU reference by tests/cuda_spec.lua. Faster kernels can replace these one by one
 * behind the same signatures. Index checks (embedding, targets) raise a device flag that is read
 * back, so bad tokens fail with the same message class as on the CPU.
 */
#include "common.cuh"

#define GRID_STRIDE(i, n) \
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

#define LAUNCH(kernel, n, ...)                                                            \
  do {                                                                                    \
    kernel<<<blocks_for((n), THREADS), THREADS, 0, current_stream()>>>(__VA_ARGS__);      \
    LAUNCH_CHECK();                                                                       \
  } while (0)

/* One warp per row: blocks of WARPS_PER_BLOCK rows. */
#define LAUNCH_ROWS(kernel, rows, ...)                                                             \
  do {                                                                                             \
    kernel<<<blocks_for((rows), WARPS_PER_BLOCK), THREADS, 0, current_stream()>>>(__VA_ARGS__);    \
    LAUNCH_CHECK();                                                                                \
  } while (0)

/* The rows of a warp, grid-stride: past blocks_for's cap of 1,048,560 blocks (8.4M rows) a warp
 * takes rows a grid apart. The loop is warp-uniform, so the warp's shuffles stay converged. */
#define ROW_LOOP(n, N)                                                                      \
  for (size_t n = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / WARP; n < (N);         \
       n += (size_t)gridDim.x * blockDim.x / WARP)
__device__ static unsigned lane(void) { return threadIdx.x % WARP; }

/* ---- elementwise --------------------------------------------------------------------------------- */

__global__ static void fill_kernel(void *data, size_t n, size_t elem_size, uint64_t pattern) {
  GRID_STRIDE(i, n) {
    switch (elem_size) {
      case 1: ((uint8_t *)data)[i] = (uint8_t)pattern; break;
      case 2: ((uint16_t *)data)[i] = (uint16_t)pattern; break;
      case 4: ((uint32_t *)data)[i] = (uint32_t)pattern; break;
      default: ((uint64_t *)data)[i] = pattern; break;
    }
  }
}

extern "C" WkStatus cuda_fill(void *data, size_t n, size_t elem_size, const void *pattern) {
  uint64_t bits = 0;
  memcpy(&bits, pattern, elem_size);  /* little-endian: the low bytes are the element */
  if (n) LAUNCH(fill_kernel, n, data, n, elem_size, bits);
  return WK_OK;
}

__global__ static void scale_kernel(float *x, size_t n, float alpha) { GRID_STRIDE(i, n) x[i] *= alpha; }
__global__ static void add_kernel(float *out, const float *a, const float *b, size_t n) { GRID_STRIDE(i, n) out[i] = a[i] + b[i]; }
__global__ static void axpy_kernel(float *y, float alpha, const float *x, size_t n) { GRID_STRIDE(i, n) y[i] += alpha * x[i]; }

__global__ static void round_kernel(float *x, size_t n, WkDType dtype) {
  GRID_STRIDE(i, n) {
    if (dtype == WK_BF16) x[i] = __bfloat162float(__float2bfloat16_rn(x[i]));
    else if (dtype == WK_F16) x[i] = __half2float(__float2half_rn(x[i]));
  }
}

extern "C" WkStatus cuda_scale(float *x, size_t n, float alpha) {
  if (n) LAUNCH(scale_kernel, n, x, n, alpha);
  return WK_OK;
}
extern "C" WkStatus cuda_add(float *out, const float *a, const float *b, size_t n) {
  if (n) LAUNCH(add_kernel, n, out, a, b, n);
  return WK_OK;
}
extern "C" WkStatus cuda_axpy(float *y, float alpha, const float *x, size_t n) {
  if (n) LAUNCH(axpy_kernel, n, y, alpha, x, n);
  return WK_OK;
}
extern "C" WkStatus cuda_round(float *x, size_t n, WkDType dtype) {
  if (n) LAUNCH(round_kernel, n, x, n, dtype);
  return WK_OK;
}

__global__ static void sumsq_kernel(const float *x, size_t n, double *out) {
  float partial = 0.0f;
  GRID_STRIDE(i, n) partial += x[i] * x[i];
  partial = warp_sum(partial);
  if (lane() == 0) atomicAdd(out, (double)partial);
}

extern "C" WkStatus cuda_sumsq(const float *x, size_t n, double *out) {
  DeviceScalar sum;
  WK_TRY(scalar_new(&sum, sizeof(double)));
  if (n) {
    sumsq_kernel<<<blocks_for(n, THREADS), THREADS, 0, current_stream()>>>(x, n, (double *)sum.ptr);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
      cuda_release(sum.device, sum.ptr);
      return WK_FAIL(WK_ERR_DEVICE, "sumsq kernel: %s", cudaGetErrorString(err));
    }
  }
  return scalar_read(&sum, out, sizeof(double));
}

__device__ static float gelu_tanh(float x) { return tanhf(GELU_SCALE * (x + GELU_CUBE * x * x * x)); }

__global__ static void gelu_forward_kernel(float *out, const float *inp, size_t n) {
  GRID_STRIDE(i, n) out[i] = 0.5f * inp[i] * (1.0f + gelu_tanh(inp[i]));
}

__global__ static void gelu_backward_kernel(float *dinp, const float *dout, const float *inp, size_t n) {
  GRID_STRIDE(i, n) {
    float x = inp[i], th = gelu_tanh(x);
    float local = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * x * x);
    dinp[i] += local * dout[i];
  }
}

extern "C" WkStatus cuda_gelu_forward(float *out, const float *inp, size_t n) {
  if (n) LAUNCH(gelu_forward_kernel, n, out, inp, n);
  return WK_OK;
}
extern "C" WkStatus cuda_gelu_backward(float *dinp, const float *dout, const float *inp, size_t n) {
  if (n) LAUNCH(gelu_backward_kernel, n, dinp, dout, inp, n);
  return WK_OK;
}

__global__ static void adamw_kernel(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                                    float beta1, float beta2, float eps, float weight_decay, float m_correction,
                                    float v_correction, float grad_scale) {
  GRID_STRIDE(i, n) {
    float g = grad[i] * grad_scale;
    m[i] = beta1 * m[i] + (1.0f - beta1) * g;
    v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
    float update = (m[i] / m_correction) / (sqrtf(v[i] / v_correction) + eps);
    param[i] -= lr * (update + weight_decay * param[i]);
  }
}

extern "C" WkStatus cuda_adamw(float *param, const float *grad, float *m, float *v, size_t n, float lr, float beta1,
                               float beta2, float eps, float weight_decay, int64_t step, float grad_scale) {
  float m_correction = 1.0f - powf(beta1, (float)step), v_correction = 1.0f - powf(beta2, (float)step);
  if (n) LAUNCH(adamw_kernel, n, param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, m_correction, v_correction, grad_scale);
  return WK_OK;
}

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

/* Launches a kernel that may raise *bad, then turns the flag into an error. */
static WkStatus check_flag(DeviceScalar *flag, const char *what) {
  int bad = 0;
  WK_TRY(scalar_read(flag, &bad, sizeof bad));
  if (bad) return WK_FAIL(WK_ERR_INVALID_ARG, "%s: an index is outside the vocabulary (tokenizer and model vocab disagree?)", what);
  return WK_OK;
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

/* ---- attention ------------------------------------------------------------------------------------ */

/* One thread per query (b, h, t): scores, softmax into its att row, then the weighted values. */
__global__ static void attention_forward_kernel(float *out, float *att, const float *qkv, size_t B, size_t T, size_t C,
                                                size_t NH) {
  size_t hs = C / NH;
  float scale = rsqrtf((float)hs);
  GRID_STRIDE(i, B * NH * T) {
    size_t t = i % T, h = (i / T) % NH, b = i / (T * NH);
    const float *q = qkv + (b * T + t) * 3 * C + h * hs;
    float *row = att + ((b * NH + h) * T + t) * T;
    float maxval = -INFINITY;
    for (size_t t2 = 0; t2 <= t; t2++) {
      const float *k = qkv + (b * T + t2) * 3 * C + C + h * hs;
      float dot = 0.0f;
      for (size_t j = 0; j < hs; j++) dot += q[j] * k[j];
      row[t2] = dot * scale;
      maxval = fmaxf(maxval, row[t2]);
    }
    float sum = 0.0f;
    for (size_t t2 = 0; t2 <= t; t2++) {
      row[t2] = expf(row[t2] - maxval);
      sum += row[t2];
    }
    for (size_t t2 = 0; t2 < T; t2++) row[t2] = t2 <= t ? row[t2] / sum : 0.0f;
    float *o = out + (b * T + t) * C + h * hs;
    for (size_t j = 0; j < hs; j++) {
      float acc = 0.0f;
      for (size_t t2 = 0; t2 <= t; t2++) acc += row[t2] * qkv[(b * T + t2) * 3 * C + 2 * C + h * hs + j];
      o[j] = acc;
    }
  }
}

__device__ static float dot_hs(const float *a, const float *b, size_t n) {
  float sum = 0.0f;
  for (size_t j = 0; j < n; j++) sum += a[j] * b[j];
  return sum;
}

/* One thread per query; key and value gradients of earlier positions are scattered with atomics. */
__global__ static void attention_backward_kernel(float *dqkv, const float *dout, const float *qkv, const float *att,
                                                 size_t B, size_t T, size_t C, size_t NH) {
  size_t hs = C / NH;
  float scale = rsqrtf((float)hs);
  GRID_STRIDE(i, B * NH * T) {
    size_t t = i % T, h = (i / T) % NH, b = i / (T * NH);
    const float *row = att + ((b * NH + h) * T + t) * T;
    const float *dy = dout + (b * T + t) * C + h * hs, *q = qkv + (b * T + t) * 3 * C + h * hs;
    float *dq = dqkv + (b * T + t) * 3 * C + h * hs;
    float weighted = 0.0f;
    for (size_t t2 = 0; t2 <= t; t2++) weighted += row[t2] * dot_hs(dy, qkv + (b * T + t2) * 3 * C + 2 * C + h * hs, hs);
    for (size_t t2 = 0; t2 <= t; t2++) {
      size_t base = (b * T + t2) * 3 * C + h * hs;
      const float *k = qkv + base + C, *v = qkv + base + 2 * C;
      float dpre = row[t2] * (dot_hs(dy, v, hs) - weighted) * scale;
      for (size_t j = 0; j < hs; j++) {
        atomicAdd(&dqkv[base + 2 * C + j], row[t2] * dy[j]);
        dq[j] += dpre * k[j];
        atomicAdd(&dqkv[base + C + j], dpre * q[j]);
      }
    }
  }
}

extern "C" WkStatus cuda_attention_forward(float *out, float *att, const float *qkv, size_t B, size_t T, size_t C,
                                           size_t NH) {
  if (B * NH * T) LAUNCH(attention_forward_kernel, B * NH * T, out, att, qkv, B, T, C, NH);
  return WK_OK;
}

extern "C" WkStatus cuda_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att, size_t B,
                                            size_t T, size_t C, size_t NH) {
  if (B * NH * T) LAUNCH(attention_backward_kernel, B * NH * T, dqkv, dout, qkv, att, B, T, C, NH);
  return WK_OK;
}

/* ---- cross-entropy -------------------------------------------------------------------------------- */

__device__ static float row_log_sum_exp(const float *row, size_t V) {
  float maxval = -INFINITY;
  for (size_t v = lane(); v < V; v += WARP) maxval = fmaxf(maxval, row[v]);
  maxval = warp_max(maxval);
  float sum = 0.0f;
  for (size_t v = lane(); v < V; v += WARP) sum += expf(row[v] - maxval);
  return maxval + logf(warp_sum(sum));
}

__global__ static void cross_entropy_forward_kernel(float *losses, const float *logits, const int32_t *targets,
                                                    WkIndexLayout at, const uint8_t *mask, size_t N, size_t V,
                                                    float normalizer, double *loss_sum, int *bad) {
  ROW_LOOP(n, N) {
    int32_t target = targets[wk_index_offset(at, (int64_t)n)];
    bool counted = !mask || mask[n];
    if (counted && (target < 0 || (size_t)target >= V)) {  /* masked-out targets may hold anything */
      if (lane() == 0) {
        *bad = 1;
        losses[n] = 0.0f;
      }
      continue;
    }
    float lse = counted ? row_log_sum_exp(logits + n * V, V) : 0.0f;
    if (lane() == 0) {
      losses[n] = counted ? (lse - logits[n * V + target]) / normalizer : 0.0f;
      atomicAdd(loss_sum, (double)losses[n]);
    }
  }
}

extern "C" WkStatus cuda_cross_entropy_forward(float *losses, const float *logits, const int32_t *targets,
                                               WkIndexLayout targets_layout, const uint8_t *mask, size_t N, size_t V,
                                               float normalizer, double *loss_sum) {
  DeviceScalar sum, flag;
  WK_TRY(scalar_new(&sum, sizeof(double)));
  WkStatus status = scalar_new(&flag, sizeof(int));
  if (status != WK_OK) {
    cuda_release(sum.device, sum.ptr);
    return status;
  }
  if (N) {
    cross_entropy_forward_kernel<<<blocks_for(N, WARPS_PER_BLOCK), THREADS, 0, current_stream()>>>(
        losses, logits, targets, targets_layout, mask, N, V, normalizer, (double *)sum.ptr, (int *)flag.ptr);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) status = WK_FAIL(WK_ERR_DEVICE, "cross_entropy kernel: %s", cudaGetErrorString(err));
  }
  WkStatus read = scalar_read(&sum, loss_sum, sizeof(double));
  WkStatus flagged = check_flag(&flag, "cross_entropy (targets)");
  return status != WK_OK ? status : read != WK_OK ? read : flagged;
}

__global__ static void cross_entropy_backward_kernel(float *dlogits, const float *logits, const int32_t *targets,
                                                     WkIndexLayout at, const uint8_t *mask, size_t N, size_t V,
                                                     float scale) {
  ROW_LOOP(n, N) {
    if (mask && !mask[n]) continue;
    const float *row = logits + n * V;
    float lse = row_log_sum_exp(row, V);
    size_t target = (size_t)targets[wk_index_offset(at, (int64_t)n)];
    for (size_t v = lane(); v < V; v += WARP)
      dlogits[n * V + v] += scale * (expf(row[v] - lse) - (target == v ? 1.0f : 0.0f));
  }
}

extern "C" WkStatus cuda_cross_entropy_backward(float *dlogits, const float *logits, const int32_t *targets,
                                                WkIndexLayout targets_layout, const uint8_t *mask, size_t N, size_t V,
                                                float normalizer, float dloss) {
  if (N) LAUNCH_ROWS(cross_entropy_backward_kernel, N, dlogits, logits, targets, targets_layout, mask, N, V,
                     dloss / normalizer);
  return WK_OK;
}
