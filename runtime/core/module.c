/*
 * module.c — where optional modules of libwick live: next to the object this code is linked into
 * (build/libwick.so in a checkout, lib/ when installed, or a test binary), unless an environment
 * variable names the file. The CUDA module (runtime/tensor/cuda_module.c) and the NCCL backend
 * (runtime/dist/nccl_loader.c) are found this way, and loaded only when a run needs them.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

void wk_module_path(const char *name, const char *override_env, char *path, size_t size) {
  const char *override = override_env ? getenv(override_env) : NULL;
  if (override && *override) {
    snprintf(path, size, "%s", override);
    return;
  }
  Dl_info info;
  const char *self = dladdr((void *)wk_module_path, &info) && info.dli_fname ? info.dli_fname : "";
  const char *slash = strrchr(self, '/');
  int dir_length = slash ? (int)(slash - self) : 1;
  snprintf(path, size, "%.*s/%s", dir_length, slash ? self : ".", name);
}
