/*
 * shared.c — memory shared by the processes of one node (the local ranks of a job): a region that is
 * named in /dev/shm (or anonymous, private to one process: the same code then serves a single rank),
 * a robust process-shared mutex, and waits on a generation counter (a futex).
 *
 * Robust against kill -9: a mutex whose holder died is handed to the next locker marked "repaired",
 * so the caller can clean up what the dead process left half done; waits are futex waits with a
 * timeout (no condition variable, whose state a dead waiter could corrupt); a process's liveness is
 * checked with kill(pid, 0).
 *
 * Creation: the first process creates the file (O_EXCL) at its full size, reserves the pages of its
 * first `reserved` bytes (posix_fallocate), maps it and calls the caller's init before publishing
 * `ready`; later processes map it and wait for `ready`. The rest is reserved piece by piece as the
 * caller first uses it (wk_shared_reserve): a too-small /dev/shm is then a clear error, never a
 * SIGBUS, and a large region costs nothing at open.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>  /* getenv, atoi */
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "shared.h"

enum {
  READY_MAGIC = 0x57434b52,   /* "WCKR": the creator finished initializing */
  OPEN_WAIT_MS = 5000,        /* how long a later process waits for the creator */
  OPEN_POLL_US = 1000,
};

static WkStatus fail_shared(const char *what, const char *name) {
  return WK_FAIL(WK_ERR_IO, "%s shared memory '/dev/shm%s': %s%s", what, name, strerror(errno),
                 errno == ENOSPC ? " (/dev/shm is too small: enlarge it, e.g. docker --shm-size, or lower the cache)" : "");
}

static WkStatus map_fd(int fd, size_t bytes, const char *name, WkSharedRegion *out) {
  void *base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return fail_shared("map", name);
  out->base = base;
  out->bytes = bytes;
  out->fd = fd;
  return WK_OK;
}

WkStatus wk_shared_reserve(WkSharedRegion *r, size_t offset, size_t length) {
  if (r->fd < 0 || length == 0) return WK_OK; /* anonymous memory is not bounded by /dev/shm */
  int err = posix_fallocate(r->fd, (off_t)offset, (off_t)length);
  if (err == 0) return WK_OK;
  errno = err;
  return fail_shared("reserve", r->name);
}

static WkStatus create_named(const char *name, size_t bytes, size_t reserved, WkSharedInit init, void *ctx,
                             WkSharedRegion *out) {
  int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return errno == EEXIST ? WK_ERR_CLOSED : fail_shared("create", name);
  WkStatus status = ftruncate(fd, (off_t)bytes) == 0 ? WK_OK : fail_shared("size", name);
  if (status == WK_OK) status = map_fd(fd, bytes, name, out);
  if (status == WK_OK) status = wk_shared_reserve(out, 0, reserved);
  if (status == WK_OK) status = init(ctx, out->base);
  if (status != WK_OK) {
    wk_shared_close(out);
    if (out->fd < 0) close(fd);
    shm_unlink(name);
    return status;
  }
  atomic_store_explicit((_Atomic uint32_t *)out->base, READY_MAGIC, memory_order_release);
  out->created = true;
  return WK_OK;
}

static WkStatus open_named(const char *name, size_t bytes, WkSharedRegion *out) {
  int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return errno == ENOENT ? WK_ERR_CLOSED : fail_shared("open", name);
  WkStatus status = WK_OK;
  struct stat st;
  /* The creator may not have reserved the pages yet: wait for the size, then for `ready`. */
  for (int waited = 0; status == WK_OK; waited += OPEN_POLL_US / 1000 + 1) {
    if (fstat(fd, &st) != 0) status = fail_shared("stat", name);
    else if ((size_t)st.st_size == bytes) break;
    else if (st.st_size != 0)
      status = WK_FAIL(WK_ERR_INVALID_ARG, "shared memory '/dev/shm%s' is %lld bytes, expected %zu: another job or "
                       "another configuration uses this name", name, (long long)st.st_size, bytes);
    else if (waited > OPEN_WAIT_MS) status = WK_ERR_CLOSED; /* a creator that died: start over */
    else usleep(OPEN_POLL_US);
  }
  if (status == WK_OK) status = map_fd(fd, bytes, name, out);
  else close(fd);
  for (int waited = 0; status == WK_OK; waited++) {
    if (atomic_load_explicit((_Atomic uint32_t *)out->base, memory_order_acquire) == READY_MAGIC) return WK_OK;
    if (waited * OPEN_POLL_US / 1000 > OPEN_WAIT_MS) status = WK_ERR_CLOSED;
    else usleep(OPEN_POLL_US);
  }
  wk_shared_close(out);
  return status;
}

