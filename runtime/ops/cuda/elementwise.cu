/*
 * elementwise.cu — the CUDA mirror of runtime/ops/cpu/elementwise.c: fill, scale, add, axpy, round,
 * sumsq, GELU and AdamW, in fp32 arithmetic, one grid-stride loop each.
 */
#include "common.cuh"

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

/* ---- sums: two stages, no atomics, the same result every run ------------------------------------- */

enum { SUM_BLOCKS = 1024 };  /* enough to fill any GPU; the second stage sums this many partials */

/* Each block's sum of x[i] (or x[i]^2) over its grid-stride share, in partials[blockIdx.x]. */
__global__ static void partial_sums_kernel(double *partials, const float *x, size_t n, bool squares) {
  float sum = 0.0f;
  GRID_STRIDE(i, n) sum += squares ? x[i] * x[i] : x[i];
  sum = block_sum(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

/* One block: the partials' total, in double. */
__global__ static void total_kernel(double *out, const double *partials, size_t count) {
  double sum = 0.0;
  for (size_t i = threadIdx.x; i < count; i += blockDim.x) sum += partials[i];
  for (int offset = WARP / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  __shared__ double warp_sums[WARPS_PER_BLOCK];
  if (lane() == 0) warp_sums[threadIdx.x / WARP] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < WARPS_PER_BLOCK; w++) total += warp_sums[w];
    *out = total;
  }
}

WkStatus device_sum(double *out, const float *x, size_t n, bool squares) {
  unsigned blocks = blocks_for(n, THREADS) < SUM_BLOCKS ? blocks_for(n, THREADS) : SUM_BLOCKS;
  DeviceScratch partials;
  WK_TRY(scratch_new(&partials, blocks * sizeof(double)));
  partial_sums_kernel<<<blocks, THREADS, 0, current_stream()>>>((double *)partials.ptr, x, n, squares);
  WkStatus status = launch_status("partial sums");
  if (status == WK_OK) {
    total_kernel<<<1, THREADS, 0, current_stream()>>>(out, (double *)partials.ptr, blocks);
    status = launch_status("total");
  }
  scratch_free(&partials);
  return status;
}

extern "C" WkStatus cuda_sumsq(const float *x, size_t n, double *out) {
  DeviceScratch sum;
  WK_TRY(scalar_new(&sum, sizeof(double)));
  WkStatus status = device_sum((double *)sum.ptr, x, n, true);
  if (status != WK_OK) {
    scratch_free(&sum);
    return status;
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
