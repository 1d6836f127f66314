/*
 * remote_blob.c — the remote blob: a remote object read by range through the node's disk cache.
 *
 * The blob's read_at serves a range from the disk cache: an entry of exactly that range, or one this
 * process knows to contain it (the reads of a shard's document index fall inside its tail entry).
 * Otherwise it waits for this process's prefetch of the range if one is in flight, else claims the
 * range (remote.h: sharing), fetches it as an urgent Range request straight into the caller's buffer and
 * stores it; when a local peer holds the claim it waits for the peer's entry instead. advise(WILLNEED)
 * queues a prefetch (dropped when the range is cached, in flight, or claimed by a peer when it starts);
 * what arrives is written to the cache by a store thread (the engine's own buffer when the range was
 * fetched alone, a copy when it came merged with neighbours), so that the engine's thread, which
 * drives every transfer, never waits on the file system (on a busy disk, making a file can take longer
 * than fetching its bytes over a fast link). forget removes cached copies of a range found corrupt, so the next
 * read fetches it anew.
 *
 * Prefetches outlive the blob that asked for them (a shard may close while its read-ahead is in flight):
 * each holds a reference to the blob's fetch target, freed with the last holder.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "remote_context.h"

static void entry_key(const RemoteBlob *b, uint64_t offset, uint64_t length, char out[KEY_CAPACITY]) {
  snprintf(out, KEY_CAPACITY, "%s/%llu-%llu", b->key, (unsigned long long)offset, (unsigned long long)length);
}

/* ---- known entries -------------------------------------------------------------------------------- */

static void known_add(RemoteBlob *b, uint64_t offset, uint64_t length) {
  pthread_mutex_lock(&b->lock);
  uint32_t at = 0;
  while (at < b->known_count && b->known[at].offset < offset) at++;
  bool present = at < b->known_count && b->known[at].offset == offset && b->known[at].length == length;
  if (!present && b->known_count == b->known_capacity) {
    uint32_t grown = b->known_capacity ? b->known_capacity * 2 : 16;
    Extent *bigger = realloc(b->known, grown * sizeof *bigger);
    if (bigger) {
      b->known = bigger;
      b->known_capacity = grown;
    }
  }
  if (!present && b->known_count < b->known_capacity) {
    memmove(b->known + at + 1, b->known + at, (b->known_count - at) * sizeof *b->known);
    b->known[at] = (Extent){offset, length};
    b->known_count++;
  }
  pthread_mutex_unlock(&b->lock);
}

static void known_remove(RemoteBlob *b, uint64_t offset, uint64_t length) {
  pthread_mutex_lock(&b->lock);
  for (uint32_t i = 0; i < b->known_count; i++)
    if (b->known[i].offset == offset && b->known[i].length == length) {
      memmove(b->known + i, b->known + i + 1, (b->known_count - i - 1) * sizeof *b->known);
      b->known_count--;
      break;
    }
  pthread_mutex_unlock(&b->lock);
}

/* A known entry holding [offset, offset+length), other than the range itself. */
static bool known_container(RemoteBlob *b, uint64_t offset, uint64_t length, Extent *out) {
  bool found = false;
  pthread_mutex_lock(&b->lock);
  for (uint32_t i = 0; i < b->known_count && b->known[i].offset <= offset && !found; i++) {
    const Extent *e = &b->known[i];
    if (offset + length <= e->offset + e->length && !(e->offset == offset && e->length == length)) {
      *out = *e;
      found = true;
    }
  }
  pthread_mutex_unlock(&b->lock);
  return found;
}

/* ---- reading through the cache ---------------------------------------------------------------------- */

/* Copies [offset, offset+length) from entry `e` when it is on disk with its full size. */
static bool read_entry(RemoteBlob *b, Extent e, uint64_t offset, uint64_t length, void *dst) {
  char key[KEY_CAPACITY];
  entry_key(b, e.offset, e.length, key);
  uint64_t size = 0;
  int fd = wk_disk_cache_open_entry(b->remote->disk, key, &size);
  if (fd < 0) return false;
  bool ok = size == e.length && remote_read_fully(fd, offset - e.offset, dst, (size_t)length, key) == WK_OK;
  close(fd);
  if (!ok) {
    wk_disk_cache_remove(b->remote->disk, key); /* the wrong size: not ours to trust */
    known_remove(b, e.offset, e.length);
  }
  return ok;
}

