/*
 * remote_index.c — a remote dataset's index.json, fetched once per node and job through the disk cache:
 * the first local rank asks the server (conditionally, when a copy is cached) and stores the answer
 * with its hash and validators; the others read that entry (remote.h: Index).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "remote_context.h"

static const char INDEX_MAGIC[] = "wick-index 1";
static const char NO_VALUE[] = "-";

/* ---- the index ------------------------------------------------------------------------------------ */

typedef struct {
  char hash[33], etag[WK_REMOTE_VALIDATOR_CAPACITY], modified[WK_REMOTE_VALIDATOR_CAPACITY], job[JOB_CAPACITY];
  char *body;
  size_t length;
} IndexEntry;

/* Reads and checks a cached index (its body's hash); false when absent or damaged. */
static bool index_load(WkRemote *r, const char *key, IndexEntry *e) {
  memset(e, 0, sizeof *e);
  uint64_t size = 0;
  int fd = wk_disk_cache_open_entry(r->disk, key, &size);
  if (fd < 0) return false;
  char *text = size < SIZE_MAX ? malloc((size_t)size + 1) : NULL;
  bool ok = text && remote_read_fully(fd, 0, text, (size_t)size, key) == WK_OK;
  close(fd);
  if (!ok) {
    free(text);
    return false;
  }
  text[size] = '\0';
  char *fields[INDEX_HEADER_LINES], *at = text;
  for (int i = 0; i < INDEX_HEADER_LINES && ok; i++) {
    char *nl = strchr(at, '\n');
    if (!nl) ok = false;
    else {
      *nl = '\0';
      fields[i] = at;
      at = nl + 1;
    }
  }
  ok = ok && strcmp(fields[0], INDEX_MAGIC) == 0 && *at == '\n' && strncmp(fields[1], "hash ", 5) == 0 &&
       strncmp(fields[2], "etag ", 5) == 0 && strncmp(fields[3], "modified ", 9) == 0 &&
       strncmp(fields[4], "job ", 4) == 0;
  if (ok) {
    at++;
    e->length = (size_t)(text + size - at);
    char actual[33];
    wk_hash_hex128(at, e->length, actual);
    ok = strcmp(actual, fields[1] + 5) == 0;
    snprintf(e->hash, sizeof e->hash, "%s", actual);
    snprintf(e->etag, sizeof e->etag, "%s", strcmp(fields[2] + 5, NO_VALUE) ? fields[2] + 5 : "");
    snprintf(e->modified, sizeof e->modified, "%s", strcmp(fields[3] + 9, NO_VALUE) ? fields[3] + 9 : "");
    snprintf(e->job, sizeof e->job, "%s", strcmp(fields[4] + 4, NO_VALUE) ? fields[4] + 4 : "");
  }
  if (ok) {
    e->body = malloc(e->length + 1);
    ok = e->body != NULL;
    if (ok) {
      memcpy(e->body, at, e->length);
      e->body[e->length] = '\0';
    }
  }
  free(text);
  return ok;
}

static void index_save(WkRemote *r, const char *key, const IndexEntry *e) {
  size_t header = sizeof INDEX_MAGIC + 64 + strlen(e->hash) + strlen(e->etag) + strlen(e->modified) + strlen(e->job);
  char *text = malloc(header + e->length);
  if (!text) return; /* a cache: the next run fetches it again */
  int n = snprintf(text, header, "%s\nhash %s\netag %s\nmodified %s\njob %s\n\n", INDEX_MAGIC, e->hash,
                   e->etag[0] ? e->etag : NO_VALUE, e->modified[0] ? e->modified : NO_VALUE,
                   e->job[0] ? e->job : NO_VALUE);
  memcpy(text + n, e->body, e->length);
  bool stored = false;
  if (wk_disk_cache_store(r->disk, key, text, (uint64_t)n + e->length, true, true, &stored) != WK_OK)
    wk_logf(WK_LOG_WARN, "could not cache the index: %s", wk_last_error());
  free(text);
}

/* With the index entry's claim held: the index, from the cache when this job checked it already, else
 * by a (conditional) request. */
static WkStatus index_get(WkRemote *r, const Target *t, const char *key, uint64_t max_bytes, IndexEntry *e) {
  bool cached = index_load(r, key, e);
  if (cached && r->has_job && strcmp(e->job, r->job) == 0) return WK_OK;
  WkFetchRequest request = {.target = &t->target, .whole = true, .max_bytes = max_bytes,
                            .if_none_match = cached && e->etag[0] ? e->etag : NULL,
                            .if_modified_since = cached && e->modified[0] ? e->modified : NULL};
  WkStatus status = wk_fetch_run(r->fetch, &request);
  if (status != WK_OK) {
    /* Gone (404) or refused (403) is an answer; anything else leaves the cached copy as good as it was. */
    bool answered = request.http_status >= 400 && request.http_status < 500;
    if (cached && !answered) {
      wk_logf(WK_LOG_WARN, "using the cached index of '%s': the server could not be asked (%s)", t->target.name,
              request.error);
      return WK_OK;
    }
    free(e->body);
    e->body = NULL;
    return WK_FAIL(status, "%s", request.error);
  }
  if (!request.not_modified) {
    free(e->body);
    e->body = (char *)request.body;
    e->length = (size_t)request.body_length;
    wk_hash_hex128(e->body, e->length, e->hash);
    snprintf(e->etag, sizeof e->etag, "%s", request.etag);
    snprintf(e->modified, sizeof e->modified, "%s", request.last_modified);
  } else if (!cached) {
    return WK_FAIL(WK_ERR_NETWORK, "'%s': the server answered 304 Not Modified to an unconditional request",
                   t->target.name);
  }
  const char *job = r->has_job ? r->job : "";
  if (!request.not_modified || strcmp(e->job, job) != 0) {
    snprintf(e->job, sizeof e->job, "%s", job);
    index_save(r, key, e);
  }
  return WK_OK;
}

WkStatus wk_remote_fetch_index(WkRemote *r, const char *location, uint64_t max_bytes, char **text, size_t *length,
                               char identity[33]) {
  *text = NULL;
  Target *t = NULL;
  WK_TRY(remote_target_new(r, location, WK_FETCH_SIZE_UNKNOWN, &t));
  char name_hash[33], key[KEY_CAPACITY];
  wk_hash_hex128(location, strlen(location), name_hash);
  snprintf(key, sizeof key, "index/%s", name_hash);
  uint64_t deadline = wk_now_ns() + r->patience_ns;
  WkStatus status = WK_OK;
  IndexEntry e = {0};
  for (;;) {
    WkDiskClaim claim;
    bool owned = false;
    status = wk_disk_cache_claim(r->disk, key, &claim, &owned);
    if (status != WK_OK) break;
    if (owned) {
      status = index_get(r, t, key, max_bytes, &e);
      wk_disk_cache_release(r->disk, &claim);
      break;
    }
    if (!wk_disk_cache_wait(r->disk, key, deadline)) { /* the holder is stuck: ask the server ourselves */
      status = index_get(r, t, key, max_bytes, &e);
      break;
    }
  }
  remote_target_unref(r, t);
  if (status != WK_OK) return status;
  *text = e.body;
  *length = e.length;
  snprintf(identity, 33, "%s", e.hash);
  return WK_OK;
}
