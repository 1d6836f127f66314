/*
 * protocol.c — the rendezvous store's wire format (see dist.h for the layout of each message).
 *
 * Pure functions over bytes: no sockets, no allocation except the encode buffer; the handshake's
 * proofs (store_proof) are an HMAC over the fields they bind. Everything here reads what another
 * process sent, so every length is checked against what is left before it is used, nothing trails
 * a message, and the limits of dist.h hold for every parsed field. The encoder refuses what the
 * parser would refuse, so a frame that encodes also parses back to the same message
 * (tests/fuzz/fuzz_store.c checks both directions).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/secret.h"
#include "dist.h"

enum { U32_BYTES = 4, I64_BYTES = 8, OP_BYTES = 2 /* op + flags */, STATUS_BYTES = 1 };

/* The challenge opens with these, so a client that reached something else says so. */
static const uint8_t CHALLENGE_MAGIC[4] = {'W', 'I', 'C', 'K'};
enum { CHALLENGE_VERSION = 1, CHALLENGE_BYTES = sizeof CHALLENGE_MAGIC + 2 + STORE_NONCE_BYTES };

const char *store_op_name(int op) {
  switch (op) {
    case STORE_HELLO: return "hello";
    case STORE_SET: return "set";
    case STORE_GET: return "get";
    case STORE_WAIT: return "wait";
    case STORE_ADD: return "add";
    case STORE_CAS: return "compare_set";
    case STORE_STATUS: return "status";
    case STORE_BYE: return "bye";
  }
  return "?";
}

static uint32_t load_u32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int64_t load_i64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = I64_BYTES - 1; i >= 0; i--) v = v << 8 | p[i];
  int64_t out;
  memcpy(&out, &v, sizeof out);
  return out;
}

FrameState store_frame_check(const uint8_t *data, size_t available, size_t *frame_length) {
  if (available < STORE_FRAME_HEADER) return FRAME_INCOMPLETE;
  uint32_t body = load_u32(data);
  if (body == 0 || body > STORE_MAX_FRAME) {
    WK_FAIL(WK_ERR_FORMAT, "store message of %u bytes (must be 1..%d): not a Wick store peer, or a corrupted stream",
            body, STORE_MAX_FRAME);
    return FRAME_INVALID;
  }
  if (available - STORE_FRAME_HEADER < body) return FRAME_INCOMPLETE;
  *frame_length = STORE_FRAME_HEADER + (size_t)body;
  return FRAME_READY;
}

/* ---- reading ----------------------------------------------------------------------------------- */

typedef struct {
  const uint8_t *at;
  size_t left;
  const char *what;  /* "request get" ... for messages */
  StoreBytes key;    /* the request's key once read: a refused value names it */
} Reader;

static WkStatus truncated(const Reader *r, const char *field) {
  return WK_FAIL(WK_ERR_FORMAT, "store %s: truncated at %s (%zu bytes left)", r->what, field, r->left);
}

static WkStatus read_u8(Reader *r, const char *field, uint8_t *out) {
  if (r->left < 1) return truncated(r, field);
  *out = r->at[0];
  r->at++, r->left--;
  return WK_OK;
}

static WkStatus read_i64(Reader *r, const char *field, int64_t *out) {
  if (r->left < I64_BYTES) return truncated(r, field);
  *out = load_i64(r->at);
  r->at += I64_BYTES, r->left -= I64_BYTES;
  return WK_OK;
}

static WkStatus read_bytes(Reader *r, const char *field, uint32_t max, StoreBytes *out) {
  if (r->left < U32_BYTES) return truncated(r, field);
  uint32_t length = load_u32(r->at);
  if (length > max)
    return WK_FAIL(WK_ERR_FORMAT, "store %s%s%.*s%s: %s of %u bytes (at most %u)", r->what, r->key.length ? " key '" : "",
                   (int)(r->key.length > 200 ? 200 : r->key.length), (const char *)r->key.data, r->key.length ? "'" : "",
                   field, length, max);
  if (r->left - U32_BYTES < length) return truncated(r, field);
  out->data = r->at + U32_BYTES;
  out->length = length;
  r->at += U32_BYTES + length, r->left -= U32_BYTES + length;
  return WK_OK;
}

static bool key_is_valid(StoreBytes key) {
  return key.length > 0 && key.length <= STORE_MAX_KEY && memchr(key.data, '\0', key.length) == NULL;
}

static WkStatus read_key(Reader *r, StoreBytes *out) {
  WK_TRY(read_bytes(r, "key", STORE_MAX_KEY, out));
  if (!key_is_valid(*out)) return WK_FAIL(WK_ERR_FORMAT, "store %s: a key is empty or holds a NUL byte", r->what);
  r->key = *out;
  return WK_OK;
}

