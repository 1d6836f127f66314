/*
 * version.c — version, build description, and the struct layout table that lets the Lua bindings
 * verify their ffi.cdef against the compiler's view of runtime/wick.h.
 */
#include <stddef.h>
#include <string.h>

#include "core.h"

#ifndef WK_BUILD_FLAGS
#define WK_BUILD_FLAGS "release"
#endif

#ifdef __clang__
#define WK_COMPILER "clang " __clang_version__
#elif defined(__GNUC__)
#define WK_COMPILER "gcc " __VERSION__
#else
#define WK_COMPILER "unknown"
#endif

uint32_t wk_version(void) {
  return WK_VERSION_MAJOR * 10000u + WK_VERSION_MINOR * 100u + WK_VERSION_PATCH;
}

void wk_build_info(WkBuildInfo *out) {
  out->major = WK_VERSION_MAJOR;
  out->minor = WK_VERSION_MINOR;
  out->patch = WK_VERSION_PATCH;
#ifdef WK_HAVE_CUDA
  out->has_cuda = 1;
#else
  out->has_cuda = 0;
#endif
  out->compiler = WK_COMPILER;
  out->build_flags = WK_BUILD_FLAGS;
}

#ifndef WK_HAVE_CUDA
int wk_cuda_device_count(void) { return 0; }
#endif

/* ---- ABI layout table ------------------------------------------------------------------------ */

typedef struct {
  const char *struct_name;
  const char *field;  /* NULL for the struct's size */
  size_t value;
} LayoutEntry;

#define SIZE_OF(type) {#type, NULL, sizeof(type)}
#define OFFSET_OF(type, field) {#type, #field, offsetof(type, field)}

/* Every struct of wick.h that crosses the FFI boundary is listed here with each of its fields. */
static const LayoutEntry layout_table[] = {
    SIZE_OF(WkBuildInfo),
    OFFSET_OF(WkBuildInfo, major),
    OFFSET_OF(WkBuildInfo, minor),
    OFFSET_OF(WkBuildInfo, patch),
    OFFSET_OF(WkBuildInfo, has_cuda),
    OFFSET_OF(WkBuildInfo, compiler),
    OFFSET_OF(WkBuildInfo, build_flags),
    /* data (runtime/data) */

    /* tensors and ops (runtime/tensor, runtime/ops) */
    SIZE_OF(WkAllocatorStats),
    OFFSET_OF(WkAllocatorStats, bytes_in_use),
    OFFSET_OF(WkAllocatorStats, bytes_cached),
    OFFSET_OF(WkAllocatorStats, device_allocs),
    OFFSET_OF(WkAllocatorStats, cache_hits),

};

int64_t wk_abi_layout(const char *struct_name, const char *field) {
  if (!struct_name) return -1;
  for (size_t i = 0; i < sizeof layout_table / sizeof layout_table[0]; i++) {
    const LayoutEntry *e = &layout_table[i];
    if (strcmp(e->struct_name, struct_name) != 0) continue;
    if ((field == NULL) != (e->field == NULL)) continue;
    if (field == NULL || strcmp(e->field, field) == 0) return (int64_t)e->value;
  }
  return -1;
}
