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
 * Trust: a named region is another process's memory, so only this user's own can be mapped. Names are
 * a keyed hash of the job's secret, the user and the job (another user cannot predict one and plant it
 * first), and a region opened by name must be a regular file of this user with mode 0600 (fstat after
 * the open), else it is refused naming the file and its owner.
 *
 * Reclaiming: every process that maps a region holds a shared OFD lock on its file, which the kernel
 * drops when the process ends however it ends (kill -9, a Lua error without close): no pid to outlive
 * it or be reused. A process that opens a region first removes this user's regions that nobody holds
 * (it can lock them exclusively), and the launcher removes its job's regions when the job is over.
 *
 * Creation: the first process creates the file (O_EXCL) at its full size, reserves the pages of its
 * first `reserved` bytes (posix_fallocate), maps it and calls the caller's init before publishing
 * `ready`; later processes map it and wait for `ready`. The rest is reserved piece by piece as the
 * caller first uses it (wk_shared_reserve): a too-small /dev/shm is then a clear error, never a
 * SIGBUS, and a large region costs nothing at open.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <pwd.h>     /* getpwuid_r: the owner of a refused region, by name */
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

#include "secret.h"  /* wk_job_secret, wk_hmac_sha256: the regions' names */
#include "shared.h"

enum {
  READY_MAGIC = 0x57434b52,   /* "WCKR": the creator finished initializing */
  OPEN_WAIT_MS = 5000,        /* how long a later process waits for the creator */
  OPEN_POLL_US = 1000,
  JOB_TAG_BYTES = 12,         /* of the keyed hash: the job's part of a name ... */
  SEGMENT_TAG_BYTES = 8,      /* ... and the region's */
  JOB_ID_CAPACITY = 256,
  KEYED_MESSAGE_CAPACITY = 640,
};

static const char SHM_DIR[] = "/dev/shm";

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

/* Marks this process as a holder (see the top of the file); WK_ERR_CLOSED when the name was removed
 * meanwhile (a reclaimer took the file just before the lock): the caller starts over. */
static WkStatus hold(int fd, const char *name) {
  struct flock lock = {.l_type = F_RDLCK, .l_whence = SEEK_SET};
  while (fcntl(fd, F_OFD_SETLKW, &lock) != 0)
    if (errno != EINTR) return fail_shared("lock", name);
  struct stat st;
  if (fstat(fd, &st) != 0) return fail_shared("stat", name);
  return st.st_nlink > 0 ? WK_OK : WK_ERR_CLOSED;
}

static void owner_name(uid_t uid, char *out, size_t capacity) {
  struct passwd entry, *found = NULL;
  char buffer[1024];
  if (getpwuid_r(uid, &entry, buffer, sizeof buffer, &found) == 0 && found)
    snprintf(out, capacity, "'%s' (uid %u)", found->pw_name, (unsigned)uid);
  else
    snprintf(out, capacity, "uid %u", (unsigned)uid);
}

/* A region made by someone else is not mapped: its maker could read and change what the ranks read. */
static WkStatus check_owner(int fd, const char *name) {
  struct stat st;
  if (fstat(fd, &st) != 0) return fail_shared("stat", name);
  if (S_ISREG(st.st_mode) && st.st_uid == geteuid() && (st.st_mode & 07777) == 0600) return WK_OK;
  char owner[320];
  owner_name(st.st_uid, owner, sizeof owner);
  return WK_FAIL(WK_ERR_IO, "refusing shared memory '/dev/shm%s': owned by %s with mode %04o, not by this user (uid "
                 "%u) with mode 0600; someone else made it under this job's name: remove it", name, owner,
                 (unsigned)(st.st_mode & 07777), (unsigned)geteuid());
}

