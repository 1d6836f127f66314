/*
 * url.c — locations of remote datasets: parsing and validation, joining a dataset's URL with a shard
 * name from its index, and the content hashes that name cache entries.
 *
 * Accepted: http://host[:port]/path, https://..., s3://bucket[/key], file://path and plain paths. Refused
 * with a reason: user:password@ (credentials would be printed in every message; S3 takes them from the
 * environment), queries and fragments (each shard is fetched by its own URL, a query would not follow
 * it), spaces and control characters, empty hosts, ports outside 1..65535, bucket names S3 would refuse.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>  /* XXH3_128bits */

#include "remote.h"

enum {
  MAX_URL_BYTES = 8192,
  MAX_PORT = 65535,
  MIN_BUCKET = 3,   /* S3 bucket names are 3..63 characters of [a-z0-9.-] */
  MAX_BUCKET = 63,
};

static const struct {
  const char *prefix;
  WkUrlScheme scheme;
} SCHEMES[] = {{"http://", WK_URL_HTTP}, {"https://", WK_URL_HTTPS}, {"s3://", WK_URL_S3}, {"file://", WK_URL_FILE}};

static bool is_host_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
         c == '_';
}

static WkStatus bad(const char *text, const char *why) {
  return WK_FAIL(WK_ERR_INVALID_ARG, "location '%s': %s", text, why);
}

/* host, [v6], with an optional :port. */
static WkStatus check_host(const char *text, const char *host, size_t n) {
  if (n == 0) return bad(text, "no host after '://'");
  size_t name_end = n;
  if (host[0] == '[') {
    const char *close = memchr(host, ']', n);
    if (!close) return bad(text, "an IPv6 address needs a closing ']'");
    for (const char *p = host + 1; p < close; p++)
      if (!(is_host_char(*p) || *p == ':')) return bad(text, "bad character in the IPv6 address");
    name_end = (size_t)(close - host) + 1;
  } else {
    const char *colon = memchr(host, ':', n);
    name_end = colon ? (size_t)(colon - host) : n;
    if (name_end == 0) return bad(text, "no host name before the port");
    for (size_t i = 0; i < name_end; i++)
      if (!is_host_char(host[i])) return bad(text, "bad character in the host name");
  }
  if (name_end == n) return WK_OK;
  if (host[name_end] != ':' || name_end + 1 == n) return bad(text, "expected ':port' after the host");
  long port = 0;
  for (size_t i = name_end + 1; i < n; i++) {
    if (host[i] < '0' || host[i] > '9') return bad(text, "the port must be a number");
    port = port * 10 + (host[i] - '0');
    if (port > MAX_PORT) return bad(text, "the port must be in 1..65535");
  }
  if (port == 0) return bad(text, "the port must be in 1..65535");
  return WK_OK;
}

static WkStatus check_bucket(const char *text, const char *bucket, size_t n) {
  if (n < MIN_BUCKET || n > MAX_BUCKET)
    return bad(text, "an S3 bucket name has 3 to 63 characters (s3://bucket/prefix)");
  for (size_t i = 0; i < n; i++) {
    char c = bucket[i];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.'))
      return bad(text, "an S3 bucket name has lowercase letters, digits, '-' and '.' only");
  }
  return WK_OK;
}

WkStatus wk_url_parse(const char *text, WkUrl *out) {
  memset(out, 0, sizeof *out);
  if (!text) return WK_FAIL(WK_ERR_INVALID_ARG, "location is NULL");
  size_t length = strlen(text);
  if (length == 0) return WK_FAIL(WK_ERR_INVALID_ARG, "location is empty");
  if (length > MAX_URL_BYTES) return WK_FAIL(WK_ERR_INVALID_ARG, "location of %zu bytes is too long", length);
  const char *rest = NULL;
  out->scheme = WK_URL_FILE;
  for (size_t i = 0; i < sizeof SCHEMES / sizeof SCHEMES[0]; i++) {
    size_t n = strlen(SCHEMES[i].prefix);
    if (strncmp(text, SCHEMES[i].prefix, n) == 0) {
      out->scheme = SCHEMES[i].scheme;
      rest = text + n;
    }
  }
  if (!rest) {
    const char *sep = strstr(text, "://");
    if (sep && sep > text && strspn(text, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-") ==
                                 (size_t)(sep - text))
      return bad(text, "unknown scheme (use http://, https://, s3:// or file://)");
    rest = text; /* a local path */
  }
  for (const char *p = text; *p; p++)
    if ((unsigned char)*p < 0x20 || *p == 0x7f) return bad(text, "control character");
  if (out->scheme == WK_URL_FILE) {
    out->host = strdup("");
    out->path = strdup(rest);
  } else {
    for (const char *p = rest; *p; p++) {
      if (*p == ' ') return bad(text, "spaces must be written %20");
      if (*p == '?' || *p == '#')
        return bad(text, "queries and fragments are not supported (each shard is fetched by its own URL)");
    }
    const char *slash = strchr(rest, '/');
    size_t host_length = slash ? (size_t)(slash - rest) : strlen(rest);
    if (memchr(rest, '@', host_length))
      return bad(text, "credentials in a URL are not supported (they would show in every message; S3 reads "
                       "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)");
    WK_TRY(out->scheme == WK_URL_S3 ? check_bucket(text, rest, host_length) : check_host(text, rest, host_length));
    out->host = strndup(rest, host_length);
    if (out->scheme == WK_URL_S3) out->path = strdup(slash ? slash + 1 : "");
    else out->path = strdup(slash ? slash : "/");
  }
  if (!out->host || !out->path) {
    wk_url_free(out);
    return WK_FAIL(WK_ERR_NOMEM, "out of memory parsing location '%s'", text);
  }
  return WK_OK;
}

void wk_url_free(WkUrl *url) {
  free(url->host);
  free(url->path);
  url->host = url->path = NULL;
}

/* RFC 3986 unreserved characters plus '/', which separates a name's directories. */
static bool keep_in_path(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
         c == '_' || c == '~' || c == '/';
}

char *wk_url_join(const char *base, const char *name) {
  size_t b = strlen(base), n = strlen(name);
  while (b > 0 && base[b - 1] == '/') b--;
  char *out = wk_malloc(b + 1 + 3 * n + 1, "URL");
  if (!out) return NULL;
  memcpy(out, base, b);
  char *p = out + b;
  *p++ = '/';
  static const char HEX[] = "0123456789ABCDEF";
  for (const unsigned char *s = (const unsigned char *)name; *s; s++) {
    if (keep_in_path(*s)) {
      *p++ = (char)*s;
    } else {
      *p++ = '%';
      *p++ = HEX[*s >> 4];
      *p++ = HEX[*s & 15];
    }
  }
  *p = '\0';
  return out;
}

void wk_hash_hex128(const void *data, size_t length, char out[33]) {
  XXH128_hash_t h = XXH3_128bits(data, length);
  snprintf(out, 33, "%016llx%016llx", (unsigned long long)h.high64, (unsigned long long)h.low64);
}
