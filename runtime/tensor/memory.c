/*
 * memory.c — storages and the host allocators.
 *
 * CPU memory is 64-byte aligned (posix_memalign). Pinned host memory comes from cudaHostAlloc when a
 * CUDA device is present, else it is ordinary aligned memory, so code that asks for pinned buffers
 * runs unchanged on a CPU machine. Device memory is the caching allocator of the CUDA module
 * (runtime/tensor/cuda/memory.cu), through its table. Both keep a peak, so that a test can compare
 * what a training step holds at its highest with the dry run's estimate, and the log each rank's.
 */
#include <stdatomic.h>
#include <stdlib.h>

#include "cuda_module.h"

static _Atomic uint64_t host_bytes_in_use, host_bytes_peak, host_allocs;

static void raise_peak(uint64_t in_use) {
  uint64_t peak = atomic_load(&host_bytes_peak);
  while (in_use > peak && !atomic_compare_exchange_weak(&host_bytes_peak, &peak, in_use)) {}
}

static bool pinned_by_cuda(MemoryKind kind) { return kind == MEMORY_PINNED && wk_cuda_device_count() > 0; }

/* Pinned memory belongs to the context of the thread's device: the process's, unless it entered another. */
static WkStatus host_alloc(MemoryKind kind, size_t bytes, void **out) {
  if (pinned_by_cuda(kind)) {
    WK_TRY(wk_cuda_enter(wk_cuda_current_device()));
    return wk_cuda()->host_alloc(bytes, out);
  }
  *out = wk_aligned_alloc(WK_CPU_ALIGNMENT, bytes, "tensor storage");
  return *out ? WK_OK : wk_last_status();
}

static void host_free(MemoryKind kind, void *data) {
  if (pinned_by_cuda(kind)) wk_cuda()->host_free(data);
  else free(data);
}

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
    status = wk_cuda_enter(device_index);  /* the block serves the current stream of its device */
    if (status == WK_OK) status = wk_cuda()->alloc(device_index, bytes, &s->data, &s->reserved);
    if (status != WK_OK) wk_error_context("cuda:%d tensor", device_index);
  } else if (kind == MEMORY_BORROWED) {
    status = WK_OK;  /* the caller sets data */
  } else {
    status = host_alloc(kind, bytes, &s->data);
    if (status == WK_OK) {
      raise_peak(atomic_fetch_add(&host_bytes_in_use, bytes) + bytes);
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
    wk_cuda()->release(s->device_index, s->data);
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
    out->bytes_peak = atomic_load(&host_bytes_peak);
    return;
  }
  wk_cuda()->allocator_stats(device_index, out);
}

void wk_allocator_reset_peak(WkDeviceType device, int device_index) {
  if (device == WK_DEVICE_CPU) atomic_store(&host_bytes_peak, atomic_load(&host_bytes_in_use));
  else wk_cuda()->reset_peak(device_index);
}

/* Without a device nothing is ever cached. */
WkStatus wk_cuda_empty_cache(int device_index) {
  return wk_cuda_device_count() > 0 ? wk_cuda()->empty_cache(device_index) : WK_OK;
}
