/*
 * shared.h — memory shared by the processes of one node: a region named in /dev/shm (or anonymous),
 * a robust process-shared lock, and futex waits on the lock's generation counter (shared.c).
 *
 * Internal header: the node-wide caches of runtime/io and runtime/loader use it, and the launcher (runtime/host) removes
 * its job's regions through it.
 */
#ifndef WK_CORE_SHARED_H
#define WK_CORE_SHARED_H

#include <pthread.h>
#include <stdatomic.h>

#include "core.h"

enum { WK_SHARED_NAME_CAPACITY = 128 };

typedef struct {
  void *base;      /* its first 4 bytes are the `ready` word the creator publishes last */
  size_t bytes;
  bool created;    /* this process made it (and ran init) */
  int fd;          /* the named region's file (for reservations), -1 when anonymous */
  char name[WK_SHARED_NAME_CAPACITY];  /* "/wick-..." or "" when anonymous */
} WkSharedRegion;

/* Initializes a fresh region (all zero) before other processes may see it. */
typedef WkStatus (*WkSharedInit)(void *ctx, void *base);

/* name NULL: an anonymous region for this process alone. Otherwise ("/wick-...", from wk_shared_job_name)
 * creates /dev/shm<name> of exactly `bytes` with its first `reserved` bytes backed, or maps the one
 * another process of this user created (waiting for it to be ready); one made by another user, or not
 * with mode 0600, is refused. The process's first call removes this user's regions nobody holds. */
WkStatus wk_shared_open(const char *name, size_t bytes, size_t reserved, WkSharedInit init, void *ctx,
                        WkSharedRegion *out);
/* Backs [offset, offset + length) with pages before its first use (a clear error when /dev/shm is too
 * small, instead of a SIGBUS at the first write). Idempotent; nothing to do for anonymous regions. */
WkStatus wk_shared_reserve(WkSharedRegion *r, size_t offset, size_t length);
void wk_shared_close(WkSharedRegion *r);
/* Removes the name (mappings stay valid); processes that open it later make a new region. */
void wk_shared_unlink(WkSharedRegion *r);

/* Lives inside a shared region. */
typedef struct {
  pthread_mutex_t mutex;
  _Atomic uint32_t generation;  /* bumped by wk_shared_wake: what waiters sleep on */
  _Atomic uint32_t waiters;
} WkSharedLock;

WkStatus wk_shared_lock_init(WkSharedLock *lock);
/* Returns true when the previous holder died holding it: the caller repairs what it left. */
bool wk_shared_lock(WkSharedLock *lock);
void wk_shared_unlock(WkSharedLock *lock);
/* Waiting for a change: read the generation under the lock, unlock, wait while it is unchanged (at
 * most timeout_ms), lock again and re-check. Changers bump it with wk_shared_wake. */
uint32_t wk_shared_generation(WkSharedLock *lock);
void wk_shared_wait(WkSharedLock *lock, uint32_t seen, uint32_t timeout_ms);
void wk_shared_wake(WkSharedLock *lock);

bool wk_process_alive(int32_t pid);
/* When process pid started (clock ticks since boot, /proc/PID/stat): recorded beside a pid, it tells
 * the process from a later one the kernel gave the same pid. 0 when it cannot be read. */
uint64_t wk_process_start_time(int32_t pid);

/* The name of this job's region `what` ("/wick-UID-JOBTAG-TAG": keyed hashes of the job's secret, the
 * user and the job's id, so another user cannot predict it). *shared is false when the process has no
 * local peers (wk_node_job_id): its caches are then private. Fails on a bad job secret. */
WkStatus wk_shared_job_name(const char *what, char out[WK_SHARED_NAME_CAPACITY], bool *shared);
/* Removes this user's regions of job `job` (a WICK_JOB_ID), whoever still maps them: the launcher's
 * clean-up when the job is over. Reads the job's secret as the ranks do (wk_job_secret). */
WK_INTERNAL_EXPORT WkStatus wk_shared_remove_job(const char *job);

/* The job this process is a local rank of, when it has local peers (LOCAL_WORLD_SIZE > 1): the
 * launcher's WICK_JOB_ID, torchrun's TORCHELASTIC_RUN_ID, SLURM's job and step, or the rendezvous
 * address as the last resort. The node's shared caches are named by it. */
bool wk_node_job_id(char *out, size_t capacity);

#endif /* WK_CORE_SHARED_H */
