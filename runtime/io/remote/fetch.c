/*
 * fetch.c — the engine: one thread driving a libcurl multi handle.
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
#include <curl/curl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>  /* strncasecmp */
#include <unistd.h>   /* getpid */

#include "remote.h"

enum {
  POLL_MS = 20,                 /* the engine wakes at least this often (stalls, retries due) */
  MERGE_GAP_BYTES = 256,        /* a gap between two prefetches no larger than a request's own headers
                                   (a shard's alignment padding) is fetched with them */
  MERGE_MAX_PARTS = 64,
  MERGE_MAX_BYTES = 8 << 20,    /* one merged request's range */
  POOL_HANDLES = 16,            /* easy handles kept for reuse */
  MAX_REDIRECTS = 5,
  ERROR_BODY_BYTES = 512,       /* kept of an error response (S3 puts its <Code> there) */
  RATE_BUCKETS = 10,            /* the download rate: bytes per 100 ms over the last second */
  RATE_BUCKET_MS = 100,
};
#define NS_PER_MS 1000000ull
#define NS_PER_S 1000000000ull
#define LONG_WAIT_NS (3 * NS_PER_S) /* a wait before a retry this long is logged, not only at info level */
#define TEXT(x) #x
#define VERSION_TEXT(a, b, c) TEXT(a) "." TEXT(b) "." TEXT(c)
static const char USER_AGENT[] = "wick/" VERSION_TEXT(WK_VERSION_MAJOR, WK_VERSION_MINOR, WK_VERSION_PATCH);
/* SHA-256 of the empty body: the payload hash of every S3 request here (all GETs). */
static const char EMPTY_PAYLOAD_SHA256[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

typedef struct Transfer Transfer;
struct Transfer {
  WkFetch *fetch;
  CURL *easy;
  const WkFetchTarget *target;
  WkFetchRequest *parts[MERGE_MAX_PARTS];
  uint32_t count;
  bool whole, urgent;
  uint64_t begin, end;          /* the range asked for (whole: unused) */
  uint8_t *buffer;
  uint64_t capacity, received;
  bool own_buffer;
  struct curl_slist *headers;
  char range[64];
  /* the current attempt's response */
  long status;
  bool checked, discarding, fatal;
  bool cut;                     /* a bound of ours ended the attempt (stall, low speed, deadline): t->reason */
  bool have_range;
  uint64_t range_first, range_last, range_total;
  bool range_total_known;
  char etag[WK_REMOTE_VALIDATOR_CAPACITY], last_modified[WK_REMOTE_VALIDATOR_CAPACITY];
  char error_body[ERROR_BODY_BYTES + 1];
  size_t error_body_length;
  char curl_error[CURL_ERROR_SIZE];
  uint64_t last_byte_ns;
  uint64_t attempt_start_ns;
  uint64_t attempt_bytes;       /* header and body bytes of this attempt */
  uint64_t header_bytes;        /* of this attempt's responses (a huge one is named) */
  uint64_t window_start_ns, window_bytes; /* the low-speed window: since when, attempt_bytes then */
  uint64_t asked;               /* the bytes this attempt waits for (its deadline) */
  /* across attempts */
  uint64_t request_start_ns, request_deadline_ns;
  uint32_t attempts;
  long last_status;
  char reason[WK_REMOTE_ERROR_CAPACITY];
  uint64_t due_ns;
  Transfer *next;
};

struct WkFetch {
  WkFetchConfig config;
  char *ca_bundle;
  CURLM *multi;
  pthread_t thread;
  bool thread_started;
  pthread_mutex_t lock;
  pthread_cond_t finished;
  WkFetchRequest *incoming, *incoming_tail;  /* submitted, not yet taken by the engine (under lock) */
  bool stopping;
  /* the engine thread's own */
  WkFetchRequest *urgent, *urgent_tail, *queued, *queued_tail;
  Transfer *active, *waiting;
  uint32_t active_count;
  uint64_t prefetch_in_flight;
  CURL *pool[POOL_HANDLES];
  uint32_t pooled;
  uint64_t rng;
  uint64_t quiet_until_ns;      /* a long wait was logged; waits until then are not logged again */
  /* statistics */
  _Atomic uint64_t requests, bytes, dropped, retries[WK_RETRY_CAUSES];
  _Atomic uint64_t rate_bytes[RATE_BUCKETS], rate_epoch[RATE_BUCKETS];
};

/* ---- global init ------------------------------------------------------------------------------------ */

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_status = CURLE_OK;
static void global_init(void) { global_status = curl_global_init(CURL_GLOBAL_DEFAULT); }

/* ---- queues ------------------------------------------------------------------------------------------ */

static void push(WkFetchRequest **head, WkFetchRequest **tail, WkFetchRequest *r) {
  r->next = NULL;
  if (*tail) (*tail)->next = r;
  else *head = r;
  *tail = r;
}

static WkFetchRequest *pop(WkFetchRequest **head, WkFetchRequest **tail) {
  WkFetchRequest *r = *head;
  if (r) {
    *head = r->next;
    if (!*head) *tail = NULL;
    r->next = NULL;
  }
  return r;
}

static void unlink_request(WkFetchRequest **head, WkFetchRequest **tail, WkFetchRequest *r, WkFetchRequest *previous) {
  if (previous) previous->next = r->next;
  else *head = r->next;
  if (*tail == r) *tail = previous;
  r->next = NULL;
}

/* ---- completion ------------------------------------------------------------------------------------- */

static void complete(WkFetch *f, WkFetchRequest *r) {
  if (r->done) {
    r->done(r); /* the request is its owner's again */
    return;
  }
  pthread_mutex_lock(&f->lock);
  r->finished = true;
  pthread_cond_broadcast(&f->finished);
  pthread_mutex_unlock(&f->lock);
}

static void fail_request(WkFetch *f, WkFetchRequest *r, WkStatus status, const char *message) {
  r->status = status;
  snprintf(r->error, sizeof r->error, "%s", message);
  r->body = NULL;
  r->body_length = 0;
  complete(f, r);
}

static void release_handle(WkFetch *f, Transfer *t) {
  if (!t->easy) return;
  if (f->pooled < POOL_HANDLES) f->pool[f->pooled++] = t->easy;
  else curl_easy_cleanup(t->easy);
  t->easy = NULL;
}

static void transfer_free(WkFetch *f, Transfer *t) {
  release_handle(f, t);
  curl_slist_free_all(t->headers);
  if (t->own_buffer) free(t->buffer);
  if (!t->urgent && !t->whole) f->prefetch_in_flight -= t->end - t->begin;
  free(t);
}

/* Hands every part its result and frees the transfer. */
static void finish(WkFetch *f, Transfer *t, WkStatus status, const char *message) {
  for (uint32_t i = 0; i < t->count; i++) {
    WkFetchRequest *r = t->parts[i];
    r->status = status;
    r->attempts = t->attempts;
    r->http_status = t->last_status;
    snprintf(r->etag, sizeof r->etag, "%s", t->etag);
    snprintf(r->last_modified, sizeof r->last_modified, "%s", t->last_modified);
    r->total = t->range_total_known ? t->range_total : t->whole ? t->received : WK_FETCH_SIZE_UNKNOWN;
    r->not_modified = status == WK_OK && t->last_status == 304;
    if (status != WK_OK) {
      snprintf(r->error, sizeof r->error, "%s", message);
      r->body = NULL;
      r->body_length = 0;
    } else if (t->whole) {
      r->body = r->not_modified ? NULL : t->buffer; /* the caller's now */
      r->body_length = r->not_modified ? 0 : t->received;
      if (r->not_modified) free(t->buffer);
      t->buffer = NULL;
      t->own_buffer = false;
    } else {
      r->body = t->buffer + (r->offset - t->begin);
      r->body_length = r->length;
      r->error[0] = '\0';
    }
  }
  for (uint32_t i = 0; i < t->count; i++) complete(f, t->parts[i]);
  transfer_free(f, t);
}

/* "GET 'name' bytes a-b" or "GET 'name'": how messages name a transfer. */
static void describe(const Transfer *t, char *out, size_t capacity) {
  if (t->whole) snprintf(out, capacity, "GET '%s'", t->target->name);
  else snprintf(out, capacity, "GET '%s' bytes %llu-%llu", t->target->name, (unsigned long long)t->begin,
                (unsigned long long)(t->end - 1));
}

/* S3 and compatible stores explain a refusal in <Code>...</Code>. */
static void error_code(const Transfer *t, char *out, size_t capacity) {
  out[0] = '\0';
  const char *a = strstr(t->error_body, "<Code>");
  const char *b = a ? strstr(a, "</Code>") : NULL;
  if (a && b) snprintf(out, capacity, " (%.*s)", (int)(b - a - 6), a + 6);
}

static void fail_fatal(WkFetch *f, Transfer *t, const char *why) {
  char what[WK_REMOTE_ERROR_CAPACITY], message[WK_REMOTE_ERROR_CAPACITY];
  describe(t, what, sizeof what);
  if (t->last_status) snprintf(message, sizeof message, "%s: %s (attempt %u, HTTP status %ld; not retried)", what, why,
                               t->attempts, t->last_status);
  else snprintf(message, sizeof message, "%s: %s (attempt %u, no HTTP response; not retried)", what, why, t->attempts);
  finish(f, t, WK_ERR_NETWORK, message);
}

/* ---- curl callbacks ----------------------------------------------------------------------------------- */

static void count_rate(WkFetch *f, uint64_t now, size_t bytes) {
  uint64_t epoch = now / (RATE_BUCKET_MS * NS_PER_MS);
  uint32_t b = (uint32_t)(epoch % RATE_BUCKETS);
  if (atomic_load_explicit(&f->rate_epoch[b], memory_order_relaxed) != epoch) {
    atomic_store_explicit(&f->rate_bytes[b], 0, memory_order_relaxed);
    atomic_store_explicit(&f->rate_epoch[b], epoch, memory_order_relaxed);
  }
  atomic_fetch_add_explicit(&f->rate_bytes[b], bytes, memory_order_relaxed);
  atomic_fetch_add_explicit(&f->bytes, bytes, memory_order_relaxed);
}

/* At a response's first body byte (or its end, when it has none): is it the answer asked for? */
static void check_response(Transfer *t) {
  t->checked = true;
  curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &t->status);
  t->last_status = t->status;
  t->discarding = !(t->status >= 200 && t->status < 300);
  if (t->discarding) return;
  char why[WK_REMOTE_ERROR_CAPACITY];
  if (t->whole) {
    if (t->asked == 0) t->asked = t->end; /* no Content-Length: the most it may be */
    if (t->status != 200) {
      snprintf(why, sizeof why, "HTTP %ld to a request for the whole object", t->status);
      snprintf(t->reason, sizeof t->reason, "%s", why);
      t->fatal = true;
    }
    return;
  }
  uint64_t first = t->begin + t->received, last = t->end - 1;
  if (!t->have_range) {
    snprintf(t->reason, sizeof t->reason,
             t->status == 200 ? "the server ignored the Range request (HTTP 200 with the whole object): it cannot serve "
                                "a dataset by range"
                              : "HTTP 206 without a Content-Range header");
    t->fatal = true;
  } else if (t->range_first != first || t->range_last != last) {
    snprintf(t->reason, sizeof t->reason, "the server answered bytes %llu-%llu for bytes %llu-%llu",
             (unsigned long long)t->range_first, (unsigned long long)t->range_last, (unsigned long long)first,
             (unsigned long long)last);
    t->fatal = true;
  } else if (t->target->size != WK_FETCH_SIZE_UNKNOWN && t->range_total_known && t->range_total != t->target->size) {
    snprintf(t->reason, sizeof t->reason,
             "the object has %llu bytes but the index says %llu (the dataset changed on the server while this "
             "index was cached; run again to fetch the new index)",
             (unsigned long long)t->range_total, (unsigned long long)t->target->size);
    t->fatal = true;
  }
}

