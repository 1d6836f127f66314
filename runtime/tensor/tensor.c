/*
 * tensor.c — tensor handles: creation, views, accessors, copies and casts, debug element access.
 *
 * A WkTensor is small and owned by one caller; its storage is shared by reference count. Copies
 * that involve a device go through the CUDA module (runtime/tensor/cuda/copy.cu); CPU copies that
 * cast or gather run the typed loops of cast.c. Element access (get/set) goes through double, for
 * debugging.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_module.h"

/* ---- dtypes ---------------------------------------------------------------------------------- */

static const char *const dtype_names[WK_DTYPE_COUNT] = {"f32", "bf16", "f16", "i32", "i64", "u16", "u8"};
static const size_t dtype_sizes[WK_DTYPE_COUNT] = {4, 2, 2, 4, 8, 2, 1};

static bool dtype_valid(WkDType dtype) { return (int)dtype >= 0 && dtype < WK_DTYPE_COUNT; }

const char *wk_dtype_name(WkDType dtype) { return dtype_valid(dtype) ? dtype_names[dtype] : "?"; }
size_t wk_dtype_size(WkDType dtype) { return dtype_valid(dtype) ? dtype_sizes[dtype] : 0; }

/* ---- creation and views ---------------------------------------------------------------------- */

static WkStatus check_shape(int ndim, const int64_t *shape, int64_t *numel) {
  if (ndim < 0 || ndim > WK_MAX_DIMS)
    return WK_FAIL(WK_ERR_INVALID_ARG, "tensor rank %d out of range 0..%d", ndim, WK_MAX_DIMS);
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 0) return WK_FAIL(WK_ERR_INVALID_ARG, "tensor dim %d has negative size %lld", d, (long long)shape[d]);
    if (shape[d] > 0 && n > INT64_MAX / 16 / shape[d])
      return WK_FAIL(WK_ERR_INVALID_ARG, "tensor shape overflows at dim %d", d);
    n *= shape[d];
  }
  *numel = n;
  return WK_OK;
}

static void set_contiguous_strides(WkTensor *t) {
  int64_t stride = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    t->strides[d] = stride;
    stride *= t->shape[d];
  }
}

static WkTensor *tensor_on_storage(WkStorage *s, WkDType dtype, int ndim, const int64_t *shape) {
  WkTensor *t = wk_calloc(1, sizeof *t, "tensor");
  if (!t) return NULL;
  t->storage = s;
  t->dtype = dtype;
  t->ndim = ndim;
  memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
  set_contiguous_strides(t);
  return t;
}

static WkTensor *tensor_new(WkDType dtype, int ndim, const int64_t *shape, MemoryKind kind, int device_index) {
  int64_t numel;
  if (!dtype_valid(dtype)) {
    WK_FAIL(WK_ERR_INVALID_ARG, "unknown dtype %d", (int)dtype);
    return NULL;
  }
  if (check_shape(ndim, shape, &numel) != WK_OK) return NULL;
  WkStorage *s;
  if (wk_storage_new(kind, device_index, (size_t)numel * dtype_sizes[dtype], &s) != WK_OK) return NULL;
  WkTensor *t = tensor_on_storage(s, dtype, ndim, shape);
  if (!t) wk_storage_release(s);
  return t;
}

WkTensor *wk_tensor_empty(WkDType dtype, int ndim, const int64_t *shape, WkDeviceType device, int device_index) {
  if (device != WK_DEVICE_CPU && device != WK_DEVICE_CUDA) {
    WK_FAIL(WK_ERR_INVALID_ARG, "unknown device type %d", (int)device);
    return NULL;
  }
  return tensor_new(dtype, ndim, shape, device == WK_DEVICE_CUDA ? MEMORY_CUDA : MEMORY_HOST, device_index);
}

WkTensor *wk_tensor_empty_pinned(WkDType dtype, int ndim, const int64_t *shape) {
  return tensor_new(dtype, ndim, shape, MEMORY_PINNED, 0);
}

WkTensor *wk_tensor_borrow(void *data, WkDType dtype, int ndim, const int64_t *shape) {
  if (!data) {
    WK_FAIL(WK_ERR_INVALID_ARG, "borrow: data is NULL");
    return NULL;
  }
  WkTensor *t = tensor_new(dtype, ndim, shape, MEMORY_BORROWED, 0);
  if (t) t->storage->data = data;
  return t;
}

