/*
 * store_client.c — the store as a rank sees it: connect (retrying until rank 0 is up), then one
 * request at a time, each bounded by a deadline.
 *
 * A handle may be shared by threads (the collectives' worker posts progress while the main thread
 * waits): a mutex covers each request from send to reply. A request that fails half-way (timeout,
 * dropped connection, malformed reply) leaves the stream out of step, so the handle is then
 * broken and every later call fails at once with the first reason.
 *
 * Connecting includes the handshake (dist.h): the client answers the server's challenge with its
 * proof of the job's secret and checks the server's proof in return, so a rank neither gives the
 * secret away nor talks to a process on MASTER_PORT that does not know it.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../core/secret.h"
#include "dist.h"

enum {
  CONNECT_RETRY_MS = 50,     /* between attempts while rank 0 is not listening yet */
  REPLY_SLACK_MS = 5000,     /* a get's reply may come this long after its server-side timeout */
  BYE_TIMEOUT_MS = 1000,     /* what closing may spend saying bye */
  PEER_CAPACITY = WK_HOST_CAPACITY + 64,
  REASON_CAPACITY = 1024
};

struct WkStore {
  int fd;
  int rank, world_size;
  int64_t timeout_ms;
  pthread_mutex_t lock;
  bool broken;
  char broken_reason[REASON_CAPACITY];
  char peer[PEER_CAPACITY];         /* "the store at host:port" */
  char local_address[INET6_ADDRSTRLEN];
  StoreBuffer out;
  uint8_t *in;
  size_t in_capacity;
  size_t secret_length;             /* 0: the job has no secret */
  uint8_t secret[WK_SECRET_MAX_BYTES];
};

/* ---- connecting --------------------------------------------------------------------------------- */

/* One non-blocking connect to one address, bounded by the deadline; fd or -1 with errno set. */
static int connect_once(const struct addrinfo *ai, int64_t deadline_ms) {
  int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
  if (fd < 0) return -1;
  if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) return fd;
  if (errno != EINPROGRESS) {
    int saved = errno;
    close(fd);
    errno = saved;
    return -1;
  }
  for (;;) {
    int64_t left = net_remaining(deadline_ms);
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    int n = poll(&p, 1, left < 0 || left > INT32_MAX ? -1 : (int)left);
    if (n < 0 && errno == EINTR) continue;
    int error = 0;
    socklen_t length = sizeof error;
    if (n == 0) error = ETIMEDOUT;
    else if (n < 0) error = errno;
    else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0) error = errno;
    if (error == 0) return fd;
    close(fd);
    errno = error;
    return -1;
  }
}

static void remember_local_address(WkStore *s) {
  struct sockaddr_storage a;
  socklen_t length = sizeof a;
  s->local_address[0] = '\0';
  if (getsockname(s->fd, (struct sockaddr *)&a, &length) != 0) return;
  if (a.ss_family == AF_INET) {
    inet_ntop(AF_INET, &((struct sockaddr_in *)&a)->sin_addr, s->local_address, sizeof s->local_address);
  } else if (a.ss_family == AF_INET6) {
    const struct in6_addr *v6 = &((struct sockaddr_in6 *)&a)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(v6)) inet_ntop(AF_INET, &v6->s6_addr[12], s->local_address, sizeof s->local_address);
    else inet_ntop(AF_INET6, v6, s->local_address, sizeof s->local_address);
  }
}

