/*
 * store_server.c — the rendezvous store rank 0 serves: a key-value map behind one poll() loop on
 * a thread of its own.
 *
 * Every connection is non-blocking and has at most one request in progress: a get or wait whose
 * key is not there yet parks the connection (nothing more is read from it) until a set, add or
 * compare-and-set provides the key, or its timeout answers 'missing'. A malformed frame is
 * answered with an error and the connection is closed after it; nothing a peer sends can make the
 * server allocate past a frame (STORE_MAX_FRAME) per connection or the map past its budget
 * (StoreLimits).
 *
 * The server also remembers, per rank, whether it said hello, bye, or dropped its connection
 * without a bye: the hang report asks for that (STATUS) to tell a killed rank from a slow one.
 *
 * The store is the job's alone. It listens on one address, the one the ranks reach it at
 * (MASTER_ADDR's), and every connection must pass the handshake (dist.h) before anything else is
 * read from it: a hello proving the job's secret, with the job's world size, for a rank that is not
 * connected already. Until then a connection may send at most STORE_MAX_HELLO_FRAME bytes, within
 * the limits' handshake timeout, and at most MAX_HANDSHAKES are open at once; a refused one is
 * logged with its peer address (the first MAX_REFUSALS_LOGGED of them), closed, and changes nothing.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <xxhash.h>

#include "../core/secret.h"
#include "dist.h"

enum {
  BUCKETS = 4096,                       /* hash buckets of the map (chained) */
  READ_CHUNK = 64 * 1024,               /* bytes read per readable event */
  ACCEPT_BACKOFF_MS = 100,              /* pause accepting when out of file descriptors */
  DECIMAL_CAPACITY = 24,                /* an int64 in decimal, sign and NUL included */
  EXTRA_CONNECTIONS = 256,              /* beyond one per rank: anonymous clients (tools, tests) */
  MAX_HANDSHAKES = 64,                  /* connections not authenticated yet, at once */
  MAX_REFUSALS_LOGGED = 16,             /* a scanner must not fill the log */
  PEER_NAME_CAPACITY = INET6_ADDRSTRLEN + 8
};

typedef struct Entry {
  struct Entry *next;
  uint64_t hash;
  uint32_t key_length, value_length;
  uint8_t *value;
  char key[];
} Entry;

typedef struct {
  int fd;
  int rank;                 /* from hello; -1 anonymous */
  bool authenticated;       /* its hello was accepted: only then are other requests handled */
  int64_t handshake_deadline_ms;
  uint8_t nonce[STORE_NONCE_BYTES];  /* the challenge it was sent */
  char peer[PEER_NAME_CAPACITY];     /* "10.0.0.2:41234", for the log */
  bool said_bye;
  bool close_after_flush;   /* a protocol error was answered: drop the connection once sent */
  bool waiting;             /* a get or wait is parked; its frame stays at in[0..] */
  int64_t deadline_ms;
  StoreRequest pending;
  uint8_t *in;
  size_t in_length, in_capacity;
  StoreBuffer out;
  size_t out_sent;
} Connection;

struct WkStoreServer {
  int listen_fd;
  int wake[2];              /* pipe: the owner asks the thread to stop */
  int port;
  int world_size;
  pthread_t thread;
  int64_t stop_deadline_ms; /* written before the wake, read by the thread after it */
  bool stopping;
  int64_t accept_paused_until;
  Entry *buckets[BUCKETS];
  size_t bytes;             /* keys and values held */
  StoreLimits limits;
  Connection **connections;
  size_t connection_count, connection_capacity, handshakes;
  size_t max_connections;
  size_t refusals;          /* connections refused so far (only the first few are logged) */
  uint8_t *rank_states;     /* StoreRankState per rank */
  size_t secret_length;     /* 0: unauthenticated (no job secret) */
  uint8_t secret[WK_SECRET_MAX_BYTES];
};

/* ---- the map ------------------------------------------------------------------------------------ */

static uint64_t key_hash(StoreBytes key) { return XXH3_64bits(key.data, key.length); }

static Entry **find_slot(WkStoreServer *s, StoreBytes key, uint64_t hash) {
  Entry **slot = &s->buckets[hash % BUCKETS];
  for (; *slot; slot = &(*slot)->next) {
    Entry *e = *slot;
    if (e->hash == hash && e->key_length == key.length && memcmp(e->key, key.data, key.length) == 0) return slot;
  }
  return slot;
}

