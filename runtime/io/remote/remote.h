/*
 * runtime/io/remote — datasets on HTTP(S) servers and S3-compatible object stores, read by range
 * through a node-shared, bounded on-disk cache. A remote shard is a WkBlob like a local file (map
 * returns NULL), so everything above the blob layer reads remote and local datasets alike.
 *
 * Owns:
 *   url.c       locations: parsing and validation (http, https, s3, file), joining a dataset's URL with a
 *               shard name from its index (percent-encoded), S3 keys -> HTTP URLs (path-style under
 *               AWS_ENDPOINT_URL, virtual-hosted on AWS)
 *   s3.c        S3 credentials and region from the environment (checked), SigV4 signing through
 *               libcurl (CURLOPT_AWS_SIGV4, x-amz-content-sha256 set, canonical sorted query built
 *               here), ListObjectsV2 for s3://bucket/prefix/ inputs
 *   retry.c     which failures are retried (connection errors, resets, cut bodies, stalls, 5xx, 429)
 *               and how long to wait (exponential backoff with jitter, Retry-After honoured)
 *   fetch.c     the engine: one thread driving a libcurl multi handle, a bounded number of parallel
 *               transfers (keep-alive, HTTP/2 where offered, TLS verified), Range requests checked
 *               against Content-Range, adjacent prefetches merged, a cut transfer resumed by Range,
 *               every wait bounded (connect and stall timeouts, a low-speed limit, a deadline per attempt
 *               sized to its bytes, one over all of a request's attempts, a number of attempts)
 *   transfer.c  one transfer's life in the engine: started (merged with neighbours), its attempts and
 *               their callbacks, resumed, retried or finished (transfer.h: the engine's state)
 *   diskcache.c the node-shared on-disk cache (below)
 *   remote.c    a remote dataset's context (options, engine, cache, statistics, fetch targets)
 *   remote_index.c  its index fetched through the cache (a conditional request)
 *   remote_blob.c   the remote blob: read_at from the cache or by a Range request, advise(WILLNEED)
 *               as prefetch, forget for a corrupt copy (remote_context.h: what the three share)
 *
 * Not here: the shard format and its checksums (shard.c verifies every block; dataset.c forgets a
 * remote block whose checksum fails and reads it once more before it reports the URL and offset).
 *
 * The on-disk cache (diskcache.c). Layout under cache_dir:
 *   v1/usage                        the bytes the cache holds (a counter), flock'ed by whoever changes it
 *   v1/claims                       empty; its bytes' record locks are the download claims (below)
 *   v1/index/<hash of URL>          an index as last fetched, with its ETag / Last-Modified
 *   v1/data/<index hash>/<shard>/<offset>-<length>   the bytes [offset, offset+length) of a shard
 * Data is content-addressed by the dataset's identity, the XXH3-128 of its index text: another version
 * of a dataset is another directory, never mixed with this one. A range is cached under exactly the
 * (offset, length) its readers ask for (a block, a shard's header, its block table + document index),
 * so every local rank names it alike. Entries are written to a temporary file (named with the writer's
 * pid) and renamed into place: a crash never leaves a partial file under an entry's name.
 *
 * Sharing: the local ranks of a node share one cache directory and download each range once. Before a
 * download, a process claims the range: it takes a write lock, without waiting, on the byte of
 * v1/claims that a hash of the entry's key names (an open file description lock: it excludes other
 * threads too, and no file is made per claim). A process that finds the claim taken waits (polling,
 * bounded by the request's time budget) until the holder releases it or dies (the kernel drops a dead
 * process's locks), then reads the entry the holder stored. A claim is dropped after the entry is
 * renamed into place. Why flock and not a
 * node-local leader: there is nothing to elect or hand over when a rank dies, and ranks of different jobs
 * that share the cache coordinate the same way.
 *
 * Budget: usage counts the bytes of every file (entries, temporaries being written, the counter itself;
 * not directories); it is changed
 * only under the usage lock, and a temporary is created at its full size before the lock is dropped,
 * so the sum of the files is never above cache_disk_bytes. Making room evicts, oldest first, entries
 * already read (their file mode loses the write bit when first read: "passed", ctime the last read),
 * then, for a read that is waiting, entries fetched ahead but not read yet. Prefetches never evict
 * entries not read yet: a full cache drops the prefetch instead. An eviction scan walks the cache and
 * recounts usage (removing temporaries of dead writers), then frees down to EVICT_LOW_WATER of the
 * budget, so scans are rare.
 *
 * Index: the index of a remote dataset is fetched once per node and job: the first local rank checks
 * the cached copy with a conditional request (If-None-Match / If-Modified-Since; 304 costs no body) and
 * records its job in the entry; local ranks of the same job then use it without a request. A changed
 * remote index has another hash, so its shards are cached apart. When the server cannot be reached at
 * all, a cached index is used with a warning, so a warm cache runs without a network.
 *
 * Internal header of runtime/io/remote; dataset.c and the converter (convert/remote_input.c) are its
 * users.
 */
