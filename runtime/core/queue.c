/*
 * queue.c — bounded blocking FIFO of pointers (mutex + two condition variables).
 *
 * Pipeline stages hand buffers to each other through these. The ring has a fixed capacity chosen
 * by the caller from its memory budget; waits take a timeout so a stuck stage surfaces as
 * WK_ERR_TIMEOUT with a message instead of a hang.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "core.h"

struct WkQueue {
  pthread_mutex_t lock;
  pthread_cond_t not_empty;
  pthread_cond_t not_full;
  void **slots;
  size_t capacity;
  size_t head;    /* index of the oldest item */
  size_t length;  /* items currently held */
  bool closed;
};

WkQueue *wk_queue_new(size_t capacity) {
  if (capacity == 0) {
    WK_FAIL(WK_ERR_INVALID_ARG, "queue capacity must be at least 1");
    return NULL;
  }
  WkQueue *q = wk_calloc(1, sizeof *q, "queue");
  if (!q) return NULL;
  q->slots = wk_calloc(capacity, sizeof *q->slots, "queue slots");
  if (!q->slots) {
    free(q);
    return NULL;
  }
  q->capacity = capacity;
  pthread_mutex_init(&q->lock, NULL);
  /* Timed waits use CLOCK_MONOTONIC so a wall-clock jump cannot stretch or cut a timeout. */
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&q->not_empty, &attr);
  pthread_cond_init(&q->not_full, &attr);
  pthread_condattr_destroy(&attr);
  return q;
}

void wk_queue_free(WkQueue *q) {
  if (!q) return;
  pthread_cond_destroy(&q->not_empty);
  pthread_cond_destroy(&q->not_full);
  pthread_mutex_destroy(&q->lock);
  free(q->slots);
  free(q);
}

void wk_queue_close(WkQueue *q) {
  pthread_mutex_lock(&q->lock);
  q->closed = true;
  pthread_cond_broadcast(&q->not_empty);
  pthread_cond_broadcast(&q->not_full);
  pthread_mutex_unlock(&q->lock);
}

static struct timespec deadline_after(int64_t timeout_ms) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_sec += timeout_ms / 1000;
  ts.tv_nsec += (timeout_ms % 1000) * 1000000;
  if (ts.tv_nsec >= 1000000000) {
    ts.tv_sec += 1;
    ts.tv_nsec -= 1000000000;
  }
  return ts;
}

/* Waits on cond until ready(q) holds, the queue closes, or the deadline passes. Lock held. */
static WkStatus wait_until(WkQueue *q, pthread_cond_t *cond, bool (*ready)(const WkQueue *),
                          int64_t timeout_ms, const char *what) {
  struct timespec deadline = deadline_after(timeout_ms < 0 ? 0 : timeout_ms);
  while (!ready(q) && !q->closed) {
    if (timeout_ms < 0) {
      pthread_cond_wait(cond, &q->lock);
    } else if (pthread_cond_timedwait(cond, &q->lock, &deadline) == ETIMEDOUT && !ready(q)) {
      return WK_FAIL(WK_ERR_TIMEOUT, "queue %s timed out after %lld ms", what, (long long)timeout_ms);
    }
  }
  return WK_OK;
}

static bool has_room(const WkQueue *q) { return q->length < q->capacity; }
static bool has_item(const WkQueue *q) { return q->length > 0; }

WkStatus wk_queue_push(WkQueue *q, void *item, int64_t timeout_ms) {
  pthread_mutex_lock(&q->lock);
  WkStatus status = wait_until(q, &q->not_full, has_room, timeout_ms, "push");
  if (status == WK_OK && q->closed) status = WK_FAIL(WK_ERR_CLOSED, "queue push after close");
  if (status == WK_OK) {
    q->slots[(q->head + q->length) % q->capacity] = item;
    q->length++;
    pthread_cond_signal(&q->not_empty);
  }
  pthread_mutex_unlock(&q->lock);
  return status;
}

WkStatus wk_queue_pop(WkQueue *q, void **item, int64_t timeout_ms) {
  pthread_mutex_lock(&q->lock);
  WkStatus status = wait_until(q, &q->not_empty, has_item, timeout_ms, "pop");
  if (status == WK_OK && q->length == 0) status = WK_FAIL(WK_ERR_CLOSED, "queue is closed and empty");
  if (status == WK_OK) {
    *item = q->slots[q->head];
    q->head = (q->head + 1) % q->capacity;
    q->length--;
    pthread_cond_signal(&q->not_full);
  }
  pthread_mutex_unlock(&q->lock);
  return status;
}

size_t wk_queue_length(WkQueue *q) {
  pthread_mutex_lock(&q->lock);
  size_t length = q->length;
  pthread_mutex_unlock(&q->lock);
  return length;
}
