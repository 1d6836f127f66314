/*
 * transfer.h — the fetch engine's state (struct WkFetch) and one transfer's (struct Transfer), shared by
 * fetch.c (the engine thread and the API) and transfer.c (a transfer's life: started, possibly merged with
 * its neighbours, its attempts and their callbacks, retried or finished). Internal to runtime/io/remote.
 */
#ifndef WK_IO_REMOTE_TRANSFER_H
#define WK_IO_REMOTE_TRANSFER_H

#include <curl/curl.h>
#include <pthread.h>

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
  bool hurried;                 /* a request was marked hurry (under lock) */
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

/* ---- request queues (the engine thread's, and `incoming` under the lock) ---------------------------- */

static inline void fetch_push(WkFetchRequest **head, WkFetchRequest **tail, WkFetchRequest *r) {
  r->next = NULL;
  if (*tail) (*tail)->next = r;
  else *head = r;
  *tail = r;
}

static inline WkFetchRequest *fetch_pop(WkFetchRequest **head, WkFetchRequest **tail) {
  WkFetchRequest *r = *head;
  if (r) {
    *head = r->next;
    if (!*head) *tail = NULL;
    r->next = NULL;
  }
  return r;
}

static inline void fetch_unlink(WkFetchRequest **head, WkFetchRequest **tail, WkFetchRequest *r,
                                WkFetchRequest *previous) {
  if (previous) previous->next = r->next;
  else *head = r->next;
  if (*tail == r) *tail = previous;
  r->next = NULL;
}

/* ---- transfer.c ------------------------------------------------------------------------------------ */

/* Starts the urgent requests, then prefetches within their budget (merged with queued neighbours). */
void fetch_start_new(WkFetch *f);
/* Starts the attempts whose backoff has passed. */
void fetch_start_due(WkFetch *f, uint64_t now);
/* libcurl finished an attempt of t: resumes, retries or finishes it. */
void fetch_on_done(WkFetch *f, Transfer *t, CURLcode code);
/* Ends t (and every request merged into it) with status and message. */
void fetch_finish(WkFetch *f, Transfer *t, WkStatus status, const char *message);
/* Takes t out of the multi handle and the active list. */
void fetch_remove_active(WkFetch *f, Transfer *t);
/* Ends a request that never started. */
void fetch_fail_request(WkFetch *f, WkFetchRequest *r, WkStatus status, const char *message);

#endif /* WK_IO_REMOTE_TRANSFER_H */
