/*
 * retry.c — which failed requests are tried again, and after how long.
 *
 * Retried: connection failures (refused, reset, name resolution, TLS handshake), bodies cut short,
 * stalls, transfers under the low-speed limit or past their deadline (fetch.c), 5xx, 408, 429 (and 503
 * with Retry-After, counted as throttling). Not retried: any other 4xx (403 and 404 above all: the URL is
 * wrong or access is denied, waiting changes nothing), a certificate that does not verify, a response that
 * does not match the Range asked for, response headers too large for libcurl.
 *
 * The wait before attempt n is BASE x 2^(n-2), capped at MAX, times a uniform jitter in [1/2, 1] so
 * that ranks failing together do not retry together; a server's Retry-After is a floor (capped too).
 */
#include <curl/curl.h>

#include "remote.h"

#define BACKOFF_BASE_NS 100000000ull   /* 100 ms before the first retry */
#define BACKOFF_MAX_NS 8000000000ull   /* never more than 8 s between attempts by backoff alone */
#define RETRY_AFTER_MAX_S 60           /* a server's Retry-After is honoured up to a minute */
#define NS_PER_S 1000000000ull

enum { HTTP_TIMEOUT = 408, HTTP_TOO_MANY = 429, HTTP_UNAVAILABLE = 503 };

WkRetryCause wk_retry_classify(int curl_code, long http_status, bool retry_after_given) {
  switch ((CURLcode)curl_code) {
    case CURLE_OK: break;
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_CONNECT:
    case CURLE_SSL_CONNECT_ERROR:
      return WK_RETRY_CONNECT;
    case CURLE_OPERATION_TIMEDOUT:
      return WK_RETRY_TIMEOUT;
    case CURLE_PARTIAL_FILE:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_HTTP3:
      return WK_RETRY_RESET;
    default:
      return WK_RETRY_FATAL;
  }
  if (http_status == HTTP_TOO_MANY || (http_status == HTTP_UNAVAILABLE && retry_after_given)) return WK_RETRY_THROTTLE;
  if (http_status == HTTP_TIMEOUT) return WK_RETRY_TIMEOUT;
  if (http_status >= 500 && http_status <= 599) return WK_RETRY_SERVER;
  return WK_RETRY_FATAL;
}

static uint64_t next_random(uint64_t *state) { /* xorshift64*: jitter only, not security */
  uint64_t x = *state ? *state : 0x9E3779B97F4A7C15ull;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *state = x;
  return x * 0x2545F4914F6CDD1Dull;
}

uint64_t wk_retry_delay_ns(uint32_t attempt, int64_t retry_after_s, uint64_t *rng) {
  uint32_t doublings = attempt >= 2 ? attempt - 2 : 0;
  uint64_t delay = BACKOFF_BASE_NS;
  while (doublings-- > 0 && delay < BACKOFF_MAX_NS) delay *= 2;
  if (delay > BACKOFF_MAX_NS) delay = BACKOFF_MAX_NS;
  uint64_t half = delay / 2;
  delay = half + next_random(rng) % (half + 1);
  if (retry_after_s > 0) {
    uint64_t floor = (uint64_t)(retry_after_s < RETRY_AFTER_MAX_S ? retry_after_s : RETRY_AFTER_MAX_S) * NS_PER_S;
    if (delay < floor) delay = floor;
  }
  return delay;
}

uint64_t wk_retry_max_delay_ns(void) {
  uint64_t retry_after = (uint64_t)RETRY_AFTER_MAX_S * NS_PER_S;
  return retry_after > BACKOFF_MAX_NS ? retry_after : BACKOFF_MAX_NS;
}

const char *wk_retry_cause_name(WkRetryCause cause) {
  static const char *const NAMES[] = {"connection error", "connection reset or body cut short", "timeout",
                                      "server error", "throttled", "checksum mismatch"};
  return cause < WK_RETRY_CAUSES ? NAMES[cause] : "not retryable";
}