static Entry *lookup(WkStoreServer *s, StoreBytes key) { return *find_slot(s, key, key_hash(key)); }

/* Sets key to value; on failure (budget, memory) leaves the map as it was and records why. */
static WkStatus put(WkStoreServer *s, StoreBytes key, const void *value, uint32_t length) {
  uint64_t hash = key_hash(key);
  Entry **slot = find_slot(s, key, hash);
  Entry *e = *slot;
  size_t old = e ? e->value_length : 0;
  size_t grow = (e ? 0 : sizeof *e + key.length) + length;
  if (s->bytes - old + grow > s->limits.max_bytes)
    return WK_FAIL(WK_ERR_NOMEM, "setting key '%.*s' to %u bytes would pass the store's budget of %zu bytes (it "
                   "holds %zu)", (int)(key.length > 200 ? 200 : key.length), (const char *)key.data, length,
                   s->limits.max_bytes, s->bytes);
  uint8_t *copy = malloc(length ? length : 1);
  if (!copy) return WK_FAIL(WK_ERR_NOMEM, "out of memory for a store value of %u bytes", length);
  if (length) memcpy(copy, value, length);
  if (!e) {
    e = malloc(sizeof *e + key.length + 1);
    if (!e) {
      free(copy);
      return WK_FAIL(WK_ERR_NOMEM, "out of memory for a store key");
    }
    e->next = NULL;
    e->hash = hash;
    e->key_length = key.length;
    memcpy(e->key, key.data, key.length);
    e->key[key.length] = '\0';
    e->value = NULL;
    e->value_length = 0;
    *slot = e;
  }
  free(e->value);
  s->bytes = s->bytes - old + grow;
  e->value = copy;
  e->value_length = length;
  return WK_OK;
}

/* ---- replies ------------------------------------------------------------------------------------ */

static void reply(WkStoreServer *s, Connection *c, StoreOp op, const StoreReply *y) {
  if (store_encode_reply(&c->out, op, y) != WK_OK) {
    wk_logf(WK_LOG_WARN, "store server: cannot answer %s: %s; dropping the connection", store_op_name(op), wk_last_error());
    c->close_after_flush = true;
  }
}

static void reply_status(WkStoreServer *s, Connection *c, StoreOp op, StoreReplyStatus status) {
  reply(s, c, op, &(StoreReply){.status = (uint8_t)status});
}

static void reply_value(WkStoreServer *s, Connection *c, StoreOp op, const void *data, size_t length) {
  reply(s, c, op, &(StoreReply){.status = STORE_REPLY_OK, .value = {data, (uint32_t)length}});
}

static void reply_error(WkStoreServer *s, Connection *c, StoreOp op, const char *message) {
  size_t length = strlen(message);
  if (length > STORE_MAX_ERROR) length = STORE_MAX_ERROR;
  reply(s, c, op, &(StoreReply){.status = STORE_REPLY_ERROR, .value = {(const uint8_t *)message, (uint32_t)length}});
}

/* ---- requests ----------------------------------------------------------------------------------- */

static bool all_present(WkStoreServer *s, const StoreRequest *q) {
  for (uint32_t i = 0; i < q->key_count; i++)
    if (!lookup(s, q->keys[i])) return false;
  return true;
}

/* Answers a get or wait if it can; returns false when it must keep waiting. */
static bool try_answer_wait(WkStoreServer *s, Connection *c, const StoreRequest *q, bool expired) {
  StoreOp op = (StoreOp)q->op;
  if (op == STORE_GET) {
    Entry *e = lookup(s, q->keys[0]);
    if (e) {
      reply_value(s, c, op, e->value, e->value_length);
      return true;
    }
  } else if (all_present(s, q)) {
    reply_status(s, c, op, STORE_REPLY_OK);
    return true;
  }
  if (!expired) return false;
  reply_status(s, c, op, STORE_REPLY_MISSING);
  return true;
}

/* Strict decimal int64, as add writes it. */
static bool parse_decimal(const uint8_t *data, uint32_t length, int64_t *out) {
  if (length == 0 || length >= DECIMAL_CAPACITY) return false;
  char text[DECIMAL_CAPACITY];
  memcpy(text, data, length);
  text[length] = '\0';
  char *end;
  errno = 0;
  long long v = strtoll(text, &end, 10);
  if (errno || *end || !(text[0] == '-' || (text[0] >= '0' && text[0] <= '9'))) return false;
  *out = v;
  return true;
}

