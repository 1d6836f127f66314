/*
 * store_server.c — the rendezvous store rank 0 serves: a key-value map behind one poll() loop on
 * a thread of its own.
 *
 * Every connection is non-blocking and has at most one request in progress: a get or wait whose
 * key is not there yet parks the connection (nothing more is read from it) until a set, add or
 * compare-and-set provides the key, or its timeout answers 'missing'. A malformed frame is
 * answered with an error and the connection is closed after it; nothing a peer sends can make the
 * server allocate past a frame (STORE_MAX_FRAME) per connection or the map past STORE_MAX_BYTES.
 *
 * The server also remembers, per rank, whether it said hello, bye, or dropped its connection
 * without a bye: the hang report asks for that (STATUS) to tell a killed rank from a slow one.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <xxhash.h>

#include "dist.h"

enum {
  BUCKETS = 4096,                       /* hash buckets of the map (chained) */
  READ_CHUNK = 64 * 1024,               /* bytes read per readable event */
  ACCEPT_BACKOFF_MS = 100,              /* pause accepting when out of file descriptors */
  DECIMAL_CAPACITY = 24,                /* an int64 in decimal, sign and NUL included */
  MAX_CONNECTIONS = 65536
};
#define STORE_MAX_BYTES ((size_t)1 << 30) /* keys + values held at once */

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
  size_t bytes;
  Connection **connections;
  size_t connection_count, connection_capacity;
  uint8_t *rank_states;     /* StoreRankState per rank */
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
  if (s->bytes - old + grow > STORE_MAX_BYTES)
    return WK_FAIL(WK_ERR_NOMEM, "the store holds %zu bytes; setting %u more would pass its budget of %zu",
                   s->bytes, length, STORE_MAX_BYTES);
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

