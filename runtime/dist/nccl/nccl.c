/*
 * nccl.c — the NCCL backend module (build/libwick_nccl.so): one communicator per process group,
 * on its own CUDA stream, with every wait bounded.
 *
 * Built only when the Makefile finds nccl.h and libnccl (NCCL ships with the CUDA toolkit), and
 * loaded by runtime/dist/nccl_loader.c on the first collective over a CUDA tensor. The
 * communicator is created non-blocking, so that its creation and every collective can be
 * polled: cudaEventQuery for completion, ncclCommGetAsyncError for a failure, and at the deadline
 * ncclCommAbort, which frees the GPU instead of hanging it. The caller's stream is respected: the
 * collective waits for the work queued on it (an event), and the caller returns only once the
 * collective is done, so its results are ready for whatever comes next.
 *
 * It calls back into libwick only for the error slot and the log (wk_fail_at, wk_logf); the
 * deadlines are runtime/dist/net.c's, linked in.
 */
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../dist.h"

#define WK_NCCL_EXPORT __attribute__((visibility("default")))

enum { POLL_US = 50 };  /* between completion checks; NCCL kernels are queued, not spinning on us */

typedef struct {
  ncclComm_t comm;
  cudaStream_t stream;
  cudaEvent_t ready;    /* recorded on the caller's stream */
  cudaEvent_t done;     /* recorded on ours after the collective */
  int device;
  int rank;
} Comm;

#define CUDA_CHECK(call)                                                                                   \
  do {                                                                                                     \
    cudaError_t cuda_status_ = (call);                                                                     \
    if (cuda_status_ != cudaSuccess)                                                                       \
      return WK_FAIL(WK_ERR_DEVICE, "%s: %s (%s)", #call, cudaGetErrorString(cuda_status_),                \
                     "check the GPU with nvidia-smi; CUDA_LAUNCH_BLOCKING=1 pins down the failing kernel"); \
  } while (0)

#define NCCL_CHECK(call)                                                                                   \
  do {                                                                                                     \
    ncclResult_t nccl_status_ = (call);                                                                    \
    if (nccl_status_ != ncclSuccess && nccl_status_ != ncclInProgress)                                     \
      return WK_FAIL(WK_ERR_DEVICE, "%s: %s (NCCL_DEBUG=INFO says more)", #call, ncclGetErrorString(nccl_status_)); \
  } while (0)

/* Waits until the communicator has no operation in progress, or aborts it at the deadline. */
static WkStatus settle(Comm *c, int64_t deadline_ms, const char *what) {
  for (;;) {
    ncclResult_t state;
    NCCL_CHECK(ncclCommGetAsyncError(c->comm, &state));
    if (state == ncclSuccess) return WK_OK;
    if (state != ncclInProgress)
      return WK_FAIL(WK_ERR_NETWORK, "NCCL %s on rank %d: %s (a peer failed or left; NCCL_DEBUG=INFO says more)",
                     what, c->rank, ncclGetErrorString(state));
    if (net_remaining(deadline_ms) == 0) {
      ncclCommAbort(c->comm);
      c->comm = NULL;
      return WK_FAIL(WK_ERR_TIMEOUT, "NCCL %s on rank %d: timed out (communicator aborted)", what, c->rank);
    }
    usleep(POLL_US);
  }
}

WK_NCCL_EXPORT WkStatus wk_nccl_unique_id(uint8_t *out, size_t capacity, size_t *length) {
  ncclUniqueId id;
  if (capacity < sizeof id) return WK_FAIL(WK_ERR_INTERNAL, "NCCL unique id needs %zu bytes", sizeof id);
  NCCL_CHECK(ncclGetUniqueId(&id));
  memcpy(out, &id, sizeof id);
  *length = sizeof id;
  return WK_OK;
}

static void destroy(Comm *c) {
  if (c->comm) ncclCommDestroy(c->comm);
  if (c->ready) cudaEventDestroy(c->ready);
  if (c->done) cudaEventDestroy(c->done);
  if (c->stream) cudaStreamDestroy(c->stream);
  free(c);
}

static WkStatus init(Comm *c, const uint8_t *id_bytes, size_t length, int size, int64_t timeout_ms) {
  ncclUniqueId id;
  if (length != sizeof id)
    return WK_FAIL(WK_ERR_FORMAT, "NCCL unique id from the store has %zu bytes, not %zu (ranks of different builds?)",
                   length, sizeof id);
  memcpy(&id, id_bytes, sizeof id);
  CUDA_CHECK(cudaSetDevice(c->device));
  CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreateWithFlags(&c->ready, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&c->done, cudaEventDisableTiming));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  NCCL_CHECK(ncclCommInitRankConfig(&c->comm, size, id, c->rank, &config));
  return settle(c, net_deadline(timeout_ms), "communicator creation");
}

