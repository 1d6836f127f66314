/*
 * fetch.c — the engine: one thread driving a libcurl multi handle (a transfer's life is transfer.c's;
 * transfer.h has what the two share).
 *
 * Requests are queued from any thread (wk_fetch_submit) and started on the engine thread: urgent ones
 * (a reader waits) first and always, then prefetches while their bytes in transfer stay within
 * prefetch_bytes, never more than max_transfers at once. A prefetch is merged with queued prefetches
 * of the same object that lie next to it (gaps up to MERGE_GAP_BYTES, MERGE_MAX_BYTES in all) into one
 * Range request, whose body is cut back into the requests.
 *
 * A range response must be 206 (or 200, which some S3-compatible stores send) with a Content-Range
 * equal to the bytes asked for and, when the object's size is known, that size: anything else is
 * refused before its body is kept. A body cut short is resumed by a Range request for what is missing.
 * Every attempt is bounded, checked here at least every POLL_MS: a connect timeout (libcurl's), a stall
 * timeout (no byte for stall_timeout_ms), a low-speed limit (fewer than low_speed_bytes_per_s over each
 * low_speed_window_ms, header bytes included: a server that drips is cut like one that is silent) and a
 * deadline sized to what is asked: the connect timeout, one low-speed window (the first judgement of the
 * rate) and the bytes asked for at the low-speed limit, so a shard's header gets seconds and a large range
 * minutes (a whole object counts its Content-Length, the most it may be without one, nothing before its
 * headers). The request as a whole, all its attempts and the waits between them, ends at
 * request_timeout_ms, and it makes at most 1 + retries attempts with the backoff of retry.c between them;
 * then it fails with its URL, range, last HTTP status, the attempt count and the last reason (the rate
 * seen, when it was too slow). A wait of LONG_WAIT_NS or more before an attempt logs one line saying why.
 *
 * HTTP: keep-alive through the multi handle's connection cache, HTTP/2 over TLS when the server offers
 * it (multiplexed, PIPEWAIT), TLS verification always on (WICK_CA_BUNDLE or the system's CAs), redirects
 * followed between http and https only (not for S3: a redirect there is a wrong region or endpoint).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>   /* getpid */

#include "transfer.h"

/* ---- global init ------------------------------------------------------------------------------------ */

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_status = CURLE_OK;
static void global_init(void) { global_status = curl_global_init(CURL_GLOBAL_DEFAULT); }

/* ---- the engine thread -------------------------------------------------------------------------------- */

/* When this attempt must be over: the connect timeout, one low-speed window and the bytes asked for at the
 * low-speed limit after its start, and never after the request's deadline. */
static uint64_t attempt_deadline_ns(const WkFetch *f, const Transfer *t) {
  const WkFetchConfig *c = &f->config;
  double at_limit_ns = (double)t->asked / (double)c->low_speed_bytes_per_s * 1e9;
  double deadline = (double)t->attempt_start_ns + (double)(c->connect_timeout_ms + c->low_speed_window_ms) * 1e6 +
                    at_limit_ns;
  return deadline < (double)t->request_deadline_ns ? (uint64_t)deadline : t->request_deadline_ns;
}

/* Whether an active transfer has run past one of its bounds; if so, why, in t->reason. */
static bool past_bounds(WkFetch *f, Transfer *t, uint64_t now) {
  const WkFetchConfig *c = &f->config;
  if (now > t->last_byte_ns && now - t->last_byte_ns > (uint64_t)c->stall_timeout_ms * NS_PER_MS) {
    snprintf(t->reason, sizeof t->reason, "no data for %lld ms (stalled)", (long long)c->stall_timeout_ms);
    return true;
  }
  uint64_t window = now - t->window_start_ns;
  if (now > t->window_start_ns && window >= (uint64_t)c->low_speed_window_ms * NS_PER_MS) {
    uint64_t bytes = t->attempt_bytes - t->window_bytes;
    double window_rate = (double)bytes * 1e9 / (double)window;
    if (window_rate < (double)c->low_speed_bytes_per_s) {
      snprintf(t->reason, sizeof t->reason, "too slow: %llu bytes in %.1f s (%.0f B/s), under the low-speed limit "
               "of %lld B/s over %lld ms (low_speed_bytes_per_s, low_speed_window_ms)", (unsigned long long)bytes,
               (double)window / 1e9, window_rate, (long long)c->low_speed_bytes_per_s,
               (long long)c->low_speed_window_ms);
      return true;
    }
    t->window_start_ns = now;
    t->window_bytes = t->attempt_bytes;
  }
  uint64_t deadline = attempt_deadline_ns(f, t);
  if (now >= deadline) {
    uint64_t since = now - t->attempt_start_ns;
    double rate = since ? (double)t->attempt_bytes * 1e9 / (double)since : 0;
    snprintf(t->reason, sizeof t->reason, "not done by %s deadline, %.1f s after it began (%llu bytes asked for; %llu "
             "bytes of headers and body came, %.0f B/s)", deadline == t->request_deadline_ns ? "the request's" : "this "
             "attempt's", (double)since / 1e9, (unsigned long long)t->asked, (unsigned long long)t->attempt_bytes, rate);
    return true;
  }
  return false;
}

