/*
 * diskcache.c — the node-shared on-disk cache of remote byte ranges: entries written atomically,
 * download claims, the byte budget and eviction. The design (layout, sharing, budget, eviction order)
 * is in remote.h's opening comment; this file is its implementation.
 *
 * Locks: the usage counter is changed under an in-process mutex plus an flock on v1/usage (flock
 * alone does not exclude threads sharing one open file). Nothing under that lock waits on the network.
 * Claims are write locks on one byte each of v1/claims (open file description locks, F_OFD_SETLK: the
 * byte is a hash of the entry's key, far past the file's end, so the file stays empty), one open file
 * per claim, so they exclude threads of one process as well as other processes, and the kernel drops
 * them when their holder dies. No file is created or removed per claim: on a busy ext4, allocating an
 * inode costs more than fetching a block over loopback, and a claim file per range doubled that (two
 * keys hashing to one byte only make one wait for the other's download). The cache directory must be on
 * a local file system (flock, record locks).
 *
 * Not fsync'ed: a crash of the process never exposes a partial entry (rename), and after a power loss a
 * damaged entry fails its block checksum, is forgotten and fetched again.
 *
 * A file system that fills up before the budget does (ENOSPC, or the user's quota: EDQUOT) is not the
 * job's failure: the entry is not stored, its reader has the bytes already, and the first time a cache sees
 * it, one warning says that ranges are read through without caching.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>  /* flock */
#include <sys/stat.h>
#include <time.h>      /* nanosleep */
#include <unistd.h>

#include "../../core/shared.h" /* wk_process_alive */
#include "remote.h"

#define EVICT_LOW_WATER 0.9        /* an eviction frees down to this share of the budget */
#define WAIT_FIRST_NS 200000ull    /* polling a peer's claim: 0.2 ms, doubling ... */
#define WAIT_MAX_NS 10000000ull    /* ... up to 10 ms */
enum {
  USAGE_BYTES = 8,                 /* v1/usage: a little-endian u64 */
  SCAN_DEPTH = 8,                  /* v1/data/<hash>/<shard>/<entry>: deeper is not ours */
};
static const char LAYOUT[] = "v1";
static const char USAGE_FILE[] = "usage";
static const char CLAIMS_FILE[] = "claims";
#define CLAIM_SLOTS (1ull << 62)   /* bytes of v1/claims a key may hash to (below OFF_MAX) */
static const char TEMP_SUFFIX[] = ".tmp";

struct WkDiskCache {
  char root[WK_DISK_PATH_CAPACITY];
  char claims_path[WK_DISK_PATH_CAPACITY];
  uint64_t budget;
  int usage_fd;
  int claims_fd;        /* v1/claims, for asking whether a claim is held (never locked through) */
  pthread_mutex_t lock;
  uint64_t full_at;     /* the counter after a scan found nothing it may evict (0: none) */
  _Atomic uint64_t evicted, temp_serial;
  atomic_bool warned_full;  /* the file system's lack of room was logged */
};

/* ---- paths ---------------------------------------------------------------------------------------- */

static bool key_is_safe(const char *key) {
  if (!key[0] || key[0] == '/' || strstr(key, "..")) return false;
  for (const char *p = key; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '/' ||
          *p == '-' || *p == '_' || *p == '.'))
      return false;
  return true;
}

static WkStatus entry_path(const WkDiskCache *c, const char *key, const char *suffix, char *out) {
  if (!key_is_safe(key)) return WK_FAIL(WK_ERR_INTERNAL, "cache key '%s' is not a plain relative name", key);
  int n = snprintf(out, WK_DISK_PATH_CAPACITY, "%s/%s%s", c->root, key, suffix ? suffix : "");
  if (n < 0 || n >= WK_DISK_PATH_CAPACITY)
    return WK_FAIL(WK_ERR_INVALID_ARG, "cache path '%s/%s' is too long (use a shorter cache_dir)", c->root, key);
  return WK_OK;
}