static bool serve_cached(RemoteBlob *b, uint64_t offset, uint64_t length, void *dst) {
  Extent container;
  if (known_container(b, offset, length, &container)) {
    if (read_entry(b, container, offset, length, dst)) return true;
    known_remove(b, container.offset, container.length);
  }
  if (!read_entry(b, (Extent){offset, length}, offset, length, dst)) return false;
  known_add(b, offset, length);
  return true;
}

static WkStatus fetch_into(RemoteBlob *b, uint64_t offset, uint64_t length, void *dst) {
  WkFetchRequest request = {.target = &b->target->target, .offset = offset, .length = length, .dst = dst};
  WkStatus status = wk_fetch_run(b->remote->fetch, &request);
  if (status != WK_OK) return WK_FAIL(status, "%s", request.error);
  return WK_OK;
}

static Prefetch *find_prefetch(WkRemote *r, const char *key) {
  for (Prefetch *p = r->prefetches; p; p = p->next)
    if (strcmp(p->key, key) == 0) return p;
  return NULL;
}

/* Remote lock held. Unlinks and frees a finished prefetch nobody waits for. */
static void reap_prefetch(WkRemote *r, Prefetch *p) {
  if (!p->done || p->waiters > 0) return;
  for (Prefetch **q = &r->prefetches; *q; q = &(*q)->next)
    if (*q == p) {
      *q = p->next;
      r->prefetch_count--;
      break;
    }
  Target *t = p->target;
  free(p);
  if (--t->refs == 0) { /* the lock is held: free here, as target_unref would */
    free(t->target.url);
    free(t->target.name);
    free(t);
  }
}

/* Remote lock held: one bounded wait on `changed` (at most WAIT_SLICE_NS, never past the deadline). */
static void wait_changed(WkRemote *r, uint64_t deadline) {
  uint64_t at = wk_now_ns() + WAIT_SLICE_NS;
  if (at > deadline) at = deadline;
  struct timespec ts = {.tv_sec = (time_t)(at / 1000000000ull), .tv_nsec = (long)(at % 1000000000ull)};
  pthread_cond_timedwait(&r->changed, &r->lock, &ts); /* changed is on CLOCK_MONOTONIC */
}

/* Waits (bounded) for this process's prefetch of key, when one is in flight; true when it waited. Its
 * bytes go to dst as soon as they arrive (*served), before the store thread has written them to the cache
 * and without reading them back from there: the reader waited for them. */
static bool wait_prefetch(WkRemote *r, const char *key, uint64_t length, void *dst, uint64_t deadline,
                          bool *served) {
  pthread_mutex_lock(&r->lock);
  Prefetch *p = find_prefetch(r, key);
  bool waited = p && !p->done;
  if (p) {
    p->waiters++;
    if (!p->done) wk_fetch_hurry(r->fetch, &p->request); /* p stays while it has waiters */
    while (!p->done && !p->arrived && wk_now_ns() < deadline) wait_changed(r, deadline);
    if (!p->done && p->arrived && p->body_length == length) {
      memcpy(dst, p->body, (size_t)length); /* the store thread frees body only under the lock, when done */
      p->served = *served = true;
    }
    p->waiters--;
    reap_prefetch(r, p);
  }
  pthread_mutex_unlock(&r->lock);
  return waited;
}

static bool find_reading(WkRemote *r, const char *key) {
  for (Reading *g = r->readings; g; g = g->next)
    if (strcmp(g->key, key) == 0) return true;
  return false;
}

/* Makes this thread the one of its process that fetches key (true), or, when another thread is fetching it,
 * waits (bounded) until that one is done and returns false: look in the cache again. */