static size_t on_body(char *data, size_t size, size_t count, void *ctx) {
  Transfer *t = ctx;
  size_t n = size * count;
  uint64_t now = wk_now_ns();
  t->last_byte_ns = now;
  t->attempt_bytes += n;
  count_rate(t->fetch, now, n);
  if (!t->checked) check_response(t);
  if (t->fatal) return 0; /* aborts the transfer: CURLE_WRITE_ERROR */
  if (t->discarding) {
    size_t keep = ERROR_BODY_BYTES - t->error_body_length < n ? ERROR_BODY_BYTES - t->error_body_length : n;
    memcpy(t->error_body + t->error_body_length, data, keep);
    t->error_body_length += keep;
    t->error_body[t->error_body_length] = '\0';
    return n;
  }
  if (t->received + n > t->capacity) {
    if (!t->whole || t->capacity == t->end) {
      snprintf(t->reason, sizeof t->reason, t->whole ? "the object is larger than the %llu bytes allowed"
                                                     : "the server sent more than the %llu bytes asked for",
               (unsigned long long)(t->whole ? t->end : t->end - t->begin));
      t->fatal = true;
      return 0;
    }
    uint64_t grown = t->capacity * 2 > t->received + n ? t->capacity * 2 : t->received + n;
    if (grown > t->end) grown = t->end; /* whole: end holds max_bytes */
    uint8_t *bigger = realloc(t->buffer, (size_t)grown);
    if (!bigger) {
      snprintf(t->reason, sizeof t->reason, "out of memory for a %llu-byte body", (unsigned long long)grown);
      t->fatal = true;
      return 0;
    }
    t->buffer = bigger;
    t->capacity = grown;
    if (t->received + n > t->capacity) return on_body(data, size, count, ctx); /* over max_bytes: refused above */
  }
  memcpy(t->buffer + t->received, data, n);
  t->received += n;
  return n;
}