static WkStatus create_named(const char *name, size_t bytes, size_t reserved, WkSharedInit init, void *ctx,
                             WkSharedRegion *out) {
  int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return errno == EEXIST ? WK_ERR_CLOSED : fail_shared("create", name);
  WkStatus status = hold(fd, name);
  if (status == WK_ERR_CLOSED) { /* a reclaimer removed it before our lock: the name is free again */
    close(fd);
    return WK_ERR_CLOSED;
  }
  if (status == WK_OK) status = fchmod(fd, 0600) == 0 ? WK_OK : fail_shared("chmod", name); /* whatever the umask */
  if (status == WK_OK) status = ftruncate(fd, (off_t)bytes) == 0 ? WK_OK : fail_shared("size", name);
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
  WkStatus status = check_owner(fd, name); /* before the lock: a stranger's lock must not stall us */
  if (status == WK_OK) status = hold(fd, name);
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

/* ---- reclaiming ---------------------------------------------------------------------------------- */

static bool own_regular(const struct stat *st) { return S_ISREG(st->st_mode) && st->st_uid == geteuid(); }

/* Removes /dev/shm/<entry> when it is this user's and no process holds it (we get the exclusive lock). */
static bool remove_if_unheld(const char *entry) {
  char path[WK_SHARED_NAME_CAPACITY + sizeof SHM_DIR];
  snprintf(path, sizeof path, "%s/%s", SHM_DIR, entry);
  struct stat before, now;
  if (lstat(path, &before) != 0 || !own_regular(&before)) return false; /* never open another user's file */
  int fd = open(path, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  struct flock lock = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
  bool unheld = fstat(fd, &before) == 0 && own_regular(&before) && fcntl(fd, F_OFD_SETLK, &lock) == 0;
  /* Still the file we locked (not one made since under the same name), then gone. */
  bool removed = unheld && lstat(path, &now) == 0 && now.st_ino == before.st_ino && unlink(path) == 0;
  if (close(fd) != 0) wk_logf(WK_LOG_DEBUG, "close %s: %s", path, strerror(errno));
  return removed;
}

/* "wick-UID-": every region of this user starts so. */
static void user_prefix(char *out, size_t capacity) { snprintf(out, capacity, "wick-%u-", (unsigned)geteuid()); }

static bool hex_digits(const char *text, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!((text[i] >= '0' && text[i] <= '9') || (text[i] >= 'a' && text[i] <= 'f'))) return false;
  return true;
}

/* A name wk_shared_job_name makes for this user: the prefix, the job's tag, '-', the region's tag. */
static bool region_name(const char *entry, const char *prefix) {
  size_t n = strlen(prefix);
  if (strncmp(entry, prefix, n) != 0) return false;
  const char *job = entry + n, *region = job + 2 * JOB_TAG_BYTES + 1;
  return strlen(job) == 2 * (JOB_TAG_BYTES + SEGMENT_TAG_BYTES) + 1 && hex_digits(job, 2 * JOB_TAG_BYTES) &&
         job[2 * JOB_TAG_BYTES] == '-' && hex_digits(region, 2 * SEGMENT_TAG_BYTES);
}

/* Calls visit on every name in /dev/shm that starts with prefix and is a region's name; returns how
 * many it returned true for. */
static WkStatus scan_regions(const char *prefix, bool (*visit)(const char *entry), int *count) {
  *count = 0;
  char user[64];
  user_prefix(user, sizeof user);
  DIR *dir = opendir(SHM_DIR);
  if (!dir) return WK_FAIL_ERRNO("list", SHM_DIR);
  struct dirent *entry;
  while ((entry = readdir(dir)) != NULL)
    if (strncmp(entry->d_name, prefix, strlen(prefix)) == 0 && region_name(entry->d_name, user) && visit(entry->d_name))
      (*count)++;
  closedir(dir);
  return WK_OK;
}

/* Once per process, before its first region: this user's regions of jobs that ended without removing
 * them (every holder killed, or gone without closing). */
static void reclaim_dead(void) {
  char prefix[64];
  int removed;
  user_prefix(prefix, sizeof prefix);
  if (scan_regions(prefix, remove_if_unheld, &removed) != WK_OK)
    wk_logf(WK_LOG_DEBUG, "shared memory of dead jobs is not reclaimed: %s", wk_last_error());
  else if (removed > 0)
    wk_logf(WK_LOG_INFO, "removed %d shared memory regions of jobs that had ended", removed);
}

static bool remove_own(const char *entry) {
  char path[WK_SHARED_NAME_CAPACITY + sizeof SHM_DIR];
  snprintf(path, sizeof path, "%s/%s", SHM_DIR, entry);
  struct stat st;
  if (lstat(path, &st) != 0 || !own_regular(&st)) return false;
  if (unlink(path) == 0) return true;
  wk_logf(WK_LOG_WARN, "cannot remove %s: %s", path, strerror(errno));
  return false;
}

/* ---- names ---------------------------------------------------------------------------------------- */

/* Hex of the first `bytes` bytes of HMAC-SHA256 keyed by the job's secret (empty when the job has none:
 * then only the owner check protects) over this user's id, the job's id and `what` ("" for the job's
 * part of a name). */
static WkStatus keyed_tag(const char *job, const char *what, size_t bytes, char *hex) {
  const uint8_t *secret;
  size_t secret_length;
  WK_TRY(wk_job_secret(&secret, &secret_length));
  char message[KEYED_MESSAGE_CAPACITY];
  int n = snprintf(message, sizeof message, "wick shared memory%c%u%c%s%c%s", 0, (unsigned)geteuid(), 0, job, 0, what);
  if (n < 0 || (size_t)n >= sizeof message) return WK_FAIL(WK_ERR_INVALID_ARG, "job id '%s' is too long", job);
  uint8_t digest[WK_HMAC_BYTES];
  wk_hmac_sha256(secret, secret_length, message, (size_t)n, digest);
  for (size_t i = 0; i < bytes; i++) snprintf(hex + 2 * i, 3, "%02x", digest[i]);
  return WK_OK;
}

/* "wick-UID-JOBTAG-": what every region of the job starts with. */
static WkStatus job_prefix(const char *job, char *out, size_t capacity) {
  char tag[2 * JOB_TAG_BYTES + 1];
  WK_TRY(keyed_tag(job, "", JOB_TAG_BYTES, tag));
  snprintf(out, capacity, "wick-%u-%s-", (unsigned)geteuid(), tag);
  return WK_OK;
}

WkStatus wk_shared_job_name(const char *what, char out[WK_SHARED_NAME_CAPACITY], bool *shared) {
  char job[JOB_ID_CAPACITY], prefix[64], tag[2 * SEGMENT_TAG_BYTES + 1];
  *shared = wk_node_job_id(job, sizeof job);
  if (!*shared) return WK_OK;
  WK_TRY(job_prefix(job, prefix, sizeof prefix));
  WK_TRY(keyed_tag(job, what, SEGMENT_TAG_BYTES, tag));
  snprintf(out, WK_SHARED_NAME_CAPACITY, "/%s%s", prefix, tag);
  return WK_OK;
}

WkStatus wk_shared_remove_job(const char *job) {
  char prefix[64];
  int removed;
  WK_TRY(job_prefix(job, prefix, sizeof prefix));
  return scan_regions(prefix, remove_own, &removed);
}

/* ---- regions -------------------------------------------------------------------------------------- */

WkStatus wk_shared_open(const char *name, size_t bytes, size_t reserved, WkSharedInit init, void *ctx,
                        WkSharedRegion *out) {
  static pthread_once_t reclaimed = PTHREAD_ONCE_INIT;
  pthread_once(&reclaimed, reclaim_dead);
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
  if (strlen(name) >= sizeof out->name || name[0] != '/' || strchr(name + 1, '/'))
    return WK_FAIL(WK_ERR_INVALID_ARG, "shared memory name '%s' is not '/' and a file name", name);
  snprintf(out->name, sizeof out->name, "%s", name);
  /* Create, or open what another process created; a half-made region of a creator that died (nobody
   * holds it) is removed and made again. */
  for (int attempt = 0; attempt < 3; attempt++) {
    WkStatus status = create_named(name, bytes, reserved, init, ctx, out);
    if (status != WK_ERR_CLOSED) return status;
    status = open_named(name, bytes, out);
    if (status != WK_ERR_CLOSED) return status;
    remove_if_unheld(name + 1);
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

uint64_t wk_process_start_time(int32_t pid) {
  char path[32], text[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = pid > 0 ? open(path, O_RDONLY | O_CLOEXEC) : -1;
  if (fd < 0) return 0;
  ssize_t n = read(fd, text, sizeof text - 1);
  close(fd);
  if (n <= 0) return 0;
  text[n] = '\0';
  /* "pid (name) state ... starttime ...": the name may hold anything, so fields count from its ')';
   * the start time is field 22. */
  const char *p = strrchr(text, ')');
  for (int field = 2; p && field < 22; field++) p = strchr(p + 1, ' ');
  return p ? strtoull(p + 1, NULL, 10) : 0;
}

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
