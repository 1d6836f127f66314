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
 * place, and when all three are f32 this is one sgemm, as before there was a choice of dtype. Each
 * sgemm of a large enough product is split in rows or columns over the kernels' pool (see sgemm).
 */
#include <cblas.h>  /* OpenBLAS */
#include <stdlib.h>

#include "gemm.h"
#include "parallel.h"
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

static void sgemm_serial(bool trans_a, bool trans_b, size_t M, size_t N, size_t K, float alpha, Block A, Block B,
                         float beta, float *C, size_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (int)M, (int)N,
              (int)K, alpha, A.data, (int)A.ld, B.data, (int)B.ld, beta, C, (int)ldc);
}

/* OpenBLAS runs on one thread and our pool splits the product: OpenBLAS's idle workers poll with
 * sched_yield between two of its calls and take the cores from our kernels' pool in between
 * (measured, a Llama step of B=8, T=128 on 2 cores: 312 ms on OpenBLAS's threads, 261 ms split
 * here). Rows of C are split when it has at least as many rows as columns, else its columns.
 *
 * Its pool goes as soon as this library loads (OpenBLAS's constructor has run by then): it would never
 * get work, and an idle worker also spins on sched_yield for its first ~0.1 s, at every process's start
 * (8% of the samples of a one-rank remote stream, 5-6% of the data loader's two ranks, on 2 cores).
 * blas_thread_shutdown_ is exported by OpenBLAS's pthreads builds (its fork handler calls it); weak, so
 * a build without it (OpenMP) keeps its pool, idle. */
extern int blas_thread_shutdown_(void) __attribute__((weak));

__attribute__((constructor)) static void make_blas_serial(void) {
  openblas_set_num_threads(1);
  if (blas_thread_shutdown_) blas_thread_shutdown_();
}

/* The epilogue over C's block of rows x cols at (row, col), if there is one. */
static void finish(GemmEpilogue e, float *block, size_t ld, size_t row, size_t col, size_t rows, size_t cols) {
  if (e.apply) e.apply(e.ctx, block, ld, row, col, rows, cols);
}

typedef struct {
  bool trans_a, trans_b, by_rows;
  size_t M, N, K;
  float alpha, beta;
  Block A, B;
  float *C;
  size_t ldc;
  GemmEpilogue epilogue;
} SgemmJob;

/* A chunk's rows (or columns) of C, then the epilogue over them, while they are in this core's cache. */
static void sgemm_part(void *ctx, size_t begin, size_t end, size_t chunk) {
  SgemmJob *j = ctx;
  Block A = j->A, B = j->B;
  float *C = j->C;
  if (j->by_rows) {
    A.data += j->trans_a ? begin : begin * A.ld;
    C += begin * j->ldc;
    sgemm_serial(j->trans_a, j->trans_b, end - begin, j->N, j->K, j->alpha, A, B, j->beta, C, j->ldc);
    finish(j->epilogue, C, j->ldc, begin, 0, end - begin, j->N);
  } else {
    B.data += j->trans_b ? begin * B.ld : begin;
    C += begin;
    sgemm_serial(j->trans_a, j->trans_b, j->M, end - begin, j->K, j->alpha, A, B, j->beta, C, j->ldc);
    finish(j->epilogue, C, j->ldc, 0, begin, j->M, end - begin);
  }
}

/* C = alpha op(A) op(B) + beta C on f32 blocks, then the epilogue over all of C. */
static void sgemm(bool trans_a, bool trans_b, size_t M, size_t N, size_t K, float alpha, Block A, Block B, float beta,
                  float *C, size_t ldc, GemmEpilogue epilogue) {
  size_t threads = parallel_threads();
  SgemmJob job = {trans_a, trans_b, M >= N, M, N, K, alpha, beta, A, B, C, ldc, epilogue};
  size_t n = job.by_rows ? M : N;
  if (threads == 1 || M * N * K < (size_t)PARALLEL_GRAIN * 4 || n < threads) {
    sgemm_part(&job, 0, n, 0);
    return;
  }
  parallel_for(n, n / threads, sgemm_part, &job);
}

/* One product C = alpha op(A) op(B) + beta C, as cpu_gemm takes it. */
typedef struct {
  size_t M, N, K;
  float alpha, beta;
  GemmOperand A, B;
  void *C;
  WkDType c_dtype;
  size_t ldc;
  GemmEpilogue epilogue;
} Product;

static size_t tiles_in(size_t n) { return (n + TILE - 1) / TILE; }

/* C's tile t (row-major over C's tiles of TILE x TILE), accumulated in f32 over K, given to the
 * epilogue and stored once; scratch: cpu_gemm_tiles(M, N, K) floats. */