/* Tries every address of host:port until one accepts or the deadline passes. */
static WkStatus connect_until(WkStore *s, const char *host, int port, int64_t deadline_ms) {
  char service[16];
  snprintf(service, sizeof service, "%d", port);
  char last[256] = "no address tried";
  for (;;) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *list = NULL;
    int rc = getaddrinfo(host, service, &hints, &list);
    if (rc != 0) {
      snprintf(last, sizeof last, "cannot resolve '%s': %s", host, gai_strerror(rc));
    } else {
      for (const struct addrinfo *ai = list; ai; ai = ai->ai_next) {
        s->fd = connect_once(ai, deadline_ms);
        if (s->fd >= 0) break;
        snprintf(last, sizeof last, "connect: %s", strerror(errno));
      }
      freeaddrinfo(list);
      if (s->fd >= 0) {
        net_no_delay(s->fd);
        remember_local_address(s);
        return WK_OK;
      }
    }
    int64_t left = net_remaining(deadline_ms);
    if (left == 0) break;
    usleep((useconds_t)(left < 0 || left > CONNECT_RETRY_MS ? CONNECT_RETRY_MS : left) * 1000u);
  }
  return WK_FAIL(WK_ERR_TIMEOUT, "%s: %s, still after %.1f s (is rank 0 running, and are MASTER_ADDR and "
                 "MASTER_PORT the same on every rank?)", s->peer, last, (double)s->timeout_ms / 1000.0);
}

/* ---- one request -------------------------------------------------------------------------------- */

static WkStatus break_store(WkStore *s, WkStatus status) {
  s->broken = true;
  snprintf(s->broken_reason, sizeof s->broken_reason, "%s", wk_last_error());
  return status;
}

static WkStatus check_usable(WkStore *s) {
  if (s->broken) return WK_FAIL(WK_ERR_NETWORK, "%s is unusable after an earlier failure: %s", s->peer, s->broken_reason);
  return WK_OK;
}

/* Reads one frame of at most max bytes into s->in; *body is its length. */
static WkStatus read_frame(WkStore *s, uint32_t max, int64_t deadline_ms, uint32_t *body) {
  uint8_t header[STORE_FRAME_HEADER];
  size_t frame = 0;
  WK_TRY(net_read_exact(s->fd, header, sizeof header, deadline_ms, s->peer));
  if (store_frame_check(header, sizeof header, &frame) == FRAME_INVALID) return WK_ERR_FORMAT;
  *body = (uint32_t)header[0] | (uint32_t)header[1] << 8 | (uint32_t)header[2] << 16 | (uint32_t)header[3] << 24;
  if (*body > max) return WK_FAIL(WK_ERR_FORMAT, "%s sent a message of %u bytes (at most %u here)", s->peer, *body, max);
  if (*body > s->in_capacity) {
    uint8_t *grown = realloc(s->in, *body);
    if (!grown) return WK_FAIL(WK_ERR_NOMEM, "out of memory for a store reply of %u bytes", *body);
    s->in = grown;
    s->in_capacity = *body;
  }
  return net_read_exact(s->fd, s->in, *body, deadline_ms, s->peer);
}

static WkStatus closed_by_server(const WkStore *s) {
  return WK_FAIL(WK_ERR_NETWORK, "%s closed the connection (rank 0, which serves it, has exited or was killed)", s->peer);
}

/* Sends q and, unless it asks for no reply, reads and parses the reply into *y (pointing into
 * s->in). Called with the lock held. */
static WkStatus transact(WkStore *s, const StoreRequest *q, int64_t deadline_ms, StoreReply *y) {
  WK_TRY(check_usable(s));
  s->out.length = 0;
  WK_TRY(store_encode_request(&s->out, q)); /* bad arguments: the stream is still in step */
  WkStatus st = net_write_all(s->fd, s->out.data, s->out.length, deadline_ms, s->peer);
  if (q->flags & STORE_FLAG_NOREPLY || st != WK_OK) {
    if (st == WK_ERR_CLOSED) st = closed_by_server(s);
    return st == WK_OK ? st : break_store(s, st);
  }
  uint32_t body = 0;
  st = read_frame(s, STORE_MAX_FRAME, deadline_ms, &body);
  if (st == WK_OK) st = store_parse_reply((StoreOp)q->op, s->in, body, y);
  if (st == WK_ERR_CLOSED) st = closed_by_server(s);
  if (st != WK_OK) {
    wk_error_context("store %s", store_op_name(q->op));
    return break_store(s, st);
  }
  /* A refused hello is the job's set-up (secret, world size, a rank twice), told by the server. */
  if (y->status == STORE_REPLY_ERROR)
    return WK_FAIL(q->op == STORE_HELLO ? WK_ERR_NETWORK : WK_ERR_INVALID_ARG, "%s refused %s: %.*s", s->peer,
                   store_op_name(q->op), (int)y->value.length, (const char *)y->value.data);
  return WK_OK;
}

