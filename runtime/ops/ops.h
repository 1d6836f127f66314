/*
 * runtime/ops — the math of training: forward and backward kernels for GPT-2-style models.
 *
 * Owns: ops.c, the public wk_op_* entry points, which check dtypes, shapes, devices and contiguity
 * once and then dispatch on the tensors' device; cpu/, the reference kernels in C (OpenBLAS GEMM,
 * rows split over a small worker pool, cpu/parallel.h, so every core works); cuda/, the same kernels in
 * CUDA (cuBLAS GEMM), compiled only when nvcc exists, into the CUDA module; cuda_ops.h lists their
 * signatures and cuda_ops.c fills their table. Kernels take raw pointers and sizes and
 * trust their arguments: validation happens in ops.c only, so the two backends cannot drift apart in what they accept.
 * Gradient outputs are accumulated (+=) by every backward kernel.
 *
 * Not here: tensors, storage and copies (runtime/tensor); module composition (lua/wick/nn/).
 */
#ifndef WK_OPS_H
#define WK_OPS_H

#include "cuda_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GELU_SCALE 0.7978845608028654f  /* sqrt(2 / pi) */
/* Work below about this many multiply-adds is not worth waking another thread for. */
#define PARALLEL_GRAIN 16384
#define GELU_CUBE 0.044715f

/* ---- CPU kernels (runtime/ops/cpu) ------------------------------------------------------------ */

void cpu_fill(void *data, size_t n, size_t elem_size, const void *pattern);
void cpu_scale(float *x, size_t n, float alpha);
void cpu_add(float *out, const float *a, const float *b, size_t n);
void cpu_axpy(float *y, float alpha, const float *x, size_t n);
void cpu_round(float *x, size_t n, WkDType dtype);
double cpu_sumsq(const float *x, size_t n);
void cpu_normal(float *x, size_t n, uint64_t seed, float mean, float std);
/* Index tensors (idx, targets) are read through their WkIndexLayout (runtime/tensor/tensor.h), so
 * views such as a loader batch's tokens[:, :-1] need no gather. Both forwards return the first
 * out-of-range index found (its logical position n) or -1. */
int64_t cpu_embedding_forward(float *out, const int32_t *idx, WkIndexLayout idx_layout, const float *wte,
                              const float *wpe, size_t B, size_t T, size_t C, size_t V);
void cpu_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *idx,
                            WkIndexLayout idx_layout, size_t B, size_t T, size_t C);
void cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                           const float *bias, size_t N, size_t C, float eps);
void cpu_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, const float *mean,
                            const float *rstd, size_t N, size_t C);
void cpu_matmul_forward(float *out, const float *inp, const float *w, const float *bias, size_t N,
                        size_t C, size_t OC, int transpose_w);
void cpu_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                         const float *w, size_t N, size_t C, size_t OC, int transpose_w);
void cpu_gelu_forward(float *out, const float *inp, size_t n);
void cpu_gelu_backward(float *dinp, const float *dout, const float *inp, size_t n);
void cpu_attention_forward(float *out, float *att, const float *qkv, size_t B, size_t T, size_t C,
                           size_t NH);
WkStatus cpu_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                                size_t B, size_t T, size_t C, size_t NH);  /* allocates a [T,T] scratch */
int64_t cpu_cross_entropy_forward(float *losses, const float *logits, const int32_t *targets,
                                  WkIndexLayout targets_layout, const uint8_t *mask, size_t N, size_t V,
                                  float normalizer, double *loss_sum);
void cpu_cross_entropy_backward(float *dlogits, const float *logits, const int32_t *targets,
                                WkIndexLayout targets_layout, const uint8_t *mask, size_t N, size_t V,
                                float normalizer, float dloss);
void cpu_adamw(float *param, const float *grad, float *m, float *v, size_t n, float lr, float beta1,
               float beta2, float eps, float weight_decay, int64_t step, float grad_scale);

/* ---- CUDA kernels (runtime/ops/cuda), on the current stream ------------------------------------
 * Entries of the kernels' table, declared once in runtime/ops/cuda_ops.h. */

#ifdef __cplusplus
}
#endif
#endif /* WK_OPS_H */
