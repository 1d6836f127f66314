/*
 * blob.c — WkBlob, a named run of bytes read by range: a local file here (pread for copies, one
 * read-only mmap for zero-copy views); HTTP resources and S3 objects are the same struct (NULL from
 * map), made by remote/remote.c. wk_blob_open opens local locations (a path or file://).
 *
 * The mapping covers the whole file and lives as long as the blob; the kernel pages it in on demand,
 * so what it holds resident is page cache the kernel may drop, not heap.
 *
 * Only regular files are opened: the file is opened without blocking and checked before anything is
 * read, because open(2) on a FIFO waits for a writer forever and a device or directory is no dataset.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>  /* mmap, munmap */
#include <unistd.h>    /* pread, close */

#include "blob.h"

typedef struct {
  WkBlob base;
  int fd;
  void *mapping;  /* NULL for an empty file or when mmap failed (reads then use pread) */
  char *path;
} FileBlob;

static WkStatus file_read_at(WkBlob *self, uint64_t offset, size_t length, void *dst) {
  FileBlob *fs = (FileBlob *)self;
  if (offset > self->size || length > self->size - offset)
    return WK_FAIL(WK_ERR_FORMAT, "'%s': read of %zu bytes at offset %llu runs past the end (%llu bytes; file truncated?)",
                   self->name, length, (unsigned long long)offset, (unsigned long long)self->size);
  /* pread even when mapped: a copy through the mapping would leave its pages resident. */
  size_t done = 0;
  while (done < length) {
    ssize_t n = pread(fs->fd, (char *)dst + done, length - done, (off_t)(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return WK_FAIL_ERRNO("read", self->name);
    if (n == 0)
      return WK_FAIL(WK_ERR_FORMAT, "'%s': file ends at %llu, expected %llu bytes (file truncated?)", self->name,
                     (unsigned long long)(offset + done), (unsigned long long)self->size);
    done += (size_t)n;
  }
  return WK_OK;
}

static const void *file_map(WkBlob *self, uint64_t offset, size_t length) {
  FileBlob *fs = (FileBlob *)self;
  if (!fs->mapping || offset > self->size || length > self->size - offset) return NULL;
  return (const char *)fs->mapping + offset;
}

/* madvise on the mapping, widened to whole pages: DONTNEED unmaps them from this process (they stay in
 * the page cache, shared with the node's other readers), WILLNEED starts reading them in. */
static void file_advise(WkBlob *self, uint64_t offset, uint64_t length, WkAdvice advice) {
  FileBlob *fs = (FileBlob *)self;
  if (!fs->mapping || offset >= self->size || length == 0) return;
  if (length > self->size - offset) length = self->size - offset;
  uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
  uint64_t first = offset / page * page, end = offset + length;
  if (madvise((char *)fs->mapping + first, (size_t)(end - first), advice == WK_ADVICE_DONTNEED ? MADV_DONTNEED : MADV_WILLNEED) != 0)
    wk_logf(WK_LOG_DEBUG, "madvise on '%s' [%llu, +%llu) failed: %s (a hint; reads are unaffected)", self->name,
            (unsigned long long)first, (unsigned long long)(end - first), strerror(errno));
}

static void file_close(WkBlob *self) {
  FileBlob *fs = (FileBlob *)self;
  if (!fs) return;
  if (fs->mapping) munmap(fs->mapping, (size_t)self->size);
  if (fs->fd >= 0) close(fs->fd);
  free(fs->path);
  free(fs);
}

WkBlob *wk_blob_open_file(const char *path) {
  FileBlob *fs = wk_calloc(1, sizeof *fs, "file source");
  if (!fs) return NULL;
  fs->fd = -1;
  fs->path = strdup(path);
  if (!fs->path) {
    WK_FAIL(WK_ERR_NOMEM, "out of memory copying path '%s'", path);
    free(fs);
    return NULL;
  }
  fs->base.name = fs->path;
  fs->base.read_at = file_read_at;
  fs->base.map = file_map;
  fs->base.advise = file_advise;
  fs->base.close = file_close;
  if (wk_open_regular(path, "datasets and converter inputs", &fs->fd, &fs->base.size) != WK_OK) {
    file_close(&fs->base);
    return NULL;
  }
  if (fs->base.size > 0) {
    /* Not MAP_POPULATE: that reads the whole file at open (8.7 ms and +135 MB of RSS for a 136 MB
     * shard, before the first sample) and makes resident memory grow with open shards x shard size.
     * Pages come in per block instead: the reader hashes a raw block in full the first time it
     * touches it (fault-around maps 16 pages per fault), so later samples in it do not fault. */
    void *m = mmap(NULL, (size_t)fs->base.size, PROT_READ, MAP_SHARED, fs->fd, 0);
    /* No mapping is not an error: reads fall back to pread, zero-copy callers to copies. */
    fs->mapping = m == MAP_FAILED ? NULL : m;
  }
  return &fs->base;
}

/* ---- by location ------------------------------------------------------------------------------- */

bool wk_blob_is_remote(const char *location) {
  return strncmp(location, "http://", 7) == 0 || strncmp(location, "https://", 8) == 0 ||
         strncmp(location, "s3://", 5) == 0;
}

WkBlob *wk_blob_open(const char *location) {
  if (!location) {
    WK_FAIL(WK_ERR_INVALID_ARG, "wk_blob_open: location is NULL");
    return NULL;
  }
  if (wk_blob_is_remote(location)) {
    WK_FAIL(WK_ERR_INTERNAL, "'%s': a remote location is opened through a remote context (remote/remote.h), "
            "not as a local blob", location);
    return NULL;
  }
  if (strncmp(location, "file://", 7) == 0) location += 7;
  return wk_blob_open_file(location);
}