static void check_progress(WkFetch *f, uint64_t now) {
  for (bool again = true; again;) {
    again = false;
    for (Transfer *t = f->active; t; t = t->next) {
      if (past_bounds(f, t, now)) {
        t->cut = true;
        fetch_on_done(f, t, CURLE_OPERATION_TIMEDOUT);
        again = true;
        break;
      }
    }
  }
}

static void collect_done(WkFetch *f) {
  CURLMsg *msg;
  int left;
  while ((msg = curl_multi_info_read(f->multi, &left))) {
    if (msg->msg != CURLMSG_DONE) continue;
    Transfer *t = NULL;
    curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&t);
    CURLcode code = msg->data.result;
    if (t) fetch_on_done(f, t, code);
  }
}

static void fail_all(WkFetch *f) {
  static const char CLOSED[] = "the dataset was closed while this request was in flight";
  while (f->active) {
    Transfer *t = f->active;
    fetch_remove_active(f, t);
    fetch_finish(f, t, WK_ERR_CLOSED, CLOSED);
  }
  while (f->waiting) {
    Transfer *t = f->waiting;
    f->waiting = t->next;
    fetch_finish(f, t, WK_ERR_CLOSED, CLOSED);
  }
  WkFetchRequest *r;
  while ((r = fetch_pop(&f->urgent, &f->urgent_tail))) fetch_fail_request(f, r, WK_ERR_CLOSED, CLOSED);
  while ((r = fetch_pop(&f->queued, &f->queued_tail))) fetch_fail_request(f, r, WK_ERR_CLOSED, CLOSED);
}

/* Lock held. Moves the queued prefetches a reader waits for to the front of the queue: read-ahead is
 * queued in the order of the units (a buffer's at once), its rows need them in shuffled order, so a
 * reader's unit can sit behind a buffer's worth of others. */
static void hurry_queued(WkFetch *f) {
  WkFetchRequest *front = NULL, *front_tail = NULL, *previous = NULL;
  for (WkFetchRequest *q = f->queued; q;) {
    WkFetchRequest *next = q->next;
    if (q->hurry) {
      fetch_unlink(&f->queued, &f->queued_tail, q, previous);
      fetch_push(&front, &front_tail, q);
    } else {
      previous = q;
    }
    q = next;
  }
  if (!front) return;
  front_tail->next = f->queued;
  if (!f->queued) f->queued_tail = front_tail;
  f->queued = front;
}

static void *engine_main(void *arg) {
  WkFetch *f = arg;
  for (;;) {
    pthread_mutex_lock(&f->lock);
    WkFetchRequest *in = f->incoming;
    f->incoming = f->incoming_tail = NULL;
    bool stopping = f->stopping;
    while (in) {
      WkFetchRequest *next = in->next;
      if (in->urgent) fetch_push(&f->urgent, &f->urgent_tail, in);
      else fetch_push(&f->queued, &f->queued_tail, in);
      in = next;
    }
    if (f->hurried) hurry_queued(f);
    f->hurried = false;
    pthread_mutex_unlock(&f->lock);
    if (stopping) {
      fail_all(f);
      break;
    }
    int running = 0;
    CURLMcode mc = curl_multi_perform(f->multi, &running);
    if (mc != CURLM_OK) wk_logf(WK_LOG_WARN, "curl_multi_perform: %s", curl_multi_strerror(mc));
    collect_done(f);
    uint64_t now = wk_now_ns();
    check_progress(f, now);
    fetch_start_due(f, now);
    fetch_start_new(f); /* a handle just added makes the poll below return at once */
    int timeout = POLL_MS;
    for (Transfer *t = f->waiting; t; t = t->next) {
      int ms = t->due_ns > now ? (int)((t->due_ns - now) / NS_PER_MS) : 0;
      if (ms < timeout) timeout = ms;
    }
    mc = curl_multi_poll(f->multi, NULL, 0, timeout, NULL);
    if (mc != CURLM_OK) wk_logf(WK_LOG_WARN, "curl_multi_poll: %s", curl_multi_strerror(mc));
  }
  return NULL;
}

/* ---- API --------------------------------------------------------------------------------------------- */

