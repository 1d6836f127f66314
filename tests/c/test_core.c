/*
 * test_core.c — the error slot and the bounded queue of runtime/core.
 */
#include <pthread.h>
#include <time.h>
#include <string.h>

#include "check.h"
#include "core/core.h"

static void test_error_slot_records_status_message_and_site(void) {
  wk_clear_error();
  WkStatus status = WK_FAIL(WK_ERR_FORMAT, "block %d: checksum mismatch", 17);
  CHECK(status == WK_ERR_FORMAT);
  CHECK(wk_last_status() == WK_ERR_FORMAT);
  CHECK(strcmp(wk_last_error(), "block 17: checksum mismatch") == 0);
  CHECK(strstr(wk_last_error_site(), "test_core.c:") != NULL);
  wk_error_context("shard '%s'", "a.wk");
  CHECK(strcmp(wk_last_error(), "shard 'a.wk': block 17: checksum mismatch") == 0);
  CHECK(wk_last_status() == WK_ERR_FORMAT);
  wk_clear_error();
  CHECK(wk_last_status() == WK_OK && wk_last_error()[0] == '\0');
}

static void test_error_message_is_not_a_format_string(void) {
  WK_FAIL(WK_ERR_INVALID_ARG, "%s", "100%s %n %x");
  CHECK(strcmp(wk_last_error(), "100%s %n %x") == 0);
}

static void *fail_in_thread(void *arg) {
  WK_FAIL(WK_ERR_IO, "only in the other thread");
  return NULL;
}

static void test_error_slot_is_per_thread(void) {
  wk_clear_error();
  pthread_t thread;
  pthread_create(&thread, NULL, fail_in_thread, NULL);
  pthread_join(thread, NULL);
  CHECK(wk_last_status() == WK_OK);
}

static void test_errno_failure_names_path(void) {
  FILE *f = fopen("/nonexistent/dir/file", "r");
  CHECK(f == NULL);
  CHECK(WK_FAIL_ERRNO("open", "/nonexistent/dir/file") == WK_ERR_IO);
  CHECK(strstr(wk_last_error(), "open '/nonexistent/dir/file': No such file") != NULL);
}

static void test_queue_fifo_capacity_timeout(void) {
  WkQueue *q = wk_queue_new(2);
  int a = 1, b = 2, c = 3;
  CHECK(wk_queue_push(q, &a, 0) == WK_OK);
  CHECK(wk_queue_push(q, &b, 0) == WK_OK);
  CHECK(wk_queue_push(q, &c, 10) == WK_ERR_TIMEOUT); /* full: backpressure, not growth */
  CHECK(wk_queue_length(q) == 2);
  void *item = NULL;
  CHECK(wk_queue_pop(q, &item, 0) == WK_OK && item == &a);
  CHECK(wk_queue_pop(q, &item, 0) == WK_OK && item == &b);
  CHECK(wk_queue_pop(q, &item, 10) == WK_ERR_TIMEOUT);
  wk_queue_free(q);
  CHECK(wk_queue_new(0) == NULL && wk_last_status() == WK_ERR_INVALID_ARG);
}

static void test_queue_close_drains_then_reports_closed(void) {
  WkQueue *q = wk_queue_new(4);
  int a = 1;
  CHECK(wk_queue_push(q, &a, -1) == WK_OK);
  wk_queue_close(q);
  CHECK(wk_queue_push(q, &a, -1) == WK_ERR_CLOSED);
  void *item = NULL;
  CHECK(wk_queue_pop(q, &item, -1) == WK_OK && item == &a);
  CHECK(wk_queue_pop(q, &item, -1) == WK_ERR_CLOSED);
  wk_queue_free(q);
}

enum { HANDOFF_ITEMS = 200000 };

static void *produce(void *arg) {
  WkQueue *q = arg;
  for (uintptr_t i = 1; i <= HANDOFF_ITEMS; i++) wk_queue_push(q, (void *)i, -1);
  wk_queue_close(q);
  return NULL;
}

static void test_queue_threads_hand_over_everything_in_order(void) {
  WkQueue *q = wk_queue_new(8);
  pthread_t producer;
  pthread_create(&producer, NULL, produce, q);
  uintptr_t expected = 1;
  bool in_order = true;
  void *item;
  while (wk_queue_pop(q, &item, -1) == WK_OK) {
    in_order = in_order && (uintptr_t)item == expected;
    expected++;
  }
  pthread_join(producer, NULL);
  CHECK(in_order);
  CHECK(expected == HANDOFF_ITEMS + 1);
  wk_queue_free(q);
}

static void *close_later(void *arg) {
  struct timespec pause = {0, 20 * 1000000};
  nanosleep(&pause, NULL);
  wk_queue_close(arg);
  return NULL;
}

static void test_queue_close_wakes_a_blocked_consumer(void) {
  WkQueue *q = wk_queue_new(1);
  pthread_t closer;
  pthread_create(&closer, NULL, close_later, q);
  void *item;
  CHECK(wk_queue_pop(q, &item, -1) == WK_ERR_CLOSED);
  pthread_join(closer, NULL);
  wk_queue_free(q);
}

static void *report_mask(void *out) {
  pthread_sigmask(SIG_BLOCK, NULL, (sigset_t *)out);
  return NULL;
}

/* A worker blocks the signals sent to the process, so they reach the host's thread; its creator's
 * own mask is left as it was. */
static void test_threads_leave_the_process_signals_to_the_host(void) {
  sigset_t in_thread, creator;
  pthread_t thread;
  CHECK(wk_thread_create(&thread, report_mask, &in_thread) == 0);
  pthread_join(thread, NULL);
  CHECK(sigismember(&in_thread, SIGUSR1) && sigismember(&in_thread, SIGINT) && sigismember(&in_thread, SIGTERM));
  pthread_sigmask(SIG_BLOCK, NULL, &creator);
  CHECK(!sigismember(&creator, SIGUSR1) && !sigismember(&creator, SIGTERM));
}

int main(void) {
  RUN_TEST(test_error_slot_records_status_message_and_site);
  RUN_TEST(test_error_message_is_not_a_format_string);
  RUN_TEST(test_error_slot_is_per_thread);
  RUN_TEST(test_errno_failure_names_path);
  RUN_TEST(test_queue_fifo_capacity_timeout);
  RUN_TEST(test_queue_close_drains_then_reports_closed);
  RUN_TEST(test_queue_threads_hand_over_everything_in_order);
  RUN_TEST(test_queue_close_wakes_a_blocked_consumer);
  RUN_TEST(test_threads_leave_the_process_signals_to_the_host);
  return check_failures ? 1 : 0;
}