static WkStatus read_timeout(Reader *r, int64_t *out) {
  WK_TRY(read_i64(r, "timeout", out));
  if (*out < 0 || *out > STORE_MAX_TIMEOUT_MS)
    return WK_FAIL(WK_ERR_FORMAT, "store %s: timeout %lld ms out of range 0..%lld", r->what, (long long)*out,
                   (long long)STORE_MAX_TIMEOUT_MS);
  return WK_OK;
}

/* A hello's identity and handshake fields; status tells a parse (FORMAT) from an encode (INVALID_ARG). */
static WkStatus check_hello(const StoreRequest *q, WkStatus status) {
  if (q->number < -1 || q->number >= STORE_MAX_WORLD)
    return WK_FAIL(status, "store hello: rank %lld out of range -1..%d", (long long)q->number, STORE_MAX_WORLD - 1);
  if (q->world_size < 0 || q->world_size > STORE_MAX_WORLD || (q->number >= 0) != (q->world_size > 0))
    return WK_FAIL(status, "store hello: world size %lld for rank %lld (1..%d for a rank, 0 for anonymous)",
                   (long long)q->world_size, (long long)q->number, STORE_MAX_WORLD);
  if (q->value.length != STORE_NONCE_BYTES)
    return WK_FAIL(status, "store hello: a nonce of %u bytes (must be %d)", q->value.length, STORE_NONCE_BYTES);
  if (q->value2.length != 0 && q->value2.length != STORE_PROOF_BYTES)
    return WK_FAIL(status, "store hello: a proof of %u bytes (must be 0 or %d)", q->value2.length, STORE_PROOF_BYTES);
  return WK_OK;
}

static WkStatus expect_end(const Reader *r) {
  if (r->left != 0) return WK_FAIL(WK_ERR_FORMAT, "store %s: %zu unexpected bytes after the message", r->what, r->left);
  return WK_OK;
}

WkStatus store_parse_request(const uint8_t *body, size_t length, StoreRequest *out) {
  memset(out, 0, sizeof *out);
  Reader r = {.at = body, .left = length, .what = "request"};
  WK_TRY(read_u8(&r, "op", &out->op));
  WK_TRY(read_u8(&r, "flags", &out->flags));
  if (store_op_name(out->op)[0] == '?')
    return WK_FAIL(WK_ERR_FORMAT, "store request: unknown op %u (not a Wick store peer, or another version)", out->op);
  char what[32];
  snprintf(what, sizeof what, "request %s", store_op_name(out->op));
  r.what = what;
  if (out->flags & ~STORE_FLAG_NOREPLY || (out->flags && out->op != STORE_SET))
    return WK_FAIL(WK_ERR_FORMAT, "store %s: unknown flags 0x%02x", what, out->flags);
  switch (out->op) {
    case STORE_HELLO:
      WK_TRY(read_i64(&r, "rank", &out->number));
      WK_TRY(read_i64(&r, "world size", &out->world_size));
      WK_TRY(read_bytes(&r, "nonce", STORE_NONCE_BYTES, &out->value));
      WK_TRY(read_bytes(&r, "proof", STORE_PROOF_BYTES, &out->value2));
      WK_TRY(check_hello(out, WK_ERR_FORMAT));
      break;
    case STORE_SET:
      out->key_count = 1;
      WK_TRY(read_key(&r, &out->keys[0]));
      WK_TRY(read_bytes(&r, "value", STORE_MAX_VALUE, &out->value));
      break;
    case STORE_GET:
      out->key_count = 1;
      WK_TRY(read_key(&r, &out->keys[0]));
      WK_TRY(read_timeout(&r, &out->number));
      break;
    case STORE_WAIT: {
      int64_t count = 0;
      WK_TRY(read_i64(&r, "key count", &count));
      if (count < 1 || count > STORE_MAX_WAIT_KEYS)
        return WK_FAIL(WK_ERR_FORMAT, "store %s: %lld keys (must be 1..%d)", what, (long long)count, STORE_MAX_WAIT_KEYS);
      out->key_count = (uint32_t)count;
      for (uint32_t i = 0; i < out->key_count; i++) WK_TRY(read_key(&r, &out->keys[i]));
      WK_TRY(read_timeout(&r, &out->number));
      break;
    }
    case STORE_ADD:
      out->key_count = 1;
      WK_TRY(read_key(&r, &out->keys[0]));
      WK_TRY(read_i64(&r, "delta", &out->number));
      break;
    case STORE_CAS:
      out->key_count = 1;
      WK_TRY(read_key(&r, &out->keys[0]));
      WK_TRY(read_bytes(&r, "expected value", STORE_MAX_VALUE, &out->value));
      WK_TRY(read_bytes(&r, "desired value", STORE_MAX_VALUE, &out->value2));
      break;
    case STORE_STATUS:
    case STORE_BYE:
      break;
    default: break; /* refused above */
  }
  return expect_end(&r);
}

