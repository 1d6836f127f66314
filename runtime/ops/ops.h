/*
 * runtime/ops — the math of training: forward and backward kernels for GPT-2 and Llama-family models.
 *
 * Owns: ops.c, the public wk_op_* entry points, which check dtypes, shapes, devices and contiguity
 * once and then dispatch on the tensors' device; cpu/, the reference kernels in C (OpenBLAS GEMM on
 * one thread a call, with the rows of every kernel and of the GEMMs split over one small worker
 * pool, cpu/parallel.h, so every core works); cuda/, the same kernels in CUDA (cuBLAS GEMM),
 * compiled only when nvcc exists, into the CUDA module; cuda_ops.h lists their signatures and
 * cuda_ops.c fills their table. Kernels take raw pointers and sizes and trust their arguments:
 * validation happens in ops.c only, so the two backends cannot drift apart in what they accept.
 * Gradient outputs are accumulated (+=) by every backward kernel but two: cross-entropy's, which
 * writes the gradient of the logits (over them, when given the same tensor), and matmul_backward_gelu's
 * dpre, which the GEMM's epilogue writes (its parameter gradients accumulate as matmul_backward's).
 *
 * Not here: tensors, storage and copies (runtime/tensor); module composition (lua/wick/nn/).
 */
#ifndef WK_OPS_H
#define WK_OPS_H

#include "cuda_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Work below about this many multiply-adds is not worth waking another thread for. */
#define PARALLEL_GRAIN 16384

/* GELU's tanh approximation, one formula for both backends, which differ only in how they take
 * th = tanh(wk_gelu_tanh_arg(x)) (the CPU through its vectorized exp, CUDA through tanhf). */
#define GELU_SCALE 0.7978845608028654f  /* sqrt(2 / pi) */
#define GELU_CUBE 0.044715f
static inline WK_HOST_DEVICE float wk_gelu_tanh_arg(float x) { return GELU_SCALE * (x + GELU_CUBE * x * x * x); }
static inline WK_HOST_DEVICE float wk_gelu(float x, float th) { return 0.5f * x * (1.0f + th); }
static inline WK_HOST_DEVICE float wk_gelu_derivative(float x, float th) {
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * x * x);
}

/* ---- CPU kernels (runtime/ops/cpu) ------------------------------------------------------------
 * Activations, their gradients and the compute copy of the weights come as void pointers with the one
 * dtype `act` they share (f32, bf16 or f16: cpu/stored.h reads and writes them, the math is f32);
 * float pointers are f32 always: parameter gradients, layernorm statistics, losses, optimizer state. */

void cpu_fill(void *data, size_t n, size_t elem_size, const void *pattern);
void cpu_scale(float *x, size_t n, float alpha);
void cpu_add(void *out, const void *a, const void *b, WkDType act, size_t n);
void cpu_axpy(void *y, float alpha, const void *x, WkDType act, size_t n);
void cpu_round(float *x, size_t n, WkDType dtype);
double cpu_sumsq(const float *x, size_t n);
void cpu_normal(float *x, size_t n, uint64_t seed, float mean, float std);
/* Index tensors (idx, targets) are read through their WkIndexLayout (runtime/tensor/tensor.h), so
 * views such as a loader batch's tokens[:, :-1] need no gather. Both forwards mark the first index
 * outside the vocabulary in the step's status (WkStepStatus, host memory here) and go on: a bad id
 * embeds as zeros (its backward skips it), a bad target scores 0; cross-entropy adds its loss sum. */
void cpu_mark_bad_ids(uint64_t *mark, int64_t *limit, const int32_t *idx, WkIndexLayout at, const uint8_t *mask,
                      size_t n, size_t V);
void cpu_embedding_forward(void *out, const int32_t *idx, WkIndexLayout idx_layout, const void *wte, const void *wpe,
                           WkDType act, size_t B, size_t T, size_t C, size_t V, WkStepStatus *status);
void cpu_embedding_backward(float *dwte, float *dwpe, const void *dout, WkDType act, const int32_t *idx,
                            WkIndexLayout idx_layout, size_t B, size_t T, size_t C, size_t V);
/* The norms' forwards serve the plain op (b and sum NULL: the norm of a) and the fused residual one
 * (the norm of a + b, written to sum rounded as cpu_add rounds it). */
void cpu_add_layernorm_forward(void *sum, void *out, float *mean, float *rstd, const void *a, const void *b,
                               const void *weight, const void *bias, WkDType act, size_t N, size_t C, float eps);
void cpu_layernorm_backward(void *dinp, float *dweight, float *dbias, const void *dout, const void *inp,
                            const void *weight, const float *mean, const float *rstd, WkDType act, size_t N,
                            size_t C);
