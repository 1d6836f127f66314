/*
 * wick.h — the one public header of libwick.
 *
 * Everything between WK_CDEF_BEGIN and WK_CDEF_END is fed, after the C preprocessor, to LuaJIT's
 * ffi.cdef by a build step (build/lua/wick/cdef.lua), so that region stays FFI-clean: opaque
 * handles, plain structs with explicit sizes, enums instead of #defines, no inline code.
 *
 * Conventions (see shared STYLE.md):
 *   - every fallible function returns WkStatus (0 = WK_OK) or a handle that is NULL on failure;
 *     the reason is then in wk_last_error() (thread-local, valid until the next failing call);
 *   - argument order is (handle, inputs, outputs, options); out-pointers come last;
 *   - the library never exits, aborts or longjmps on bad input.
 */
#ifndef WICK_H
#define WICK_H

#include <stddef.h>   /* size_t */
#include <stdint.h>   /* int64_t, uint32_t ... */

#ifdef __cplusplus
extern "C" {
#endif

#ifndef WK_API
#define WK_API __attribute__((visibility("default")))
#endif

/* Bumped on any change of the declarations below; Lua refuses a library whose major differs. */
#define WK_VERSION_MAJOR 0
#define WK_VERSION_MINOR 1
#define WK_VERSION_PATCH 0

/* WK_CDEF_BEGIN */

/* ---- status codes and errors ------------------------------------------------------------- */
typedef enum {
  WK_OK = 0,
  WK_ERR_INVALID_ARG = 1,  /* the caller passed something out of range or inconsistent */
  WK_ERR_IO = 2,           /* open/read/write/mmap failed; the message names the path */
  WK_ERR_NOMEM = 3,        /* an allocation failed or a configured budget is exceeded */
  WK_ERR_FORMAT = 4,       /* bad magic, version, checksum or truncation in an input file */
  WK_ERR_TIMEOUT = 5,      /* a wait ran past its deadline (peer, server, queue) */
  WK_ERR_CLOSED = 6,       /* the object was closed or the stream has ended */
  WK_ERR_UNSUPPORTED = 7,  /* a feature not compiled in or not available on this machine */
  WK_ERR_DEVICE = 8,       /* CUDA, cuBLAS or NCCL reported an error */
  WK_ERR_NETWORK = 9,      /* a remote transfer failed after its retries */
  WK_ERR_INTERNAL = 10     /* a broken invariant inside Wick: please report it */
} WkStatus;

WK_API const char *wk_last_error(void);       /* message of the last failure on this thread, "" if none */
WK_API WkStatus wk_last_status(void);         /* status of the last failure on this thread */
WK_API const char *wk_last_error_site(void);  /* "runtime/x/y.c:123" where it was raised */
WK_API void wk_clear_error(void);
WK_API const char *wk_status_name(WkStatus status);  /* "WK_ERR_IO", ... */

/* ---- logging ------------------------------------------------------------------------------ */
typedef enum { WK_LOG_ERROR = 0, WK_LOG_WARN = 1, WK_LOG_INFO = 2, WK_LOG_DEBUG = 3 } WkLogLevel;

WK_API WkLogLevel wk_log_level(void);             /* from WICK_LOG at first use, default warn */
WK_API WkStatus wk_set_log_level(WkLogLevel level);
WK_API WkStatus wk_parse_log_level(const char *name, WkLogLevel *out);
WK_API void wk_log_message(WkLogLevel level, const char *message);  /* no formatting: safe for Lua */

/* ---- version and build ---------------------------------------------------------------------- */
typedef struct {
  uint32_t major, minor, patch;
  uint32_t has_cuda;        /* 1 when the CUDA backend was compiled in */
  const char *compiler;     /* e.g. "gcc 12.2.0" */
  const char *build_flags;  /* e.g. "release" or "asan+ubsan" */
} WkBuildInfo;

WK_API uint32_t wk_version(void);  /* major * 10000 + minor * 100 + patch */
WK_API void wk_build_info(WkBuildInfo *out);
WK_API int wk_cuda_device_count(void);  /* 0 without the CUDA backend, a driver, or a GPU */

/* Layout of every struct declared here, as C sees it, so Lua can prove its ffi.cdef agrees.
 * field == NULL asks for sizeof(struct); returns -1 for an unknown struct or field. */
WK_API int64_t wk_abi_layout(const char *struct_name, const char *field);

/* ---- data: datasets, converter, loader (runtime/data) ---------------------------------------- */

/* ---- tensors and ops (runtime/tensor, runtime/ops) --------------------------------------------- */

/* WK_CDEF_END */

#ifdef __cplusplus
}
#endif
#endif /* WICK_H */
