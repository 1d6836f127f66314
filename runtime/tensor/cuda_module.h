/*
 * cuda_module.h — the CUDA module (build/libwick_cuda.so): its loader, and the entry points of its
 * tensor half (devices, memory, streams, events, copies: runtime/tensor/cuda), listed once.
 *
 * The CUDA allocator, streams, events and copies (runtime/tensor/cuda) and the kernels with cuBLAS
 * (runtime/ops/cuda) live in one module, not in libwick.so: loading cudart and cuBLAS costs every
 * process about 200 MB of resident memory and 70 ms, which a CPU run, a data-only rank or a test must
 * not pay. runtime/tensor/cuda_module.c opens it on first use, only where an NVIDIA device node
 * exists, and fills one table of function pointers from the list below; callers go through the table:
 *
 *   WK_TRY(wk_cuda()->alloc(device_index, bytes, &ptr, &reserved));
 *
 * Each half of the module has one such list: this one, and the kernels' in runtime/ops/cuda_ops.h
 * (ops sits above tensor, so the tensor layer cannot name the kernels). A list is expanded three ways,
 * with the macros below: its table's fields, the table's filling by dlsym (wk_cuda_resolve), and, for
 * nvcc, the prototypes the module's definitions must match (so a signature that drifts is a compile
 * error, not a crash). A new entry is one line in a list and its definition, `extern "C" ret
 * cuda_NAME(...)`, in a .cu file. Without the module (no device, WICK_CUDA=0, a build without nvcc)
 * every entry is a stand-in that fails with WK_ERR_UNSUPPORTED and the reason, reports 0 devices, or
 * does nothing (void entries). Each entry: X(return type, name, (parameters)); the return type is one
 * token: WkStatus, int or void.
 */
#ifndef WK_CUDA_MODULE_H
#define WK_CUDA_MODULE_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define WK_CUDA_MODULE_FUNCTIONS(X)                                                                            \
  /* devices, memory, streams, events, copies: runtime/tensor/cuda */                                         \
  X(int, device_count, (void))                                                                                 \
  X(WkStatus, set_device, (int device_index))                                                                  \
  X(WkStatus, alloc, (int device_index, size_t bytes, void **out, size_t *reserved))                           \
  X(WkStatus, record_stream, (int device_index, void *ptr, void *stream))                                      \
  X(void, release, (int device_index, void *ptr))                                                              \
  X(void, allocator_stats, (int device_index, WkAllocatorStats *out))                                          \
  X(void, reset_peak, (int device_index))                                                                      \
  X(WkStatus, empty_cache, (int device_index))                                                                 \
  X(WkStatus, host_alloc, (size_t bytes, void **out))                                                          \
  X(void, host_free, (void *ptr))                                                                              \
  X(WkStatus, copy, (void *dst, const void *src, size_t bytes, WkStream *stream))                              \
  X(WkStatus, copy_convert, (WkTensor *dst, const WkTensor *src, WkStream *stream))                            \
  X(WkStatus, stream_new, (int device_index, void **handle))                                                   \
  X(void, stream_free, (void *handle))                                                                         \
  X(WkStatus, stream_synchronize, (void *handle))                                                              \
  X(WkStatus, device_synchronize, (int device_index))                                                          \
  X(WkStatus, event_new, (int device_index, void **handle))                                                    \
  X(void, event_free, (void *handle))                                                                          \
  X(WkStatus, event_record, (void *event, void *stream))                                                       \
  X(WkStatus, event_synchronize, (void *event))                                                                \
  X(WkStatus, stream_wait_event, (void *stream, void *event))

/* ---- expanding a list ---------------------------------------------------------------------------- */

/* A table's field: one pointer per entry, named like it. */
#define WK_CUDA_FIELD(ret, name, params) ret(*name) params;

/* A stand-in for an entry the module cannot serve (define them with WK_CUDA_STAND_IN, list them in a
 * table's initialiser with WK_CUDA_STAND_IN_ENTRY): fails, reports no device, or does nothing. */
#define WK_CUDA_STAND_IN_RESULT_WkStatus return wk_cuda_unavailable();
#define WK_CUDA_STAND_IN_RESULT_int return 0;
#define WK_CUDA_STAND_IN_RESULT_void
#define WK_CUDA_STAND_IN(ret, name, params) \
  static ret stand_in_##name params { WK_CUDA_STAND_IN_RESULT_##ret }
#define WK_CUDA_STAND_IN_ENTRY(ret, name, params) .name = stand_in_##name,

/* Fills found->name from the module: `bool ok = true; LIST(WK_CUDA_RESOLVE)` leaves ok false when the
 * module is not loaded or lacks an entry (then the table keeps its stand-ins). */
#define WK_CUDA_RESOLVE(ret, name, params) ok = ok && wk_cuda_resolve(#name, (void **)&found.name);

/* The module's own definitions, exported as cuda_NAME for the loader's dlsym. */
#define WK_CUDA_PROTOTYPE(ret, name, params) ret cuda_##name params;

/* Why an entry cannot run (no module, no device, no nvcc at build time), as an error. */
WkStatus wk_cuda_unavailable(void);

/* The module's cuda_<name> into *out, loading it first if need be; false (and *out NULL) when it is
 * not loaded (no device, WICK_CUDA=0, no nvcc) or lacks the symbol (logged: a stale build). */
bool wk_cuda_resolve(const char *name, void **out);

/* ---- the tensor half's table ----------------------------------------------------------------------- */

typedef struct {
  WK_CUDA_MODULE_FUNCTIONS(WK_CUDA_FIELD)
} WkCudaModule;

/* The module's table, loaded on the first call (thread-safe); never NULL: entries the module cannot
 * serve are the stand-ins described above. */
const WkCudaModule *wk_cuda(void);

/* Serves module's table instead of the loaded one (NULL: the loaded one again), so a test can run
 * the placement and copy logic of the tensor layer and ops over a fake device without a GPU. */
WK_INTERNAL_EXPORT void wk_cuda_use(const WkCudaModule *module);

#ifdef __CUDACC__
WK_CUDA_MODULE_FUNCTIONS(WK_CUDA_PROTOTYPE)
#endif

#ifdef __cplusplus
}
#endif
#endif /* WK_CUDA_MODULE_H */
