/*
 * cuda_module.h — the entry points of the CUDA module (build/libwick_cuda.so), listed once.
 *
 * The CUDA allocator, streams, events and copies (runtime/tensor/cuda) and the kernels with cuBLAS
 * (runtime/ops/cuda) live in one module, not in libwick.so: loading cudart and cuBLAS costs every
 * process about 200 MB of resident memory and 70 ms, which a CPU run, a data-only rank or a test must
 * not pay. runtime/tensor/cuda_module.c opens it on first use, only where an NVIDIA device node
 * exists, and fills one table of function pointers from this list; callers go through the table:
 *
 *   WK_TRY(wk_cuda()->alloc(device_index, bytes, &ptr, &reserved));
 *
 * The list is expanded three ways: the table's fields (here), its filling by dlsym (cuda_module.c),
 * and, for nvcc, the prototypes the module's definitions must match (so a signature that drifts is a
 * compile error, not a crash). A new entry is one line here and its definition, `extern "C" ret
 * cuda_NAME(...)`, in a .cu file. Without the module (no device, WICK_CUDA=0, a build without nvcc)
 * every entry is a stand-in that fails with WK_ERR_UNSUPPORTED and the reason, reports 0 devices, or
 * does nothing (void entries).
 *
 * The tensor layer owns the table because it owns devices and memory; runtime/ops calls its kernel
 * entries through it (ops sits above tensor, so that is the allowed direction). Each entry:
 * X(return type, name, (parameters)); the return type is one token: WkStatus, int or void.
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
  X(WkStatus, stream_wait_event, (void *stream, void *event))                                                  \
  /* kernels, on the current stream: runtime/ops/cuda */                                                       \
  X(WkStatus, fill, (void *data, size_t n, size_t elem_size, const void *pattern))                             \
  X(WkStatus, scale, (float *x, size_t n, float alpha))                                                        \
  X(WkStatus, add, (float *out, const float *a, const float *b, size_t n))                                     \
  X(WkStatus, axpy, (float *y, float alpha, const float *x, size_t n))                                         \
  X(WkStatus, round, (float *x, size_t n, WkDType dtype))                                                      \
  X(WkStatus, sumsq, (const float *x, size_t n, double *out))                                                  \
  X(WkStatus, embedding_forward,                                                                               \
    (float *out, const int32_t *idx, WkIndexLayout idx_layout, const float *wte, const float *wpe, size_t B,     \
     size_t T, size_t C, size_t V))                                                                            \
  X(WkStatus, embedding_backward,                                                                              \
    (float *dwte, float *dwpe, const float *dout, const int32_t *idx, WkIndexLayout idx_layout, size_t B,       \
     size_t T, size_t C))                                                                                      \
  X(WkStatus, layernorm_forward,                                                                               \
    (float *out, float *mean, float *rstd, const float *inp, const float *weight, const float *bias, size_t N,  \
     size_t C, float eps))                                                                                     \
  X(WkStatus, layernorm_backward,                                                                              \
    (float *dinp, float *dweight, float *dbias, const float *dout, const float *inp, const float *weight,       \
     const float *mean, const float *rstd, size_t N, size_t C))                                                \
  X(WkStatus, matmul_forward,                                                                                  \
    (int device_index, float *out, const float *inp, const float *w, const float *bias, size_t N, size_t C,     \
     size_t OC, int transpose_w))                                                                              \
  X(WkStatus, matmul_backward,                                                                                 \
    (int device_index, float *dinp, float *dw, float *dbias, const float *dout, const float *inp,                \
     const float *w, size_t N, size_t C, size_t OC, int transpose_w))                                          \
  X(WkStatus, gelu_forward, (float *out, const float *inp, size_t n))                                          \
  X(WkStatus, gelu_backward, (float *dinp, const float *dout, const float *inp, size_t n))                     \
  X(WkStatus, attention_forward,                                                                               \
    (float *out, float *att, const float *qkv, size_t B, size_t T, size_t C, size_t NH))                       \
  X(WkStatus, attention_backward,                                                                              \
    (float *dqkv, const float *dout, const float *qkv, const float *att, size_t B, size_t T, size_t C,          \
     size_t NH))                                                                                               \
  X(WkStatus, cross_entropy_forward,                                                                           \
    (float *losses, const float *logits, const int32_t *targets, WkIndexLayout targets_layout,                 \
     const uint8_t *mask, size_t N, size_t V, float normalizer, double *loss_sum))                             \
  X(WkStatus, cross_entropy_backward,                                                                          \
    (float *dlogits, const float *logits, const int32_t *targets, WkIndexLayout targets_layout,                \
     const uint8_t *mask, size_t N, size_t V, float normalizer, float dloss))                                  \
  X(WkStatus, adamw,                                                                                           \
    (float *param, const float *grad, float *m, float *v, size_t n, float lr, float beta1, float beta2,         \
     float eps, float weight_decay, int64_t step, float grad_scale))

/* The table: one pointer per entry, named like it. */
typedef struct {
#define WK_CUDA_MODULE_FIELD(ret, name, params) ret(*name) params;
  WK_CUDA_MODULE_FUNCTIONS(WK_CUDA_MODULE_FIELD)
#undef WK_CUDA_MODULE_FIELD
} WkCudaModule;

/* The module's table, loaded on the first call (thread-safe); never NULL: entries the module cannot
 * serve are the stand-ins described above. */
const WkCudaModule *wk_cuda(void);

/* Serves module's table instead of the loaded one (NULL: the loaded one again), so a test can run
 * the placement and copy logic of the tensor layer and ops over a fake device without a GPU. */
WK_INTERNAL_EXPORT void wk_cuda_use(const WkCudaModule *module);

#ifdef __CUDACC__
/* The module's own definitions, exported as cuda_NAME for the loader's dlsym. */
#define WK_CUDA_MODULE_PROTOTYPE(ret, name, params) ret cuda_##name params;
WK_CUDA_MODULE_FUNCTIONS(WK_CUDA_MODULE_PROTOTYPE)
#undef WK_CUDA_MODULE_PROTOTYPE
#endif

#ifdef __cplusplus
}
#endif
#endif /* WK_CUDA_MODULE_H */
