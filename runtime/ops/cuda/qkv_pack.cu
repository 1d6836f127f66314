/*
 * qkv_pack.cu — the CUDA mirror of runtime/ops/cpu/qkv_pack.c: grouped-query attention's gather of q
 * [N, NH*hs], k and v [N, KVH*hs] into the fused qkv [N, 3*NH*hs] the attention kernels read, each kv
 * head repeated for its group of NH/KVH query heads; the backward scatters dqkv back. A kv head's
 * gradient is the sum over its group, formed by the one thread that owns the element (in head order,
 * in f32, rounded once), so no atomics. All are activations of one stored dtype.
 */
#include "common.cuh"

/* A thread per element of qkv: which of q, k, v it copies is a function of its column. */
template <typename Storage>
__global__ static void qkv_pack_kernel(Storage *qkv, const Storage *q, const Storage *k, const Storage *v, size_t NH,
                                       size_t KVH, size_t hs, size_t n) {
  size_t C = NH * hs, KC = KVH * hs, group = NH / KVH;
  GRID_STRIDE(i, n) {
    size_t row = i / (3 * C), col = i % (3 * C), part = col / C, c = col % C;
    size_t kv = row * KC + (c / hs / group) * hs + c % hs;
    qkv[i] = part == 0 ? q[row * C + c] : part == 1 ? k[kv] : v[kv];
  }
}

/* dq += its third of dqkv, a thread per element of dq. */
template <typename Storage>
__global__ static void dq_kernel(Storage *dq, const Storage *dqkv, size_t C, size_t n) {
  GRID_STRIDE(i, n) {
    size_t row = i / C, c = i % C;
    dq[i] = from_float<Storage>(to_float(dq[i]) + to_float(dqkv[row * 3 * C + c]));
  }
}

/* A thread per element of dk and of dv (i < 2n, dk's first): it sums the group's query heads. */
template <typename Storage>
__global__ static void dkv_kernel(Storage *dk, Storage *dv, const Storage *dqkv, size_t NH, size_t KVH, size_t hs,
                                  size_t n) {
  size_t C = NH * hs, KC = KVH * hs, group = NH / KVH;
  GRID_STRIDE(i, 2 * n) {
    bool is_v = i >= n;
    size_t e = is_v ? i - n : i, row = e / KC, head = (e % KC) / hs, d = e % hs;
    Storage *grad = is_v ? dv : dk;
    const Storage *part = dqkv + row * 3 * C + (is_v ? 2 : 1) * C;
    float sum = to_float(grad[e]);
    for (size_t h = head * group; h < (head + 1) * group; h++) sum += to_float(part[h * hs + d]);
    grad[e] = from_float<Storage>(sum);
  }
}

template <typename Storage>
static WkStatus qkv_pack(Storage *qkv, const Storage *q, const Storage *k, const Storage *v, size_t N, size_t NH,
                         size_t KVH, size_t hs) {
  LAUNCH(qkv_pack_kernel<Storage>, N * 3 * NH * hs, qkv, q, k, v, NH, KVH, hs, N * 3 * NH * hs);
  return WK_OK;
}

template <typename Storage>
static WkStatus qkv_pack_backward(Storage *dq, Storage *dk, Storage *dv, const Storage *dqkv, size_t N, size_t NH,
                                  size_t KVH, size_t hs) {
  LAUNCH(dq_kernel<Storage>, N * NH * hs, dq, dqkv, NH * hs, N * NH * hs);
  LAUNCH(dkv_kernel<Storage>, 2 * N * KVH * hs, dk, dv, dqkv, NH, KVH, hs, N * KVH * hs);
  return WK_OK;
}

extern "C" WkStatus cuda_qkv_pack(WkDType dtype, void *qkv, const void *q, const void *k, const void *v, size_t N,
                                  size_t NH, size_t KVH, size_t hs) {
  if (N * NH * hs == 0) return WK_OK;
  STORAGE_DISPATCH(dtype, "qkv_pack", qkv_pack((Storage *)qkv, (const Storage *)q, (const Storage *)k,
                                               (const Storage *)v, N, NH, KVH, hs));
}

extern "C" WkStatus cuda_qkv_pack_backward(WkDType dtype, void *dq, void *dk, void *dv, const void *dqkv, size_t N,
                                           size_t NH, size_t KVH, size_t hs) {
  if (N * NH * hs == 0) return WK_OK;
  STORAGE_DISPATCH(dtype, "qkv_pack_backward", qkv_pack_backward((Storage *)dq, (Storage *)dk, (Storage *)dv,
                                                                 (const Storage *)dqkv, N, NH, KVH, hs));
}