static void copy_value(const char *value, size_t n, char *out, size_t capacity) {
  while (n > 0 && (value[n - 1] == '\r' || value[n - 1] == '\n' || value[n - 1] == ' ')) n--;
  while (n > 0 && *value == ' ') value++, n--;
  if (n >= capacity) n = capacity - 1;
  memcpy(out, value, n);
  out[n] = '\0';
}

static bool header_is(const char *line, size_t n, const char *name) {
  size_t k = strlen(name);
  return n > k && strncasecmp(line, name, k) == 0 && line[k] == ':';
}

static size_t on_header(char *line, size_t size, size_t count, void *ctx) {
  Transfer *t = ctx;
  size_t n = size * count;
  t->last_byte_ns = wk_now_ns();
  t->attempt_bytes += n;
  t->header_bytes += n;
  if (n >= 5 && strncmp(line, "HTTP/", 5) == 0) { /* a new response (after a redirect or 100) */
    long status = 0;
    if (sscanf(line, "HTTP/%*s %ld", &status) == 1) t->last_status = status; /* named if its headers fail */
    t->have_range = t->range_total_known = false;
    t->etag[0] = t->last_modified[0] = '\0';
    if (t->whole) t->asked = 0;
  } else if (t->whole && header_is(line, n, "content-length")) {
    char value[32];
    copy_value(line + 15, n - 15, value, sizeof value);
    char *end;
    unsigned long long length = strtoull(value, &end, 10);
    if (end != value && *end == '\0') t->asked = length < t->end ? length : t->end;
  } else if (header_is(line, n, "content-range")) {
    char value[128];
    copy_value(line + 14, n - 14, value, sizeof value);
    unsigned long long a, b, total;
    char star;
    if (sscanf(value, "bytes %llu-%llu/%llu", &a, &b, &total) == 3) {
      t->have_range = t->range_total_known = true;
      t->range_first = a;
      t->range_last = b;
      t->range_total = total;
    } else if (sscanf(value, "bytes %llu-%llu/%c", &a, &b, &star) == 3 && star == '*') {
      t->have_range = true;
      t->range_first = a;
      t->range_last = b;
    }
  } else if (header_is(line, n, "etag")) {
    copy_value(line + 5, n - 5, t->etag, sizeof t->etag);
  } else if (header_is(line, n, "last-modified")) {
    copy_value(line + 14, n - 14, t->last_modified, sizeof t->last_modified);
  }
  return n;
}

