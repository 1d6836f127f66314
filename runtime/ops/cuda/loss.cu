/*
 * loss.cu — the CUDA mirror of runtime/ops/cpu/loss.c: cross-entropy over rows of logits, forward
 * (losses and their sum) and backward.
 */
#include "common.cuh"

/* ---- cross-entropy -------------------------------------------------------------------------------- */

__device__ static float row_log_sum_exp(const float *row, size_t V) {
  float maxval = -INFINITY;
  for (size_t v = lane(); v < V; v += WARP) maxval = fmaxf(maxval, row[v]);
  maxval = warp_max(maxval);
  float sum = 0.0f;
  for (size_t v = lane(); v < V; v += WARP) sum += expf(row[v] - maxval);
  return maxval + logf(warp_sum(sum));
}

__global__ static void cross_entropy_forward_kernel(float *losses, const float *logits, const int32_t *targets,
                                                    WkIndexLayout at, const uint8_t *mask, size_t N, size_t V,
                                                    float normalizer, double *loss_sum, int *bad) {
  ROW_LOOP(n, N) {
    int32_t target = targets[wk_index_offset(at, (int64_t)n)];
    bool counted = !mask || mask[n];
    if (counted && (target < 0 || (size_t)target >= V)) {  /* masked-out targets may hold anything */
      if (lane() == 0) {
        *bad = 1;
        losses[n] = 0.0f;
      }
      continue;
    }
    float lse = counted ? row_log_sum_exp(logits + n * V, V) : 0.0f;
    if (lane() == 0) {
      losses[n] = counted ? (lse - logits[n * V + target]) / normalizer : 0.0f;
      atomicAdd(loss_sum, (double)losses[n]);
    }
  }
}

extern "C" WkStatus cuda_cross_entropy_forward(float *losses, const float *logits, const int32_t *targets,
                                               WkIndexLayout targets_layout, const uint8_t *mask, size_t N, size_t V,
                                               float normalizer, double *loss_sum) {
  DeviceScratch sum, flag;
  WK_TRY(scalar_new(&sum, sizeof(double)));
  WkStatus status = scalar_new(&flag, sizeof(int));
  if (status != WK_OK) {
    scratch_free(&sum);
    return status;
  }
  if (N) {
    cross_entropy_forward_kernel<<<blocks_for(N, WARPS_PER_BLOCK), THREADS, 0, current_stream()>>>(
        losses, logits, targets, targets_layout, mask, N, V, normalizer, (double *)sum.ptr, (int *)flag.ptr);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) status = WK_FAIL(WK_ERR_DEVICE, "cross_entropy kernel: %s", cudaGetErrorString(err));
  }
  WkStatus read = scalar_read(&sum, loss_sum, sizeof(double));
  WkStatus flagged = check_flag(&flag, "cross_entropy (targets)");
  return status != WK_OK ? status : read != WK_OK ? read : flagged;
}

__global__ static void cross_entropy_backward_kernel(float *dlogits, const float *logits, const int32_t *targets,
                                                     WkIndexLayout at, const uint8_t *mask, size_t N, size_t V,
                                                     float scale) {
  ROW_LOOP(n, N) {
    if (mask && !mask[n]) continue;
    const float *row = logits + n * V;
    float lse = row_log_sum_exp(row, V);
    size_t target = (size_t)targets[wk_index_offset(at, (int64_t)n)];
    for (size_t v = lane(); v < V; v += WARP)
      dlogits[n * V + v] += scale * (expf(row[v] - lse) - (target == v ? 1.0f : 0.0f));
  }
}

extern "C" WkStatus cuda_cross_entropy_backward(float *dlogits, const float *logits, const int32_t *targets,
                                                WkIndexLayout targets_layout, const uint8_t *mask, size_t N, size_t V,
                                                float normalizer, float dloss) {
  if (N) LAUNCH_ROWS(cross_entropy_backward_kernel, N, dlogits, logits, targets, targets_layout, mask, N, V,
                     dloss / normalizer);
  return WK_OK;
}
