/*
 * comm.c — WkDist, the one interface every collective goes through.
 *
 * A process group is the world (world.c), the store (rank 0 serves it, every rank is a client),
 * a Gloo context for CPU tensors and, on the first collective over a CUDA tensor, an NCCL
 * communicator (its unique id exchanged through the store). A world of 1 has none of these: its
 * collectives are local copies.
 *
 * Every collective gets the next sequence number of the group. As it starts, a rank records its
 * sequence number, the collective's name and size and the calling recipe line in memory; the
 * group's progress thread posts that record to the store (fire and forget) whenever it changed,
 * at most every PROGRESS_INTERVAL_MS: the collectives themselves make no store traffic, rank 0's
 * store sees a bounded rate whatever the world size, and a posted record is at most that stale.
 * When a collective fails or times out, report.c reads the others' records to name the ranks
 * that are missing. After a failure the group is unusable: every later collective fails at once
 * with the first report.
 *
 * Asynchronous all-reduces (gradient buckets during the backward pass) run on one worker thread,
 * in the order they were started; a synchronous collective first waits for every queued one, so
 * all ranks run collectives in the same order whatever the timing. The worker never calls Lua.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../tensor/tensor.h"
#include "dist.h"

enum {
  SITE_CAPACITY = 256,
  MESSAGE_CAPACITY = 1024,
  CLOSE_BYE_GRACE_MS = 1000, /* minimum time rank 0 keeps serving for the others to say bye */
  FAILED_SERVE_MS = 3000,    /* after a failure: long enough for the others' hang reports */
  PROGRESS_INTERVAL_MS = 20, /* the progress thread posts at most this often */
  PROGRESS_POST_CAPACITY = SITE_CAPACITY + 128
};

static const char GLOO_PREFIX[] = "wick/gloo/";
static const char NCCL_ID_KEY[] = "wick/nccl/id";

typedef struct {
  CollectiveKind kind;
  WkTensor *out;        /* all_reduce and broadcast: in place (out == in) */
  const WkTensor *in;
  WkReduceOp op;
  int root;
  void *stream;         /* the caller's CUDA stream when it started (NULL: default) */
  DistProgress progress;
  char site[SITE_CAPACITY];
} Collective;

struct WkWork {
  WkDist *dist;
  Collective c;
  bool done;
  WkStatus status;
  char message[MESSAGE_CAPACITY];
  WkWork *next;         /* in the worker's queue */
};

struct WkDist {
  WkWorld world;
  int64_t timeout_ms;
  WkStoreServer *server;
  WkStore *store;
  GlooGroup *gloo;
  NcclGroup *nccl;
  uint64_t seq;                       /* of the last collective started */
  bool failed;
  WkStatus failure_status;
  char failure[MESSAGE_CAPACITY];
  WkDistStats stats;
  /* the progress thread: posts `progress` when `progress_version` passed `posted_version` */
  pthread_t progress_thread;
  bool progress_started, progress_stop, progress_idle;
  pthread_mutex_t progress_lock;
  pthread_cond_t progress_changed;
  DistProgress progress;
  char progress_site[SITE_CAPACITY];
  uint64_t progress_version, posted_version;
  /* the worker */
  pthread_t worker;
  bool worker_started, worker_stop;
  pthread_mutex_t lock;
  pthread_cond_t changed;
  WkWork *head, *tail;                /* queued, not started */
  bool running;                       /* the worker is inside a collective */
};

/* ---- progress --------------------------------------------------------------------------------- */

/* Sleeps until the record changes (no wakeups while the group is idle), posts it, then rests
 * PROGRESS_INTERVAL_MS before looking again; on stop, posts what is left. */
