/*
 * input_tar.c — a WebDataset shard as converter input: a tar (optionally gzip-compressed) read with
 * libarchive, its members grouped into samples as WebDataset groups them: consecutive members whose
 * names share a key, the name up to the first dot of its last path component ("a/b.c.txt": key
 * "a/b", extension "c.txt"). Each sample's member whose extension is --field ("txt", or "json" with
 * --json-field picking the string in it) is one document; a sample without one is a bad row naming
 * its key. With --column each field is a member extension too ("cls": the .cls member; "json.NAME": the
 * NAME of the .json member), and a sample without one has that field missing (column_value.c says so).
 * Directories and other non-files are skipped. The archive is read through the blob, in order, once.
 */
#include <errno.h>  /* EIO for libarchive's read errors */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <archive.h>        /* archive_read_* */
#include <archive_entry.h>  /* archive_entry_pathname, archive_entry_filetype */

#include "convert.h"

enum { READ_BYTES = 1 << 20, KEY_BYTES = 1024 };

typedef struct {
  WkBlob *blob;
  uint64_t offset;
  uint8_t *buffer;
  WkStatus status;  /* a read failure, kept for the message */
} Source;

static la_ssize_t read_source(struct archive *a, void *arg, const void **out) {
  Source *s = arg;
  uint64_t left = s->blob->size - s->offset;
  size_t n = left < READ_BYTES ? (size_t)left : READ_BYTES;
  if (n && (s->status = s->blob->read_at(s->blob, s->offset, n, s->buffer)) != WK_OK) {
    archive_set_error(a, EIO, "%s", wk_last_error());
    return -1;
  }
  s->offset += n;
  *out = s->buffer;
  return (la_ssize_t)n;
}

/* A sample being gathered: the members its fields read (convert_record_fields: the text's first). */
typedef struct {
  char key[KEY_BYTES];
  bool open;
  uint32_t count;
  const char *fields[1 + COLUMN_MAX];
  bool found[1 + COLUMN_MAX];
  WkByteVec member[1 + COLUMN_MAX];
} Sample;

/* Whether a member of this extension fills the field: the same extension, or a .json member for "json.NAME". */
static bool fills(const char *field, const char *extension, bool *json) {
  *json = strcmp(extension, "json") == 0 && (strcmp(field, "json") == 0 || strncmp(field, "json.", 5) == 0);
  return *json || strcmp(extension, field) == 0;
}

static WkStatus finish_sample(const ChunkContext *ctx, RecordCutter *rc, Sample *s) {
  if (!s->open) return WK_OK;
  s->open = false;
  if (ctx->records || s->found[0]) {
    RecordSlot slots[1 + COLUMN_MAX];
    for (uint32_t k = 0; k < s->count; k++) {
      bool json;
      fills(s->fields[k], "json", &json);
      slots[k] = (RecordSlot){!s->found[k] ? SLOT_MISSING : json ? SLOT_JSON : SLOT_MEMBER, s->member[k].data,
                              s->member[k].length};
    }
    return record_cutter_add(rc, slots, s->count);
  }
  char reason[128];
  snprintf(reason, sizeof reason, "sample '%.60s' has no .%.20s member (choose the extension with --field)", s->key,
           ctx->field);
  return record_cutter_bad(rc, reason);
}

/* Key and extension of a member's name: up to / after the first dot of its last component. */
static void split_name(const char *name, char *key, size_t key_capacity, const char **extension) {
  const char *slash = strrchr(name, '/');
  const char *dot = strchr(slash ? slash + 1 : name, '.');
  size_t n = dot ? (size_t)(dot - name) : strlen(name);
  snprintf(key, key_capacity, "%.*s", (int)n, name);
  *extension = dot ? dot + 1 : "";
}

static WkStatus archive_failure(struct archive *a, const Source *s, const char *path) {
  if (s->status != WK_OK) return s->status;
  return WK_FAIL(WK_ERR_FORMAT, "'%s': tar: %s at byte %llu (file truncated or corrupted, or not a tar)", path,
                 archive_error_string(a) ? archive_error_string(a) : "unreadable", (unsigned long long)s->offset);
}