static bool reading_begin(WkRemote *r, Reading *me, const char *key, uint64_t deadline) {
  pthread_mutex_lock(&r->lock);
  bool other = find_reading(r, key);
  if (other) {
    while (find_reading(r, key) && wk_now_ns() < deadline) wait_changed(r, deadline);
  } else {
    *me = (Reading){.key = key, .next = r->readings};
    r->readings = me;
  }
  pthread_mutex_unlock(&r->lock);
  return !other;
}

static void reading_end(WkRemote *r, Reading *me) {
  pthread_mutex_lock(&r->lock);
  for (Reading **g = &r->readings; *g; g = &(*g)->next)
    if (*g == me) {
      *g = me->next;
      break;
    }
  pthread_cond_broadcast(&r->changed);
  pthread_mutex_unlock(&r->lock);
}

/* One attempt at a range the cache lacks: claim it for the node and fetch and store it, or wait (bounded) for
 * the process that claimed it; after the deadline, fetch it without the cache. *served: dst holds it. */
static WkStatus read_claimed(RemoteBlob *b, const char *key, uint64_t offset, size_t length, void *dst,
                             uint64_t deadline, bool *served) {
  WkRemote *r = b->remote;
  WkDiskClaim claim;
  bool owned = false;
  WK_TRY(wk_disk_cache_claim(r->disk, key, &claim, &owned));
  WkStatus status = WK_OK;
  if (owned) {
    if (serve_cached(b, offset, length, dst)) { /* stored while we claimed */
      wk_disk_cache_release(r->disk, &claim);
      *served = true;
      return WK_OK;
    }
    status = fetch_into(b, offset, length, dst);
    bool stored = false;
    if (status == WK_OK) status = wk_disk_cache_store(r->disk, key, dst, length, true, true, &stored);
    if (stored) known_add(b, offset, length);
    wk_disk_cache_release(r->disk, &claim);
    *served = status == WK_OK;
  } else if (!wk_disk_cache_wait(r->disk, key, deadline) || wk_now_ns() >= deadline) {
    status = fetch_into(b, offset, length, dst); /* the peer took too long: fetch without the cache */
    *served = status == WK_OK;
  }
  return status;
}

static WkStatus remote_read_at(WkBlob *self, uint64_t offset, size_t length, void *dst) {
  RemoteBlob *b = (RemoteBlob *)self;
  WkRemote *r = b->remote;
  if (offset > self->size || length > self->size - offset)
    return WK_FAIL(WK_ERR_FORMAT, "'%s': read of %zu bytes at offset %llu runs past the end (%llu bytes)", self->name,
                   length, (unsigned long long)offset, (unsigned long long)self->size);
  if (length == 0) return WK_OK;
  if (!b->key) return fetch_into(b, offset, length, dst);
  if (serve_cached(b, offset, length, dst)) {
    atomic_fetch_add_explicit(&r->hits, 1, memory_order_relaxed);
    return WK_OK;
  }
  uint64_t t0 = wk_now_ns(), deadline = t0 + r->patience_ns;
  atomic_fetch_add_explicit(&r->misses, 1, memory_order_relaxed);
  char key[KEY_CAPACITY];
  entry_key(b, offset, length, key);
  WkStatus status = WK_OK;
  bool served = false;
  while (!served && status == WK_OK) {
    if (serve_cached(b, offset, length, dst)) {
      served = true;
      break;
    }
    Reading me;
    bool mine = false;
    if (wk_now_ns() < deadline) {
      if (wait_prefetch(r, key, length, dst, deadline, &served)) continue; /* served, or look again */
      if (!(mine = reading_begin(r, &me, key, deadline))) continue; /* so is another thread's read */
    }
    status = read_claimed(b, key, offset, length, dst, deadline, &served);
    if (mine) reading_end(r, &me);
  }
  atomic_fetch_add_explicit(&r->wait_ns, wk_now_ns() - t0, memory_order_relaxed);
  return status;
}

/* ---- prefetch ------------------------------------------------------------------------------------- */

/* Ends a prefetch: done, its body (if any) is the caller's to free (returned), and whether a reader took
 * its bytes from memory (*served). A stored entry whose bytes a reader found corrupt meanwhile
 * (remote_forget) is removed before its waiters wake, or the reader that forgot it would read it again. */
