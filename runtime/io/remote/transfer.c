/*
 * transfer.c — one transfer's life in the fetch engine (fetch.c), all on the engine thread: started
 * from a request (a prefetch merged with queued neighbours of the same object into one Range request),
 * each attempt set up on an easy handle, its response checked (status, Content-Range, size) and its body
 * cut back into the requests as it arrives, then resumed by Range when cut short, retried with backoff
 * (retry.c) when the failure is one that is retried, or finished: every request it carries completes.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>  /* strncasecmp */

#include "transfer.h"

#define TEXT(x) #x
#define VERSION_TEXT(a, b, c) TEXT(a) "." TEXT(b) "." TEXT(c)
static const char USER_AGENT[] = "wick/" VERSION_TEXT(WK_VERSION_MAJOR, WK_VERSION_MINOR, WK_VERSION_PATCH);
/* SHA-256 of the empty body: the payload hash of every S3 request here (all GETs). */
static const char EMPTY_PAYLOAD_SHA256[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

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

void fetch_fail_request(WkFetch *f, WkFetchRequest *r, WkStatus status, const char *message) {
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
void fetch_finish(WkFetch *f, Transfer *t, WkStatus status, const char *message) {
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
    } else if (r->take_body && t->count == 1 && t->own_buffer) {
      r->body = t->buffer; /* the caller's now: the transfer was this range alone */
      r->body_length = r->length;
      r->body_taken = true;
      r->error[0] = '\0';
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
  fetch_finish(f, t, WK_ERR_NETWORK, message);
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
    fetch_finish(f, t, cause == WK_RETRY_TIMEOUT || !out_of_attempts ? WK_ERR_TIMEOUT : WK_ERR_NETWORK, message);
    return;
  }
  atomic_fetch_add_explicit(&f->retries[cause], 1, memory_order_relaxed);
  log_wait(f, t, what, why, (int64_t)retry_after, delay, now);
  t->due_ns = now + delay;
  t->next = f->waiting;
  f->waiting = t;
}

void fetch_remove_active(WkFetch *f, Transfer *t) {
  for (Transfer **p = &f->active; *p; p = &(*p)->next)
    if (*p == t) {
      *p = t->next;
      f->active_count--;
      break;
    }
  t->next = NULL;
  curl_multi_remove_handle(f->multi, t->easy);
}

void fetch_on_done(WkFetch *f, Transfer *t, CURLcode code) {
  fetch_remove_active(f, t);
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
      fetch_finish(f, t, WK_OK, "");
    } else {
      snprintf(why, sizeof why, "body cut short at %llu of %llu bytes", (unsigned long long)t->received,
               (unsigned long long)expected);
      retry_or_fail(f, t, WK_RETRY_RESET, why);
    }
    return;
  }
  if (t->status == 304 && t->whole && (t->parts[0]->if_none_match || t->parts[0]->if_modified_since)) {
    fetch_finish(f, t, WK_OK, "");
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
      fetch_unlink(&f->queued, &f->queued_tail, q, previous);
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
    fetch_fail_request(f, r, WK_ERR_NOMEM, "out of memory starting a transfer");
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
      for (uint32_t i = 0; i < t->count; i++) fetch_fail_request(f, t->parts[i], WK_ERR_NOMEM, "out of memory for a transfer");
      free(t);
      return;
    }
  }
  if (!t->urgent && !t->whole) f->prefetch_in_flight += t->end - t->begin;
  t->request_start_ns = wk_now_ns();
  t->request_deadline_ns = t->request_start_ns + (uint64_t)f->config.request_timeout_ms * NS_PER_MS;
  begin_attempt(f, t);
}

void fetch_start_new(WkFetch *f) {
  while (f->active_count < (uint32_t)f->config.max_transfers) {
    WkFetchRequest *r = fetch_pop(&f->urgent, &f->urgent_tail);
    if (!r) {
      r = f->queued;
      if (!r) return;
      if (f->prefetch_in_flight > 0 && f->prefetch_in_flight + r->length > (uint64_t)f->config.prefetch_bytes) return;
      fetch_pop(&f->queued, &f->queued_tail);
    }
    if (r->start && !r->start(r)) {
      atomic_fetch_add_explicit(&f->dropped, 1, memory_order_relaxed);
      continue;
    }
    start_transfer(f, r);
  }
}

void fetch_start_due(WkFetch *f, uint64_t now) {
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