/* Reads the member the archive is at into buffer. */
static WkStatus read_member(struct archive *a, const Source *src, const char *path, const char *name, la_int64_t size,
                            WkByteVec *buffer) {
  buffer->length = 0;
  WK_TRY(wk_byte_vec_reserve(buffer, (size_t)size));
  la_ssize_t got = size ? archive_read_data(a, buffer->data, (size_t)size) : 0;
  if (got != size)
    return got < 0 ? archive_failure(a, src, path)
                   : WK_FAIL(WK_ERR_FORMAT, "'%s': member '%s' ends after %lld of its %lld bytes (truncated?)", path,
                             name, (long long)got, (long long)size);
  buffer->length = (size_t)size;
  return WK_OK;
}

WkStatus convert_cut_tar(const ChunkContext *ctx, uint32_t i, WkBlob *blob, const RecordLimits *limits, ChunkEmit emit,
                         void *arg) {
  const char *path = blob->name;
  struct archive *a = archive_read_new();
  Source src = {.blob = blob, .buffer = malloc(READ_BYTES)};
  if (!a || !src.buffer) {
    if (a) archive_read_free(a);
    free(src.buffer);
    return WK_FAIL(WK_ERR_NOMEM, "out of memory opening '%s'", path);
  }
  archive_read_support_format_tar(a);
  archive_read_support_filter_gzip(a);
  WkStatus status = WK_OK;
  if (archive_read_open(a, &src, NULL, read_source, NULL) != ARCHIVE_OK) status = archive_failure(a, &src, path);
  RecordCutter rc;
  record_cutter_init(&rc, i, limits->chunk_bytes, emit, arg);
  Sample sample = {0};
  sample.count = ctx->records ? convert_record_fields(ctx, sample.fields, 1 + COLUMN_MAX) : 1;
  sample.fields[0] = ctx->records ? sample.fields[0] : ctx->field;
  struct archive_entry *entry;
  while (status == WK_OK) {
    int rc_header = archive_read_next_header(a, &entry);
    if (rc_header == ARCHIVE_EOF) break;
    if (rc_header != ARCHIVE_OK && rc_header != ARCHIVE_WARN) {
      status = archive_failure(a, &src, path);
      break;
    }
    if (archive_entry_filetype(entry) != AE_IFREG) continue;
    const char *name = archive_entry_pathname(entry);
    if (!name) continue;
    char key[KEY_BYTES];
    const char *extension;
    split_name(name, key, sizeof key, &extension);
    if (!sample.open || strcmp(key, sample.key) != 0) {
      if ((status = finish_sample(ctx, &rc, &sample)) != WK_OK) break;
      snprintf(sample.key, sizeof sample.key, "%s", key);
      sample.open = true;
      memset(sample.found, 0, sizeof sample.found);
    }
    la_int64_t size = archive_entry_size(entry);
    for (uint32_t k = 0, read = UINT32_MAX; k < sample.count && status == WK_OK; k++) {
      bool json;
      if (!fills(sample.fields[k], extension, &json) || sample.found[k]) continue; /* libarchive skips unread data */
      if (size < 0 || (uint64_t)size > limits->max_member_bytes) {
        status = WK_FAIL(WK_ERR_FORMAT, "'%s': member '%s' of %lld bytes is over the limit of %llu", path, name,
                         (long long)size, (unsigned long long)limits->max_member_bytes);
        break;
      }
      /* A member is read once; a second field it fills (json.a, json.b) copies it. */
      sample.member[k].length = 0;
      status = read == UINT32_MAX
                   ? read_member(a, &src, path, name, size, &sample.member[k])
                   : wk_byte_vec_append(&sample.member[k], sample.member[read].data, sample.member[read].length);
      read = k;
      sample.found[k] = true;
    }
    rc.progress = src.offset;
  }
  if (status == WK_OK) status = finish_sample(ctx, &rc, &sample);
  if (status == WK_OK) {
    rc.progress = blob->size;
    status = record_cutter_flush(&rc, true);
  }
  archive_read_free(a);
  free(src.buffer);
  for (uint32_t k = 0; k < 1 + COLUMN_MAX; k++) free(sample.member[k].data);
  record_cutter_free(&rc);
  return status;
}
