/*
 * runtime/tensor — tensors: storage, dtype, shape, strides, device; allocators, streams, copies.
 *
 * Owns: the WkTensor/WkStorage structs, the reference-counted storage and its allocators (aligned
 * CPU memory, pinned host memory, the CUDA caching allocator in cuda/memory.cu), streams and events,
 * copies and dtype casts between any two tensors, the scalar conversions bf16/f16 <-> f32 that the CPU
 * backend uses to store low-precision values, and the CUDA module (cuda_module.h: its loader and the
 * one list of its entry points; its device half in cuda/). It does not own any math: ops live in
 * runtime/ops, which builds on this layer and never the other way round.
 *
 * Internal header: runtime/ code includes it; Lua sees only the opaque handles of wick.h.
 */
#ifndef WK_TENSOR_H
#define WK_TENSOR_H

#include <string.h>

#include "../core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { WK_CPU_ALIGNMENT = 64 };  /* a cache line, and enough for any SIMD load */

typedef enum { MEMORY_HOST = 0, MEMORY_PINNED = 1, MEMORY_CUDA = 2, MEMORY_BORROWED = 3 } MemoryKind;

typedef struct {
  void *data;
  size_t bytes;     /* what the tensor asked for; views are checked against it */
  size_t reserved;  /* what the allocator handed out (the CUDA cache may round up) */
  MemoryKind kind;
  int device_index;
  int refcount;  /* atomic: views may be freed from other threads */
} WkStorage;

struct WkTensor {
  WkStorage *storage;
  WkDType dtype;
  int ndim;
  int64_t offset;  /* elements from the start of storage */
  int64_t shape[WK_MAX_DIMS];
  int64_t strides[WK_MAX_DIMS];
};

static inline WkDeviceType tensor_device(const WkTensor *t) {
  return t->storage->kind == MEMORY_CUDA ? WK_DEVICE_CUDA : WK_DEVICE_CPU;
}

static inline void *tensor_ptr(const WkTensor *t) {
  return (char *)t->storage->data + (size_t)t->offset * wk_dtype_size(t->dtype);
}

struct WkStream {
  WkDeviceType device;
  int device_index;
  void *handle;  /* cudaStream_t */
};

struct WkEvent {
  WkDeviceType device;
  void *handle;  /* cudaEvent_t */
};

enum { WK_MAX_DEVICES = 16 };  /* CUDA device indices the runtime keeps state for: streams, allocator, cuBLAS */

/* The calling thread's current stream for work on cuda:device_index (wk_stream_set_current sets it
 * for its stream's device); NULL: that device's default stream. */
WK_INTERNAL_EXPORT WkStream *wk_stream_current_on(int device_index);

/* Placement: every CUDA entry point (an op's dispatch, a tensor's allocation or copy) enters the
 * device of its tensors, which makes it the calling thread's current CUDA device; the module's own
 * calls on another device restore the thread's device when they return. */
WK_INTERNAL_EXPORT WkStatus wk_cuda_enter(int device_index);
/* The device last entered by this thread; before any, the process's default device. */
WK_INTERNAL_EXPORT int wk_cuda_current_device(void);

/* Functions that kernels of both devices use (nvcc compiles them for the GPU as well). */
#ifdef __CUDACC__
#define WK_HOST_DEVICE __host__ __device__
#else
#define WK_HOST_DEVICE
#endif

/* How a kernel walks an index tensor in place, whatever its strides (token ids and targets are views
 * of a loader batch: tokens[:, :-1] and tokens[:, 1:]). Logical element n, in row-major order, lies
 * at data[wk_index_offset(layout, n)] from the tensor's first element. A contiguous tensor of any
 * shape is one row; a strided one has one or two dims. */
typedef struct {
  int64_t cols;        /* elements per row (at least 1) */
  int64_t row_stride;  /* elements from a row to the next */
  int64_t col_stride;  /* elements from one element of a row to the next */
} WkIndexLayout;

WK_HOST_DEVICE static inline int64_t wk_index_offset(WkIndexLayout layout, int64_t n) {
  return n / layout.cols * layout.row_stride + n % layout.cols * layout.col_stride;
}

/* t's layout, or WK_ERR_INVALID_ARG for a strided tensor of more than two dims. */
WkStatus wk_tensor_index_layout(const WkTensor *t, WkIndexLayout *out);

/* Writes "[2, 3] f32 cpu" into buf for error messages. */
const char *wk_tensor_describe(const WkTensor *t, char *buf, size_t size);

/* CPU to CPU, any dtypes, any source strides, into a contiguous dst of as many elements that does not
 * overlap src (runtime/tensor/cast.c, which says what each dtype pair does to a value). */
void wk_tensor_copy_cpu(WkTensor *dst, const WkTensor *src);

/* ---- scalar conversions (round to nearest even, like the hardware) ---------------------------
 * Inline and without branches, so that loops over them vectorize (runtime/tensor/cast.c); compiled
 * for the GPU too, so its casts (runtime/tensor/cuda/copy.cu) give the very same bits. */

WK_HOST_DEVICE static inline uint32_t wk_f32_bits(float f) {
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  return bits;
}

WK_HOST_DEVICE static inline float wk_f32_from_bits(uint32_t bits) {
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

WK_HOST_DEVICE static inline float wk_bf16_to_f32(uint16_t h) { return wk_f32_from_bits((uint32_t)h << 16); }

WK_HOST_DEVICE static inline uint16_t wk_f32_to_bf16(float f) {
  uint32_t bits = wk_f32_bits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40);  /* quiet nan */
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}

