/*
 * secret.h — the job's secret and the keyed hash that uses it (secret.c).
 *
 * Internal header: the store (runtime/dist), the launcher (runtime/host) and the node's shared
 * segments (runtime/loader) include it.
 */
#ifndef WK_CORE_SECRET_H
#define WK_CORE_SECRET_H

#include "core.h"

enum {
  WK_SECRET_MIN_BYTES = 16,     /* shorter is guessable */
  WK_SECRET_MAX_BYTES = 1024,
  WK_HMAC_BYTES = 32,           /* HMAC-SHA256 */
  WK_SECRET_GENERATED_BYTES = 32 /* what the launcher makes, written as 64 hex digits */
};

/* The job's secret from WICK_STORE_SECRET, or the file WICK_STORE_SECRET_FILE names (regular, owned
 * by this user, mode 0600 or stricter; a trailing newline is not part of it). *length is 0 when
 * neither is set: the job is unauthenticated. Read once per process; a bad one fails every call. */
WkStatus wk_job_secret(const uint8_t **bytes, size_t *length);

/* From the kernel's random source (getrandom). Exported for the launcher (runtime/host). */
WK_INTERNAL_EXPORT WkStatus wk_random_bytes(void *out, size_t length);

void wk_hmac_sha256(const void *key, size_t key_length, const void *message, size_t message_length,
                    uint8_t out[WK_HMAC_BYTES]);
/* Compares digests in constant time. */
bool wk_digest_equal(const uint8_t *a, const uint8_t *b, size_t length);

#endif /* WK_CORE_SECRET_H */