WkStatus wk_fetch_new(const WkFetchConfig *config, WkFetch **out) {
  *out = NULL;
  pthread_once(&global_once, global_init);
  if (global_status != CURLE_OK)
    return WK_FAIL(WK_ERR_NETWORK, "curl_global_init: %s", curl_easy_strerror(global_status));
  WkFetch *f = wk_calloc(1, sizeof *f, "fetch engine");
  if (!f) return wk_last_status();
  f->config = *config;
  f->rng = wk_now_ns() ^ ((uint64_t)getpid() << 32);
  pthread_mutex_init(&f->lock, NULL);
  pthread_cond_init(&f->finished, NULL);
  WkStatus status = WK_OK;
  if (config->ca_bundle && !(f->ca_bundle = strdup(config->ca_bundle)))
    status = WK_FAIL(WK_ERR_NOMEM, "out of memory for the CA bundle path");
  f->config.ca_bundle = f->ca_bundle;
  if (status == WK_OK && !(f->multi = curl_multi_init()))
    status = WK_FAIL(WK_ERR_NETWORK, "curl_multi_init failed (out of memory?)");
  struct {
    CURLMoption option;
    long value;
    const char *name;
  } options[] = {{CURLMOPT_PIPELINING, CURLPIPE_MULTIPLEX, "CURLMOPT_PIPELINING"},
                 {CURLMOPT_MAX_HOST_CONNECTIONS, (long)config->max_transfers, "CURLMOPT_MAX_HOST_CONNECTIONS"},
                 {CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)config->max_transfers, "CURLMOPT_MAX_TOTAL_CONNECTIONS"},
                 {CURLMOPT_MAXCONNECTS, (long)config->max_transfers, "CURLMOPT_MAXCONNECTS"}};
  for (size_t i = 0; status == WK_OK && i < sizeof options / sizeof options[0]; i++) {
    CURLMcode mc = curl_multi_setopt(f->multi, options[i].option, options[i].value);
    if (mc != CURLM_OK) status = WK_FAIL(WK_ERR_NETWORK, "curl_multi_setopt(%s): %s", options[i].name, curl_multi_strerror(mc));
  }
  if (status == WK_OK) {
    int rc = wk_thread_create(&f->thread, engine_main, f);
    if (rc != 0) status = WK_FAIL(WK_ERR_INTERNAL, "cannot start the fetch thread: %s", strerror(rc));
    else f->thread_started = true;
  }
  if (status != WK_OK) {
    wk_fetch_free(f);
    return status;
  }
  *out = f;
  return WK_OK;
}

void wk_fetch_free(WkFetch *f) {
  if (!f) return;
  if (f->thread_started) {
    pthread_mutex_lock(&f->lock);
    f->stopping = true;
    pthread_mutex_unlock(&f->lock);
    curl_multi_wakeup(f->multi);
    pthread_join(f->thread, NULL);
  }
  for (uint32_t i = 0; i < f->pooled; i++) curl_easy_cleanup(f->pool[i]);
  if (f->multi) curl_multi_cleanup(f->multi);
  pthread_cond_destroy(&f->finished);
  pthread_mutex_destroy(&f->lock);
  free(f->ca_bundle);
  free(f);
}

void wk_fetch_submit(WkFetch *f, WkFetchRequest *r) {
  r->finished = false;
  r->status = WK_OK;
  r->error[0] = '\0';
  r->body_taken = false;
  pthread_mutex_lock(&f->lock);
  bool stopping = f->stopping;
  if (!stopping) fetch_push(&f->incoming, &f->incoming_tail, r);
  pthread_mutex_unlock(&f->lock);
  if (stopping) {
    fetch_fail_request(f, r, WK_ERR_CLOSED, "the dataset is closing");
    return;
  }
  curl_multi_wakeup(f->multi);
}

void wk_fetch_hurry(WkFetch *f, WkFetchRequest *r) {
  pthread_mutex_lock(&f->lock);
  r->hurry = true;
  f->hurried = true;
  pthread_mutex_unlock(&f->lock);
  curl_multi_wakeup(f->multi);
}

WkStatus wk_fetch_run(WkFetch *f, WkFetchRequest *r) {
  r->urgent = true;
  r->done = NULL;
  r->start = NULL;
  wk_fetch_submit(f, r);
  pthread_mutex_lock(&f->lock);
  while (!r->finished) pthread_cond_wait(&f->finished, &f->lock); /* bounded: every attempt times out */
  pthread_mutex_unlock(&f->lock);
  return r->status;
}

void wk_fetch_stats(WkFetch *f, WkFetchStats *out) {
  memset(out, 0, sizeof *out);
  out->requests = atomic_load(&f->requests);
  out->bytes = atomic_load(&f->bytes);
  out->dropped = atomic_load(&f->dropped);
  for (int c = 0; c < WK_RETRY_CAUSES; c++) out->retries[c] = atomic_load(&f->retries[c]);
  uint64_t epoch = wk_now_ns() / (RATE_BUCKET_MS * NS_PER_MS), sum = 0;
  for (int b = 0; b < RATE_BUCKETS; b++) {
    uint64_t e = atomic_load_explicit(&f->rate_epoch[b], memory_order_relaxed);
    if (e + RATE_BUCKETS > epoch && e < epoch) sum += atomic_load_explicit(&f->rate_bytes[b], memory_order_relaxed);
  }
  out->rate_bytes_per_s = sum * 1000 / ((RATE_BUCKETS - 1) * RATE_BUCKET_MS); /* the finished buckets */
}

uint64_t wk_fetch_patience_ns(const WkFetchConfig *config) {
  return ((uint64_t)config->request_timeout_ms + POLL_MS) * NS_PER_MS; /* the engine sees a deadline within POLL_MS */
}
