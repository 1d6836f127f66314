/*
 * nccl.c — the NCCL backend module (build/libwick_nccl.so): one communicator per process group,
 * on its own CUDA stream, with every wait bounded.
 *
 * Built only when the Makefile finds nccl.h and libnccl (NCCL ships with the CUDA toolkit), and
 * loaded by runtime/dist/nccl_loader.c on the first collective over a CUDA tensor. The
 * communicator is created non-blocking, so that its creation and every collective can be
 * polled: cudaEventQuery for completion, ncclCommGetAsyncError for a failure. Any failure (an NCCL
 * or CUDA error, an asynchronous error, the deadline) ends in ncclCommAbort, which frees the GPU
 * instead of hanging it: ncclCommDestroy on a broken communicator can block forever. The failure's
 * status (WK_ERR_TIMEOUT at the deadline) goes back to comm.c, which writes the same hang report
 * as for Gloo (report.c: the missing ranks, the collective, the recipe line). A healthy
 * close finalizes (flushing what is queued), then destroys. The caller's stream is respected: the
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
#include "../nccl_module.h"

/* The entry points, from the one list the loader and the smoke test's cdef read too: exported, and
 * the definitions below must match them. */
#define EXPORTED_PROTOTYPE(ret, name, params) __attribute__((visibility("default"))) ret wk_nccl_##name params;
WK_NCCL_MODULE_FUNCTIONS(EXPORTED_PROTOTYPE)
#undef EXPORTED_PROTOTYPE

enum { POLL_US = 50 };  /* between completion checks; NCCL kernels are queued, not spinning on us */

