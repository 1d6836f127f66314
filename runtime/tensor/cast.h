/*
 * cast.h — what one element of a dtype becomes in another: the rules of every cast, on both devices.
 * cast.c runs them in typed CPU loops, runtime/tensor/cuda/copy.cu in its casting copy kernel, so a
 * tensor cast on the GPU gives the very bits the CPU gives.
 *
 * What each element becomes is what the former path through double gave on x86, now written without
 * undefined behaviour, so that no compiler, vectorizing or not, may change it:
 *   float dtypes (f32, bf16, f16) to float dtypes: widened exactly to f32, then rounded to nearest even
 *     (wk_f32_to_bf16, wk_f32_to_f16: f16 overflows to inf; NaN stays NaN);
 *   integers to float dtypes: the nearest double, then the nearest f32, then bf16/f16 (exact up to
 *     2^24; an i64 is rounded twice, as before);
 *   float dtypes to integers: truncated toward zero into int32 (i32, u16, u8) or int64 (i64); NaN and
 *     values outside that range give INT32_MIN / INT64_MIN (x86's answer, so the double path's); u16
 *     and u8 keep the low bits of the int32 (-1.5 -> 65535 / 255, 1e10 -> 0);
 *   integers to integers: reduced modulo 2^bits (-1 -> 65535 as u16), like numpy's astype and torch.
 * Two results differ from the double path, as fixes: an i64 outside the int32 range used to become
 * INT32_MIN as i32 and 0 as u16 or u8 (now its low bits), and a signalling NaN in bf16 used to be made
 * quiet on its way to f32 (now widened bit for bit, as for every other bf16 value).
 */
#ifndef WK_TENSOR_CAST_H
#define WK_TENSOR_CAST_H

#include "tensor.h"

/* Each dtype loads into one of two value types, float (f32, bf16 and f16 are all exact in it) or
 * int64_t (every integer dtype is), and each dtype is made from either. */

#define WK_INT32_LIMIT 2147483648.0f           /* 2^31: int32 holds [-2^31, 2^31) */
#define WK_INT64_LIMIT 9223372036854775808.0f  /* 2^63 */

/* Out-of-range values and NaN are mapped to -limit before the cast, which keeps it defined (and lets
 * gcc vectorize it as a compare, a blend and one cvttps2dq; the GPU's cvt would saturate instead). */
WK_HOST_DEVICE static inline int32_t int32_truncated(float v) {
  return (int32_t)(v >= -WK_INT32_LIMIT && v < WK_INT32_LIMIT ? v : -WK_INT32_LIMIT);
}
WK_HOST_DEVICE static inline int64_t int64_truncated(float v) {
  return (int64_t)(v >= -WK_INT64_LIMIT && v < WK_INT64_LIMIT ? v : -WK_INT64_LIMIT);
}

WK_HOST_DEVICE static inline float f32_load(float x) { return x; }
WK_HOST_DEVICE static inline float bf16_load(uint16_t x) { return wk_bf16_to_f32(x); }
WK_HOST_DEVICE static inline float f16_load(uint16_t x) { return wk_f16_to_f32(x); }
WK_HOST_DEVICE static inline int64_t i32_load(int32_t x) { return x; }
WK_HOST_DEVICE static inline int64_t i64_load(int64_t x) { return x; }
WK_HOST_DEVICE static inline int64_t u16_load(uint16_t x) { return x; }
WK_HOST_DEVICE static inline int64_t u8_load(uint8_t x) { return x; }

WK_HOST_DEVICE static inline float f32_from_real(float v) { return v; }
WK_HOST_DEVICE static inline uint16_t bf16_from_real(float v) { return wk_f32_to_bf16(v); }
WK_HOST_DEVICE static inline uint16_t f16_from_real(float v) { return wk_f32_to_f16(v); }
WK_HOST_DEVICE static inline int32_t i32_from_real(float v) { return int32_truncated(v); }
WK_HOST_DEVICE static inline int64_t i64_from_real(float v) { return int64_truncated(v); }
WK_HOST_DEVICE static inline uint16_t u16_from_real(float v) { return (uint16_t)int32_truncated(v); }
WK_HOST_DEVICE static inline uint8_t u8_from_real(float v) { return (uint8_t)int32_truncated(v); }

/* Through double, as before: an i64 is rounded twice. A value that fits int32 is exact in double, so
 * converting it straight rounds the same, and lets gcc vectorize the i32, u16 and u8 sources. */
WK_HOST_DEVICE static inline float f32_from_integer(int64_t v) {
  return v == (int32_t)v ? (float)(int32_t)v : (float)(double)v;
}
WK_HOST_DEVICE static inline uint16_t bf16_from_integer(int64_t v) { return wk_f32_to_bf16(f32_from_integer(v)); }
WK_HOST_DEVICE static inline uint16_t f16_from_integer(int64_t v) { return wk_f32_to_f16(f32_from_integer(v)); }
/* Narrowing to a signed type keeps the low bits (gcc, clang and nvcc define it so); to unsigned, C does. */
WK_HOST_DEVICE static inline int32_t i32_from_integer(int64_t v) { return (int32_t)v; }
WK_HOST_DEVICE static inline int64_t i64_from_integer(int64_t v) { return v; }
WK_HOST_DEVICE static inline uint16_t u16_from_integer(int64_t v) { return (uint16_t)v; }
WK_HOST_DEVICE static inline uint8_t u8_from_integer(int64_t v) { return (uint8_t)v; }

#endif /* WK_TENSOR_CAST_H */
