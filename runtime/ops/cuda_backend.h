/*
 * cuda_backend.h — the functions of the CUDA backend module, listed once.
 *
 * The CUDA kernels, cuBLAS and the CUDA allocator live in build/libwick_cuda.so, not in libwick.so:
 * loading cuBLAS/cuBLASLt costs every process about 200 MB of resident memory and 70 ms, which a
 * CPU run, a data-only rank or a test must not pay. libwick.so has one small stub per function
 * below (cuda_backend.c) that loads the module on first use, and only when an NVIDIA device node
 * exists. The module's own definitions carry the same names (declared in ops.h and tensor.h).
 *
 * Each entry: X(return type, name, (parameters), (arguments)); VOID for functions returning void.
 */
#ifndef WK_CUDA_BACKEND_H
#define WK_CUDA_BACKEND_H

#define WK_CUDA_BACKEND_STATUS_FUNCTIONS(X)                                                                   \
  X(cuda_fill, (void *data, size_t n, size_t elem_size, const void *pattern), (data, n, elem_size, pattern))  \
  X(cuda_scale, (float *x, size_t n, float alpha), (x, n, alpha))                                             \
  X(cuda_add, (float *out, const float *a, const float *b, size_t n), (out, a, b, n))                         \
  X(cuda_axpy, (float *y, float alpha, const float *x, size_t n), (y, alpha, x, n))                           \
  X(cuda_round, (float *x, size_t n, WkDType dtype), (x, n, dtype))                                           \
  X(cuda_sumsq, (const float *x, size_t n, double *out), (x, n, out))                                         \
  X(cuda_embedding_forward,                                                                                   \
    (float *out, const int32_t *idx, const float *wte, const float *wpe, size_t B, size_t T, size_t C, size_t V), \
    (out, idx, wte, wpe, B, T, C, V))                                                                         \
  X(cuda_embedding_backward,                                                                                  \
    (float *dwte, float *dwpe, const float *dout, const int32_t *idx, size_t B, size_t T, size_t C),           \
    (dwte, dwpe, dout, idx, B, T, C))                                                                         \
  X(cuda_layernorm_forward,                                                                                   \
    (float *out, float *mean, float *rstd, const float *inp, const float *weight, const float *bias, size_t N,  \
     size_t C, float eps),                                                                                    \
    (out, mean, rstd, inp, weight, bias, N, C, eps))                                                          \
  X(cuda_layernorm_backward,                                                                                  \
    (float *dinp, float *dweight, float *dbias, const float *dout, const float *inp, const float *weight,      \
     const float *mean, const float *rstd, size_t N, size_t C),                                               \
    (dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C))                                              \
  X(cuda_matmul_forward,                                                                                      \
    (int device_index, float *out, const float *inp, const float *w, const float *bias, size_t N, size_t C,    \
     size_t OC, int transpose_w),                                                                             \
    (device_index, out, inp, w, bias, N, C, OC, transpose_w))                                                 \
  X(cuda_matmul_backward,                                                                                     \
    (int device_index, float *dinp, float *dw, float *dbias, const float *dout, const float *inp,               \
     const float *w, size_t N, size_t C, size_t OC, int transpose_w),                                         \
    (device_index, dinp, dw, dbias, dout, inp, w, N, C, OC, transpose_w))                                     \
  X(cuda_gelu_forward, (float *out, const float *inp, size_t n), (out, inp, n))                               \
  X(cuda_gelu_backward, (float *dinp, const float *dout, const float *inp, size_t n), (dinp, dout, inp, n))   \
  X(cuda_attention_forward, (float *out, float *att, const float *qkv, size_t B, size_t T, size_t C, size_t NH), \
    (out, att, qkv, B, T, C, NH))                                                                             \
  X(cuda_attention_backward,                                                                                  \
    (float *dqkv, const float *dout, const float *qkv, const float *att, size_t B, size_t T, size_t C,         \
     size_t NH),                                                                                              \
    (dqkv, dout, qkv, att, B, T, C, NH))                                                                      \
  X(cuda_cross_entropy_forward,                                                                               \
    (float *losses, const float *logits, const int32_t *targets, const uint8_t *mask, size_t N, size_t V,      \
     float normalizer, double *loss_sum),                                                                     \
    (losses, logits, targets, mask, N, V, normalizer, loss_sum))                                              \
  X(cuda_cross_entropy_backward,                                                                              \
    (float *dlogits, const float *logits, const int32_t *targets, const uint8_t *mask, size_t N, size_t V,     \
     float normalizer, float dloss),                                                                          \
    (dlogits, logits, targets, mask, N, V, normalizer, dloss))                                                \
  X(cuda_adamw,                                                                                               \
    (float *param, const float *grad, float *m, float *v, size_t n, float lr, float beta1, float beta2,        \
     float eps, float weight_decay, int64_t step, float grad_scale),                                          \
    (param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, step, grad_scale))                            \
  X(wk_cuda_alloc, (int device_index, size_t bytes, void **out, size_t *reserved),                            \
    (device_index, bytes, out, reserved))                                                                     \
  X(wk_cuda_host_alloc, (size_t bytes, void **out), (bytes, out))                                             \
  X(wk_cuda_memcpy, (void *dst, const void *src, size_t bytes, WkStream *stream), (dst, src, bytes, stream))  \
  X(wk_cuda_copy_convert, (WkTensor *dst, const WkTensor *src), (dst, src))                                   \
  X(wk_cuda_stream_new, (int device_index, void **handle), (device_index, handle))                            \
  X(wk_cuda_stream_synchronize, (void *handle), (handle))                                                     \
  X(wk_cuda_device_synchronize, (int device_index), (device_index))                                           \
  X(wk_cuda_event_new, (int device_index, void **handle), (device_index, handle))                             \
  X(wk_cuda_event_record, (void *event, void *stream), (event, stream))                                       \
  X(wk_cuda_event_synchronize, (void *event), (event))                                                        \
  X(wk_cuda_stream_wait_event, (void *stream, void *event), (stream, event))                                  \
  X(wk_cuda_empty_cache, (int device_index), (device_index))

#define WK_CUDA_BACKEND_VOID_FUNCTIONS(X)                                                                     \
  X(wk_cuda_release, (int device_index, void *ptr, size_t reserved), (device_index, ptr, reserved))           \
  X(wk_cuda_host_free, (void *ptr), (ptr))                                                                    \
  X(wk_cuda_allocator_stats, (int device_index, WkAllocatorStats *out), (device_index, out))                  \
  X(wk_cuda_stream_free, (void *handle), (handle))                                                            \
  X(wk_cuda_event_free, (void *handle), (handle))

#endif /* WK_CUDA_BACKEND_H */
