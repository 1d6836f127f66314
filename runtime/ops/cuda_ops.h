/*
 * cuda_ops.h — the kernels' half of the CUDA module (runtime/ops/cuda), listed once, and its table.
 *
 * The list is expanded like the tensor half's (runtime/tensor/cuda_module.h, which says how): the
 * fields of WkCudaOps, its filling by dlsym from the module the tensor layer loaded (cuda_ops.c), and
 * nvcc's prototypes for the definitions in runtime/ops/cuda. ops.c calls an entry after checking the
 * arguments and entering the tensors' device; every entry runs on the thread's current stream.
 */
#ifndef WK_CUDA_OPS_H
#define WK_CUDA_OPS_H

#include "../tensor/cuda_module.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __CUDACC__
#define WK_HOST_DEVICE __host__ __device__
#else
#define WK_HOST_DEVICE
#endif

/* Whether an embedding id or a target indexes a vocabulary of V; the others are marked, not read. */
static inline WK_HOST_DEVICE bool wk_in_vocab(int32_t id, size_t V) { return id >= 0 && (size_t)id < V; }

/* WkStepStatus's mark of a bad index at element n holding id: larger for an earlier element, so the
 * largest mark (an atomicMax on a GPU) names the first bad one; 0 is no mark. */
static inline WK_HOST_DEVICE uint64_t wk_bad_mark(uint64_t n, int32_t id) { return ~(n << 32 | (uint32_t)id); }
static inline uint64_t wk_bad_mark_element(uint64_t mark) { return ~mark >> 32; }
static inline int32_t wk_bad_mark_id(uint64_t mark) { return (int32_t)(uint32_t)~mark; }

/* The dtypes are the CPU's (runtime/ops/ops.c): activations, their gradients and the weights' compute
 * copy in the op's `dtype` (f32, bf16 or f16, void pointers); parameter gradients, layernorm's mean
 * and rstd, rmsnorm's rstd, RoPE's inverse frequencies, losses and the optimizer's tensors f32 (float
 * pointers). The norms' forwards serve the plain op (b and sum NULL) and the fused residual one
 * (sum = a + b rounded, then its norm), as the CPU's: one kernel each. */
