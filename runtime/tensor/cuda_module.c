/*
 * cuda_module.c — loads the CUDA module (build/libwick_cuda.so) on first use and fills its table.
 *
 * wk_cuda_device_count() is the gate: without an NVIDIA device node (/dev/nvidiactl) or with
 * WICK_CUDA=0 nothing is loaded, so CPU runs never map cudart or cuBLAS. Otherwise the module is
 * opened from next to libwick.so (or WICK_CUDA_LIB) and every entry of cuda_module.h is resolved
 * once; a module that lacks one is not used at all. The kernels' table (runtime/ops/cuda_ops.c)
 * resolves its entries from the same module through wk_cuda_resolve. A missing module or driver is a
 * device count of 0 with the reason logged at info level. In a build without nvcc the same table holds
 * only the stand-ins, so callers need no #ifdef.
 */
#include <dlfcn.h>
#include <stdatomic.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_module.h"

#ifdef WK_HAVE_CUDA
static const char MODULE_NAME[] = "libwick_cuda.so";
#endif

/* Callers add what they were doing ("cuda:0 tensor: ..."). */
WkStatus wk_cuda_unavailable(void) {
#ifdef WK_HAVE_CUDA
  return WK_FAIL(WK_ERR_UNSUPPORTED, "the CUDA backend is not available (no NVIDIA device, WICK_CUDA=0, or %s "
                 "could not be loaded; WICK_LOG=info says why)", MODULE_NAME);
#else
  return WK_FAIL(WK_ERR_UNSUPPORTED, "this libwick was built without CUDA (rebuild with nvcc on PATH)");
#endif
}

WK_CUDA_MODULE_FUNCTIONS(WK_CUDA_STAND_IN)

static WkCudaModule table = {WK_CUDA_MODULE_FUNCTIONS(WK_CUDA_STAND_IN_ENTRY)};

static pthread_once_t load_once = PTHREAD_ONCE_INIT;

#ifdef WK_HAVE_CUDA
static void *loaded;  /* the loaded module (its tensor half resolved), or NULL */
static const char DEVICE_NODE[] = "/dev/nvidiactl";
enum { SYMBOL_CAPACITY = 64 };

static bool symbol_of(void *opened, const char *name, void **out) {
  char symbol[SYMBOL_CAPACITY];
  snprintf(symbol, sizeof symbol, "cuda_%s", name);
  *out = dlsym(opened, symbol);
  if (!*out) wk_logf(WK_LOG_WARN, "CUDA module lacks %s: using the CPU backend (rebuild: make)", symbol);
  return *out != NULL;
}

static void load_module(void) {
  const char *env = getenv("WICK_CUDA");
  if (env && strcmp(env, "0") == 0) return;
  if (access(DEVICE_NODE, F_OK) != 0) return; /* no NVIDIA driver: nothing to load */
  char path[PATH_MAX];
  wk_module_path(MODULE_NAME, "WICK_CUDA_LIB", path, sizeof path);
  void *opened = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!opened) {
    wk_logf(WK_LOG_INFO, "CUDA backend not loaded (%s): using the CPU backend", dlerror());
    return;
  }
  WkCudaModule found;
  bool ok = true;
#define RESOLVE_TENSOR_ENTRY(ret, name, params) ok = ok && symbol_of(opened, #name, (void **)&found.name);
  WK_CUDA_MODULE_FUNCTIONS(RESOLVE_TENSOR_ENTRY)
#undef RESOLVE_TENSOR_ENTRY
  if (!ok) {
    dlclose(opened);
    return;
  }
  table = found; /* the module stays loaded for the life of the process */
  loaded = opened;
}

bool wk_cuda_resolve(const char *name, void **out) {
  pthread_once(&load_once, load_module);
  *out = NULL;
  return loaded && symbol_of(loaded, name, out);
}
#else
static void load_module(void) {}

bool wk_cuda_resolve(const char *name, void **out) {
  *out = NULL;
  return false;
}
#endif

static const WkCudaModule *_Atomic in_use;  /* wk_cuda_use's table, NULL: the loaded one */

const WkCudaModule *wk_cuda(void) {
  const WkCudaModule *fake = in_use;
  if (fake) return fake;
  pthread_once(&load_once, load_module);
  return &table;
}

void wk_cuda_use(const WkCudaModule *module) { in_use = module; }

int wk_cuda_device_count(void) { return wk_cuda()->device_count(); }

static _Atomic int default_device;             /* a rank's GPU: wk_cuda_set_default_device */
static _Thread_local int entered_device = -1;  /* -1: this thread has entered none yet */

WkStatus wk_cuda_set_default_device(int device_index) {
  if (device_index < 0 || device_index >= WK_MAX_DEVICES)
    return WK_FAIL(WK_ERR_INVALID_ARG, "cuda:%d: device index out of range 0..%d", device_index, WK_MAX_DEVICES - 1);
  default_device = device_index;
  return WK_OK;
}

WkStatus wk_cuda_enter(int device_index) {
  if (device_index < 0 || device_index >= WK_MAX_DEVICES)
    return WK_FAIL(WK_ERR_INVALID_ARG, "cuda:%d: device index out of range 0..%d", device_index, WK_MAX_DEVICES - 1);
  WK_TRY(wk_cuda()->set_device(device_index));
  entered_device = device_index;
  return WK_OK;
}

int wk_cuda_default_device(void) { return default_device; }

int wk_cuda_current_device(void) { return entered_device >= 0 ? entered_device : default_device; }
