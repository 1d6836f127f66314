/*
 * log.c — leveled logging to stderr, configured by WICK_LOG=error|warn|info|debug.
 *
 * Lines carry the rank when RANK is set, so interleaved output of a multi-process job stays
 * attributable: "wick[1] warn: ...". One fprintf per line keeps lines whole across threads.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

enum { LOG_LEVEL_UNSET = -1, LOG_LINE_CAPACITY = 2048 };

static atomic_int current_level = LOG_LEVEL_UNSET;

static const char *const level_names[] = {"error", "warn", "info", "debug"};
enum { LEVEL_COUNT = sizeof level_names / sizeof level_names[0] };

/* Returns the level named, or LOG_LEVEL_UNSET. Raises nothing: wk_log_level() uses it before any
 * level exists, and recording an error would ask for the level again. */
static int level_from_name(const char *name) {
  for (int level = 0; level < LEVEL_COUNT; level++)
    if (name && strcmp(name, level_names[level]) == 0) return level;
  return LOG_LEVEL_UNSET;
}

WkStatus wk_parse_log_level(const char *name, WkLogLevel *out) {
  int level = level_from_name(name);
  if (level == LOG_LEVEL_UNSET)
    return WK_FAIL(WK_ERR_INVALID_ARG, "unknown log level '%s' (expected error, warn, info or debug)",
                   name ? name : "(null)");
  *out = (WkLogLevel)level;
  return WK_OK;
}

WkLogLevel wk_log_level(void) {
  int level = atomic_load(&current_level);
  if (level != LOG_LEVEL_UNSET) return (WkLogLevel)level;
  const char *env = getenv("WICK_LOG");
  level = env && *env ? level_from_name(env) : WK_LOG_WARN;
  if (level == LOG_LEVEL_UNSET) {
    fprintf(stderr, "wick warn: WICK_LOG='%s' is not one of error, warn, info, debug; using warn\n", env);
    level = WK_LOG_WARN;
  }
  atomic_store(&current_level, level);
  return (WkLogLevel)level;
}

WkStatus wk_set_log_level(WkLogLevel level) {
  if ((int)level < 0 || (int)level >= LEVEL_COUNT)
    return WK_FAIL(WK_ERR_INVALID_ARG, "log level %d out of range 0..%d", (int)level, LEVEL_COUNT - 1);
  atomic_store(&current_level, (int)level);
  return WK_OK;
}

void wk_log_message(WkLogLevel level, const char *message) {
  if ((int)level < 0 || (int)level >= LEVEL_COUNT || !WK_LOG_ENABLED(level)) return;
  const char *rank = getenv("RANK");
  if (rank && *rank)
    fprintf(stderr, "wick[%s] %s: %s\n", rank, level_names[level], message);
  else
    fprintf(stderr, "wick %s: %s\n", level_names[level], message);
}

void wk_logf(WkLogLevel level, const char *fmt, ...) {
  if (!WK_LOG_ENABLED(level)) return;
  char line[LOG_LINE_CAPACITY];
  va_list args;
  va_start(args, fmt);
  vsnprintf(line, sizeof line, fmt, args);
  va_end(args);
  wk_log_message(level, line);
}