/* ---- the handshake ------------------------------------------------------------------------------ */

/* Answers the server's challenge and checks its proof. WK_ERR_CLOSED when the server closed the
 * connection before its challenge (it was too busy to take one more): the caller tries again. */
static WkStatus handshake(WkStore *s, int64_t deadline_ms) {
  uint32_t body = 0;
  StoreChallenge challenge;
  WkStatus st = read_frame(s, STORE_MAX_HELLO_FRAME, deadline_ms, &body);
  if (st == WK_ERR_CLOSED) return st;
  if (st == WK_OK) st = store_parse_challenge(s->in, body, &challenge);
  if (st != WK_OK) return wk_error_context("%s: the handshake", s->peer);
  if (challenge.keyed && !s->secret_length)
    return WK_FAIL(WK_ERR_NETWORK, "%s requires the job's secret, and this rank has none (give every rank the same "
                   "WICK_STORE_SECRET or WICK_STORE_SECRET_FILE)", s->peer);
  if (!challenge.keyed && s->secret_length)
    return WK_FAIL(WK_ERR_NETWORK, "%s has no job secret, but this rank has one (the store of another job, or "
                   "WICK_STORE_SECRET set on some ranks only?)", s->peer);
  uint8_t nonce[STORE_NONCE_BYTES], proof[STORE_PROOF_BYTES];
  WK_TRY(wk_random_bytes(nonce, sizeof nonce));
  StoreRequest hello = {.op = STORE_HELLO, .number = s->rank, .world_size = s->world_size,
                        .value = {nonce, STORE_NONCE_BYTES}};
  if (s->secret_length) {
    store_proof(s->secret, s->secret_length, STORE_PROOF_CLIENT, challenge.nonce, nonce, s->rank, s->world_size, proof);
    hello.value2 = (StoreBytes){proof, STORE_PROOF_BYTES};
  }
  StoreReply y;
  WK_TRY(transact(s, &hello, deadline_ms, &y));
  if (!s->secret_length) return WK_OK;
  store_proof(s->secret, s->secret_length, STORE_PROOF_SERVER, challenge.nonce, nonce, s->rank, s->world_size, proof);
  if (y.value.length != STORE_PROOF_BYTES || !wk_digest_equal(y.value.data, proof, STORE_PROOF_BYTES))
    return WK_FAIL(WK_ERR_NETWORK, "%s did not prove it knows the job's secret (another process listens on "
                   "MASTER_PORT?)", s->peer);
  return WK_OK;
}

/* Connects and shakes hands, again while the server turns connections away, until the deadline. */
static WkStatus open_connection(WkStore *s, const char *host, int port, int64_t deadline_ms) {
  for (;;) {
    WK_TRY(connect_until(s, host, port, deadline_ms));
    WkStatus st = handshake(s, deadline_ms);
    if (st != WK_ERR_CLOSED) return st;
    close(s->fd);
    s->fd = -1;
    if (net_remaining(deadline_ms) == 0)
      return WK_FAIL(WK_ERR_TIMEOUT, "%s closed every connection before its handshake within %.1f s (too many "
                     "connections to it?)", s->peer, (double)s->timeout_ms / 1000.0);
    usleep(CONNECT_RETRY_MS * 1000u);
  }
}

static WkStatus check_key(const char *key, StoreBytes *out) {
  size_t length = key ? strlen(key) : 0;
  if (length == 0 || length > STORE_MAX_KEY)
    return WK_FAIL(WK_ERR_INVALID_ARG, "store key must be 1..%d bytes, got %zu", STORE_MAX_KEY, length);
  *out = (StoreBytes){(const uint8_t *)key, (uint32_t)length};
  return WK_OK;
}

