/*
 * node_cache.c — a source's decoded units and edges, shared by the local ranks of a node (shared.c): each
 * unit is decoded once per node and stays exactly as long as the order says it is needed.
 *
 * What stays cached follows the order, not recency. An entry carries the absolute draws of its
 * buffer's first and last item (its hold, from order.c) and becomes reusable once every attached
 * reader's low water (the first draw it may still read) is past the last. So an entry a reader still needs is never taken
 * from under it, and readers copy from entries without holding the lock. When every slot is still
 * needed, a reader waits for the node's slowest reader to move on (backpressure: no rank runs ahead of
 * its node by more than the cache holds), except the slowest reader itself: it takes the slot of the
 * entry needed furthest in the future among those no reader can be reading (its buffer starts past
 * every reader's high water, the last draw it may be reading now), or else decodes privately, so the
 * node always makes progress. A dead reader or decoder (kill -9) is noticed and cleared while others
 * wait: it is recorded by pid and start time, so a pid the kernel gave to another process since does
 * not keep it.
 *
 * Layout: header, reader table, `units + edges` entries (hash chains and free lists threaded through
 * them by index), bucket heads, then the unit slots and the edge slots. All changes happen under the
 * robust lock; when its holder died, the chains are rebuilt from the entries.
 *
 * The region is memory other processes write, so nothing read from it is trusted: a joiner checks the
 * whole layout against its own and then uses its own copy of it (sizes, counts, offsets), and every
 * index read from the region (a link, a list head) is checked against the entries and chain walks are
 * bounded; a bad one fails the next read with a message naming the region, never an access outside it.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../core/shared.h"
#include "node_cache.h"

enum {
  CACHE_VERSION = 2,          /* 2: readers and decoders recorded with their start times */
  MAX_READERS = 256,          /* loaders of one stream on one node (ranks x loaders per rank) */
  DATA_ALIGNMENT = 64,
  WAIT_SLICE_MS = 50,         /* a waiter re-checks dead peers this often */
  WAIT_LIMIT_MS = 300000,     /* then gives up with a message naming who it waited for */
};

static const char CACHE_MAGIC[8] = "WICKUNIT";

/* Forwards a failure from inside a locked section. */
#define TRY_UNLOCKED(c, expr)                 \
  do {                                        \
    WkStatus try_status_ = (expr);            \
    if (try_status_ != WK_OK) {               \
      unlock(c);                              \
      return try_status_;                     \
    }                                         \
  } while (0)
static const uint64_t EDGE_KEY_TAG = 1ull << 63;

typedef enum { ENTRY_FREE = 0, ENTRY_LOADING = 1, ENTRY_READY = 2 } EntryState;

typedef struct {
  uint64_t key;
  uint64_t hold_from, hold_until;
  int32_t next;               /* hash chain, or free list */
  uint32_t state;
  int32_t owner;              /* pid decoding it while LOADING */
  uint32_t owner_started;     /* and its start time (see still_running) */
  uint32_t bytes;             /* edges: bytes saved */
  uint32_t backed;            /* its data's pages are reserved (wk_shared_reserve) */
} Entry;

typedef struct {
  _Atomic int32_t pid;        /* 0: unused */
  _Atomic uint32_t started;   /* the reader's start time (see still_running) */
  _Atomic uint64_t low_water, high_water;
} Reader;

typedef struct {
  _Atomic uint32_t ready;     /* shared.c's ready word */
  char magic[8];
  uint32_t version;
  uint64_t identity, unit_bytes, edge_bytes;
  uint32_t units, edges, buckets;
  uint64_t entries_at, buckets_at, unit_data_at, edge_data_at;
  WkSharedLock lock;
  int32_t free_units, free_edges;
  uint32_t attached;
  Reader readers[MAX_READERS];
  WkNodeCacheStats stats;     /* under the lock, except the two byte counts (atomic adds) */
  _Atomic uint64_t decoded_bytes, delivered_bytes;
} Header;

