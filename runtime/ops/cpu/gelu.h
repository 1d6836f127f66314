/*
 * gelu.h — GELU's tanh approximation over runs of f32 values (elementwise.c): the GELU ops' arithmetic,
 * which the matmul's GELU epilogue (layers.c) applies to a product's unrounded values.
 */
#ifndef WK_OPS_CPU_GELU_H
#define WK_OPS_CPU_GELU_H

#include <stddef.h>

/* out[i] = gelu(inp[i]) for i < n. */
void cpu_gelu_run(float *restrict out, const float *restrict inp, size_t n);

/* d[i] *= gelu'(inp[i]) for i < n: a gradient through GELU, written where it was. */
void cpu_gelu_derivative_times_run(float *restrict d, const float *restrict inp, size_t n);

#endif /* WK_OPS_CPU_GELU_H */
