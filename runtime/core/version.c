/*
 * version.c — version, build description, and the struct layout table that lets the Lua bindings
 * verify their ffi.cdef against the compiler's view of runtime/wick.h (the table's rows are generated
 * from the same region of wick.h as the cdef).
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

/* ---- ABI layout table ------------------------------------------------------------------------ */

typedef struct {
  const char *struct_name;
  const char *field;  /* NULL for the struct's size */
  size_t value;
} LayoutEntry;

#define SIZE_OF(type) {#type, NULL, sizeof(type)}
#define OFFSET_OF(type, field) {#type, #field, offsetof(type, field)}

/* Every struct of wick.h's WK_CDEF region (what Lua's cdef holds) with each of its fields: rows the build
 * writes from that region (runtime/core/abi_layout.awk), so a struct or field added there is checked too. */
static const LayoutEntry layout_table[] = {
#include "abi_layout.h"
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
