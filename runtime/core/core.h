/*
 * runtime/core — what every other subsystem stands on.
 *
 * Owns: the error model (thread-local status + message, the WK_FAIL/WK_TRY macros that record the
 * call site), logging (WICK_LOG), checked allocation, the bounded blocking queue that connects
 * pipeline stages running on C threads, where optional modules live (module.c), a small JSON reader
 * (json.h), opening files that must be regular ones (files.c), the one content hash (hash.c), the
 * parameter tables of the subsystems above (param.c), memory shared by a node's processes
 * (shared.h), and starting worker threads that leave the process's signals to the host (thread.c). It knows nothing about data, tensors or devices.
 *
 * Internal header: runtime/ code includes it; Lua never sees it (Lua sees runtime/wick.h only).
 */
#ifndef WK_CORE_H
#define WK_CORE_H

#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../wick.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Internal functions the CUDA backend module (build/libwick_cuda.so) calls back into: exported
 * from libwick.so, but not part of the public API of wick.h. */
#define WK_INTERNAL_EXPORT __attribute__((visibility("default")))

/* ---- errors ---------------------------------------------------------------------------------- */

/* Records status and a printf-style message for this thread; returns status so callers can write
 * `return wk_fail(...)`. The message is data, never a format string of someone else's text. */
WK_INTERNAL_EXPORT WkStatus wk_fail_at(const char *file, int line, WkStatus status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Prefixes the current message with context ("shard 'x.wk': " + old message), keeping the status. */
WK_INTERNAL_EXPORT WkStatus wk_error_context(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define WK_FAIL(status, ...) wk_fail_at(__FILE__, __LINE__, (status), __VA_ARGS__)

/* Forwards a failure: evaluates expr once and returns its status if it is not WK_OK. */
#define WK_TRY(expr)                            \
  do {                                          \
    WkStatus wk_try_status_ = (expr);           \
    if (wk_try_status_ != WK_OK) return wk_try_status_; \
  } while (0)

/* Names errno for an I/O failure on path: "open 'x': No such file or directory". */
WkStatus wk_fail_errno_at(const char *file, int line, const char *what, const char *path);
#define WK_FAIL_ERRNO(what, path) wk_fail_errno_at(__FILE__, __LINE__, (what), (path))

/* ---- logging --------------------------------------------------------------------------------- */

WK_INTERNAL_EXPORT void wk_logf(WkLogLevel level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define WK_LOG_ENABLED(level) ((level) <= wk_log_level())

/* ---- memory ---------------------------------------------------------------------------------- */

/* malloc/calloc that record WK_ERR_NOMEM with what was being allocated; NULL on failure. */
void *wk_malloc(size_t size, const char *what);
void *wk_calloc(size_t count, size_t size, const char *what);
/* Aligned allocation (alignment a power of two >= sizeof(void*)); free with free(). */
void *wk_aligned_alloc(size_t alignment, size_t size, const char *what);

/* ---- optional modules (module.c) ------------------------------------------------------------- */

/* The path of module `name` next to libwick (or $override_env when that is set and not empty). */
void wk_module_path(const char *name, const char *override_env, char *path, size_t size);

/* ---- hashing (hash.c) ------------------------------------------------------------------------ */

/* XXH3-64 with seed 0: the checksum of every shard field and block, and the disk cache's key slots. */
uint64_t wk_hash64(const void *data, size_t length);

/* ---- parameters (param.c) ------------------------------------------------------------------- */

/* One integer parameter of a subsystem: the range its setter accepts and its default (0 where the
 * subsystem derives it later, as the loader's micro_batch). */
typedef struct {
  int64_t min, max, fallback;
  const char *name;  /* as the refusal and the Lua option spell it */
} WkParamSpec;

/* A subsystem's parameters, indexed by its public enum (WkLoaderParam, WkConvertParam, ...). */
typedef struct {
  const char *owner;  /* "loader", "converter", ...: the first word of every refusal */
  const WkParamSpec *specs;
  int count;
} WkParamTable;

/* The bounds of `param`; an index outside the table is "unknown <owner> parameter N". */
WkStatus wk_param_bounds(const WkParamTable *table, int param, int64_t *min, int64_t *max);
/* WK_OK when min <= value <= max, else "<owner> <name>=<value> is outside [min, max]". min and max are
 * the caller's, so a bound known only at run time (zstd's levels, a vocabulary) reads the same. */
WkStatus wk_param_check(const WkParamTable *table, int param, int64_t value, int64_t min, int64_t max);
/* The default of `param` (0 where the subsystem derives it); fills values[0 .. table->count) with all. */
WkStatus wk_param_default(const WkParamTable *table, int param, int64_t *value);
void wk_param_defaults(const WkParamTable *table, int64_t *values);

/* ---- bounded blocking queue ------------------------------------------------------------------ */

/* A fixed-capacity FIFO of pointers shared by producer and consumer threads. Capacity is the
 * backpressure: a full queue blocks producers, so memory never grows with the input. Closing wakes
 * every waiter; after close, pops drain what is left and then report WK_ERR_CLOSED. */
typedef struct WkQueue WkQueue;

WkQueue *wk_queue_new(size_t capacity);
void wk_queue_free(WkQueue *q);
void wk_queue_close(WkQueue *q);
/* timeout_ms < 0 waits forever; returns WK_ERR_TIMEOUT or WK_ERR_CLOSED without blocking further. */
WkStatus wk_queue_push(WkQueue *q, void *item, int64_t timeout_ms);
WkStatus wk_queue_pop(WkQueue *q, void **item, int64_t timeout_ms);
size_t wk_queue_length(WkQueue *q);

/* ---- threads --------------------------------------------------------------------------------- */

/* pthread_create(thread, NULL, start, arg), the new thread blocking the signals a process is sent
 * (SIGUSR1, SIGINT, SIGTERM, SIGHUP, SIGQUIT): the kernel then hands such a signal to a thread that
 * takes it, the host's, so its handler has run when `kill` returns; were it a worker's, the flag
 * the trainer polls (kill -USR1: pause) could be set a moment after the poll. */
int wk_thread_create(pthread_t *thread, void *(*start)(void *), void *arg);
/* The same for threads another library starts (Gloo's loop, NCCL's proxy and the CUDA runtime's, in
 * the NCCL module): block those signals in the calling thread around the call that starts them,
 * then restore its mask. */
WK_INTERNAL_EXPORT void wk_signals_block(sigset_t *previous);
WK_INTERNAL_EXPORT void wk_signals_restore(const sigset_t *previous);

/* ---- files ----------------------------------------------------------------------------------- */

/* What a st_mode names, for messages: "a directory", "a FIFO (named pipe)", ... */
const char *wk_file_kind(unsigned mode);
/* Opens `path` for reading if it is a regular file (`what` it holds, plural, for the refusal: "datasets
 * and converter inputs"); anything else is refused before a byte is read, never waited on. */
WkStatus wk_open_regular(const char *path, const char *what, int *fd, uint64_t *size);

#ifdef __cplusplus
}
#endif
#endif /* WK_CORE_H */
