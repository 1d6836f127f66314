/*
 * test_block_cache.c — the device caching allocator's stream bookkeeping (runtime/tensor/block_cache.c)
 * over a fake device whose events complete only when the test says so: a block freed while another
 * stream may still read it is never handed to a third stream before that stream's event completes,
 * its own stream reuses it at once, a full device gets the reusable blocks back, and empty_cache waits
 * for pending streams before returning memory.
 */
#include <stdlib.h>

#include "check.h"
#include "tensor/block_cache.h"

enum { FAKE_EVENTS = 64 };

typedef struct {
  size_t capacity, in_use;  /* device bytes */
  int mallocs, frees, live_events, synchronized;
  bool done[FAKE_EVENTS];   /* event i has completed */
  int recorded;
} FakeDevice;

/* Events are small integers in disguise; 0 is never used. */
static intptr_t event_id(void *event) { return (intptr_t)event; }

/* A block's size sits in front of it, where the fake's free finds it. */
enum { HEADER = 16 };

static WkStatus fake_malloc(void *ctx, size_t bytes, void **out) {
  FakeDevice *d = ctx;
  if (d->in_use + bytes > d->capacity) return WK_FAIL(WK_ERR_NOMEM, "fake device full");
  char *base = malloc(HEADER + bytes);
  memcpy(base, &bytes, sizeof bytes);
  *out = base + HEADER;
  d->in_use += bytes;
  d->mallocs++;
  return WK_OK;
}

static void fake_free(void *ctx, void *ptr) {
  FakeDevice *d = ctx;
  char *base = (char *)ptr - HEADER;
  size_t bytes;
  memcpy(&bytes, base, sizeof bytes);
  d->in_use -= bytes;
  d->frees++;
  free(base);
}

static WkStatus fake_event_record(void *ctx, void *stream, void **event) {
  FakeDevice *d = ctx;
  if (d->recorded + 1 >= FAKE_EVENTS) return WK_FAIL(WK_ERR_DEVICE, "fake device out of events");
  *event = (void *)(intptr_t)++d->recorded;
  d->live_events++;
  return WK_OK;
}

static bool fake_event_done(void *ctx, void *event) { return ((FakeDevice *)ctx)->done[event_id(event)]; }

static WkStatus fake_event_synchronize(void *ctx, void *event) {
  FakeDevice *d = ctx;
  d->done[event_id(event)] = true;
  d->synchronized++;
  return WK_OK;
}

static void fake_event_free(void *ctx, void *event) { ((FakeDevice *)ctx)->live_events--; }

static WkBlockCache cache;
static FakeDevice device;
static void *const STREAM_A = (void *)0xa, *const STREAM_B = (void *)0xb, *const STREAM_C = (void *)0xc;

static void open_cache(size_t capacity) {
  memset(&device, 0, sizeof device);
  device.capacity = capacity;
  WkBlockDevice ops = {&device, fake_malloc, fake_free, fake_event_record, fake_event_done, fake_event_synchronize,
                       fake_event_free};
  wk_block_cache_init(&cache, &ops);
}

static size_t last_reserved;

static void *take(size_t bytes, void *stream) {
  void *ptr = NULL;
  return wk_block_cache_alloc(&cache, bytes, stream, &ptr, &last_reserved) == WK_OK ? ptr : NULL;
}

static void test_same_stream_reuses_at_once(void) {
  open_cache(1u << 20);
  void *a = take(1000, STREAM_A);
  wk_block_cache_release(&cache, a);
  CHECK(take(1000, STREAM_A) == a);  /* queued work on A runs before anything A does next */
  WkAllocatorStats stats;
  wk_block_cache_stats(&cache, &stats);
  CHECK(stats.device_allocs == 1 && stats.cache_hits == 1 && stats.bytes_in_use == 1024 && stats.bytes_cached == 0);
  wk_block_cache_destroy(&cache);
  CHECK(device.in_use == 0 && device.live_events == 0);
}

static void test_a_block_waits_for_every_stream_that_used_it(void) {
  open_cache(1u << 20);
  void *a = take(1000, STREAM_A);
  CHECK(wk_block_cache_record_stream(&cache, a, STREAM_B) == WK_OK);  /* a copy on B reads it */
  wk_block_cache_release(&cache, a);
  /* event 1 is on A, event 2 on B: C may take it only once both are done */
  void *c1 = take(1000, STREAM_C);
  CHECK(c1 != NULL && c1 != a);
  wk_block_cache_release(&cache, c1);
  device.done[1] = true;
  void *c2 = take(1000, STREAM_C);
  CHECK(c2 == c1);  /* C's own block is reusable at once; a's is still read on B */
  void *c3 = take(1000, STREAM_C);
  CHECK(c3 != a);
  wk_block_cache_release(&cache, c3);
  wk_block_cache_release(&cache, c2);
  device.done[2] = true;
  bool got_a = false;
  for (int i = 0; i < 3; i++) got_a = got_a || take(1000, STREAM_C) == a;
  CHECK(got_a);
  wk_block_cache_destroy(&cache);
  CHECK(device.in_use == 0 && device.live_events == 0);
}

