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

__global__ static void sumsq_kernel(const float *x, size_t n, double *out) {
  float partial = 0.0f;
  GRID_STRIDE(i, n) partial += x[i] * x[i];
  partial = warp_sum(partial);
  if (lane() == 0) atomicAdd(out, (double)partial);
}

extern "C" WkStatus cuda_sumsq(const float *x, size_t n, double *out) {
  DeviceScratch sum;
  WK_TRY(scalar_new(&sum, sizeof(double)));
  if (n) {
    sumsq_kernel<<<blocks_for(n, THREADS), THREADS, 0, current_stream()>>>(x, n, (double *)sum.ptr);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
      scratch_free(&sum);
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