static void *progress_loop(void *arg) {
  WkDist *d = arg;
  char key[sizeof DIST_PROGRESS_KEY + 16], post[PROGRESS_POST_CAPACITY];
  snprintf(key, sizeof key, DIST_PROGRESS_KEY "%d", d->world.rank);
  pthread_mutex_lock(&d->progress_lock);
  for (;;) {
    d->progress_idle = true;
    while (!d->progress_stop && d->progress_version == d->posted_version)
      pthread_cond_wait(&d->progress_changed, &d->progress_lock);
    d->progress_idle = false;
    if (d->progress_version != d->posted_version) {
      int length = dist_format_progress(post, sizeof post, &d->progress);
      d->posted_version = d->progress_version;
      pthread_mutex_unlock(&d->progress_lock);
      if (store_post(d->store, key, post, (size_t)length) != WK_OK)
        wk_logf(WK_LOG_DEBUG, "posting progress: %s", wk_last_error()); /* the collectives will tell */
      pthread_mutex_lock(&d->progress_lock);
    }
    if (d->progress_stop) break;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += PROGRESS_INTERVAL_MS * 1000000L;
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    while (!d->progress_stop && pthread_cond_timedwait(&d->progress_changed, &d->progress_lock, &until) == 0) {}
  }
  pthread_mutex_unlock(&d->progress_lock);
  return NULL;
}

static void record_progress(WkDist *d, const DistProgress *p) {
  pthread_mutex_lock(&d->progress_lock);
  d->progress = *p;
  snprintf(d->progress_site, sizeof d->progress_site, "%s", p->site);
  d->progress.site = d->progress_site;
  d->progress_version++;
  if (d->progress_idle) pthread_cond_signal(&d->progress_changed); /* resting: it looks again soon */
  pthread_mutex_unlock(&d->progress_lock);
}

/* ---- init and close ----------------------------------------------------------------------------- */

static void destroy_sync(WkDist *d) {
  pthread_cond_destroy(&d->changed);
  pthread_mutex_destroy(&d->lock);
  pthread_cond_destroy(&d->progress_changed);
  pthread_mutex_destroy(&d->progress_lock);
}

static WkStatus check_world(const WkWorld *w) {
  if (!w) return WK_FAIL(WK_ERR_INVALID_ARG, "wk_dist_init: world is NULL");
  if (w->world_size < 1 || w->rank < 0 || w->rank >= w->world_size)
    return WK_FAIL(WK_ERR_INVALID_ARG, "wk_dist_init: rank %d of a world of %d", w->rank, w->world_size);
  if (w->local_world_size < 1 || w->local_rank < 0 || w->local_rank >= w->local_world_size)
    return WK_FAIL(WK_ERR_INVALID_ARG, "wk_dist_init: local rank %d of %d", w->local_rank, w->local_world_size);
  if (w->world_size > 1 && (memchr(w->master_addr, '\0', sizeof w->master_addr) == NULL || !w->master_addr[0] ||
                            w->master_port < 1 || w->master_port > UINT16_MAX))
    return WK_FAIL(WK_ERR_INVALID_ARG, "wk_dist_init: a world of %d needs MASTER_ADDR and a MASTER_PORT in 1..65535",
                   w->world_size);
  return WK_OK;
}

WkDist *wk_dist_init(const WkWorld *world, int64_t timeout_ms) {
  if (check_world(world) != WK_OK) return NULL;
  if (timeout_ms < 1 || timeout_ms > STORE_MAX_TIMEOUT_MS) {
    WK_FAIL(WK_ERR_INVALID_ARG, "wk_dist_init: timeout %" PRId64 " ms out of range 1..%" PRId64, timeout_ms,
            STORE_MAX_TIMEOUT_MS);
    return NULL;
  }
  WkDist *d = wk_calloc(1, sizeof *d, "process group");
  if (!d) return NULL;
  d->world = *world;
  d->timeout_ms = timeout_ms;
  pthread_mutex_init(&d->lock, NULL);
  pthread_cond_init(&d->changed, NULL);
  pthread_mutex_init(&d->progress_lock, NULL);
  pthread_cond_init(&d->progress_changed, NULL);
  if (world->world_size == 1) return d; /* alone: no socket at all */
  const WkWorld *w = world;
  if (w->rank == 0) {
    d->server = wk_store_server_start(w->master_addr, w->master_port, w->world_size);
    if (!d->server) goto fail;
  }
  d->store = wk_store_connect(w->master_addr, w->master_port, w->rank, w->world_size, timeout_ms);
  if (!d->store) goto fail;
  sigset_t mask;
  wk_signals_block(&mask);  /* Gloo's loop thread starts here */
  d->gloo = gloo_connect(d->store, GLOO_PREFIX, w->rank, w->world_size, store_local_address(d->store), timeout_ms);
  wk_signals_restore(&mask);
  if (!d->gloo) goto fail;
  int rc = wk_thread_create(&d->progress_thread, progress_loop, d);
  if (rc != 0) {
    WK_FAIL(WK_ERR_NOMEM, "cannot start the progress thread: %s", strerror(rc));
    goto fail;
  }
  d->progress_started = true;
  return d;
fail:
  wk_error_context("rank %d of %d joining the job at %s:%d", w->rank, w->world_size, w->master_addr, w->master_port);
  {
    WkStatus status = wk_last_status();
    char message[MESSAGE_CAPACITY];
    snprintf(message, sizeof message, "%s", wk_last_error());
    gloo_free(d->gloo);
    wk_store_close(d->store);
    wk_store_server_stop(d->server, 0);
    destroy_sync(d);
    free(d);
    WK_FAIL(status, "%s", message);
  }
  return NULL;
}