/* ---- attempts ---------------------------------------------------------------------------------------- */

#define SETOPT(option, value)                                                  \
  do {                                                                         \
    CURLcode setopt_code_ = curl_easy_setopt(easy, option, value);             \
    if (setopt_code_ != CURLE_OK) {                                            \
      snprintf(why, sizeof why, "curl_easy_setopt(%s): %s", #option, curl_easy_strerror(setopt_code_)); \
      goto fail;                                                               \
    }                                                                          \
  } while (0)

static void begin_attempt(WkFetch *f, Transfer *t) {
  char why[WK_REMOTE_ERROR_CAPACITY];
  t->attempts++;
  atomic_fetch_add_explicit(&f->requests, 1, memory_order_relaxed);
  t->status = 0;
  t->checked = t->discarding = t->fatal = t->cut = false;
  t->attempt_bytes = t->header_bytes = t->window_bytes = 0;
  t->asked = t->whole ? 0 : t->end - t->begin - t->received; /* a whole object: from its headers */
  t->have_range = t->range_total_known = false;
  t->error_body_length = 0;
  t->error_body[0] = t->curl_error[0] = '\0';
  if (t->whole) t->received = 0; /* a whole object restarts from its first byte */
  curl_slist_free_all(t->headers);
  t->headers = NULL;
  CURL *easy = t->easy;
  if (!easy && f->pooled > 0) {
    easy = f->pool[--f->pooled];
    curl_easy_reset(easy);
  }
  if (!easy) easy = curl_easy_init();
  if (!easy) {
    snprintf(t->reason, sizeof t->reason, "curl_easy_init failed (out of memory?)");
    fail_fatal(f, t, t->reason);
    return;
  }
  t->easy = easy;
  const WkFetchConfig *c = &f->config;
  const WkS3Config *s3 = t->target->s3;
  SETOPT(CURLOPT_URL, t->target->url);
  SETOPT(CURLOPT_PRIVATE, t);
  SETOPT(CURLOPT_WRITEFUNCTION, on_body);
  SETOPT(CURLOPT_WRITEDATA, t);
  SETOPT(CURLOPT_HEADERFUNCTION, on_header);
  SETOPT(CURLOPT_HEADERDATA, t);
  SETOPT(CURLOPT_ERRORBUFFER, t->curl_error);
  SETOPT(CURLOPT_NOSIGNAL, 1L);
  SETOPT(CURLOPT_CONNECTTIMEOUT_MS, (long)c->connect_timeout_ms);
  SETOPT(CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_2TLS);
  SETOPT(CURLOPT_PIPEWAIT, 1L);
  SETOPT(CURLOPT_PROTOCOLS_STR, "http,https");
  SETOPT(CURLOPT_SSL_VERIFYPEER, 1L);
  SETOPT(CURLOPT_SSL_VERIFYHOST, 2L);
  SETOPT(CURLOPT_USERAGENT, USER_AGENT);
  if (f->ca_bundle) SETOPT(CURLOPT_CAINFO, f->ca_bundle);
  if (!s3) {
    SETOPT(CURLOPT_FOLLOWLOCATION, 1L);
    SETOPT(CURLOPT_MAXREDIRS, (long)MAX_REDIRECTS);
    SETOPT(CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  }
  if (!t->whole) {
    snprintf(t->range, sizeof t->range, "%llu-%llu", (unsigned long long)(t->begin + t->received),
             (unsigned long long)(t->end - 1));
    SETOPT(CURLOPT_RANGE, t->range);
  }
  char header[WK_REMOTE_VALIDATOR_CAPACITY + 32];
  const WkFetchRequest *first = t->parts[0];
  struct {
    const char *name, *value;
  } extra[] = {{"If-None-Match", t->whole ? first->if_none_match : NULL},
               {"If-Modified-Since", t->whole ? first->if_modified_since : NULL},
               {"x-amz-content-sha256", s3 ? EMPTY_PAYLOAD_SHA256 : NULL}};
  for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
    if (!extra[i].value || !extra[i].value[0]) continue;
    snprintf(header, sizeof header, "%s: %s", extra[i].name, extra[i].value);
    struct curl_slist *more = curl_slist_append(t->headers, header);
    if (!more) {
      snprintf(why, sizeof why, "out of memory for request headers");
      goto fail;
    }
    t->headers = more;
  }
  if (s3 && s3->token_header) {
    struct curl_slist *more = curl_slist_append(t->headers, s3->token_header);
    if (!more) {
      snprintf(why, sizeof why, "out of memory for request headers");
      goto fail;
    }
    t->headers = more;
  }
  if (t->headers) SETOPT(CURLOPT_HTTPHEADER, t->headers);
  if (s3 && s3->sign) {
    SETOPT(CURLOPT_AWS_SIGV4, s3->sigv4);
    SETOPT(CURLOPT_USERPWD, s3->userpwd);
  }
  t->last_byte_ns = t->attempt_start_ns = t->window_start_ns = wk_now_ns();
  CURLMcode added = curl_multi_add_handle(f->multi, easy);
  if (added != CURLM_OK) {
    snprintf(why, sizeof why, "curl_multi_add_handle: %s", curl_multi_strerror(added));
    goto fail;
  }
  t->next = f->active;
  f->active = t;
  f->active_count++;
  return;
fail:
  fail_fatal(f, t, why);
}
#undef SETOPT

/* Why the next attempt waits `delay`: the server's Retry-After (honoured up to retry.c's cap) or backoff. */
static void wait_reason(const Transfer *t, int64_t retry_after_s, uint64_t delay, char *out, size_t capacity) {
  if (retry_after_s > 0 && (uint64_t)retry_after_s * NS_PER_S > delay)
    snprintf(out, capacity, "as the server asked (Retry-After: %lld s, honoured up to %.0f s)", (long long)retry_after_s,
             (double)wk_retry_max_delay_ns() / 1e9);
  else if (retry_after_s > 0) snprintf(out, capacity, "as the server asked (Retry-After: %lld s)", (long long)retry_after_s);
  else snprintf(out, capacity, "backing off after %u failed attempt%s", t->attempts, t->attempts == 1 ? "" : "s");
}

/* Logs the wait before the next attempt: at info level, or one warning line when it is long (one per such
 * wait of the engine's, not one per transfer waiting alike). */
static void log_wait(WkFetch *f, const Transfer *t, const char *what, const char *why, int64_t retry_after_s,
                     uint64_t delay, uint64_t now) {
  char because[160];
  wait_reason(t, retry_after_s, delay, because, sizeof because);
  bool warn = delay >= LONG_WAIT_NS && now >= f->quiet_until_ns;
  if (warn) f->quiet_until_ns = now + delay;
  wk_logf(warn ? WK_LOG_WARN : WK_LOG_INFO, "waiting %.1f s before attempt %u of %s, %s: %s", (double)delay / 1e9,
          t->attempts + 1, what, because, why);
}

/* A retryable failure: schedule the next attempt (resuming a range where it stopped), or give up when the
 * attempts are spent or the next could not start before the request's deadline. */
static void retry_or_fail(WkFetch *f, Transfer *t, WkRetryCause cause, const char *why) {
  char what[WK_REMOTE_ERROR_CAPACITY];
  describe(t, what, sizeof what);
  if (why != t->reason) snprintf(t->reason, sizeof t->reason, "%s", why);
  if (cause == WK_RETRY_FATAL) {
    fail_fatal(f, t, why);
    return;
  }
  uint64_t now = wk_now_ns();
  curl_off_t retry_after = 0;
  if (t->easy) curl_easy_getinfo(t->easy, CURLINFO_RETRY_AFTER, &retry_after);
  uint64_t delay = wk_retry_delay_ns(t->attempts + 1, (int64_t)retry_after, &f->rng);
  bool out_of_attempts = t->attempts > (uint32_t)f->config.retries;
  if (out_of_attempts || now + delay >= t->request_deadline_ns) {
    char limit[320] = "", because[160], message[WK_REMOTE_ERROR_CAPACITY];
    wait_reason(t, (int64_t)retry_after, delay, because, sizeof because);
    if (!out_of_attempts)
      snprintf(limit, sizeof limit, " in %.1f s: request_timeout_ms=%lld bounds a request with all its attempts%s%s",
               (double)(now - t->request_start_ns) / 1e9, (long long)f->config.request_timeout_ms,
               now < t->request_deadline_ns ? ", and the next could not start before it ends, waiting " : "",
               now < t->request_deadline_ns ? because : "");
    snprintf(message, sizeof message, "%s: %s; gave up after %u attempt%s%s (last HTTP status %ld)", what, why,
             t->attempts, t->attempts == 1 ? "" : "s", limit, t->last_status);
    finish(f, t, cause == WK_RETRY_TIMEOUT || !out_of_attempts ? WK_ERR_TIMEOUT : WK_ERR_NETWORK, message);
    return;
  }
  atomic_fetch_add_explicit(&f->retries[cause], 1, memory_order_relaxed);
  log_wait(f, t, what, why, (int64_t)retry_after, delay, now);
  t->due_ns = now + delay;
  t->next = f->waiting;
  f->waiting = t;
}

static void remove_active(WkFetch *f, Transfer *t) {
  for (Transfer **p = &f->active; *p; p = &(*p)->next)
    if (*p == t) {
      *p = t->next;
      f->active_count--;
      break;
    }
  t->next = NULL;
  curl_multi_remove_handle(f->multi, t->easy);
}

static void on_done(WkFetch *f, Transfer *t, CURLcode code) {
  remove_active(f, t);
  char why[WK_REMOTE_ERROR_CAPACITY];
  if (t->fatal) {
    fail_fatal(f, t, t->reason);
    return;
  }
  if (t->cut) {
    retry_or_fail(f, t, WK_RETRY_TIMEOUT, t->reason);
    return;
  }
  if (code == CURLE_OUT_OF_MEMORY && !t->checked) { /* what libcurl says of a header line over its limit */
    snprintf(why, sizeof why, "the response's headers are too large: a header line longer than libcurl's limit of "
             "%d bytes, after %llu bytes of headers", CURL_MAX_HTTP_HEADER, (unsigned long long)t->header_bytes);
    fail_fatal(f, t, why);
    return;
  }
  if (code != CURLE_OK) {
    snprintf(why, sizeof why, "%s%s%s", curl_easy_strerror(code), t->curl_error[0] ? ": " : "", t->curl_error);
    if (code == CURLE_PEER_FAILED_VERIFICATION || code == CURLE_SSL_CACERT_BADFILE)
      snprintf(why + strlen(why), sizeof why - strlen(why),
               " (TLS verification is always on: give the server's CA with WICK_CA_BUNDLE=path.pem)");
    retry_or_fail(f, t, wk_retry_classify(code, 0, false), why);
    return;
  }
  if (!t->checked) check_response(t); /* a response without a body */
  if (t->fatal) {
    fail_fatal(f, t, t->reason);
    return;
  }
  if (!t->discarding) {
    uint64_t expected = t->end - t->begin;
    if (t->whole || t->received == expected) {
      finish(f, t, WK_OK, "");
    } else {
      snprintf(why, sizeof why, "body cut short at %llu of %llu bytes", (unsigned long long)t->received,
               (unsigned long long)expected);
      retry_or_fail(f, t, WK_RETRY_RESET, why);
    }
    return;
  }
  if (t->status == 304 && t->whole && (t->parts[0]->if_none_match || t->parts[0]->if_modified_since)) {
    finish(f, t, WK_OK, "");
    return;
  }
  curl_off_t retry_after = 0;
  curl_easy_getinfo(t->easy, CURLINFO_RETRY_AFTER, &retry_after);
  char code_text[128];
  error_code(t, code_text, sizeof code_text);
  WkRetryCause cause = wk_retry_classify(CURLE_OK, t->status, retry_after > 0);
  const char *hint = t->status == 404 ? ": not found (check the URL; was the dataset moved or deleted?)"
                     : t->status != 403 ? ""
                     : t->target->s3 ? ": access denied by the bucket (check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
                                       "AWS_SESSION_TOKEN and the bucket's policy)"
                                     : ": access denied (check the server's permissions)";
  snprintf(why, sizeof why, "HTTP %ld%s%s", t->status, code_text, hint);
  retry_or_fail(f, t, cause, why);
}

/* ---- starting --------------------------------------------------------------------------------------- */

static bool mergeable(const Transfer *t, const WkFetchRequest *q) {
  if (q->target != t->target || q->whole || q->dst || q->urgent || t->count == MERGE_MAX_PARTS) return false;
  uint64_t q_end = q->offset + q->length;
  if (q->offset >= t->end) return q->offset - t->end <= MERGE_GAP_BYTES && q_end - t->begin <= MERGE_MAX_BYTES;
  if (q_end <= t->begin) return t->begin - q_end <= MERGE_GAP_BYTES && t->end - q->offset <= MERGE_MAX_BYTES;
  return false; /* overlapping: kept apart */
}

static void add_part(Transfer *t, WkFetchRequest *q) {
  uint32_t at = t->count++;
  while (at > 0 && t->parts[at - 1]->offset > q->offset) {
    t->parts[at] = t->parts[at - 1];
    at--;
  }
  t->parts[at] = q;
  if (q->offset < t->begin) t->begin = q->offset;
  if (q->offset + q->length > t->end) t->end = q->offset + q->length;
}

static void merge_neighbours(WkFetch *f, Transfer *t) {
  bool grew = true;
  while (grew) {
    grew = false;
    WkFetchRequest *previous = NULL;
    for (WkFetchRequest *q = f->queued; q; previous = q, q = q->next) {
      if (!mergeable(t, q)) continue;
      unlink_request(&f->queued, &f->queued_tail, q, previous);
      if (q->start && !q->start(q)) {
        atomic_fetch_add_explicit(&f->dropped, 1, memory_order_relaxed);
      } else {
        add_part(t, q);
      }
      grew = true;
      break;
    }
  }
}

static void start_transfer(WkFetch *f, WkFetchRequest *r) {
  Transfer *t = calloc(1, sizeof *t);
  if (!t) {
    fail_request(f, r, WK_ERR_NOMEM, "out of memory starting a transfer");
    return;
  }
  t->fetch = f;
  t->target = r->target;
  t->whole = r->whole;
  t->urgent = r->urgent;
  t->parts[t->count++] = r;
  if (r->whole) {
    t->begin = 0;
    t->end = r->max_bytes; /* the most the buffer may grow to */
  } else {
    t->begin = r->offset;
    t->end = r->offset + r->length;
    if (!r->urgent && !r->dst) merge_neighbours(f, t);
  }
  if (!r->whole && t->count == 1 && r->dst) {
    t->buffer = r->dst;
    t->capacity = r->length;
  } else {
    t->capacity = r->whole ? (r->max_bytes < (1u << 16) ? r->max_bytes : (1u << 16)) : t->end - t->begin;
    t->buffer = malloc(t->capacity ? (size_t)t->capacity : 1);
    t->own_buffer = true;
    if (!t->buffer) {
      for (uint32_t i = 0; i < t->count; i++) fail_request(f, t->parts[i], WK_ERR_NOMEM, "out of memory for a transfer");
      free(t);
      return;
    }
  }
  if (!t->urgent && !t->whole) f->prefetch_in_flight += t->end - t->begin;
  t->request_start_ns = wk_now_ns();
  t->request_deadline_ns = t->request_start_ns + (uint64_t)f->config.request_timeout_ms * NS_PER_MS;
  begin_attempt(f, t);
}

static void start_new(WkFetch *f) {
  while (f->active_count < (uint32_t)f->config.max_transfers) {
    WkFetchRequest *r = pop(&f->urgent, &f->urgent_tail);
    if (!r) {
      r = f->queued;
      if (!r) return;
      if (f->prefetch_in_flight > 0 && f->prefetch_in_flight + r->length > (uint64_t)f->config.prefetch_bytes) return;
      pop(&f->queued, &f->queued_tail);
    }
    if (r->start && !r->start(r)) {
      atomic_fetch_add_explicit(&f->dropped, 1, memory_order_relaxed);
      continue;
    }
    start_transfer(f, r);
  }
}

static void start_due(WkFetch *f, uint64_t now) {
  for (Transfer **p = &f->waiting; *p;) {
    Transfer *t = *p;
    if (t->due_ns <= now && f->active_count < (uint32_t)f->config.max_transfers) {
      *p = t->next;
      t->next = NULL;
      if (t->easy) {
        curl_easy_cleanup(t->easy); /* a fresh handle: the old one may hold a broken connection */
        t->easy = NULL;
      }
      begin_attempt(f, t);
    } else {
      p = &t->next;
    }
  }
}

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
        on_done(f, t, CURLE_OPERATION_TIMEDOUT);
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
    if (t) on_done(f, t, code);
  }
}

