/*
 * fuzz_store.c — libFuzzer target for what the rendezvous store reads off the network: frames,
 * requests and replies, the handshake's challenge and hello (runtime/dist/protocol.c), and the
 * SLURM node list world.c reads from the environment.
 *
 * The input is taken as a stream of frames, as the server and the client read it. A request or
 * reply that parses must encode back to exactly the bytes it came from (so the encoder and the
 * parser agree on every limit); whatever the bytes, nothing may crash or read out of bounds.
 *
 *   make fuzz && build/fuzz/fuzz_store -max_total_time=60 /tmp/new-inputs tests/fuzz/corpus/store
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"

static void same_bytes(const StoreBuffer *b, const uint8_t *frame, size_t length) {
  if (b->length != length || memcmp(b->data, frame, length) != 0) abort();
}

static void check_frame(const uint8_t *frame, size_t length) {
  const uint8_t *body = frame + STORE_FRAME_HEADER;
  size_t body_length = length - STORE_FRAME_HEADER;
  StoreBuffer b = {0};
  StoreRequest q;
  if (store_parse_request(body, body_length, &q) == WK_OK) {
    if (store_encode_request(&b, &q) != WK_OK) abort();
    same_bytes(&b, frame, length);
    if (q.op == STORE_HELLO && q.value.length != STORE_NONCE_BYTES) abort(); /* proofs read a full nonce */
  }
  StoreChallenge challenge;
  if (store_parse_challenge(body, body_length, &challenge) == WK_OK) {
    b.length = 0;
    if (store_encode_challenge(&b, &challenge) != WK_OK) abort();
    same_bytes(&b, frame, length);
  }
  for (int op = STORE_HELLO; op <= STORE_BYE; op++) {
    StoreReply y;
    if (store_parse_reply((StoreOp)op, body, body_length, &y) != WK_OK) continue;
    b.length = 0;
    if (store_encode_reply(&b, (StoreOp)op, &y) != WK_OK) abort();
    same_bytes(&b, frame, length);
  }
  store_buffer_free(&b);
}

static void check_nodelist(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  if (!text) return;
  memcpy(text, data, size);
  text[size] = '\0';
  char host[64];
  if (world_first_slurm_host(text, host, sizeof host) == WK_OK) {
    size_t n = strlen(host);
    if (n == 0 || n >= sizeof host) abort();
    for (size_t i = 0; i < n; i++)
      if (!isalnum((unsigned char)host[i]) && !strchr("-_.", host[i])) abort();
  }
  free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  size_t at = 0, frame;
  while (at < size && store_frame_check(data + at, size - at, &frame) == FRAME_READY) {
    check_frame(data + at, frame);
    at += frame;
  }
  check_nodelist(data, size);
  return 0;
}