/* mkdir -p of path's directory (path itself is a file). On failure *error is mkdir's errno. */
static WkStatus make_parents(const char *path, int *error) {
  char dir[WK_DISK_PATH_CAPACITY];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash || slash == dir) return WK_OK;
  *slash = '\0';
  for (char *p = dir + 1;; p++) {
    if (*p == '/' || *p == '\0') {
      char saved = *p;
      *p = '\0';
      if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        *error = errno;
        return WK_FAIL_ERRNO("create cache directory", dir);
      }
      *p = saved;
      if (saved == '\0') break;
    }
  }
  return WK_OK;
}

/* ---- the usage counter ---------------------------------------------------------------------------- */

static void lock_usage(WkDiskCache *c) {
  pthread_mutex_lock(&c->lock);
  while (flock(c->usage_fd, LOCK_EX) != 0 && errno == EINTR) {
  }
}

static void unlock_usage(WkDiskCache *c) {
  flock(c->usage_fd, LOCK_UN);
  pthread_mutex_unlock(&c->lock);
}

static bool read_counter(WkDiskCache *c, uint64_t *value) {
  uint8_t b[USAGE_BYTES];
  if (pread(c->usage_fd, b, sizeof b, 0) != (ssize_t)sizeof b) return false;
  uint64_t v = 0;
  for (int i = USAGE_BYTES - 1; i >= 0; i--) v = v << 8 | b[i];
  *value = v;
  return true;
}

static void write_counter(WkDiskCache *c, uint64_t value) {
  uint8_t b[USAGE_BYTES];
  for (int i = 0; i < USAGE_BYTES; i++) b[i] = (uint8_t)(value >> (8 * i));
  if (pwrite(c->usage_fd, b, sizeof b, 0) != (ssize_t)sizeof b)
    wk_logf(WK_LOG_WARN, "cache '%s': cannot write its usage counter: %s (the next eviction scan recounts it)",
            c->root, strerror(errno));
}

/* ---- scanning and eviction ------------------------------------------------------------------------ */

typedef struct {
  char *path;
  uint64_t size;
  int64_t time_ns;
  bool passed;
} Victim;

typedef struct {
  WkDiskCache *cache;
  Victim *items;
  size_t count, capacity;
  uint64_t total;
} Scan;

static bool has_suffix(const char *name, const char *suffix) {
  size_t n = strlen(name), k = strlen(suffix);
  return n >= k && strcmp(name + n - k, suffix) == 0;
}

/* A temporary "<entry>.<pid>-<serial>.tmp" whose writer is gone. */
static bool temp_is_orphan(const char *name) {
  const char *end = name + strlen(name) - strlen(TEMP_SUFFIX);
  const char *dash = end;
  while (dash > name && dash[-1] != '-') dash--;
  const char *dot = dash > name ? dash - 1 : name;
  while (dot > name && dot[-1] != '.') dot--;
  if (dot == name) return false;
  long pid = strtol(dot, NULL, 10);
  return pid > 0 && (int32_t)pid != getpid() && !wk_process_alive((int32_t)pid);
}

static void scan_dir(Scan *s, const char *dir, int depth) {
  if (depth > SCAN_DEPTH) return;
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    char path[WK_DISK_PATH_CAPACITY];
    if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) continue;
    struct stat st;
    if (lstat(path, &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      scan_dir(s, path, depth + 1);
      continue;
    }
    if (!S_ISREG(st.st_mode)) continue;
    if (depth == 0 && strcmp(e->d_name, USAGE_FILE) == 0) { /* counted too, at the size it is about to have */
      s->total += USAGE_BYTES;
      continue;
    }
    if (depth == 0 && strcmp(e->d_name, CLAIMS_FILE) == 0) continue; /* empty: its locks are the claims */
    if (has_suffix(e->d_name, TEMP_SUFFIX)) {
      if (temp_is_orphan(e->d_name) && unlink(path) == 0) continue;
      s->total += (uint64_t)st.st_size; /* being written: counted, never evicted */
      continue;
    }
    s->total += (uint64_t)st.st_size;
    if (s->count == s->capacity) {
      size_t grown = s->capacity ? s->capacity * 2 : 256;
      Victim *bigger = realloc(s->items, grown * sizeof *bigger);
      if (!bigger) continue; /* not a candidate, still counted */
      s->items = bigger;
      s->capacity = grown;
    }
    bool passed = (st.st_mode & S_IWUSR) == 0;
    const struct timespec *t = passed ? &st.st_ctim : &st.st_mtim;
    char *copy = strdup(path);
    if (!copy) continue;
    s->items[s->count++] = (Victim){.path = copy, .size = (uint64_t)st.st_size, .passed = passed,
                                    .time_ns = (int64_t)t->tv_sec * 1000000000 + t->tv_nsec};
  }
  closedir(d);
}