static void stop_progress(WkDist *d) {
  if (!d->progress_started) return;
  pthread_mutex_lock(&d->progress_lock);
  d->progress_stop = true;
  pthread_cond_broadcast(&d->progress_changed);
  pthread_mutex_unlock(&d->progress_lock);
  pthread_join(d->progress_thread, NULL);
  d->progress_started = false;
}

static void stop_worker(WkDist *d) {
  pthread_mutex_lock(&d->lock);
  d->worker_stop = true;
  pthread_cond_broadcast(&d->changed);
  pthread_mutex_unlock(&d->lock);
  if (d->worker_started) pthread_join(d->worker, NULL);
  d->worker_started = false;
}

void wk_dist_close(WkDist *d) {
  if (!d) return;
  stop_worker(d); /* runs what was queued first */
  stop_progress(d); /* posts the last record first */
  if (d->nccl) nccl_group_free(d->nccl);
  wk_store_close(d->store); /* bye: the others' reports tell a closed rank from a lost one */
  if (d->server) {
    /* Serve until the others leave: all of the timeout normally, a few seconds after a failure
     * (the others only need the store for their reports then). */
    int64_t grace = d->timeout_ms > CLOSE_BYE_GRACE_MS ? d->timeout_ms : CLOSE_BYE_GRACE_MS;
    if (d->failed && grace > FAILED_SERVE_MS) grace = FAILED_SERVE_MS;
    wk_store_server_stop(d->server, grace);
  }
  gloo_free(d->gloo);
  destroy_sync(d);
  free(d);
}

WkStore *wk_dist_store(WkDist *d) { return d ? d->store : NULL; }

void wk_dist_stats(const WkDist *d, WkDistStats *out) {
  if (!out) return;
  *out = d ? d->stats : (WkDistStats){0};
}

/* ---- running one collective --------------------------------------------------------------------- */

static WkStatus open_nccl(WkDist *d, int device_index) {
  if (d->nccl) return WK_OK;
  WkStatus st = nccl_group_open(d->store, NCCL_ID_KEY, d->world.rank, d->world.world_size, device_index,
                                d->timeout_ms, &d->nccl);
  if (st != WK_OK) wk_error_context("NCCL for cuda:%d", device_index);
  return st;
}

/* ---- the collectives, described once ------------------------------------------------------------ */

/* How a collective's tensors relate: one tensor reduced or sent in place, an output holding world_size
 * times the input (gathers) or the reverse (scatters), or none (the barrier). */
typedef enum { IN_PLACE, GATHERS, SCATTERS, NO_TENSOR } CollectiveShape;

/* Runs a collective over Gloo; count is the elements each rank ends with. */
typedef WkStatus (*GlooRun)(WkDist *d, const Collective *c, size_t count, WkDType dtype, uint32_t tag);

