/*
 * parallel.h — a fixed pool of worker threads that the CPU kernels split their rows over.
 *
 * Why not OpenMP: libgomp's idle workers spin for a while after every parallel region, taking the
 * cores from whatever runs next (measured: a GPT training step went from 0.76 s to 1.30 s on 2
 * cores, against OpenBLAS's threads). These workers sleep on a condition variable instead, and the
 * GEMMs split over them too (gemm.c), so one set of threads owns the cores. One job runs at a time;
 * a nested or concurrent call runs inline.
 */
#ifndef WK_PARALLEL_H
#define WK_PARALLEL_H

#include <stddef.h>

#include "../ops.h" /* PARALLEL_GRAIN */

enum { PARALLEL_MAX_CHUNKS = 64 };

/* Processes items [begin, end) of the job; chunk is in [0, parallel_chunks(n, grain)). */
typedef void (*ParallelBody)(void *ctx, size_t begin, size_t end, size_t chunk);

/* How many chunks parallel_for(n, grain, ...) uses: 1 when n < 2 * grain. Reductions keep one
 * partial result per chunk and add them in chunk order, so results do not depend on timing. */
size_t parallel_chunks(size_t n, size_t grain);

/* The threads a job runs on: the workers and the caller (starts the pool). */
size_t parallel_threads(void);

/* Runs body over [0, n) split into parallel_chunks(n, grain) contiguous chunks, on the pool and
 * the calling thread; returns when every chunk is done. */
void parallel_for(size_t n, size_t grain, ParallelBody body, void *ctx);

/* The grain for rows of work_per_row multiply-adds: about PARALLEL_GRAIN (runtime/ops/ops.h) a chunk. */
static inline size_t parallel_row_grain(size_t work_per_row) {
  return work_per_row >= PARALLEL_GRAIN ? 1 : PARALLEL_GRAIN / (work_per_row ? work_per_row : 1);
}

#endif /* WK_PARALLEL_H */
