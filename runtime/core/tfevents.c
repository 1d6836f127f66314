/*
 * tfevents.c — TensorBoard event files: the writer the trainer logs its curves with, and the cut a
 * resumed run makes so that every step is in a log directory once.
 *
 * An event file is a sequence of TFRecords: uint64 little-endian length, uint32 masked CRC-32C of
 * those 8 bytes, the data, uint32 masked CRC-32C of the data (mask: rotate right by 15, add
 * 0xa282ead8). Each record's data is an `Event` protobuf: wall_time (double, field 1), step (int64,
 * field 2), file_version (string, field 3: "brain.Event:2" in a file's first record) or summary
 * (field 5): a `Summary` of repeated `Value` (field 1) { tag (string, field 1), simple_value (float,
 * field 2) }. Fields are written in field order and a zero step is left out, as protobuf's own
 * serializer does, so the bytes are the ones TensorBoard's writer makes.
 *
 * Owns the format only: which metrics become which tags is the Lua side's (lua/wick/train/tensorboard.lua).
 * Each record is one write(2), so a reader (TensorBoard following a live run) never waits on a
 * buffer and a killed writer leaves at most one partial record, at the end.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core.h"

enum {
  HEADER_BYTES = 12,               /* length + its CRC */
  FOOTER_BYTES = 4,                /* the data's CRC */
  MAX_TAG_BYTES = 1024,            /* a tag is a metric's name, never data */
  MAX_VALUES = 65536,              /* values in one event */
  MAX_RECORD_BYTES = 64 << 20,     /* a longer record in a file being cut is taken for corruption */
  PATH_CAPACITY = 4096,
  HOST_CAPACITY = 256,
  /* protobuf wire types */
  WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_BYTES = 2, WIRE_FIXED32 = 5,
};

static const char FILE_VERSION[] = "brain.Event:2";
static const char FILE_PREFIX[] = "events.out.tfevents.";
static const uint32_t CRC_MASK_DELTA = 0xa282ead8u;
static const uint32_t CASTAGNOLI_REFLECTED = 0x82f63b78u;

struct WkEvents {
  int fd;
  char path[PATH_CAPACITY];
};

/* ---- CRC-32C ------------------------------------------------------------------------------------ */

/* Bit by bit: records are a few hundred bytes a step, and there is no table to share between threads. */
uint32_t wk_crc32c(const void *data, size_t length) {
  const uint8_t *p = data;
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < length; i++) {
    crc ^= p[i];
    for (int k = 0; k < 8; k++) crc = (crc & 1) ? (crc >> 1) ^ CASTAGNOLI_REFLECTED : crc >> 1;
  }
  return crc ^ 0xffffffffu;
}

static uint32_t masked_crc(const void *data, size_t length) {
  uint32_t crc = wk_crc32c(data, length);
  return ((crc >> 15) | (crc << 17)) + CRC_MASK_DELTA;
}

/* ---- protobuf pieces ---------------------------------------------------------------------------- */

static size_t varint_size(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) { v >>= 7; n++; }
  return n;
}

static uint8_t *put_varint(uint8_t *p, uint64_t v) {
  while (v >= 0x80) { *p++ = (uint8_t)(v | 0x80); v >>= 7; }
  *p++ = (uint8_t)v;
  return p;
}

static uint8_t *put_le(uint8_t *p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) *p++ = (uint8_t)(v >> (8 * i));
  return p;
}

static uint8_t *put_key(uint8_t *p, unsigned field, unsigned wire) { return put_varint(p, field << 3 | wire); }

static uint8_t *put_bytes(uint8_t *p, unsigned field, const void *data, size_t length) {
  p = put_varint(put_key(p, field, WIRE_BYTES), length);
  memcpy(p, data, length);
  return p + length;
}

/* A length-delimited field of `length` bytes, key included. */
static size_t bytes_field_size(size_t length) { return 1 + varint_size(length) + length; }

static size_t value_size(const char *tag) { return bytes_field_size(strlen(tag)) + 1 + sizeof(float); }

static uint8_t *put_value(uint8_t *p, const char *tag, float value) {
  uint32_t bits;
  memcpy(&bits, &value, sizeof bits);
  p = put_varint(put_key(p, 1, WIRE_BYTES), value_size(tag));
  p = put_bytes(p, 1, tag, strlen(tag));
  return put_le(put_key(p, 2, WIRE_FIXED32), bits, 4);
}

/* The Event's head: wall_time, and step unless it is 0. */
static size_t head_size(int64_t step) { return 1 + 8 + (step != 0 ? 1 + varint_size((uint64_t)step) : 0); }

