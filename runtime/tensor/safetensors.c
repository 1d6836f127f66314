/*
 * safetensors.c — Hugging Face's weights format, read and written in C.
 *
 * A file is an 8-byte little-endian header length, a JSON header
 *   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}}
 * padded with spaces to 8 bytes, then the raw little-endian tensor data (offsets count from the
 * end of the header). Opening parses and checks the header only; each tensor is then read with one
 * pread straight into its destination, so loading a checkpoint never holds it twice in memory; or
 * viewed where it lies in a private mapping of the file (wk_safetensors_view), so a model of
 * another dtype converts from the page cache with no copy of the file's tensor in between.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/json.h"
#include "tensor.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c reads and writes little-endian data in place: a big-endian host needs byte swaps"
#endif

enum {
  HEADER_LENGTH_BYTES = 8,
  HEADER_ALIGNMENT = 8,              /* the header is padded with spaces to this many bytes */
  MAX_HEADER_BYTES = 100 << 20,      /* the format's own cap on the JSON header */
  IO_CHUNK = 64 << 20,               /* largest single pread/write: keeps short transfers rare */
};

static const char METADATA_KEY[] = "__metadata__";
static const char *const FORMAT_NAMES[WK_DTYPE_COUNT] = {"F32", "BF16", "F16", "I32", "I64", "U16", "U8"};

struct WkSafetensors {
  char *path;
  int fd;
  uint64_t data_start;  /* file offset of the data section */
  uint64_t data_bytes;
  WkJson *header;
  WkSafetensorsEntry *entries;
  uint32_t count;
  const char **meta_keys, **meta_values;
  uint32_t meta_count;
  void *map;            /* the whole file, mapped copy-on-write at the first view; NULL before */
  uint64_t map_bytes;
};

/* ---- reading ------------------------------------------------------------------------------------ */

