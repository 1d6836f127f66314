/*
 * world.c — who this process is in the job, from the environment its launcher left.
 *
 * torchrun (and `run --nproc-per-node`) sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
 * MASTER_ADDR and MASTER_PORT; a hand-made launch may set only the first two plus the master
 * (then the job is taken to be on one node: local rank = rank). SLURM's srun sets SLURM_PROCID,
 * SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_TASKS_PER_NODE and SLURM_JOB_NODELIST; the
 * store then lives on the first host of the node list at MASTER_PORT or 29500. torchrun's
 * variables win when both are there (srun torchrun ...). With neither, the process is alone:
 * a world of 1, which never opens a socket.
 *
 * Every value is checked: integral, in range, consistent with the others; a bad one is an error
 * naming the variable, never a guess.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist.h"

enum { DEFAULT_MASTER_PORT = 29500, MAX_PORT = 65535 };

/* *present = whether the variable is set; a set one must be an integer in [min, max]. */
static WkStatus env_int(const char *name, long min, long max, bool *present, int32_t *out) {
  const char *text = getenv(name);
  *present = text != NULL;
  if (!text) return WK_OK;
  char *end;
  errno = 0;
  long v = strtol(text, &end, 10);
  if (*text == '\0' || *end != '\0' || errno || v < min || v > max)
    return WK_FAIL(WK_ERR_INVALID_ARG, "%s='%s' must be an integer from %ld to %ld", name, text, min, max);
  *out = (int32_t)v;
  return WK_OK;
}

static WkStatus require_int(const char *name, long min, long max, const char *because, int32_t *out) {
  bool present;
  WK_TRY(env_int(name, min, max, &present, out));
  if (!present) return WK_FAIL(WK_ERR_INVALID_ARG, "%s is not set, but %s", name, because);
  return WK_OK;
}

static WkStatus set_master_addr(WkWorld *w, const char *host, const char *name) {
  size_t length = strlen(host);
  if (length == 0 || length >= sizeof w->master_addr)
    return WK_FAIL(WK_ERR_INVALID_ARG, "%s must be a host name of 1..%zu characters", name, sizeof w->master_addr - 1);
  memcpy(w->master_addr, host, length + 1);
  return WK_OK;
}

static WkStatus master_port(WkWorld *w, bool required, const char *because) {
  bool present;
  WK_TRY(env_int("MASTER_PORT", 1, MAX_PORT, &present, &w->master_port));
  if (present) return WK_OK;
  if (required) return WK_FAIL(WK_ERR_INVALID_ARG, "MASTER_PORT is not set, but %s", because);
  w->master_port = DEFAULT_MASTER_PORT;
  return WK_OK;
}

static WkStatus check_ranks(const WkWorld *w, const char *rank_name, const char *local_name) {
  if (w->rank >= w->world_size)
    return WK_FAIL(WK_ERR_INVALID_ARG, "%s=%d is not below the world size %d", rank_name, w->rank, w->world_size);
  if (w->local_world_size > w->world_size || w->local_rank >= w->local_world_size)
    return WK_FAIL(WK_ERR_INVALID_ARG, "%s=%d with %d local ranks (world %d) is inconsistent", local_name,
                   w->local_rank, w->local_world_size, w->world_size);
  return WK_OK;
}

static WkStatus from_torchrun(WkWorld *w) {
  const char *because = "RANK or WORLD_SIZE is (torchrun-style launch)";
  WK_TRY(require_int("RANK", 0, WK_DIST_MAX_WORLD - 1, because, &w->rank));
  WK_TRY(require_int("WORLD_SIZE", 1, WK_DIST_MAX_WORLD, because, &w->world_size));
  bool has_local, has_local_world;
  w->local_rank = w->rank;
  w->local_world_size = w->world_size;
  WK_TRY(env_int("LOCAL_RANK", 0, WK_DIST_MAX_WORLD - 1, &has_local, &w->local_rank));
  WK_TRY(env_int("LOCAL_WORLD_SIZE", 1, WK_DIST_MAX_WORLD, &has_local_world, &w->local_world_size));
  if (has_local != has_local_world)
    return WK_FAIL(WK_ERR_INVALID_ARG, "LOCAL_RANK and LOCAL_WORLD_SIZE must be set together");
  w->source = WK_WORLD_TORCHRUN;
  WK_TRY(check_ranks(w, "RANK", "LOCAL_RANK"));
  if (w->world_size == 1) return WK_OK;
  const char *addr = getenv("MASTER_ADDR");
  if (!addr) return WK_FAIL(WK_ERR_INVALID_ARG, "MASTER_ADDR is not set, but WORLD_SIZE=%d needs rank 0's host", w->world_size);
  WK_TRY(set_master_addr(w, addr, "MASTER_ADDR"));
  return master_port(w, true, "a job of several ranks needs the rendezvous port");
}

/* SLURM_TASKS_PER_NODE: "4(x2),3" = 4 tasks on each of 2 nodes, then 3 on the next. */
static WkStatus slurm_tasks_on_node(const char *text, int32_t node, int32_t *out) {
  const char *p = text;
  int32_t index = 0;
  while (*p) {
    char *end;
    errno = 0;
    long tasks = strtol(p, &end, 10), repeat = 1;
    if (end == p || tasks < 1 || tasks > WK_DIST_MAX_WORLD || errno) break;
    p = end;
    if (*p == '(') {
      if (p[1] != 'x') break;
      repeat = strtol(p + 2, &end, 10);
      if (end == p + 2 || *end != ')' || repeat < 1 || repeat > WK_DIST_MAX_WORLD) break;
      p = end + 1;
    }
    if (node < index + repeat) {
      *out = (int32_t)tasks;
      return WK_OK;
    }
    index += (int32_t)repeat;
    if (*p == ',') p++;
    else if (*p) break;
  }
  return WK_FAIL(WK_ERR_INVALID_ARG, "SLURM_TASKS_PER_NODE='%s' does not give a task count for node %d", text, node);
}