static void gemm_tile(const Product *p, size_t t, float *scratch) {
  size_t m0 = t / tiles_in(p->N) * TILE, n0 = t % tiles_in(p->N) * TILE;
  size_t mr = min_size(TILE, p->M - m0), nr = min_size(TILE, p->N - n0);
  float *a_tile = scratch, *b_tile = a_tile + min_size(TILE, p->M) * min_size(TILE, p->K);
  float *c_tile = b_tile + min_size(TILE, p->K) * min_size(TILE, p->N);
  void *c_first = stored_at(p->C, p->c_dtype, m0 * p->ldc + n0);
  bool direct = p->c_dtype == WK_F32;
  float *acc = direct ? c_first : c_tile;
  size_t ld_acc = direct ? p->ldc : nr;
  if (!direct && p->beta != 0.0f)
    for (size_t r = 0; r < mr; r++) stored_load_run(c_tile + r * nr, stored_at(c_first, p->c_dtype, r * p->ldc), p->c_dtype, nr);
  if (p->K == 0)
    for (size_t r = 0; r < mr; r++)
      for (size_t c = 0; c < nr; c++) acc[r * ld_acc + c] = p->beta == 0.0f ? 0.0f : p->beta * acc[r * ld_acc + c];
  for (size_t k0 = 0; k0 < p->K; k0 += TILE) {
    size_t kr = min_size(TILE, p->K - k0);
    Block a = op_block(p->A, m0, mr, k0, kr, a_tile), b = op_block(p->B, k0, kr, n0, nr, b_tile);
    sgemm(p->A.trans, p->B.trans, mr, nr, kr, p->alpha, a, b, k0 == 0 ? p->beta : 1.0f, acc, ld_acc, GEMM_NO_EPILOGUE);
  }
  finish(p->epilogue, acc, ld_acc, m0, n0, mr, nr);
  if (!direct)
    for (size_t r = 0; r < mr; r++) stored_store_run(stored_at(c_first, p->c_dtype, r * p->ldc), c_tile + r * nr, p->c_dtype, nr);
}

/* f32 operands and a product over K > 0: one sgemm, read in place (no tiles). */
static bool one_sgemm(size_t K, GemmOperand A, GemmOperand B, WkDType c_dtype) {
  return A.dtype == WK_F32 && B.dtype == WK_F32 && c_dtype == WK_F32 && K > 0;
}

size_t cpu_gemm_tiles(size_t M, size_t N, size_t K) {
  size_t tm = min_size(TILE, M), tn = min_size(TILE, N), tk = min_size(TILE, K);
  return tm * tk + tk * tn + tm * tn;
}

/* The product as one sgemm (one_sgemm), the epilogue over each chunk of C it splits into. */
static void whole(const Product *p) {
  sgemm(p->A.trans, p->B.trans, p->M, p->N, p->K, p->alpha, (Block){p->A.data, p->A.ld}, (Block){p->B.data, p->B.ld},
        p->beta, p->C, p->ldc, p->epilogue);
}

void cpu_gemm_in(size_t M, size_t N, size_t K, float alpha, GemmOperand A, GemmOperand B, float beta, void *C,
                 WkDType c_dtype, size_t ldc, float *tiles) {
  Product p = {M, N, K, alpha, beta, A, B, C, c_dtype, ldc, GEMM_NO_EPILOGUE};
  if (M == 0 || N == 0) return;
  if (one_sgemm(K, A, B, c_dtype)) {
    whole(&p);
    return;
  }
  for (size_t t = 0; t < tiles_in(M) * tiles_in(N); t++) gemm_tile(&p, t, tiles);
}

/* C's tiles split over the pool, a scratch each chunk: the widening and rounding around the sgemms
 * then run on every thread too, where a tile at a time leaves them to the caller. */
typedef struct {
  const Product *p;
  float *scratch;
  size_t scratch_floats;
} TilesJob;

static void tiles_part(void *ctx, size_t begin, size_t end, size_t chunk) {
  const TilesJob *j = ctx;
  for (size_t t = begin; t < end; t++) gemm_tile(j->p, t, j->scratch + chunk * j->scratch_floats);
}

WkStatus cpu_gemm_epilogue(size_t M, size_t N, size_t K, float alpha, GemmOperand A, GemmOperand B, float beta,
                           void *C, WkDType c_dtype, size_t ldc, GemmEpilogue epilogue) {
  Product p = {M, N, K, alpha, beta, A, B, C, c_dtype, ldc, epilogue};
  if (M == 0 || N == 0) return WK_OK;
  if (one_sgemm(K, A, B, c_dtype)) {
    whole(&p);
    return WK_OK;
  }
  size_t count = tiles_in(M) * tiles_in(N), threads = parallel_threads();
  size_t grain = count >= threads ? count / threads : count;  /* fewer tiles than threads: one chunk, split sgemms */
  TilesJob job = {&p, NULL, cpu_gemm_tiles(M, N, K)};
  if (!(job.scratch = wk_malloc(parallel_chunks(count, grain) * job.scratch_floats * sizeof(float), "gemm tiles")))
    return wk_last_status();
  parallel_for(count, grain, tiles_part, &job);
  free(job.scratch);
  return WK_OK;
}

WkStatus cpu_gemm(size_t M, size_t N, size_t K, float alpha, GemmOperand A, GemmOperand B, float beta, void *C,
                  WkDType c_dtype, size_t ldc) {
  return cpu_gemm_epilogue(M, N, K, alpha, A, B, beta, C, c_dtype, ldc, GEMM_NO_EPILOGUE);
}
