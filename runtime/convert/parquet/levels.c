/*
 * levels.c — Parquet's RLE / bit-packed hybrid encoding, which holds definition levels and dictionary
 * indices: a sequence of runs, each a ULEB128 header whose low bit says which kind it is:
 *   0: a repeated run: header >> 1 copies of one value, stored in ceil(bit_width / 8) bytes
 *   1: a bit-packed run: (header >> 1) groups of 8 values, bit_width bits each, least significant
 *      bit first
 * A run is handed out whole when it repeats (a million nulls are one call), value by value when it
 * is packed. Lengths are checked against the bytes there are before anything is read.
 */
#include "parquet.h"

enum { MAX_BIT_WIDTH = 32, MAX_HEADER_BYTES = 10, BITS_PER_BYTE = 8, GROUP_VALUES = 8 };

WkStatus rle_init(Rle *r, const uint8_t *data, size_t length, int bit_width) {
  *r = (Rle){.p = data, .end = data + length, .bit_width = bit_width};
  if (bit_width < 0 || bit_width > MAX_BIT_WIDTH)
    return WK_FAIL(WK_ERR_FORMAT, "a bit width of %d (at most %d)", bit_width, MAX_BIT_WIDTH);
  return WK_OK;
}

static WkStatus header(Rle *r, uint64_t *out) {
  uint64_t v = 0;
  for (int i = 0; i < MAX_HEADER_BYTES; i++) {
    if (r->p >= r->end) return WK_FAIL(WK_ERR_FORMAT, "the encoded values end before the values do");
    uint8_t b = *r->p++;
    v |= (uint64_t)(b & 0x7f) << (7 * i);
    if (!(b & 0x80)) {
      *out = v;
      return WK_OK;
    }
  }
  return WK_FAIL(WK_ERR_FORMAT, "a run header longer than %d bytes", MAX_HEADER_BYTES);
}

/* Starts the next run; repeat or packed becomes non-zero unless the run is empty. */
static WkStatus next_run(Rle *r) {
  uint64_t h = 0;
  WK_TRY(header(r, &h));
  uint64_t n = h >> 1;
  size_t left = (size_t)(r->end - r->p);
  if (h & 1) {
    /* n groups of bit_width bytes (8 values of bit_width bits). */
    if (r->bit_width > 0 && n > left / (size_t)r->bit_width)
      return WK_FAIL(WK_ERR_FORMAT, "a bit-packed run of %llu groups runs past the end of its data",
                     (unsigned long long)n);
    if (n > UINT64_MAX / GROUP_VALUES) return WK_FAIL(WK_ERR_FORMAT, "a bit-packed run of %llu groups", (unsigned long long)n);
    r->packed = n * GROUP_VALUES;
    r->bit = 0;
    return WK_OK;
  }
  size_t bytes = (size_t)(r->bit_width + BITS_PER_BYTE - 1) / BITS_PER_BYTE;
  if (bytes > left) return WK_FAIL(WK_ERR_FORMAT, "a repeated run's value runs past the end of its data");
  uint32_t v = 0;
  for (size_t i = 0; i < bytes; i++) v |= (uint32_t)r->p[i] << (BITS_PER_BYTE * i);
  r->p += bytes;
  if (r->bit_width < MAX_BIT_WIDTH && v >> r->bit_width)
    return WK_FAIL(WK_ERR_FORMAT, "a repeated value %u wider than %d bits", v, r->bit_width);
  r->value = v;
  r->repeat = n;
  return WK_OK;
}

/* The next value of the packed run: bit_width bits at bit position r->bit from r->p. */
static uint32_t packed_value(Rle *r) {
  uint64_t v = 0;
  size_t first = (size_t)(r->bit / BITS_PER_BYTE), shift = (size_t)(r->bit % BITS_PER_BYTE);
  size_t bytes = (shift + (size_t)r->bit_width + BITS_PER_BYTE - 1) / BITS_PER_BYTE;
  for (size_t i = 0; i < bytes; i++) v |= (uint64_t)r->p[first + i] << (BITS_PER_BYTE * i);
  r->bit += (uint64_t)r->bit_width;
  return (uint32_t)((v >> shift) & ((UINT64_C(1) << r->bit_width) - 1));
}

WkStatus rle_run(Rle *r, uint64_t max, uint32_t *value, uint64_t *count) {
  while (r->repeat == 0 && r->packed == 0) WK_TRY(next_run(r));
  if (r->repeat) {
    uint64_t n = r->repeat < max ? r->repeat : max;
    r->repeat -= n;
    *value = r->value;
    *count = n;
    return WK_OK;
  }
  *value = r->bit_width ? packed_value(r) : 0;
  *count = 1;
  if (--r->packed == 0) r->p += (size_t)(r->bit / BITS_PER_BYTE); /* the run's groups x bit_width bytes */
  return WK_OK;
}
