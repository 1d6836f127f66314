/*
 * loss.cu — the CUDA mirror of runtime/ops/cpu/loss.c: cross-entropy over rows of logits, forward
 * (losses and their sum) and backward.
 *
 * A block per row (V = 50257 is 197 values a thread): the log-sum-exp is one online pass (a running
 * max rescales the running sum) and two block reductions, so the forward reads each logit once and
 * the backward twice (the pass, then the write, which replaces the logits where dlogits is logits: the
 * classifier's gradient takes its output's memory, as llm.c's fused classifier does). The loss sum is the deterministic two-stage sum of
 * the losses (no atomics); it and the bad-target flag come back to the host in one copy.
 * As on the CPU, the logits and dlogits are stored f32, bf16 or f16 (read exactly, dlogits rounded
 * once per element); the log-sum-exp, the losses and their sum stay f32 and double.
 */
#include "common.cuh"

/* log(sum(exp(row))) over the block's threads, returned to all of them. */
template <typename Storage>
__device__ static float block_log_sum_exp(const Storage *row, size_t V) {
  float maxval = -INFINITY, sum = 0.0f;
  for (size_t v = threadIdx.x; v < V; v += blockDim.x) {
    float x = to_float(row[v]);
    if (x > maxval) {
      sum = sum * expf(maxval - x) + 1.0f;
      maxval = x;
    } else {
      sum += expf(x - maxval);
    }
  }
  float row_max = block_max(maxval);
  sum = block_sum(maxval == -INFINITY ? 0.0f : sum * expf(maxval - row_max));
  return row_max + logf(sum);
}

/* Rows a block apart, grid-stride (the loop is block-uniform, so the reductions stay in step). */
#define BLOCK_ROW_LOOP(n, N) for (size_t n = blockIdx.x; n < (N); n += gridDim.x)

template <typename Storage>
__global__ static void cross_entropy_forward_kernel(float *losses, const Storage *logits, const int32_t *targets,
                                                    WkIndexLayout at, const uint8_t *mask, size_t N, size_t V,
                                                    float normalizer, WkStepStatus *status) {
  BLOCK_ROW_LOOP(n, N) {
    int32_t target = targets[wk_index_offset(at, (int64_t)n)];
    bool counted = !mask || mask[n];
    if (counted && !wk_in_vocab(target, V)) {  /* masked-out targets may hold anything */
      if (threadIdx.x == 0) {
        mark_bad_id((unsigned long long *)&status->bad_target, &status->target_limit, n, target, V);
        losses[n] = 0.0f;
      }
      continue;
    }
    if (!counted) {
      if (threadIdx.x == 0) losses[n] = 0.0f;
      continue;
    }
    float lse = block_log_sum_exp(logits + n * V, V);
    if (threadIdx.x == 0) losses[n] = (lse - to_float(logits[n * V + target])) / normalizer;
  }
}

/* The losses, their sum added to the step's status and bad targets marked there: nothing is read
 * back (ops.c reads the status once a step, or at once when the caller gave none). */
template <typename Storage>
static WkStatus cross_entropy_forward(float *losses, const Storage *logits, const int32_t *targets,
                                      WkIndexLayout targets_layout, const uint8_t *mask, size_t N, size_t V,
                                      float normalizer, WkStepStatus *status) {
  if (N == 0) return WK_OK;
  cross_entropy_forward_kernel<Storage><<<blocks_for(N, 1), THREADS, 0, current_stream()>>>(
      losses, logits, targets, targets_layout, mask, N, V, normalizer, status);
  WK_TRY(launch_status("cross_entropy"));
  return device_sum(&status->loss_sum, losses, N, false);
}

extern "C" WkStatus cuda_cross_entropy_forward(WkDType dtype, float *losses, const void *logits,
                                               const int32_t *targets, WkIndexLayout targets_layout,
                                               const uint8_t *mask, size_t N, size_t V, float normalizer,
                                               WkStepStatus *status) {
  STORAGE_DISPATCH(dtype, "cross_entropy",
                   cross_entropy_forward(losses, (const Storage *)logits, targets, targets_layout, mask, N, V,
                                         normalizer, status));
}

template <typename Storage>
__global__ static void cross_entropy_backward_kernel(Storage *dlogits, const Storage *logits, const int32_t *targets,
                                                     WkIndexLayout at, const uint8_t *mask, size_t N, size_t V,
                                                     float scale) {
  BLOCK_ROW_LOOP(n, N) {
    const Storage *row = logits + n * V;
    Storage *drow = dlogits + n * V;
    if (mask && !mask[n]) {
      for (size_t v = threadIdx.x; v < V; v += blockDim.x) drow[v] = from_float<Storage>(0.0f);
      continue;
    }
    float lse = block_log_sum_exp(row, V);  /* every thread's reads of the row end in its reductions */
    size_t target = (size_t)targets[wk_index_offset(at, (int64_t)n)];
    for (size_t v = threadIdx.x; v < V; v += blockDim.x) {
      float p = expf(to_float(row[v]) - lse);
      drow[v] = from_float<Storage>(scale * (p - (target == v ? 1.0f : 0.0f)));
    }
  }
}

template <typename Storage>
static WkStatus cross_entropy_backward(Storage *dlogits, const Storage *logits, const int32_t *targets,
                                       WkIndexLayout targets_layout, const uint8_t *mask, size_t N, size_t V,
                                       float scale) {
  cross_entropy_backward_kernel<Storage><<<blocks_for(N, 1), THREADS, 0, current_stream()>>>(
      dlogits, logits, targets, targets_layout, mask, N, V, scale);
  LAUNCH_CHECK();
  return WK_OK;
}

extern "C" WkStatus cuda_cross_entropy_backward(WkDType dtype, void *dlogits, const void *logits,
                                                const int32_t *targets, WkIndexLayout targets_layout,
                                                const uint8_t *mask, size_t N, size_t V, float normalizer,
                                                float dloss) {
  if (N == 0) return WK_OK;
  STORAGE_DISPATCH(dtype, "cross_entropy_backward",
                   cross_entropy_backward((Storage *)dlogits, (const Storage *)logits, targets, targets_layout,
                                          mask, N, V, dloss / normalizer));
}
