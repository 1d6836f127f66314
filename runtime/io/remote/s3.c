/*
 * s3.c — S3 and S3-compatible stores: credentials, region and endpoint from the environment (each
 * variable checked), object URLs, the canonical query SigV4 needs, and ListObjectsV2.
 *
 * Signing is libcurl's (CURLOPT_AWS_SIGV4, set by fetch.c from WkS3Config). Two things it does not do,
 * done here: it signs the query as given, unsorted, so every query is built sorted and encoded
 * (wk_s3_canonical_query); and it does not add x-amz-content-sha256, which S3 requires, so fetch.c sends
 * the hash of the empty body (every request here is a GET) and libcurl signs that header too.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "remote.h"

enum {
  MAX_REGION = 64,
  MAX_KEY_ID = 256,
  MAX_LIST_BYTES = 16 << 20,     /* one ListObjectsV2 page (1000 keys) is far smaller */
  MAX_CONTINUATIONS = 1 << 20,   /* pages of one listing: a bound, not a limit anyone reaches */
};
static const char DEFAULT_REGION[] = "us-east-1";

static WkStatus bad_env(const char *variable, const char *why) {
  return WK_FAIL(WK_ERR_INVALID_ARG, "environment variable %s: %s", variable, why);
}

static bool printable(const char *s) {
  for (; *s; s++)
    if ((unsigned char)*s < 0x21 || (unsigned char)*s > 0x7e) return false;
  return true;
}

WkStatus wk_s3_config_from_env(WkS3Config *out) {
  memset(out, 0, sizeof *out);
  const char *id = getenv("AWS_ACCESS_KEY_ID"), *secret = getenv("AWS_SECRET_ACCESS_KEY");
  const char *token = getenv("AWS_SESSION_TOKEN"), *region = getenv("AWS_REGION");
  const char *endpoint = getenv("AWS_ENDPOINT_URL");
  if (!region || !*region) region = getenv("AWS_DEFAULT_REGION");
  if (!region || !*region) region = DEFAULT_REGION;
  if (strlen(region) > MAX_REGION || strspn(region, "abcdefghijklmnopqrstuvwxyz0123456789-") != strlen(region))
    return bad_env("AWS_REGION", "a region is lowercase letters, digits and '-' (like us-east-1)");
  if ((id && *id) != (secret && *secret))
    return bad_env(id && *id ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID",
                   "set both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or neither (unsigned requests)");
  if (id && *id && (strlen(id) > MAX_KEY_ID || !printable(id) || strchr(id, ':')))
    return bad_env("AWS_ACCESS_KEY_ID", "must be printable characters without ':' or spaces");
  if (secret && *secret && !printable(secret)) return bad_env("AWS_SECRET_ACCESS_KEY", "must be printable characters");
  if (token && *token && !printable(token)) return bad_env("AWS_SESSION_TOKEN", "must be printable characters");
  out->sign = id && *id;
  out->region = strdup(region);
  size_t sigv4_length = sizeof "aws:amz::s3" + strlen(region);
  out->sigv4 = wk_malloc(sigv4_length, "S3 signing parameters");
  if (out->sigv4) snprintf(out->sigv4, sigv4_length, "aws:amz:%s:s3", region);
  if (out->sign) {
    size_t n = strlen(id) + strlen(secret) + 2;
    out->userpwd = wk_malloc(n, "S3 credentials");
    if (out->userpwd) snprintf(out->userpwd, n, "%s:%s", id, secret);
    if (token && *token) {
      n = strlen(token) + sizeof "x-amz-security-token: ";
      out->token_header = wk_malloc(n, "S3 session token header");
      if (out->token_header) snprintf(out->token_header, n, "x-amz-security-token: %s", token);
    }
  }
  if (endpoint && *endpoint) {
    WkUrl url;
    if (wk_url_parse(endpoint, &url) != WK_OK || (url.scheme != WK_URL_HTTP && url.scheme != WK_URL_HTTPS)) {
      if (url.host) wk_url_free(&url);
      wk_s3_config_free(out);
      return bad_env("AWS_ENDPOINT_URL", "must be an http:// or https:// URL (like http://127.0.0.1:9000)");
    }
    wk_url_free(&url);
    size_t n = strlen(endpoint);
    while (n > 0 && endpoint[n - 1] == '/') n--;
    out->endpoint = strndup(endpoint, n);
    if (!out->endpoint) {
      wk_s3_config_free(out);
      return WK_FAIL(WK_ERR_NOMEM, "out of memory reading AWS_ENDPOINT_URL");
    }
  }
  if (!out->region || !out->sigv4 || (out->sign && !out->userpwd) || (token && *token && out->sign && !out->token_header)) {
    wk_s3_config_free(out);
    return WK_FAIL(WK_ERR_NOMEM, "out of memory reading the S3 configuration");
  }
  return WK_OK;
}

