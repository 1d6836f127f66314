/*
 * blas_kernels.c — whether OpenBLAS runs the kernels this CPU can.
 *
 * A DYNAMIC_ARCH OpenBLAS (Debian's) chooses its kernels from the CPU's model number when it loads,
 * and a model it does not know gets the generic SSE3 ones ("Prescott"); cloud VMs often report such
 * a model. Its choice can only be changed before it loads (OPENBLAS_CORETYPE), so this says what to
 * set and `run` (runtime/host/run.c) starts itself again with it.
 */
#include <cblas.h>  /* OpenBLAS: openblas_get_corename */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "../../wick.h"

/* OpenBLAS's x86-64 kernels older than AVX2 and FMA: a pick among these on a CPU with AVX2 is a
 * fallback. Any other name is a pick of OpenBLAS's own that is left alone. */
static const char *const PRE_AVX2_KERNELS[] = {
  "Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Sandybridge", "Barcelona", "Bobcat",
  "Bulldozer", "Piledriver", "Steamroller", "Excavator", "Opteron", "Opteron(SSE3)", "Katmai", "Coppermine",
  "Northwood", "Banias",
};

const char *wk_blas_kernels(void) { return openblas_get_corename(); }

static bool is_pre_avx2(const char *name) {
  for (size_t i = 0; i < sizeof PRE_AVX2_KERNELS / sizeof PRE_AVX2_KERNELS[0]; i++)
    if (strcmp(name, PRE_AVX2_KERNELS[i]) == 0) return true;
  return false;
}

const char *wk_blas_better_kernels(void) {
#if defined(__x86_64__)
  const char *picked = openblas_get_corename();
  if (getenv("OPENBLAS_CORETYPE") || !picked || !is_pre_avx2(picked)) return NULL;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return NULL;
}