static uint8_t *put_head(uint8_t *p, int64_t step, double wall_time) {
  uint64_t bits;
  memcpy(&bits, &wall_time, sizeof bits);
  p = put_le(put_key(p, 1, WIRE_FIXED64), bits, 8);
  if (step != 0) p = put_varint(put_key(p, 2, WIRE_VARINT), (uint64_t)step);
  return p;
}

/* ---- records ------------------------------------------------------------------------------------ */

/* Frames data[HEADER_BYTES .. HEADER_BYTES + length) in place: header before it, CRC after it. */
static void frame(uint8_t *record, size_t length) {
  put_le(record, length, 8);
  put_le(record + 8, masked_crc(record, 8), 4);
  put_le(record + HEADER_BYTES + length, masked_crc(record + HEADER_BYTES, length), 4);
}

static WkStatus write_all(WkEvents *w, const uint8_t *bytes, size_t length) {
  while (length > 0) {
    ssize_t n = write(w->fd, bytes, length);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return WK_FAIL_ERRNO("write", w->path);
    bytes += n;
    length -= (size_t)n;
  }
  return WK_OK;
}

static WkStatus check_values(uint32_t count, const char *const *tags) {
  if (count > MAX_VALUES) return WK_FAIL(WK_ERR_INVALID_ARG, "events: %u values in one event (at most %d)", count, MAX_VALUES);
  for (uint32_t i = 0; i < count; i++) {
    if (!tags[i] || tags[i][0] == '\0') return WK_FAIL(WK_ERR_INVALID_ARG, "events: value %u has no tag", i);
    if (strlen(tags[i]) > MAX_TAG_BYTES)
      return WK_FAIL(WK_ERR_INVALID_ARG, "events: tag '%.40s...' is longer than %d bytes", tags[i], MAX_TAG_BYTES);
  }
  return WK_OK;
}

WkStatus wk_events_write_scalars(WkEvents *w, int64_t step, double wall_time, uint32_t count, const char *const *tags,
                                 const float *values) {
  if (!w || (count > 0 && (!tags || !values))) return WK_FAIL(WK_ERR_INVALID_ARG, "events: NULL writer, tags or values");
  if (step < 0) return WK_FAIL(WK_ERR_INVALID_ARG, "events: step %lld is negative", (long long)step);
  if (!(wall_time >= 0 && wall_time < 1e12)) return WK_FAIL(WK_ERR_INVALID_ARG, "events: wall time %g out of range", wall_time);
  WK_TRY(check_values(count, tags));
  size_t summary = 0;
  for (uint32_t i = 0; i < count; i++) summary += bytes_field_size(value_size(tags[i]));
  size_t length = head_size(step) + bytes_field_size(summary);
  uint8_t *record = wk_malloc(HEADER_BYTES + length + FOOTER_BYTES, "an event record");
  if (!record) return WK_ERR_NOMEM;
  uint8_t *p = put_head(record + HEADER_BYTES, step, wall_time);
  p = put_varint(put_key(p, 5, WIRE_BYTES), summary);
  for (uint32_t i = 0; i < count; i++) p = put_value(p, tags[i], values[i]);
  frame(record, length);
  WkStatus status = write_all(w, record, HEADER_BYTES + length + FOOTER_BYTES);
  free(record);
  return status;
}

static WkStatus write_file_version(WkEvents *w, double wall_time) {
  size_t length = head_size(0) + bytes_field_size(sizeof FILE_VERSION - 1);
  uint8_t record[HEADER_BYTES + 64 + FOOTER_BYTES];
  put_bytes(put_head(record + HEADER_BYTES, 0, wall_time), 3, FILE_VERSION, sizeof FILE_VERSION - 1);
  frame(record, length);
  return write_all(w, record, HEADER_BYTES + length + FOOTER_BYTES);
}

/* ---- the writer --------------------------------------------------------------------------------- */

static WkStatus make_directory(const char *dir) {
  struct stat st;
  if (mkdir(dir, 0777) != 0 && errno != EEXIST) return WK_FAIL_ERRNO("create the TensorBoard directory", dir);
  if (stat(dir, &st) != 0) return WK_FAIL_ERRNO("stat", dir);
  if (!S_ISDIR(st.st_mode))
    return WK_FAIL(WK_ERR_IO, "'%s' is %s, not a directory for TensorBoard files", dir,
                   wk_file_kind((unsigned)st.st_mode));
  return WK_OK;
}