/* IEEE half: 1 sign, 5 exponent (bias 15), 10 mantissa bits; f32 has 8 (bias 127) and 23. */
enum {
  WK_F16_MANTISSA_BITS = 10,
  WK_F32_MANTISSA_BITS = 23,
  WK_F16_DROPPED_BITS = WK_F32_MANTISSA_BITS - WK_F16_MANTISSA_BITS,  /* 13 */
  WK_F16_REBIAS = 127 - 15,
};
static const uint32_t WK_F32_INF_BITS = 0x7f800000u, WK_F32_QUIET_NAN_BITS = 0x7fc00000u;
static const uint32_t WK_F16_SMALLEST_NORMAL_AS_F32 = (uint32_t)(1 + WK_F16_REBIAS) << WK_F32_MANTISSA_BITS; /* 2^-14 */
static const uint32_t WK_F16_OVERFLOW_AS_F32 = 0x47800000u;  /* 2^16 (from 65520 on, rounding carries to inf too) */
static const uint16_t WK_F16_INF = 0x7c00u, WK_F16_QUIET_NAN = 0x7e00u, WK_F16_SIGN = 0x8000u;

/* cond ? a : b by masks. The f16 conversions choose this way: a ternary there becomes a branch around
 * their float addition, which gcc will not make unconditional again (-ftrapping-math), so no vectorizing. */
WK_HOST_DEVICE static inline uint32_t wk_bits_select(bool cond, uint32_t a, uint32_t b) {
  uint32_t mask = 0u - (uint32_t)cond;
  return (a & mask) | (b & ~mask);
}

/* Exact. NaN becomes the quiet NaN of its sign (the payload is dropped). */
WK_HOST_DEVICE static inline float wk_f16_to_f32(uint16_t h) {
  uint32_t magnitude = (uint32_t)(h & 0x7fffu) << WK_F16_DROPPED_BITS;  /* exponent and mantissa in f32's place */
  uint32_t exponent_mask = (uint32_t)WK_F16_INF << WK_F16_DROPPED_BITS, exponent = magnitude & exponent_mask;
  uint32_t normal = magnitude + ((uint32_t)WK_F16_REBIAS << WK_F32_MANTISSA_BITS);
  /* Zero and subnormals, m * 2^-24: read as 2^-14 * (1 + m/1024), minus 2^-14 (exact). */
  float tiny = wk_f32_from_bits(magnitude + WK_F16_SMALLEST_NORMAL_AS_F32) - wk_f32_from_bits(WK_F16_SMALLEST_NORMAL_AS_F32);
  uint32_t special = wk_bits_select((h & 0x3ffu) != 0, WK_F32_QUIET_NAN_BITS, WK_F32_INF_BITS);
  uint32_t bits = wk_bits_select(exponent == 0, wk_f32_bits(tiny), normal);
  bits = wk_bits_select(exponent == exponent_mask, special, bits);
  return wk_f32_from_bits(bits | (uint32_t)(h & WK_F16_SIGN) << 16);
}

/* Nearest even; overflow (from 65520 on) gives inf, NaN the quiet NaN of its sign. */
WK_HOST_DEVICE static inline uint16_t wk_f32_to_f16(float f) {
  uint32_t bits = wk_f32_bits(f), sign = (bits >> 16) & WK_F16_SIGN, a = bits & 0x7fffffffu;
  /* Below 2^-14: adding 0.5 (2^-1, 24 binades up) puts the multiples of 2^-24 in the low mantissa bits,
   * rounded to nearest even by the addition itself. */
  uint32_t tiny = wk_f32_bits(wk_f32_from_bits(a) + 0.5f) - wk_f32_bits(0.5f);
  /* Normal: rebias, and round the dropped bits to nearest even; a carry moves into the next binade
   * (and past 65504 into inf). */
  uint32_t odd = (a >> WK_F16_DROPPED_BITS) & 1u, below_half = (1u << (WK_F16_DROPPED_BITS - 1)) - 1u;
  uint32_t normal = (a - ((uint32_t)WK_F16_REBIAS << WK_F32_MANTISSA_BITS) + below_half + odd) >> WK_F16_DROPPED_BITS;
  uint32_t magnitude = wk_bits_select(a < WK_F16_SMALLEST_NORMAL_AS_F32, tiny, normal);
  magnitude = wk_bits_select(a >= WK_F16_OVERFLOW_AS_F32, WK_F16_INF, magnitude);
  magnitude = wk_bits_select(a > WK_F32_INF_BITS, WK_F16_QUIET_NAN, magnitude);
  return (uint16_t)(sign | magnitude);
}

/* ---- allocation (runtime/tensor/memory.c; device memory in runtime/tensor/cuda/memory.cu) ----- */

/* MEMORY_PINNED is page-locked host memory (cudaHostAlloc) when a CUDA device is present, else 64-byte
 * aligned memory: for buffers that other subsystems fill and the device copies from (the loader's ring). */
WkStatus wk_storage_new(MemoryKind kind, int device_index, size_t bytes, WkStorage **out);
void wk_storage_release(WkStorage *s);
/* A contiguous tensor over bytes [byte_offset, ...) of s, which holds several arrays laid out by its
 * owner (a loader's ring slot); takes a reference to s. NULL when it does not fit or is misaligned. */
WkTensor *wk_tensor_on_storage(WkStorage *s, size_t byte_offset, WkDType dtype, int ndim, const int64_t *shape);

#ifdef __cplusplus
}
#endif
#endif /* WK_TENSOR_H */
