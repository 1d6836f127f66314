/*
 * cuda_backend.c — loads the CUDA backend module (build/libwick_cuda.so) on first use.
 *
 * wk_cuda_device_count() is the gate: without an NVIDIA device node (/dev/nvidiactl) or with
 * WICK_CUDA=0 it answers 0 without loading anything, so CPU runs never map cuBLAS. Otherwise the
 * module is opened from next to libwick.so (or WICK_CUDA_LIB) and every function of
 * cuda_backend.h is resolved once. A missing module or driver is a device count of 0 with the
 * reason logged at info level; a call to a CUDA function without the backend is WK_ERR_UNSUPPORTED.
 */
#ifdef WK_HAVE_CUDA
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_backend.h"
#include "ops.h"

static const char MODULE_NAME[] = "libwick_cuda.so";
static const char DEVICE_NODE[] = "/dev/nvidiactl";

/* One pointer per module function, named like the function with an _impl suffix. */
#define DECLARE_POINTER(name, params, args) static WkStatus(*name##_impl) params;
#define DECLARE_VOID_POINTER(name, params, args) static void(*name##_impl) params;
WK_CUDA_BACKEND_STATUS_FUNCTIONS(DECLARE_POINTER)
WK_CUDA_BACKEND_VOID_FUNCTIONS(DECLARE_VOID_POINTER)
static int (*device_count_impl)(void);

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static bool loaded;

static bool resolve(void *module, const char *name, void **out) {
  *out = dlsym(module, name);
  if (!*out) wk_logf(WK_LOG_WARN, "CUDA backend module lacks %s: using the CPU backend", name);
  return *out != NULL;
}

static void load_module(void) {
  const char *env = getenv("WICK_CUDA");
  if (env && strcmp(env, "0") == 0) return;
  if (access(DEVICE_NODE, F_OK) != 0) return; /* no NVIDIA driver: nothing to load */
  char path[PATH_MAX];
  wk_module_path(MODULE_NAME, "WICK_CUDA_LIB", path, sizeof path);
  void *module = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!module) {
    wk_logf(WK_LOG_INFO, "CUDA backend not loaded (%s): using the CPU backend", dlerror());
    return;
  }
  bool ok = resolve(module, "wk_cuda_device_count", (void **)&device_count_impl);
#define RESOLVE(name, params, args) ok = ok && resolve(module, #name, (void **)&name##_impl);
  WK_CUDA_BACKEND_STATUS_FUNCTIONS(RESOLVE)
  WK_CUDA_BACKEND_VOID_FUNCTIONS(RESOLVE)
#undef RESOLVE
  if (!ok) {
    dlclose(module);
    return;
  }
  loaded = true; /* the module stays loaded for the life of the process */
}

static bool backend(void) {
  pthread_once(&load_once, load_module);
  return loaded;
}

static WkStatus no_backend(const char *name) {
  return WK_FAIL(WK_ERR_UNSUPPORTED, "%s: the CUDA backend is not available (no NVIDIA device, WICK_CUDA=0, "
                 "or %s could not be loaded; WICK_LOG=info says why)", name, MODULE_NAME);
}

int wk_cuda_device_count(void) { return backend() ? device_count_impl() : 0; }

#define DEFINE_STUB(name, params, args) \
  WkStatus name params { return backend() ? name##_impl args : no_backend(#name); }
#define DEFINE_VOID_STUB(name, params, args) \
  void name params {                        \
    if (backend()) name##_impl args;        \
  }
WK_CUDA_BACKEND_STATUS_FUNCTIONS(DEFINE_STUB)
WK_CUDA_BACKEND_VOID_FUNCTIONS(DEFINE_VOID_STUB)

#endif /* WK_HAVE_CUDA */