static WkStatus check_value(const char *key, const void *value, size_t length, StoreBytes *out) {
  if (length > STORE_MAX_VALUE)
    return WK_FAIL(WK_ERR_INVALID_ARG, "store key '%.200s': a value of %zu bytes (at most %d)", key, length, STORE_MAX_VALUE);
  if (length && !value) return WK_FAIL(WK_ERR_INVALID_ARG, "store value is NULL with length %zu", length);
  *out = (StoreBytes){value, (uint32_t)length};
  return WK_OK;
}

static WkStatus check_timeout(int64_t timeout_ms) {
  if (timeout_ms < 0 || timeout_ms > STORE_MAX_TIMEOUT_MS)
    return WK_FAIL(WK_ERR_INVALID_ARG, "store timeout %lld ms out of range 0..%lld (every wait needs a bound)",
                   (long long)timeout_ms, (long long)STORE_MAX_TIMEOUT_MS);
  return WK_OK;
}

static WkStatus check_store(const WkStore *s) {
  if (!s) return WK_FAIL(WK_ERR_INVALID_ARG, "store is NULL");
  return WK_OK;
}

/* Copies a reply's value out (the get/compare-set convention of wick.h). */
static WkStatus copy_value(StoreBytes v, void *buffer, size_t capacity, size_t *length, const char *key) {
  if (length) *length = v.length;
  if (v.length > capacity)
    return WK_FAIL(WK_ERR_INVALID_ARG, "store key '%s' holds %u bytes, more than the buffer's %zu", key, v.length, capacity);
  if (v.length) memcpy(buffer, v.data, v.length);
  return WK_OK;
}

/* ---- the public calls --------------------------------------------------------------------------- */

WkStore *store_connect_keyed(const char *host, int port, int rank, int world_size, int64_t timeout_ms,
                             const uint8_t *secret, size_t secret_length) {
  if (!host || !*host || strlen(host) >= WK_HOST_CAPACITY || port < 1 || port > UINT16_MAX) {
    WK_FAIL(WK_ERR_INVALID_ARG, "store: host must be 1..%d characters and port 1..65535 (got '%s':%d)",
            WK_HOST_CAPACITY - 1, host ? host : "(null)", port);
    return NULL;
  }
  if (check_timeout(timeout_ms) != WK_OK) return NULL;
  if (rank < -1 || (rank >= 0 && (world_size < 1 || rank >= world_size)) || (rank < 0 && world_size != 0) ||
      world_size > STORE_MAX_WORLD) {
    WK_FAIL(WK_ERR_INVALID_ARG, "store: rank %d of a world of %d (a rank below world size, or -1 and 0 for "
            "anonymous)", rank, world_size);
    return NULL;
  }
  if (secret_length > WK_SECRET_MAX_BYTES || (secret_length && !secret)) {
    WK_FAIL(WK_ERR_INVALID_ARG, "store: a secret of %zu bytes (at most %d)", secret_length, WK_SECRET_MAX_BYTES);
    return NULL;
  }
  WkStore *s = wk_calloc(1, sizeof *s, "store client");
  if (!s) return NULL;
  s->fd = -1;
  s->rank = rank;
  s->world_size = world_size;
  s->timeout_ms = timeout_ms;
  if (secret_length) memcpy(s->secret, secret, secret_length);
  s->secret_length = secret_length;
  snprintf(s->peer, sizeof s->peer, "the store at %s:%d", host, port);
  pthread_mutex_init(&s->lock, NULL);
  if (open_connection(s, host, port, net_deadline(timeout_ms)) != WK_OK) {
    if (s->fd >= 0) close(s->fd);
    store_buffer_free(&s->out);
    free(s->in);
    pthread_mutex_destroy(&s->lock);
    free(s);
    return NULL;
  }
  return s;
}

