/*
 * nccl_loader.c — NCCL for CUDA tensors, from the module build/libwick_nccl.so.
 *
 * NCCL (with cudart) is a few hundred MB to map, so it lives in a module of its own that libwick
 * opens on the first collective over a CUDA tensor, never in a CPU run. The module is built only
 * when the Makefile finds NCCL (`make` prints ✓ NCCL or ✗ NCCL); without it, or without a GPU,
 * a CUDA collective is WK_ERR_UNSUPPORTED with the reason. The unique id of the communicator goes
 * through the store here: rank 0 makes it, the others wait for it (bounded by the timeout).
 *
 * The module's functions (runtime/dist/nccl/nccl.c) are resolved once, into a table filled from
 * the list in nccl_module.h.
 */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist.h"
#include "nccl_module.h"

enum { UNIQUE_ID_CAPACITY = 256 };

struct NcclGroup {
  void *comm;
};

static struct {
#define NCCL_FIELD(ret, name, params) ret(*name) params;
  WK_NCCL_MODULE_FUNCTIONS(NCCL_FIELD)
#undef NCCL_FIELD
} nccl;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static bool loaded;
static char load_failure[512];

static void load_module(void) {
#ifndef WK_HAVE_NCCL
  snprintf(load_failure, sizeof load_failure, "this libwick was built without NCCL (install the CUDA toolkit "
           "with NCCL and rebuild: `make` prints ✓ NCCL when it finds nccl.h and libnccl)");
#else
  static const char MODULE_NAME[] = "libwick_nccl.so";
  if (wk_cuda_device_count() == 0) {
    snprintf(load_failure, sizeof load_failure, "no CUDA device is usable here (WICK_LOG=info says why)");
    return;
  }
  char path[PATH_MAX];
  wk_module_path(MODULE_NAME, "WICK_NCCL_LIB", path, sizeof path);
  void *module = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!module) {
    snprintf(load_failure, sizeof load_failure, "cannot load %s: %s", path, dlerror());
    return;
  }
  bool ok = true;
#define RESOLVE(ret, name, params) ok = ok && (*(void **)&nccl.name = dlsym(module, "wk_nccl_" #name)) != NULL;
  WK_NCCL_MODULE_FUNCTIONS(RESOLVE)
#undef RESOLVE
  if (!ok) {
    snprintf(load_failure, sizeof load_failure, "%s lacks a function (a module of another build?)", path);
    dlclose(module);
    return;
  }
  loaded = true; /* stays loaded for the life of the process */
#endif
}

WkStatus nccl_group_open(WkStore *store, const char *id_key, int rank, int size, int device_index, int64_t timeout_ms,
                         NcclGroup **out) {
  pthread_once(&load_once, load_module);
  if (!loaded) return WK_FAIL(WK_ERR_UNSUPPORTED, "collectives over CUDA tensors need NCCL: %s", load_failure);
  uint8_t id[UNIQUE_ID_CAPACITY];
  size_t length = 0;
  if (rank == 0) {
    WK_TRY(nccl.unique_id(id, sizeof id, &length));
    WK_TRY(wk_store_set(store, id_key, id, length));
  } else {
    WK_TRY(wk_store_get(store, id_key, timeout_ms, id, sizeof id, &length));
  }
  NcclGroup *g = wk_calloc(1, sizeof *g, "NCCL group");
  if (!g) return WK_ERR_NOMEM;
  WkStatus st = nccl.init(id, length, rank, size, device_index, timeout_ms, &g->comm);
  if (st != WK_OK) {
    free(g);
    return st;
  }
  *out = g;
  return WK_OK;
}

void nccl_group_free(NcclGroup *g) {
  if (!g) return;
  if (loaded) nccl.free(g->comm);
  free(g);
}

WkStatus nccl_group_run(NcclGroup *g, CollectiveKind kind, void *out, const void *in, size_t count, WkDType dtype,
                        WkReduceOp op, int root, void *stream, int64_t timeout_ms) {
  if (!loaded || !g) return WK_FAIL(WK_ERR_UNSUPPORTED, "NCCL is not loaded: %s", load_failure);
  return nccl.run(g->comm, (int)kind, out, in, count, (int)dtype, (int)op, root, stream, timeout_ms);
}