static void fail_all(WkFetch *f) {
  static const char CLOSED[] = "the dataset was closed while this request was in flight";
  while (f->active) {
    Transfer *t = f->active;
    remove_active(f, t);
    finish(f, t, WK_ERR_CLOSED, CLOSED);
  }
  while (f->waiting) {
    Transfer *t = f->waiting;
    f->waiting = t->next;
    finish(f, t, WK_ERR_CLOSED, CLOSED);
  }
  WkFetchRequest *r;
  while ((r = pop(&f->urgent, &f->urgent_tail))) fail_request(f, r, WK_ERR_CLOSED, CLOSED);
  while ((r = pop(&f->queued, &f->queued_tail))) fail_request(f, r, WK_ERR_CLOSED, CLOSED);
}

static void *engine_main(void *arg) {
  WkFetch *f = arg;
  for (;;) {
    pthread_mutex_lock(&f->lock);
    WkFetchRequest *in = f->incoming;
    f->incoming = f->incoming_tail = NULL;
    bool stopping = f->stopping;
    pthread_mutex_unlock(&f->lock);
    while (in) {
      WkFetchRequest *next = in->next;
      if (in->urgent) push(&f->urgent, &f->urgent_tail, in);
      else push(&f->queued, &f->queued_tail, in);
      in = next;
    }
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
    start_due(f, now);
    start_new(f); /* a handle just added makes the poll below return at once */
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
    int rc = pthread_create(&f->thread, NULL, engine_main, f);
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
  pthread_mutex_lock(&f->lock);
  bool stopping = f->stopping;
  if (!stopping) push(&f->incoming, &f->incoming_tail, r);
  pthread_mutex_unlock(&f->lock);
  if (stopping) {
    fail_request(f, r, WK_ERR_CLOSED, "the dataset is closing");
    return;
  }
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