struct WkNodeCache {
  WkSharedRegion region;
  Header *h;
  Entry *entries;
  int32_t *bucket;
  uint8_t *unit_data, *edge_data;
  Header layout;              /* this process's copy of the layout, checked against the region's at open */
  bool corrupt;               /* a bad index was read from the region: the next get fails */
  uint32_t reader;            /* this loader's slot in the reader table */
  uint32_t started;           /* this process's start time, recorded beside its pid */
  char what[256];             /* the source, for messages */
};

static size_t align_up(size_t n) { return (n + DATA_ALIGNMENT - 1) / DATA_ALIGNMENT * DATA_ALIGNMENT; }

static uint32_t bucket_count(uint32_t entries) {
  uint32_t b = 16;
  while (b < 2 * entries) b *= 2;
  return b;
}

/* The layout of a region with `units` unit slots, without memory behind it. */
static Header layout_with(const WkNodeCacheConfig *cfg, uint32_t units) {
  Header h = {.version = CACHE_VERSION, .identity = cfg->identity, .unit_bytes = align_up(cfg->unit_bytes),
              .edge_bytes = align_up(cfg->edge_bytes), .units = units, .edges = cfg->edge_slots};
  memcpy(h.magic, CACHE_MAGIC, sizeof h.magic);
  h.buckets = bucket_count(h.units + h.edges);
  h.entries_at = align_up(sizeof(Header));
  h.buckets_at = align_up(h.entries_at + sizeof(Entry) * (h.units + h.edges));
  h.unit_data_at = align_up(h.buckets_at + sizeof(int32_t) * h.buckets);
  h.edge_data_at = h.unit_data_at + (uint64_t)h.units * h.unit_bytes;
  return h;
}

static uint64_t region_bytes(const Header *h) { return h->edge_data_at + (uint64_t)h->edges * h->edge_bytes; }

/* The most unit slots whose region fits the budget: a first guess from the sizes, then down past the
 * alignment and bucket rounding. */
static Header layout(const WkNodeCacheConfig *cfg) {
  Header empty = layout_with(cfg, 0);
  uint64_t fixed = region_bytes(&empty);
  uint64_t per_unit = align_up(cfg->unit_bytes) + sizeof(Entry) + 2 * sizeof(int32_t);
  uint64_t guess = cfg->budget_bytes > fixed ? (cfg->budget_bytes - fixed) / per_unit + 1 : 0;
  uint32_t units = guess > UINT32_MAX / 4 ? UINT32_MAX / 4 : (uint32_t)guess;
  Header h = layout_with(cfg, units);
  while (units > 0 && region_bytes(&h) > cfg->budget_bytes) h = layout_with(cfg, --units);
  return h;
}

uint32_t wk_node_cache_slots(const WkNodeCacheConfig *cfg) { return layout(cfg).units; }

uint64_t wk_node_cache_bytes_for(const WkNodeCacheConfig *cfg, uint32_t units) {
  Header h = layout_with(cfg, units);
  return region_bytes(&h);
}

/* ---- chains --------------------------------------------------------------------------------------- */

static uint32_t bucket_of(const Header *h, uint64_t key) { return (uint32_t)(wk_mix64(key, 0x75) & (h->buckets - 1)); }

static uint32_t entry_count(const WkNodeCache *c) { return c->layout.units + c->layout.edges; }

/* An index read from the region: -1 (none) or an entry in [first, end); anything else marks the cache
 * corrupted and reads as none. */
static int32_t checked_index(WkNodeCache *c, int32_t i, uint32_t first, uint32_t end) {
  if (i == -1 || (i >= (int32_t)first && (uint32_t)i < end)) return i;
  c->corrupt = true;
  return -1;
}

static int32_t next_in_chain(WkNodeCache *c, int32_t link) { return checked_index(c, link, 0, entry_count(c)); }

