/*
 * remote.c — a remote dataset's context (options, fetch engine, disk cache, counters), its index
 * fetched through the cache, and the remote blob.
 *
 * The blob's read_at serves a range from the disk cache: an entry of exactly that range, or one this
 * process knows to contain it (the reads of a shard's document index fall inside its tail entry).
 * Otherwise it waits for this process's prefetch of the range if one is in flight, else claims the
 * range (remote.h: sharing), fetches it as an urgent Range request straight into the caller's buffer and
 * stores it; when a local peer holds the claim it waits for the peer's entry instead. advise(WILLNEED)
 * queues a prefetch (dropped when the range is cached, in flight, or claimed by a peer when it starts);
 * what arrives is copied and written to the cache by a store thread, so that the engine's thread, which
 * drives every transfer, never waits on the file system (on a busy disk, making a file can take longer
 * than fetching its bytes over a fast link). forget removes cached copies of a range found corrupt, so the next
 * read fetches it anew.
 *
 * Prefetches outlive the blob that asked for them (a shard may close while its read-ahead is in flight):
 * each holds a reference to the blob's fetch target, freed with the last holder.
 */
#include <errno.h>
#include <stddef.h> /* offsetof */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../core/shared.h" /* wk_node_job_id */
#include "remote.h"

enum {
  MAX_PREFETCHES = 4096,       /* queued or in transfer per dataset; more read-ahead is dropped */
  STORE_QUEUE = 64,            /* prefetched ranges waiting for the store thread (then the engine waits) */
  WAIT_SLICE_NS = 50 * 1000 * 1000, /* a waiter rechecks its deadline at least this often */
  KEY_CAPACITY = 512,
  JOB_CAPACITY = 256,
  INDEX_HEADER_LINES = 5,      /* magic, hash, etag, modified, job; then an empty line and the body */
};
#define TIMEOUT_MS_MAX (INT64_C(24) * 3600 * 1000) /* a day: longer is a mistake, not a slow network */
static const char INDEX_MAGIC[] = "wick-index 1";
static const char NO_VALUE[] = "-";

typedef struct {
  WkFetchTarget target;
  uint32_t refs;               /* under the remote's lock */
} Target;

typedef struct {
  uint64_t offset, length;
} Extent;

typedef struct Prefetch Prefetch;

/* A read of this process fetching a range the cache lacks (on its thread's stack): the other threads of the
 * process that need the range wait on the remote's condition variable for it, not by polling the claim. */
typedef struct Reading {
  const char *key;
  struct Reading *next;
} Reading;

struct WkRemote {
  WkRemoteOptions options;
  char cache_dir[WK_DISK_PATH_CAPACITY];
  WkFetchConfig fetch_config;
  WkFetch *fetch;
  WkDiskCache *disk;
  uint64_t patience_ns;        /* the longest a download can take: how long to wait for a peer's */
  pthread_mutex_t lock;        /* prefetches, readings, targets' refs, the S3 configuration */
  pthread_cond_t changed;      /* a prefetch or a reading ended */
  Prefetch *prefetches;
  Reading *readings;
  uint32_t prefetch_count;
  WkS3Config s3;
  bool s3_loaded;
  char job[JOB_CAPACITY];
  bool has_job;
  _Atomic uint64_t hits, misses, wait_ns, prefetched, corrupt;
  WkQueue *stores;             /* prefetches whose bytes the store thread writes to the cache */
  pthread_t storer;
  bool storer_started;
};

struct Prefetch {
  WkFetchRequest request;
  WkRemote *remote;
  Target *target;
  char key[KEY_CAPACITY];
  WkDiskClaim claim;
  uint8_t *body;               /* what arrived, for the store thread (NULL: failed or not kept) */
  uint64_t body_length;
  bool done;
  uint32_t waiters;
  Prefetch *next;
};

typedef struct {
  WkBlob base;
  WkRemote *remote;
  Target *target;
  char *key;                   /* the cache directory of its entries; NULL: uncached */
  pthread_mutex_t lock;        /* known */
  Extent *known;               /* entries this process read or stored, sorted by offset */
  uint32_t known_count, known_capacity;
} RemoteBlob;

static void *storer_main(void *arg); /* the store thread (prefetch, below) */

/* ---- options ------------------------------------------------------------------------------------ */