static void test_b_reuses_its_own_stream_block_while_a_is_pending(void) {
  open_cache(1u << 20);
  void *a = take(1000, STREAM_A);
  CHECK(wk_block_cache_record_stream(&cache, a, STREAM_B) == WK_OK);
  wk_block_cache_release(&cache, a);
  device.done[1] = true;             /* A is done, B still reads */
  CHECK(take(1000, STREAM_B) == a);  /* B's pending read runs before B's next work */
  wk_block_cache_destroy(&cache);
}

static void test_a_full_device_gets_the_finished_blocks_back(void) {
  open_cache(4096);
  void *a = take(3000, STREAM_A);
  void *b = take(500, STREAM_A);
  CHECK(a && b);
  wk_block_cache_release(&cache, a);
  device.done[1] = true;
  /* 1024 B does not fit beside the cached 3072 B and is too small to take it: the cache frees it */
  void *c = take(1000, STREAM_B);
  CHECK(c != NULL && device.frees == 1);
  wk_block_cache_destroy(&cache);
  CHECK(device.in_use == 0);
}

static void test_a_pending_block_is_not_freed_under_a_stream(void) {
  open_cache(4000);
  void *a = take(3000, STREAM_A);
  wk_block_cache_release(&cache, a);  /* event 1 on A, not done */
  CHECK(take(1000, STREAM_B) == NULL);  /* the device is full and A may still use the block */
  CHECK(device.frees == 0);
  CHECK(wk_block_cache_empty(&cache) == WK_OK);  /* waits for A, then frees */
  CHECK(device.synchronized == 1 && device.frees == 1 && device.in_use == 0);
  WkAllocatorStats stats;
  wk_block_cache_stats(&cache, &stats);
  CHECK(stats.bytes_cached == 0 && stats.bytes_in_use == 0);
  wk_block_cache_destroy(&cache);
}

static void test_record_stream_names_what_it_cannot_do(void) {
  open_cache(1u << 20);
  int not_a_block;
  CHECK(wk_block_cache_record_stream(&cache, &not_a_block, STREAM_B) == WK_ERR_INTERNAL);
  void *a = take(100, STREAM_A);
  for (intptr_t s = 1; s < WK_BLOCK_STREAMS; s++) CHECK(wk_block_cache_record_stream(&cache, a, (void *)(0x100 + s)) == WK_OK);
  CHECK(wk_block_cache_record_stream(&cache, a, STREAM_A) == WK_OK);  /* already known: no slot used */
  CHECK(wk_block_cache_record_stream(&cache, a, STREAM_C) == WK_ERR_INVALID_ARG);
  wk_block_cache_destroy(&cache);
  CHECK(device.in_use == 0);
}

static void test_sizes_round_and_reuse_at_most_twice(void) {
  open_cache(64u << 20);
  CHECK(take(1000, STREAM_A) && last_reserved == 1024);
  void *a = take(3u << 20, STREAM_A);  /* 3 MiB: a multiple of 2 MiB, 4 MiB */
  CHECK(last_reserved == (4u << 20));
  wk_block_cache_release(&cache, a);
  CHECK(take(1000000, STREAM_A) != a);  /* 4 MiB is more than twice 1000448 B */
  CHECK(take(2u << 20 | 1, STREAM_A) == a);
  wk_block_cache_destroy(&cache);
}

/* The peak is the most held at once, kept when blocks go back to the cache, lowered only by a reset. */
static void test_the_peak_is_the_most_held_at_once(void) {
  open_cache(1u << 20);
  void *a = take(1000, STREAM_A), *b = take(3000, STREAM_A);
  wk_block_cache_release(&cache, a);
  void *c = take(500, STREAM_A);
  WkAllocatorStats stats;
  wk_block_cache_stats(&cache, &stats);
  CHECK(stats.bytes_in_use == last_reserved + 3072 && stats.bytes_peak == 1024 + 3072);
  wk_block_cache_release(&cache, b);
  wk_block_cache_reset_peak(&cache);
  wk_block_cache_stats(&cache, &stats);
  CHECK(stats.bytes_peak == stats.bytes_in_use && stats.bytes_in_use == last_reserved);
  wk_block_cache_release(&cache, c);
  wk_block_cache_destroy(&cache);
}

int main(void) {
  RUN_TEST(test_same_stream_reuses_at_once);
  RUN_TEST(test_a_block_waits_for_every_stream_that_used_it);
  RUN_TEST(test_b_reuses_its_own_stream_block_while_a_is_pending);
  RUN_TEST(test_a_full_device_gets_the_finished_blocks_back);
  RUN_TEST(test_a_pending_block_is_not_freed_under_a_stream);
  RUN_TEST(test_record_stream_names_what_it_cannot_do);
  RUN_TEST(test_sizes_round_and_reuse_at_most_twice);
  RUN_TEST(test_the_peak_is_the_most_held_at_once);
  return check_failures ? 1 : 0;
}