#ifndef WK_IO_REMOTE_H
#define WK_IO_REMOTE_H

#include "../blob.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
  WK_REMOTE_ERROR_CAPACITY = 512,  /* a request's failure message */
  WK_REMOTE_VALIDATOR_CAPACITY = 256,  /* an ETag or a Last-Modified date */
};
#define WK_FETCH_SIZE_UNKNOWN UINT64_MAX

/* ---- url.c -------------------------------------------------------------------------------------- */

typedef enum { WK_URL_FILE = 0, WK_URL_HTTP = 1, WK_URL_HTTPS = 2, WK_URL_S3 = 3 } WkUrlScheme;

typedef struct {
  WkUrlScheme scheme;
  char *host;    /* http(s): "host" or "host:port"; s3: the bucket; file: "" */
  char *path;    /* http(s) and file: from the first '/'; s3: the key (no leading '/', may be "") */
} WkUrl;

/* Parses and validates a location (scheme, host, port, bucket, no credentials, query or fragment, no
 * control characters or spaces); a string without "scheme://" is a local path (WK_URL_FILE). */
WkStatus wk_url_parse(const char *text, WkUrl *out);
void wk_url_free(WkUrl *url);
/* base + "/" + name, with name's bytes percent-encoded where a URL path needs it (its '/' kept); name
 * must be a safe relative name (wk_index_name_is_safe). malloc'd; NULL on failure (error set). */
char *wk_url_join(const char *base, const char *name);
/* A lowercase hex XXH3-128 of bytes: content addresses and names of cache entries (33 bytes). */
void wk_hash_hex128(const void *data, size_t length, char out[33]);

/* ---- s3.c --------------------------------------------------------------------------------------- */

/* Credentials and where to send requests, from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
 * AWS_SESSION_TOKEN, AWS_REGION (else AWS_DEFAULT_REGION, else us-east-1) and AWS_ENDPOINT_URL. */
typedef struct {
  bool sign;                /* false: no credentials, requests go unsigned (public buckets) */
  char *userpwd;            /* "key:secret" for CURLOPT_USERPWD */
  char *sigv4;              /* "aws:amz:<region>:s3" for CURLOPT_AWS_SIGV4 */
  char *token_header;       /* "x-amz-security-token: ..." or NULL */
  char *region;
  char *endpoint;           /* AWS_ENDPOINT_URL without a trailing '/', or NULL for AWS */
} WkS3Config;

WkStatus wk_s3_config_from_env(WkS3Config *out);
void wk_s3_config_free(WkS3Config *s3);
/* The HTTP(S) URL of object `key` of `bucket`: path-style under an endpoint, virtual-hosted on AWS
 * (path-style for bucket names with dots, which a wildcard certificate does not cover). */
char *wk_s3_object_url(const WkS3Config *s3, const char *bucket, const char *key);
/* ListObjectsV2 of a bucket: keys under prefix, each passed to `each` (in the store's order, which is
 * byte-wise sorted), following continuation tokens. */
typedef struct WkFetch WkFetch;
typedef WkStatus (*WkS3Each)(void *ctx, const char *key, uint64_t size);
WkStatus wk_s3_list(WkFetch *fetch, const WkS3Config *s3, const char *bucket, const char *prefix, WkS3Each each,
                    void *ctx);
/* The query string of a request, canonical for SigV4: parameters sorted by name, names and values
 * percent-encoded (RFC 3986 unreserved characters kept, '%XX' uppercase). names/values: count pairs. */
char *wk_s3_canonical_query(const char *const *names, const char *const *values, uint32_t count);

/* ---- retry.c ------------------------------------------------------------------------------------ */

typedef enum {
  WK_RETRY_CONNECT = 0,   /* connection refused, name resolution, TLS handshake */
  WK_RETRY_RESET = 1,     /* connection reset or closed, a body cut short */
  WK_RETRY_TIMEOUT = 2,   /* no byte for the stall timeout, too slow, an attempt's deadline */
  WK_RETRY_SERVER = 3,    /* 5xx */
  WK_RETRY_THROTTLE = 4,  /* 429, or 503 with Retry-After */
  WK_RETRY_CORRUPT = 5,   /* a block whose checksum failed, fetched again (counted by remote.c) */
  WK_RETRY_CAUSES = 6,
  WK_RETRY_FATAL = 7      /* not retried: 4xx but 408/429, TLS verification, a malformed response */
} WkRetryCause;