static void do_add(WkStoreServer *s, Connection *c, const StoreRequest *q) {
  int64_t value = 0;
  Entry *e = lookup(s, q->keys[0]);
  char message[STORE_MAX_ERROR];
  if (e && !parse_decimal(e->value, e->value_length, &value)) {
    snprintf(message, sizeof message, "add: key '%s' holds a value that is not a decimal integer", e->key);
    reply_error(s, c, STORE_ADD, message);
    return;
  }
  int64_t sum;
  if (__builtin_add_overflow(value, q->number, &sum)) {
    reply_error(s, c, STORE_ADD, "add: the result overflows a 64-bit integer");
    return;
  }
  char text[DECIMAL_CAPACITY];
  int length = snprintf(text, sizeof text, "%" PRId64, sum);
  if (put(s, q->keys[0], text, (uint32_t)length) != WK_OK) {
    reply_error(s, c, STORE_ADD, wk_last_error());
    return;
  }
  reply(s, c, STORE_ADD, &(StoreReply){.status = STORE_REPLY_OK, .number = sum});
}

static void do_compare_set(WkStoreServer *s, Connection *c, const StoreRequest *q) {
  Entry *e = lookup(s, q->keys[0]);
  bool matches = e ? (e->value_length == q->value.length && memcmp(e->value, q->value.data, q->value.length) == 0)
                   : q->value.length == 0;
  if (matches && put(s, q->keys[0], q->value2.data, q->value2.length) != WK_OK) {
    reply_error(s, c, STORE_CAS, wk_last_error());
    return;
  }
  e = lookup(s, q->keys[0]);
  StoreReply y = {.status = STORE_REPLY_OK, .swapped = matches};
  if (e) y.value = (StoreBytes){e->value, e->value_length};
  reply(s, c, STORE_CAS, &y);
}

static void set_rank_state(WkStoreServer *s, int rank, StoreRankState state) {
  if (rank >= 0 && rank < s->world_size) s->rank_states[rank] = (uint8_t)state;
}

/* ---- the handshake ------------------------------------------------------------------------------- */

static void log_refusal(WkStoreServer *s, const char *peer, const char *why) {
  s->refusals++;
  if (s->refusals <= MAX_REFUSALS_LOGGED)
    wk_logf(WK_LOG_WARN, "store server: refused the connection from %s: %s%s", peer, why,
            s->refusals == MAX_REFUSALS_LOGGED ? " (further refusals are not logged)" : "");
}

/* Answers why (when the peer is still owed an answer) and closes the connection once that is sent. */
static void refuse(WkStoreServer *s, Connection *c, StoreOp op, const char *why) {
  log_refusal(s, c->peer, why);
  reply_error(s, c, op, why);
  c->close_after_flush = true;
}

/* Why this hello cannot be accepted (into message), or false when it can. */
static bool hello_refused(const WkStoreServer *s, const Connection *c, const StoreRequest *q, char *message,
                          size_t capacity) {
  if (c->authenticated) {
    snprintf(message, capacity, "a second hello on one connection");
    return true;
  }
  if (s->secret_length) {
    uint8_t expected[STORE_PROOF_BYTES];
    store_proof(s->secret, s->secret_length, STORE_PROOF_CLIENT, c->nonce, q->value.data, q->number, q->world_size,
                expected);
    if (q->value2.length != STORE_PROOF_BYTES || !wk_digest_equal(q->value2.data, expected, STORE_PROOF_BYTES)) {
      snprintf(message, capacity, "%s", q->value2.length ? "wrong proof of the job's secret (another job's secret?)"
                                                         : "no proof of the job's secret (WICK_STORE_SECRET is not set?)");
      return true;
    }
  } else if (q->value2.length) {
    snprintf(message, capacity, "a proof of a secret, but this store has none (WICK_STORE_SECRET is set on "
             "some ranks only?)");
    return true;
  }
  if (q->number < 0) return false;
  if (q->world_size != s->world_size) {
    snprintf(message, capacity, "rank %" PRId64 " has WORLD_SIZE=%" PRId64 ", but rank 0 has WORLD_SIZE=%d (every "
             "rank of a job needs the same)", q->number, q->world_size, s->world_size);
    return true;
  }
  if (q->number >= s->world_size) {
    snprintf(message, capacity, "hello from rank %" PRId64 ", but this job has %d ranks", q->number, s->world_size);
    return true;
  }
  if (s->rank_states[q->number] == STORE_RANK_CONNECTED) {
    snprintf(message, capacity, "rank %" PRId64 " is connected already (two processes with RANK=%" PRId64 "?)",
             q->number, q->number);
    return true;
  }
  return false;
}