WkStore *wk_store_connect(const char *host, int port, int rank, int world_size, int64_t timeout_ms) {
  const uint8_t *secret;
  size_t length;
  if (wk_job_secret(&secret, &length) != WK_OK) {
    wk_error_context("store");
    return NULL;
  }
  return store_connect_keyed(host, port, rank, world_size, timeout_ms, secret, length);
}

void wk_store_close(WkStore *s) {
  if (!s) return;
  pthread_mutex_lock(&s->lock);
  if (!s->broken) {
    StoreRequest bye = {.op = STORE_BYE};
    StoreReply y;
    int64_t wait = s->timeout_ms < BYE_TIMEOUT_MS ? s->timeout_ms : BYE_TIMEOUT_MS;
    if (transact(s, &bye, net_deadline(wait), &y) != WK_OK)
      wk_logf(WK_LOG_INFO, "store: bye not acknowledged: %s", wk_last_error());
  }
  pthread_mutex_unlock(&s->lock);
  close(s->fd);
  store_buffer_free(&s->out);
  free(s->in);
  pthread_mutex_destroy(&s->lock);
  free(s);
}

static WkStatus set_with(WkStore *s, const char *key, const void *value, size_t length, uint8_t flags) {
  WK_TRY(check_store(s));
  StoreRequest q = {.op = STORE_SET, .flags = flags, .key_count = 1};
  WK_TRY(check_key(key, &q.keys[0]));
  WK_TRY(check_value(key, value, length, &q.value));
  pthread_mutex_lock(&s->lock);
  StoreReply y;
  WkStatus st = transact(s, &q, net_deadline(s->timeout_ms), &y);
  pthread_mutex_unlock(&s->lock);
  return st;
}

WkStatus wk_store_set(WkStore *s, const char *key, const void *value, size_t length) {
  return set_with(s, key, value, length, 0);
}

WkStatus store_post(WkStore *s, const char *key, const void *value, size_t length) {
  return set_with(s, key, value, length, STORE_FLAG_NOREPLY);
}

/* A get under the lock: on success *y points into s->in until the lock is released. */
static WkStatus locked_get(WkStore *s, const char *key, int64_t timeout_ms, StoreReply *y) {
  StoreRequest q = {.op = STORE_GET, .key_count = 1, .number = timeout_ms};
  WK_TRY(check_key(key, &q.keys[0]));
  WK_TRY(transact(s, &q, net_deadline(timeout_ms + REPLY_SLACK_MS), y));
  if (y->status == STORE_REPLY_MISSING)
    return WK_FAIL(WK_ERR_TIMEOUT, "store key '%s' was not set within %.1f s", key, (double)timeout_ms / 1000.0);
  return WK_OK;
}

WkStatus wk_store_get(WkStore *s, const char *key, int64_t timeout_ms, void *buffer, size_t capacity, size_t *length) {
  WK_TRY(check_store(s));
  WK_TRY(check_timeout(timeout_ms));
  if (capacity && !buffer) return WK_FAIL(WK_ERR_INVALID_ARG, "store get: buffer is NULL with capacity %zu", capacity);
  pthread_mutex_lock(&s->lock);
  StoreReply y;
  WkStatus st = locked_get(s, key, timeout_ms, &y);
  if (st == WK_OK) st = copy_value(y.value, buffer, capacity, length, key);
  pthread_mutex_unlock(&s->lock);
  return st;
}

WkStatus store_get_alloc(WkStore *s, const char *key, int64_t timeout_ms, uint8_t **value, size_t *length) {
  WK_TRY(check_store(s));
  WK_TRY(check_timeout(timeout_ms));
  *value = NULL;
  pthread_mutex_lock(&s->lock);
  StoreReply y;
  WkStatus st = locked_get(s, key, timeout_ms, &y);
  if (st == WK_OK) {
    *value = wk_malloc(y.value.length + 1, "store value");
    if (!*value) {
      st = WK_ERR_NOMEM;
    } else {
      if (y.value.length) memcpy(*value, y.value.data, y.value.length);
      (*value)[y.value.length] = '\0'; /* text values can be used as C strings */
      *length = y.value.length;
    }
  }
  pthread_mutex_unlock(&s->lock);
  return st;
}