/* curl_code is a CURLcode (0 for a completed response), http_status the response's (0 if none). */
WkRetryCause wk_retry_classify(int curl_code, long http_status, bool retry_after_given);
/* Nanoseconds to wait before attempt `attempt` (2 = the first retry): exponential from a base, capped,
 * with jitter in [1/2, 1] of it; at least retry_after_s seconds when the server gave Retry-After. */
uint64_t wk_retry_delay_ns(uint32_t attempt, int64_t retry_after_s, uint64_t *rng);
/* The longest wait between two attempts (a capped Retry-After). */
uint64_t wk_retry_max_delay_ns(void);
const char *wk_retry_cause_name(WkRetryCause cause);

/* ---- fetch.c ------------------------------------------------------------------------------------ */

typedef struct {
  int64_t max_transfers, connect_timeout_ms, stall_timeout_ms, request_timeout_ms, retries;
  int64_t low_speed_bytes_per_s, low_speed_window_ms;
  int64_t prefetch_bytes;   /* bytes of non-urgent requests in transfer at once */
  const char *ca_bundle;    /* CA certificates (WICK_CA_BUNDLE), NULL: the system's */
} WkFetchConfig;

/* What is fetched: an object by its HTTP(S) URL, signed for S3 or not, of a known size or not. */
typedef struct {
  char *url;                /* what is requested */
  char *name;               /* what messages name: the location as the user wrote it (s3://...) */
  const WkS3Config *s3;     /* NULL: unsigned */
  uint64_t size;            /* checked against Content-Range; WK_FETCH_SIZE_UNKNOWN */
} WkFetchTarget;

typedef struct WkFetchRequest WkFetchRequest;
struct WkFetchRequest {
  /* set by the caller */
  const WkFetchTarget *target;
  uint64_t offset, length;  /* a range of the object (length > 0) ... */
  bool whole;               /* ... or the whole object, without Range, into a buffer of at most max_bytes */
  uint64_t max_bytes;
  const char *if_none_match, *if_modified_since; /* conditional whole requests (NULL: none) */
  uint8_t *dst;             /* a range's bytes go here (NULL: into a buffer of the engine's) */
  bool urgent;              /* a reader waits: before any prefetch, outside the prefetch budget */
  bool take_body;           /* a range without dst: take the engine's buffer when it holds this range alone
                               (body_taken), instead of copying the body out during done() */
  /* On the engine thread: start() before the transfer (false drops the request: done() is not called),
   * done() after it, with the results below. Either may be NULL. A range's body is dst, or a buffer of
   * the engine's valid during done() only; a whole object's body is malloc'd and the caller's (free it). */
  bool (*start)(WkFetchRequest *request);
  void (*done)(WkFetchRequest *request);
  void *ctx;
  /* results */
  WkStatus status;
  char error[WK_REMOTE_ERROR_CAPACITY];
  long http_status;
  uint32_t attempts;
  const uint8_t *body;
  uint64_t body_length;
  bool body_taken;          /* body is malloc'd and the caller's (free it): take_body was granted */
  bool not_modified;
  uint64_t total;           /* the object's size the server reported (Content-Range or Content-Length) */
  char etag[WK_REMOTE_VALIDATOR_CAPACITY], last_modified[WK_REMOTE_VALIDATOR_CAPACITY];
  /* engine's */
  WkFetchRequest *next;
  bool finished;
  bool hurry;               /* a reader waits for this prefetch (wk_fetch_hurry; under the engine's lock) */
};

typedef struct {
  uint64_t requests, bytes, retries[WK_RETRY_CAUSES];
  uint64_t rate_bytes_per_s;
  uint64_t dropped;         /* prefetches dropped by their start() */
} WkFetchStats;

WkStatus wk_fetch_new(const WkFetchConfig *config, WkFetch **out);
/* Fails what is still queued (WK_ERR_CLOSED, done() called) and stops the thread. */
void wk_fetch_free(WkFetch *fetch);
/* Queues a request; done() runs on the engine thread when it ends. */
void wk_fetch_submit(WkFetch *fetch, WkFetchRequest *request);
/* A reader now waits for this submitted prefetch: when it is still queued, it moves to the front of the
 * queue (it stays a prefetch: merged with neighbours, within the prefetch budget). Any thread. */