WkStatus store_parse_reply(StoreOp op, const uint8_t *body, size_t length, StoreReply *out) {
  memset(out, 0, sizeof *out);
  char what[32];
  snprintf(what, sizeof what, "reply to %s", store_op_name(op));
  Reader r = {.at = body, .left = length, .what = what};
  WK_TRY(read_u8(&r, "status", &out->status));
  switch (out->status) {
    case STORE_REPLY_OK: break;
    case STORE_REPLY_MISSING:
      if (op != STORE_GET && op != STORE_WAIT) return WK_FAIL(WK_ERR_FORMAT, "store %s: unexpected 'missing'", what);
      return expect_end(&r);
    case STORE_REPLY_ERROR:
      WK_TRY(read_bytes(&r, "message", STORE_MAX_ERROR, &out->value));
      return expect_end(&r);
    default: return WK_FAIL(WK_ERR_FORMAT, "store %s: unknown status %u", what, out->status);
  }
  switch (op) {
    case STORE_GET:
    case STORE_STATUS: WK_TRY(read_bytes(&r, "value", STORE_MAX_VALUE, &out->value)); break;
    case STORE_HELLO:
      WK_TRY(read_bytes(&r, "proof", STORE_PROOF_BYTES, &out->value));
      if (out->value.length != 0 && out->value.length != STORE_PROOF_BYTES)
        return WK_FAIL(WK_ERR_FORMAT, "store %s: a proof of %u bytes", what, out->value.length);
      break;
    case STORE_ADD: WK_TRY(read_i64(&r, "value", &out->number)); break;
    case STORE_CAS:
      WK_TRY(read_u8(&r, "swapped", &out->swapped));
      if (out->swapped > 1) return WK_FAIL(WK_ERR_FORMAT, "store %s: swapped flag %u", what, out->swapped);
      WK_TRY(read_bytes(&r, "value", STORE_MAX_VALUE, &out->value));
      break;
    case STORE_SET: case STORE_WAIT: case STORE_BYE: break;
    default: return WK_FAIL(WK_ERR_INVALID_ARG, "store: no reply format for op %d", (int)op);
  }
  return expect_end(&r);
}

WkStatus store_parse_challenge(const uint8_t *body, size_t length, StoreChallenge *out) {
  memset(out, 0, sizeof *out);
  if (length != CHALLENGE_BYTES || memcmp(body, CHALLENGE_MAGIC, sizeof CHALLENGE_MAGIC) != 0)
    return WK_FAIL(WK_ERR_FORMAT, "store challenge: %zu bytes that are not a Wick store's greeting (another "
                   "program on that port?)", length);
  const uint8_t *p = body + sizeof CHALLENGE_MAGIC;
  if (p[0] != CHALLENGE_VERSION)
    return WK_FAIL(WK_ERR_FORMAT, "store challenge: protocol version %u, this rank speaks %d (mixed Wick "
                   "versions in one job?)", p[0], CHALLENGE_VERSION);
  if (p[1] > 1) return WK_FAIL(WK_ERR_FORMAT, "store challenge: keyed flag %u", p[1]);
  out->keyed = p[1] == 1;
  memcpy(out->nonce, p + 2, STORE_NONCE_BYTES);
  return WK_OK;
}

/* ---- writing ----------------------------------------------------------------------------------- */

void store_buffer_free(StoreBuffer *b) {
  free(b->data);
  *b = (StoreBuffer){0};
}

static WkStatus reserve(StoreBuffer *b, size_t extra) {
  if (b->capacity - b->length >= extra) return WK_OK;
  size_t capacity = b->capacity ? b->capacity : 256;
  while (capacity - b->length < extra) capacity *= 2;
  uint8_t *data = realloc(b->data, capacity);
  if (!data) return WK_FAIL(WK_ERR_NOMEM, "out of memory for a store message of %zu bytes", b->length + extra);
  b->data = data;
  b->capacity = capacity;
  return WK_OK;
}

static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < U32_BYTES; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void put(StoreBuffer *b, const void *data, size_t length) {
  if (length) memcpy(b->data + b->length, data, length);
  b->length += length;
}

