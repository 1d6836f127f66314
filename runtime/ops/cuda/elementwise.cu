/*
 * elementwise.cu — the CUDA mirror of runtime/ops/cpu/elementwise.c: fill, scale, add, axpy, round,
 * sumsq, GELU and AdamW, one grid-stride loop each; add, axpy and GELU store f32, bf16 or f16 and
 * compute in f32; scale, round, sumsq and AdamW serve the f32 weights and their gradients only.
 * The GELU passes are also the matmul's way where cuBLASLt has no GELU epilogue (blas.cu).
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

__global__ static void scale_kernel(float *x, size_t n, float alpha) {
  GRID_STRIDE(i, n) x[i] *= alpha;
}
template <typename Storage>
__global__ static void add_kernel(Storage *out, const Storage *a, const Storage *b, size_t n) {
  GRID_STRIDE(i, n) stored_add(out, a, b, i);
}
template <typename Storage>
__global__ static void axpy_kernel(Storage *y, float alpha, const Storage *x, size_t n) {
  GRID_STRIDE(i, n) y[i] = from_float<Storage>(to_float(y[i]) + alpha * to_float(x[i]));
}

/* Launches kernel<Storage> over n elements for dtype's storage type, then returns WK_OK. */
#define LAUNCH_STORED(dtype, what, kernel, n, ...)                                                 \
  do {                                                                                             \
    if ((n) == 0) return WK_OK;                                                                    \
    switch (dtype) {                                                                               \
      case WK_F32: { typedef float Storage; LAUNCH(kernel<Storage>, n, __VA_ARGS__); break; }      \
      case WK_BF16: { typedef __nv_bfloat16 Storage; LAUNCH(kernel<Storage>, n, __VA_ARGS__); break; } \
      case WK_F16: { typedef __half Storage; LAUNCH(kernel<Storage>, n, __VA_ARGS__); break; }     \
      default: return WK_FAIL(WK_ERR_INVALID_ARG, "%s: %s tensors have no CUDA kernel", what, wk_dtype_name(dtype)); \
    }                                                                                              \
    return WK_OK;                                                                                  \
  } while (0)

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
extern "C" WkStatus cuda_add(WkDType dtype, void *out, const void *a, const void *b, size_t n) {
  LAUNCH_STORED(dtype, "add", add_kernel, n, (Storage *)out, (const Storage *)a, (const Storage *)b, n);
}
extern "C" WkStatus cuda_axpy(WkDType dtype, void *y, float alpha, const void *x, size_t n) {
  LAUNCH_STORED(dtype, "axpy", axpy_kernel, n, (Storage *)y, alpha, (const Storage *)x, n);
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
    *out += total;
  }
}

WkStatus device_sum(double *out, const float *x, size_t n, bool squares) {
  unsigned blocks = blocks_for(n, THREADS);
  if (blocks > (unsigned)SUM_BLOCKS) blocks = SUM_BLOCKS;
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

__device__ static float gelu_tanh(float x) { return tanhf(wk_gelu_tanh_arg(x)); }

template <typename Storage>
__global__ static void gelu_forward_kernel(Storage *out, const Storage *inp, size_t n) {
  GRID_STRIDE(i, n) {
    float x = to_float(inp[i]);
    out[i] = from_float<Storage>(wk_gelu(x, gelu_tanh(x)));
  }
}

__device__ static float gelu_derivative(float x) { return wk_gelu_derivative(x, gelu_tanh(x)); }

template <typename Storage>
__global__ static void gelu_backward_kernel(Storage *dinp, const Storage *dout, const Storage *inp, size_t n) {
  GRID_STRIDE(i, n) dinp[i] = from_float<Storage>(to_float(dinp[i]) + gelu_derivative(to_float(inp[i])) * to_float(dout[i]));
}

template <typename Storage>
__global__ static void gelu_derivative_times_kernel(Storage *d, const Storage *pre, size_t n) {
  GRID_STRIDE(i, n) d[i] = from_float<Storage>(gelu_derivative(to_float(pre[i])) * to_float(d[i]));
}

extern "C" WkStatus cuda_gelu_forward(WkDType dtype, void *out, const void *inp, size_t n) {
  LAUNCH_STORED(dtype, "gelu", gelu_forward_kernel, n, (Storage *)out, (const Storage *)inp, n);
}
extern "C" WkStatus cuda_gelu_backward(WkDType dtype, void *dinp, const void *dout, const void *inp, size_t n) {
  LAUNCH_STORED(dtype, "gelu_backward", gelu_backward_kernel, n, (Storage *)dinp, (const Storage *)dout,
                (const Storage *)inp, n);
}
WkStatus gelu_derivative_times(WkDType dtype, void *d, const void *pre, size_t n) {
  LAUNCH_STORED(dtype, "matmul_backward_gelu", gelu_derivative_times_kernel, n, (Storage *)d, (const Storage *)pre, n);
}

/* f32 master weights and moments; each element read once and written once. */
__global__ static void adamw_kernel(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                                    float beta1, float beta2, float eps, float weight_decay, float m_correction,
                                    float v_correction, float grad_scale) {
  GRID_STRIDE(i, n) {
    float g = grad[i] * grad_scale, p = param[i];
    float mi = beta1 * m[i] + (1.0f - beta1) * g, vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    float update = (mi / m_correction) / (sqrtf(vi / v_correction) + eps);
    m[i] = mi;
    v[i] = vi;
    param[i] = p - lr * (update + weight_decay * p);
  }
}

extern "C" WkStatus cuda_adamw(float *param, const float *grad, float *m, float *v, size_t n, float lr, float beta1,
                               float beta2, float eps, float weight_decay, int64_t step, float grad_scale) {
  float m_correction = 1.0f - powf(beta1, (float)step), v_correction = 1.0f - powf(beta2, (float)step);
  if (n) LAUNCH(adamw_kernel, n, param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, m_correction, v_correction, grad_scale);
  return WK_OK;
}