static int victim_order(const void *a, const void *b) {
  const Victim *x = a, *y = b;
  if (x->passed != y->passed) return x->passed ? -1 : 1;
  return x->time_ns < y->time_ns ? -1 : x->time_ns > y->time_ns;
}

/* Usage lock held. Recounts the cache and evicts until `need` more bytes fit (and down to the low
 * water). Returns the usage after it; *fits whether need fits. */
static uint64_t make_room(WkDiskCache *c, uint64_t need, bool evict_unread, bool *fits) {
  Scan s = {.cache = c};
  scan_dir(&s, c->root, 0);
  uint64_t usage = s.total;
  uint64_t low = (uint64_t)((double)c->budget * EVICT_LOW_WATER);
  uint64_t target = low >= need ? low - need : c->budget - need;
  if (usage + need > c->budget) {
    qsort(s.items, s.count, sizeof *s.items, victim_order);
    for (size_t i = 0; i < s.count && usage > target; i++) {
      if (!s.items[i].passed && !evict_unread) break;
      if (unlink(s.items[i].path) == 0) {
        usage -= s.items[i].size;
        atomic_fetch_add(&c->evicted, s.items[i].size);
      }
    }
  }
  for (size_t i = 0; i < s.count; i++) free(s.items[i].path);
  free(s.items);
  write_counter(c, usage);
  *fits = usage + need <= c->budget;
  c->full_at = *fits ? 0 : usage;
  return usage;
}

/* ---- API -------------------------------------------------------------------------------------------- */

