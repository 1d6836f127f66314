/*
 * test_shared.c — the node's shared memory as an outside value: a region that is not this user's with
 * mode 0600 is refused (core/shared.c), and a node cache whose shared header or links another process
 * corrupted fails with a message instead of reading outside the region or looping (loader/node_cache.c),
 * and a reader whose pid now names another process is cleared like a dead one.
 *
 * node_cache.c is included, not linked: the tests corrupt its private layout the way another process
 * mapping the region could.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "loader/node_cache.c"

enum { HANG_LIMIT_S = 60 }; /* a loop in a chain would otherwise hang the test instead of failing it */

static WkStatus zero_init(void *ctx, void *base) {
  (void)ctx;
  (void)base;
  return WK_OK;
}

static void test_refuses_a_region_of_this_user_that_others_may_open(void) {
  char name[64], path[80];
  snprintf(name, sizeof name, "/wick-test-mode-%d", (int)getpid());
  snprintf(path, sizeof path, "/dev/shm%s", name);
  int fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
  CHECK(fd >= 0);
  if (fd < 0) return;
  uint32_t ready = 0x57434b52; /* shared.c's READY_MAGIC: a finished region in every other respect */
  CHECK(ftruncate(fd, 4096) == 0 && pwrite(fd, &ready, sizeof ready, 0) == (ssize_t)sizeof ready);
  CHECK(fchmod(fd, 0644) == 0);
  close(fd);
  WkSharedRegion region;
  CHECK(wk_shared_open(name, 4096, 0, zero_init, NULL, &region) == WK_ERR_IO);
  CHECK(strstr(wk_last_error(), "with mode 0644, not by this user") != NULL);
  CHECK(strstr(wk_last_error(), path) != NULL);
  unlink(path);
}

static WkStatus fill_pattern(void *ctx, uint8_t *dst) {
  memset(dst, *(const int *)ctx, 64);
  return WK_OK;
}

static WkNodeCacheConfig cache_config_for(const char *name) {
  return (WkNodeCacheConfig){.what = "test source", .shared_name = name, .identity = 42, .budget_bytes = 1 << 20,
                             .unit_bytes = 4096, .edge_bytes = 256, .edge_slots = 8};
}

static void test_a_joiner_checks_the_whole_layout(void) {
  char name[64];
  snprintf(name, sizeof name, "/wick-test-layout-%d", (int)getpid());
  WkNodeCacheConfig cfg = cache_config_for(name);
  WkNodeCache *first = NULL, *second = NULL;
  CHECK(wk_node_cache_open(&cfg, 0, &first) == WK_OK);
  if (!first) return;
  first->h->buckets = 1u << 31; /* as another process could write it: bucket heads far outside */
  CHECK(wk_node_cache_open(&cfg, 0, &second) == WK_ERR_INVALID_ARG);
  CHECK(strstr(wk_last_error(), "another stream or configuration") != NULL);
  wk_node_cache_close(second);
  wk_node_cache_close(first);
}

static void corrupt_links(WkNodeCache *c, bool loop) {
  for (uint32_t b = 0; b < c->h->buckets; b++) c->bucket[b] = loop ? 0 : 1 << 30;
  if (loop) {
    c->entries[0] = (Entry){.key = 7, .next = 0, .state = ENTRY_READY}; /* a chain that comes back to itself */
  }
  c->h->free_units = 1 << 30;
}

static void test_corrupted_links_fail_the_read(void) {
  for (int loop = 0; loop < 2; loop++) {
    char name[64];
    snprintf(name, sizeof name, "/wick-test-links-%d-%d", (int)getpid(), loop);
    WkNodeCacheConfig cfg = cache_config_for(name);
    WkNodeCache *c = NULL;
    CHECK(wk_node_cache_open(&cfg, 0, &c) == WK_OK);
    if (!c) return;
    uint8_t scratch[4096];
    WkUnitHit hit;
    int pattern = 5;
    CHECK(wk_node_cache_get(c, 1, (WkHold){.from = 0, .until = 10}, fill_pattern, &pattern, scratch, &hit) == WK_OK);
    corrupt_links(c, loop);
    CHECK(wk_node_cache_get(c, 2, (WkHold){.from = 0, .until = 10}, fill_pattern, &pattern, scratch, &hit) == WK_ERR_IO);
    CHECK(strstr(wk_last_error(), "is corrupted") != NULL && strstr(wk_last_error(), name) != NULL);
    wk_node_cache_close(c);
  }
}

static void test_a_process_is_its_pid_and_start_time(void) {
  uint32_t started = (uint32_t)wk_process_start_time(getpid());
  CHECK(started > 0);
  CHECK(still_running(getpid(), started));
  CHECK(still_running(getpid(), 0)); /* recorded without a start time: the pid alone */
  CHECK(!still_running(getpid(), started + 1));
}

static void test_a_reader_whose_pid_was_reused_is_cleared(void) {
  char name[64];
  snprintf(name, sizeof name, "/wick-test-reuse-%d", (int)getpid());
  WkNodeCacheConfig cfg = cache_config_for(name);
  WkNodeCache *first = NULL, *second = NULL;
  CHECK(wk_node_cache_open(&cfg, 0, &first) == WK_OK);
  if (!first) return;
  /* A reader that died, whose pid the kernel has given to a live process (our parent) since. */
  Reader *gone = &first->h->readers[first->reader + 1];
  atomic_store(&gone->started, (uint32_t)wk_process_start_time(getppid()) + 1);
  atomic_store(&gone->pid, (int32_t)getppid());
  first->h->attached++;
  CHECK(wk_node_cache_open(&cfg, 0, &second) == WK_OK); /* attaching clears dead readers */
  CHECK(atomic_load(&gone->pid) == 0 || atomic_load(&gone->pid) == (int32_t)getpid()); /* freed, maybe retaken */
  CHECK(first->h->attached == 2);
  wk_node_cache_close(second);
  wk_node_cache_close(first);
}

int main(void) {
  alarm(HANG_LIMIT_S);
  RUN_TEST(test_refuses_a_region_of_this_user_that_others_may_open);
  RUN_TEST(test_a_joiner_checks_the_whole_layout);
  RUN_TEST(test_corrupted_links_fail_the_read);
  RUN_TEST(test_a_process_is_its_pid_and_start_time);
  RUN_TEST(test_a_reader_whose_pid_was_reused_is_cleared);
  return check_failures == 0 ? 0 : 1;
}