typedef struct {
  const char *name;       /* in progress records, hang reports and every message */
  CollectiveShape shape;  /* what is checked, what a world of one copies, what count each rank ends with */
  bool reduces;           /* takes a WkReduceOp */
  GlooRun gloo;
} CollectiveSpec;

/* AVG is reduced as SUM; the division happens once every contribution is in. */
static void finish_average(WkDist *d, const Collective *c, size_t count, WkDType dtype) {
  if (c->op == WK_REDUCE_AVG) dist_finish_average(tensor_ptr(c->out), count, dtype, d->world.world_size);
}

static WkStatus gloo_run_all_reduce(WkDist *d, const Collective *c, size_t count, WkDType dtype, uint32_t tag) {
  WK_TRY(gloo_all_reduce(d->gloo, tensor_ptr(c->out), count, dtype, c->op, tag, d->timeout_ms));
  finish_average(d, c, count, dtype);
  return WK_OK;
}

static WkStatus gloo_run_broadcast(WkDist *d, const Collective *c, size_t count, WkDType dtype, uint32_t tag) {
  return gloo_broadcast(d->gloo, tensor_ptr(c->out), count * wk_dtype_size(dtype), c->root, tag, d->timeout_ms);
}

static WkStatus gloo_run_all_gather(WkDist *d, const Collective *c, size_t count, WkDType dtype, uint32_t tag) {
  return gloo_all_gather(d->gloo, tensor_ptr(c->out), tensor_ptr(c->in), count * wk_dtype_size(dtype), tag,
                         d->timeout_ms);
}

static WkStatus gloo_run_reduce_scatter(WkDist *d, const Collective *c, size_t count, WkDType dtype, uint32_t tag) {
  WK_TRY(gloo_reduce_scatter(d->gloo, tensor_ptr(c->out), tensor_ptr(c->in), count, dtype, c->op, tag,
                             d->timeout_ms));
  finish_average(d, c, count, dtype);
  return WK_OK;
}

static WkStatus gloo_run_barrier(WkDist *d, const Collective *c, size_t count, WkDType dtype, uint32_t tag) {
  (void)c, (void)count, (void)dtype;
  return gloo_barrier(d->gloo, tag, d->timeout_ms);
}

static const CollectiveSpec COLLECTIVES[] = {
    [COLL_ALL_REDUCE] = {"all_reduce", IN_PLACE, true, gloo_run_all_reduce},
    [COLL_BROADCAST] = {"broadcast", IN_PLACE, false, gloo_run_broadcast},
    [COLL_ALL_GATHER] = {"all_gather", GATHERS, false, gloo_run_all_gather},
    [COLL_REDUCE_SCATTER] = {"reduce_scatter", SCATTERS, true, gloo_run_reduce_scatter},
    [COLL_BARRIER] = {"barrier", NO_TENSOR, false, gloo_run_barrier},
};

_Static_assert(sizeof COLLECTIVES / sizeof COLLECTIVES[0] == COLL_BARRIER + 1, "every collective is described");

static const char *kind_name(CollectiveKind kind) { return COLLECTIVES[kind].name; }

/* The elements each rank ends with: a scatter leaves each its world_size-th of the input. */
static size_t rank_count(const WkDist *d, const Collective *c) {
  size_t count = c->in ? (size_t)wk_tensor_numel(c->in) : 0;
  return COLLECTIVES[c->kind].shape == SCATTERS ? count / (size_t)d->world.world_size : count;
}

/* The world-1 collectives: everything is already reduced, only gathers and scatters copy. */
static WkStatus run_alone(const Collective *c) {
  CollectiveShape shape = COLLECTIVES[c->kind].shape;
  if (shape == GATHERS || shape == SCATTERS) return wk_tensor_copy(c->out, c->in);
  return WK_OK;
}

static WkStatus run_gloo(WkDist *d, const Collective *c, uint32_t tag) {
  return COLLECTIVES[c->kind].gloo(d, c, rank_count(d, c), c->in ? c->in->dtype : WK_U8, tag);
}

static WkStatus run_nccl(WkDist *d, const Collective *c) {
  WK_TRY(open_nccl(d, wk_tensor_device_index(c->in)));
  return nccl_group_run(d->nccl, c->kind, tensor_ptr(c->out), tensor_ptr(c->in), rank_count(d, c), c->in->dtype,
                        c->op, c->root, c->stream, d->timeout_ms);
}