void wk_s3_config_free(WkS3Config *s3) {
  free(s3->userpwd);
  free(s3->sigv4);
  free(s3->token_header);
  free(s3->region);
  free(s3->endpoint);
  memset(s3, 0, sizeof *s3);
}

char *wk_s3_object_url(const WkS3Config *s3, const char *bucket, const char *key) {
  size_t n = (s3->endpoint ? strlen(s3->endpoint) : 0) + strlen(bucket) + strlen(key) + strlen(s3->region) + 64;
  char *url = wk_malloc(n, "S3 URL");
  if (!url) return NULL;
  if (s3->endpoint) snprintf(url, n, "%s/%s/%s", s3->endpoint, bucket, key);
  else if (strchr(bucket, '.')) snprintf(url, n, "https://s3.%s.amazonaws.com/%s/%s", s3->region, bucket, key);
  else snprintf(url, n, "https://%s.s3.%s.amazonaws.com/%s", bucket, s3->region, key);
  return url;
}

/* ---- canonical query ------------------------------------------------------------------------------ */

static size_t encode(const char *s, char *out) {
  static const char HEX[] = "0123456789ABCDEF";
  size_t n = 0;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    unsigned char c = *p;
    bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                c == '.' || c == '_' || c == '~';
    if (keep) {
      if (out) out[n] = (char)c;
      n++;
    } else {
      if (out) {
        out[n] = '%';
        out[n + 1] = HEX[c >> 4];
        out[n + 2] = HEX[c & 15];
      }
      n += 3;
    }
  }
  return n;
}

char *wk_s3_canonical_query(const char *const *names, const char *const *values, uint32_t count) {
  uint32_t *order = wk_malloc((count ? count : 1) * sizeof *order, "query order");
  if (!order) return NULL;
  size_t bytes = 1;
  for (uint32_t i = 0; i < count; i++) {
    order[i] = i;
    bytes += encode(names[i], NULL) + encode(values[i], NULL) + 2;
  }
  /* Insertion sort by name (byte-wise, as SigV4 compares): a handful of parameters. */
  for (uint32_t i = 1; i < count; i++)
    for (uint32_t j = i; j > 0 && strcmp(names[order[j - 1]], names[order[j]]) > 0; j--) {
      uint32_t t = order[j];
      order[j] = order[j - 1];
      order[j - 1] = t;
    }
  char *out = wk_malloc(bytes, "query");
  if (out) {
    size_t n = 0;
    for (uint32_t i = 0; i < count; i++) {
      if (i) out[n++] = '&';
      n += encode(names[order[i]], out + n);
      out[n++] = '=';
      n += encode(values[order[i]], out + n);
    }
    out[n] = '\0';
  }
  free(order);
  return out;
}

/* ---- listing ---------------------------------------------------------------------------------------- */