static void accept_hello(WkStoreServer *s, Connection *c, const StoreRequest *q) {
  char message[STORE_MAX_ERROR];
  if (hello_refused(s, c, q, message, sizeof message)) {
    refuse(s, c, STORE_HELLO, message);
    return;
  }
  c->authenticated = true;
  s->handshakes--;
  c->rank = (int)q->number;
  set_rank_state(s, c->rank, STORE_RANK_CONNECTED);
  uint8_t proof[STORE_PROOF_BYTES];
  StoreReply y = {.status = STORE_REPLY_OK};
  if (s->secret_length) {
    store_proof(s->secret, s->secret_length, STORE_PROOF_SERVER, c->nonce, q->value.data, q->number, q->world_size,
                proof);
    y.value = (StoreBytes){proof, STORE_PROOF_BYTES};
  }
  reply(s, c, STORE_HELLO, &y);
}

/* Handles one request; returns true when it changed the map (parked waits may now succeed). */
static bool handle(WkStoreServer *s, Connection *c, const StoreRequest *q) {
  StoreOp op = (StoreOp)q->op;
  switch (op) {
    case STORE_HELLO: accept_hello(s, c, q); return false;
    case STORE_SET:
      if (put(s, q->keys[0], q->value.data, q->value.length) != WK_OK) {
        if (q->flags & STORE_FLAG_NOREPLY) wk_logf(WK_LOG_WARN, "store server: %s", wk_last_error());
        else reply_error(s, c, op, wk_last_error());
        return false;
      }
      if (!(q->flags & STORE_FLAG_NOREPLY)) reply_status(s, c, op, STORE_REPLY_OK);
      return true;
    case STORE_GET:
    case STORE_WAIT:
      if (!try_answer_wait(s, c, q, q->number == 0)) {
        c->waiting = true;
        c->pending = *q;
        c->deadline_ms = net_deadline(q->number);
      }
      return false;
    case STORE_ADD: do_add(s, c, q); return true;
    case STORE_CAS: do_compare_set(s, c, q); return true;
    case STORE_STATUS: reply_value(s, c, op, s->rank_states, (size_t)s->world_size); return false;
    case STORE_BYE:
      c->said_bye = true;
      set_rank_state(s, c->rank, STORE_RANK_CLOSED);
      reply_status(s, c, op, STORE_REPLY_OK);
      return false;
  }
  return false;
}

/* Drops the frame at the front of the input buffer. */
static void consume(Connection *c, size_t length) {
  memmove(c->in, c->in + length, c->in_length - length);
  c->in_length -= length;
}

/* The body length a buffered frame header declares (0 when the header is not in yet). */
static uint32_t declared_body(const Connection *c) {
  if (c->in_length < STORE_FRAME_HEADER) return 0;
  return (uint32_t)c->in[0] | (uint32_t)c->in[1] << 8 | (uint32_t)c->in[2] << 16 | (uint32_t)c->in[3] << 24;
}

/* Handles the complete frames buffered on c, stopping at a parked wait. Until its hello is
 * accepted a connection is held to one small hello: nothing else is parsed or handled. */
static bool process_frames(WkStoreServer *s, Connection *c) {
  bool changed = false;
  char message[STORE_MAX_ERROR];
  while (!c->waiting && !c->close_after_flush) {
    if (!c->authenticated && declared_body(c) > STORE_MAX_HELLO_FRAME) {
      snprintf(message, sizeof message, "a first message of %u bytes (a hello is at most %d)", declared_body(c),
               STORE_MAX_HELLO_FRAME);
      refuse(s, c, STORE_HELLO, message);
      break;
    }
    size_t frame;
    FrameState state = store_frame_check(c->in, c->in_length, &frame);
    if (state == FRAME_INCOMPLETE) break;
    StoreRequest q;
    if (state == FRAME_INVALID ||
        store_parse_request(c->in + STORE_FRAME_HEADER, frame - STORE_FRAME_HEADER, &q) != WK_OK) {
      if (!c->authenticated) {
        refuse(s, c, STORE_HELLO, wk_last_error());
        break;
      }
      wk_logf(WK_LOG_WARN, "store server: bad message from %s %d: %s", c->rank >= 0 ? "rank" : "client",
              c->rank >= 0 ? c->rank : c->fd, wk_last_error());
      reply_error(s, c, STORE_HELLO, wk_last_error());
      c->close_after_flush = true;
      break;
    }
    if (!c->authenticated && q.op != STORE_HELLO) {
      snprintf(message, sizeof message, "%s before hello", store_op_name(q.op));
      refuse(s, c, (StoreOp)q.op, message);
      break;
    }
    changed |= handle(s, c, &q);
    if (!c->waiting) consume(c, frame);
  }
  return changed;
}

