/*
 * secret.c — the job's secret: what lets the processes of one job recognise each other and nobody
 * else (another user on the host, another host on the network).
 *
 * The launcher makes one per job (wk_random_bytes) and hands it to the ranks it starts in
 * WICK_STORE_SECRET; ranks started by SLURM or torchrun get it from the same variable or from a file
 * named by WICK_STORE_SECRET_FILE (readable by its owner alone: a secret others can read is none).
 * The store proves knowledge of it with HMAC-SHA256 challenges (never sending it) and the node's
 * shared segments are named by a keyed hash of it, so another user cannot predict them.
 */
#include <errno.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "secret.h"

static struct {
  pthread_once_t once;
  WkStatus status;
  char message[512];
  size_t length;
  uint8_t bytes[WK_SECRET_MAX_BYTES];
} job = {.once = PTHREAD_ONCE_INIT};

__attribute__((format(printf, 1, 2))) static WkStatus refuse(const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vsnprintf(job.message, sizeof job.message, fmt, args);
  va_end(args);
  return WK_ERR_INVALID_ARG;
}

static WkStatus take(const uint8_t *bytes, size_t length, const char *source) {
  while (length > 0 && (bytes[length - 1] == '\n' || bytes[length - 1] == '\r')) length--;
  if (length < WK_SECRET_MIN_BYTES || length > WK_SECRET_MAX_BYTES) {
    snprintf(job.message, sizeof job.message, "%s: the job secret must be %d to %d bytes, not %zu", source,
             WK_SECRET_MIN_BYTES, WK_SECRET_MAX_BYTES, length);
    return WK_ERR_INVALID_ARG;
  }
  memcpy(job.bytes, bytes, length);
  job.length = length;
  return WK_OK;
}

static WkStatus read_secret_file(const char *path) {
  int fd;
  uint64_t size;
  if (wk_open_regular(path, "job secrets", &fd, &size) != WK_OK) return refuse("WICK_STORE_SECRET_FILE: %s", wk_last_error());
  struct stat st;
  WkStatus status = WK_OK;
  uint8_t bytes[WK_SECRET_MAX_BYTES + 2];
  ssize_t got = 0;
  if (fstat(fd, &st) != 0 || st.st_uid != geteuid())
    status = refuse("WICK_STORE_SECRET_FILE '%s' is not owned by this user", path);
  else if ((st.st_mode & 077) != 0)
    status = refuse("WICK_STORE_SECRET_FILE '%s' is readable by other users (chmod 600 it)", path);
  else if (size > sizeof bytes)
    status = refuse("WICK_STORE_SECRET_FILE '%s' holds %llu bytes; the job secret is at most %d", path,
                    (unsigned long long)size, WK_SECRET_MAX_BYTES);
  else if ((got = read(fd, bytes, (size_t)size)) < 0)
    status = refuse("WICK_STORE_SECRET_FILE '%s': read failed", path);
  else
    status = take(bytes, (size_t)got, path);
  close(fd);
  return status;
}

static void load(void) {
  const char *text = getenv("WICK_STORE_SECRET"), *file = getenv("WICK_STORE_SECRET_FILE");
  if (text && !*text) text = NULL;
  if (file && !*file) file = NULL;
  if (text && file)
    job.status = refuse("%s", "WICK_STORE_SECRET and WICK_STORE_SECRET_FILE are both set: give the job secret one way");
  else if (text)
    job.status = take((const uint8_t *)text, strlen(text), "WICK_STORE_SECRET");
  else if (file)
    job.status = read_secret_file(file);
  else
    job.status = WK_OK;
}

WkStatus wk_job_secret(const uint8_t **bytes, size_t *length) {
  pthread_once(&job.once, load);
  *bytes = job.bytes;
  *length = job.status == WK_OK ? job.length : 0;
  if (job.status != WK_OK) return WK_FAIL(job.status, "%s", job.message);
  return WK_OK;
}

WkStatus wk_random_bytes(void *out, size_t length) {
  uint8_t *p = out;
  while (length > 0) {
    ssize_t got = getrandom(p, length, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return WK_FAIL(WK_ERR_IO, "getrandom: %s", strerror(errno));
    p += got;
    length -= (size_t)got;
  }
  return WK_OK;
}

void wk_hmac_sha256(const void *key, size_t key_length, const void *message, size_t message_length,
                    uint8_t out[WK_HMAC_BYTES]) {
  unsigned int n = WK_HMAC_BYTES;
  HMAC(EVP_sha256(), key, (int)key_length, message, message_length, out, &n);
}

bool wk_digest_equal(const uint8_t *a, const uint8_t *b, size_t length) {
  uint8_t diff = 0; /* constant time: how long a compare takes says nothing about where it differs */
  for (size_t i = 0; i < length; i++) diff |= (uint8_t)(a[i] ^ b[i]);
  return diff == 0;
}