static WkStatus read_exactly(int fd, void *dst, uint64_t length, uint64_t offset, const char *path) {
  char *p = dst;
  while (length > 0) {
    size_t chunk = length < IO_CHUNK ? (size_t)length : IO_CHUNK;
    ssize_t n = pread(fd, p, chunk, (off_t)offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return WK_FAIL_ERRNO("read", path);
    if (n == 0) return WK_FAIL(WK_ERR_FORMAT, "%s: unexpected end of file at byte %llu (truncated?)", path,
                               (unsigned long long)offset);
    p += n;
    offset += (uint64_t)n;
    length -= (uint64_t)n;
  }
  return WK_OK;
}

static bool format_dtype(const char *name, WkDType *out) {
  for (int d = 0; d < WK_DTYPE_COUNT; d++)
    if (strcmp(name, FORMAT_NAMES[d]) == 0) {
      *out = (WkDType)d;
      return true;
    }
  return false;
}

static void describe_shape(const WkSafetensorsEntry *e, char *buf, size_t size) {
  size_t used = (size_t)snprintf(buf, size, "[");
  for (int d = 0; d < e->ndim && used < size; d++) used += (size_t)snprintf(buf + used, size - used, d ? ", %lld" : "%lld", (long long)e->shape[d]);
  if (used < size) snprintf(buf + used, size - used, "]");
}

/* Checks one tensor's header entry against the format and the file. */
static WkStatus parse_entry(const WkSafetensors *f, const WkJson *member, WkSafetensorsEntry *e) {
  const WkJson *dtype = wk_json_get(member, "dtype"), *shape = wk_json_get(member, "shape");
  const WkJson *offsets = wk_json_get(member, "data_offsets");
  e->name = member->key;
  if (member->type != WK_JSON_OBJECT || !dtype || dtype->type != WK_JSON_STRING || !shape ||
      shape->type != WK_JSON_ARRAY || !offsets || offsets->type != WK_JSON_ARRAY)
    return WK_FAIL(WK_ERR_FORMAT, "%s: tensor '%s' lacks dtype, shape or data_offsets", f->path, e->name);
  if (!format_dtype(dtype->string, &e->dtype))
    return WK_FAIL(WK_ERR_FORMAT, "%s: tensor '%s' has dtype %s (supported: F32 BF16 F16 I32 I64 U16 U8)", f->path,
                   e->name, dtype->string);
  uint64_t numel = 1, dim;
  e->ndim = 0;
  for (const WkJson *d = shape->child; d; d = d->next) {
    if (e->ndim == WK_MAX_DIMS || !wk_json_u64(d, &dim) || dim > INT64_MAX || (dim && numel > UINT64_MAX / 16 / dim))
      return WK_FAIL(WK_ERR_FORMAT, "%s: tensor '%s' has a bad shape (at most %d dims of sizes that fit)", f->path,
                     e->name, WK_MAX_DIMS);
    e->shape[e->ndim++] = (int64_t)dim;
    numel *= dim;
  }
  e->bytes = numel * wk_dtype_size(e->dtype);
  uint64_t begin = 0, end = 0;
  const WkJson *first = offsets->child, *second = first ? first->next : NULL;
  bool offsets_ok = second && !second->next && wk_json_u64(first, &begin) && wk_json_u64(second, &end) && end >= begin;
  char dims[160];
  describe_shape(e, dims, sizeof dims);
  if (!offsets_ok || end - begin != e->bytes)
    return WK_FAIL(WK_ERR_FORMAT, "%s: tensor '%s' %s %s needs %llu bytes but data_offsets are [%llu, %llu] "
                   "(file corrupted?)", f->path, e->name, dims, dtype->string, (unsigned long long)e->bytes,
                   (unsigned long long)begin, (unsigned long long)end);
  if (end > f->data_bytes)
    return WK_FAIL(WK_ERR_FORMAT, "%s: tensor '%s' %s %s needs %llu bytes at data offsets [%llu, %llu], past the "
                   "end of the data (%llu bytes: file truncated)", f->path, e->name, dims, dtype->string,
                   (unsigned long long)e->bytes, (unsigned long long)begin, (unsigned long long)end,
                   (unsigned long long)f->data_bytes);
  e->offset = begin;
  return WK_OK;
}

static WkStatus parse_metadata(WkSafetensors *f, const WkJson *metadata) {
  if (metadata->type != WK_JSON_OBJECT)
    return WK_FAIL(WK_ERR_FORMAT, "%s: __metadata__ is not an object of strings", f->path);
  for (const WkJson *m = metadata->child; m; m = m->next) f->meta_count++;
  f->meta_keys = wk_calloc(f->meta_count, sizeof *f->meta_keys, "safetensors metadata");
  f->meta_values = wk_calloc(f->meta_count, sizeof *f->meta_values, "safetensors metadata");
  if (!f->meta_keys || !f->meta_values) return wk_last_status();
  uint32_t i = 0;
  for (const WkJson *m = metadata->child; m; m = m->next, i++) {
    if (m->type != WK_JSON_STRING)
      return WK_FAIL(WK_ERR_FORMAT, "%s: __metadata__ value of '%s' is not a string", f->path, m->key);
    f->meta_keys[i] = m->key;
    f->meta_values[i] = m->string;
  }
  return WK_OK;
}

static WkStatus parse_header(WkSafetensors *f, const char *text, size_t length) {
  WkStatus status = wk_json_parse(text, length, &f->header);
  if (status != WK_OK) return wk_error_context("%s: header", f->path);
  if (f->header->type != WK_JSON_OBJECT) return WK_FAIL(WK_ERR_FORMAT, "%s: the header is not a JSON object", f->path);
  for (const WkJson *m = f->header->child; m; m = m->next) f->count += strcmp(m->key, METADATA_KEY) != 0;
  f->entries = wk_calloc(f->count, sizeof *f->entries, "safetensors entries");
  if (!f->entries) return wk_last_status();
  uint32_t i = 0;
  for (const WkJson *m = f->header->child; m; m = m->next) {
    if (strcmp(m->key, METADATA_KEY) == 0) {
      WK_TRY(parse_metadata(f, m));
      continue;
    }
    /* A name given twice is ambiguous (JSON allows it; this format cannot). Headers hold at most a
     * few thousand tensors, so the quadratic check costs nothing next to reading them. */
    for (uint32_t j = 0; j < i; j++)
      if (strcmp(f->entries[j].name, m->key) == 0)
        return WK_FAIL(WK_ERR_FORMAT, "%s: tensor '%s' appears twice in the header", f->path, m->key);
    WK_TRY(parse_entry(f, m, &f->entries[i++]));
  }
  return WK_OK;
}

static WkStatus open_file(WkSafetensors *f) {
  uint64_t file_size;
  WK_TRY(wk_open_regular(f->path, "checkpoints", &f->fd, &file_size));
  uint8_t prefix[HEADER_LENGTH_BYTES];
  uint64_t header_length = 0;
  if (file_size >= HEADER_LENGTH_BYTES) WK_TRY(read_exactly(f->fd, prefix, sizeof prefix, 0, f->path));
  for (int b = HEADER_LENGTH_BYTES - 1; b >= 0 && file_size >= HEADER_LENGTH_BYTES; b--)
    header_length = header_length << 8 | prefix[b];
  if (file_size < HEADER_LENGTH_BYTES || header_length > MAX_HEADER_BYTES ||
      header_length > file_size - HEADER_LENGTH_BYTES)
    return WK_FAIL(WK_ERR_FORMAT, "%s: not a safetensors file (bad header length; truncated or another format)",
                   f->path);
  char *text = wk_malloc((size_t)header_length + 1, "safetensors header");
  if (!text) return wk_last_status();
  WkStatus status = read_exactly(f->fd, text, header_length, HEADER_LENGTH_BYTES, f->path);
  f->data_start = HEADER_LENGTH_BYTES + header_length;
  f->data_bytes = file_size - f->data_start;
  if (status == WK_OK) status = parse_header(f, text, (size_t)header_length);
  free(text);
  return status;
}

WkSafetensors *wk_safetensors_open(const char *path) {
  WkSafetensors *f = wk_calloc(1, sizeof *f, "safetensors file");
  if (!f) return NULL;
  f->fd = -1;
  f->path = strdup(path ? path : "");
  if (!f->path || open_file(f) != WK_OK) {
    if (!f->path) WK_FAIL(WK_ERR_NOMEM, "out of memory opening a safetensors file");
    wk_safetensors_close(f);
    return NULL;
  }
  return f;
}

void wk_safetensors_close(WkSafetensors *f) {
  if (!f) return;
  if (f->map) munmap(f->map, f->map_bytes);
  if (f->fd >= 0) close(f->fd);
  wk_json_free(f->header);
  free(f->entries);
  free(f->meta_keys);
  free(f->meta_values);
  free(f->path);
  free(f);
}

uint32_t wk_safetensors_count(const WkSafetensors *f) { return f->count; }

WkStatus wk_safetensors_entry(const WkSafetensors *f, uint32_t i, WkSafetensorsEntry *out) {
  if (i >= f->count) return WK_FAIL(WK_ERR_INVALID_ARG, "%s: tensor %u of %u", f->path, i, f->count);
  *out = f->entries[i];
  return WK_OK;
}

uint32_t wk_safetensors_metadata_count(const WkSafetensors *f) { return f->meta_count; }

WkStatus wk_safetensors_metadata(const WkSafetensors *f, uint32_t i, const char **key, const char **value) {
  if (i >= f->meta_count) return WK_FAIL(WK_ERR_INVALID_ARG, "%s: metadata %u of %u", f->path, i, f->meta_count);
  *key = f->meta_keys[i];
  *value = f->meta_values[i];
  return WK_OK;
}

WkStatus wk_safetensors_read(WkSafetensors *f, uint32_t i, WkTensor *dst) {
  WkSafetensorsEntry e;
  WK_TRY(wk_safetensors_entry(f, i, &e));
  if (!dst || tensor_device(dst) != WK_DEVICE_CPU || !wk_tensor_is_contiguous(dst) || dst->dtype != e.dtype ||
      (uint64_t)wk_tensor_numel(dst) * wk_dtype_size(dst->dtype) != e.bytes)
    return WK_FAIL(WK_ERR_INVALID_ARG, "%s: tensor '%s' must be read into a contiguous CPU tensor of %s with %llu bytes",
                   f->path, e.name, wk_dtype_name(e.dtype), (unsigned long long)e.bytes);
  return read_exactly(f->fd, tensor_ptr(dst), e.bytes, f->data_start + e.offset, f->path);
}

/* Maps the file once; the views below point into the mapping until the file is closed. */
static WkStatus map_file(WkSafetensors *f) {
  if (f->map) return WK_OK;
  f->map_bytes = f->data_start + f->data_bytes;
  /* Private and writable: a stray write to a view changes a copy of the page, never the file. */
  void *map = mmap(NULL, f->map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE, f->fd, 0);
  if (map == MAP_FAILED) return WK_FAIL(WK_ERR_IO, "%s: mmap of %llu bytes failed: %s", f->path,
                                        (unsigned long long)f->map_bytes, strerror(errno));
  f->map = map;
  return WK_OK;
}

WkTensor *wk_safetensors_view(WkSafetensors *f, uint32_t i) {
  WkSafetensorsEntry e;
  if (wk_safetensors_entry(f, i, &e) != WK_OK || map_file(f) != WK_OK) return NULL;
  unsigned char *data = (unsigned char *)f->map + f->data_start + e.offset;
  if ((uintptr_t)data % wk_dtype_size(e.dtype) == 0) return wk_tensor_borrow(data, e.dtype, e.ndim, e.shape);
  /* The format does not promise aligned offsets: such a tensor is copied once, aligned. */
  WkTensor *copy = wk_tensor_empty(e.dtype, e.ndim, e.shape, WK_DEVICE_CPU, 0);
  if (copy) memcpy(tensor_ptr(copy), data, e.bytes);
  return copy;
}

/* ---- writing ------------------------------------------------------------------------------------ */

/* A growing text buffer for the header. */
typedef struct {
  char *data;
  size_t length, capacity;
  bool failed;
} Text;

static void append(Text *t, const char *bytes, size_t n) {
  if (t->failed) return;
  if (t->length + n + 1 > t->capacity) {
    size_t capacity = (t->length + n + 1) * 2;
    char *grown = realloc(t->data, capacity);
    if (!grown) {
      t->failed = true;
      return;
    }
    t->data = grown;
    t->capacity = capacity;
  }
  memcpy(t->data + t->length, bytes, n);
  t->length += n;
}

static void append_text(Text *t, const char *s) { append(t, s, strlen(s)); }

/* A JSON string: quotes, backslashes and control characters escaped. */
static void append_json_string(Text *t, const char *s) {
  append(t, "\"", 1);
  for (; *s; s++) {
    char escaped[8];
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') snprintf(escaped, sizeof escaped, "\\%c", c);
    else if (c < 0x20) snprintf(escaped, sizeof escaped, "\\u%04x", c);
    else snprintf(escaped, sizeof escaped, "%c", c);
    append_text(t, escaped);
  }
  append(t, "\"", 1);
}

/* The header of tensors laid out in the given order; each entry of dtype `as` (its shape the
 * tensor's), or of the tensor's own dtype where `as` is ANY_DTYPE. */
enum { ANY_DTYPE = -1 };
static WkStatus build_header(Text *t, uint32_t count, const char *const *names, WkTensor *const *tensors, int as,
                             uint32_t meta_count, const char *const *meta_keys, const char *const *meta_values) {
  append_text(t, "{");
  if (meta_count > 0) {
    append_text(t, "\"__metadata__\":{");
    for (uint32_t m = 0; m < meta_count; m++) {
      if (m) append_text(t, ",");
      append_json_string(t, meta_keys[m]);
      append_text(t, ":");
      append_json_string(t, meta_values[m]);
    }
    append_text(t, "}");
  }
  uint64_t offset = 0;
  for (uint32_t i = 0; i < count; i++) {
    char number[96];
    const WkTensor *x = tensors[i];
    WkDType dtype = as == ANY_DTYPE ? x->dtype : (WkDType)as;
    uint64_t bytes = (uint64_t)wk_tensor_numel(x) * wk_dtype_size(dtype);
    if (i || meta_count) append_text(t, ",");
    append_json_string(t, names[i]);
    snprintf(number, sizeof number, ":{\"dtype\":\"%s\",\"shape\":[", FORMAT_NAMES[dtype]);
    append_text(t, number);
    for (int d = 0; d < x->ndim; d++) {
      snprintf(number, sizeof number, d ? ",%lld" : "%lld", (long long)x->shape[d]);
      append_text(t, number);
    }
    snprintf(number, sizeof number, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)offset,
             (unsigned long long)(offset + bytes));
    append_text(t, number);
    offset += bytes;
  }
  append_text(t, "}");
  while (t->length % HEADER_ALIGNMENT) append_text(t, " ");
  if (t->failed) return WK_FAIL(WK_ERR_NOMEM, "out of memory building a safetensors header");
  return WK_OK;
}