void wk_fetch_hurry(WkFetch *fetch, WkFetchRequest *request);
/* Runs a request as urgent and waits for it (done and ctx are the engine's); returns its status. */
WkStatus wk_fetch_run(WkFetch *fetch, WkFetchRequest *request);
void wk_fetch_stats(WkFetch *fetch, WkFetchStats *out);
/* The longest a request can take with all its attempts (request_timeout_ms): what a waiter for another
 * process's download waits at most. */
uint64_t wk_fetch_patience_ns(const WkFetchConfig *config);

/* ---- diskcache.c -------------------------------------------------------------------------------- */

enum { WK_DISK_PATH_CAPACITY = 4096 };

typedef struct WkDiskCache WkDiskCache;
typedef struct {
  int fd;  /* an open file of v1/claims holding the key's lock byte; -1: none */
} WkDiskClaim;

/* Opens (creating) the cache under dir with a budget in bytes. */
WkStatus wk_disk_cache_open(const char *dir, uint64_t budget, WkDiskCache **out);
void wk_disk_cache_close(WkDiskCache *c);
/* Entry `key` (a relative path like "data/<hash>/3/128-4096") for reading: its fd, or -1 when absent.
 * Reading marks it passed (see the eviction order above). */
int wk_disk_cache_open_entry(WkDiskCache *c, const char *key, uint64_t *size);
bool wk_disk_cache_has(WkDiskCache *c, const char *key);
/* Takes the right to download key without waiting: *owned false when another process (or thread) holds
 * it. Release with wk_disk_cache_release once the entry is stored (or the download failed). */
WkStatus wk_disk_cache_claim(WkDiskCache *c, const char *key, WkDiskClaim *claim, bool *owned);
void wk_disk_cache_release(WkDiskCache *c, WkDiskClaim *claim);
/* Waits until nobody holds key's claim (true) or the deadline passes (false). */
bool wk_disk_cache_wait(WkDiskCache *c, const char *key, uint64_t deadline_ns);
/* Stores length bytes as entry key (replacing it), atomically; *stored is false when the budget has
 * no room (after evicting what the order allows: passed entries, and unread ones when evict_unread).
 * passed: the bytes are being read now (a waiting reader's download). */
WkStatus wk_disk_cache_store(WkDiskCache *c, const char *key, const void *data, uint64_t length, bool passed,
                             bool evict_unread, bool *stored);
void wk_disk_cache_remove(WkDiskCache *c, const char *key);
uint64_t wk_disk_cache_usage(WkDiskCache *c);
uint64_t wk_disk_cache_evicted(WkDiskCache *c);

/* ---- remote.c ----------------------------------------------------------------------------------- */

typedef struct WkRemote WkRemote;

/* Checks the options and the environment they default to (WICK_CACHE_DIR, XDG_CACHE_HOME, HOME,
 * WICK_CA_BUNDLE, AWS_*), then starts the engine and opens the cache. */
WkStatus wk_remote_open(const WkRemoteOptions *options, WkRemote **out);
/* Every integer option within its bounds (wk_remote_param_bounds), else "remote option <name>=<value> is
 * outside [min, max]". */
WkStatus wk_remote_options_check(const WkRemoteOptions *options);
void wk_remote_close(WkRemote *r);
/* The text of a dataset index at `location` (http, https or s3), through the cache; identity is the
 * XXH3-128 hex of the text (the cache directory of the dataset's shards). text is malloc'd. */
WkStatus wk_remote_fetch_index(WkRemote *r, const char *location, uint64_t max_bytes, char **text, size_t *length,
                               char identity[33]);
/* A blob over the object at `location` of `size` bytes (from the index), cached under `cache_key` (a
 * relative directory such as "data/<identity>/<shard>"), or uncached when cache_key is NULL. */
WkBlob *wk_remote_blob_open(WkRemote *r, const char *location, uint64_t size, const char *cache_key);
void wk_remote_stats(WkRemote *r, WkRemoteStats *out);
/* The size of the object at `location` (http, https or s3), from the Content-Range of a one-byte Range
 * request (an empty object cannot be read by range: the server's 416 is the error). */
WkStatus wk_remote_object_size(WkRemote *r, const char *location, uint64_t *size);
/* The objects under an s3://bucket/prefix (ListObjectsV2, byte-wise sorted): each(ctx, key, size). */
WkStatus wk_remote_list(WkRemote *r, const char *location, WkS3Each each, void *ctx);

#ifdef __cplusplus
}
#endif
#endif /* WK_IO_REMOTE_H */
