/*
 * codec.c — decompressing Parquet pages: UNCOMPRESSED, SNAPPY (libsnappy's C API), GZIP (zlib,
 * gzip or zlib headers, several members), ZSTD. Each page says its uncompressed size; a page that
 * decompresses to any other size is corrupt. Other codecs (LZO, BROTLI, LZ4) are refused by name.
 */
#include <string.h>

#include <snappy-c.h>  /* snappy_uncompressed_length, snappy_uncompress */
#include <zlib.h>      /* inflate for GZIP pages */
#include <zstd.h>      /* ZSTD_decompress */

#include "parquet.h"

enum { ZLIB_AUTO_HEADER = 15 + 32 }; /* windowBits: the largest window, gzip or zlib header detected */

static const char *const CODECS[] = {"UNCOMPRESSED", "SNAPPY", "GZIP", "LZO", "BROTLI", "LZ4", "ZSTD", "LZ4_RAW"};

const char *parquet_codec_name(int32_t codec) {
  return codec >= 0 && (size_t)codec < sizeof CODECS / sizeof CODECS[0] ? CODECS[codec] : "unknown";
}

static WkStatus gunzip(const uint8_t *src, size_t src_length, uint8_t *dst, size_t dst_length, const char *what) {
  z_stream z;
  memset(&z, 0, sizeof z);
  int rc = inflateInit2(&z, ZLIB_AUTO_HEADER);
  if (rc != Z_OK) return WK_FAIL(WK_ERR_NOMEM, "%s: zlib inflateInit2 failed (%d)", what, rc);
  z.next_in = (Bytef *)src;
  z.next_out = dst;
  WkStatus status = WK_OK;
  /* zlib counts in uInt: feed and drain in pieces it can count. */
  size_t in_left = src_length, out_left = dst_length;
  for (;;) {
    uInt in = in_left > UINT32_MAX ? UINT32_MAX : (uInt)in_left, out = out_left > UINT32_MAX ? UINT32_MAX : (uInt)out_left;
    z.avail_in = in;
    z.avail_out = out;
    rc = inflate(&z, Z_NO_FLUSH);
    in_left -= in - z.avail_in;
    out_left -= out - z.avail_out;
    if (rc == Z_STREAM_END && in_left > 0) { /* another gzip member follows */
      if (inflateReset(&z) != Z_OK) { status = WK_FAIL(WK_ERR_FORMAT, "%s: gzip: cannot reset for the next member", what); break; }
      continue;
    }
    if (rc == Z_STREAM_END) break;
    if (rc == Z_OK && (in_left > 0 && out_left > 0)) continue;
    if (rc == Z_OK || rc == Z_BUF_ERROR) {
      status = WK_FAIL(WK_ERR_FORMAT, "%s: gzip data %s", what,
                       out_left == 0 ? "decompresses to more than the page's size" : "ends early (truncated)");
    } else {
      status = WK_FAIL(WK_ERR_FORMAT, "%s: gzip: %s", what, z.msg ? z.msg : "corrupt data");
    }
    break;
  }
  if (status == WK_OK && out_left != 0)
    status = WK_FAIL(WK_ERR_FORMAT, "%s: gzip data decompresses to %zu bytes, the page says %zu", what,
                     dst_length - out_left, dst_length);
  inflateEnd(&z);
  return status;
}

WkStatus parquet_decompress(int32_t codec, const uint8_t *src, size_t src_length, uint8_t *dst, size_t dst_length,
                            const char *what) {
  switch (codec) {
    case PARQUET_UNCOMPRESSED:
      if (src_length != dst_length)
        return WK_FAIL(WK_ERR_FORMAT, "%s: an uncompressed page of %zu bytes says it holds %zu", what, src_length,
                       dst_length);
      if (dst_length) memcpy(dst, src, dst_length);
      return WK_OK;
    case PARQUET_SNAPPY: {
      size_t n = 0;
      if (snappy_uncompressed_length((const char *)src, src_length, &n) != SNAPPY_OK || n != dst_length)
        return WK_FAIL(WK_ERR_FORMAT, "%s: snappy data %s the page's %zu bytes", what,
                       n ? "does not decompress to" : "is corrupt, not", dst_length);
      n = dst_length;
      if (snappy_uncompress((const char *)src, src_length, (char *)dst, &n) != SNAPPY_OK || n != dst_length)
        return WK_FAIL(WK_ERR_FORMAT, "%s: snappy data is corrupt", what);
      return WK_OK;
    }
    case PARQUET_GZIP: return gunzip(src, src_length, dst, dst_length, what);
    case PARQUET_ZSTD: {
      size_t n = ZSTD_decompress(dst, dst_length, src, src_length);
      if (ZSTD_isError(n)) return WK_FAIL(WK_ERR_FORMAT, "%s: zstd: %s", what, ZSTD_getErrorName(n));
      if (n != dst_length)
        return WK_FAIL(WK_ERR_FORMAT, "%s: zstd data decompresses to %zu bytes, the page says %zu", what, n, dst_length);
      return WK_OK;
    }
  }
  return WK_FAIL(WK_ERR_UNSUPPORTED, "%s: compression %s (%d) is not supported (only uncompressed, snappy, gzip, zstd)",
                 what, parquet_codec_name(codec), (int)codec);
}
