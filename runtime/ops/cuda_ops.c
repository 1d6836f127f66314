/*
 * cuda_ops.c — the kernels' table (cuda_ops.h): stand-ins until the first call, then the module's
 * cuda_* definitions, resolved through the tensor layer's loader. A module that lacks one of them
 * (a stale build) leaves every entry a stand-in, so ops fail with the reason rather than half-run.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "cuda_ops.h"

WK_CUDA_OPS_FUNCTIONS(WK_CUDA_STAND_IN)

static WkCudaOps table = {WK_CUDA_OPS_FUNCTIONS(WK_CUDA_STAND_IN_ENTRY)};
static pthread_once_t fill_once = PTHREAD_ONCE_INIT;

static void fill_table(void) {
  WkCudaOps found;
  bool ok = true;
  WK_CUDA_OPS_FUNCTIONS(WK_CUDA_RESOLVE)
  if (ok) table = found;
}

static const WkCudaOps *_Atomic in_use;  /* wk_cuda_ops_use's table, NULL: the loaded one */

const WkCudaOps *wk_cuda_ops(void) {
  const WkCudaOps *fake = in_use;
  if (fake) return fake;
  pthread_once(&fill_once, fill_table);
  return &table;
}

void wk_cuda_ops_use(const WkCudaOps *ops) { in_use = ops; }