/* Handles one request; returns true when it changed the map (parked waits may now succeed). */
static bool handle(WkStoreServer *s, Connection *c, const StoreRequest *q) {
  StoreOp op = (StoreOp)q->op;
  char message[STORE_MAX_ERROR];
  switch (op) {
    case STORE_HELLO:
      if (q->number >= s->world_size) {
        snprintf(message, sizeof message, "hello from rank %" PRId64 ", but this job has %d ranks", q->number, s->world_size);
        reply_error(s, c, op, message);
        c->close_after_flush = true;
        return false;
      }
      c->rank = (int)q->number;
      set_rank_state(s, c->rank, STORE_RANK_CONNECTED);
      reply_status(s, c, op, STORE_REPLY_OK);
      return false;
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

/* Handles the complete frames buffered on c, stopping at a parked wait. */
static bool process_frames(WkStoreServer *s, Connection *c) {
  bool changed = false;
  while (!c->waiting && !c->close_after_flush) {
    size_t frame;
    FrameState state = store_frame_check(c->in, c->in_length, &frame);
    if (state == FRAME_INCOMPLETE) break;
    StoreRequest q;
    if (state == FRAME_INVALID ||
        store_parse_request(c->in + STORE_FRAME_HEADER, frame - STORE_FRAME_HEADER, &q) != WK_OK) {
      wk_logf(WK_LOG_WARN, "store server: bad message from %s %d: %s", c->rank >= 0 ? "rank" : "client",
              c->rank >= 0 ? c->rank : c->fd, wk_last_error());
      reply_error(s, c, STORE_HELLO, wk_last_error());
      c->close_after_flush = true;
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
  if (c->rank >= 0) set_rank_state(s, c->rank, c->said_bye ? STORE_RANK_CLOSED : STORE_RANK_LOST);
  if (c->rank >= 0 && !c->said_bye) wk_logf(WK_LOG_INFO, "store server: rank %d dropped its connection without bye", c->rank);
  close(c->fd);
  free(c->in);
  store_buffer_free(&c->out);
  free(c);
  s->connections[index] = s->connections[--s->connection_count];
}

static void accept_connections(WkStoreServer *s) {
  for (;;) {
    int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        wk_logf(WK_LOG_WARN, "store server: accept: %s (raise the open-file limit: ulimit -n)", strerror(errno));
        s->accept_paused_until = net_now_ms() + ACCEPT_BACKOFF_MS;
      }
      return; /* EAGAIN: no more pending; others (ECONNABORTED) are the peer's problem */
    }
    if (s->connection_count == MAX_CONNECTIONS) {
      wk_logf(WK_LOG_WARN, "store server: %d connections already; refusing one more", MAX_CONNECTIONS);
      close(fd);
      continue;
    }
    if (s->connection_count == s->connection_capacity) {
      size_t capacity = s->connection_capacity ? 2 * s->connection_capacity : 16;
      Connection **grown = realloc(s->connections, capacity * sizeof *grown);
      if (!grown) {
        close(fd);
        continue;
      }
      s->connections = grown;
      s->connection_capacity = capacity;
    }
    Connection *c = calloc(1, sizeof *c);
    if (!c) {
      close(fd);
      continue;
    }
    net_no_delay(fd);
    c->fd = fd;
    c->rank = -1;
    s->connections[s->connection_count++] = c;
  }
}

/* Reads what is there; returns false when the connection is finished. */
static bool read_connection(WkStoreServer *s, Connection *c) {
  size_t want = READ_CHUNK;
  size_t frame;
  if (store_frame_check(c->in, c->in_length, &frame) == FRAME_INCOMPLETE && c->in_length >= STORE_FRAME_HEADER) {
    uint32_t body = (uint32_t)c->in[0] | (uint32_t)c->in[1] << 8 | (uint32_t)c->in[2] << 16 | (uint32_t)c->in[3] << 24;
    size_t missing = STORE_FRAME_HEADER + (size_t)body - c->in_length;
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

static int open_listener(int port, char *why, size_t why_size) {
  int fd = socket(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  bool v6 = fd >= 0;
  if (!v6) fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    snprintf(why, why_size, "socket: %s", strerror(errno));
    return -1;
  }
  int on = 1, off = 0;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on); /* restart on a port in TIME_WAIT */
  int rc;
  if (v6) {
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off); /* IPv4 clients too */
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = in6addr_any, .sin6_port = htons((uint16_t)port)};
    rc = bind(fd, (struct sockaddr *)&a, sizeof a);
    if (rc != 0 && errno == EADDRNOTAVAIL) { /* IPv6 disabled: fall back to IPv4 */
      close(fd);
      fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) {
        snprintf(why, why_size, "socket: %s", strerror(errno));
        return -1;
      }
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
      v6 = false;
    }
  }
  if (!v6) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY), .sin_port = htons((uint16_t)port)};
    rc = bind(fd, (struct sockaddr *)&a, sizeof a);
  }
  if (rc != 0 || listen(fd, SOMAXCONN) != 0) {
    snprintf(why, why_size, "%s: %s%s", rc != 0 ? "bind" : "listen", strerror(errno),
             errno == EADDRINUSE ? " (another job or a stale rank 0 holds it; pick another MASTER_PORT)" : "");
    close(fd);
    return -1;
  }
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

WkStoreServer *wk_store_server_start(int port, int world_size) {
  if (port < 0 || port > UINT16_MAX) {
    WK_FAIL(WK_ERR_INVALID_ARG, "store server: port %d out of range 0..65535", port);
    return NULL;
  }
  if (world_size < 1 || world_size > STORE_MAX_VALUE) {
    WK_FAIL(WK_ERR_INVALID_ARG, "store server: world size %d out of range 1..%d", world_size, STORE_MAX_VALUE);
    return NULL;
  }
  WkStoreServer *s = wk_calloc(1, sizeof *s, "store server");
  if (!s) return NULL;
  s->listen_fd = s->wake[0] = s->wake[1] = -1;
  s->world_size = world_size;
  s->rank_states = wk_calloc((size_t)world_size, 1, "store rank states");
  if (!s->rank_states) {
    free_server(s);
    return NULL;
  }
  char why[256];
  s->listen_fd = open_listener(port, why, sizeof why);
  if (s->listen_fd < 0) {
    WK_FAIL(WK_ERR_NETWORK, "store server on port %d: %s", port, why);
    free_server(s);
    return NULL;
  }
  s->port = bound_port(s->listen_fd);
  if (pipe2(s->wake, O_CLOEXEC) != 0) {
    WK_FAIL_ERRNO("pipe for", "the store server");
    free_server(s);
    return NULL;
  }
  int rc = pthread_create(&s->thread, NULL, serve, s);
  if (rc != 0) {
    WK_FAIL(WK_ERR_NOMEM, "store server: cannot start its thread: %s", strerror(rc));
    free_server(s);
    return NULL;
  }
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
