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
#include "dist/dist.h"

enum { SHORT_MS = 200, LONG_MS = 5000 };

static StoreBytes text(const char *s) { return (StoreBytes){(const uint8_t *)s, (uint32_t)strlen(s)}; }

/* ---- protocol ------------------------------------------------------------------------------------ */

static void test_requests_round_trip_and_every_truncation_is_refused(void) {
  StoreRequest requests[] = {
      {.op = STORE_HELLO, .number = 7},
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
  struct { const uint8_t *body; size_t length; const char *reason; } cases[] = {
      {unknown_op, sizeof unknown_op, "unknown op"},
      {trailing, sizeof trailing, "unexpected bytes"},
      {bad_flags, sizeof bad_flags, "flags"},
      {empty_key, sizeof empty_key, "empty"},
      {nul_key, sizeof nul_key, "NUL"},
      {huge_key, sizeof huge_key, "at most"},
      {negative_timeout, sizeof negative_timeout, "out of range"},
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

/* ---- the server and the client ----------------------------------------------------------------- */

typedef struct {
  int port;
  const char *key;
  int adds;
} Adder;

static void *add_many(void *arg) {
  Adder *a = arg;
  WkStore *s = wk_store_connect("127.0.0.1", a->port, -1, LONG_MS);
  if (!s) return (void *)1;
  for (int i = 0; i < a->adds; i++)
    if (wk_store_add(s, a->key, 1, NULL) != WK_OK) return (void *)1;
  wk_store_close(s);
  return NULL;
}

static void *set_later(void *arg) {
  Adder *a = arg;
  WkStore *s = wk_store_connect("127.0.0.1", a->port, -1, LONG_MS);
  if (!s) return (void *)1;
  usleep(SHORT_MS * 1000 / 2);
  WkStatus st = wk_store_set(s, a->key, "late", 4);
  wk_store_close(s);
  return st == WK_OK ? NULL : (void *)1;
}

static void test_store_set_get_wait_add_compare_set(void) {
  WkStoreServer *server = wk_store_server_start(0, 4);
  CHECK(server != NULL);
  if (!server) return;
  int port = wk_store_server_port(server);
  WkStore *s = wk_store_connect("127.0.0.1", port, 0, LONG_MS);
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
  WkStoreServer *server = wk_store_server_start(0, 2);
  CHECK(server != NULL);
  if (!server) return;
  int port = wk_store_server_port(server);
  WkStore *good = wk_store_connect("127.0.0.1", port, 0, LONG_MS);
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

static void test_server_tells_closed_from_lost_ranks(void) {
  WkStoreServer *server = wk_store_server_start(0, 3);
  if (!server) {
    CHECK(server != NULL);
    return;
  }
  int port = wk_store_server_port(server);
  WkStore *r0 = wk_store_connect("127.0.0.1", port, 0, LONG_MS);
  WkStore *r1 = wk_store_connect("127.0.0.1", port, 1, LONG_MS);
  CHECK(r0 && r1);
  int fd = raw_connect(port); /* rank 2 says hello by hand, then drops without bye */
  StoreBuffer b = {0};
  store_encode_request(&b, &(StoreRequest){.op = STORE_HELLO, .number = 2});
  CHECK(send(fd, b.data, b.length, MSG_NOSIGNAL) == (ssize_t)b.length);
  char reply[16];
  CHECK(recv(fd, reply, sizeof reply, 0) > 0);
  close(fd);
  store_buffer_free(&b);
  wk_store_close(r1);
  uint8_t states[3] = {0};
  for (int tries = 0; tries < 100; tries++) {
    CHECK(store_rank_states(r0, states, 3, LONG_MS) == WK_OK);
    if (states[1] == STORE_RANK_CLOSED && states[2] == STORE_RANK_LOST) break;
    usleep(10000);
  }
  CHECK(states[0] == STORE_RANK_CONNECTED && states[1] == STORE_RANK_CLOSED && states[2] == STORE_RANK_LOST);
  CHECK(wk_store_connect("127.0.0.1", port, 3, LONG_MS) == NULL); /* not a rank of this job */
  wk_store_close(r0);
  wk_store_server_stop(server, 0);
}

static void test_connect_gives_up_at_its_timeout(void) {
  WkStoreServer *server = wk_store_server_start(0, 1); /* a port known free once it stops */
  int port = wk_store_server_port(server);
  wk_store_server_stop(server, 0);
  uint64_t start = wk_now_ns();
  CHECK(wk_store_connect("127.0.0.1", port, 0, SHORT_MS) == NULL);
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
  RUN_TEST(test_requests_round_trip_and_every_truncation_is_refused);
  RUN_TEST(test_malformed_requests_are_refused_with_a_reason);
  RUN_TEST(test_store_set_get_wait_add_compare_set);
  RUN_TEST(test_server_survives_malformed_truncated_and_oversized_input);
  RUN_TEST(test_server_tells_closed_from_lost_ranks);
  RUN_TEST(test_connect_gives_up_at_its_timeout);
  RUN_TEST(test_world_from_torchrun_slurm_or_nothing);
  RUN_TEST(test_first_slurm_host);
  return check_failures ? 1 : 0;
}