WkStatus wk_disk_cache_open(const char *dir, uint64_t budget, WkDiskCache **out) {
  *out = NULL;
  WkDiskCache *c = wk_calloc(1, sizeof *c, "disk cache");
  if (!c) return wk_last_status();
  c->usage_fd = c->claims_fd = -1;
  c->budget = budget;
  pthread_mutex_init(&c->lock, NULL);
  WkStatus status = WK_OK;
  char usage_path[WK_DISK_PATH_CAPACITY];
  int n = snprintf(c->root, sizeof c->root, "%s/%s", dir, LAYOUT);
  if (n < 0 || n >= (int)sizeof c->root ||
      snprintf(usage_path, sizeof usage_path, "%s/%s", c->root, USAGE_FILE) >= (int)sizeof usage_path ||
      snprintf(c->claims_path, sizeof c->claims_path, "%s/%s", c->root, CLAIMS_FILE) >= (int)sizeof c->claims_path)
    status = WK_FAIL(WK_ERR_INVALID_ARG, "cache_dir '%s' is too long", dir);
  int error = 0; /* a full file system here is the open's failure: nothing could be cached */
  if (status == WK_OK) status = make_parents(usage_path, &error);
  if (status == WK_OK) {
    c->usage_fd = open(usage_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (c->usage_fd < 0) status = WK_FAIL_ERRNO("open the cache's usage file (is cache_dir writable?)", usage_path);
  }
  if (status == WK_OK) {
    c->claims_fd = open(c->claims_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (c->claims_fd < 0) status = WK_FAIL_ERRNO("open the cache's claims file (is cache_dir writable?)", c->claims_path);
  }
  if (status == WK_OK) {
    lock_usage(c);
    uint64_t value;
    if (!read_counter(c, &value)) { /* a new cache, or a counter lost: count what is there */
      bool fits;
      make_room(c, 0, false, &fits);
    }
    unlock_usage(c);
  }
  if (status != WK_OK) {
    wk_disk_cache_close(c);
    return status;
  }
  *out = c;
  return WK_OK;
}

void wk_disk_cache_close(WkDiskCache *c) {
  if (!c) return;
  if (c->usage_fd >= 0) close(c->usage_fd);
  if (c->claims_fd >= 0) close(c->claims_fd);
  pthread_mutex_destroy(&c->lock);
  free(c);
}

int wk_disk_cache_open_entry(WkDiskCache *c, const char *key, uint64_t *size) {
  char path[WK_DISK_PATH_CAPACITY];
  if (entry_path(c, key, NULL, path) != WK_OK) return -1;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return -1;
  }
  *size = (uint64_t)st.st_size;
  /* Passed: read at least once; ctime says when last (the eviction order). Another user's entry in a
   * shared cache keeps its mode: a hint only. */
  if (fchmod(fd, S_IRUSR | S_IRGRP | S_IROTH) != 0)
    wk_logf(WK_LOG_DEBUG, "cache entry '%s': cannot mark it read: %s", path, strerror(errno));
  return fd;
}

bool wk_disk_cache_has(WkDiskCache *c, const char *key) {
  char path[WK_DISK_PATH_CAPACITY];
  return entry_path(c, key, NULL, path) == WK_OK && access(path, F_OK) == 0;
}

/* The byte of v1/claims that stands for key. */
static struct flock claim_byte(const char *key, short type) {
  return (struct flock){.l_type = type, .l_whence = SEEK_SET,
                        .l_start = (off_t)(wk_hash64(key, strlen(key)) % CLAIM_SLOTS), .l_len = 1};
}

WkStatus wk_disk_cache_claim(WkDiskCache *c, const char *key, WkDiskClaim *claim, bool *owned) {
  *owned = false;
  claim->fd = -1;
  if (!key_is_safe(key)) return WK_FAIL(WK_ERR_INTERNAL, "cache key '%s' is not a plain relative name", key);
  int fd = open(c->claims_path, O_RDWR | O_CLOEXEC); /* its own open file: a lock apart from every other */
  if (fd < 0) return WK_FAIL_ERRNO("open the cache's claims file", c->claims_path);
  struct flock lock = claim_byte(key, F_WRLCK);
  if (fcntl(fd, F_OFD_SETLK, &lock) != 0) {
    int e = errno;
    close(fd);
    if (e == EAGAIN || e == EACCES) return WK_OK; /* someone downloads it */
    errno = e;
    return WK_FAIL_ERRNO("lock a byte of the cache's claims file (F_OFD_SETLK)", c->claims_path);
  }
  claim->fd = fd;
  *owned = true;
  return WK_OK;
}

void wk_disk_cache_release(WkDiskCache *c, WkDiskClaim *claim) {
  (void)c;
  if (claim->fd < 0) return;
  close(claim->fd); /* drops the lock */
  claim->fd = -1;
}

bool wk_disk_cache_wait(WkDiskCache *c, const char *key, uint64_t deadline_ns) {
  uint64_t sleep_ns = WAIT_FIRST_NS;
  for (;;) {
    struct flock lock = claim_byte(key, F_WRLCK);
    if (fcntl(c->claims_fd, F_OFD_GETLK, &lock) != 0) {
      wk_logf(WK_LOG_DEBUG, "cache claims '%s': F_OFD_GETLK: %s (not waiting)", c->claims_path, strerror(errno));
      return true;
    }
    if (lock.l_type == F_UNLCK) return true; /* released, or its holder died */
    if (wk_now_ns() >= deadline_ns) return false;
    struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)sleep_ns};
    nanosleep(&ts, NULL);
    if (sleep_ns < WAIT_MAX_NS) sleep_ns *= 2;
  }
}

/* The temporary of an entry, opened for writing. Its directories are made when the open finds them
 * missing (the first entry of a shard), not tried on every store: a mkdir -p of an entry's 7 levels was
 * 7 of the ~35 system calls a range cost a remote stream. */
static int open_temp(const char *temp, const char *path, int *error, WkStatus *status) {
  int fd = open(temp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd >= 0 || errno != ENOENT) return fd;
  *status = make_parents(path, error);
  return *status == WK_OK ? open(temp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644) : -1;
}

