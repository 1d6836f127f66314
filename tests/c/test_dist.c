/*
 * test_dist.c — the rendezvous store (protocol, server, client) and world discovery of
 * runtime/dist, against a real server on a real socket.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "core/secret.h"
#include "dist/dist.h"

enum { SHORT_MS = 200, LONG_MS = 5000 };

static StoreBytes text(const char *s) { return (StoreBytes){(const uint8_t *)s, (uint32_t)strlen(s)}; }

static const uint8_t NONCE[STORE_NONCE_BYTES] = {1, 2, 3};
static const uint8_t SECRET[] = "the job's secret, 32 bytes long!";
static const uint8_t OTHER_SECRET[] = "another job's secret, 32 bytes!!";
#define SECRET_LENGTH (sizeof SECRET - 1)

/* ---- protocol ------------------------------------------------------------------------------------ */

static void test_requests_round_trip_and_every_truncation_is_refused(void) {
  StoreRequest requests[] = {
      {.op = STORE_HELLO, .number = 7, .world_size = 8, .value = {NONCE, STORE_NONCE_BYTES}},
      {.op = STORE_HELLO, .number = -1, .value = {NONCE, STORE_NONCE_BYTES}, .value2 = {NONCE, STORE_PROOF_BYTES}},
      {.op = STORE_SET, .key_count = 1, .keys = {text("k")}, .value = text("value")},
      {.op = STORE_SET, .flags = STORE_FLAG_NOREPLY, .key_count = 1, .keys = {text("k")}, .value = text("")},
      {.op = STORE_GET, .key_count = 1, .keys = {text("key")}, .number = 1234},
      {.op = STORE_WAIT, .key_count = 2, .keys = {text("a"), text("bc")}, .number = 0},
      {.op = STORE_ADD, .key_count = 1, .keys = {text("n")}, .number = -5},
      {.op = STORE_CAS, .key_count = 1, .keys = {text("c")}, .value = text(""), .value2 = text("x")},
      {.op = STORE_STATUS},
      {.op = STORE_BYE},
  };
  for (size_t i = 0; i < sizeof requests / sizeof requests[0]; i++) {
    StoreBuffer b = {0};
    CHECK(store_encode_request(&b, &requests[i]) == WK_OK);
    size_t frame = 0;
    CHECK(store_frame_check(b.data, b.length, &frame) == FRAME_READY && frame == b.length);
    StoreRequest back;
    CHECK(store_parse_request(b.data + STORE_FRAME_HEADER, b.length - STORE_FRAME_HEADER, &back) == WK_OK);
    CHECK(back.op == requests[i].op && back.number == requests[i].number && back.key_count == requests[i].key_count);
    for (size_t cut = 0; cut < b.length - STORE_FRAME_HEADER; cut++) {
      CHECK(store_parse_request(b.data + STORE_FRAME_HEADER, cut, &back) == WK_ERR_FORMAT);
      CHECK(store_frame_check(b.data, STORE_FRAME_HEADER + cut, &frame) == FRAME_INCOMPLETE);
    }
    store_buffer_free(&b);
  }
}