/* Retries every parked wait after a change of the map, or because its deadline passed; an
 * answered connection goes on with what it sent next, which may change the map again. */
static void wake_waiters(WkStoreServer *s) {
  for (bool changed = true; changed;) {
    changed = false;
    int64_t now = net_now_ms();
    for (size_t i = 0; i < s->connection_count; i++) {
      Connection *c = s->connections[i];
      if (!c->waiting || !try_answer_wait(s, c, &c->pending, c->deadline_ms <= now)) continue;
      c->waiting = false;
      size_t frame;
      if (store_frame_check(c->in, c->in_length, &frame) == FRAME_READY) consume(c, frame);
      changed |= process_frames(s, c);
    }
  }
}

/* ---- connections -------------------------------------------------------------------------------- */

static void close_connection(WkStoreServer *s, size_t index) {
  Connection *c = s->connections[index];
  if (!c->authenticated) s->handshakes--;
  if (c->rank >= 0) set_rank_state(s, c->rank, c->said_bye ? STORE_RANK_CLOSED : STORE_RANK_LOST);
  if (c->rank >= 0 && !c->said_bye) wk_logf(WK_LOG_INFO, "store server: rank %d dropped its connection without bye", c->rank);
  close(c->fd);
  free(c->in);
  store_buffer_free(&c->out);
  free(c);
  s->connections[index] = s->connections[--s->connection_count];
}

static void name_peer(const struct sockaddr_storage *a, char *out, size_t capacity) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (a->ss_family == AF_INET) {
    const struct sockaddr_in *v4 = (const struct sockaddr_in *)a;
    inet_ntop(AF_INET, &v4->sin_addr, host, sizeof host);
    port = ntohs(v4->sin_port);
  } else if (a->ss_family == AF_INET6) {
    const struct sockaddr_in6 *v6 = (const struct sockaddr_in6 *)a;
    inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof host);
    port = ntohs(v6->sin6_port);
  }
  snprintf(out, capacity, "%s:%d", host, port);
}

/* A new connection, greeted with its challenge; NULL (the fd closed, the reason logged) when it
 * cannot be taken. */
static Connection *greet(WkStoreServer *s, int fd, const char *peer) {
  if (s->connection_count >= s->max_connections || s->handshakes >= MAX_HANDSHAKES) {
    log_refusal(s, peer, s->handshakes >= MAX_HANDSHAKES ? "too many connections still in their handshake"
                                                          : "too many connections");
    close(fd);
    return NULL;
  }
  if (s->connection_count == s->connection_capacity) {
    size_t capacity = s->connection_capacity ? 2 * s->connection_capacity : 16;
    Connection **grown = realloc(s->connections, capacity * sizeof *grown);
    if (!grown) {
      close(fd);
      return NULL;
    }
    s->connections = grown;
    s->connection_capacity = capacity;
  }
  Connection *c = calloc(1, sizeof *c);
  StoreChallenge challenge = {.keyed = s->secret_length > 0};
  if (!c || wk_random_bytes(challenge.nonce, sizeof challenge.nonce) != WK_OK ||
      store_encode_challenge(&c->out, &challenge) != WK_OK) {
    wk_logf(WK_LOG_WARN, "store server: cannot greet %s: %s", peer, c ? wk_last_error() : "out of memory");
    if (c) store_buffer_free(&c->out);
    free(c);
    close(fd);
    return NULL;
  }
  net_no_delay(fd);
  c->fd = fd;
  c->rank = -1;
  c->handshake_deadline_ms = net_deadline(s->limits.handshake_timeout_ms);
  memcpy(c->nonce, challenge.nonce, sizeof c->nonce);
  snprintf(c->peer, sizeof c->peer, "%s", peer);
  s->handshakes++;
  s->connections[s->connection_count++] = c;
  return c;
}