/* Every integer option's bounds and default, and where it sits in WkRemoteOptions: their one place. */
static const WkParamSpec PARAM_SPECS[WK_REMOTE_PARAM_COUNT] = {
    [WK_REMOTE_CACHE_DISK_BYTES] = {0, INT64_MAX, INT64_C(16) << 30, "cache_disk_bytes"},
    [WK_REMOTE_PREFETCH_BYTES] = {0, INT64_C(1) << 40, INT64_C(64) << 20, "prefetch_bytes"},
    [WK_REMOTE_MAX_TRANSFERS] = {1, 256, 16, "max_transfers"},
    [WK_REMOTE_CONNECT_TIMEOUT_MS] = {1, TIMEOUT_MS_MAX, 10000, "connect_timeout_ms"},
    [WK_REMOTE_STALL_TIMEOUT_MS] = {1, TIMEOUT_MS_MAX, 30000, "stall_timeout_ms"},
    [WK_REMOTE_REQUEST_TIMEOUT_MS] = {1, TIMEOUT_MS_MAX, 600000, "request_timeout_ms"},
    [WK_REMOTE_RETRIES] = {0, 100, 5, "retries"},
    [WK_REMOTE_LOW_SPEED_BYTES_PER_S] = {1, INT64_C(1) << 30, 1024, "low_speed_bytes_per_s"},
    [WK_REMOTE_LOW_SPEED_WINDOW_MS] = {1, TIMEOUT_MS_MAX, 30000, "low_speed_window_ms"},
};
static const WkParamTable PARAMS = {"remote option", PARAM_SPECS, WK_REMOTE_PARAM_COUNT};
static const size_t FIELDS[WK_REMOTE_PARAM_COUNT] = {
    [WK_REMOTE_CACHE_DISK_BYTES] = offsetof(WkRemoteOptions, cache_disk_bytes),
    [WK_REMOTE_PREFETCH_BYTES] = offsetof(WkRemoteOptions, prefetch_bytes),
    [WK_REMOTE_MAX_TRANSFERS] = offsetof(WkRemoteOptions, max_transfers),
    [WK_REMOTE_CONNECT_TIMEOUT_MS] = offsetof(WkRemoteOptions, connect_timeout_ms),
    [WK_REMOTE_STALL_TIMEOUT_MS] = offsetof(WkRemoteOptions, stall_timeout_ms),
    [WK_REMOTE_REQUEST_TIMEOUT_MS] = offsetof(WkRemoteOptions, request_timeout_ms),
    [WK_REMOTE_RETRIES] = offsetof(WkRemoteOptions, retries),
    [WK_REMOTE_LOW_SPEED_BYTES_PER_S] = offsetof(WkRemoteOptions, low_speed_bytes_per_s),
    [WK_REMOTE_LOW_SPEED_WINDOW_MS] = offsetof(WkRemoteOptions, low_speed_window_ms),
};

static int64_t *field(WkRemoteOptions *o, WkRemoteParam p) { return (int64_t *)((char *)o + FIELDS[p]); }

void wk_remote_options_default(WkRemoteOptions *out) {
  *out = (WkRemoteOptions){.cache_dir = NULL};
  for (int p = 0; p < WK_REMOTE_PARAM_COUNT; p++) *field(out, p) = PARAM_SPECS[p].fallback;
}

WkStatus wk_remote_param_bounds(WkRemoteParam param, int64_t *min, int64_t *max) {
  return wk_param_bounds(&PARAMS, (int)param, min, max);
}

WkStatus wk_remote_options_check(const WkRemoteOptions *o) {
  for (int p = 0; p < WK_REMOTE_PARAM_COUNT; p++)
    WK_TRY(wk_param_check(&PARAMS, p, *field((WkRemoteOptions *)o, p), PARAM_SPECS[p].min, PARAM_SPECS[p].max));
  return WK_OK;
}

/* cache_dir, else WICK_CACHE_DIR, else $XDG_CACHE_HOME/wick (absolute only, as the XDG spec says), else
 * $HOME/.cache/wick. */
static WkStatus resolve_cache_dir(const char *given, char *out) {
  const char *dir = given && *given ? given : getenv("WICK_CACHE_DIR");
  const char *suffix = "";
  if (!dir || !*dir) {
    const char *xdg = getenv("XDG_CACHE_HOME");
    if (xdg && xdg[0] == '/') {
      dir = xdg;
      suffix = "/wick";
    } else {
      dir = getenv("HOME");
      suffix = "/.cache/wick";
      if (!dir || !*dir)
        return WK_FAIL(WK_ERR_INVALID_ARG, "remote datasets need a cache directory: set cache_dir, WICK_CACHE_DIR, "
                                           "XDG_CACHE_HOME or HOME");
    }
  }
  if (snprintf(out, WK_DISK_PATH_CAPACITY, "%s%s", dir, suffix) >= WK_DISK_PATH_CAPACITY / 2)
    return WK_FAIL(WK_ERR_INVALID_ARG, "cache directory '%s%s' is too long", dir, suffix);
  return WK_OK;
}