static uint8_t *finish_prefetch(Prefetch *p, bool stored, bool *served) {
  WkRemote *r = p->remote;
  pthread_mutex_lock(&r->lock);
  if (stored && p->forgotten) wk_disk_cache_remove(r->disk, p->key);
  p->done = true;
  uint8_t *body = p->body;
  p->body = NULL;
  *served = p->served && !p->forgotten;
  pthread_cond_broadcast(&r->changed);
  reap_prefetch(r, p);
  pthread_mutex_unlock(&r->lock);
  return body;
}

static bool prefetch_start(WkFetchRequest *request) {
  Prefetch *p = request->ctx;
  WkRemote *r = p->remote;
  bool owned = false;
  if (wk_disk_cache_claim(r->disk, p->key, &p->claim, &owned) != WK_OK || !owned ||
      wk_disk_cache_has(r->disk, p->key)) {
    if (owned) wk_disk_cache_release(r->disk, &p->claim);
    bool served;
    finish_prefetch(p, false, &served); /* nothing arrived: no body, nobody served */
    return false;
  }
  return true;
}

/* Writes a prefetch's bytes to the cache (the store thread), drops its claim and wakes its waiters. An
 * entry a waiting reader took from memory is marked read, as reading it from the cache would have. */
static void store_prefetch(Prefetch *p) {
  WkRemote *r = p->remote;
  bool stored = false, served = false;
  if (p->body && wk_disk_cache_store(r->disk, p->key, p->body, p->body_length, false, false, &stored) == WK_OK &&
      stored)
    atomic_fetch_add_explicit(&r->prefetched, 1, memory_order_relaxed);
  char key[KEY_CAPACITY];
  memcpy(key, p->key, sizeof key);
  wk_disk_cache_release(r->disk, &p->claim);
  free(finish_prefetch(p, stored, &served)); /* p may be gone now */
  uint64_t size;
  int fd = stored && served ? wk_disk_cache_open_entry(r->disk, key, &size) : -1;
  if (fd >= 0) close(fd);
}

void *remote_storer_main(void *arg) {
  WkRemote *r = arg;
  void *item;
  while (wk_queue_pop(r->stores, &item, -1) == WK_OK) store_prefetch(item);
  return NULL;
}

static void prefetch_done(WkFetchRequest *request) {
  Prefetch *p = request->ctx;
  WkRemote *r = p->remote;
  uint8_t *body = NULL;
  if (request->status == WK_OK && request->body_taken) {
    body = (uint8_t *)request->body; /* a transfer of its own: no copy on the engine's thread */
  } else if (request->status == WK_OK) {
    body = malloc(request->body_length ? (size_t)request->body_length : 1); /* the engine's copy ends here */
    if (body) memcpy(body, request->body, (size_t)request->body_length);
    else wk_logf(WK_LOG_DEBUG, "prefetch of '%s': no memory to keep %llu bytes (the read will fetch them)",
                 request->target->name, (unsigned long long)request->body_length);
  } else {
    wk_logf(WK_LOG_DEBUG, "prefetch failed (the read will try again): %s", request->error);
  }
  /* Published under the lock: a reader waiting for this range takes it from here. */
  pthread_mutex_lock(&r->lock);
  p->body = body;
  p->body_length = body ? request->body_length : 0;
  p->arrived = body != NULL;
  if (body && p->waiters > 0) pthread_cond_broadcast(&r->changed);
  pthread_mutex_unlock(&r->lock);
  if (wk_queue_push(r->stores, p, -1) != WK_OK) store_prefetch(p); /* closing: write it here */
}