/* wk_disk_cache_store; on a failed system call *error is its errno. */
static WkStatus store_entry(WkDiskCache *c, const char *path, const void *data, uint64_t length, bool passed,
                            bool evict_unread, bool *stored, int *error) {
  char temp[WK_DISK_PATH_CAPACITY];
  uint64_t serial = atomic_fetch_add(&c->temp_serial, 1);
  if (snprintf(temp, sizeof temp, "%s.%d-%llu%s", path, (int)getpid(), (unsigned long long)serial, TEMP_SUFFIX) >=
      (int)sizeof temp)
    return WK_FAIL(WK_ERR_INVALID_ARG, "cache path '%s' is too long", path);
  if (length > c->budget) return WK_OK; /* never fits */
  /* Reserve: the temporary exists at its full size before the lock is dropped. */
  lock_usage(c);
  uint64_t usage = 0;
  bool fits = read_counter(c, &usage) && usage + length <= c->budget;
  if (!fits && !(c->full_at && c->full_at == usage && !evict_unread)) usage = make_room(c, length, evict_unread, &fits);
  int fd = -1;
  WkStatus status = WK_OK;
  if (fits) {
    fd = open_temp(temp, path, error, &status); /* status: a directory it could not make */
    if (status == WK_OK && (fd < 0 || ftruncate(fd, (off_t)length) != 0)) {
      *error = errno;
      status = WK_FAIL_ERRNO("create cache entry", temp);
      if (fd >= 0) close(fd), unlink(temp);
      fd = -1;
    }
    if (fd >= 0) write_counter(c, usage + length);
  }
  unlock_usage(c);
  if (fd < 0) return status;
  for (uint64_t done = 0; status == WK_OK && done < length;) {
    ssize_t n = pwrite(fd, (const uint8_t *)data + done, (size_t)(length - done), (off_t)done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *error = errno;
      status = WK_FAIL_ERRNO("write cache entry", temp);
    } else {
      done += (uint64_t)n;
    }
  }
  mode_t mode = passed ? (S_IRUSR | S_IRGRP | S_IROTH) : (S_IRUSR | S_IWUSR | S_IRGRP | S_IROTH);
  if (status == WK_OK && fchmod(fd, mode) != 0) {
    *error = errno;
    status = WK_FAIL_ERRNO("set the mode of cache entry", temp);
  }
  close(fd);
  lock_usage(c);
  uint64_t now_usage = 0;
  read_counter(c, &now_usage);
  if (status == WK_OK) {
    struct stat old;
    uint64_t replaced = stat(path, &old) == 0 ? (uint64_t)old.st_size : 0;
    if (rename(temp, path) != 0) {
      *error = errno;
      status = WK_FAIL_ERRNO("rename cache entry into place", path);
    } else {
      write_counter(c, now_usage >= replaced ? now_usage - replaced : 0);
      *stored = true;
    }
  }
  if (status != WK_OK) {
    unlink(temp);
    write_counter(c, now_usage >= length ? now_usage - length : 0);
  }
  unlock_usage(c);
  return status;
}

WkStatus wk_disk_cache_store(WkDiskCache *c, const char *key, const void *data, uint64_t length, bool passed,
                             bool evict_unread, bool *stored) {
  *stored = false;
  char path[WK_DISK_PATH_CAPACITY];
  WK_TRY(entry_path(c, key, NULL, path));
  int error = 0;
  WkStatus status = store_entry(c, path, data, length, passed, evict_unread, stored, &error);
  if (status == WK_OK || (error != ENOSPC && error != EDQUOT)) return status;
  if (!atomic_exchange(&c->warned_full, true))
    wk_logf(WK_LOG_WARN, "cache '%s': the file system has no room (%s): reading through without caching what does "
            "not fit (free space there, or set cache_disk_bytes below what it can hold)", c->root, wk_last_error());
  return WK_OK;
}

void wk_disk_cache_remove(WkDiskCache *c, const char *key) {
  char path[WK_DISK_PATH_CAPACITY];
  if (entry_path(c, key, NULL, path) != WK_OK) return;
  lock_usage(c);
  struct stat st;
  if (stat(path, &st) == 0 && unlink(path) == 0) {
    uint64_t usage = 0;
    if (read_counter(c, &usage)) write_counter(c, usage >= (uint64_t)st.st_size ? usage - (uint64_t)st.st_size : 0);
  }
  unlock_usage(c);
}

uint64_t wk_disk_cache_usage(WkDiskCache *c) {
  uint64_t usage = 0;
  lock_usage(c);
  read_counter(c, &usage);
  unlock_usage(c);
  return usage;
}

uint64_t wk_disk_cache_evicted(WkDiskCache *c) { return atomic_load(&c->evicted); }
