/*
 * memory.c — allocation that reports what failed, and a monotonic clock.
 */
#include <stdlib.h>
#include <time.h>

#include "core.h"

void *wk_malloc(size_t size, const char *what) {
  void *p = malloc(size ? size : 1);
  if (!p) WK_FAIL(WK_ERR_NOMEM, "out of memory allocating %zu bytes for %s", size, what);
  return p;
}

void *wk_calloc(size_t count, size_t size, const char *what) {
  void *p = calloc(count ? count : 1, size ? size : 1);
  if (!p) WK_FAIL(WK_ERR_NOMEM, "out of memory allocating %zu x %zu bytes for %s", count, size, what);
  return p;
}

void *wk_aligned_alloc(size_t alignment, size_t size, const char *what) {
  void *p = NULL;
  int rc = posix_memalign(&p, alignment, size ? size : alignment);
  if (rc != 0) {
    WK_FAIL(WK_ERR_NOMEM, "out of memory allocating %zu bytes (aligned to %zu) for %s", size, alignment, what);
    return NULL;
  }
  return p;
}

uint64_t wk_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