WkStatus wk_shared_open(const char *name, size_t bytes, size_t reserved, WkSharedInit init, void *ctx,
                        WkSharedRegion *out) {
  memset(out, 0, sizeof *out);
  out->fd = -1;
  if (bytes < sizeof(uint32_t)) return WK_FAIL(WK_ERR_INVALID_ARG, "shared region of %zu bytes is too small", bytes);
  if (!name) {
    void *base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return WK_FAIL(WK_ERR_NOMEM, "cannot map %zu bytes of memory: %s", bytes, strerror(errno));
    out->base = base;
    out->bytes = bytes;
    out->created = true;
    WkStatus status = init(ctx, base);
    if (status != WK_OK) wk_shared_close(out);
    return status;
  }
  if (strlen(name) >= sizeof out->name) return WK_FAIL(WK_ERR_INVALID_ARG, "shared memory name '%s' is too long", name);
  snprintf(out->name, sizeof out->name, "%s", name);
  /* Create, or open what another process created; a half-made region of a creator that died is
   * removed and made again. */
  for (int attempt = 0; attempt < 3; attempt++) {
    WkStatus status = create_named(name, bytes, reserved, init, ctx, out);
    if (status != WK_ERR_CLOSED) return status;
    status = open_named(name, bytes, out);
    if (status != WK_ERR_CLOSED) return status;
    shm_unlink(name);
  }
  return WK_FAIL(WK_ERR_IO, "shared memory '/dev/shm%s' could not be created or opened (another process keeps "
                 "re-creating it?)", name);
}

void wk_shared_close(WkSharedRegion *r) {
  if (r->base) munmap(r->base, r->bytes);
  if (r->fd >= 0) close(r->fd);
  r->base = NULL;
  r->fd = -1;
}

void wk_shared_unlink(WkSharedRegion *r) {
  if (r->name[0]) shm_unlink(r->name);
}

/* ---- the lock ---------------------------------------------------------------------------------- */

WkStatus wk_shared_lock_init(WkSharedLock *lock) {
  pthread_mutexattr_t attr;
  int err = pthread_mutexattr_init(&attr);
  if (!err) err = pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  if (!err) err = pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  if (!err) err = pthread_mutex_init(&lock->mutex, &attr);
  pthread_mutexattr_destroy(&attr);
  if (err) return WK_FAIL(WK_ERR_INTERNAL, "cannot make a process-shared robust mutex: %s", strerror(err));
  atomic_store(&lock->generation, 0);
  atomic_store(&lock->waiters, 0);
  return WK_OK;
}

bool wk_shared_lock(WkSharedLock *lock) {
  int err = pthread_mutex_lock(&lock->mutex);
  if (err == EOWNERDEAD) {
    pthread_mutex_consistent(&lock->mutex);
    return true;
  }
  return false;
}

void wk_shared_unlock(WkSharedLock *lock) { pthread_mutex_unlock(&lock->mutex); }

static long futex(_Atomic uint32_t *word, int op, uint32_t value, const struct timespec *timeout) {
  return syscall(SYS_futex, (uint32_t *)word, op, value, timeout, NULL, 0);
}

uint32_t wk_shared_generation(WkSharedLock *lock) { return atomic_load_explicit(&lock->generation, memory_order_acquire); }

void wk_shared_wake(WkSharedLock *lock) {
  atomic_fetch_add_explicit(&lock->generation, 1, memory_order_acq_rel);
  if (atomic_load_explicit(&lock->waiters, memory_order_acquire) > 0) futex(&lock->generation, FUTEX_WAKE, INT32_MAX, NULL);
}

void wk_shared_wait(WkSharedLock *lock, uint32_t seen, uint32_t timeout_ms) {
  struct timespec timeout = {.tv_sec = timeout_ms / 1000, .tv_nsec = (long)(timeout_ms % 1000) * 1000000L};
  atomic_fetch_add(&lock->waiters, 1);
  if (atomic_load_explicit(&lock->generation, memory_order_acquire) == seen) futex(&lock->generation, FUTEX_WAIT, seen, &timeout);
  atomic_fetch_sub(&lock->waiters, 1);
}

bool wk_process_alive(int32_t pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

bool wk_node_job_id(char *out, size_t capacity) {
  const char *local = getenv("LOCAL_WORLD_SIZE");
  if (!local || atoi(local) < 2) return false;
  const char *id = getenv("WICK_JOB_ID");
  if (!id) id = getenv("TORCHELASTIC_RUN_ID");
  if (id) return snprintf(out, capacity, "%s", id) < (int)capacity;
  const char *slurm = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
  if (slurm) return snprintf(out, capacity, "slurm-%s.%s", slurm, step ? step : "0") < (int)capacity;
  const char *addr = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT");
  if (addr && port) return snprintf(out, capacity, "%s:%s", addr, port) < (int)capacity;
  return false;
}
