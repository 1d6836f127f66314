/*
 * runtime/io — byte sources: a named run of bytes read by range, from a local file or a server.
 *
 * Owns: WkBlob and the local file blob (blob.c); remote blobs in remote/ (HTTP(S) and S3 objects read
 * by range through a node-shared disk cache, with retries, deadlines and transfer limits; remote.h).
 * Does not own what the bytes mean: shards are runtime/format/, datasets runtime/dataset/.
 *
 * Layer: above core/ only (runtime/LAYERS). This header is the contract the layers above read bytes
 * through; the FFI-visible remote options are in wick.h.
 */
#ifndef WK_IO_BLOB_H
#define WK_IO_BLOB_H

#include "../core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- blobs ------------------------------------------------------------------------------ */

/* Anything that can serve byte ranges: a local file (pread, mmap), later HTTP and S3 objects.
 * Implementations must be safe to call read_at from several threads at once. */
typedef struct WkBlob WkBlob;
typedef enum { WK_ADVICE_WILLNEED = 0, WK_ADVICE_DONTNEED = 1 } WkAdvice;
struct WkBlob {
  const char *name;  /* path or URL, used in every error message */
  uint64_t size;     /* total bytes */
  /* Reads exactly length bytes at offset into dst; a short read is WK_ERR_FORMAT ("truncated"). */
  WkStatus (*read_at)(WkBlob *self, uint64_t offset, size_t length, void *dst);
  /* Zero-copy view of [offset, offset+length) or NULL when the source cannot map (remote). */
  const void *(*map)(WkBlob *self, uint64_t offset, size_t length);
  /* A hint about [offset, offset+length): soon needed (read ahead) or done with (let its pages go, so
   * resident memory does not grow with what has been read). Never fails; a source may ignore it. */
  void (*advise)(WkBlob *self, uint64_t offset, uint64_t length, WkAdvice advice);
  /* Drops any cached copy of [offset, offset+length), found corrupt, so the next read fetches it from
   * its origin. NULL for sources that are their own origin (local files). */
  void (*forget)(WkBlob *self, uint64_t offset, uint64_t length);
  void (*close)(WkBlob *self);
};

/* Opens a local regular file; anything else (a FIFO, device, directory, socket) is refused before a
 * byte is read, with what it is ("'x' is a FIFO (named pipe), not a regular file"). */
WkBlob *wk_blob_open_file(const char *path);
/* Opens a local location: a path or file://path. http://, https:// and s3:// are opened through a
 * remote context (remote/remote.h: wk_remote_blob_open), which the dataset owns. */
WkBlob *wk_blob_open(const char *location);
bool wk_blob_is_remote(const char *location);

#ifdef __cplusplus
}
#endif
#endif /* WK_IO_BLOB_H */