static void test_malformed_requests_are_refused_with_a_reason(void) {
  const uint8_t unknown_op[] = {99, 0};
  const uint8_t trailing[] = {STORE_BYE, 0, 1};
  const uint8_t bad_flags[] = {STORE_BYE, 1};
  const uint8_t empty_key[] = {STORE_GET, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  const uint8_t nul_key[] = {STORE_GET, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  const uint8_t huge_key[] = {STORE_GET, 0, 0xff, 0xff, 0, 0};
  const uint8_t negative_timeout[] = {STORE_GET, 0, 1, 0, 0, 0, 'k', 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  const uint8_t huge_value[] = {STORE_SET, 0, 1, 0, 0, 0, 'k', 1, 0, 0, 1}; /* 16 MiB + 1 */
  struct { const uint8_t *body; size_t length; const char *reason; } cases[] = {
      {unknown_op, sizeof unknown_op, "unknown op"},
      {trailing, sizeof trailing, "unexpected bytes"},
      {bad_flags, sizeof bad_flags, "flags"},
      {empty_key, sizeof empty_key, "empty"},
      {nul_key, sizeof nul_key, "NUL"},
      {huge_key, sizeof huge_key, "at most"},
      {negative_timeout, sizeof negative_timeout, "out of range"},
      {huge_value, sizeof huge_value, "store request set key 'k': value of 16777217 bytes (at most 16777216)"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    StoreRequest q;
    CHECK(store_parse_request(cases[i].body, cases[i].length, &q) == WK_ERR_FORMAT);
    CHECK(strstr(wk_last_error(), cases[i].reason) != NULL);
  }
  const uint8_t oversized[] = {0xff, 0xff, 0xff, 0x7f};
  const uint8_t zero[] = {0, 0, 0, 0};
  size_t frame;
  CHECK(store_frame_check(oversized, sizeof oversized, &frame) == FRAME_INVALID);
  CHECK(store_frame_check(zero, sizeof zero, &frame) == FRAME_INVALID);
  StoreReply y;
  const uint8_t missing_for_set[] = {STORE_REPLY_MISSING};
  CHECK(store_parse_reply(STORE_SET, missing_for_set, 1, &y) == WK_ERR_FORMAT);
}

static void test_challenge_round_trips_and_hello_fields_are_checked(void) {
  StoreChallenge challenge = {.keyed = true, .nonce = {9, 8, 7}}, back;
  StoreBuffer b = {0};
  CHECK(store_encode_challenge(&b, &challenge) == WK_OK);
  CHECK(store_parse_challenge(b.data + STORE_FRAME_HEADER, b.length - STORE_FRAME_HEADER, &back) == WK_OK);
  CHECK(back.keyed && memcmp(back.nonce, challenge.nonce, STORE_NONCE_BYTES) == 0);
  b.data[STORE_FRAME_HEADER] = 'X'; /* not a Wick store's greeting */
  CHECK(store_parse_challenge(b.data + STORE_FRAME_HEADER, b.length - STORE_FRAME_HEADER, &back) == WK_ERR_FORMAT);
  CHECK(strstr(wk_last_error(), "not a Wick store") != NULL);
  store_buffer_free(&b);
  StoreRequest bad[] = {
      {.op = STORE_HELLO, .number = 1, .world_size = 0, .value = {NONCE, STORE_NONCE_BYTES}},  /* a rank without a world */
      {.op = STORE_HELLO, .number = -1, .world_size = 2, .value = {NONCE, STORE_NONCE_BYTES}}, /* anonymous with one */
      {.op = STORE_HELLO, .number = 0, .world_size = 1, .value = {NONCE, 8}},                  /* a short nonce */
      {.op = STORE_HELLO, .number = 0, .world_size = 1, .value = {NONCE, STORE_NONCE_BYTES}, .value2 = {NONCE, 5}},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) CHECK(store_encode_request(&b, &bad[i]) == WK_ERR_INVALID_ARG);
  store_buffer_free(&b);
  /* A proof binds the side, both nonces, the rank and the world size. */
  uint8_t proof[STORE_PROOF_BYTES], other[STORE_PROOF_BYTES];
  store_proof(SECRET, SECRET_LENGTH, STORE_PROOF_CLIENT, NONCE, challenge.nonce, 1, 2, proof);
  store_proof(SECRET, SECRET_LENGTH, STORE_PROOF_SERVER, NONCE, challenge.nonce, 1, 2, other);
  CHECK(!wk_digest_equal(proof, other, STORE_PROOF_BYTES));
  store_proof(SECRET, SECRET_LENGTH, STORE_PROOF_CLIENT, NONCE, challenge.nonce, 1, 3, other);
  CHECK(!wk_digest_equal(proof, other, STORE_PROOF_BYTES));
  store_proof(SECRET, SECRET_LENGTH, STORE_PROOF_CLIENT, challenge.nonce, NONCE, 1, 2, other);
  CHECK(!wk_digest_equal(proof, other, STORE_PROOF_BYTES));
}

/* ---- the server and the client ----------------------------------------------------------------- */

typedef struct {
  int port;
  const char *key;
  int adds;
} Adder;

static void *add_many(void *arg) {
  Adder *a = arg;
  WkStore *s = wk_store_connect("127.0.0.1", a->port, -1, 0, LONG_MS);
  if (!s) return (void *)1;
  for (int i = 0; i < a->adds; i++)
    if (wk_store_add(s, a->key, 1, NULL) != WK_OK) return (void *)1;
  wk_store_close(s);
  return NULL;
}

static void *set_later(void *arg) {
  Adder *a = arg;
  WkStore *s = wk_store_connect("127.0.0.1", a->port, -1, 0, LONG_MS);
  if (!s) return (void *)1;
  usleep(SHORT_MS * 1000 / 2);
  WkStatus st = wk_store_set(s, a->key, "late", 4);
  wk_store_close(s);
  return st == WK_OK ? NULL : (void *)1;
}

static void test_store_set_get_wait_add_compare_set(void) {
  WkStoreServer *server = wk_store_server_start("127.0.0.1", 0, 4);
  CHECK(server != NULL);
  if (!server) return;
  int port = wk_store_server_port(server);
  WkStore *s = wk_store_connect("127.0.0.1", port, 0, 4, LONG_MS);
  CHECK(s != NULL);
  char buf[64];
  size_t length = 0;
  CHECK(wk_store_set(s, "a", "alpha", 5) == WK_OK);
  CHECK(wk_store_get(s, "a", 0, buf, sizeof buf, &length) == WK_OK && length == 5 && memcmp(buf, "alpha", 5) == 0);
  CHECK(wk_store_get(s, "a", 0, buf, 2, &length) == WK_ERR_INVALID_ARG && length == 5); /* too small: told the size */

  uint64_t start = wk_now_ns();
  CHECK(wk_store_get(s, "absent", SHORT_MS, buf, sizeof buf, &length) == WK_ERR_TIMEOUT);
  double waited_ms = (double)(wk_now_ns() - start) / 1e6;
  CHECK(waited_ms >= SHORT_MS * 0.9 && waited_ms < SHORT_MS * 5);
  CHECK(strstr(wk_last_error(), "absent") != NULL);

  Adder later = {port, "later", 0};
  pthread_t thread;
  pthread_create(&thread, NULL, set_later, &later);
  CHECK(wk_store_get(s, "later", LONG_MS, buf, sizeof buf, &length) == WK_OK && length == 4);
  void *failed;
  pthread_join(thread, &failed);
  CHECK(failed == NULL);
  const char *keys[] = {"a", "later"};
  CHECK(wk_store_wait(s, keys, 2, 0) == WK_OK);
  const char *missing[] = {"a", "nope"};
  CHECK(wk_store_wait(s, missing, 2, SHORT_MS / 4) == WK_ERR_TIMEOUT);

  enum { THREADS = 4, ADDS = 200 };
  Adder adders[THREADS];
  pthread_t threads[THREADS];
  for (int i = 0; i < THREADS; i++) {
    adders[i] = (Adder){port, "count", ADDS};
    pthread_create(&threads[i], NULL, add_many, &adders[i]);
  }
  for (int i = 0; i < THREADS; i++) {
    pthread_join(threads[i], &failed);
    CHECK(failed == NULL);
  }
  int64_t value = 0;
  CHECK(wk_store_add(s, "count", 0, &value) == WK_OK && value == THREADS * ADDS);
  CHECK(wk_store_add(s, "a", 1, &value) == WK_ERR_INVALID_ARG); /* "alpha" is not a number */
  CHECK(strstr(wk_last_error(), "not a decimal") != NULL);
  CHECK(wk_store_add(s, "count", 0, &value) == WK_OK); /* a refused request leaves the client usable */

  int swapped = -1;
  CHECK(wk_store_compare_set(s, "leader", "", 0, "r1", 2, buf, sizeof buf, &length, &swapped) == WK_OK);
  CHECK(swapped == 1 && length == 2 && memcmp(buf, "r1", 2) == 0);
  CHECK(wk_store_compare_set(s, "leader", "", 0, "r2", 2, buf, sizeof buf, &length, &swapped) == WK_OK);
  CHECK(swapped == 0 && memcmp(buf, "r1", 2) == 0);
  CHECK(wk_store_compare_set(s, "leader", "r1", 2, "r3", 2, buf, sizeof buf, &length, &swapped) == WK_OK);
  CHECK(swapped == 1 && memcmp(buf, "r3", 2) == 0);

  size_t big = 1u << 20;
  char *value_in = malloc(big), *value_out = malloc(big);
  for (size_t i = 0; i < big; i++) value_in[i] = (char)(i * 31);
  CHECK(wk_store_set(s, "big", value_in, big) == WK_OK);
  CHECK(wk_store_get(s, "big", 0, value_out, big, &length) == WK_OK && length == big && memcmp(value_in, value_out, big) == 0);
  CHECK(wk_store_set(s, "huge", value_in, (size_t)STORE_MAX_VALUE + 1) == WK_ERR_INVALID_ARG);
  CHECK(strstr(wk_last_error(), "store key 'huge': a value of 16777217 bytes (at most 16777216)") != NULL);
  free(value_in);
  free(value_out);
  CHECK(wk_store_get(s, "a", -1, buf, sizeof buf, &length) == WK_ERR_INVALID_ARG); /* no unbounded waits */
  wk_store_close(s);
  wk_store_server_stop(server, 0);
}

static int raw_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Sends bytes and reads until the server closes; returns whether it closed within the time. */
static bool server_closes_after(int port, const void *bytes, size_t length) {
  int fd = raw_connect(port);
  if (fd < 0) return false;
  bool closed = false;
  if (send(fd, bytes, length, MSG_NOSIGNAL) == (ssize_t)length) {
    struct timeval tv = {.tv_sec = LONG_MS / 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char sink[1024];
    ssize_t n;
    while ((n = recv(fd, sink, sizeof sink, 0)) > 0) {}
    closed = n == 0;
  }
  close(fd);
  return closed;
}

static void test_server_survives_malformed_truncated_and_oversized_input(void) {
  WkStoreServer *server = wk_store_server_start("127.0.0.1", 0, 2);
  CHECK(server != NULL);
  if (!server) return;
  int port = wk_store_server_port(server);
  WkStore *good = wk_store_connect("127.0.0.1", port, 0, 2, LONG_MS);
  CHECK(good != NULL && wk_store_set(good, "k", "v", 1) == WK_OK);
  const uint8_t garbage[] = {5, 0, 0, 0, 42, 42, 42, 42, 42};
  const uint8_t oversized[] = {0xff, 0xff, 0xff, 0xff, 1, 2, 3};
  const uint8_t zero_length[] = {0, 0, 0, 0};
  CHECK(server_closes_after(port, garbage, sizeof garbage));
  CHECK(server_closes_after(port, oversized, sizeof oversized));
  CHECK(server_closes_after(port, zero_length, sizeof zero_length));
  /* A frame cut short, then the peer leaves: nothing to answer, nothing to crash. */
  int fd = raw_connect(port);
  const uint8_t truncated[] = {100, 0, 0, 0, STORE_SET, 0, 1};
  CHECK(fd >= 0 && send(fd, truncated, sizeof truncated, MSG_NOSIGNAL) == (ssize_t)sizeof truncated);
  close(fd);
  char buf[8];
  size_t length;
  CHECK(wk_store_get(good, "k", 0, buf, sizeof buf, &length) == WK_OK && length == 1);
  wk_store_close(good);
  wk_store_server_stop(server, 0);
}

/* Reads one frame off fd (blocking, at most LONG_MS); its body length, or -1 when the server
 * closed the connection first. */
static long raw_read_frame(int fd, uint8_t *body, size_t capacity) {
  struct timeval tv = {.tv_sec = LONG_MS / 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  uint8_t header[STORE_FRAME_HEADER];
  if (recv(fd, header, sizeof header, MSG_WAITALL) != (ssize_t)sizeof header) return -1;
  uint32_t length = header[0] | header[1] << 8 | header[2] << 16 | (uint32_t)header[3] << 24;
  if (length > capacity || recv(fd, body, length, MSG_WAITALL) != (ssize_t)length) return -1;
  return (long)length;
}

static bool raw_send(int fd, const StoreRequest *q) {
  StoreBuffer b = {0};
  bool sent = store_encode_request(&b, q) == WK_OK && send(fd, b.data, b.length, MSG_NOSIGNAL) == (ssize_t)b.length;
  store_buffer_free(&b);
  return sent;
}

/* A client by hand: reads the challenge, says hello as rank of world with the proof secret gives
 * (length 0: none). Returns the connection when the server answered OK, else -1. */
static int raw_hello(int port, int64_t rank, int64_t world, const uint8_t *secret, size_t length) {
  int fd = raw_connect(port);
  uint8_t body[512];
  StoreChallenge challenge;
  long n = fd < 0 ? -1 : raw_read_frame(fd, body, sizeof body);
  if (n < 0 || store_parse_challenge(body, (size_t)n, &challenge) != WK_OK) {
    if (fd >= 0) close(fd);
    return -1;
  }
  uint8_t proof[STORE_PROOF_BYTES];
  StoreRequest hello = {.op = STORE_HELLO, .number = rank, .world_size = world, .value = {NONCE, STORE_NONCE_BYTES}};
  if (length) {
    store_proof(secret, length, STORE_PROOF_CLIENT, challenge.nonce, NONCE, rank, world, proof);
    hello.value2 = (StoreBytes){proof, STORE_PROOF_BYTES};
  }
  StoreReply y;
  if (!raw_send(fd, &hello) || (n = raw_read_frame(fd, body, sizeof body)) < 0 ||
      store_parse_reply(STORE_HELLO, body, (size_t)n, &y) != WK_OK || y.status != STORE_REPLY_OK) {
    close(fd);
    return -1;
  }
  return fd;
}

/* The server's view of every rank, once it settled on `expected` (or after a few seconds). */
static bool rank_states_become(WkStore *s, const uint8_t *expected, uint32_t count) {
  uint8_t states[16] = {0};
  for (int tries = 0; tries < 300; tries++) {
    if (store_rank_states(s, states, count, LONG_MS) == WK_OK && memcmp(states, expected, count) == 0) return true;
    usleep(10000);
  }
  return false;
}

static void test_server_tells_closed_from_lost_ranks(void) {
  WkStoreServer *server = wk_store_server_start("127.0.0.1", 0, 3);
  if (!server) {
    CHECK(server != NULL);
    return;
  }
  int port = wk_store_server_port(server);
  WkStore *r0 = wk_store_connect("127.0.0.1", port, 0, 3, LONG_MS);
  WkStore *r1 = wk_store_connect("127.0.0.1", port, 1, 3, LONG_MS);
  CHECK(r0 && r1);
  int fd = raw_hello(port, 2, 3, NULL, 0); /* rank 2 says hello by hand, then drops without bye */
  CHECK(fd >= 0);
  close(fd);
  wk_store_close(r1);
  CHECK(rank_states_become(r0, (const uint8_t[]){STORE_RANK_CONNECTED, STORE_RANK_CLOSED, STORE_RANK_LOST}, 3));
  CHECK(wk_store_connect("127.0.0.1", port, 3, 4, LONG_MS) == NULL); /* not a job of this size */
  wk_store_close(r0);
  wk_store_server_stop(server, 0);
}

/* Reads until the server closes fd; true when it closed within LONG_MS without serving anything. */
static bool closed_unanswered(int fd) {
  uint8_t body[512];
  long n;
  while ((n = raw_read_frame(fd, body, sizeof body)) >= 0) {
    StoreReply y;
    if (store_parse_reply(STORE_SET, body, (size_t)n, &y) == WK_OK && y.status == STORE_REPLY_OK) return false;
  }
  return true;
}

static void test_only_connections_proving_the_secret_are_served(void) {
  WkStoreServer *server = store_server_start_keyed("127.0.0.1", 0, 2, SECRET, SECRET_LENGTH, STORE_LIMITS);
  CHECK(server != NULL);
  if (!server) return;
  int port = wk_store_server_port(server);
  WkStore *r0 = store_connect_keyed("127.0.0.1", port, 0, 2, LONG_MS, SECRET, SECRET_LENGTH);
  CHECK(r0 != NULL);
  CHECK(store_connect_keyed("127.0.0.1", port, 1, 2, LONG_MS, OTHER_SECRET, SECRET_LENGTH) == NULL);
  CHECK(wk_last_status() == WK_ERR_NETWORK && strstr(wk_last_error(), "wrong proof of the job's secret") != NULL);
  CHECK(store_connect_keyed("127.0.0.1", port, 1, 2, LONG_MS, NULL, 0) == NULL);
  CHECK(wk_last_status() == WK_ERR_NETWORK && strstr(wk_last_error(), "requires the job's secret") != NULL);
  CHECK(store_connect_keyed("127.0.0.1", port, -1, 0, LONG_MS, OTHER_SECRET, SECRET_LENGTH) == NULL);

  /* Strangers by hand: a request before hello, a hello as rank 1 with no proof or a wrong one, a
   * hello too big to be one. Each is closed without an answer that serves it. */
  int fd = raw_connect(port);
  CHECK(fd >= 0 && raw_send(fd, &(StoreRequest){.op = STORE_SET, .key_count = 1, .keys = {text("wick/pause/1")},
                                                 .value = text("lr_scale=0")}));
  CHECK(closed_unanswered(fd));
  close(fd);
  CHECK(raw_hello(port, 1, 2, NULL, 0) < 0);
  CHECK(raw_hello(port, 1, 2, OTHER_SECRET, SECRET_LENGTH) < 0);
  fd = raw_connect(port);
  const uint8_t huge[] = {0, 0, 0, 1, STORE_HELLO, 0}; /* 16 MiB announced */
  CHECK(fd >= 0 && send(fd, huge, sizeof huge, MSG_NOSIGNAL) == (ssize_t)sizeof huge && closed_unanswered(fd));
  close(fd);
  /* None of them changed anything: the key is not there, and rank 1 is unseen, not lost. */
  char buf[16];
  size_t length;
  CHECK(wk_store_get(r0, "wick/pause/1", 0, buf, sizeof buf, &length) == WK_ERR_TIMEOUT);
  uint8_t states[2];
  CHECK(store_rank_states(r0, states, 2, LONG_MS) == WK_OK && states[1] == STORE_RANK_UNSEEN);
  /* The real rank 1 still joins. */
  WkStore *r1 = store_connect_keyed("127.0.0.1", port, 1, 2, LONG_MS, SECRET, SECRET_LENGTH);
  CHECK(r1 != NULL && wk_store_set(r1, "k", "v", 1) == WK_OK);
  wk_store_close(r1);
  wk_store_close(r0);
  wk_store_server_stop(server, 0);

  /* Mutual: a rank with the secret refuses a store without one. */
  server = store_server_start_keyed("127.0.0.1", 0, 2, NULL, 0, STORE_LIMITS);
  CHECK(server != NULL);
  if (!server) return;
  CHECK(store_connect_keyed("127.0.0.1", wk_store_server_port(server), 0, 2, LONG_MS, SECRET, SECRET_LENGTH) == NULL);
  CHECK(strstr(wk_last_error(), "has no job secret, but this rank has one") != NULL);
  wk_store_server_stop(server, 0);
}

/* A fake store on a port: greets as keyed, then answers any hello OK with a proof it made up. */
typedef struct {
  int listen_fd;
} Impostor;

static void *impostor_serve(void *arg) {
  Impostor *impostor = arg;
  int fd = accept(impostor->listen_fd, NULL, NULL);
  if (fd < 0) return NULL;
  StoreBuffer b = {0};
  StoreChallenge challenge = {.keyed = true};
  uint8_t body[512], proof[STORE_PROOF_BYTES] = {0};
  store_encode_challenge(&b, &challenge);
  if (send(fd, b.data, b.length, MSG_NOSIGNAL) == (ssize_t)b.length && raw_read_frame(fd, body, sizeof body) > 0) {
    b.length = 0;
    store_encode_reply(&b, STORE_HELLO, &(StoreReply){.status = STORE_REPLY_OK, .value = {proof, sizeof proof}});
    if (send(fd, b.data, b.length, MSG_NOSIGNAL) != (ssize_t)b.length) perror("impostor");
  }
  store_buffer_free(&b);
  close(fd);
  return NULL;
}

static void test_client_refuses_a_store_that_cannot_prove_the_secret(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  socklen_t length = sizeof a;
  CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 1) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &length) == 0);
  Impostor impostor = {fd};
  pthread_t thread;
  pthread_create(&thread, NULL, impostor_serve, &impostor);
  CHECK(store_connect_keyed("127.0.0.1", ntohs(a.sin_port), 1, 2, LONG_MS, SECRET, SECRET_LENGTH) == NULL);
  CHECK(strstr(wk_last_error(), "did not prove it knows the job's secret") != NULL);
  pthread_join(thread, NULL);
  close(fd);
}

static void test_hello_checks_the_world_size_and_one_connection_per_rank(void) {
  WkStoreServer *server = store_server_start_keyed("127.0.0.1", 0, 2, SECRET, SECRET_LENGTH, STORE_LIMITS);
  CHECK(server != NULL);
  if (!server) return;
  int port = wk_store_server_port(server);
  CHECK(store_connect_keyed("127.0.0.1", port, 1, 3, LONG_MS, SECRET, SECRET_LENGTH) == NULL);
  CHECK(wk_last_status() == WK_ERR_NETWORK &&
        strstr(wk_last_error(), "rank 1 has WORLD_SIZE=3, but rank 0 has WORLD_SIZE=2") != NULL);
  WkStore *r0 = store_connect_keyed("127.0.0.1", port, 0, 2, LONG_MS, SECRET, SECRET_LENGTH);
  WkStore *r1 = store_connect_keyed("127.0.0.1", port, 1, 2, LONG_MS, SECRET, SECRET_LENGTH);
  CHECK(r0 && r1);
  /* A second rank 1, even with the secret, is refused, and its leaving does not make rank 1 lost. */
  CHECK(store_connect_keyed("127.0.0.1", port, 1, 2, LONG_MS, SECRET, SECRET_LENGTH) == NULL);
  CHECK(strstr(wk_last_error(), "rank 1 is connected already") != NULL);
  usleep(SHORT_MS * 1000);
  CHECK(rank_states_become(r0, (const uint8_t[]){STORE_RANK_CONNECTED, STORE_RANK_CONNECTED}, 2));
  /* Once rank 1 said bye, it may join again (a process group opened anew). */
  wk_store_close(r1);
  r1 = store_connect_keyed("127.0.0.1", port, 1, 2, LONG_MS, SECRET, SECRET_LENGTH);
  CHECK(r1 != NULL);
  wk_store_close(r1);
  wk_store_close(r0);
  wk_store_server_stop(server, 0);
}

static void test_the_budget_and_connection_caps_hold(void) {
  enum { BUDGET = 1 << 20 };
  WkStoreServer *server = store_server_start_keyed("127.0.0.1", 0, 1, NULL, 0,
                                                  (StoreLimits){.max_bytes = BUDGET, .handshake_timeout_ms = LONG_MS});
  CHECK(server != NULL);
  if (!server) return;
  int port = wk_store_server_port(server);
  WkStore *s = store_connect_keyed("127.0.0.1", port, -1, 0, LONG_MS, NULL, 0);
  char *value = calloc(1, BUDGET / 2);
  CHECK(s && value && wk_store_set(s, "first", value, BUDGET / 2) == WK_OK);
  CHECK(wk_store_set(s, "second", value, BUDGET / 2) == WK_ERR_INVALID_ARG); /* the server refused it */
  CHECK(strstr(wk_last_error(), "setting key 'second' to 524288 bytes would pass the store's budget of 1048576") != NULL);
  CHECK(wk_store_set(s, "first", value, BUDGET / 4) == WK_OK); /* replacing frees what it held */
  CHECK(wk_store_set(s, "second", value, BUDGET / 2) == WK_OK);
  free(value);
  /* One connection per rank and 256 more: beyond them even a client that proves itself is not taken. */
  enum { EXTRA = 256 };
  int fds[EXTRA];
  int open_count = 1; /* s */
  for (int i = 0; i < EXTRA; i++) {
    fds[i] = raw_hello(port, -1, 0, NULL, 0);
    if (fds[i] >= 0) open_count++;
  }
  CHECK(open_count == 1 + EXTRA);
  CHECK(raw_hello(port, -1, 0, NULL, 0) < 0);
  for (int i = 0; i < EXTRA; i++)
    if (fds[i] >= 0) close(fds[i]);
  wk_store_close(s);
  wk_store_server_stop(server, 0);
}

static void test_a_connection_that_does_not_finish_its_hello_in_time_is_closed(void) {
  WkStoreServer *server = store_server_start_keyed("127.0.0.1", 0, 2, SECRET, SECRET_LENGTH,
                                                  (StoreLimits){.max_bytes = 1 << 20, .handshake_timeout_ms = SHORT_MS});
  CHECK(server != NULL);
  if (!server) return;
  int port = wk_store_server_port(server);
  uint8_t body[512];
  int silent = raw_connect(port), slow = raw_connect(port);
  CHECK(silent >= 0 && raw_read_frame(silent, body, sizeof body) > 0);
  CHECK(slow >= 0 && raw_read_frame(slow, body, sizeof body) > 0);
  const uint8_t half_a_hello[] = {64, 0, 0, 0, STORE_HELLO, 0, 1};
  CHECK(send(slow, half_a_hello, sizeof half_a_hello, MSG_NOSIGNAL) == (ssize_t)sizeof half_a_hello);
  uint64_t start = wk_now_ns();
  CHECK(raw_read_frame(silent, body, sizeof body) < 0 && raw_read_frame(slow, body, sizeof body) < 0);
  double waited_ms = (double)(wk_now_ns() - start) / 1e6;
  CHECK(waited_ms >= SHORT_MS * 0.5 && waited_ms < LONG_MS); /* closed at the deadline, not before */
  close(silent);
  close(slow);
  WkStore *r0 = store_connect_keyed("127.0.0.1", port, 0, 2, LONG_MS, SECRET, SECRET_LENGTH);
  CHECK(r0 != NULL && wk_store_set(r0, "k", "v", 1) == WK_OK);
  usleep(2 * SHORT_MS * 1000); /* an authenticated connection has no such deadline */
  CHECK(wk_store_set(r0, "k", "w", 1) == WK_OK);
  wk_store_close(r0);
  wk_store_server_stop(server, 0);
}

static void test_connections_in_their_handshake_are_capped(void) {
  WkStoreServer *server = store_server_start_keyed("127.0.0.1", 0, 1, SECRET, SECRET_LENGTH, STORE_LIMITS);
  CHECK(server != NULL);
  if (!server) return;
  int port = wk_store_server_port(server);
  enum { SILENT = 64 }; /* the server's MAX_HANDSHAKES */
  int silent[SILENT];
  uint8_t body[512];
  for (int i = 0; i < SILENT; i++) {
    silent[i] = raw_connect(port);
    CHECK(silent[i] >= 0 && raw_read_frame(silent[i], body, sizeof body) > 0); /* each is greeted */
  }
  int one_more = raw_connect(port);
  CHECK(one_more >= 0 && raw_read_frame(one_more, body, sizeof body) < 0); /* closed, not greeted */
  close(one_more);
  for (int i = 0; i < SILENT; i++) close(silent[i]);
  WkStore *r0 = store_connect_keyed("127.0.0.1", port, 0, 1, LONG_MS, SECRET, SECRET_LENGTH);
  CHECK(r0 != NULL); /* the slots are free again */
  wk_store_close(r0);
  wk_store_server_stop(server, 0);
}

static void test_connect_gives_up_at_its_timeout(void) {
  WkStoreServer *server = wk_store_server_start("127.0.0.1", 0, 1); /* a port known free once it stops */
  int port = wk_store_server_port(server);
  wk_store_server_stop(server, 0);
  uint64_t start = wk_now_ns();
  CHECK(wk_store_connect("127.0.0.1", port, 0, 1, SHORT_MS) == NULL);
  double waited_ms = (double)(wk_now_ns() - start) / 1e6;
  CHECK(wk_last_status() == WK_ERR_TIMEOUT && strstr(wk_last_error(), "MASTER_ADDR") != NULL);
  CHECK(waited_ms >= SHORT_MS * 0.9 && waited_ms < SHORT_MS * 5);
}

/* ---- world discovery ----------------------------------------------------------------------------- */

static const char *const ENV_NAMES[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                        "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID",
                                        "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_JOB_NODELIST",
                                        "SLURM_NODELIST"};

static void clear_env(void) {
  for (size_t i = 0; i < sizeof ENV_NAMES / sizeof ENV_NAMES[0]; i++) unsetenv(ENV_NAMES[i]);
}

static void test_world_from_torchrun_slurm_or_nothing(void) {
  clear_env();
  WkWorld w;
  CHECK(wk_world_from_env(&w) == WK_OK && w.world_size == 1 && w.rank == 0 && w.source == WK_WORLD_SINGLE);

  setenv("RANK", "3", 1), setenv("WORLD_SIZE", "4", 1), setenv("LOCAL_RANK", "1", 1);
  setenv("LOCAL_WORLD_SIZE", "2", 1), setenv("MASTER_ADDR", "node0", 1), setenv("MASTER_PORT", "4242", 1);
  CHECK(wk_world_from_env(&w) == WK_OK && w.rank == 3 && w.world_size == 4 && w.local_rank == 1 &&
        w.local_world_size == 2 && w.master_port == 4242 && strcmp(w.master_addr, "node0") == 0 &&
        w.source == WK_WORLD_TORCHRUN);
  setenv("RANK", "4", 1);
  CHECK(wk_world_from_env(&w) == WK_ERR_INVALID_ARG && strstr(wk_last_error(), "RANK=4") != NULL);
  setenv("RANK", "1.5", 1);
  CHECK(wk_world_from_env(&w) == WK_ERR_INVALID_ARG && strstr(wk_last_error(), "RANK='1.5'") != NULL);
  setenv("RANK", "1", 1), setenv("MASTER_PORT", "70000", 1);
  CHECK(wk_world_from_env(&w) == WK_ERR_INVALID_ARG && strstr(wk_last_error(), "MASTER_PORT") != NULL);
  unsetenv("MASTER_PORT");
  CHECK(wk_world_from_env(&w) == WK_ERR_INVALID_ARG && strstr(wk_last_error(), "MASTER_PORT is not set") != NULL);
  unsetenv("WORLD_SIZE");
  CHECK(wk_world_from_env(&w) == WK_ERR_INVALID_ARG && strstr(wk_last_error(), "WORLD_SIZE is not set") != NULL);

  clear_env();
  setenv("SLURM_PROCID", "5", 1), setenv("SLURM_NTASKS", "8", 1), setenv("SLURM_LOCALID", "1", 1);
  setenv("SLURM_NODEID", "2", 1), setenv("SLURM_TASKS_PER_NODE", "2(x2),4", 1);
  setenv("SLURM_JOB_NODELIST", "gpu[07-09,12],cpu3", 1);
  CHECK(wk_world_from_env(&w) == WK_OK && w.rank == 5 && w.world_size == 8 && w.local_rank == 1 &&
        w.local_world_size == 4 && strcmp(w.master_addr, "gpu07") == 0 && w.master_port == 29500 &&
        w.source == WK_WORLD_SLURM);
  setenv("MASTER_ADDR", "login1", 1);
  CHECK(wk_world_from_env(&w) == WK_OK && strcmp(w.master_addr, "login1") == 0);
  setenv("RANK", "0", 1), setenv("WORLD_SIZE", "1", 1); /* srun torchrun ...: torchrun's wins */
  CHECK(wk_world_from_env(&w) == WK_OK && w.source == WK_WORLD_TORCHRUN && w.world_size == 1);
  clear_env();
}

static void test_first_slurm_host(void) {
  char host[32];
  struct { const char *list, *first; } good[] = {
      {"node7", "node7"}, {"gpu[07-09,12],cpu3", "gpu07"}, {"rack[1-2]-n[001-004]", "rack1-n001"},
      {"a.b-c_d", "a.b-c_d"}, {"n[3],m[1-2]", "n3"},
  };
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
    CHECK(world_first_slurm_host(good[i].list, host, sizeof host) == WK_OK && strcmp(host, good[i].first) == 0);
  const char *bad[] = {"", ",a", "n[", "n[]", "n[1-]", "n[a]", "n[1,]", "n 1", "n[1-2"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    CHECK(world_first_slurm_host(bad[i], host, sizeof host) == WK_ERR_FORMAT);
  CHECK(world_first_slurm_host("abcdefghijklmnopqrstuvwxyz0123456789", host, sizeof host) == WK_ERR_FORMAT);
}

int main(void) {
  unsetenv("WICK_STORE_SECRET"); /* the public calls below run without a job secret */
  unsetenv("WICK_STORE_SECRET_FILE");
  RUN_TEST(test_requests_round_trip_and_every_truncation_is_refused);
  RUN_TEST(test_challenge_round_trips_and_hello_fields_are_checked);
  RUN_TEST(test_malformed_requests_are_refused_with_a_reason);
  RUN_TEST(test_store_set_get_wait_add_compare_set);
  RUN_TEST(test_server_survives_malformed_truncated_and_oversized_input);
  RUN_TEST(test_server_tells_closed_from_lost_ranks);
  RUN_TEST(test_only_connections_proving_the_secret_are_served);
  RUN_TEST(test_client_refuses_a_store_that_cannot_prove_the_secret);
  RUN_TEST(test_hello_checks_the_world_size_and_one_connection_per_rank);
  RUN_TEST(test_a_connection_that_does_not_finish_its_hello_in_time_is_closed);
  RUN_TEST(test_connections_in_their_handshake_are_capped);
  RUN_TEST(test_the_budget_and_connection_caps_hold);
  RUN_TEST(test_connect_gives_up_at_its_timeout);
  RUN_TEST(test_world_from_torchrun_slurm_or_nothing);
  RUN_TEST(test_first_slurm_host);
  return check_failures ? 1 : 0;
}
