/*
 * gemm.c — C = alpha op(A) op(B) + beta C over operands stored as f32, bf16 or f16.
 *
 * sgemm is the one product OpenBLAS has for every case here: its bf16 product (cblas_sbgemm) takes
 * two bf16 operands only (attention multiplies f32 probabilities by stored values; fp16 has no such
 * kernel), and outside CPUs with bf16 instructions it falls back to generic code. So 2-byte
 * operands are widened to f32 on their way in and the result rounded to nearest even on its way out. That happens in tiles of 256 x 256, never for a whole operand: activations
 * grow with the batch, and an f32 copy of one would take back the memory that 2-byte storage saves.
 * Each (row, column) tile of C is accumulated in f32 over the tiles of K and stored once, so a
 * 2-byte output is rounded once per product, as the f32 accumulation of tensor cores does. The
 * cost: every element of A is widened N / 256 times and of B M / 256 times, 2 conversions per 256
 * multiply-adds, against converting the weights' compute copy to f32 once per step, which would keep
 * an f32 copy of every weight besides the master and the 2-byte copy. f32 operands are read in
 * place, and when all three are f32 this is one sgemm, as before there was a choice of dtype.
 */
#include <cblas.h>  /* OpenBLAS */
#include <stdlib.h>

#include "gemm.h"
#include "stored.h"

enum { TILE = 256 };

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

/* A block of a matrix as sgemm reads it: an f32 pointer and its leading dimension. */
typedef struct {
  const float *data;
  size_t ld;
} Block;

/* Rows [r0, r0 + rows) and columns [c0, c0 + cols) of X's storage as f32: in place when X is f32,
 * else widened into scratch. */
static Block block_of(GemmOperand X, size_t r0, size_t rows, size_t c0, size_t cols, float *scratch) {
  const void *first = stored_at(X.data, X.dtype, r0 * X.ld + c0);
  if (X.dtype == WK_F32) return (Block){first, X.ld};
  for (size_t r = 0; r < rows; r++) stored_load_run(scratch + r * cols, stored_at(first, X.dtype, r * X.ld), X.dtype, cols);
  return (Block){scratch, cols};
}

/* The block of op(X) at rows [i0, i0 + rows), columns [j0, j0 + cols): in storage a transposed block. */
static Block op_block(GemmOperand X, size_t i0, size_t rows, size_t j0, size_t cols, float *scratch) {
  return X.trans ? block_of(X, j0, cols, i0, rows, scratch) : block_of(X, i0, rows, j0, cols, scratch);
}

static void sgemm(bool trans_a, bool trans_b, size_t M, size_t N, size_t K, float alpha, Block A, Block B, float beta,
                  float *C, size_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (int)M, (int)N,
              (int)K, alpha, A.data, (int)A.ld, B.data, (int)B.ld, beta, C, (int)ldc);
}

/* C's tile [m0, m0 + mr) x [n0, n0 + nr), accumulated in f32 over K and stored once. */
static void gemm_tile(size_t m0, size_t mr, size_t n0, size_t nr, size_t K, float alpha, GemmOperand A, GemmOperand B,
                      float beta, void *C, WkDType c_dtype, size_t ldc, float *a_tile, float *b_tile, float *c_tile) {
  void *c_first = stored_at(C, c_dtype, m0 * ldc + n0);
  bool direct = c_dtype == WK_F32;
  float *acc = direct ? c_first : c_tile;
  size_t ld_acc = direct ? ldc : nr;
  if (!direct && beta != 0.0f)
    for (size_t r = 0; r < mr; r++) stored_load_run(c_tile + r * nr, stored_at(c_first, c_dtype, r * ldc), c_dtype, nr);
  if (K == 0)
    for (size_t r = 0; r < mr; r++)
      for (size_t c = 0; c < nr; c++) acc[r * ld_acc + c] = beta == 0.0f ? 0.0f : beta * acc[r * ld_acc + c];
  for (size_t k0 = 0; k0 < K; k0 += TILE) {
    size_t kr = min_size(TILE, K - k0);
    Block a = op_block(A, m0, mr, k0, kr, a_tile), b = op_block(B, k0, kr, n0, nr, b_tile);
    sgemm(A.trans, B.trans, mr, nr, kr, alpha, a, b, k0 == 0 ? beta : 1.0f, acc, ld_acc);
  }
  if (!direct)
    for (size_t r = 0; r < mr; r++) stored_store_run(stored_at(c_first, c_dtype, r * ldc), c_tile + r * nr, c_dtype, nr);
}

WkStatus cpu_gemm(size_t M, size_t N, size_t K, float alpha, GemmOperand A, GemmOperand B, float beta, void *C,
                  WkDType c_dtype, size_t ldc) {
  if (M == 0 || N == 0) return WK_OK;
  if (A.dtype == WK_F32 && B.dtype == WK_F32 && c_dtype == WK_F32 && K > 0) {
    sgemm(A.trans, B.trans, M, N, K, alpha, (Block){A.data, A.ld}, (Block){B.data, B.ld}, beta, C, ldc);
    return WK_OK;
  }
  size_t tm = min_size(TILE, M), tn = min_size(TILE, N), tk = min_size(TILE, K);
  float *scratch = wk_malloc((tm * tk + tk * tn + tm * tn) * sizeof *scratch, "gemm tiles");
  if (!scratch) return wk_last_status();
  float *a_tile = scratch, *b_tile = a_tile + tm * tk, *c_tile = b_tile + tk * tn;
  for (size_t m0 = 0; m0 < M; m0 += TILE)
    for (size_t n0 = 0; n0 < N; n0 += TILE)
      gemm_tile(m0, min_size(TILE, M - m0), n0, min_size(TILE, N - n0), K, alpha, A, B, beta, C, c_dtype, ldc, a_tile,
                b_tile, c_tile);
  free(scratch);
  return WK_OK;
}
