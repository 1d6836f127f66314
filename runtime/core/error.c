/*
 * error.c — the thread-local error slot behind wk_last_error().
 *
 * Each thread has one slot (status, message, call site). A failing function fills it and returns
 * the status; callers either forward the status (WK_TRY) or add context (wk_error_context). Nothing
 * here allocates, so reporting an out-of-memory failure cannot itself fail.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "core.h"

enum { ERROR_MESSAGE_CAPACITY = 1024, ERROR_SITE_CAPACITY = 128 };

typedef struct {
  WkStatus status;
  char message[ERROR_MESSAGE_CAPACITY];
  char site[ERROR_SITE_CAPACITY];
} ErrorSlot;

static _Thread_local ErrorSlot error_slot;

WkStatus wk_fail_at(const char *file, int line, WkStatus status, const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vsnprintf(error_slot.message, sizeof error_slot.message, fmt, args);
  va_end(args);
  snprintf(error_slot.site, sizeof error_slot.site, "%s:%d", file, line);
  error_slot.status = status;
  if (WK_LOG_ENABLED(WK_LOG_DEBUG))
    wk_logf(WK_LOG_DEBUG, "%s (%s at %s)", error_slot.message, wk_status_name(status), error_slot.site);
  return status;
}

WkStatus wk_fail_errno_at(const char *file, int line, const char *what, const char *path) {
  int saved_errno = errno;
  WkStatus status = saved_errno == ENOMEM ? WK_ERR_NOMEM : WK_ERR_IO;
  return wk_fail_at(file, line, status, "%s '%s': %s", what, path, strerror(saved_errno));
}

WkStatus wk_error_context(const char *fmt, ...) {
  char prefix[ERROR_MESSAGE_CAPACITY];
  char previous[ERROR_MESSAGE_CAPACITY];
  va_list args;
  va_start(args, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, args);
  va_end(args);
  memcpy(previous, error_slot.message, sizeof previous);
  snprintf(error_slot.message, sizeof error_slot.message, "%s: %s", prefix, previous);
  return error_slot.status;
}

const char *wk_last_error(void) { return error_slot.message; }
WkStatus wk_last_status(void) { return error_slot.status; }
const char *wk_last_error_site(void) { return error_slot.site; }

void wk_clear_error(void) {
  error_slot.status = WK_OK;
  error_slot.message[0] = '\0';
  error_slot.site[0] = '\0';
}

const char *wk_status_name(WkStatus status) {
  switch (status) {
    case WK_OK: return "WK_OK";
    case WK_ERR_INVALID_ARG: return "WK_ERR_INVALID_ARG";
    case WK_ERR_IO: return "WK_ERR_IO";
    case WK_ERR_NOMEM: return "WK_ERR_NOMEM";
    case WK_ERR_FORMAT: return "WK_ERR_FORMAT";
    case WK_ERR_TIMEOUT: return "WK_ERR_TIMEOUT";
    case WK_ERR_CLOSED: return "WK_ERR_CLOSED";
    case WK_ERR_UNSUPPORTED: return "WK_ERR_UNSUPPORTED";
    case WK_ERR_DEVICE: return "WK_ERR_DEVICE";
    case WK_ERR_NETWORK: return "WK_ERR_NETWORK";
    case WK_ERR_INTERNAL: return "WK_ERR_INTERNAL";
  }
  return "WK_ERR_UNKNOWN";
}
