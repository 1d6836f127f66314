/*
 * check.h — the few macros the C tests need: CHECK(cond) records a failure with file:line and
 * goes on; TEST_MAIN runs the listed test functions and exits non-zero if any check failed.
 */
#ifndef WK_TEST_CHECK_H
#define WK_TEST_CHECK_H

#include <stdio.h>

static int check_failures;

#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);  \
      check_failures++;                                                          \
    }                                                                            \
  } while (0)

#define RUN_TEST(fn)                          \
  do {                                        \
    int before_ = check_failures;             \
    fn();                                     \
    printf("%s %s\n", check_failures == before_ ? "ok" : "FAIL", #fn); \
  } while (0)

#endif /* WK_TEST_CHECK_H */
