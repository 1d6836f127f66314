/*
 * remote_context.h — the state of a remote context (struct WkRemote) and of its blobs, shared by
 * remote.c (the context, targets), remote_blob.c (reads and prefetches through the disk cache) and
 * remote_index.c (the index). Internal to runtime/io/remote; remote.h is the subsystem's header.
 */
#ifndef WK_IO_REMOTE_CONTEXT_H
#define WK_IO_REMOTE_CONTEXT_H

#include <pthread.h>

#include "remote.h"

enum {
  MAX_PREFETCHES = 4096,       /* queued or in transfer per dataset; more read-ahead is dropped */
  STORE_QUEUE = 64,            /* prefetched ranges waiting for the store thread (then the engine waits) */
  WAIT_SLICE_NS = 50 * 1000 * 1000, /* a waiter rechecks its deadline at least this often */
  KEY_CAPACITY = 512,
  JOB_CAPACITY = 256,
  INDEX_HEADER_LINES = 5,      /* magic, hash, etag, modified, job; then an empty line and the body */
};

typedef struct {
  WkFetchTarget target;
  uint32_t refs;               /* under the remote's lock */
} Target;

typedef struct {
  uint64_t offset, length;
} Extent;

typedef struct Prefetch Prefetch;

/* A read of this process fetching a range the cache lacks (on its thread's stack): the other threads of the
 * process that need the range wait on the remote's condition variable for it, not by polling the claim. */
typedef struct Reading {
  const char *key;
  struct Reading *next;
} Reading;

struct WkRemote {
  WkRemoteOptions options;
  char cache_dir[WK_DISK_PATH_CAPACITY];
  WkFetchConfig fetch_config;
  WkFetch *fetch;
  WkDiskCache *disk;
  uint64_t patience_ns;        /* the longest a download can take: how long to wait for a peer's */
  pthread_mutex_t lock;        /* prefetches, readings, targets' refs, the S3 configuration */
  pthread_cond_t changed;      /* a prefetch or a reading ended */
  Prefetch *prefetches;
  Reading *readings;
  uint32_t prefetch_count;
  WkS3Config s3;
  bool s3_loaded;
  char job[JOB_CAPACITY];
  bool has_job;
  _Atomic uint64_t hits, misses, wait_ns, prefetched, corrupt;
  WkQueue *stores;             /* prefetches whose bytes the store thread writes to the cache */
  pthread_t storer;
  bool storer_started;
};

struct Prefetch {
  WkFetchRequest request;
  WkRemote *remote;
  Target *target;
  char key[KEY_CAPACITY];
  WkDiskClaim claim;
  uint8_t *body;               /* what arrived, for the store thread (NULL: failed or not kept) */
  uint64_t body_length;
  bool arrived;                /* body is set: a waiting reader may copy it until done (under the lock) */
  bool served;                 /* a reader took its bytes from body: its entry is marked read once stored */
  bool forgotten;              /* its bytes were found corrupt: nobody takes them, its entry goes once stored */
  bool done;
  uint32_t waiters;
  Prefetch *next;
};

typedef struct {
  WkBlob base;
  WkRemote *remote;
  Target *target;
  char *key;                   /* the cache directory of its entries; NULL: uncached */
  pthread_mutex_t lock;        /* known */
  Extent *known;               /* entries this process read or stored, sorted by offset */
  uint32_t known_count, known_capacity;
} RemoteBlob;

/* ---- remote.c -------------------------------------------------------------------------------------- */

/* The fetch target of a location, with one reference; unref frees it with the last one. */
WkStatus remote_target_new(WkRemote *r, const char *location, uint64_t size, Target **out);
void remote_target_unref(WkRemote *r, Target *t);
/* The S3 configuration, read from the environment at the first s3:// location. */
WkStatus remote_load_s3(WkRemote *r);
/* length bytes of a cache entry's file at offset (what names it in messages). */
WkStatus remote_read_fully(int fd, uint64_t offset, void *dst, size_t length, const char *what);

/* ---- remote_blob.c --------------------------------------------------------------------------------- */

/* The store thread: writes prefetched ranges to the disk cache (started by wk_remote_open). */
void *remote_storer_main(void *arg);

#endif /* WK_IO_REMOTE_CONTEXT_H */