static int32_t *free_list(WkNodeCache *c, uint32_t index) {
  return index < c->layout.units ? &c->h->free_units : &c->h->free_edges;
}

static void push_free(WkNodeCache *c, uint32_t index) {
  Entry *e = &c->entries[index];
  int32_t *head = free_list(c, index);
  e->state = ENTRY_FREE;
  e->next = *head;
  *head = (int32_t)index;
}

static void link_entry(WkNodeCache *c, uint32_t index) {
  Entry *e = &c->entries[index];
  int32_t *head = &c->bucket[bucket_of(&c->layout, e->key)];
  e->next = *head;
  *head = (int32_t)index;
}

/* A chain is at most every entry long: a longer one loops. */
static bool chain_too_long(WkNodeCache *c, uint32_t steps) {
  if (steps <= entry_count(c)) return false;
  c->corrupt = true;
  return true;
}

static void unlink_entry(WkNodeCache *c, uint32_t index) {
  int32_t *link = &c->bucket[bucket_of(&c->layout, c->entries[index].key)];
  for (uint32_t steps = 0;; steps++) {
    int32_t i = next_in_chain(c, *link);
    if (i < 0 || chain_too_long(c, steps)) return;
    if (i == (int32_t)index) break;
    link = &c->entries[i].next;
  }
  *link = c->entries[index].next;
}

static Entry *find(WkNodeCache *c, uint64_t key) {
  uint32_t steps = 0;
  for (int32_t i = next_in_chain(c, c->bucket[bucket_of(&c->layout, key)]); i >= 0 && !chain_too_long(c, steps++);
       i = next_in_chain(c, c->entries[i].next))
    if (c->entries[i].key == key) return &c->entries[i];
  return NULL;
}

/* A recorded process still runs: its pid is alive and started when it did (the low 32 bits of the start
 * time tell it from a later process the kernel gave the same pid; they keep Entry and Reader as small as
 * they were). A start time of 0, or one we may not read, checks the pid alone. */
static bool still_running(int32_t pid, uint32_t started) {
  if (!wk_process_alive(pid)) return false;
  uint32_t now = started ? (uint32_t)wk_process_start_time(pid) : 0;
  return now == 0 || now == started;
}

/* Lock held. Rebuilds chains and free lists from the entries' states (after a holder died). */
static void rebuild(WkNodeCache *c) {
  Header *h = c->h;
  for (uint32_t b = 0; b < c->layout.buckets; b++) c->bucket[b] = -1;
  h->free_units = h->free_edges = -1;
  for (uint32_t i = entry_count(c); i-- > 0;) {
    Entry *e = &c->entries[i];
    if (e->state == ENTRY_LOADING && !still_running(e->owner, e->owner_started)) e->state = ENTRY_FREE;
    if (e->state == ENTRY_FREE) push_free(c, i);
    else link_entry(c, i);
  }
}

/* Lock held. Clears readers and decoders that died; returns whether anything changed. */
static bool clear_dead(WkNodeCache *c) {
  Header *h = c->h;
  bool changed = false;
  for (uint32_t r = 0; r < MAX_READERS; r++) {
    int32_t pid = atomic_load(&h->readers[r].pid);
    if (pid != 0 && !still_running(pid, atomic_load(&h->readers[r].started))) {
      atomic_store(&h->readers[r].pid, 0);
      h->attached--;
      changed = true;
    }
  }
  for (uint32_t i = 0; i < entry_count(c); i++) {
    Entry *e = &c->entries[i];
    if (e->state == ENTRY_LOADING && !still_running(e->owner, e->owner_started)) {
      unlink_entry(c, i);
      push_free(c, i);
      changed = true;
    }
  }
  return changed;
}

static WkStatus check_intact(WkNodeCache *c) {
  if (!c->corrupt) return WK_OK;
  return WK_FAIL(WK_ERR_IO, "%s: node cache '/dev/shm%s' is corrupted (a link outside its %u entries, or a loop): "
                 "a process of this user wrote into it; remove it and start the job again", c->what, c->region.name,
                 entry_count(c));
}

