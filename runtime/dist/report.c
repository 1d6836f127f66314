/*
 * report.c — the hang report: when a collective fails or times out, say which ranks are missing
 * and where they were, in one line.
 *
 * Every rank's progress thread posts "SEQ NAME NUMEL DTYPE SITE" of its current collective to the
 * store (comm.c; at most PROGRESS_INTERVAL_MS stale). The rank that fails reads those posts and
 * the server's view of every connection (hello, bye, or dropped without a bye) and sorts the
 * others:
 *   gone    dropped its store connection without dist:close(): killed, crashed or exited early
 *   closed  called dist:close() while we still needed it
 *   behind  alive, but its last collective is older than ours (or it started none)
 *   astray  in a collective with our sequence number that is not ours (ranks took different paths)
 * A rank that reported a failure itself is a fellow victim, not a cause. A dropped peer is often
 * seen by Gloo a moment before the store notices, so after a connection failure the picture is
 * re-read for up to REPORT_SETTLE_MS until some rank shows up gone or closed; only then (or when
 * none does) the report is written.
 *
 * The report replaces the thread's error message and keeps the backend's text at the end.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dist.h"

enum {
  REPORT_SETTLE_MS = 1000,     /* how long to wait for the store to notice a dropped peer */
  REPORT_POLL_MS = 50,
  REPORT_STORE_TIMEOUT_MS = 2000,
  REPORT_MAX_NAMED = 8,        /* ranks described in full; the rest are counted */
  REPORT_CAPACITY = 1024,
  DESCRIPTION_CAPACITY = 512
};

typedef enum { PEER_FINE = 0, PEER_GONE, PEER_CLOSED, PEER_BEHIND, PEER_ASTRAY, PEER_UNSEEN, PEER_VICTIM } PeerState;

int dist_format_progress(char *out, size_t capacity, const DistProgress *p) {
  int n = snprintf(out, capacity, "%" PRIu64 " %s %" PRId64 " %s %s", p->seq, p->name, p->numel, wk_dtype_name(p->dtype),
                   p->site && *p->site ? p->site : "-");
  return n < 0 ? 0 : n >= (int)capacity ? (int)capacity - 1 : n;
}

/* "all_reduce #42 (1000 f32) at recipe.lua:31" */
static void describe(char *out, size_t capacity, uint64_t seq, const char *name, int64_t numel, const char *dtype,
                     const char *site) {
  int n = snprintf(out, capacity, "%s #%" PRIu64, name, seq);
  if (n < 0 || (size_t)n >= capacity) return;
  if (strcmp(name, "barrier") != 0) n += snprintf(out + n, capacity - (size_t)n, " (%" PRId64 " %s)", numel, dtype);
  if ((size_t)n < capacity && site && *site && strcmp(site, "-") != 0) snprintf(out + n, capacity - (size_t)n, " at %s", site);
}

typedef struct {
  bool posted;
  uint64_t seq;
  char name[32], dtype[16];
  int64_t numel;
  char site[256];
} Posted;

static void read_posted(WkStore *store, int rank, Posted *p) {
  char key[sizeof DIST_PROGRESS_KEY + 16];
  snprintf(key, sizeof key, DIST_PROGRESS_KEY "%d", rank);
  memset(p, 0, sizeof *p);
  uint8_t *value;
  size_t length;
  if (store_get_alloc(store, key, 0, &value, &length) != WK_OK) return;
  unsigned long long seq;
  long long numel;
  int site_at = 0;
  if (sscanf((const char *)value, "%llu %31s %lld %15s %n", &seq, p->name, &numel, p->dtype, &site_at) == 4 && site_at > 0) {
    p->posted = true;
    p->seq = seq;
    p->numel = numel;
    snprintf(p->site, sizeof p->site, "%s", (const char *)value + site_at);
  }
  free(value);
}

static bool has_failed(WkStore *store, int rank) {
  char key[sizeof DIST_FAILED_KEY + 16];
  snprintf(key, sizeof key, DIST_FAILED_KEY "%d", rank);
  uint8_t *value;
  size_t length;
  if (store_get_alloc(store, key, 0, &value, &length) != WK_OK) return false;
  free(value);
  return true;
}

/* A rank in another collective than ours is a cause even when its own collective failed too. */
static PeerState classify(uint8_t server_state, bool failed, const Posted *p, const DistProgress *current) {
  bool same_seq = p->posted && p->seq == current->seq;
  if (same_seq && (strcmp(p->name, current->name) != 0 || p->numel != current->numel ||
                   strcmp(p->dtype, wk_dtype_name(current->dtype)) != 0))
    return PEER_ASTRAY;
  if (failed) return PEER_VICTIM;
  if (server_state == STORE_RANK_LOST) return PEER_GONE;
  if (server_state == STORE_RANK_CLOSED) return PEER_CLOSED;
  if (server_state == STORE_RANK_UNSEEN) return PEER_UNSEEN;
  if (!p->posted || p->seq < current->seq) return PEER_BEHIND;
  return PEER_FINE;
}

