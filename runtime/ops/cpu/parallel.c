/*
 * parallel.c — the worker pool behind parallel_for (see parallel.h for why it is not OpenMP).
 *
 * Workers are started on first use: one fewer than the online CPUs, since the caller works too.
 * Chunks are claimed under the pool lock together with the job they belong to, so a worker that
 * wakes late can never run a chunk of one job with the body of another. After fork() the child has
 * no workers: an atfork handler resets the pool so the child starts its own.
 */
#include <pthread.h>
#include <stdbool.h>
#include <unistd.h>

#include "parallel.h"

enum { MAX_WORKERS = 63, CHUNKS_PER_THREAD = 4 };

static struct {
  pthread_mutex_t lock;
  pthread_cond_t wake, done;
  pthread_mutex_t job_lock;  /* one job at a time */
  int workers;               /* 0 until started, -1 when the pool could not start */
  ParallelBody body;
  void *ctx;
  size_t n, chunks, next, completed;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
          PTHREAD_MUTEX_INITIALIZER, 0, NULL, NULL, 0, 0, 0, 0};

static bool atfork_registered;
static _Thread_local bool inside_job;  /* a body that calls parallel_for runs it inline */

static void run_chunk(ParallelBody body, void *ctx, size_t n, size_t chunks, size_t chunk) {
  body(ctx, chunk * n / chunks, (chunk + 1) * n / chunks, chunk);
}

/* Claims and runs chunks until none is left; lock held on entry and exit. */
static void work_locked(void) {
  while (pool.next < pool.chunks) {
    size_t chunk = pool.next++;
    ParallelBody body = pool.body;
    void *ctx = pool.ctx;
    size_t n = pool.n, chunks = pool.chunks;
    pthread_mutex_unlock(&pool.lock);
    inside_job = true;
    run_chunk(body, ctx, n, chunks, chunk);
    inside_job = false;
    pthread_mutex_lock(&pool.lock);
    if (++pool.completed == pool.chunks) pthread_cond_signal(&pool.done);
  }
}

static void *worker_main(void *arg) {
  pthread_mutex_lock(&pool.lock);
  for (;;) {
    while (pool.next >= pool.chunks) pthread_cond_wait(&pool.wake, &pool.lock);
    work_locked();
  }
  return NULL;
}

static void reset_after_fork(void) {
  pthread_mutex_init(&pool.lock, NULL);
  pthread_mutex_init(&pool.job_lock, NULL);
  pthread_cond_init(&pool.wake, NULL);
  pthread_cond_init(&pool.done, NULL);
  pool.workers = 0;
  pool.next = pool.chunks = pool.completed = 0;
}

/* Starts the workers once per process; pool lock held. */
static void start_pool_locked(void) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  int wanted = cpus > 1 ? (int)(cpus - 1 < MAX_WORKERS ? cpus - 1 : MAX_WORKERS) : 0;
  if (!atfork_registered) atfork_registered = pthread_atfork(NULL, NULL, reset_after_fork) == 0;
  int started = 0;
  for (; started < wanted; started++) {
    pthread_t thread;
    if (wk_thread_create(&thread, worker_main, NULL) != 0) break;
    pthread_detach(thread);
  }
  pool.workers = started > 0 ? started : -1;
}

size_t parallel_threads(void) {
  pthread_mutex_lock(&pool.lock);
  if (pool.workers == 0) start_pool_locked();
  pthread_mutex_unlock(&pool.lock);
  return pool.workers > 0 ? (size_t)pool.workers + 1 : 1;
}

size_t parallel_chunks(size_t n, size_t grain) {
  size_t threads = parallel_threads();
  size_t by_size = grain ? n / grain : n;
  size_t chunks = threads * CHUNKS_PER_THREAD;
  if (chunks > by_size) chunks = by_size;
  if (chunks > PARALLEL_MAX_CHUNKS) chunks = PARALLEL_MAX_CHUNKS;
  return threads == 1 || chunks < 2 ? 1 : chunks;
}

void parallel_for(size_t n, size_t grain, ParallelBody body, void *ctx) {
  size_t chunks = parallel_chunks(n, grain);
  if (chunks == 1 || inside_job || pthread_mutex_trylock(&pool.job_lock) != 0) {
    for (size_t chunk = 0; chunk < chunks; chunk++) run_chunk(body, ctx, n, chunks, chunk);
    return;
  }
  pthread_mutex_lock(&pool.lock);
  pool.body = body;
  pool.ctx = ctx;
  pool.n = n;
  pool.chunks = chunks;
  pool.next = pool.completed = 0;
  pthread_cond_broadcast(&pool.wake);
  work_locked();
  while (pool.completed < pool.chunks) pthread_cond_wait(&pool.done, &pool.lock);
  pthread_mutex_unlock(&pool.lock);
  pthread_mutex_unlock(&pool.job_lock);
}