WkStatus wk_store_wait(WkStore *s, const char *const *keys, uint32_t count, int64_t timeout_ms) {
  WK_TRY(check_store(s));
  WK_TRY(check_timeout(timeout_ms));
  if (count < 1 || count > STORE_MAX_WAIT_KEYS || !keys)
    return WK_FAIL(WK_ERR_INVALID_ARG, "store wait: %u keys (must be 1..%d)", count, STORE_MAX_WAIT_KEYS);
  StoreRequest q = {.op = STORE_WAIT, .key_count = count, .number = timeout_ms};
  for (uint32_t i = 0; i < count; i++) WK_TRY(check_key(keys[i], &q.keys[i]));
  pthread_mutex_lock(&s->lock);
  StoreReply y;
  WkStatus st = transact(s, &q, net_deadline(timeout_ms + REPLY_SLACK_MS), &y);
  pthread_mutex_unlock(&s->lock);
  if (st == WK_OK && y.status == STORE_REPLY_MISSING)
    return WK_FAIL(WK_ERR_TIMEOUT, "store wait: key '%s'%s not set within %.1f s", keys[0],
                   count > 1 ? " (or another of the keys)" : "", (double)timeout_ms / 1000.0);
  return st;
}

WkStatus wk_store_add(WkStore *s, const char *key, int64_t delta, int64_t *value) {
  WK_TRY(check_store(s));
  StoreRequest q = {.op = STORE_ADD, .key_count = 1, .number = delta};
  WK_TRY(check_key(key, &q.keys[0]));
  pthread_mutex_lock(&s->lock);
  StoreReply y;
  WkStatus st = transact(s, &q, net_deadline(s->timeout_ms), &y);
  pthread_mutex_unlock(&s->lock);
  if (st == WK_OK && value) *value = y.number;
  return st;
}

WkStatus wk_store_compare_set(WkStore *s, const char *key, const void *expected, size_t expected_length,
                              const void *desired, size_t desired_length, void *buffer, size_t capacity,
                              size_t *length, int *swapped) {
  WK_TRY(check_store(s));
  StoreRequest q = {.op = STORE_CAS, .key_count = 1};
  WK_TRY(check_key(key, &q.keys[0]));
  WK_TRY(check_value(key, expected, expected_length, &q.value));
  WK_TRY(check_value(key, desired, desired_length, &q.value2));
  if (capacity && !buffer) return WK_FAIL(WK_ERR_INVALID_ARG, "store compare_set: buffer is NULL with capacity %zu", capacity);
  pthread_mutex_lock(&s->lock);
  StoreReply y;
  WkStatus st = transact(s, &q, net_deadline(s->timeout_ms), &y);
  if (st == WK_OK) {
    if (swapped) *swapped = y.swapped;
    st = copy_value(y.value, buffer, capacity, length, key);
  }
  pthread_mutex_unlock(&s->lock);
  return st;
}

/* ---- for the collectives ------------------------------------------------------------------------ */

const char *store_local_address(const WkStore *s) { return s->local_address; }

WkStatus store_rank_states(WkStore *s, uint8_t *states, uint32_t count, int64_t timeout_ms) {
  WK_TRY(check_store(s));
  StoreRequest q = {.op = STORE_STATUS};
  pthread_mutex_lock(&s->lock);
  StoreReply y;
  WkStatus st = transact(s, &q, net_deadline(timeout_ms), &y);
  if (st == WK_OK) {
    if (y.value.length != count) {
      st = WK_FAIL(WK_ERR_FORMAT, "%s knows %u ranks, this rank expects %u", s->peer, y.value.length, count);
    } else {
      memcpy(states, y.value.data, count);
    }
  }
  pthread_mutex_unlock(&s->lock);
  return st;
}