static void lock(WkNodeCache *c) {
  if (wk_shared_lock(&c->h->lock)) rebuild(c);
}

static void unlock(WkNodeCache *c) { wk_shared_unlock(&c->h->lock); }

/* The first draw any attached reader may still read; `slowest` gets its pid. */
static uint64_t min_low_water(const WkNodeCache *c, int32_t *slowest) {
  uint64_t low = UINT64_MAX;
  for (uint32_t r = 0; r < MAX_READERS; r++) {
    int32_t pid = atomic_load(&c->h->readers[r].pid);
    uint64_t w = atomic_load(&c->h->readers[r].low_water);
    if (pid != 0 && w < low) {
      low = w;
      if (slowest) *slowest = pid;
    }
  }
  return low;
}

/* Lock held. A unit entry no reader can be reading now, needed furthest in the future; -1 if none. */
static int32_t steal_unit(WkNodeCache *c) {
  uint64_t high = 0;
  for (uint32_t r = 0; r < MAX_READERS; r++)
    if (atomic_load(&c->h->readers[r].pid) != 0 && atomic_load(&c->h->readers[r].high_water) > high)
      high = atomic_load(&c->h->readers[r].high_water);
  int32_t best = -1;
  for (uint32_t i = 0; i < c->layout.units; i++) {
    const Entry *e = &c->entries[i];
    if (e->state == ENTRY_READY && e->hold_from > high && (best < 0 || e->hold_from > c->entries[best].hold_from))
      best = (int32_t)i;
  }
  if (best >= 0) {
    unlink_entry(c, (uint32_t)best);
    c->h->stats.steals++;
  }
  return best;
}

/* Lock held. A free entry of the kind (units or edges), or one no reader needs any more. */
static int32_t take_entry(WkNodeCache *c, bool edge) {
  int32_t *head = edge ? &c->h->free_edges : &c->h->free_units;
  int32_t free_entry = edge ? checked_index(c, *head, c->layout.units, entry_count(c))
                            : checked_index(c, *head, 0, c->layout.units);
  if (free_entry >= 0) {
    *head = c->entries[free_entry].next;
    return free_entry;
  }
  if (c->corrupt) return -1;
  uint64_t low = min_low_water(c, NULL);
  uint32_t first = edge ? c->layout.units : 0, end = edge ? c->layout.units + c->layout.edges : c->layout.units;
  for (uint32_t i = first; i < end; i++) {
    Entry *e = &c->entries[i];
    if (e->state == ENTRY_READY && e->hold_until < low) {
      unlink_entry(c, i);
      return (int32_t)i;
    }
  }
  return -1;
}

/* ---- opening ------------------------------------------------------------------------------------ */

static WkStatus init_region(void *ctx, void *base) {
  const Header *want = ctx;
  Header *h = base;
  memcpy(h, want, sizeof *h);
  WK_TRY(wk_shared_lock_init(&h->lock));
  WkNodeCache view = {.h = h, .layout = *want, .entries = (Entry *)((uint8_t *)base + h->entries_at),
                      .bucket = (int32_t *)((uint8_t *)base + h->buckets_at)};
  memset(view.entries, 0, sizeof(Entry) * entry_count(&view));
  rebuild(&view);
  return WK_OK;
}

/* Every field the layout is made of, as another process wrote it (read once: it may change under us). */
static WkStatus check_layout(const volatile Header *got, const Header *want, const char *name) {
  char magic[sizeof CACHE_MAGIC];
  for (size_t i = 0; i < sizeof magic; i++) magic[i] = got->magic[i];
  if (memcmp(magic, CACHE_MAGIC, sizeof magic) != 0 || got->version != CACHE_VERSION ||
      got->identity != want->identity || got->unit_bytes != want->unit_bytes || got->edge_bytes != want->edge_bytes ||
      got->units != want->units || got->edges != want->edges || got->buckets != want->buckets ||
      got->entries_at != want->entries_at || got->buckets_at != want->buckets_at ||
      got->unit_data_at != want->unit_data_at || got->edge_data_at != want->edge_data_at)
    return WK_FAIL(WK_ERR_INVALID_ARG, "shared cache '/dev/shm%s' was made for another stream or configuration "
                   "(the node's ranks must use the same loader settings)", name);
  return WK_OK;
}