WkStatus wk_remote_open(const WkRemoteOptions *options, WkRemote **out) {
  *out = NULL;
  WkRemoteOptions defaults;
  wk_remote_options_default(&defaults);
  if (!options) options = &defaults;
  WK_TRY(wk_remote_options_check(options));
  const char *ca = getenv("WICK_CA_BUNDLE");
  if (ca && *ca && access(ca, R_OK) != 0)
    return WK_FAIL(WK_ERR_INVALID_ARG, "WICK_CA_BUNDLE='%s': cannot read it (%s); give a PEM file of CA certificates",
                   ca, strerror(errno));
  WkRemote *r = wk_calloc(1, sizeof *r, "remote dataset");
  if (!r) return wk_last_status();
  r->options = *options;
  r->options.cache_dir = r->cache_dir;
  pthread_mutex_init(&r->lock, NULL);
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC); /* its deadlines are wk_now_ns() */
  pthread_cond_init(&r->changed, &attr);
  pthread_condattr_destroy(&attr);
  char job[JOB_CAPACITY];
  r->has_job = wk_node_job_id(job, sizeof job);
  if (r->has_job) wk_hash_hex128(job, strlen(job), r->job); /* one word for the index entry's header */
  r->fetch_config = (WkFetchConfig){.max_transfers = options->max_transfers,
                                    .connect_timeout_ms = options->connect_timeout_ms,
                                    .stall_timeout_ms = options->stall_timeout_ms,
                                    .request_timeout_ms = options->request_timeout_ms,
                                    .retries = options->retries,
                                    .low_speed_bytes_per_s = options->low_speed_bytes_per_s,
                                    .low_speed_window_ms = options->low_speed_window_ms,
                                    .prefetch_bytes = options->prefetch_bytes,
                                    .ca_bundle = ca && *ca ? ca : NULL};
  r->patience_ns = wk_fetch_patience_ns(&r->fetch_config);
  WkStatus status = resolve_cache_dir(options->cache_dir, r->cache_dir);
  if (status == WK_OK) status = wk_disk_cache_open(r->cache_dir, (uint64_t)options->cache_disk_bytes, &r->disk);
  if (status == WK_OK && !(r->stores = wk_queue_new(STORE_QUEUE))) status = wk_last_status();
  if (status == WK_OK) {
    int rc = pthread_create(&r->storer, NULL, storer_main, r);
    if (rc != 0) status = WK_FAIL(WK_ERR_INTERNAL, "cannot start the cache's store thread: %s", strerror(rc));
    r->storer_started = rc == 0;
  }
  if (status == WK_OK) status = wk_fetch_new(&r->fetch_config, &r->fetch);
  if (status != WK_OK) {
    wk_remote_close(r);
    return status;
  }
  *out = r;
  return WK_OK;
}

void wk_remote_close(WkRemote *r) {
  if (!r) return;
  wk_fetch_free(r->fetch); /* finishes every prefetch (their done() runs now) */
  if (r->stores) {
    wk_queue_close(r->stores); /* the store thread writes what is queued, then ends */
    if (r->storer_started) pthread_join(r->storer, NULL);
    wk_queue_free(r->stores);
  }
  wk_disk_cache_close(r->disk);
  wk_s3_config_free(&r->s3);
  pthread_cond_destroy(&r->changed);
  pthread_mutex_destroy(&r->lock);
  free(r);
}

/* ---- targets ------------------------------------------------------------------------------------ */

static void target_unref(WkRemote *r, Target *t) {
  if (!t) return;
  pthread_mutex_lock(&r->lock);
  bool last = --t->refs == 0;
  pthread_mutex_unlock(&r->lock);
  if (!last) return;
  free(t->target.url);
  free(t->target.name);
  free(t);
}

/* The S3 configuration, read from the environment at the first s3:// location. */
static WkStatus load_s3(WkRemote *r) {
  WkStatus status = WK_OK;
  pthread_mutex_lock(&r->lock);
  if (!r->s3_loaded) {
    status = wk_s3_config_from_env(&r->s3);
    r->s3_loaded = status == WK_OK;
  }
  pthread_mutex_unlock(&r->lock);
  return status;
}

/* The HTTP(S) request for a location (an s3:// one mapped through the S3 configuration). */
static WkStatus target_new(WkRemote *r, const char *location, uint64_t size, Target **out) {
  WkUrl url;
  WK_TRY(wk_url_parse(location, &url));
  WkStatus status = WK_OK;
  Target *t = wk_calloc(1, sizeof *t, "remote target");
  if (!t) status = wk_last_status();
  if (status == WK_OK && (url.scheme == WK_URL_FILE))
    status = WK_FAIL(WK_ERR_INVALID_ARG, "'%s' is not a remote location", location);
  if (status == WK_OK && url.scheme == WK_URL_S3) {
    status = load_s3(r);
    if (status == WK_OK) {
      t->target.s3 = &r->s3;
      t->target.url = wk_s3_object_url(&r->s3, url.host, url.path);
    }
  } else if (status == WK_OK) {
    t->target.url = strdup(location);
  }
  if (status == WK_OK) {
    t->target.name = strdup(location);
    t->target.size = size;
    t->refs = 1;
    if (!t->target.url || !t->target.name) status = WK_FAIL(WK_ERR_NOMEM, "out of memory for '%s'", location);
  }
  wk_url_free(&url);
  if (status != WK_OK) {
    if (t) {
      free(t->target.url);
      free(t->target.name);
      free(t);
    }
    return status;
  }
  *out = t;
  return WK_OK;
}

/* ---- small file helpers -------------------------------------------------------------------------- */