typedef struct {
  ncclComm_t comm;
  cudaStream_t stream;
  cudaEvent_t ready;    /* recorded on the caller's stream */
  cudaEvent_t done;     /* recorded on ours after the collective */
  int device;
  int rank;
  int64_t timeout_ms;   /* of every wait, the close's included */
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

/* Ends a failed communicator: every later call on it reports the abort. Returns status. */
static WkStatus abort_comm(Comm *c, WkStatus status) {
  if (!c->comm) return status;
  ncclResult_t r = ncclCommAbort(c->comm);
  if (r != ncclSuccess) wk_logf(WK_LOG_WARN, "ncclCommAbort on rank %d: %s", c->rank, ncclGetErrorString(r));
  c->comm = NULL;
  return wk_error_context("communicator aborted");
}

/* A check inside a live communicator's call: its failure aborts it. */
#define ABORT_ON_FAILURE(c, expr)                                     \
  do {                                                                \
    WkStatus abort_status_ = (expr);                                  \
    if (abort_status_ != WK_OK) return abort_comm((c), abort_status_); \
  } while (0)

static WkStatus async_error(Comm *c, ncclResult_t *state) {
  NCCL_CHECK(ncclCommGetAsyncError(c->comm, state));
  return WK_OK;
}

/* Polls the communicator's asynchronous state: WK_OK with *busy while an operation is in
 * progress, a failure (not yet aborted) when it has one. */
static WkStatus poll_state(Comm *c, const char *what, int64_t deadline_ms, bool *busy) {
  ncclResult_t state;
  WK_TRY(async_error(c, &state));
  *busy = state == ncclInProgress;
  if (state != ncclSuccess && state != ncclInProgress)
    return WK_FAIL(WK_ERR_NETWORK, "NCCL %s on rank %d: %s (a peer failed or left; NCCL_DEBUG=INFO says more)",
                   what, c->rank, ncclGetErrorString(state));
  if (*busy && net_remaining(deadline_ms) == 0)
    return WK_FAIL(WK_ERR_TIMEOUT, "NCCL %s on rank %d: timed out", what, c->rank);
  return WK_OK;
}

/* Waits until the communicator has no operation in progress; any failure aborts it. */
static WkStatus settle(Comm *c, int64_t deadline_ms, const char *what) {
  for (bool busy = true;;) {
    ABORT_ON_FAILURE(c, poll_state(c, what, deadline_ms, &busy));
    if (!busy) return WK_OK;
    usleep(POLL_US);
  }
}

WkStatus wk_nccl_unique_id(uint8_t *out, size_t capacity, size_t *length) {
  ncclUniqueId id;
  if (capacity < sizeof id) return WK_FAIL(WK_ERR_INTERNAL, "NCCL unique id needs %zu bytes", sizeof id);
  NCCL_CHECK(ncclGetUniqueId(&id));
  memcpy(out, &id, sizeof id);
  *length = sizeof id;
  return WK_OK;
}

/* A healthy communicator is finalized, then destroyed; a failed one (or one whose finalize fails) aborted. */
static void close_comm(Comm *c, bool healthy) {
  if (!c->comm) return;
  if (!healthy) {
    (void)abort_comm(c, WK_ERR_CLOSED);
    return;
  }
  ncclResult_t r = ncclCommFinalize(c->comm);
  WkStatus st = r == ncclSuccess || r == ncclInProgress
                    ? settle(c, net_deadline(c->timeout_ms), "close")
                    : abort_comm(c, WK_FAIL(WK_ERR_DEVICE, "ncclCommFinalize: %s", ncclGetErrorString(r)));
  if (st != WK_OK) {
    wk_logf(WK_LOG_WARN, "%s", wk_last_error());
    return;
  }
  r = ncclCommDestroy(c->comm);
  if (r != ncclSuccess) wk_logf(WK_LOG_WARN, "ncclCommDestroy on rank %d: %s", c->rank, ncclGetErrorString(r));
  c->comm = NULL;
}

static void destroy(Comm *c, bool healthy) {
  close_comm(c, healthy);
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
  ncclResult_t r = ncclCommInitRankConfig(&c->comm, size, id, c->rank, &config);
  if (r != ncclSuccess && r != ncclInProgress)
    return abort_comm(c, WK_FAIL(WK_ERR_DEVICE, "ncclCommInitRankConfig: %s (NCCL_DEBUG=INFO says more)",
                                 ncclGetErrorString(r)));
  return settle(c, net_deadline(timeout_ms), "communicator creation");
}

WkStatus wk_nccl_init(const uint8_t *id, size_t length, int rank, int size, int device_index, int64_t timeout_ms,
                      void **out) {
  Comm *c = calloc(1, sizeof *c);
  if (!c) return WK_FAIL(WK_ERR_NOMEM, "out of memory for an NCCL communicator");
  c->device = device_index;
  c->rank = rank;
  c->timeout_ms = timeout_ms;
  /* NCCL starts its proxy thread (and the CUDA runtime its own) here: they must not take the signals
   * the host handles (runtime/core/thread.c says why) */
  sigset_t mask;
  wk_signals_block(&mask);
  WkStatus st = init(c, id, length, size, timeout_ms);
  wk_signals_restore(&mask);
  if (st != WK_OK) {
    destroy(c, false);
    return st;
  }
  *out = c;
  return WK_OK;
}

void wk_nccl_free(void *comm) {
  if (comm) destroy(comm, true);
}

static WkStatus nccl_dtype(int dtype, ncclDataType_t *out) {
  switch ((WkDType)dtype) {
    case WK_F32: *out = ncclFloat32; return WK_OK;
    case WK_BF16: *out = ncclBfloat16; return WK_OK;
    case WK_F16: *out = ncclFloat16; return WK_OK;
    case WK_I32: *out = ncclInt32; return WK_OK;
    case WK_I64: *out = ncclInt64; return WK_OK;
    case WK_U8: *out = ncclUint8; return WK_OK;
    default: return WK_FAIL(WK_ERR_INVALID_ARG, "NCCL: dtype %s has no NCCL type", wk_dtype_name((WkDType)dtype));
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

/* Waits for the collective queued on c's stream; any failure aborts the communicator. */
static WkStatus wait_done(Comm *c, int64_t deadline) {
  for (bool busy = true;;) {
    cudaError_t q = cudaEventQuery(c->done);
    if (q == cudaSuccess) return WK_OK;
    if (q != cudaErrorNotReady) CUDA_CHECK(q);
    WK_TRY(poll_state(c, "collective", deadline, &busy));
    if (!busy && net_remaining(deadline) == 0)
      return WK_FAIL(WK_ERR_TIMEOUT, "NCCL collective on rank %d: timed out", c->rank);
    usleep(POLL_US);
  }
}

static WkStatus cuda_record_done(Comm *c) {
  CUDA_CHECK(cudaEventRecord(c->done, c->stream));
  return WK_OK;
}

static WkStatus launch(Comm *c, int kind, void *out, const void *in, size_t count, ncclDataType_t type, int op,
                       int root, void *stream) {
  CUDA_CHECK(cudaSetDevice(c->device));
  CUDA_CHECK(cudaEventRecord(c->ready, (cudaStream_t)stream));
  CUDA_CHECK(cudaStreamWaitEvent(c->stream, c->ready, 0));
  return enqueue(c, kind, out, in, count, type, op, root);
}

WkStatus wk_nccl_run(void *comm, int kind, void *out, const void *in, size_t count, int dtype, int op, int root,
                     void *stream, int64_t timeout_ms) {
  Comm *c = comm;
  if (!c->comm)
    return WK_FAIL(WK_ERR_CLOSED, "NCCL communicator of rank %d was aborted by an earlier failure", c->rank);
  ncclDataType_t type = ncclFloat32;
  WK_TRY(nccl_dtype(dtype, &type));
  int64_t deadline = net_deadline(timeout_ms);
  ABORT_ON_FAILURE(c, launch(c, kind, out, in, count, type, op, root, stream));
  WK_TRY(settle(c, deadline, "collective launch"));
  ABORT_ON_FAILURE(c, cuda_record_done(c));
  ABORT_ON_FAILURE(c, wait_done(c, deadline));
  return WK_OK;
}