static WkStatus attach(WkNodeCache *c, uint64_t first_draw) {
  lock(c);
  clear_dead(c);
  for (uint32_t r = 0; r < MAX_READERS; r++) {
    if (atomic_load(&c->h->readers[r].pid) != 0) continue;
    atomic_store(&c->h->readers[r].low_water, first_draw);
    atomic_store(&c->h->readers[r].high_water, first_draw);
    atomic_store(&c->h->readers[r].started, c->started);
    atomic_store(&c->h->readers[r].pid, (int32_t)getpid());
    c->h->attached++;
    c->reader = r;
    unlock(c);
    return WK_OK;
  }
  unlock(c);
  return WK_FAIL(WK_ERR_INVALID_ARG, "%s: more than %d loaders share one node cache", c->what, MAX_READERS);
}

WkStatus wk_node_cache_open(const WkNodeCacheConfig *cfg, uint64_t first_draw, WkNodeCache **out) {
  *out = NULL;
  Header want = layout(cfg);
  if (want.units == 0)
    return WK_FAIL(WK_ERR_INVALID_ARG, "%s: a cache of %llu bytes cannot hold one unit", cfg->what,
                   (unsigned long long)cfg->budget_bytes);
  WkNodeCache *c = wk_calloc(1, sizeof *c, "node cache");
  if (!c) return wk_last_status();
  snprintf(c->what, sizeof c->what, "%s", cfg->what);
  c->layout = want;
  c->started = (uint32_t)wk_process_start_time(getpid());
  WkStatus status = wk_shared_open(cfg->shared_name, region_bytes(&want), want.unit_data_at, init_region, &want,
                                   &c->region);
  if (status == WK_OK) {
    uint8_t *base = c->region.base;
    c->h = (Header *)base;
    c->entries = (Entry *)(base + want.entries_at);
    c->bucket = (int32_t *)(base + want.buckets_at);
    c->unit_data = base + want.unit_data_at;
    c->edge_data = base + want.edge_data_at;
    status = check_layout(c->h, &want, c->region.name);
  }
  if (status == WK_OK) status = attach(c, first_draw);
  if (status == WK_OK && c->region.name[0])
    wk_logf(WK_LOG_DEBUG, "%s: node cache /dev/shm%s (%zu bytes, %s)", c->what, c->region.name, c->region.bytes,
            c->region.created ? "made here" : "joined");
  if (status != WK_OK) {
    wk_shared_close(&c->region);
    free(c);
    return wk_error_context("%s: node cache", cfg->what);
  }
  *out = c;
  return WK_OK;
}

void wk_node_cache_close(WkNodeCache *c) {
  if (!c) return;
  lock(c);
  clear_dead(c); /* a killed peer must not keep the region's name alive */
  atomic_store(&c->h->readers[c->reader].pid, 0);
  bool last = --c->h->attached == 0;
  unlock(c);
  wk_shared_wake(&c->h->lock);
  if (last) wk_shared_unlink(&c->region); /* the next loader of this job starts a fresh one */
  wk_shared_close(&c->region);
  free(c);
}

void wk_node_cache_set_low_water(WkNodeCache *c, uint64_t draw) {
  atomic_store(&c->h->readers[c->reader].low_water, draw);
  wk_shared_wake(&c->h->lock);
}

void wk_node_cache_set_high_water(WkNodeCache *c, uint64_t draw) {
  atomic_store(&c->h->readers[c->reader].high_water, draw);
}