#define WK_CUDA_OPS_FUNCTIONS(X)                                                                               \
  X(WkStatus, fill, (void *data, size_t n, size_t elem_size, const void *pattern))                             \
  X(WkStatus, scale, (float *x, size_t n, float alpha))                                                        \
  X(WkStatus, add, (WkDType dtype, void *out, const void *a, const void *b, size_t n))                         \
  X(WkStatus, axpy, (WkDType dtype, void *y, float alpha, const void *x, size_t n))                            \
  X(WkStatus, round, (float *x, size_t n, WkDType dtype))                                                      \
  X(WkStatus, sumsq, (const float *x, size_t n, double *out))                                                  \
  X(WkStatus, embedding_forward,                                                                               \
    (WkDType dtype, void *out, const int32_t *idx, WkIndexLayout idx_layout, const void *wte, const void *wpe, \
     size_t B, size_t T, size_t C, size_t V, WkStepStatus *status))                                            \
  X(WkStatus, embedding_backward,                                                                              \
    (WkDType dtype, float *dwte, float *dwpe, const void *dout, const int32_t *idx, WkIndexLayout idx_layout,  \
     size_t B, size_t T, size_t C, size_t V))                                                                  \
  X(WkStatus, add_layernorm_forward,                                                                           \
    (WkDType dtype, void *sum, void *out, float *mean, float *rstd, const void *a, const void *b,              \
     const void *weight, const void *bias, size_t N, size_t C, float eps))                                     \
  X(WkStatus, layernorm_backward,                                                                              \
    (WkDType dtype, void *dinp, float *dweight, float *dbias, const void *dout, const void *inp,               \
     const void *weight, const float *mean, const float *rstd, size_t N, size_t C))                            \
  X(WkStatus, matmul_forward,                                                                                  \
    (WkDType dtype, void *out, const void *inp, const void *w, const void *bias, size_t N, size_t C, size_t OC, \
     int transpose_w))                                                                                         \
  X(WkStatus, matmul_backward,                                                                                 \
    (WkDType dtype, void *dinp, float *dw, float *dbias, const void *dout, const void *inp, const void *w,     \
     size_t N, size_t C, size_t OC, int transpose_w))                                                          \
  X(WkStatus, matmul_gelu_forward,                                                                             \
    (WkDType dtype, void *out, void *pre, const void *inp, const void *w, const void *bias, size_t N, size_t C, \
     size_t OC, int transpose_w))                                                                              \
  X(WkStatus, matmul_backward_gelu,                                                                            \
    (WkDType dtype, void *dpre, float *dw, float *dbias, const void *dout, const void *inp, const void *w,     \
     const void *pre, size_t N, size_t C, size_t OC, int transpose_w))                                        \
  X(WkStatus, gelu_forward, (WkDType dtype, void *out, const void *inp, size_t n))                             \
  X(WkStatus, gelu_backward, (WkDType dtype, void *dinp, const void *dout, const void *inp, size_t n))         \
  X(WkStatus, attention_forward,                                                                               \
    (WkDType dtype, void *out, void *att, const void *qkv, size_t B, size_t T, size_t C, size_t NH))           \
  X(WkStatus, attention_backward,                                                                              \
    (WkDType dtype, void *dqkv, const void *dout, const void *qkv, const void *att, size_t B, size_t T,        \
     size_t C, size_t NH))                                                                                     \
  X(WkStatus, cross_entropy_forward,                                                                           \
    (WkDType dtype, float *losses, const void *logits, const int32_t *targets, WkIndexLayout targets_layout,   \
     const uint8_t *mask, size_t N, size_t V, float normalizer, WkStepStatus *status))                         \
  X(WkStatus, cross_entropy_backward,                                                                          \
    (WkDType dtype, void *dlogits, const void *logits, const int32_t *targets, WkIndexLayout targets_layout,   \
     const uint8_t *mask, size_t N, size_t V, float normalizer, float dloss))                                  \
  X(WkStatus, add_rmsnorm_forward,                                                                             \
    (WkDType dtype, void *sum, void *out, float *rstd, const void *a, const void *b, const void *weight,       \
     size_t N, size_t C, float eps))                                                                           \
  X(WkStatus, rmsnorm_backward,                                                                                \
    (WkDType dtype, void *dinp, float *dweight, const void *dout, const void *inp, const void *weight,         \
     const float *rstd, size_t N, size_t C))                                                                   \
  X(WkStatus, rope_forward,                                                                                    \
    (WkDType dtype, void *out, const void *inp, const float *inv_freq, size_t B, size_t T, size_t H, size_t hs,  \
     int64_t start))                                                                                           \
  X(WkStatus, rope_backward,                                                                                   \
    (WkDType dtype, void *dinp, const void *dout, const float *inv_freq, size_t B, size_t T, size_t H,         \
     size_t hs, int64_t start))                                                                                \
  X(WkStatus, swiglu_forward, (WkDType dtype, void *out, const void *gate, const void *up, size_t n))          \
  X(WkStatus, swiglu_backward,                                                                                 \
    (WkDType dtype, void *dgate, void *dup, const void *dout, const void *gate, const void *up, size_t n))     \
  X(WkStatus, qkv_pack,                                                                                        \
    (WkDType dtype, void *qkv, const void *q, const void *k, const void *v, size_t N, size_t NH, size_t KVH,   \
     size_t hs))                                                                                               \
  X(WkStatus, qkv_pack_backward,                                                                               \
    (WkDType dtype, void *dq, void *dk, void *dv, const void *dqkv, size_t N, size_t NH, size_t KVH,           \
     size_t hs))                                                                                               \
  X(WkStatus, attention_cached,                                                                                \
    (WkDType dtype, void *out, const void *q, const void *k, const void *v, void *k_cache, void *v_cache,      \
     size_t B, size_t Tq, size_t Tmax, size_t NH, size_t KVH, size_t hs, int64_t start))                       \
  X(WkStatus, adamw,                                                                                           \
    (float *param, const float *grad, float *m, float *v, size_t n, float lr, float beta1, float beta2,        \
     float eps, float weight_decay, int64_t step, float grad_scale))

typedef struct {
  WK_CUDA_OPS_FUNCTIONS(WK_CUDA_FIELD)
} WkCudaOps;

/* The kernels' table, filled on the first call (thread-safe); never NULL: without the module every
 * entry is a stand-in that fails with WK_ERR_UNSUPPORTED and the reason. */
const WkCudaOps *wk_cuda_ops(void);

/* Serves ops instead of the loaded table (NULL: the loaded one again), so a test can run ops.c's
 * dispatch over a fake device without a GPU (with wk_cuda_use for the tensor half). */
WK_INTERNAL_EXPORT void wk_cuda_ops_use(const WkCudaOps *ops);

#ifdef __CUDACC__
WK_CUDA_OPS_FUNCTIONS(WK_CUDA_PROTOTYPE)
#endif

#ifdef __cplusplus
}
#endif
#endif /* WK_CUDA_OPS_H */
