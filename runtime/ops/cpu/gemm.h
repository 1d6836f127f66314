/*
 * gemm.h — matrix products over operands stored in any float dtype (f32, bf16, f16), through
 * OpenBLAS sgemm (runtime/ops/cpu/gemm.c).
 */
#ifndef WK_OPS_CPU_GEMM_H
#define WK_OPS_CPU_GEMM_H

#include "../ops.h"

/* A row-major matrix of dtype f32, bf16 or f16, ld elements from one row to the next, read as its
 * transpose when trans is set. */
typedef struct {
  const void *data;
  WkDType dtype;
  size_t ld;
  bool trans;
} GemmOperand;

/* C[M,N] = alpha op(A)[M,K] op(B)[K,N] + beta C, C row-major of dtype c_dtype with ldc elements a
 * row. One sgemm when all three are f32; otherwise in tiles (see gemm.c), widened into `tiles`, an
 * f32 scratch of cpu_gemm_tiles(M, N, K) floats. Allocates nothing, so it can run on a pool worker. */
void cpu_gemm_in(size_t M, size_t N, size_t K, float alpha, GemmOperand A, GemmOperand B, float beta, void *C,
                 WkDType c_dtype, size_t ldc, float *tiles);

/* The floats of cpu_gemm_in's scratch for an M x N x K product with a 2-byte operand: three tiles of
 * at most 256 x 256. */
size_t cpu_gemm_tiles(size_t M, size_t N, size_t K);

/* cpu_gemm_in with its scratch allocated here when an operand is not f32: the only way it can fail. */
WkStatus cpu_gemm(size_t M, size_t N, size_t K, float alpha, GemmOperand A, GemmOperand B, float beta, void *C,
                  WkDType c_dtype, size_t ldc);

/* What a product does with its values while they are still unrounded f32 (a fused activation, as a
 * cuBLASLt epilogue does): apply gets a block of rows x cols of alpha op(A) op(B) + beta C, whose
 * first element is C's (row, col), ld floats from one row to the next. It may change them, and C
 * then stores what it leaves (rounded once to C's dtype), and may write outputs of its own from
 * them. Blocks never overlap; several may be applied at once on the kernels' pool. */
typedef struct {
  void (*apply)(void *ctx, float *block, size_t ld, size_t row, size_t col, size_t rows, size_t cols);
  void *ctx;
} GemmEpilogue;
#define GEMM_NO_EPILOGUE ((GemmEpilogue){NULL, NULL})  /* C stores the product as it is */

/* cpu_gemm with an epilogue: the same products in the same order, so C gets the very values
 * cpu_gemm gives when apply leaves them alone. */
WkStatus cpu_gemm_epilogue(size_t M, size_t N, size_t K, float alpha, GemmOperand A, GemmOperand B, float beta,
                           void *C, WkDType c_dtype, size_t ldc, GemmEpilogue epilogue);

#endif /* WK_OPS_CPU_GEMM_H */
