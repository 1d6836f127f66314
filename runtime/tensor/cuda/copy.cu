/*
 * copy.cu — copies that involve device memory: bytes between any two memories (cudaMemcpyAsync on a
 * stream), and the strided or casting copy between two device tensors (a kernel), by cast.h's rules
 * (the CPU's, bit for bit).
 */
#include "../cast.h"
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

/* One element on its way from one dtype to another: a float (f32, bf16, f16 are exact in it) or an
 * int64_t (every integer dtype is), as cast.h loads it. */
struct Element {
  bool real;
  float f;
  int64_t i;
};

__device__ static Element load_element(const void *base, WkDType dtype, int64_t at) {
  switch (dtype) {
    case WK_F32: return {true, f32_load(((const float *)base)[at]), 0};
    case WK_BF16: return {true, bf16_load(((const uint16_t *)base)[at]), 0};
    case WK_F16: return {true, f16_load(((const uint16_t *)base)[at]), 0};
    case WK_I32: return {false, 0.0f, i32_load(((const int32_t *)base)[at])};
    case WK_I64: return {false, 0.0f, i64_load(((const int64_t *)base)[at])};
    case WK_U16: return {false, 0.0f, u16_load(((const uint16_t *)base)[at])};
    default: return {false, 0.0f, u8_load(((const uint8_t *)base)[at])};
  }
}

#define FROM(dst, e) ((e).real ? dst##_from_real((e).f) : dst##_from_integer((e).i))

__device__ static void store_element(void *base, WkDType dtype, int64_t i, Element e) {
  switch (dtype) {
    case WK_F32: ((float *)base)[i] = FROM(f32, e); break;
    case WK_BF16: ((uint16_t *)base)[i] = FROM(bf16, e); break;
    case WK_F16: ((uint16_t *)base)[i] = FROM(f16, e); break;
    case WK_I32: ((int32_t *)base)[i] = FROM(i32, e); break;
    case WK_I64: ((int64_t *)base)[i] = FROM(i64, e); break;
    case WK_U16: ((uint16_t *)base)[i] = FROM(u16, e); break;
    default: ((uint8_t *)base)[i] = FROM(u8, e); break;
  }
}

/* The same dtype is the same bits (NaN payloads included), as on the CPU. */
__device__ static void copy_bits(void *dst, const void *src, size_t size, int64_t i, int64_t at) {
  switch (size) {
    case 1: ((uint8_t *)dst)[i] = ((const uint8_t *)src)[at]; break;
    case 2: ((uint16_t *)dst)[i] = ((const uint16_t *)src)[at]; break;
    case 4: ((uint32_t *)dst)[i] = ((const uint32_t *)src)[at]; break;
    default: ((uint64_t *)dst)[i] = ((const uint64_t *)src)[at]; break;
  }
}

/* dst (contiguous) = src (any strides), converted; element i of dst is logical element i of src. */
__global__ static void copy_convert_kernel(void *dst, WkDType dst_dtype, const void *src, WkDType src_dtype,
                                           size_t elem_size, Layout layout, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t rest = i, at = layout.offset;
    for (int d = layout.ndim - 1; d >= 0; d--) {
      at += (rest % layout.shape[d]) * layout.strides[d];
      rest /= layout.shape[d];
    }
    if (dst_dtype == src_dtype) copy_bits(dst, src, elem_size, i, at);
    else store_element(dst, dst_dtype, i, load_element(src, src_dtype, at));
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
      tensor_ptr(dst), dst->dtype, src->storage->data, src->dtype, wk_dtype_size(src->dtype), layout, n);
  LAUNCH_CHECK();
  return WK_OK;
}
