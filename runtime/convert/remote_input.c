/*
 * remote_input.c — converter inputs at http://, https:// and s3:// locations, read through the remote
 * layer (runtime/io/remote): the same fetch engine, retries, timeouts and S3 signing as remote
 * datasets. An input is one object; its size comes from the server (a one-byte Range request), then
 * the converter reads it by range as it cuts it (in its chunks, never a whole download first).
 * Nothing is cached: each byte of an input is read once.
 *
 * An s3://bucket/prefix/ (ending in '/') is like a directory: every object under it (ListObjectsV2,
 * byte-wise sorted, as a directory walk sorts), hidden names and names no include pattern matches
 * skipped, each with the size the listing gives. Not here: the input kinds (convert_input.c, by the
 * name's suffix, as for local files).
 */
#include <stdlib.h>
#include <string.h>

#include "../io/remote/remote.h"
#include "convert.h"

enum { INPUTS_FIRST_CAPACITY = 64 };
static const char S3_SCHEME[] = "s3://";

static WkStatus add_input(WkRemote *remote, char *location, uint64_t size, Input **inputs, size_t *count,
                          size_t *capacity) {
  if (*count == *capacity) {
    size_t grown_capacity = *capacity ? *capacity * 2 : INPUTS_FIRST_CAPACITY;
    Input *grown = realloc(*inputs, grown_capacity * sizeof *grown);
    if (!grown) {
      free(location);
      return WK_FAIL(WK_ERR_NOMEM, "out of memory listing inputs");
    }
    *inputs = grown;
    *capacity = grown_capacity;
  }
  (*inputs)[(*count)++] =
      (Input){.path = location, .kind = convert_input_kind(location), .size = size, .remote = remote};
  return WK_OK;
}

typedef struct {
  WkRemote *remote;
  const char *bucket;
  const char *const *patterns;
  Input **inputs;
  size_t *count, *capacity;
} Listing;

static WkStatus add_listed(void *ctx, const char *key, uint64_t size) {
  const Listing *l = ctx;
  const char *slash = strrchr(key, '/');
  const char *base = slash ? slash + 1 : key;
  /* a folder marker, a hidden name, or one no pattern matches */
  if (base[0] == '\0' || base[0] == '.' || !convert_input_wanted(key, l->patterns)) return WK_OK;
  size_t n = strlen(S3_SCHEME) + strlen(l->bucket) + strlen(key) + 2;
  char *location = wk_malloc(n, "input location");
  if (!location) return wk_last_status();
  snprintf(location, n, "%s%s/%s", S3_SCHEME, l->bucket, key);
  return add_input(l->remote, location, size, l->inputs, l->count, l->capacity);
}

WkStatus convert_add_remote_input(WkRemote **remote, const char *location, const char *const *patterns,
                                  Input **inputs, size_t *count, size_t *capacity) {
  if (!*remote) WK_TRY(wk_remote_open(NULL, remote));
  size_t length = strlen(location);
  if (strncmp(location, S3_SCHEME, strlen(S3_SCHEME)) == 0 && location[length - 1] == '/') {
    WkUrl url;
    WK_TRY(wk_url_parse(location, &url));
    size_t before = *count;
    Listing l = {*remote, url.host, patterns, inputs, count, capacity};
    WkStatus status = wk_remote_list(*remote, location, add_listed, &l);
    wk_url_free(&url);
    if (status == WK_OK && *count == before)
      status = WK_FAIL(WK_ERR_INVALID_ARG, "input '%s': no objects under this prefix%s", location,
                       patterns && patterns[0] ? " match the include patterns" : "");
    return status;
  }
  uint64_t size = 0;
  WK_TRY(wk_remote_object_size(*remote, location, &size));
  char *copy = strdup(location);
  if (!copy) return WK_FAIL(WK_ERR_NOMEM, "out of memory listing inputs");
  return add_input(*remote, copy, size, inputs, count, capacity);
}

WkBlob *convert_open_input(const Input *in) {
  if (!in->remote) return wk_blob_open_file(in->path);
  return wk_remote_blob_open(in->remote, in->path, in->size, NULL);
}

void convert_remote_close(WkRemote *remote) { wk_remote_close(remote); }