WkEvents *wk_events_open(const char *dir, double wall_time) {
  if (!dir || dir[0] == '\0') { WK_FAIL(WK_ERR_INVALID_ARG, "events: no directory"); return NULL; }
  if (!(wall_time >= 0 && wall_time < 1e12)) {
    WK_FAIL(WK_ERR_INVALID_ARG, "events: wall time %g out of range", wall_time);
    return NULL;
  }
  if (make_directory(dir) != WK_OK) return NULL;
  char host[HOST_CAPACITY];
  if (gethostname(host, sizeof host) != 0) { WK_FAIL_ERRNO("gethostname", dir); return NULL; }
  host[sizeof host - 1] = '\0';
  WkEvents *w = wk_calloc(1, sizeof *w, "an event writer");
  if (!w) return NULL;
  int n = snprintf(w->path, sizeof w->path, "%s/%s%lld.%s.%d", dir, FILE_PREFIX, (long long)wall_time, host, (int)getpid());
  if (n < 0 || (size_t)n >= sizeof w->path) {
    WK_FAIL(WK_ERR_INVALID_ARG, "events: directory name too long: '%.60s...'", dir);
    free(w);
    return NULL;
  }
  /* O_EXCL: a file of this name is another writer's (same second, same pid: another writer in this process). */
  w->fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0666);
  if (w->fd < 0) {
    WK_FAIL_ERRNO("create", w->path);
    free(w);
    return NULL;
  }
  if (write_file_version(w, wall_time) != WK_OK) {
    wk_events_close(w);
    return NULL;
  }
  return w;
}

const char *wk_events_path(const WkEvents *w) { return w ? w->path : ""; }

WkStatus wk_events_close(WkEvents *w) {
  if (!w) return WK_OK;
  WkStatus status = close(w->fd) == 0 ? WK_OK : WK_FAIL_ERRNO("close", w->path);
  free(w);
  return status;
}

/* ---- cutting a file after a step ------------------------------------------------------------------ */

typedef struct {
  const uint8_t *p, *end;
} Reader;

static bool read_varint(Reader *r, uint64_t *out) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64 && r->p < r->end; shift += 7) {
    uint8_t b = *r->p++;
    v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) { *out = v; return true; }
  }
  return false;
}

static bool skip_field(Reader *r, unsigned wire) {
  uint64_t n;
  switch (wire) {
    case WIRE_VARINT: return read_varint(r, &n);
    case WIRE_FIXED64: n = 8; break;
    case WIRE_FIXED32: n = 4; break;
    case WIRE_BYTES: if (!read_varint(r, &n)) return false; break;
    default: return false;
  }
  if (n > (uint64_t)(r->end - r->p)) return false;
  r->p += n;
  return true;
}

/* The step of an Event's bytes (0 when it has none); false when they are no protobuf message. */
static bool event_step(const uint8_t *data, size_t length, int64_t *step) {
  Reader r = {data, data + length};
  *step = 0;
  while (r.p < r.end) {
    uint64_t key, v;
    if (!read_varint(&r, &key)) return false;
    if (key == (2 << 3 | WIRE_VARINT)) {
      if (!read_varint(&r, &v)) return false;
      *step = (int64_t)v;
    } else if (!skip_field(&r, (unsigned)(key & 7))) {
      return false;
    }
  }
  return true;
}

