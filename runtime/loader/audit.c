/*
 * audit.c — the loader's audit file: one line per delivered sample (step, rank, row, id, epoch, hash,
 * status), appended with one write per batch.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loader.h"

/* ---- audit ------------------------------------------------------------------------------------- */

enum { AUDIT_LINE_CAPACITY = 256 };
static const char *const SAMPLE_STATUS_NAMES[] = {"ok", "skipped", "padding"};

WkStatus wk_loader_audit(WkLoader *loader, const char *path) {
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return WK_FAIL_ERRNO("open audit file", path);
  char *copy = strdup(path);
  if (!copy) {
    close(fd);
    return WK_FAIL(WK_ERR_NOMEM, "out of memory for the audit path");
  }
  if (loader->audit_fd >= 0) close(loader->audit_fd);
  free(loader->audit_path);
  loader->audit_fd = fd;
  loader->audit_path = copy;
  return WK_OK;
}

/* One write per batch of whole lines, so ranks appending to one file never split a line. */
WkStatus loader_audit_batch(WkLoader *loader, const WkBatch *batch) {
  size_t capacity = (size_t)loader->rows * AUDIT_LINE_CAPACITY, used = 0;
  char *text = wk_malloc(capacity, "audit lines");
  if (!text) return wk_last_status();
  for (uint32_t r = 0; r < loader->rows; r++) {
    WkSampleInfo info;
    wk_loader_sample_info(loader, r, &info);
    int n = snprintf(text + used, capacity - used,
                     "step=%llu micro=%u rank=%lld row=%u id=%u:%u:%llu epoch=%llu hash=%016llx status=%s\n",
                     (unsigned long long)batch->step, batch->micro_step, (long long)param(loader, WK_LOADER_RANK), r,
                     info.source, info.shard, (unsigned long long)info.offset, (unsigned long long)info.epoch,
                     (unsigned long long)info.token_hash, SAMPLE_STATUS_NAMES[info.status]);
    if (n > 0 && (size_t)n < capacity - used) used += (size_t)n;
  }
  ssize_t written = write(loader->audit_fd, text, used);
  free(text);
  if (written != (ssize_t)used) return WK_FAIL_ERRNO("write audit file", loader->audit_path);
  return WK_OK;
}
