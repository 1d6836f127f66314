/*
 * nccl_module.h — the entry points of the NCCL module (build/libwick_nccl.so), listed once.
 *
 * The list is expanded three ways: the module's prototypes, which its definitions in nccl/nccl.c
 * must match (a signature that drifts is a compile error, not a crash) and which export them; the
 * loader's table of pointers and its filling by dlsym (nccl_loader.c); and the ffi.cdef of
 * tests/fixtures/dist/nccl_smoke.lua, which drives the module without libwick's loader: the
 * Makefile preprocesses the region between the WK_NCCL_CDEF markers below, with the prototypes
 * expanded, into build/lua/wick/nccl_cdef.lua. Each entry: X(return type, name, (parameters)),
 * exported as wk_nccl_NAME; the types are those of wick.h's cdef and <stdint.h>.
 */
#ifndef WK_NCCL_MODULE_H
#define WK_NCCL_MODULE_H

#include "../wick.h"

/* WK_NCCL_CDEF_BEGIN */
#define WK_NCCL_MODULE_FUNCTIONS(X)                                                                        \
  /* the communicator's unique id, made by rank 0 and passed to the others through the store */           \
  X(WkStatus, unique_id, (uint8_t *out, size_t capacity, size_t *length))                                 \
  X(WkStatus, init, (const uint8_t *id, size_t length, int rank, int size, int device_index,               \
                     int64_t timeout_ms, void **comm))                                                     \
  /* one collective (kind: CollectiveKind, dtype: WkDType, op: WkReduceOp), waited for */                  \
  X(WkStatus, run, (void *comm, int kind, void *out, const void *in, size_t count, int dtype, int op,       \
                    int root, void *stream, int64_t timeout_ms))                                           \
  X(void, free, (void *comm))
#define WK_NCCL_MODULE_PROTOTYPE(ret, name, params) ret wk_nccl_##name params;
/* WK_NCCL_CDEF_END */

#endif /* WK_NCCL_MODULE_H */
