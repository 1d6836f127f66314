/*
 * remote_input.c — converter inputs at http://, https:// and s3:// locations, read through the remote
 * layer (runtime/data/remote): the same fetch engine, retries, timeouts and S3 signing as remote
 * datasets. An input is one object; its size comes from the server (a one-byte Range request), then
 * the converter reads it by range as it cuts it (in its chunks, never a whole download first).
 * Nothing is cached: each byte of an input is read once.
 *
 * Not here: listing (an s3://bucket/prefix/ of many objects is not expanded; name the objects), the
 * input kinds (convert_input.c, by the name's suffix, as for local files).
 */
#include <stdlib.h>
#include <string.h>

#include "../remote/remote.h"
#include "convert.h"

enum { INPUTS_FIRST_CAPACITY = 64 };

WkStatus convert_add_remote_input(WkRemote **remote, const char *location, Input **inputs, size_t *count,
                                  size_t *capacity) {
  if (!*remote) WK_TRY(wk_remote_open(NULL, remote));
  uint64_t size = 0;
  WK_TRY(wk_remote_object_size(*remote, location, &size));
  if (*count == *capacity) {
    size_t grown_capacity = *capacity ? *capacity * 2 : INPUTS_FIRST_CAPACITY;
    Input *grown = realloc(*inputs, grown_capacity * sizeof *grown);
    if (!grown) return WK_FAIL(WK_ERR_NOMEM, "out of memory listing inputs");
    *inputs = grown;
    *capacity = grown_capacity;
  }
  char *copy = strdup(location);
  if (!copy) return WK_FAIL(WK_ERR_NOMEM, "out of memory listing inputs");
  (*inputs)[(*count)++] = (Input){.path = copy, .kind = convert_input_kind(location), .size = size, .remote = *remote};
  return WK_OK;
}

WkBlob *convert_open_input(const Input *in) {
  if (!in->remote) return wk_blob_open_file(in->path);
  return wk_remote_blob_open(in->remote, in->path, in->size, NULL);
}

void convert_remote_close(WkRemote *remote) { wk_remote_close(remote); }