WkTensor *wk_tensor_on_storage(WkStorage *s, size_t byte_offset, WkDType dtype, int ndim, const int64_t *shape) {
  int64_t numel;
  if (!dtype_valid(dtype)) {
    WK_FAIL(WK_ERR_INVALID_ARG, "unknown dtype %d", (int)dtype);
    return NULL;
  }
  if (check_shape(ndim, shape, &numel) != WK_OK) return NULL;
  size_t size = dtype_sizes[dtype], bytes = (size_t)numel * size;
  if (byte_offset % size != 0 || byte_offset > s->bytes || bytes > s->bytes - byte_offset) {
    WK_FAIL(WK_ERR_INVALID_ARG, "%zu bytes of %s at byte %zu do not fit a storage of %zu bytes (or are misaligned)",
            bytes, dtype_names[dtype], byte_offset, s->bytes);
    return NULL;
  }
  WkTensor *t = tensor_on_storage(s, dtype, ndim, shape);
  if (!t) return NULL;
  t->offset = (int64_t)(byte_offset / size);
  atomic_fetch_add((_Atomic int *)&s->refcount, 1);
  return t;
}

WkTensor *wk_tensor_view(const WkTensor *t, int64_t offset, int ndim, const int64_t *shape, const int64_t *strides) {
  int64_t numel;
  if (check_shape(ndim, shape, &numel) != WK_OK) return NULL;
  /* Every element the view can reach must lie inside the storage. */
  int64_t lo = offset, hi = offset;
  for (int d = 0; d < ndim && numel > 0; d++) {
    int64_t reach = (shape[d] - 1) * strides[d];
    if (reach < 0) lo += reach; else hi += reach;
  }
  int64_t capacity = (int64_t)(t->storage->bytes / dtype_sizes[t->dtype]);
  if (numel > 0 && (lo < 0 || hi >= capacity)) {
    WK_FAIL(WK_ERR_INVALID_ARG, "view reaches elements [%lld, %lld] outside the storage of %lld elements",
            (long long)lo, (long long)hi, (long long)capacity);
    return NULL;
  }
  WkTensor *v = tensor_on_storage(t->storage, t->dtype, ndim, shape);
  if (!v) return NULL;
  v->offset = offset;
  memcpy(v->strides, strides, (size_t)ndim * sizeof *strides);
  atomic_fetch_add((_Atomic int *)&t->storage->refcount, 1);
  return v;
}

WkTensor *wk_tensor_share(const WkTensor *t) {
  WkTensor *copy = wk_malloc(sizeof *copy, "tensor");
  if (!copy) return NULL;
  *copy = *t;
  atomic_fetch_add((_Atomic int *)&t->storage->refcount, 1);
  return copy;
}

void wk_tensor_free(WkTensor *t) {
  if (!t) return;
  wk_storage_release(t->storage);
  free(t);
}

/* ---- accessors ------------------------------------------------------------------------------- */

WkDType wk_tensor_dtype(const WkTensor *t) { return t->dtype; }
WkDeviceType wk_tensor_device(const WkTensor *t) { return tensor_device(t); }
int wk_tensor_device_index(const WkTensor *t) { return t->storage->device_index; }
int wk_tensor_ndim(const WkTensor *t) { return t->ndim; }
int64_t wk_tensor_size(const WkTensor *t, int dim) { return dim >= 0 && dim < t->ndim ? t->shape[dim] : 1; }
int64_t wk_tensor_stride(const WkTensor *t, int dim) { return dim >= 0 && dim < t->ndim ? t->strides[dim] : 1; }
int64_t wk_tensor_offset(const WkTensor *t) { return t->offset; }
void *wk_tensor_data(const WkTensor *t) { return tensor_ptr(t); }
int wk_tensor_same_storage(const WkTensor *a, const WkTensor *b) { return a->storage == b->storage; }

int64_t wk_tensor_numel(const WkTensor *t) {
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
  return n;
}

int wk_tensor_is_contiguous(const WkTensor *t) {
  int64_t stride = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->shape[d] != 1 && t->strides[d] != stride) return 0;
    stride *= t->shape[d];
  }
  return 1;
}

WkStatus wk_tensor_index_layout(const WkTensor *t, WkIndexLayout *out) {
  int64_t n = wk_tensor_numel(t);
  if (wk_tensor_is_contiguous(t)) {
    *out = (WkIndexLayout){.cols = n > 0 ? n : 1, .row_stride = n, .col_stride = 1};
  } else if (t->ndim == 1) {
    *out = (WkIndexLayout){.cols = t->shape[0] > 0 ? t->shape[0] : 1, .row_stride = 0, .col_stride = t->strides[0]};
  } else if (t->ndim == 2) {
    *out = (WkIndexLayout){.cols = t->shape[1] > 0 ? t->shape[1] : 1, .row_stride = t->strides[0],
                           .col_stride = t->strides[1]};
  } else {
    char got[128];
    return WK_FAIL(WK_ERR_INVALID_ARG, "%s (strided) cannot be read in place as rows of indices: make it contiguous "
                   "or a view of one or two dims", wk_tensor_describe(t, got, sizeof got));
  }
  return WK_OK;
}