static void accept_connections(WkStoreServer *s) {
  for (;;) {
    struct sockaddr_storage address;
    socklen_t length = sizeof address;
    int fd = accept4(s->listen_fd, (struct sockaddr *)&address, &length, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        wk_logf(WK_LOG_WARN, "store server: accept: %s (raise the open-file limit: ulimit -n)", strerror(errno));
        s->accept_paused_until = net_now_ms() + ACCEPT_BACKOFF_MS;
      }
      return; /* EAGAIN: no more pending; others (ECONNABORTED) are the peer's problem */
    }
    char peer[PEER_NAME_CAPACITY];
    name_peer(&address, peer, sizeof peer);
    greet(s, fd, peer);
  }
}

/* Closes the connections whose handshake did not finish in time (a refused one that has not taken
 * its answer by then too: it was logged already). */
static void expire_handshakes(WkStoreServer *s) {
  int64_t now = net_now_ms();
  for (size_t k = s->connection_count; k-- > 0;) {
    Connection *c = s->connections[k];
    if (c->authenticated || c->handshake_deadline_ms > now) continue;
    if (!c->close_after_flush) log_refusal(s, c->peer, "no hello within the handshake's time");
    close_connection(s, k);
  }
}

/* Reads what is there; returns false when the connection is finished. */
static bool read_connection(WkStoreServer *s, Connection *c) {
  size_t want = READ_CHUNK;
  size_t frame;
  if (!c->authenticated) {
    want = STORE_FRAME_HEADER + STORE_MAX_HELLO_FRAME; /* a stranger gets no bigger buffer than a hello */
    if (c->in_length >= want) return true; /* process_frames refuses it */
    want -= c->in_length;
  } else if (store_frame_check(c->in, c->in_length, &frame) == FRAME_INCOMPLETE && c->in_length >= STORE_FRAME_HEADER) {
    size_t missing = STORE_FRAME_HEADER + (size_t)declared_body(c) - c->in_length;
    if (missing > want) want = missing; /* body <= STORE_MAX_FRAME: checked by store_frame_check */
  }
  if (c->in_capacity - c->in_length < want) {
    size_t capacity = c->in_length + want;
    uint8_t *grown = realloc(c->in, capacity);
    if (!grown) {
      wk_logf(WK_LOG_WARN, "store server: out of memory for a message of %zu bytes", capacity);
      return false;
    }
    c->in = grown;
    c->in_capacity = capacity;
  }
  ssize_t n = recv(c->fd, c->in + c->in_length, want, MSG_DONTWAIT);
  if (n == 0) return false;
  if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
  c->in_length += (size_t)n;
  process_frames(s, c); /* what it changed, wake_waiters looks at next */
  return true;
}