static void describe_peer(char *out, size_t capacity, int rank, PeerState state, const Posted *p) {
  char last[DESCRIPTION_CAPACITY] = "";
  if (p->posted) describe(last, sizeof last, p->seq, p->name, p->numel, p->dtype, p->site);
  switch (state) {
    case PEER_GONE:
      snprintf(out, capacity, "rank %d left without dist:close() (killed, crashed or exited early)%s%s", rank,
               p->posted ? " after entering " : " before any collective", last);
      break;
    case PEER_CLOSED:
      snprintf(out, capacity, "rank %d called dist:close()%s%s", rank, p->posted ? " after " : " before any collective", last);
      break;
    case PEER_BEHIND:
      if (p->posted) snprintf(out, capacity, "rank %d is behind, last in %s", rank, last);
      else snprintf(out, capacity, "rank %d has not reached any collective", rank);
      break;
    case PEER_ASTRAY: snprintf(out, capacity, "rank %d is in a different collective, %s", rank, last); break;
    case PEER_UNSEEN: snprintf(out, capacity, "rank %d never connected to the store", rank); break;
    default: out[0] = '\0';
  }
}

/* A peer that dropped or closed is a cause; one merely behind may only be late to post its
 * progress. So when some rank is gone, a connection failure names only the gone ones; a timeout
 * names everyone who is not where we are. */
static bool is_cause(PeerState state, bool any_gone, bool timed_out) {
  if (state == PEER_FINE || state == PEER_VICTIM) return false;
  if (timed_out || !any_gone) return true;
  return state == PEER_GONE || state == PEER_CLOSED || state == PEER_UNSEEN;
}

/* Fills the list of missing ranks; returns how many, or -1 when the store cannot be asked. */
static int find_missing(WkStore *store, int rank, int world_size, const DistProgress *current, bool timed_out,
                        char *list, size_t capacity, int *victims, bool *any_gone_out) {
  uint8_t *states = malloc((size_t)world_size);
  Posted *posted = malloc((size_t)world_size * sizeof *posted);
  PeerState *peers = malloc((size_t)world_size * sizeof *peers);
  int missing = -1;
  if (!states || !posted || !peers ||
      store_rank_states(store, states, (uint32_t)world_size, REPORT_STORE_TIMEOUT_MS) != WK_OK)
    goto done;
  bool any_gone = false;
  *victims = 0;
  for (int r = 0; r < world_size; r++) {
    peers[r] = PEER_FINE;
    if (r == rank) continue;
    read_posted(store, r, &posted[r]);
    peers[r] = classify(states[r], has_failed(store, r), &posted[r], current);
    any_gone |= peers[r] == PEER_GONE || peers[r] == PEER_CLOSED || peers[r] == PEER_UNSEEN;
    if (peers[r] == PEER_VICTIM) (*victims)++;
  }
  *any_gone_out = any_gone;
  missing = 0;
  size_t used = 0;
  list[0] = '\0';
  for (int r = 0; r < world_size; r++) {
    if (!is_cause(peers[r], any_gone, timed_out)) continue;
    if (missing++ < REPORT_MAX_NAMED && used < capacity) {
      char one[DESCRIPTION_CAPACITY];
      describe_peer(one, sizeof one, r, peers[r], &posted[r]);
      int n = snprintf(list + used, capacity - used, "%s%s", used ? "; " : "", one);
      if (n > 0) used += (size_t)n;
    }
  }
  if (missing > REPORT_MAX_NAMED && used < capacity)
    snprintf(list + used, capacity - used, "; and %d more", missing - REPORT_MAX_NAMED);
done:
  free(states);
  free(posted);
  free(peers);
  return missing;
}

WkStatus dist_report_failure(WkStore *store, int rank, int world_size, const DistProgress *current,
                             uint64_t elapsed_ns) {
  WkStatus status = wk_last_status();
  char backend[REPORT_CAPACITY];
  snprintf(backend, sizeof backend, "%s", wk_last_error());
  char key[sizeof DIST_FAILED_KEY + 16], mark[32];
  snprintf(key, sizeof key, DIST_FAILED_KEY "%d", rank);
  int mark_length = snprintf(mark, sizeof mark, "%" PRIu64, current->seq);
  store_post(store, key, mark, (size_t)mark_length); /* lets the others tell a victim from a cause */

  char list[REPORT_CAPACITY];
  int victims = 0, missing;
  int64_t settle = net_deadline(REPORT_SETTLE_MS);
  bool timed_out = status == WK_ERR_TIMEOUT, any_gone = false;
  /* A dropped connection means some peer went away: wait for the store to see which one. */
  while ((missing = find_missing(store, rank, world_size, current, timed_out, list, sizeof list, &victims,
                                 &any_gone)) >= 0 &&
         (missing == 0 || (!timed_out && !any_gone)) && net_remaining(settle) > 0)
    usleep(REPORT_POLL_MS * 1000);

  char what[DESCRIPTION_CAPACITY];
  describe(what, sizeof what, current->seq, current->name, current->numel, wk_dtype_name(current->dtype), current->site);
  const char *how = timed_out ? "timed out" : "failed";
  double seconds = (double)elapsed_ns * 1e-9;
  if (missing < 0) {
    return WK_FAIL(WK_ERR_NETWORK, "rank %d: %s %s after %.1f s: rank 0 is missing (the store it serves is "
                   "unreachable: it was killed, crashed or exited early) [%.300s]", rank, what, how, seconds, backend);
  }
  if (missing == 0) {
    return WK_FAIL(status, "rank %d: %s %s after %.1f s, yet every rank reached it%s [%s]", rank, what, how, seconds,
                   victims ? " (some failed as well)" : "", backend);
  }
  return WK_FAIL(status == WK_ERR_TIMEOUT ? WK_ERR_TIMEOUT : WK_ERR_NETWORK, "rank %d: %s %s after %.1f s waiting "
                 "for %d rank%s: %s [%.300s]", rank, what, how, seconds, missing, missing == 1 ? "" : "s", list, backend);
}