/* Runs c (on the caller's thread or the worker) and turns a failure into the hang report. */
static WkStatus execute(WkDist *d, Collective *c) {
  if (d->world.world_size == 1) return run_alone(c);
  if (c->progress.numel == 0 && COLLECTIVES[c->kind].shape != NO_TENSOR) return WK_OK; /* every rank skips it alike */
  record_progress(d, &c->progress);
  uint64_t start = wk_now_ns();
  bool cuda = c->in && tensor_device(c->in) == WK_DEVICE_CUDA;
  WkStatus st = cuda ? run_nccl(d, c) : run_gloo(d, c, (uint32_t)c->progress.seq);
  if (st == WK_OK || st == WK_ERR_INVALID_ARG || st == WK_ERR_UNSUPPORTED || st == WK_ERR_NOMEM) return st;
  return dist_report_failure(d->store, d->world.rank, d->world.world_size, &c->progress, wk_now_ns() - start);
}

static void fail_group(WkDist *d, WkStatus status) {
  pthread_mutex_lock(&d->lock);
  if (!d->failed) {
    d->failed = true;
    d->failure_status = status;
    snprintf(d->failure, sizeof d->failure, "%s", wk_last_error());
  }
  pthread_mutex_unlock(&d->lock);
}

/* ---- the worker --------------------------------------------------------------------------------- */

static void *work_loop(void *arg) {
  WkDist *d = arg;
  pthread_mutex_lock(&d->lock);
  for (;;) {
    while (!d->head && !d->worker_stop) pthread_cond_wait(&d->changed, &d->lock);
    WkWork *w = d->head;
    if (!w) break; /* stopping, and nothing left */
    d->head = w->next;
    if (!d->head) d->tail = NULL;
    d->running = true;
    bool failed = d->failed;
    pthread_mutex_unlock(&d->lock);
    WkStatus st;
    if (failed) {
      st = WK_FAIL(d->failure_status, "%s", d->failure);
    } else {
      st = execute(d, &w->c);
      if (st != WK_OK) fail_group(d, st);
    }
    pthread_mutex_lock(&d->lock);
    w->status = st;
    if (st != WK_OK) snprintf(w->message, sizeof w->message, "%s", wk_last_error());
    w->done = true;
    d->running = false;
    pthread_cond_broadcast(&d->changed);
  }
  pthread_mutex_unlock(&d->lock);
  return NULL;
}

/* Waits until the worker has run everything queued (called before a synchronous collective). */
static void drain(WkDist *d) {
  if (!d->worker_started) return;
  pthread_mutex_lock(&d->lock);
  while (d->head || d->running) pthread_cond_wait(&d->changed, &d->lock);
  pthread_mutex_unlock(&d->lock);
}

/* ---- checking and starting ---------------------------------------------------------------------- */

static WkStatus check_tensor(const WkTensor *t, const char *what, const char *name) {
  if (!t) return WK_FAIL(WK_ERR_INVALID_ARG, "%s: %s tensor is NULL", name, what);
  char text[128];
  if (!wk_tensor_is_contiguous(t))
    return WK_FAIL(WK_ERR_INVALID_ARG, "%s: %s tensor %s is not contiguous (use :contiguous())", name, what,
                   wk_tensor_describe(t, text, sizeof text));
  if (!dist_dtype_supported(t->dtype))
    return WK_FAIL(WK_ERR_INVALID_ARG, "%s: %s tensor %s: collectives take f32, bf16, f16, i32, i64 or u8", name, what,
                   wk_tensor_describe(t, text, sizeof text));
  return WK_OK;
}

