/*
 * test_secret.c — the job secret of runtime/core (secret.c): HMAC-SHA256 against RFC 4231's vectors,
 * the secret read from the environment, and the random source.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/secret.h"

static void hex(const uint8_t *bytes, size_t n, char *out) {
  for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", bytes[i]);
}

static void test_hmac_sha256_matches_rfc4231(void) {
  uint8_t digest[WK_HMAC_BYTES];
  char text[2 * WK_HMAC_BYTES + 1];
  wk_hmac_sha256("Jefe", 4, "what do ya want for nothing?", 28, digest); /* RFC 4231, test case 2 */
  hex(digest, sizeof digest, text);
  CHECK(strcmp(text, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843") == 0);
  uint8_t key[131];
  memset(key, 0xaa, sizeof key); /* test case 6: a key longer than the block is hashed first */
  const char *data = "Test Using Larger Than Block-Size Key - Hash Key First";
  wk_hmac_sha256(key, sizeof key, data, strlen(data), digest);
  hex(digest, sizeof digest, text);
  CHECK(strcmp(text, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54") == 0);
}

static void test_digest_equal_compares_every_byte(void) {
  uint8_t a[WK_HMAC_BYTES] = {0}, b[WK_HMAC_BYTES] = {0};
  CHECK(wk_digest_equal(a, b, sizeof a));
  b[WK_HMAC_BYTES - 1] = 1;
  CHECK(!wk_digest_equal(a, b, sizeof a));
}

static void test_secret_from_environment_without_its_newline(void) {
  setenv("WICK_STORE_SECRET", "0123456789abcdef0123456789abcdef\n", 1);
  const uint8_t *bytes;
  size_t length;
  CHECK(wk_job_secret(&bytes, &length) == WK_OK);
  CHECK(length == 32 && memcmp(bytes, "0123456789abcdef0123456789abcdef", 32) == 0);
}

static void test_random_bytes_differ(void) {
  uint8_t a[32], b[32];
  CHECK(wk_random_bytes(a, sizeof a) == WK_OK && wk_random_bytes(b, sizeof b) == WK_OK);
  CHECK(memcmp(a, b, sizeof a) != 0);
}

int main(void) {
  RUN_TEST(test_hmac_sha256_matches_rfc4231);
  RUN_TEST(test_digest_equal_compares_every_byte);
  RUN_TEST(test_secret_from_environment_without_its_newline);
  RUN_TEST(test_random_bytes_differ);
  return check_failures ? 1 : 0;
}