const char *wk_tensor_describe(const WkTensor *t, char *buf, size_t size) {
  size_t used = (size_t)snprintf(buf, size, "[");
  for (int d = 0; d < t->ndim && used < size; d++)
    used += (size_t)snprintf(buf + used, size - used, d ? ", %lld" : "%lld", (long long)t->shape[d]);
  if (used >= size) return buf;
  if (tensor_device(t) == WK_DEVICE_CUDA)
    snprintf(buf + used, size - used, "] %s cuda:%d", wk_dtype_name(t->dtype), t->storage->device_index);
  else
    snprintf(buf + used, size - used, "] %s cpu", wk_dtype_name(t->dtype));
  return buf;
}

/* ---- element access -------------------------------------------------------------------------- */

/* Storage offset (elements) of the element at a flat logical (row-major) index. */
static int64_t logical_to_offset(const WkTensor *t, int64_t index) {
  int64_t offset = t->offset;
  for (int d = t->ndim - 1; d >= 0; d--) {
    offset += (index % t->shape[d]) * t->strides[d];
    index /= t->shape[d];
  }
  return offset;
}

static double load_element(const void *base, WkDType dtype, int64_t i) {
  switch (dtype) {
    case WK_F32: return ((const float *)base)[i];
    case WK_BF16: return wk_bf16_to_f32(((const uint16_t *)base)[i]);
    case WK_F16: return wk_f16_to_f32(((const uint16_t *)base)[i]);
    case WK_I32: return ((const int32_t *)base)[i];
    case WK_I64: return (double)((const int64_t *)base)[i];
    case WK_U16: return ((const uint16_t *)base)[i];
    case WK_U8: return ((const uint8_t *)base)[i];
    case WK_DTYPE_COUNT: break;
  }
  return NAN;
}

/* v truncated toward zero into int32 (i32, u16, u8) or int64, with NaN and values outside the type
 * giving its minimum: what x86 answers, so what the plain casts gave, without their undefined
 * behaviour (the copies of cast.c do the same from float). */
static const double INT32_LIMIT = 2147483648.0, INT64_LIMIT = 9223372036854775808.0;
static int32_t int32_truncated(double v) { return (int32_t)(v >= -INT32_LIMIT && v < INT32_LIMIT ? v : -INT32_LIMIT); }
static int64_t int64_truncated(double v) { return (int64_t)(v >= -INT64_LIMIT && v < INT64_LIMIT ? v : -INT64_LIMIT); }

static void store_element(void *base, WkDType dtype, int64_t i, double v) {
  switch (dtype) {
    case WK_F32: ((float *)base)[i] = (float)v; break;
    case WK_BF16: ((uint16_t *)base)[i] = wk_f32_to_bf16((float)v); break;
    case WK_F16: ((uint16_t *)base)[i] = wk_f32_to_f16((float)v); break;
    case WK_I32: ((int32_t *)base)[i] = int32_truncated(v); break;
    case WK_I64: ((int64_t *)base)[i] = int64_truncated(v); break;
    case WK_U16: ((uint16_t *)base)[i] = (uint16_t)int32_truncated(v); break;
    case WK_U8: ((uint8_t *)base)[i] = (uint8_t)int32_truncated(v); break;
    case WK_DTYPE_COUNT: break;
  }
}

static WkStatus check_element_access(const WkTensor *t, int64_t index) {
  if (tensor_device(t) != WK_DEVICE_CPU)
    return WK_FAIL(WK_ERR_INVALID_ARG, "element access needs a CPU tensor (copy it to the cpu first)");
  int64_t n = wk_tensor_numel(t);
  if (index < 0 || index >= n)
    return WK_FAIL(WK_ERR_INVALID_ARG, "element %lld out of range 0..%lld", (long long)index, (long long)n - 1);
  return WK_OK;
}

WkStatus wk_tensor_get(const WkTensor *t, int64_t index, double *out) {
  WK_TRY(check_element_access(t, index));
  *out = load_element(t->storage->data, t->dtype, logical_to_offset(t, index));
  return WK_OK;
}