static WkStatus check_pair(const WkTensor *out, const WkTensor *in, int64_t out_factor, int64_t in_factor,
                           const char *name) {
  WK_TRY(check_tensor(out, "output", name));
  WK_TRY(check_tensor(in, "input", name));
  char a[128], b[128];
  if (out->dtype != in->dtype || tensor_device(out) != tensor_device(in) ||
      wk_tensor_device_index(out) != wk_tensor_device_index(in) ||
      wk_tensor_numel(out) * in_factor != wk_tensor_numel(in) * out_factor)
    return WK_FAIL(WK_ERR_INVALID_ARG, "%s: output %s and input %s do not fit (same dtype and device; the %s holds "
                   "world_size times the elements of the %s)", name, wk_tensor_describe(out, a, sizeof a),
                   wk_tensor_describe(in, b, sizeof b), out_factor > 1 ? "output" : "input",
                   out_factor > 1 ? "input" : "output");
  if (wk_tensor_same_storage(out, in)) return WK_FAIL(WK_ERR_INVALID_ARG, "%s: output and input share storage", name);
  return WK_OK;
}

static WkStatus check_group(WkDist *d, const char *name) {
  if (!d) return WK_FAIL(WK_ERR_INVALID_ARG, "%s: the process group is NULL", name);
  if (d->failed)
    return WK_FAIL(d->failure_status, "%s: the process group failed earlier and cannot be used: %s", name, d->failure);
  return WK_OK;
}

static WkStatus check_op(WkReduceOp op, const char *name) {
  if ((int)op < WK_REDUCE_SUM || (int)op > WK_REDUCE_MIN)
    return WK_FAIL(WK_ERR_INVALID_ARG, "%s: unknown reduction %d (sum, avg, max, min)", name, (int)op);
  return WK_OK;
}

/* The caller's current stream on the device of c's tensor (NCCL waits for the work queued on it). */
static void *caller_stream(const Collective *c) {
  if (!c->in || tensor_device(c->in) != WK_DEVICE_CUDA) return NULL;
  WkStream *stream = wk_stream_current_on(c->in->storage->device_index);
  return stream ? stream->handle : NULL;
}

/* Gives c its sequence number and progress record. */
static void number(WkDist *d, Collective *c, const char *site) {
  c->progress.seq = ++d->seq;
  c->progress.name = kind_name(c->kind);
  c->progress.numel = c->in ? wk_tensor_numel(c->in) : 0;
  c->progress.dtype = c->in ? c->in->dtype : WK_U8;
  snprintf(c->site, sizeof c->site, "%s", site ? site : "");
  c->progress.site = c->site;
  d->stats.collectives++;
  if (c->in) d->stats.bytes += (uint64_t)c->progress.numel * wk_dtype_size(c->in->dtype);
}

static WkStatus run_now(WkDist *d, Collective *c, const char *site) {
  uint64_t start = wk_now_ns();
  drain(d);
  WkStatus st = check_group(d, kind_name(c->kind)); /* a queued collective may just have failed */
  if (st == WK_OK) {
    number(d, c, site);
    c->stream = caller_stream(c);
    st = execute(d, c);
    if (st != WK_OK && d->world.world_size > 1 && st != WK_ERR_INVALID_ARG) fail_group(d, st);
  }
  d->stats.wait_ns += wk_now_ns() - start;
  return st;
}

/* What every collective checks before it is numbered: the group, its tensors (by shape), its reduction. */
static WkStatus check_collective(WkDist *d, const Collective *c) {
  const CollectiveSpec *spec = &COLLECTIVES[c->kind];
  WK_TRY(check_group(d, spec->name));
  int64_t world = d->world.world_size;
  if (spec->shape == IN_PLACE) WK_TRY(check_tensor(c->in, "the", spec->name));
  if (spec->shape == GATHERS) WK_TRY(check_pair(c->out, c->in, world, 1, spec->name));
  if (spec->shape == SCATTERS) WK_TRY(check_pair(c->out, c->in, 1, world, spec->name));
  if (spec->reduces) WK_TRY(check_op(c->op, spec->name));
  return WK_OK;
}

static WkStatus run_checked(WkDist *d, Collective *c, const char *site) {
  WK_TRY(check_collective(d, c));
  return run_now(d, c, site);
}

WkStatus wk_dist_all_reduce(WkDist *d, WkTensor *t, WkReduceOp op, const char *site) {
  return run_checked(d, &(Collective){.kind = COLL_ALL_REDUCE, .out = t, .in = t, .op = op}, site);
}