WK_NCCL_EXPORT WkStatus wk_nccl_init(const uint8_t *id, size_t length, int rank, int size, int device_index,
                                     int64_t timeout_ms, void **out) {
  Comm *c = calloc(1, sizeof *c);
  if (!c) return WK_FAIL(WK_ERR_NOMEM, "out of memory for an NCCL communicator");
  c->device = device_index;
  c->rank = rank;
  WkStatus st = init(c, id, length, size, timeout_ms);
  if (st != WK_OK) {
    destroy(c);
    return st;
  }
  *out = c;
  return WK_OK;
}

WK_NCCL_EXPORT void wk_nccl_free(void *comm) {
  if (comm) destroy(comm);
}

static WkStatus nccl_dtype(int dtype, ncclDataType_t *out) {
  switch ((WkDType)dtype) {
    case WK_F32: *out = ncclFloat32; return WK_OK;
    case WK_BF16: *out = ncclBfloat16; return WK_OK;
    case WK_F16: *out = ncclFloat16; return WK_OK;
    case WK_I32: *out = ncclInt32; return WK_OK;
    case WK_I64: *out = ncclInt64; return WK_OK;
    default: return WK_FAIL(WK_ERR_INVALID_ARG, "NCCL: dtype %d has no NCCL type", dtype);
  }
}

static ncclRedOp_t nccl_op(int op) {
  switch ((WkReduceOp)op) {
    case WK_REDUCE_AVG: return ncclAvg;
    case WK_REDUCE_MAX: return ncclMax;
    case WK_REDUCE_MIN: return ncclMin;
    default: return ncclSum;
  }
}

static WkStatus enqueue(Comm *c, int kind, void *out, const void *in, size_t count, ncclDataType_t type, int op,
                        int root) {
  switch ((CollectiveKind)kind) {
    case COLL_ALL_REDUCE: NCCL_CHECK(ncclAllReduce(in, out, count, type, nccl_op(op), c->comm, c->stream)); break;
    case COLL_BROADCAST: NCCL_CHECK(ncclBroadcast(in, out, count, type, root, c->comm, c->stream)); break;
    case COLL_ALL_GATHER: NCCL_CHECK(ncclAllGather(in, out, count, type, c->comm, c->stream)); break;
    case COLL_REDUCE_SCATTER: NCCL_CHECK(ncclReduceScatter(in, out, count, type, nccl_op(op), c->comm, c->stream)); break;
    default: return WK_FAIL(WK_ERR_INVALID_ARG, "NCCL: collective %d has no tensor to run on", kind);
  }
  return WK_OK;
}

WK_NCCL_EXPORT WkStatus wk_nccl_run(void *comm, int kind, void *out, const void *in, size_t count, int dtype, int op,
                                    int root, void *stream, int64_t timeout_ms) {
  Comm *c = comm;
  if (!c->comm) return WK_FAIL(WK_ERR_CLOSED, "NCCL communicator of rank %d was aborted by an earlier timeout", c->rank);
  ncclDataType_t type = ncclFloat32;
  WK_TRY(nccl_dtype(dtype, &type));
  int64_t deadline = net_deadline(timeout_ms);
  CUDA_CHECK(cudaSetDevice(c->device));
  CUDA_CHECK(cudaEventRecord(c->ready, (cudaStream_t)stream));
  CUDA_CHECK(cudaStreamWaitEvent(c->stream, c->ready, 0));
  WK_TRY(enqueue(c, kind, out, in, count, type, op, root));
  WK_TRY(settle(c, deadline, "collective launch"));
  CUDA_CHECK(cudaEventRecord(c->done, c->stream));
  for (;;) {
    cudaError_t q = cudaEventQuery(c->done);
    if (q == cudaSuccess) return WK_OK;
    if (q != cudaErrorNotReady) CUDA_CHECK(q);
    ncclResult_t state;
    NCCL_CHECK(ncclCommGetAsyncError(c->comm, &state));
    if (state != ncclSuccess && state != ncclInProgress)
      return WK_FAIL(WK_ERR_NETWORK, "NCCL collective on rank %d: %s (a peer failed or left)", c->rank,
                     ncclGetErrorString(state));
    if (net_remaining(deadline) == 0) {
      ncclCommAbort(c->comm);
      c->comm = NULL;
      return WK_FAIL(WK_ERR_TIMEOUT, "NCCL collective on rank %d: timed out (communicator aborted)", c->rank);
    }
    usleep(POLL_US);
  }
}