/* Sends what is queued; returns false when the connection is finished. */
static bool flush_connection(Connection *c) {
  while (c->out_sent < c->out.length) {
    ssize_t n = send(c->fd, c->out.data + c->out_sent, c->out.length - c->out_sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    c->out_sent += (size_t)n;
  }
  c->out.length = c->out_sent = 0;
  return !c->close_after_flush;
}

/* ---- the loop ----------------------------------------------------------------------------------- */

/* Stopping is done when every rank that said hello has said bye or dropped. */
static bool drained(const WkStoreServer *s) {
  for (int r = 0; r < s->world_size; r++)
    if (s->rank_states[r] == STORE_RANK_CONNECTED) return false;
  return true;
}

static int poll_timeout(const WkStoreServer *s) {
  int64_t now = net_now_ms(), next = -1;
  for (size_t i = 0; i < s->connection_count; i++) {
    const Connection *c = s->connections[i];
    if (c->waiting && (next < 0 || c->deadline_ms < next)) next = c->deadline_ms;
    if (!c->authenticated && (next < 0 || c->handshake_deadline_ms < next)) next = c->handshake_deadline_ms;
  }
  if (s->stopping && (next < 0 || s->stop_deadline_ms < next)) next = s->stop_deadline_ms;
  if (s->accept_paused_until > now && (next < 0 || s->accept_paused_until < next)) next = s->accept_paused_until;
  if (next < 0) return -1;
  return next <= now ? 0 : (int)(next - now > INT32_MAX ? INT32_MAX : next - now);
}

static void *serve(void *arg) {
  WkStoreServer *s = arg;
  struct pollfd *fds = NULL;
  size_t fds_capacity = 0;
  enum { WAKE_FD = 0, LISTEN_FD = 1, FIRST_CONNECTION = 2 };
  for (;;) {
    if (s->stopping && (drained(s) || net_now_ms() >= s->stop_deadline_ms)) break;
    size_t needed = FIRST_CONNECTION + s->connection_count;
    if (needed > fds_capacity) {
      struct pollfd *grown = realloc(fds, needed * sizeof *grown);
      if (!grown) {
        wk_logf(WK_LOG_ERROR, "store server: out of memory for %zu connections; stopping", s->connection_count);
        break;
      }
      fds = grown;
      fds_capacity = needed;
    }
    bool accepting = net_now_ms() >= s->accept_paused_until;
    fds[WAKE_FD] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
    fds[LISTEN_FD] = (struct pollfd){.fd = accepting ? s->listen_fd : -1, .events = POLLIN};
    for (size_t i = 0; i < s->connection_count; i++) {
      const Connection *c = s->connections[i];
      short events = POLLRDHUP;
      if (!c->waiting && !c->close_after_flush) events |= POLLIN;
      if (c->out.length > c->out_sent) events |= POLLOUT;
      fds[FIRST_CONNECTION + i] = (struct pollfd){.fd = c->fd, .events = events};
    }
    int n = poll(fds, (nfds_t)needed, poll_timeout(s));
    if (n < 0 && errno != EINTR) {
      wk_logf(WK_LOG_ERROR, "store server: poll: %s; stopping", strerror(errno));
      break;
    }
    if (n > 0 && fds[WAKE_FD].revents) {
      char byte;
      if (read(s->wake[0], &byte, 1) == 1) s->stopping = true;
    }
    /* Walk backwards: closing swaps the last connection into the freed place. */
    for (size_t k = s->connection_count; n > 0 && k-- > 0;) {
      Connection *c = s->connections[k];
      short revents = fds[FIRST_CONNECTION + k].revents;
      bool alive = true;
      if (revents & (POLLIN | POLLHUP | POLLRDHUP | POLLERR)) {
        /* A parked or condemned connection is not read: a hang-up there ends it. */
        if (!c->waiting && !c->close_after_flush) alive = read_connection(s, c);
        else alive = !(revents & (POLLHUP | POLLRDHUP | POLLERR));
      }
      if (alive && (revents & POLLOUT)) alive = flush_connection(c);
      if (!alive) close_connection(s, k);
    }
    if (n > 0 && fds[LISTEN_FD].revents) accept_connections(s);
    expire_handshakes(s);
    wake_waiters(s); /* after changes, and for the deadlines that passed */
    for (size_t k = s->connection_count; k-- > 0;) {
      Connection *c = s->connections[k];
      if ((c->out.length > c->out_sent || c->close_after_flush) && !flush_connection(c)) close_connection(s, k);
    }
  }
  free(fds);
  return NULL;
}

/* ---- start and stop ----------------------------------------------------------------------------- */

/* Listens on the first address host resolves to that this host has; -1 with the reason in why. */
static int open_listener(const char *host, int port, char *why, size_t why_size) {
  char service[16];
  snprintf(service, sizeof service, "%d", port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *list;
  int rc = getaddrinfo(host, service, &hints, &list);
  if (rc != 0) {
    snprintf(why, why_size, "cannot resolve '%s': %s", host, gai_strerror(rc));
    return -1;
  }
  int fd = -1;
  snprintf(why, why_size, "'%s' has no address", host);
  for (const struct addrinfo *ai = list; ai && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      snprintf(why, why_size, "socket: %s", strerror(errno));
      continue;
    }
    int on = 1;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) != 0) /* restart on a port in TIME_WAIT */
      wk_logf(WK_LOG_DEBUG, "store server: SO_REUSEADDR: %s", strerror(errno));
    bool bound = bind(fd, ai->ai_addr, ai->ai_addrlen) == 0;
    if (!bound || listen(fd, SOMAXCONN) != 0) {
      char address[PEER_NAME_CAPACITY];
      name_peer((const struct sockaddr_storage *)ai->ai_addr, address, sizeof address);
      snprintf(why, why_size, "%s %s: %s%s", bound ? "listen on" : "bind to", address, strerror(errno),
               errno == EADDRINUSE ? " (another job or a stale rank 0 holds it; pick another MASTER_PORT)"
               : errno == EADDRNOTAVAIL ? " (not an address of this host: rank 0 must run on MASTER_ADDR)" : "");
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(list);
  return fd;
}

static int bound_port(int fd) {
  struct sockaddr_storage a;
  socklen_t length = sizeof a;
  if (getsockname(fd, (struct sockaddr *)&a, &length) != 0) return -1;
  if (a.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&a)->sin6_port);
  return ntohs(((struct sockaddr_in *)&a)->sin_port);
}