WkStatus wk_dist_broadcast(WkDist *d, WkTensor *t, int root, const char *site) {
  Collective c = {.kind = COLL_BROADCAST, .out = t, .in = t, .root = root};
  WK_TRY(check_collective(d, &c));
  if (root < 0 || root >= d->world.world_size)
    return WK_FAIL(WK_ERR_INVALID_ARG, "broadcast: root %d is not a rank of this world of %d", root, d->world.world_size);
  return run_now(d, &c, site);
}

WkStatus wk_dist_all_gather(WkDist *d, WkTensor *out, const WkTensor *t, const char *site) {
  return run_checked(d, &(Collective){.kind = COLL_ALL_GATHER, .out = out, .in = t}, site);
}

WkStatus wk_dist_reduce_scatter(WkDist *d, WkTensor *out, const WkTensor *t, WkReduceOp op, const char *site) {
  return run_checked(d, &(Collective){.kind = COLL_REDUCE_SCATTER, .out = out, .in = t, .op = op}, site);
}

WkStatus wk_dist_barrier(WkDist *d, const char *site) {
  return run_checked(d, &(Collective){.kind = COLL_BARRIER}, site);
}

/* Queues c, checked as the blocking collective checks it, on the group's worker (started on first
 * use) and returns at once. */
static WkWork *start(WkDist *d, Collective c, const char *site) {
  if (check_collective(d, &c) != WK_OK) return NULL;
  WkWork *w = wk_calloc(1, sizeof *w, "asynchronous collective");
  if (!w) return NULL;
  w->dist = d;
  w->c = c;
  number(d, &w->c, site);
  w->c.stream = caller_stream(&w->c);
  if (d->world.world_size == 1) { /* nothing to wait for, a copy at most */
    w->status = run_alone(&w->c);
    if (w->status != WK_OK) snprintf(w->message, sizeof w->message, "%s", wk_last_error());
    w->done = true;
    return w;
  }
  pthread_mutex_lock(&d->lock);
  if (!d->worker_started) {
    int rc = wk_thread_create(&d->worker, work_loop, d);
    if (rc != 0) {
      pthread_mutex_unlock(&d->lock);
      free(w);
      WK_FAIL(WK_ERR_NOMEM, "%s: cannot start the collectives' worker thread: %s", kind_name(c.kind), strerror(rc));
      return NULL;
    }
    d->worker_started = true;
  }
  if (d->tail) d->tail->next = w;
  else d->head = w;
  d->tail = w;
  pthread_cond_broadcast(&d->changed);
  pthread_mutex_unlock(&d->lock);
  return w;
}

WkWork *wk_dist_all_reduce_start(WkDist *d, WkTensor *t, WkReduceOp op, const char *site) {
  return start(d, (Collective){.kind = COLL_ALL_REDUCE, .out = t, .in = t, .op = op}, site);
}

WkWork *wk_dist_all_gather_start(WkDist *d, WkTensor *out, const WkTensor *t, const char *site) {
  return start(d, (Collective){.kind = COLL_ALL_GATHER, .out = out, .in = t}, site);
}

WkWork *wk_dist_reduce_scatter_start(WkDist *d, WkTensor *out, const WkTensor *t, WkReduceOp op, const char *site) {
  return start(d, (Collective){.kind = COLL_REDUCE_SCATTER, .out = out, .in = t, .op = op}, site);
}

WkStatus wk_work_wait(WkWork *w) {
  if (!w) return WK_FAIL(WK_ERR_INVALID_ARG, "wk_work_wait: work is NULL");
  WkDist *d = w->dist;
  uint64_t start = wk_now_ns();
  pthread_mutex_lock(&d->lock);
  while (!w->done) pthread_cond_wait(&d->changed, &d->lock);
  pthread_mutex_unlock(&d->lock);
  d->stats.wait_ns += wk_now_ns() - start;
  WkStatus st = w->status;
  if (st != WK_OK) WK_FAIL(st, "%s", w->message);
  free(w);
  return st;
}