WkStatus wk_tensor_set(WkTensor *t, int64_t index, double value) {
  WK_TRY(check_element_access(t, index));
  store_element(t->storage->data, t->dtype, logical_to_offset(t, index), value);
  return WK_OK;
}

/* ---- copies ---------------------------------------------------------------------------------- */

/* CPU to CPU: a contiguous same-dtype source is one memmove; anything else runs cast.c's loops. */
static void copy_on_cpu(WkTensor *dst, const WkTensor *src) {
  if (dst->dtype == src->dtype && wk_tensor_is_contiguous(src)) {
    memmove(tensor_ptr(dst), tensor_ptr(src), (size_t)wk_tensor_numel(dst) * dtype_sizes[dst->dtype]);
    return;
  }
  wk_tensor_copy_cpu(dst, src);
}

static WkStatus check_copy(const WkTensor *dst, const WkTensor *src) {
  char a[96], b[96];
  if (wk_tensor_numel(dst) != wk_tensor_numel(src))
    return WK_FAIL(WK_ERR_INVALID_ARG, "copy: %s and %s differ in element count",
                   wk_tensor_describe(dst, a, sizeof a), wk_tensor_describe(src, b, sizeof b));
  if (!wk_tensor_is_contiguous(dst))
    return WK_FAIL(WK_ERR_INVALID_ARG, "copy: destination %s must be contiguous", wk_tensor_describe(dst, a, sizeof a));
  return WK_OK;
}

/* Work queued on an explicit stream uses t's device block: the allocator must not hand it to another
 * stream before that work is done. */
static WkStatus mark_used_on(const WkTensor *t, WkStream *stream) {
  if (!stream || stream->device != WK_DEVICE_CUDA || tensor_device(t) != WK_DEVICE_CUDA) return WK_OK;
  return wk_cuda()->record_stream(t->storage->device_index, t->storage->data, stream->handle);
}

/* Crossing devices moves bytes only; a cast or a gather happens first on whichever side has the data,
 * on the given stream like the copy itself. */
static WkStatus copy_with_device(WkTensor *dst, const WkTensor *src, WkStream *stream) {
  const WkTensor *on_device = tensor_device(dst) == WK_DEVICE_CUDA ? dst : src;
  WK_TRY(wk_cuda_enter(on_device->storage->device_index));
  WK_TRY(mark_used_on(dst, stream));
  WK_TRY(mark_used_on(src, stream));
  size_t bytes = (size_t)wk_tensor_numel(dst) * dtype_sizes[dst->dtype];
  bool same_layout = dst->dtype == src->dtype && wk_tensor_is_contiguous(src);
  if (tensor_device(dst) == WK_DEVICE_CUDA && tensor_device(src) == WK_DEVICE_CUDA && !same_layout)
    return wk_cuda()->copy_convert(dst, src, stream);
  if (same_layout) return wk_cuda()->copy(tensor_ptr(dst), tensor_ptr(src), bytes, stream);
  /* Stage in dst's dtype and layout on src's side, then move bytes. */
  WkTensor *staged = wk_tensor_empty(dst->dtype, dst->ndim, dst->shape, tensor_device(src), src->storage->device_index);
  if (!staged) return wk_last_status();
  WkStatus status = tensor_device(src) == WK_DEVICE_CUDA ? wk_cuda()->copy_convert(staged, src, stream)
                                                         : (copy_on_cpu(staged, src), WK_OK);
  if (status == WK_OK) status = wk_cuda()->copy(tensor_ptr(dst), tensor_ptr(staged), bytes, stream);
  /* The staging buffer may still be read by a queued copy: wait before releasing it. */
  if (status == WK_OK) status = wk_stream_synchronize(stream);
  wk_tensor_free(staged);
  return status;
}

WkStatus wk_tensor_copy_async(WkTensor *dst, const WkTensor *src, WkStream *stream) {
  WK_TRY(check_copy(dst, src));
  if (tensor_device(dst) == WK_DEVICE_CPU && tensor_device(src) == WK_DEVICE_CPU) {
    copy_on_cpu(dst, src);
    return WK_OK;
  }
  return copy_with_device(dst, src, stream);
}

WkStatus wk_tensor_copy(WkTensor *dst, const WkTensor *src) {
  WK_TRY(wk_tensor_copy_async(dst, src, NULL));
  bool on_device = tensor_device(dst) == WK_DEVICE_CUDA || tensor_device(src) == WK_DEVICE_CUDA;
  return on_device ? wk_stream_synchronize(NULL) : WK_OK;
}