static void put_u8(StoreBuffer *b, uint8_t v) { put(b, &v, 1); }

static void put_i64(StoreBuffer *b, int64_t v) {
  uint64_t u;
  memcpy(&u, &v, sizeof u);
  uint8_t bytes[I64_BYTES];
  for (int i = 0; i < I64_BYTES; i++) bytes[i] = (uint8_t)(u >> (8 * i));
  put(b, bytes, sizeof bytes);
}

static void put_bytes(StoreBuffer *b, StoreBytes s) {
  uint8_t length[U32_BYTES];
  put_u32(length, s.length);
  put(b, length, sizeof length);
  put(b, s.data, s.length);
}

static size_t bytes_size(StoreBytes s) { return U32_BYTES + (size_t)s.length; }

/* Starts a frame: reserves its whole size and leaves room for the header, filled by end_frame. */
static WkStatus begin_frame(StoreBuffer *b, size_t body, size_t *start) {
  if (body > STORE_MAX_FRAME) return WK_FAIL(WK_ERR_INVALID_ARG, "store message of %zu bytes exceeds %d", body, STORE_MAX_FRAME);
  WK_TRY(reserve(b, STORE_FRAME_HEADER + body));
  *start = b->length;
  b->length += STORE_FRAME_HEADER;
  return WK_OK;
}

static void end_frame(StoreBuffer *b, size_t start) {
  put_u32(b->data + start, (uint32_t)(b->length - start - STORE_FRAME_HEADER));
}

static WkStatus check_value(StoreBytes v, uint32_t max, const char *what) {
  if (v.length > max) return WK_FAIL(WK_ERR_INVALID_ARG, "store %s of %u bytes (at most %u)", what, v.length, max);
  return WK_OK;
}

WkStatus store_encode_request(StoreBuffer *b, const StoreRequest *q) {
  size_t body = OP_BYTES;
  uint32_t keys = 0;
  bool timeout = false;
  switch (q->op) {
    case STORE_HELLO:
      WK_TRY(check_hello(q, WK_ERR_INVALID_ARG));
      body += 2 * I64_BYTES + bytes_size(q->value) + bytes_size(q->value2);
      break;
    case STORE_SET: keys = 1; WK_TRY(check_value(q->value, STORE_MAX_VALUE, "value")); body += bytes_size(q->value); break;
    case STORE_GET: keys = 1; timeout = true; break;
    case STORE_WAIT:
      keys = q->key_count;
      timeout = true;
      if (keys < 1 || keys > STORE_MAX_WAIT_KEYS)
        return WK_FAIL(WK_ERR_INVALID_ARG, "store wait: %u keys (must be 1..%d)", keys, STORE_MAX_WAIT_KEYS);
      body += I64_BYTES;
      break;
    case STORE_ADD: keys = 1; body += I64_BYTES; break;
    case STORE_CAS:
      keys = 1;
      WK_TRY(check_value(q->value, STORE_MAX_VALUE, "expected value"));
      WK_TRY(check_value(q->value2, STORE_MAX_VALUE, "desired value"));
      body += bytes_size(q->value) + bytes_size(q->value2);
      break;
    case STORE_STATUS: case STORE_BYE: break;
    default: return WK_FAIL(WK_ERR_INVALID_ARG, "store: unknown op %u", q->op);
  }
  if (q->flags & ~STORE_FLAG_NOREPLY || (q->flags && q->op != STORE_SET))
    return WK_FAIL(WK_ERR_INVALID_ARG, "store %s: flags 0x%02x not allowed", store_op_name(q->op), q->flags);
  if (timeout && (q->number < 0 || q->number > STORE_MAX_TIMEOUT_MS))
    return WK_FAIL(WK_ERR_INVALID_ARG, "store %s: timeout %lld ms out of range 0..%lld", store_op_name(q->op),
                   (long long)q->number, (long long)STORE_MAX_TIMEOUT_MS);
  for (uint32_t i = 0; i < keys; i++) {
    if (!key_is_valid(q->keys[i]))
      return WK_FAIL(WK_ERR_INVALID_ARG, "store %s: key must be 1..%d bytes without NUL", store_op_name(q->op), STORE_MAX_KEY);
    body += bytes_size(q->keys[i]);
  }
  if (timeout) body += I64_BYTES;
  size_t start = 0;
  WK_TRY(begin_frame(b, body, &start));
  put_u8(b, q->op);
  put_u8(b, q->flags);
  if (q->op == STORE_HELLO) {
    put_i64(b, q->number);
    put_i64(b, q->world_size);
    put_bytes(b, q->value);
    put_bytes(b, q->value2);
  }
  if (q->op == STORE_WAIT) put_i64(b, keys);
  for (uint32_t i = 0; i < keys; i++) put_bytes(b, q->keys[i]);
  if (q->op == STORE_SET) put_bytes(b, q->value);
  if (q->op == STORE_CAS) {
    put_bytes(b, q->value);
    put_bytes(b, q->value2);
  }
  if (q->op == STORE_ADD || timeout) put_i64(b, q->number);
  end_frame(b, start);
  return WK_OK;
}