static void free_server(WkStoreServer *s) {
  for (size_t i = s->connection_count; i-- > 0;) close_connection(s, i);
  free(s->connections);
  for (int b = 0; b < BUCKETS; b++) {
    for (Entry *e = s->buckets[b], *next; e; e = next) {
      next = e->next;
      free(e->value);
      free(e);
    }
  }
  if (s->listen_fd >= 0) close(s->listen_fd);
  if (s->wake[0] >= 0) close(s->wake[0]);
  if (s->wake[1] >= 0) close(s->wake[1]);
  free(s->rank_states);
  free(s);
}

WkStoreServer *store_server_start_keyed(const char *host, int port, int world_size, const uint8_t *secret,
                                        size_t secret_length, StoreLimits limits) {
  if (!host || !*host || port < 0 || port > UINT16_MAX) {
    WK_FAIL(WK_ERR_INVALID_ARG, "store server: needs an address to listen on and a port in 0..65535 (got '%s':%d)",
            host ? host : "(null)", port);
    return NULL;
  }
  if (world_size < 1 || world_size > STORE_MAX_WORLD) {
    WK_FAIL(WK_ERR_INVALID_ARG, "store server: world size %d out of range 1..%d", world_size, STORE_MAX_WORLD);
    return NULL;
  }
  if (secret_length > WK_SECRET_MAX_BYTES || (secret_length && !secret)) {
    WK_FAIL(WK_ERR_INVALID_ARG, "store server: a secret of %zu bytes (at most %d)", secret_length, WK_SECRET_MAX_BYTES);
    return NULL;
  }
  WkStoreServer *s = wk_calloc(1, sizeof *s, "store server");
  if (!s) return NULL;
  s->listen_fd = s->wake[0] = s->wake[1] = -1;
  s->world_size = world_size;
  s->max_connections = (size_t)world_size + EXTRA_CONNECTIONS;
  s->limits = limits;
  if (secret_length) memcpy(s->secret, secret, secret_length);
  s->secret_length = secret_length;
  s->rank_states = wk_calloc((size_t)world_size, 1, "store rank states");
  if (!s->rank_states) {
    free_server(s);
    return NULL;
  }
  char why[512];
  s->listen_fd = open_listener(host, port, why, sizeof why);
  if (s->listen_fd < 0) {
    WK_FAIL(WK_ERR_NETWORK, "store server on %s port %d: %s", host, port, why);
    free_server(s);
    return NULL;
  }
  s->port = bound_port(s->listen_fd);
  if (pipe2(s->wake, O_CLOEXEC) != 0) {
    WK_FAIL_ERRNO("pipe for", "the store server");
    free_server(s);
    return NULL;
  }
  int rc = wk_thread_create(&s->thread, serve, s);
  if (rc != 0) {
    WK_FAIL(WK_ERR_NOMEM, "store server: cannot start its thread: %s", strerror(rc));
    free_server(s);
    return NULL;
  }
  return s;
}

WkStoreServer *wk_store_server_start(const char *host, int port, int world_size) {
  const uint8_t *secret;
  size_t length;
  if (wk_job_secret(&secret, &length) != WK_OK) {
    wk_error_context("store server");
    return NULL;
  }
  WkStoreServer *s = store_server_start_keyed(host, port, world_size, secret, length, STORE_LIMITS);
  if (s && !length)
    wk_logf(WK_LOG_WARN, "store server at %s:%d: no job secret (WICK_STORE_SECRET or WICK_STORE_SECRET_FILE), so it "
            "is unauthenticated: any process that reaches that address can act on this job, as with torch's "
            "TCPStore", host, s->port);
  return s;
}

int wk_store_server_port(const WkStoreServer *s) { return s ? s->port : -1; }

void wk_store_server_stop(WkStoreServer *s, int64_t timeout_ms) {
  if (!s) return;
  s->stop_deadline_ms = net_deadline(timeout_ms < 0 ? 0 : timeout_ms);
  char byte = 1;
  /* A one-byte write to our own pipe cannot block or partially fail; if it fails the thread
   * would serve on, so say so rather than hang in join. */
  if (write(s->wake[1], &byte, 1) != 1) {
    wk_logf(WK_LOG_ERROR, "store server: cannot signal its thread to stop: %s", strerror(errno));
    return;
  }
  pthread_join(s->thread, NULL);
  free_server(s);
}