/* The text of the first <tag>...</tag> at or after from, XML entities decoded; NULL when absent. */
static char *xml_text(const char *from, const char *end, const char *tag, const char **after) {
  char open[64], close[64];
  snprintf(open, sizeof open, "<%s>", tag);
  snprintf(close, sizeof close, "</%s>", tag);
  const char *a = strstr(from, open);
  if (!a || a >= end) return NULL;
  a += strlen(open);
  const char *b = strstr(a, close);
  if (!b || b > end) return NULL;
  if (after) *after = b + strlen(close);
  char *out = wk_malloc((size_t)(b - a) + 1, "XML text");
  if (!out) return NULL;
  static const struct { const char *entity; char c; } ENTITIES[] = {
      {"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
  size_t n = 0;
  for (const char *p = a; p < b;) {
    bool decoded = false;
    for (size_t e = 0; *p == '&' && e < sizeof ENTITIES / sizeof ENTITIES[0]; e++) {
      size_t len = strlen(ENTITIES[e].entity);
      if ((size_t)(b - p) >= len && strncmp(p, ENTITIES[e].entity, len) == 0) {
        out[n++] = ENTITIES[e].c;
        p += len;
        decoded = true;
        break;
      }
    }
    if (!decoded) out[n++] = *p++;
  }
  out[n] = '\0';
  return out;
}

static WkStatus list_page(WkFetch *fetch, const WkS3Config *s3, const char *bucket, const char *prefix,
                          const char *token, WkS3Each each, void *ctx, char **next) {
  const char *names[3] = {"list-type", "prefix", "continuation-token"};
  const char *values[3] = {"2", prefix, token ? token : ""};
  char *query = wk_s3_canonical_query(names, values, token ? 3 : 2);
  char *base = query ? wk_s3_object_url(s3, bucket, "") : NULL;
  size_t n = (base ? strlen(base) : 0) + (query ? strlen(query) : 0) + 2;
  char *url = base ? wk_malloc(n, "S3 listing URL") : NULL;
  char name[WK_REMOTE_ERROR_CAPACITY];
  snprintf(name, sizeof name, "s3://%s/%s", bucket, prefix);
  WkStatus status = WK_OK;
  if (!url) status = WK_FAIL(WK_ERR_NOMEM, "out of memory listing '%s'", name);
  if (status == WK_OK) snprintf(url, n, "%s?%s", base, query);
  free(base);
  free(query);
  if (status != WK_OK) return status;
  WkFetchTarget target = {.url = url, .name = name, .s3 = s3, .size = WK_FETCH_SIZE_UNKNOWN};
  WkFetchRequest request = {.target = &target, .whole = true, .max_bytes = MAX_LIST_BYTES};
  status = wk_fetch_run(fetch, &request);
  free(url);
  if (status != WK_OK) return WK_FAIL(status, "%s", request.error);
  char *text = wk_malloc(request.body_length + 1, "S3 listing");
  if (!text) {
    free((void *)request.body);
    return wk_last_status();
  }
  memcpy(text, request.body, request.body_length);
  text[request.body_length] = '\0';
  free((void *)request.body);
  const char *end = text + request.body_length, *at = text;
  for (;;) {
    const char *after = NULL;
    char *contents = xml_text(at, end, "Contents", &after);
    if (!contents) break;
    char *key = xml_text(contents, contents + strlen(contents), "Key", NULL);
    char *size = xml_text(contents, contents + strlen(contents), "Size", NULL);
    char *stop = NULL;
    unsigned long long bytes = size ? strtoull(size, &stop, 10) : 0;
    if (!key || !size || !stop || *stop) status = WK_FAIL(WK_ERR_FORMAT, "listing of '%s': an entry without a Key or Size", name);
    if (status == WK_OK) status = each(ctx, key, bytes);
    free(key);
    free(size);
    free(contents);
    at = after;
    if (status != WK_OK) break;
  }
  char *truncated = status == WK_OK ? xml_text(text, end, "IsTruncated", NULL) : NULL;
  *next = truncated && strcmp(truncated, "true") == 0 ? xml_text(text, end, "NextContinuationToken", NULL) : NULL;
  if (status == WK_OK && truncated && strcmp(truncated, "true") == 0 && !*next)
    status = WK_FAIL(WK_ERR_FORMAT, "listing of '%s' is truncated but has no NextContinuationToken", name);
  free(truncated);
  free(text);
  return status;
}

WkStatus wk_s3_list(WkFetch *fetch, const WkS3Config *s3, const char *bucket, const char *prefix, WkS3Each each,
                    void *ctx) {
  char *token = NULL;
  for (uint32_t page = 0; page < MAX_CONTINUATIONS; page++) {
    char *next = NULL;
    WkStatus status = list_page(fetch, s3, bucket, prefix, token, each, ctx, &next);
    free(token);
    if (status != WK_OK) {
      free(next);
      return status;
    }
    if (!next) return WK_OK;
    token = next;
  }
  free(token);
  return WK_FAIL(WK_ERR_FORMAT, "listing of s3://%s/%s did not end after %d pages", bucket, prefix, MAX_CONTINUATIONS);
}