static WkStatus read_fully(int fd, uint64_t offset, void *dst, size_t length, const char *what) {
  for (size_t done = 0; done < length;) {
    ssize_t n = pread(fd, (uint8_t *)dst + done, length - done, (off_t)(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return WK_FAIL_ERRNO("read cache entry", what);
    if (n == 0) return WK_FAIL(WK_ERR_FORMAT, "cache entry '%s' ends early", what);
    done += (size_t)n;
  }
  return WK_OK;
}

static void entry_key(const RemoteBlob *b, uint64_t offset, uint64_t length, char out[KEY_CAPACITY]) {
  snprintf(out, KEY_CAPACITY, "%s/%llu-%llu", b->key, (unsigned long long)offset, (unsigned long long)length);
}

/* ---- known entries -------------------------------------------------------------------------------- */

static void known_add(RemoteBlob *b, uint64_t offset, uint64_t length) {
  pthread_mutex_lock(&b->lock);
  uint32_t at = 0;
  while (at < b->known_count && b->known[at].offset < offset) at++;
  bool present = at < b->known_count && b->known[at].offset == offset && b->known[at].length == length;
  if (!present && b->known_count == b->known_capacity) {
    uint32_t grown = b->known_capacity ? b->known_capacity * 2 : 16;
    Extent *bigger = realloc(b->known, grown * sizeof *bigger);
    if (bigger) {
      b->known = bigger;
      b->known_capacity = grown;
    }
  }
  if (!present && b->known_count < b->known_capacity) {
    memmove(b->known + at + 1, b->known + at, (b->known_count - at) * sizeof *b->known);
    b->known[at] = (Extent){offset, length};
    b->known_count++;
  }
  pthread_mutex_unlock(&b->lock);
}

static void known_remove(RemoteBlob *b, uint64_t offset, uint64_t length) {
  pthread_mutex_lock(&b->lock);
  for (uint32_t i = 0; i < b->known_count; i++)
    if (b->known[i].offset == offset && b->known[i].length == length) {
      memmove(b->known + i, b->known + i + 1, (b->known_count - i - 1) * sizeof *b->known);
      b->known_count--;
      break;
    }
  pthread_mutex_unlock(&b->lock);
}

/* A known entry holding [offset, offset+length), other than the range itself. */
static bool known_container(RemoteBlob *b, uint64_t offset, uint64_t length, Extent *out) {
  bool found = false;
  pthread_mutex_lock(&b->lock);
  for (uint32_t i = 0; i < b->known_count && b->known[i].offset <= offset && !found; i++) {
    const Extent *e = &b->known[i];
    if (offset + length <= e->offset + e->length && !(e->offset == offset && e->length == length)) {
      *out = *e;
      found = true;
    }
  }
  pthread_mutex_unlock(&b->lock);
  return found;
}

/* ---- reading through the cache ---------------------------------------------------------------------- */

/* Copies [offset, offset+length) from entry `e` when it is on disk with its full size. */
static bool read_entry(RemoteBlob *b, Extent e, uint64_t offset, uint64_t length, void *dst) {
  char key[KEY_CAPACITY];
  entry_key(b, e.offset, e.length, key);
  uint64_t size = 0;
  int fd = wk_disk_cache_open_entry(b->remote->disk, key, &size);
  if (fd < 0) return false;
  bool ok = size == e.length && read_fully(fd, offset - e.offset, dst, (size_t)length, key) == WK_OK;
  close(fd);
  if (!ok) {
    wk_disk_cache_remove(b->remote->disk, key); /* the wrong size: not ours to trust */
    known_remove(b, e.offset, e.length);
  }
  return ok;
}

static bool serve_cached(RemoteBlob *b, uint64_t offset, uint64_t length, void *dst) {
  Extent container;
  if (known_container(b, offset, length, &container)) {
    if (read_entry(b, container, offset, length, dst)) return true;
    known_remove(b, container.offset, container.length);
  }
  if (!read_entry(b, (Extent){offset, length}, offset, length, dst)) return false;
  known_add(b, offset, length);
  return true;
}

static WkStatus fetch_into(RemoteBlob *b, uint64_t offset, uint64_t length, void *dst) {
  WkFetchRequest request = {.target = &b->target->target, .offset = offset, .length = length, .dst = dst};
  WkStatus status = wk_fetch_run(b->remote->fetch, &request);
  if (status != WK_OK) return WK_FAIL(status, "%s", request.error);
  return WK_OK;
}

static Prefetch *find_prefetch(WkRemote *r, const char *key) {
  for (Prefetch *p = r->prefetches; p; p = p->next)
    if (strcmp(p->key, key) == 0) return p;
  return NULL;
}

/* Remote lock held. Unlinks and frees a finished prefetch nobody waits for. */
static void reap_prefetch(WkRemote *r, Prefetch *p) {
  if (!p->done || p->waiters > 0) return;
  for (Prefetch **q = &r->prefetches; *q; q = &(*q)->next)
    if (*q == p) {
      *q = p->next;
      r->prefetch_count--;
      break;
    }
  Target *t = p->target;
  free(p);
  if (--t->refs == 0) { /* the lock is held: free here, as target_unref would */
    free(t->target.url);
    free(t->target.name);
    free(t);
  }
}

/* Remote lock held: one bounded wait on `changed` (at most WAIT_SLICE_NS, never past the deadline). */
static void wait_changed(WkRemote *r, uint64_t deadline) {
  uint64_t at = wk_now_ns() + WAIT_SLICE_NS;
  if (at > deadline) at = deadline;
  struct timespec ts = {.tv_sec = (time_t)(at / 1000000000ull), .tv_nsec = (long)(at % 1000000000ull)};
  pthread_cond_timedwait(&r->changed, &r->lock, &ts); /* changed is on CLOCK_MONOTONIC */
}

/* Waits (bounded) for this process's prefetch of key, when one is in flight; true when it waited. */
static bool wait_prefetch(WkRemote *r, const char *key, uint64_t deadline) {
  pthread_mutex_lock(&r->lock);
  Prefetch *p = find_prefetch(r, key);
  bool waited = p && !p->done;
  if (p) {
    p->waiters++;
    while (!p->done && wk_now_ns() < deadline) wait_changed(r, deadline);
    p->waiters--;
    reap_prefetch(r, p);
  }
  pthread_mutex_unlock(&r->lock);
  return waited;
}

static bool find_reading(WkRemote *r, const char *key) {
  for (Reading *g = r->readings; g; g = g->next)
    if (strcmp(g->key, key) == 0) return true;
  return false;
}

/* Makes this thread the one of its process that fetches key (true), or, when another thread is fetching it,
 * waits (bounded) until that one is done and returns false: look in the cache again. */
static bool reading_begin(WkRemote *r, Reading *me, const char *key, uint64_t deadline) {
  pthread_mutex_lock(&r->lock);
  bool other = find_reading(r, key);
  if (other) {
    while (find_reading(r, key) && wk_now_ns() < deadline) wait_changed(r, deadline);
  } else {
    *me = (Reading){.key = key, .next = r->readings};
    r->readings = me;
  }
  pthread_mutex_unlock(&r->lock);
  return !other;
}

static void reading_end(WkRemote *r, Reading *me) {
  pthread_mutex_lock(&r->lock);
  for (Reading **g = &r->readings; *g; g = &(*g)->next)
    if (*g == me) {
      *g = me->next;
      break;
    }
  pthread_cond_broadcast(&r->changed);
  pthread_mutex_unlock(&r->lock);
}

/* One attempt at a range the cache lacks: claim it for the node and fetch and store it, or wait (bounded) for
 * the process that claimed it; after the deadline, fetch it without the cache. *served: dst holds it. */
static WkStatus read_claimed(RemoteBlob *b, const char *key, uint64_t offset, size_t length, void *dst,
                             uint64_t deadline, bool *served) {
  WkRemote *r = b->remote;
  WkDiskClaim claim;
  bool owned = false;
  WK_TRY(wk_disk_cache_claim(r->disk, key, &claim, &owned));
  WkStatus status = WK_OK;
  if (owned) {
    if (serve_cached(b, offset, length, dst)) { /* stored while we claimed */
      wk_disk_cache_release(r->disk, &claim);
      *served = true;
      return WK_OK;
    }
    status = fetch_into(b, offset, length, dst);
    bool stored = false;
    if (status == WK_OK) status = wk_disk_cache_store(r->disk, key, dst, length, true, true, &stored);
    if (stored) known_add(b, offset, length);
    wk_disk_cache_release(r->disk, &claim);
    *served = status == WK_OK;
  } else if (!wk_disk_cache_wait(r->disk, key, deadline) || wk_now_ns() >= deadline) {
    status = fetch_into(b, offset, length, dst); /* the peer took too long: fetch without the cache */
    *served = status == WK_OK;
  }
  return status;
}

static WkStatus remote_read_at(WkBlob *self, uint64_t offset, size_t length, void *dst) {
  RemoteBlob *b = (RemoteBlob *)self;
  WkRemote *r = b->remote;
  if (offset > self->size || length > self->size - offset)
    return WK_FAIL(WK_ERR_FORMAT, "'%s': read of %zu bytes at offset %llu runs past the end (%llu bytes)", self->name,
                   length, (unsigned long long)offset, (unsigned long long)self->size);
  if (length == 0) return WK_OK;
  if (!b->key) return fetch_into(b, offset, length, dst);
  if (serve_cached(b, offset, length, dst)) {
    atomic_fetch_add_explicit(&r->hits, 1, memory_order_relaxed);
    return WK_OK;
  }
  uint64_t t0 = wk_now_ns(), deadline = t0 + r->patience_ns;
  atomic_fetch_add_explicit(&r->misses, 1, memory_order_relaxed);
  char key[KEY_CAPACITY];
  entry_key(b, offset, length, key);
  WkStatus status = WK_OK;
  bool served = false;
  while (!served && status == WK_OK) {
    if (serve_cached(b, offset, length, dst)) {
      served = true;
      break;
    }
    Reading me;
    bool mine = false;
    if (wk_now_ns() < deadline) {
      if (wait_prefetch(r, key, deadline)) continue;          /* our prefetch of it is over: look again */
      if (!(mine = reading_begin(r, &me, key, deadline))) continue; /* so is another thread's read */
    }
    status = read_claimed(b, key, offset, length, dst, deadline, &served);
    if (mine) reading_end(r, &me);
  }
  atomic_fetch_add_explicit(&r->wait_ns, wk_now_ns() - t0, memory_order_relaxed);
  return status;
}

/* ---- prefetch ------------------------------------------------------------------------------------- */

static void finish_prefetch(Prefetch *p) {
  WkRemote *r = p->remote;
  pthread_mutex_lock(&r->lock);
  p->done = true;
  pthread_cond_broadcast(&r->changed);
  reap_prefetch(r, p);
  pthread_mutex_unlock(&r->lock);
}

static bool prefetch_start(WkFetchRequest *request) {
  Prefetch *p = request->ctx;
  WkRemote *r = p->remote;
  bool owned = false;
  if (wk_disk_cache_claim(r->disk, p->key, &p->claim, &owned) != WK_OK || !owned ||
      wk_disk_cache_has(r->disk, p->key)) {
    if (owned) wk_disk_cache_release(r->disk, &p->claim);
    finish_prefetch(p);
    return false;
  }
  return true;
}

/* Writes a prefetch's bytes to the cache (the store thread), drops its claim and wakes its waiters. */
static void store_prefetch(Prefetch *p) {
  WkRemote *r = p->remote;
  if (p->body) {
    bool stored = false;
    if (wk_disk_cache_store(r->disk, p->key, p->body, p->body_length, false, false, &stored) == WK_OK && stored)
      atomic_fetch_add_explicit(&r->prefetched, 1, memory_order_relaxed);
    free(p->body);
    p->body = NULL;
  }
  wk_disk_cache_release(r->disk, &p->claim);
  finish_prefetch(p);
}

static void *storer_main(void *arg) {
  WkRemote *r = arg;
  void *item;
  while (wk_queue_pop(r->stores, &item, -1) == WK_OK) store_prefetch(item);
  return NULL;
}

static void prefetch_done(WkFetchRequest *request) {
  Prefetch *p = request->ctx;
  WkRemote *r = p->remote;
  if (request->status == WK_OK) {
    p->body = malloc(request->body_length ? (size_t)request->body_length : 1); /* the engine's copy ends here */
    if (p->body) {
      memcpy(p->body, request->body, (size_t)request->body_length);
      p->body_length = request->body_length;
    } else {
      wk_logf(WK_LOG_DEBUG, "prefetch of '%s': no memory to keep %llu bytes (the read will fetch them)",
              request->target->name, (unsigned long long)request->body_length);
    }
  } else {
    wk_logf(WK_LOG_DEBUG, "prefetch failed (the read will try again): %s", request->error);
  }
  if (wk_queue_push(r->stores, p, -1) != WK_OK) store_prefetch(p); /* closing: write it here */
}

static void remote_advise(WkBlob *self, uint64_t offset, uint64_t length, WkAdvice advice) {
  RemoteBlob *b = (RemoteBlob *)self;
  WkRemote *r = b->remote;
  if (advice != WK_ADVICE_WILLNEED || !b->key || r->options.prefetch_bytes == 0 || offset >= self->size || length == 0)
    return;
  if (length > self->size - offset) length = self->size - offset;
  Prefetch *p = calloc(1, sizeof *p);
  if (!p) return; /* a hint */
  entry_key(b, offset, length, p->key);
  if (wk_disk_cache_has(r->disk, p->key)) {
    free(p);
    return;
  }
  pthread_mutex_lock(&r->lock);
  bool skip = find_prefetch(r, p->key) || r->prefetch_count >= MAX_PREFETCHES;
  if (!skip) {
    p->remote = r;
    p->target = b->target;
    b->target->refs++;
    p->claim.fd = -1;
    p->request = (WkFetchRequest){.target = &b->target->target, .offset = offset, .length = length,
                                  .start = prefetch_start, .done = prefetch_done, .ctx = p};
    p->next = r->prefetches;
    r->prefetches = p;
    r->prefetch_count++;
  }
  pthread_mutex_unlock(&r->lock);
  if (skip) {
    free(p);
    return;
  }
  wk_fetch_submit(r->fetch, &p->request);
}

static void remote_forget(WkBlob *self, uint64_t offset, uint64_t length) {
  RemoteBlob *b = (RemoteBlob *)self;
  if (!b->key) return;
  atomic_fetch_add_explicit(&b->remote->corrupt, 1, memory_order_relaxed);
  Extent gone[64];
  uint32_t count = 0;
  pthread_mutex_lock(&b->lock);
  for (uint32_t i = 0; i < b->known_count;) {
    const Extent *e = &b->known[i];
    if (e->offset < offset + length && offset < e->offset + e->length && count < 64) {
      gone[count++] = *e;
      memmove(b->known + i, b->known + i + 1, (b->known_count - i - 1) * sizeof *b->known);
      b->known_count--;
    } else {
      i++;
    }
  }
  pthread_mutex_unlock(&b->lock);
  if (count == 0) gone[count++] = (Extent){offset, length};
  for (uint32_t i = 0; i < count; i++) {
    char key[KEY_CAPACITY];
    entry_key(b, gone[i].offset, gone[i].length, key);
    wk_disk_cache_remove(b->remote->disk, key);
  }
}

static const void *remote_map(WkBlob *self, uint64_t offset, size_t length) {
  (void)self, (void)offset, (void)length;
  return NULL;
}

static void remote_close(WkBlob *self) {
  RemoteBlob *b = (RemoteBlob *)self;
  if (!b) return;
  target_unref(b->remote, b->target);
  pthread_mutex_destroy(&b->lock);
  free(b->known);
  free(b->key);
  free(b);
}

WkBlob *wk_remote_blob_open(WkRemote *r, const char *location, uint64_t size, const char *cache_key) {
  RemoteBlob *b = wk_calloc(1, sizeof *b, "remote blob");
  if (!b) return NULL;
  pthread_mutex_init(&b->lock, NULL);
  b->remote = r;
  if (target_new(r, location, size, &b->target) != WK_OK || (cache_key && !(b->key = strdup(cache_key)))) {
    if (wk_last_status() == WK_OK) WK_FAIL(WK_ERR_NOMEM, "out of memory opening '%s'", location);
    remote_close(&b->base);
    return NULL;
  }
  b->base.name = b->target->target.name;
  b->base.size = size;
  b->base.read_at = remote_read_at;
  b->base.map = remote_map;
  b->base.advise = remote_advise;
  b->base.forget = remote_forget;
  b->base.close = remote_close;
  return &b->base;
}

/* ---- an object's size ---------------------------------------------------------------------------- */

WkStatus wk_remote_object_size(WkRemote *r, const char *location, uint64_t *size) {
  Target *t = NULL;
  WK_TRY(target_new(r, location, WK_FETCH_SIZE_UNKNOWN, &t));
  uint8_t first;
  WkFetchRequest request = {.target = &t->target, .offset = 0, .length = 1, .dst = &first};
  WkStatus status = wk_fetch_run(r->fetch, &request);
  if (status != WK_OK) status = WK_FAIL(status, "%s", request.error);
  else if (request.total == WK_FETCH_SIZE_UNKNOWN)
    status = WK_FAIL(WK_ERR_NETWORK, "GET '%s' bytes 0-0: the answer gave no size (Content-Range 'bytes 0-0/*'); "
                                     "the server must report an object's size to read it by range", t->target.name);
  else *size = request.total;
  target_unref(r, t);
  return status;
}

WkStatus wk_remote_list(WkRemote *r, const char *location, WkS3Each each, void *ctx) {
  WkUrl url;
  WK_TRY(wk_url_parse(location, &url));
  WkStatus status = url.scheme == WK_URL_S3
                        ? load_s3(r)
                        : WK_FAIL(WK_ERR_INVALID_ARG, "'%s': only s3:// prefixes are listed", location);
  if (status == WK_OK) status = wk_s3_list(r->fetch, &r->s3, url.host, url.path, each, ctx);
  wk_url_free(&url);
  return status;
}

/* ---- the index ------------------------------------------------------------------------------------ */

typedef struct {
  char hash[33], etag[WK_REMOTE_VALIDATOR_CAPACITY], modified[WK_REMOTE_VALIDATOR_CAPACITY], job[JOB_CAPACITY];
  char *body;
  size_t length;
} IndexEntry;

/* Reads and checks a cached index (its body's hash); false when absent or damaged. */
static bool index_load(WkRemote *r, const char *key, IndexEntry *e) {
  memset(e, 0, sizeof *e);
  uint64_t size = 0;
  int fd = wk_disk_cache_open_entry(r->disk, key, &size);
  if (fd < 0) return false;
  char *text = size < SIZE_MAX ? malloc((size_t)size + 1) : NULL;
  bool ok = text && read_fully(fd, 0, text, (size_t)size, key) == WK_OK;
  close(fd);
  if (!ok) {
    free(text);
    return false;
  }
  text[size] = '\0';
  char *fields[INDEX_HEADER_LINES], *at = text;
  for (int i = 0; i < INDEX_HEADER_LINES && ok; i++) {
    char *nl = strchr(at, '\n');
    if (!nl) ok = false;
    else {
      *nl = '\0';
      fields[i] = at;
      at = nl + 1;
    }
  }
  ok = ok && strcmp(fields[0], INDEX_MAGIC) == 0 && *at == '\n' && strncmp(fields[1], "hash ", 5) == 0 &&
       strncmp(fields[2], "etag ", 5) == 0 && strncmp(fields[3], "modified ", 9) == 0 &&
       strncmp(fields[4], "job ", 4) == 0;
  if (ok) {
    at++;
    e->length = (size_t)(text + size - at);
    char actual[33];
    wk_hash_hex128(at, e->length, actual);
    ok = strcmp(actual, fields[1] + 5) == 0;
    snprintf(e->hash, sizeof e->hash, "%s", actual);
    snprintf(e->etag, sizeof e->etag, "%s", strcmp(fields[2] + 5, NO_VALUE) ? fields[2] + 5 : "");
    snprintf(e->modified, sizeof e->modified, "%s", strcmp(fields[3] + 9, NO_VALUE) ? fields[3] + 9 : "");
    snprintf(e->job, sizeof e->job, "%s", strcmp(fields[4] + 4, NO_VALUE) ? fields[4] + 4 : "");
  }
  if (ok) {
    e->body = malloc(e->length + 1);
    ok = e->body != NULL;
    if (ok) {
      memcpy(e->body, at, e->length);
      e->body[e->length] = '\0';
    }
  }
  free(text);
  return ok;
}

static void index_save(WkRemote *r, const char *key, const IndexEntry *e) {
  size_t header = sizeof INDEX_MAGIC + 64 + strlen(e->hash) + strlen(e->etag) + strlen(e->modified) + strlen(e->job);
  char *text = malloc(header + e->length);
  if (!text) return; /* a cache: the next run fetches it again */
  int n = snprintf(text, header, "%s\nhash %s\netag %s\nmodified %s\njob %s\n\n", INDEX_MAGIC, e->hash,
                   e->etag[0] ? e->etag : NO_VALUE, e->modified[0] ? e->modified : NO_VALUE,
                   e->job[0] ? e->job : NO_VALUE);
  memcpy(text + n, e->body, e->length);
  bool stored = false;
  if (wk_disk_cache_store(r->disk, key, text, (uint64_t)n + e->length, true, true, &stored) != WK_OK)
    wk_logf(WK_LOG_WARN, "could not cache the index: %s", wk_last_error());
  free(text);
}

/* With the index entry's claim held: the index, from the cache when this job checked it already, else
 * by a (conditional) request. */
static WkStatus index_get(WkRemote *r, const Target *t, const char *key, uint64_t max_bytes, IndexEntry *e) {
  bool cached = index_load(r, key, e);
  if (cached && r->has_job && strcmp(e->job, r->job) == 0) return WK_OK;
  WkFetchRequest request = {.target = &t->target, .whole = true, .max_bytes = max_bytes,
                            .if_none_match = cached && e->etag[0] ? e->etag : NULL,
                            .if_modified_since = cached && e->modified[0] ? e->modified : NULL};
  WkStatus status = wk_fetch_run(r->fetch, &request);
  if (status != WK_OK) {
    /* Gone (404) or refused (403) is an answer; anything else leaves the cached copy as good as it was. */
    bool answered = request.http_status >= 400 && request.http_status < 500;
    if (cached && !answered) {
      wk_logf(WK_LOG_WARN, "using the cached index of '%s': the server could not be asked (%s)", t->target.name,
              request.error);
      return WK_OK;
    }
    free(e->body);
    e->body = NULL;
    return WK_FAIL(status, "%s", request.error);
  }
  if (!request.not_modified) {
    free(e->body);
    e->body = (char *)request.body;
    e->length = (size_t)request.body_length;
    wk_hash_hex128(e->body, e->length, e->hash);
    snprintf(e->etag, sizeof e->etag, "%s", request.etag);
    snprintf(e->modified, sizeof e->modified, "%s", request.last_modified);
  } else if (!cached) {
    return WK_FAIL(WK_ERR_NETWORK, "'%s': the server answered 304 Not Modified to an unconditional request",
                   t->target.name);
  }
  const char *job = r->has_job ? r->job : "";
  if (!request.not_modified || strcmp(e->job, job) != 0) {
    snprintf(e->job, sizeof e->job, "%s", job);
    index_save(r, key, e);
  }
  return WK_OK;
}

WkStatus wk_remote_fetch_index(WkRemote *r, const char *location, uint64_t max_bytes, char **text, size_t *length,
                               char identity[33]) {
  *text = NULL;
  Target *t = NULL;
  WK_TRY(target_new(r, location, WK_FETCH_SIZE_UNKNOWN, &t));
  char name_hash[33], key[KEY_CAPACITY];
  wk_hash_hex128(location, strlen(location), name_hash);
  snprintf(key, sizeof key, "index/%s", name_hash);
  uint64_t deadline = wk_now_ns() + r->patience_ns;
  WkStatus status = WK_OK;
  IndexEntry e = {0};
  for (;;) {
    WkDiskClaim claim;
    bool owned = false;
    status = wk_disk_cache_claim(r->disk, key, &claim, &owned);
    if (status != WK_OK) break;
    if (owned) {
      status = index_get(r, t, key, max_bytes, &e);
      wk_disk_cache_release(r->disk, &claim);
      break;
    }
    if (!wk_disk_cache_wait(r->disk, key, deadline)) { /* the holder is stuck: ask the server ourselves */
      status = index_get(r, t, key, max_bytes, &e);
      break;
    }
  }
  target_unref(r, t);
  if (status != WK_OK) return status;
  *text = e.body;
  *length = e.length;
  snprintf(identity, 33, "%s", e.hash);
  return WK_OK;
}

/* ---- statistics ------------------------------------------------------------------------------------ */

void wk_remote_stats(WkRemote *r, WkRemoteStats *out) {
  memset(out, 0, sizeof *out);
  if (!r) return;
  WkFetchStats f;
  wk_fetch_stats(r->fetch, &f);
  *out = (WkRemoteStats){.requests = f.requests, .bytes_fetched = f.bytes,
                         .cache_hits = atomic_load(&r->hits), .cache_misses = atomic_load(&r->misses),
                         .prefetched = atomic_load(&r->prefetched), .prefetch_dropped = f.dropped,
                         .retries_connect = f.retries[WK_RETRY_CONNECT], .retries_reset = f.retries[WK_RETRY_RESET],
                         .retries_timeout = f.retries[WK_RETRY_TIMEOUT], .retries_server = f.retries[WK_RETRY_SERVER],
                         .retries_throttle = f.retries[WK_RETRY_THROTTLE], .retries_corrupt = atomic_load(&r->corrupt),
                         .rate_bytes_per_s = f.rate_bytes_per_s, .wait_ns = atomic_load(&r->wait_ns),
                         .disk_bytes = wk_disk_cache_usage(r->disk), .evicted_bytes = wk_disk_cache_evicted(r->disk)};
}