void wk_node_cache_add_delivered(WkNodeCache *c, uint64_t bytes) { atomic_fetch_add(&c->h->delivered_bytes, bytes); }

void wk_node_cache_stats(WkNodeCache *c, WkNodeCacheStats *out) {
  lock(c);
  *out = c->h->stats;
  unlock(c);
  out->decoded_bytes = atomic_load(&c->h->decoded_bytes);
  out->delivered_bytes = atomic_load(&c->h->delivered_bytes);
  out->slots = c->layout.units;
  out->edge_slots = c->layout.edges;
}

/* ---- waiting ---------------------------------------------------------------------------------------- */

typedef struct {
  uint64_t started_ns;
  uint32_t seen;
} Wait;

/* Lock held on entry and on return. Sleeps until something changes (or a slice passes), clearing dead
 * peers; fails once the wait has lasted WAIT_LIMIT_MS. */
static WkStatus wait_for_change(WkNodeCache *c, Wait *w, const char *for_what, int32_t pid) {
  uint64_t now = wk_now_ns();
  if (w->started_ns == 0) {
    w->started_ns = now;
    c->h->stats.waits++;
  }
  if (now - w->started_ns > (uint64_t)WAIT_LIMIT_MS * 1000000ull)
    return WK_FAIL(WK_ERR_TIMEOUT, "%s: waited %d s for %s (pid %d); is a local rank stuck?", c->what,
                   WAIT_LIMIT_MS / 1000, for_what, (int)pid);
  uint32_t seen = wk_shared_generation(&c->h->lock);
  unlock(c);
  wk_shared_wait(&c->h->lock, seen, WAIT_SLICE_MS);
  lock(c);
  if (clear_dead(c)) wk_shared_wake(&c->h->lock);
  return WK_OK;
}

/* ---- units ------------------------------------------------------------------------------------------ */

static uint8_t *unit_data(WkNodeCache *c, const Entry *e) {
  return c->unit_data + (size_t)(e - c->entries) * c->layout.unit_bytes;
}

static uint8_t *edge_data(WkNodeCache *c, const Entry *e) {
  return c->edge_data + (size_t)(e - c->entries - c->layout.units) * c->layout.edge_bytes;
}

/* Lock held. Backs entry i's data with pages on its first use; on failure it goes back to the free list. */
static WkStatus back_entry(WkNodeCache *c, int32_t i) {
  Entry *e = &c->entries[i];
  if (e->backed) return WK_OK;
  bool edge = (uint32_t)i >= c->layout.units;
  uint8_t *data = edge ? edge_data(c, e) : unit_data(c, e);
  WkStatus status = wk_shared_reserve(&c->region, (size_t)(data - (uint8_t *)c->region.base),
                                      edge ? c->layout.edge_bytes : c->layout.unit_bytes);
  if (status != WK_OK) {
    push_free(c, (uint32_t)i);
    return wk_error_context("%s", c->what);
  }
  e->backed = 1;
  return WK_OK;
}