/* The products of matmul and attention may allocate tiles (cpu/gemm.h): they can fail. */
WkStatus cpu_matmul_forward(void *out, const void *inp, const void *w, const void *bias, WkDType act, size_t N,
                            size_t C, size_t OC, int transpose_w);
WkStatus cpu_matmul_backward(void *dinp, float *dw, float *dbias, const void *dout, const void *inp, const void *w,
                             WkDType act, size_t N, size_t C, size_t OC, int transpose_w);
/* The MLP's products with GELU in their epilogue: forward, pre = the product (+ bias) and out = gelu of
 * it unrounded, each rounded once; backward, matmul_backward's dw and dbias, and dpre = gelu'(pre) times
 * the product dout @ w^T, written (not accumulated) and rounded once. */
WkStatus cpu_matmul_gelu_forward(void *out, void *pre, const void *inp, const void *w, const void *bias, WkDType act,
                                 size_t N, size_t C, size_t OC, int transpose_w);
WkStatus cpu_matmul_backward_gelu(void *dpre, float *dw, float *dbias, const void *dout, const void *inp,
                                  const void *w, const void *pre, WkDType act, size_t N, size_t C, size_t OC,
                                  int transpose_w);
void cpu_gelu_forward(void *out, const void *inp, WkDType act, size_t n);
void cpu_gelu_backward(void *dinp, const void *dout, const void *inp, WkDType act, size_t n);
WkStatus cpu_attention_forward(void *out, void *att, const void *qkv, WkDType act, size_t B, size_t T, size_t C,
                               size_t NH);
WkStatus cpu_attention_backward(void *dqkv, const void *dout, const void *qkv, const void *att, WkDType act, size_t B,
                                size_t T, size_t C, size_t NH);  /* a thread's [T,T] scratch, two when act is 2-byte */
void cpu_cross_entropy_forward(float *losses, const void *logits, WkDType act, const int32_t *targets,
                               WkIndexLayout targets_layout, const uint8_t *mask, size_t N, size_t V, float normalizer,
                               WkStepStatus *status);
void cpu_cross_entropy_backward(void *dlogits, const void *logits, WkDType act, const int32_t *targets,
                                WkIndexLayout targets_layout, const uint8_t *mask, size_t N, size_t V,
                                float normalizer, float dloss);
void cpu_adamw(float *param, const float *grad, float *m, float *v, size_t n, float lr, float beta1,
               float beta2, float eps, float weight_decay, int64_t step, float grad_scale);
/* Llama-family kernels (rmsnorm.c, rope.c, swiglu.c, qkv_pack.c, attention_cached.c): activations in
 * act as above; rstd, the weight gradient and the RoPE inverse frequencies are f32. */
void cpu_add_rmsnorm_forward(void *sum, void *out, float *rstd, const void *a, const void *b, const void *weight,
                             WkDType act, size_t N, size_t C, float eps);
void cpu_rmsnorm_backward(void *dinp, float *dweight, const void *dout, const void *inp, const void *weight,
                          const float *rstd, WkDType act, size_t N, size_t C);
typedef struct {
  WkRopeKind kind;
  double theta, factor, low_freq_factor, high_freq_factor, original_max_position_embeddings;
} WkRopeScaling;
void cpu_rope_frequencies(float *inv_freq, size_t half, const WkRopeScaling *scaling);
void cpu_rope_forward(void *out, const void *inp, const float *inv_freq, WkDType act, size_t B, size_t T, size_t H,
                      size_t hs, int64_t start);
void cpu_rope_backward(void *dinp, const void *dout, const float *inv_freq, WkDType act, size_t B, size_t T,
                       size_t H, size_t hs, int64_t start);
void cpu_swiglu_forward(void *out, const void *gate, const void *up, WkDType act, size_t n);
void cpu_swiglu_backward(void *dgate, void *dup, const void *dout, const void *gate, const void *up, WkDType act,
                         size_t n);
void cpu_qkv_pack(void *qkv, const void *q, const void *k, const void *v, WkDType act, size_t N, size_t NH,
                  size_t KVH, size_t hs);
void cpu_qkv_pack_backward(void *dq, void *dk, void *dv, const void *dqkv, WkDType act, size_t N, size_t NH,
                           size_t KVH, size_t hs);
WkStatus cpu_attention_cached(void *out, const void *q, const void *k, const void *v, void *k_cache, void *v_cache,
                              WkDType act, size_t B, size_t Tq, size_t Tmax, size_t NH, size_t KVH, size_t hs,
                              int64_t start);  /* allocates scores */

/* ---- CUDA kernels (runtime/ops/cuda), on the current stream ------------------------------------
 * Entries of the kernels' table, declared once in runtime/ops/cuda_ops.h. */

#ifdef __cplusplus
}
#endif
#endif /* WK_OPS_H */
