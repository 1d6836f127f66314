/*
 * runtime/tensor — tensors: storage, dtype, shape, strides, device; allocators, streams, copies.
 *
 * Owns: the WkTensor/WkStorage structs, the reference-counted storage and its allocators (aligned
 * CPU memory, pinned host memory, the CUDA caching allocator in runtime/ops/cuda/memory.cu),
 * streams and events, copies and dtype casts between any two tensors, and the scalar conversions
 * bf16/f16 <-> f32 that the CPU backend uses to store low-precision values. It does not own any
 * math: ops live in runtime/ops.
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

WK_INTERNAL_EXPORT WkStream *wk_stream_current(void);  /* the calling thread's stream for ops; NULL = default */

/* Writes "[2, 3] f32 cpu" into buf for error messages. */
const char *wk_tensor_describe(const WkTensor *t, char *buf, size_t size);

/* ---- scalar conversions (round to nearest even, like the hardware) --------------------------- */

static inline float wk_bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static inline uint16_t wk_f32_to_bf16(float f) {
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40);  /* quiet nan */
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}

float wk_f16_to_f32(uint16_t h);
uint16_t wk_f32_to_f16(float f);

/* ---- allocation (runtime/tensor/memory.c; device memory in runtime/ops/cuda/memory.cu) -------- */

WkStatus wk_storage_new(MemoryKind kind, int device_index, size_t bytes, WkStorage **out);
void wk_storage_release(WkStorage *s);

/* Page-locked host memory (cudaHostAlloc) when a CUDA device is present, else 64-byte aligned
 * memory: for buffers that other subsystems fill and the device copies from (the loader's ring). */
WkStatus wk_host_alloc_pinned(size_t bytes, void **out);
void wk_host_free_pinned(void *data);

#ifdef WK_HAVE_CUDA
/* Device memory from the caching allocator; *reserved receives the block's real size, which
 * must be passed back to wk_cuda_release. */
WkStatus wk_cuda_alloc(int device_index, size_t bytes, void **out, size_t *reserved);
void wk_cuda_release(int device_index, void *ptr, size_t reserved);
WkStatus wk_cuda_host_alloc(size_t bytes, void **out);
void wk_cuda_host_free(void *ptr);
void wk_cuda_allocator_stats(int device_index, WkAllocatorStats *out);
/* Copies between any two memories by cudaMemcpyAsync on stream (NULL = current stream). */
WkStatus wk_cuda_memcpy(void *dst, const void *src, size_t bytes, WkStream *stream);
/* Strided or casting copy whose source and destination are both on the device. */
WkStatus wk_cuda_copy_convert(WkTensor *dst, const WkTensor *src);
WkStatus wk_cuda_stream_new(int device_index, void **handle);
void wk_cuda_stream_free(void *handle);
WkStatus wk_cuda_stream_synchronize(void *handle);
WkStatus wk_cuda_device_synchronize(int device_index);
WkStatus wk_cuda_event_new(int device_index, void **handle);
void wk_cuda_event_free(void *handle);
WkStatus wk_cuda_event_record(void *event, void *stream);
WkStatus wk_cuda_event_synchronize(void *event);
WkStatus wk_cuda_stream_wait_event(void *stream, void *event);
#endif

#ifdef __cplusplus
}
#endif
#endif /* WK_TENSOR_H */