WkStatus wk_node_cache_get(WkNodeCache *c, uint64_t key, WkHold hold, WkUnitFill fill, void *ctx, uint8_t *scratch,
                           WkUnitHit *out) {
  Wait w = {0};
  key &= ~EDGE_KEY_TAG;
  lock(c);
  for (;;) {
    Entry *e = find(c, key);
    TRY_UNLOCKED(c, check_intact(c));
    if (e && e->state == ENTRY_READY) {
      if (e->hold_until < hold.until) e->hold_until = hold.until;
      if (e->hold_from > hold.from) e->hold_from = hold.from;
      *out = (WkUnitHit){.data = unit_data(c, e), .hold_until = e->hold_until, .cached = true};
      unlock(c);
      return WK_OK;
    }
    if (e) { /* LOADING by another reader of the node: wait for it */
      TRY_UNLOCKED(c, wait_for_change(c, &w, "a unit another process is decoding", e->owner));
      continue;
    }
    int32_t slot = take_entry(c, false), slowest = 0;
    TRY_UNLOCKED(c, check_intact(c));
    bool is_slowest = slot < 0 && atomic_load(&c->h->readers[c->reader].low_water) <= min_low_water(c, &slowest);
    if (is_slowest) slot = steal_unit(c); /* the node's slowest reader never waits */
    if (slot < 0) {
      if (is_slowest) {
        c->h->stats.private_decodes++;
        unlock(c);
        WK_TRY(fill(ctx, scratch));
        *out = (WkUnitHit){.data = scratch, .cached = false};
        return WK_OK;
      }
      TRY_UNLOCKED(c, wait_for_change(c, &w, "room in the node cache: the slowest local reader", slowest));
      continue;
    }
    TRY_UNLOCKED(c, back_entry(c, slot));
    e = &c->entries[slot];
    *e = (Entry){.key = key, .hold_from = hold.from, .hold_until = hold.until, .state = ENTRY_LOADING,
                 .owner = (int32_t)getpid(), .owner_started = c->started, .backed = 1};
    link_entry(c, (uint32_t)slot);
    unlock(c);
    WkStatus status = fill(ctx, unit_data(c, e));
    lock(c);
    if (status == WK_OK) {
      e->state = ENTRY_READY;
      c->h->stats.decoded_units++;
      *out = (WkUnitHit){.data = unit_data(c, e), .hold_until = e->hold_until, .cached = true};
    } else {
      unlink_entry(c, (uint32_t)slot);
      push_free(c, (uint32_t)slot);
    }
    unlock(c);
    wk_shared_wake(&c->h->lock);
    return status;
  }
}

/* ---- edges ------------------------------------------------------------------------------------------ */

void wk_node_cache_put_edge(WkNodeCache *c, uint64_t key, uint64_t hold_until, const void *data, uint32_t bytes) {
  key |= EDGE_KEY_TAG;
  if (bytes > c->layout.edge_bytes) return; /* cannot happen: edges are shorter than a sample */
  lock(c);
  Entry *e = find(c, key);
  if (e) {
    if (e->hold_until < hold_until) e->hold_until = hold_until;
  } else {
    int32_t slot = take_entry(c, true);
    if (slot < 0 || back_entry(c, slot) != WK_OK) {
      c->h->stats.edges_dropped++; /* the straddler will decode the unit again: counted, not fatal */
    } else {
      e = &c->entries[slot];
      *e = (Entry){.key = key, .hold_until = hold_until, .state = ENTRY_READY, .bytes = bytes, .backed = 1};
      memcpy(edge_data(c, e), data, bytes);
      link_entry(c, (uint32_t)slot);
      c->h->stats.edges_saved++;
    }
  }
  unlock(c);
}

bool wk_node_cache_take_edge(WkNodeCache *c, uint64_t key, void *dst, uint32_t bytes) {
  key |= EDGE_KEY_TAG;
  lock(c);
  Entry *e = find(c, key);
  bool found = e && e->bytes == bytes;
  if (found) memcpy(dst, edge_data(c, e), bytes);
  if (found) c->h->stats.edges_used++; else c->h->stats.edges_missing++;
  unlock(c);
  return found;
}

bool wk_node_cache_copy_resident(WkNodeCache *c, uint64_t key, uint64_t offset, void *dst, uint32_t bytes) {
  lock(c);
  Entry *e = find(c, key);
  bool found = e && e->state == ENTRY_READY && offset + bytes <= c->layout.unit_bytes;
  if (found) memcpy(dst, unit_data(c, e) + offset, bytes); /* under the lock: nobody reuses the slot meanwhile */
  unlock(c);
  return found;
}

void wk_node_cache_add_decoded(WkNodeCache *c, uint64_t bytes) { atomic_fetch_add(&c->h->decoded_bytes, bytes); }
