/*
 * memory.c — storages and the host allocators.
 *
 * CPU memory is 64-byte aligned (posix_memalign). Pinned host memory comes from cudaHostAlloc when
 * the CUDA backend is compiled in and a device is present, else it is ordinary aligned memory, so
 * code that asks for pinned buffers runs unchanged on a CPU machine. Device memory is delegated to
 * the caching allocator of runtime/ops/cuda/memory.cu.
 */
#include <stdatomic.h>
#include <stdlib.h>

#include "tensor.h"

static _Atomic uint64_t host_bytes_in_use, host_allocs;

static WkStatus host_alloc(MemoryKind kind, size_t bytes, void **out) {
#ifdef WK_HAVE_CUDA
  if (kind == MEMORY_PINNED && wk_cuda_device_count() > 0) return wk_cuda_host_alloc(bytes, out);
#endif
  *out = wk_aligned_alloc(WK_CPU_ALIGNMENT, bytes, "tensor storage");
  return *out ? WK_OK : wk_last_status();
}

static void host_free(MemoryKind kind, void *data) {
#ifdef WK_HAVE_CUDA
  if (kind == MEMORY_PINNED && wk_cuda_device_count() > 0) {
    wk_cuda_host_free(data);
    return;
  }
#endif
  free(data);
}

WkStatus wk_host_alloc_pinned(size_t bytes, void **out) { return host_alloc(MEMORY_PINNED, bytes, out); }
void wk_host_free_pinned(void *data) { host_free(MEMORY_PINNED, data); }

WkStatus wk_storage_new(MemoryKind kind, int device_index, size_t bytes, WkStorage **out) {
  WkStorage *s = wk_calloc(1, sizeof *s, "tensor storage header");
  if (!s) return wk_last_status();
  s->bytes = bytes;
  s->kind = kind;
  s->device_index = kind == MEMORY_CUDA ? device_index : 0;
  s->reserved = bytes;
  s->refcount = 1;
  WkStatus status;
  if (kind == MEMORY_CUDA) {
#ifdef WK_HAVE_CUDA
    status = wk_cuda_alloc(device_index, bytes, &s->data, &s->reserved);
#else
    status = WK_FAIL(WK_ERR_UNSUPPORTED, "cuda:%d tensor: this libwick was built without CUDA (rebuild with nvcc on PATH)", device_index);
#endif
  } else if (kind == MEMORY_BORROWED) {
    status = WK_OK;  /* the caller sets data */
  } else {
    status = host_alloc(kind, bytes, &s->data);
    if (status == WK_OK) {
      atomic_fetch_add(&host_bytes_in_use, bytes);
      atomic_fetch_add(&host_allocs, 1);
    }
  }
  if (status != WK_OK) {
    free(s);
    return status;
  }
  *out = s;
  return WK_OK;
}

void wk_storage_release(WkStorage *s) {
  if (atomic_fetch_sub((_Atomic int *)&s->refcount, 1) != 1) return;
  if (s->kind == MEMORY_CUDA) {
#ifdef WK_HAVE_CUDA
    wk_cuda_release(s->device_index, s->data, s->reserved);
#endif
  } else if (s->kind != MEMORY_BORROWED) {
    host_free(s->kind, s->data);
    atomic_fetch_sub(&host_bytes_in_use, s->bytes);
  }
  free(s);
}

void wk_allocator_stats(WkDeviceType device, int device_index, WkAllocatorStats *out) {
  memset(out, 0, sizeof *out);
  if (device == WK_DEVICE_CPU) {
    out->bytes_in_use = atomic_load(&host_bytes_in_use);
    out->device_allocs = atomic_load(&host_allocs);
    return;
  }
#ifdef WK_HAVE_CUDA
  wk_cuda_allocator_stats(device_index, out);
#endif
}

#ifndef WK_HAVE_CUDA
WkStatus wk_cuda_empty_cache(int device_index) { return WK_OK; }  /* nothing is ever cached */
#endif