static uint64_t get_le(const uint8_t *p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static WkStatus read_at(int fd, const char *path, void *buffer, size_t length, uint64_t offset) {
  ssize_t n = pread(fd, buffer, length, (off_t)offset);
  if (n < 0) return WK_FAIL_ERRNO("read", path);
  if ((size_t)n != length) return WK_FAIL(WK_ERR_IO, "'%s' offset %llu: short read", path, (unsigned long long)offset);
  return WK_OK;
}

/* The step of the record at *offset (advanced past it); *partial when the file ends inside it. */
static WkStatus next_record(int fd, const char *path, uint64_t size, uint64_t *offset, int64_t *step, bool *partial) {
  uint8_t header[HEADER_BYTES];
  *partial = size - *offset < HEADER_BYTES;
  if (*partial) return WK_OK;
  WK_TRY(read_at(fd, path, header, sizeof header, *offset));
  uint64_t length = get_le(header, 8);
  if (get_le(header + 8, 4) != masked_crc(header, 8))
    return WK_FAIL(WK_ERR_FORMAT,
                   "'%s' offset %llu: record length checksum mismatch (not a TensorBoard event file, or corrupted)",
                   path, (unsigned long long)*offset);
  if (length > MAX_RECORD_BYTES)
    return WK_FAIL(WK_ERR_FORMAT, "'%s' offset %llu: record of %llu bytes (more than %d: corrupted)", path,
                   (unsigned long long)*offset, (unsigned long long)length, MAX_RECORD_BYTES);
  *partial = size - *offset - HEADER_BYTES < length + FOOTER_BYTES;
  if (*partial) return WK_OK;
  uint8_t *data = wk_malloc(length + FOOTER_BYTES, "an event record");
  if (!data) return WK_ERR_NOMEM;
  WkStatus status = read_at(fd, path, data, length + FOOTER_BYTES, *offset + HEADER_BYTES);
  if (status == WK_OK && get_le(data + length, 4) != masked_crc(data, length))
    status = WK_FAIL(WK_ERR_FORMAT, "'%s' offset %llu: record data checksum mismatch (corrupted)", path,
                     (unsigned long long)*offset);
  if (status == WK_OK && !event_step(data, length, step))
    status = WK_FAIL(WK_ERR_FORMAT, "'%s' offset %llu: record is not an Event protobuf", path, (unsigned long long)*offset);
  free(data);
  *offset += HEADER_BYTES + length + FOOTER_BYTES;
  return status;
}

/* Where the file should end: before its first record of a step after `step`, or its partial tail. */
static WkStatus cut_offset(int fd, const char *path, uint64_t size, int64_t step, uint64_t *cut, uint64_t *removed) {
  uint64_t offset = 0;
  *cut = size;
  *removed = 0;
  while (offset < size) {
    uint64_t start = offset;
    int64_t record_step = 0;
    bool partial;
    WK_TRY(next_record(fd, path, size, &offset, &record_step, &partial));
    if (*cut == size && (partial || record_step > step)) *cut = start;
    if (partial) break;
    if (*cut != size) (*removed)++;
  }
  return WK_OK;
}

WkStatus wk_events_truncate(const char *path, int64_t step, uint64_t *removed) {
  if (!path || !removed) return WK_FAIL(WK_ERR_INVALID_ARG, "events: NULL path or count");
  *removed = 0;
  /* O_NOFOLLOW and the owner's check: what another user put in a shared directory (a link to one of
   * our files, a file of theirs) is never cut. */
  int fd = open(path, O_RDWR | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
  if (fd < 0) return WK_FAIL_ERRNO("open", path);
  struct stat st;
  WkStatus status = WK_OK;
  uint64_t cut = 0;
  if (fstat(fd, &st) != 0)
    status = WK_FAIL_ERRNO("stat", path);
  else if (!S_ISREG(st.st_mode))
    status = WK_FAIL(WK_ERR_IO, "'%s' is %s, not a TensorBoard event file", path, wk_file_kind((unsigned)st.st_mode));
  else if (st.st_uid != geteuid())
    status = WK_FAIL(WK_ERR_IO, "'%s' belongs to another user (uid %u): not cut (use a log directory of your own)", path,
                     (unsigned)st.st_uid);
  if (status == WK_OK) status = cut_offset(fd, path, (uint64_t)st.st_size, step, &cut, removed);
  if (status == WK_OK && cut < (uint64_t)st.st_size && ftruncate(fd, (off_t)cut) != 0) status = WK_FAIL_ERRNO("truncate", path);
  close(fd);
  return status;
}

WkStatus wk_events_truncate_dir(const char *dir, int64_t step, uint64_t *removed) {
  if (!dir || !removed) return WK_FAIL(WK_ERR_INVALID_ARG, "events: NULL directory or count");
  *removed = 0;
  DIR *d = opendir(dir);
  if (!d) return errno == ENOENT ? WK_OK : WK_FAIL_ERRNO("open the TensorBoard directory", dir);
  WkStatus status = WK_OK;
  struct dirent *entry;
  while (status == WK_OK && (entry = readdir(d)) != NULL) {
    if (strncmp(entry->d_name, FILE_PREFIX, sizeof FILE_PREFIX - 1) != 0) continue;
    char path[PATH_CAPACITY];
    uint64_t cut = 0;
    int n = snprintf(path, sizeof path, "%s/%s", dir, entry->d_name);
    if (n < 0 || (size_t)n >= sizeof path) status = WK_FAIL(WK_ERR_INVALID_ARG, "events: path too long in '%.60s...'", dir);
    if (status == WK_OK) status = wk_events_truncate(path, step, &cut);
    *removed += cut;
  }
  closedir(d);
  return status;
}