static WkStatus from_slurm(WkWorld *w) {
  const char *because = "SLURM_PROCID is (a task launched by srun)";
  WK_TRY(require_int("SLURM_PROCID", 0, WK_DIST_MAX_WORLD - 1, because, &w->rank));
  WK_TRY(require_int("SLURM_NTASKS", 1, WK_DIST_MAX_WORLD, because, &w->world_size));
  WK_TRY(require_int("SLURM_LOCALID", 0, WK_DIST_MAX_WORLD - 1, because, &w->local_rank));
  bool present;
  int32_t node = 0;
  WK_TRY(env_int("SLURM_NODEID", 0, WK_DIST_MAX_WORLD - 1, &present, &node));
  WK_TRY(env_int("SLURM_NTASKS_PER_NODE", 1, WK_DIST_MAX_WORLD, &present, &w->local_world_size));
  if (!present) {
    const char *per_node = getenv("SLURM_TASKS_PER_NODE");
    if (!per_node) return WK_FAIL(WK_ERR_INVALID_ARG, "SLURM_TASKS_PER_NODE is not set, but %s", because);
    WK_TRY(slurm_tasks_on_node(per_node, node, &w->local_world_size));
  }
  w->source = WK_WORLD_SLURM;
  WK_TRY(check_ranks(w, "SLURM_PROCID", "SLURM_LOCALID"));
  if (w->world_size == 1) return WK_OK;
  const char *addr = getenv("MASTER_ADDR");
  if (addr) {
    WK_TRY(set_master_addr(w, addr, "MASTER_ADDR"));
  } else {
    const char *nodes = getenv("SLURM_JOB_NODELIST");
    if (!nodes) nodes = getenv("SLURM_NODELIST");
    if (!nodes) return WK_FAIL(WK_ERR_INVALID_ARG, "SLURM_JOB_NODELIST is not set (nor MASTER_ADDR), but %s", because);
    if (world_first_slurm_host(nodes, w->master_addr, sizeof w->master_addr) != WK_OK)
      return wk_error_context("SLURM_JOB_NODELIST");
  }
  return master_port(w, false, NULL);
}

WkStatus wk_world_from_env(WkWorld *out) {
  if (!out) return WK_FAIL(WK_ERR_INVALID_ARG, "wk_world_from_env: out is NULL");
  *out = (WkWorld){.world_size = 1, .local_world_size = 1, .source = WK_WORLD_SINGLE};
  WkWorld w = *out;
  WkStatus st = WK_OK;
  if (getenv("RANK") || getenv("WORLD_SIZE")) st = from_torchrun(&w);
  else if (getenv("SLURM_PROCID")) st = from_slurm(&w);
  if (st == WK_OK) *out = w;
  return st;
}

/* ---- SLURM node lists ----------------------------------------------------------------------------
 * "node07", "gpu[07-09,12],cpu3", "rack[1-2]-n[01-04]": a comma-separated list of names, where a
 * bracket holds comma-separated numbers or ranges. The first host takes the first number of each
 * bracket of the first name, as written (zero padding kept). */

static bool is_name_char(char c) { return isalnum((unsigned char)c) || c == '-' || c == '_' || c == '.'; }

/* Checks "[a-b,c,...]" at *p (past the '['); copies the first number; leaves *p past the ']'. */
static bool bracket(const char **p, char *out, size_t capacity, size_t *length) {
  const char *s = *p;
  bool first = true;
  for (;;) {
    const char *lo = s;
    while (isdigit((unsigned char)*s)) s++;
    if (s == lo) return false;
    if (first) {
      size_t n = (size_t)(s - lo);
      if (*length + n >= capacity) return false;
      memcpy(out + *length, lo, n);
      *length += n;
      first = false;
    }
    if (*s == '-') {
      const char *hi = ++s;
      while (isdigit((unsigned char)*s)) s++;
      if (s == hi) return false;
    }
    if (*s == ']') break;
    if (*s != ',') return false;
    s++;
  }
  *p = s + 1;
  return true;
}

WkStatus world_first_slurm_host(const char *nodelist, char *out, size_t capacity) {
  if (!nodelist || capacity == 0) return WK_FAIL(WK_ERR_INVALID_ARG, "first SLURM host: no node list or no room");
  size_t length = 0;
  const char *p = nodelist;
  bool ok = *p != '\0' && *p != ',';
  while (ok && *p && *p != ',') {
    if (*p == '[') {
      p++;
      ok = bracket(&p, out, capacity, &length);
    } else if (is_name_char(*p)) {
      ok = length + 1 < capacity;
      if (ok) out[length++] = *p++;
    } else {
      ok = false;
    }
  }
  out[ok ? length : 0] = '\0';
  if (!ok || length == 0)
    return WK_FAIL(WK_ERR_FORMAT, "'%.200s' is not a SLURM node list like 'gpu[01-04,07],cpu3' (or the first "
                   "host is longer than %zu characters)", nodelist, capacity - 1);
  return WK_OK;
}
