/*
 * remote.c — a remote dataset's context: its options (their table), the fetch engine, the disk cache and
 * the store thread it starts, the fetch targets (an s3:// location mapped through the S3 configuration),
 * an object's size, and the counters. What reads through it is remote_blob.c (the remote blob) and
 * remote_index.c (the index); remote_context.h is the state the three share.
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
#include "remote_context.h"

#define TIMEOUT_MS_MAX (INT64_C(24) * 3600 * 1000) /* a day: longer is a mistake, not a slow network */

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
    int rc = wk_thread_create(&r->storer, remote_storer_main, r);
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

void remote_target_unref(WkRemote *r, Target *t) {
  if (!t) return;
  pthread_mutex_lock(&r->lock);
  bool last = --t->refs == 0;
  pthread_mutex_unlock(&r->lock);
  if (!last) return;
  free(t->target.url);
  free(t->target.name);
  free(t);
}

WkStatus remote_load_s3(WkRemote *r) {
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
WkStatus remote_target_new(WkRemote *r, const char *location, uint64_t size, Target **out) {
  WkUrl url;
  WK_TRY(wk_url_parse(location, &url));
  WkStatus status = WK_OK;
  Target *t = wk_calloc(1, sizeof *t, "remote target");
  if (!t) status = wk_last_status();
  if (status == WK_OK && (url.scheme == WK_URL_FILE))
    status = WK_FAIL(WK_ERR_INVALID_ARG, "'%s' is not a remote location", location);
  if (status == WK_OK && url.scheme == WK_URL_S3) {
    status = remote_load_s3(r);
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

WkStatus remote_read_fully(int fd, uint64_t offset, void *dst, size_t length, const char *what) {
  for (size_t done = 0; done < length;) {
    ssize_t n = pread(fd, (uint8_t *)dst + done, length - done, (off_t)(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return WK_FAIL_ERRNO("read cache entry", what);
    if (n == 0) return WK_FAIL(WK_ERR_FORMAT, "cache entry '%s' ends early", what);
    done += (size_t)n;
  }
  return WK_OK;
}

/* ---- an object's size ---------------------------------------------------------------------------- */

WkStatus wk_remote_object_size(WkRemote *r, const char *location, uint64_t *size) {
  Target *t = NULL;
  WK_TRY(remote_target_new(r, location, WK_FETCH_SIZE_UNKNOWN, &t));
  uint8_t first;
  WkFetchRequest request = {.target = &t->target, .offset = 0, .length = 1, .dst = &first};
  WkStatus status = wk_fetch_run(r->fetch, &request);
  if (status != WK_OK) status = WK_FAIL(status, "%s", request.error);
  else if (request.total == WK_FETCH_SIZE_UNKNOWN)
    status = WK_FAIL(WK_ERR_NETWORK, "GET '%s' bytes 0-0: the answer gave no size (Content-Range 'bytes 0-0/*'); "
                                     "the server must report an object's size to read it by range", t->target.name);
  else *size = request.total;
  remote_target_unref(r, t);
  return status;
}

WkStatus wk_remote_list(WkRemote *r, const char *location, WkS3Each each, void *ctx) {
  WkUrl url;
  WK_TRY(wk_url_parse(location, &url));
  WkStatus status = url.scheme == WK_URL_S3
                        ? remote_load_s3(r)
                        : WK_FAIL(WK_ERR_INVALID_ARG, "'%s': only s3:// prefixes are listed", location);
  if (status == WK_OK) status = wk_s3_list(r->fetch, &r->s3, url.host, url.path, each, ctx);
  wk_url_free(&url);
  return status;
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