WkStatus store_encode_reply(StoreBuffer *b, StoreOp op, const StoreReply *y) {
  size_t body = STATUS_BYTES;
  if (y->status == STORE_REPLY_ERROR) {
    WK_TRY(check_value(y->value, STORE_MAX_ERROR, "error message"));
    body += bytes_size(y->value);
  } else if (y->status == STORE_REPLY_MISSING) {
    if (op != STORE_GET && op != STORE_WAIT) return WK_FAIL(WK_ERR_INVALID_ARG, "store: 'missing' answers only get and wait");
  } else if (y->status == STORE_REPLY_OK) {
    switch (op) {
      case STORE_GET: case STORE_STATUS:
        WK_TRY(check_value(y->value, STORE_MAX_VALUE, "value"));
        body += bytes_size(y->value);
        break;
      case STORE_HELLO:
        if (y->value.length != 0 && y->value.length != STORE_PROOF_BYTES)
          return WK_FAIL(WK_ERR_INVALID_ARG, "store hello: a proof of %u bytes", y->value.length);
        body += bytes_size(y->value);
        break;
      case STORE_ADD: body += I64_BYTES; break;
      case STORE_CAS:
        if (y->swapped > 1) return WK_FAIL(WK_ERR_INVALID_ARG, "store: swapped flag %u", y->swapped);
        WK_TRY(check_value(y->value, STORE_MAX_VALUE, "value"));
        body += 1 + bytes_size(y->value);
        break;
      case STORE_SET: case STORE_WAIT: case STORE_BYE: break;
      default: return WK_FAIL(WK_ERR_INVALID_ARG, "store: no reply format for op %d", (int)op);
    }
  } else {
    return WK_FAIL(WK_ERR_INVALID_ARG, "store: unknown reply status %u", y->status);
  }
  size_t start = 0;
  WK_TRY(begin_frame(b, body, &start));
  put_u8(b, y->status);
  if (y->status == STORE_REPLY_ERROR) {
    put_bytes(b, y->value);
  } else if (y->status == STORE_REPLY_OK) {
    if (op == STORE_ADD) put_i64(b, y->number);
    if (op == STORE_CAS) put_u8(b, y->swapped);
    if (op == STORE_GET || op == STORE_STATUS || op == STORE_CAS || op == STORE_HELLO) put_bytes(b, y->value);
  }
  end_frame(b, start);
  return WK_OK;
}

WkStatus store_encode_challenge(StoreBuffer *b, const StoreChallenge *c) {
  size_t start = 0;
  WK_TRY(begin_frame(b, CHALLENGE_BYTES, &start));
  put(b, CHALLENGE_MAGIC, sizeof CHALLENGE_MAGIC);
  put_u8(b, CHALLENGE_VERSION);
  put_u8(b, c->keyed ? 1 : 0);
  put(b, c->nonce, STORE_NONCE_BYTES);
  end_frame(b, start);
  return WK_OK;
}

/* ---- the handshake's proofs -------------------------------------------------------------------- */

void store_proof(const uint8_t *secret, size_t secret_length, StoreProofRole role,
                 const uint8_t server_nonce[STORE_NONCE_BYTES], const uint8_t client_nonce[STORE_NONCE_BYTES],
                 int64_t rank, int64_t world_size, uint8_t out[STORE_PROOF_BYTES]) {
  /* Each side's label differs, so one side's proof is never valid as the other's. */
  const char *label = role == STORE_PROOF_CLIENT ? "wick store: client" : "wick store: server";
  enum { LABEL_BYTES = 18 };
  uint8_t message[LABEL_BYTES + 2 * STORE_NONCE_BYTES + 2 * I64_BYTES];
  StoreBuffer m = {.data = message, .capacity = sizeof message};
  put(&m, label, LABEL_BYTES);
  put(&m, server_nonce, STORE_NONCE_BYTES);
  put(&m, client_nonce, STORE_NONCE_BYTES);
  put_i64(&m, rank);
  put_i64(&m, world_size);
  wk_hmac_sha256(secret, secret_length, m.data, m.length, out);
}