/* pwrite of all `length` bytes at file offset `at`. */
static WkStatus write_all_at(int fd, const void *src, uint64_t length, uint64_t at, const char *path) {
  const char *p = src;
  while (length > 0) {
    size_t chunk = length < IO_CHUNK ? (size_t)length : IO_CHUNK;
    ssize_t n = pwrite(fd, p, chunk, (off_t)at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return WK_FAIL_ERRNO("write", path);
    p += n;
    at += (uint64_t)n;
    length -= (uint64_t)n;
  }
  return WK_OK;
}

/* Writes a tensor's bytes at `at`: straight from memory when it is a contiguous CPU tensor, else
 * through a contiguous CPU copy (device tensors, strided views). */
static WkStatus write_tensor_at(int fd, const WkTensor *x, uint64_t at, const char *path) {
  uint64_t bytes = (uint64_t)wk_tensor_numel(x) * wk_dtype_size(x->dtype);
  if (tensor_device(x) == WK_DEVICE_CPU && wk_tensor_is_contiguous(x)) return write_all_at(fd, tensor_ptr(x), bytes, at, path);
  WkTensor *host = wk_tensor_empty(x->dtype, x->ndim, x->shape, WK_DEVICE_CPU, 0);
  if (!host) return wk_last_status();
  WkStatus status = wk_tensor_copy(host, x);
  if (status == WK_OK) status = write_all_at(fd, tensor_ptr(host), bytes, at, path);
  wk_tensor_free(host);
  return status;
}

/* The length prefix and the header; returns where the data section starts in *data_start. */
static WkStatus write_header(int fd, const Text *header, uint64_t *data_start, const char *path) {
  uint8_t prefix[HEADER_LENGTH_BYTES];
  for (int b = 0; b < HEADER_LENGTH_BYTES; b++) prefix[b] = (uint8_t)((uint64_t)header->length >> (8 * b));
  WK_TRY(write_all_at(fd, prefix, sizeof prefix, 0, path));
  WK_TRY(write_all_at(fd, header->data, header->length, HEADER_LENGTH_BYTES, path));
  *data_start = HEADER_LENGTH_BYTES + header->length;
  return WK_OK;
}

static WkStatus check_entries(const char *what, const char *path, uint32_t count, const char *const *names,
                              WkTensor *const *tensors) {
  for (uint32_t i = 0; i < count; i++)
    if (!names[i] || !tensors[i] || !wk_dtype_size(tensors[i]->dtype))
      return WK_FAIL(WK_ERR_INVALID_ARG, "%s '%s': entry %u has no name or no tensor", what, path, i);
  return WK_OK;
}

WkStatus wk_safetensors_save(const char *path, uint32_t count, const char *const *names, WkTensor *const *tensors,
                             uint32_t meta_count, const char *const *meta_keys, const char *const *meta_values) {
  WK_TRY(check_entries("safetensors save", path, count, names, tensors));
  Text header = {0};
  WkStatus status = build_header(&header, count, names, tensors, ANY_DTYPE, meta_count, meta_keys, meta_values);
  /* Written next to the target and renamed: readers never see a half-written file. */
  char tmp[PATH_MAX];
  if (status == WK_OK && (size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp)
    status = WK_FAIL(WK_ERR_INVALID_ARG, "safetensors save: path '%s' is too long", path);
  int fd = status == WK_OK ? open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : -1;
  if (status == WK_OK && fd < 0) status = WK_FAIL_ERRNO("create", tmp);
  uint64_t at = 0;
  if (status == WK_OK) status = write_header(fd, &header, &at, tmp);
  for (uint32_t i = 0; status == WK_OK && i < count; i++) {
    status = write_tensor_at(fd, tensors[i], at, tmp);
    at += (uint64_t)wk_tensor_numel(tensors[i]) * wk_dtype_size(tensors[i]->dtype);
  }
  if (fd >= 0 && close(fd) != 0 && status == WK_OK) status = WK_FAIL_ERRNO("close", tmp);
  if (status == WK_OK && rename(tmp, path) != 0) status = WK_FAIL_ERRNO("rename to", path);
  if (status != WK_OK && fd >= 0) unlink(tmp);
  free(header.data);
  return status;
}

/* ---- one file written in parts --------------------------------------------------------------- */

WkStatus wk_safetensors_create(const char *path, uint32_t count, const char *const *names, WkTensor *const *shapes,
                               WkDType dtype, uint32_t meta_count, const char *const *meta_keys,
                               const char *const *meta_values) {
  WK_TRY(check_entries("safetensors create", path, count, names, shapes));
  if (!wk_dtype_size(dtype)) return WK_FAIL(WK_ERR_INVALID_ARG, "safetensors create '%s': no such dtype %d", path, (int)dtype);
  Text header = {0};
  WkStatus status = build_header(&header, count, names, shapes, (int)dtype, meta_count, meta_keys, meta_values);
  uint64_t data = 0;
  for (uint32_t i = 0; i < count; i++) data += (uint64_t)wk_tensor_numel(shapes[i]) * wk_dtype_size(dtype);
  /* O_NOFOLLOW: a link planted where a checkpoint's part goes is refused, not written through. */
  int fd = status == WK_OK ? open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644) : -1;
  if (status == WK_OK && fd < 0) status = WK_FAIL_ERRNO("create", path);
  uint64_t data_start = 0;
  if (status == WK_OK) status = write_header(fd, &header, &data_start, path);
  if (status == WK_OK && ftruncate(fd, (off_t)(data_start + data)) != 0) status = WK_FAIL_ERRNO("size", path);
  if (fd >= 0 && close(fd) != 0 && status == WK_OK) status = WK_FAIL_ERRNO("close", path);
  free(header.data);
  return status;
}

WkStatus wk_safetensors_write_at(const char *path, uint64_t offset, const WkTensor *t) {
  if (!t) return WK_FAIL(WK_ERR_INVALID_ARG, "safetensors write '%s': no tensor", path);
  int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return WK_FAIL_ERRNO("open", path);
  uint8_t prefix[HEADER_LENGTH_BYTES];
  WkStatus status = read_exactly(fd, prefix, sizeof prefix, 0, path);
  uint64_t header = 0;
  for (int b = 0; b < HEADER_LENGTH_BYTES; b++) header |= (uint64_t)prefix[b] << (8 * b);
  uint64_t bytes = (uint64_t)wk_tensor_numel(t) * wk_dtype_size(t->dtype), at = HEADER_LENGTH_BYTES + header + offset;
  struct stat st;
  if (status == WK_OK && fstat(fd, &st) != 0) status = WK_FAIL_ERRNO("stat", path);
  if (status == WK_OK && (at < offset || at + bytes > (uint64_t)st.st_size))
    status = WK_FAIL(WK_ERR_INVALID_ARG, "safetensors write '%s': %llu bytes at data offset %llu run past its end", path,
                     (unsigned long long)bytes, (unsigned long long)offset);
  if (status == WK_OK) status = write_tensor_at(fd, t, at, path);
  if (close(fd) != 0 && status == WK_OK) status = WK_FAIL_ERRNO("close", path);
  return status;
}
