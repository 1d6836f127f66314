/*
 * copy.cu — copies that involve device memory: bytes between any two memories (cudaMemcpyAsync on a
 * stream), and the strided or casting copy between two device tensors (a kernel).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda.cuh"

/* Where to run: on stream when it is a CUDA one, else on the current stream of the thread's device.
 * A CUDA stream brings its device, which the calling thread may not have entered (the loader's
 * reader threads copy on streams of theirs). */
static int device_for(const WkStream *stream) {
  return stream && stream->device == WK_DEVICE_CUDA ? stream->device_index : wk_cuda_current_device();
}

static cudaStream_t stream_for(const WkStream *stream) {
  return stream && stream->device == WK_DEVICE_CUDA ? (cudaStream_t)stream->handle : current_stream();
}

extern "C" WkStatus cuda_copy(void *dst, const void *src, size_t bytes, WkStream *stream) {
  DEVICE_GUARD(device_for(stream));
  if (bytes) CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_for(stream)));
  return WK_OK;
}

struct Layout {
  int ndim;
  int64_t offset;
  int64_t shape[WK_MAX_DIMS];
  int64_t strides[WK_MAX_DIMS];
};

__device__ static double load_any(const void *base, WkDType dtype, int64_t i) {
  switch (dtype) {
    case WK_F32: return ((const float *)base)[i];
    case WK_BF16: return __bfloat162float(((const __nv_bfloat16 *)base)[i]);
    case WK_F16: return __half2float(((const __half *)base)[i]);
    case WK_I32: return ((const int32_t *)base)[i];
    case WK_I64: return (double)((const int64_t *)base)[i];
    case WK_U16: return ((const uint16_t *)base)[i];
    case WK_U8: return ((const uint8_t *)base)[i];
    default: return 0.0;
  }
}

__device__ static void store_any(void *base, WkDType dtype, int64_t i, double v) {
  switch (dtype) {
    case WK_F32: ((float *)base)[i] = (float)v; break;
    case WK_BF16: ((__nv_bfloat16 *)base)[i] = __float2bfloat16_rn((float)v); break;
    case WK_F16: ((__half *)base)[i] = __float2half_rn((float)v); break;
    case WK_I32: ((int32_t *)base)[i] = (int32_t)v; break;
    case WK_I64: ((int64_t *)base)[i] = (int64_t)v; break;
    case WK_U16: ((uint16_t *)base)[i] = (uint16_t)v; break;
    case WK_U8: ((uint8_t *)base)[i] = (uint8_t)v; break;
    default: break;
  }
}

/* dst (contiguous) = src (any strides), converted; element i of dst is logical element i of src. */
__global__ static void copy_convert_kernel(void *dst, WkDType dst_dtype, const void *src, WkDType src_dtype,
                                           Layout layout, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t rest = i, at = layout.offset;
    for (int d = layout.ndim - 1; d >= 0; d--) {
      at += (rest % layout.shape[d]) * layout.strides[d];
      rest /= layout.shape[d];
    }
    store_any(dst, dst_dtype, i, load_any(src, src_dtype, at));
  }
}

extern "C" WkStatus cuda_copy_convert(WkTensor *dst, const WkTensor *src, WkStream *stream) {
  DEVICE_GUARD(device_for(stream));
  Layout layout = {};
  layout.ndim = src->ndim;
  layout.offset = src->offset;
  for (int d = 0; d < src->ndim; d++) {
    layout.shape[d] = src->shape[d];
    layout.strides[d] = src->strides[d];
  }
  int64_t n = wk_tensor_numel(dst);
  if (n == 0) return WK_OK;
  copy_convert_kernel<<<blocks_for((size_t)n, THREADS), THREADS, 0, stream_for(stream)>>>(
      tensor_ptr(dst), dst->dtype, src->storage->data, src->dtype, layout, n);
  LAUNCH_CHECK();
  return WK_OK;
}
