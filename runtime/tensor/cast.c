/*
 * cast.c — CPU copies between any two dtypes and layouts: one typed loop per (source, destination)
 * dtype pair, run over the source's innermost runs.
 *
 * The source layout is collapsed first (size-1 dims dropped, dims contiguous with each other merged),
 * so a contiguous source is one run and a sliced or transposed one a run per innermost row, walked by
 * an odometer over the outer dims. Each run goes through a plain loop over typed pointers, which
 * gcc -O3 vectorizes on the x86-64 baseline (SSE2) for every pair but those between i64 and a float
 * dtype (SSE2 has no packed int64 <-> float conversion; they stay scalar loops). The 49 loops come from
 * one macro over the dtype list below. Same-dtype pairs copy bits unchanged (NaN payloads included);
 * wk_tensor_copy moves a contiguous same-dtype source with memmove before it gets here.
 *
 * What each element becomes is written once, in cast.h, which the GPU casts compile too.
 * Source and destination must not overlap (a borrowed tensor could alias another): the loops assume it.
 */
#include "cast.h"

/* ---- dtypes: enum, name, storage type --------------------------------------------------------- */

/* X(arg, enum, name, storage type) for every dtype; `arg` passes through (the pair grid uses it). */
#define DTYPES(X, arg)                   \
  X(arg, WK_F32, f32, float)             \
  X(arg, WK_BF16, bf16, uint16_t)        \
  X(arg, WK_F16, f16, uint16_t)          \
  X(arg, WK_I32, i32, int32_t)           \
  X(arg, WK_I64, i64, int64_t)           \
  X(arg, WK_U16, u16, uint16_t)          \
  X(arg, WK_U8, u8, uint8_t)

#define COUNT_DTYPE(arg, e, name, type) +1
_Static_assert(0 DTYPES(COUNT_DTYPE, ~) == WK_DTYPE_COUNT, "cast.c: DTYPES must list every WkDType");

/* name_t: the storage type; name_code: the WkDType. */
#define STORAGE_TYPE(arg, e, name, type) \
  typedef type name##_t;                 \
  enum { name##_code = e };
DTYPES(STORAGE_TYPE, ~)

/* Element x of dtype src as dtype dst, through the value type src loads into; the same dtype is the
 * same bits (the comparison is a constant: the compiler keeps one side). */
#define CONVERTED(src, dst, x)                                                                            \
  ((int)src##_code == (int)dst##_code                                                                     \
       ? (dst##_t)(x)                                                                                     \
       : _Generic(src##_load(x), float: dst##_from_real, int64_t: dst##_from_integer)(src##_load(x)))

/* ---- the loops ------------------------------------------------------------------------------------ */

/* n elements from src, stride elements apart, into contiguous dst. */
typedef void (*ConvertRun)(void *restrict dst, const void *restrict src, int64_t stride, int64_t n);

#define CONVERT_RUN(src, dst)                                                                          \
  static void convert_##src##_##dst(void *restrict out, const void *restrict in, int64_t stride, int64_t n) { \
    dst##_t *restrict d = out;                                                                         \
    const src##_t *restrict s = in;                                                                    \
    if (stride == 1) {                                                                                 \
      for (int64_t i = 0; i < n; i++) d[i] = CONVERTED(src, dst, s[i]);                                \
    } else {                                                                                           \
      for (int64_t i = 0; i < n; i++) d[i] = CONVERTED(src, dst, s[i * stride]);                       \
    }                                                                                                  \
  }

/* The grid of pairs expands DTYPES inside DTYPES, which one scan of the preprocessor refuses: the inner
 * expansion is deferred (DEFER) and done by a second scan (EXPAND). */
#define EMPTY()
#define DEFER(macro) macro EMPTY()
#define EXPAND(...) __VA_ARGS__
#define DTYPES_AGAIN() DTYPES

#define RUN_FOR_PAIR(src, dst_enum, dst, dst_type) CONVERT_RUN(src, dst)
#define RUNS_FROM(arg, src_enum, src, src_type) DEFER(DTYPES_AGAIN)()(RUN_FOR_PAIR, src)
EXPAND(DTYPES(RUNS_FROM, ~))

#define ENTRY_FOR_PAIR(src, dst_enum, dst, dst_type) [dst_enum] = convert_##src##_##dst,
#define ROW_FROM(arg, src_enum, src, src_type) [src_enum] = {DEFER(DTYPES_AGAIN)()(ENTRY_FOR_PAIR, src)},
static const ConvertRun convert_runs[WK_DTYPE_COUNT][WK_DTYPE_COUNT] = {EXPAND(DTYPES(ROW_FROM, ~))};

/* ---- walking the source ------------------------------------------------------------------------- */

/* The source's layout with size-1 dims dropped and mergeable dims merged; at least one dim. */
static int collapse_layout(const WkTensor *t, int64_t *shape, int64_t *strides) {
  int ndim = 0;
  for (int d = 0; d < t->ndim; d++) {
    if (t->shape[d] == 1) continue;
    if (ndim > 0 && strides[ndim - 1] == t->strides[d] * t->shape[d]) {
      shape[ndim - 1] *= t->shape[d];
      strides[ndim - 1] = t->strides[d];
    } else {
      shape[ndim] = t->shape[d];
      strides[ndim] = t->strides[d];
      ndim++;
    }
  }
  if (ndim == 0) {
    shape[0] = strides[0] = 1;
    ndim = 1;
  }
  return ndim;
}

void wk_tensor_copy_cpu(WkTensor *dst, const WkTensor *src) {
  int64_t n = wk_tensor_numel(dst);
  if (n == 0) return;
  int64_t shape[WK_MAX_DIMS], strides[WK_MAX_DIMS], index[WK_MAX_DIMS] = {0};
  int ndim = collapse_layout(src, shape, strides);
  int64_t inner = shape[ndim - 1], inner_stride = strides[ndim - 1];
  ptrdiff_t in_size = (ptrdiff_t)wk_dtype_size(src->dtype), out_size = (ptrdiff_t)wk_dtype_size(dst->dtype);
  const char *in = tensor_ptr(src);
  char *out = tensor_ptr(dst);
  ConvertRun run = convert_runs[src->dtype][dst->dtype];
  int64_t at = 0;  /* elements from `in` to the current run */
  for (int64_t done = 0; done < n; done += inner) {
    run(out + done * out_size, in + at * in_size, inner_stride, inner);
    for (int d = ndim - 2; d >= 0; d--) {  /* the next run: an odometer over the outer dims */
      at += strides[d];
      if (++index[d] < shape[d]) break;
      at -= strides[d] * shape[d];
      index[d] = 0;
    }
  }
}