static void remote_advise(WkBlob *self, uint64_t offset, uint64_t length, WkAdvice advice) {
  RemoteBlob *b = (RemoteBlob *)self;
  WkRemote *r = b->remote;
  if (advice != WK_ADVICE_WILLNEED || !b->key || r->options.prefetch_bytes == 0 || offset >= self->size || length == 0)
    return;
  if (length > self->size - offset) length = self->size - offset;
  Prefetch *p = calloc(1, sizeof *p);
  if (!p) return; /* a hint */
  entry_key(b, offset, length, p->key);
  if (wk_disk_cache_has(r->disk, p->key)) {
    free(p);
    return;
  }
  pthread_mutex_lock(&r->lock);
  bool skip = find_prefetch(r, p->key) || r->prefetch_count >= MAX_PREFETCHES;
  if (!skip) {
    p->remote = r;
    p->target = b->target;
    b->target->refs++;
    p->claim.fd = -1;
    p->request = (WkFetchRequest){.target = &b->target->target, .offset = offset, .length = length,
                                  .take_body = true, .start = prefetch_start, .done = prefetch_done, .ctx = p};
    p->next = r->prefetches;
    r->prefetches = p;
    r->prefetch_count++;
  }
  pthread_mutex_unlock(&r->lock);
  if (skip) {
    free(p);
    return;
  }
  wk_fetch_submit(r->fetch, &p->request);
}

/* Prefetches of b overlapping [offset, offset + length) whose bytes a reader found corrupt: nobody may
 * take them from memory any more, and their entries go once stored. */
static void forget_prefetches(RemoteBlob *b, uint64_t offset, uint64_t length) {
  WkRemote *r = b->remote;
  size_t n = strlen(b->key);
  pthread_mutex_lock(&r->lock);
  for (Prefetch *p = r->prefetches; p; p = p->next) {
    const WkFetchRequest *q = &p->request;
    if (strncmp(p->key, b->key, n) == 0 && p->key[n] == '/' && q->offset < offset + length &&
        offset < q->offset + q->length) {
      p->forgotten = true;
      p->arrived = false;
    }
  }
  pthread_mutex_unlock(&r->lock);
}

static void remote_forget(WkBlob *self, uint64_t offset, uint64_t length) {
  RemoteBlob *b = (RemoteBlob *)self;
  if (!b->key) return;
  atomic_fetch_add_explicit(&b->remote->corrupt, 1, memory_order_relaxed);
  forget_prefetches(b, offset, length);
  Extent gone[64];
  uint32_t count = 0;
  pthread_mutex_lock(&b->lock);
  for (uint32_t i = 0; i < b->known_count;) {
    const Extent *e = &b->known[i];
    if (e->offset < offset + length && offset < e->offset + e->length && count < 64) {
      gone[count++] = *e;
      memmove(b->known + i, b->known + i + 1, (b->known_count - i - 1) * sizeof *b->known);
      b->known_count--;
    } else {
      i++;
    }
  }
  pthread_mutex_unlock(&b->lock);
  if (count == 0) gone[count++] = (Extent){offset, length};
  for (uint32_t i = 0; i < count; i++) {
    char key[KEY_CAPACITY];
    entry_key(b, gone[i].offset, gone[i].length, key);
    wk_disk_cache_remove(b->remote->disk, key);
  }
}

static const void *remote_map(WkBlob *self, uint64_t offset, size_t length) {
  (void)self, (void)offset, (void)length;
  return NULL;
}

static void remote_close(WkBlob *self) {
  RemoteBlob *b = (RemoteBlob *)self;
  if (!b) return;
  remote_target_unref(b->remote, b->target);
  pthread_mutex_destroy(&b->lock);
  free(b->known);
  free(b->key);
  free(b);
}

WkBlob *wk_remote_blob_open(WkRemote *r, const char *location, uint64_t size, const char *cache_key) {
  RemoteBlob *b = wk_calloc(1, sizeof *b, "remote blob");
  if (!b) return NULL;
  pthread_mutex_init(&b->lock, NULL);
  b->remote = r;
  if (remote_target_new(r, location, size, &b->target) != WK_OK || (cache_key && !(b->key = strdup(cache_key)))) {
    if (wk_last_status() == WK_OK) WK_FAIL(WK_ERR_NOMEM, "out of memory opening '%s'", location);
    remote_close(&b->base);
    return NULL;
  }
  b->base.name = b->target->target.name;
  b->base.size = size;
  b->base.read_at = remote_read_at;
  b->base.map = remote_map;
  b->base.advise = remote_advise;
  b->base.forget = remote_forget;
  b->base.close = remote_close;
  return &b->base;
}
