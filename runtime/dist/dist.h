/*
 * runtime/dist — distributed runs: who we are, how ranks meet, and the collectives they share.
 *
 * Owns:
 *   world.c        the world (rank, world size, local rank, master address) from torchrun's or
 *                  SLURM's environment; a process with neither is a world of 1 and opens no socket
 *   protocol.c     the rendezvous store's wire format: frames, requests, replies (fuzzed:
 *                  tests/fuzz/fuzz_store.c), and nothing that touches a socket
 *   store_server.c the store rank 0 serves at MASTER_ADDR:MASTER_PORT (that address only), on a
 *                  thread of its own, to connections that prove the job's secret
 *   store_client.c the client every rank (rank 0 too) talks to it with: the handshake, then set,
 *                  get, wait, add, compare-and-set, each bounded by a timeout
 *   net.c          the socket helpers both sides share (deadlines, full reads and writes)
 *   reduce.c       element-wise sum/avg/max/min over f32, bf16, f16, i32, i64, u8
 *   comm.c         WkDist, the one collective interface: sequence numbers, the progress thread
 *                  that posts each rank's current collective to the store, the world-1 path, the
 *                  Gloo backend for CPU tensors, the NCCL module for CUDA tensors, and the worker
 *                  thread that runs asynchronous collectives
 *   nccl_loader.c  opens the NCCL module on first use and passes the unique id through the store
 *   nccl_module.h  the NCCL module's entry points, listed once (the module, the loader and the
 *                  smoke test's cdef are made from the list)
 *   report.c       the hang report: which ranks are missing and where they were, from the store
 *   gloo.cpp       the thin C++ shim over Debian's libgloo (TCP transport, our store as its Store):
 *                  the only C++ in the tree; every exception stops there and becomes a WkStatus
 *   nccl/          the NCCL backend, built into build/libwick_nccl.so only when NCCL is found and
 *                  loaded by comm.c on the first collective over a CUDA tensor
 * It does not own tensors, streams or devices (runtime/tensor, runtime/ops) or the launcher
 * (runtime/host/launch.c), which only sets the torchrun variables that world.c reads.
 *
 * Internal header: runtime/dist code includes it; Lua sees only runtime/wick.h.
 */
#ifndef WK_DIST_H
#define WK_DIST_H

#include "../core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- limits of the store (everything a peer sends is checked against them) ------------------ */
enum {
  STORE_MAX_KEY = 1024,                          /* bytes in a key */
  STORE_MAX_VALUE = 16 << 20,                    /* bytes in a value */
  STORE_MAX_WAIT_KEYS = 64,                      /* keys in one wait */
  STORE_MAX_ERROR = 512,                         /* bytes of an error reply's message */
  STORE_FRAME_HEADER = 4,                        /* u32 little-endian body length */
  STORE_MAX_FRAME = 2 * STORE_MAX_VALUE + 65536, /* a compare-and-set carries two values */
  STORE_MAX_HELLO_FRAME = 256,                   /* what a peer may send before it is authenticated */
  STORE_MAX_WORLD = WK_DIST_MAX_WORLD,           /* ranks in a job */
  STORE_NONCE_BYTES = 32,                        /* each side's challenge */
  STORE_PROOF_BYTES = 32                         /* HMAC-SHA256 */
};
#define STORE_MAX_TIMEOUT_MS ((int64_t)WK_DIST_MAX_TIMEOUT_S * 1000)

/* What a server allows; STORE_LIMITS are the ones of wick.h's wk_store_server_start. */
typedef struct {
  size_t max_bytes;              /* keys + values it holds at once */
  int64_t handshake_timeout_ms;  /* from accept to an accepted hello */
} StoreLimits;
#define STORE_LIMITS ((StoreLimits){.max_bytes = (size_t)1 << 30, .handshake_timeout_ms = 10000})

/* ---- protocol.c: the wire format ---------------------------------------------------------------
 * A frame is a u32 little-endian body length, then the body. A request body is an op byte, a
 * flags byte, then the op's fields; a reply body is a status byte, then the fields of the op it
 * answers. Byte strings are a u32 length and the bytes; integers are 8 bytes little-endian.
 *
 * The handshake: on every connection the server speaks first, a CHALLENGE ("WICK", version 1,
 * keyed byte, its nonce). The client's first request is HELLO with its own nonce and, when the
 * store is keyed, its proof HMAC(secret, client label, both nonces, rank, world size); the server
 * answers OK with its own proof (server label, same fields), so each side knows the other holds
 * the job's secret, and neither ever sends it. Nothing else is handled before an accepted HELLO.
 *   HELLO  number=rank (-1: anonymous), world_size (0 for anonymous), value=client nonce,
 *          value2=proof (empty when the store is not keyed)   -> OK value=server proof
 *   SET    key, value                              -> OK (no reply with STORE_FLAG_NOREPLY)
 *   GET    key, number=timeout_ms                  -> OK value | MISSING
 *   WAIT   count, keys..., number=timeout_ms       -> OK | MISSING
 *   ADD    key, number=delta                       -> OK number (the new value)
 *   CAS    key, value=expected, value2=desired     -> OK swapped-byte value (the value now)
 *   STATUS                                         -> OK value (one StoreRankState byte per rank)
 *   BYE                                            -> OK (the rank closed on purpose)
 * Any request may be answered ERROR message. */
typedef enum {
  STORE_HELLO = 1, STORE_SET = 2, STORE_GET = 3, STORE_WAIT = 4, STORE_ADD = 5, STORE_CAS = 6,
  STORE_STATUS = 7, STORE_BYE = 8
} StoreOp;

enum { STORE_FLAG_NOREPLY = 1 };  /* SET only: fire and forget (progress posts) */

typedef enum { STORE_REPLY_OK = 0, STORE_REPLY_MISSING = 1, STORE_REPLY_ERROR = 2 } StoreReplyStatus;

/* What the server knows of each rank, for the hang report. */
typedef enum {
  STORE_RANK_UNSEEN = 0,     /* never said hello */
  STORE_RANK_CONNECTED = 1,
  STORE_RANK_CLOSED = 2,     /* said bye: dist:close() */
  STORE_RANK_LOST = 3        /* its connection dropped without a bye: killed, crashed or exited */
} StoreRankState;

typedef struct {
  const uint8_t *data;  /* points into the frame it was parsed from */
  uint32_t length;
} StoreBytes;

typedef struct {
  uint8_t op;           /* StoreOp */
  uint8_t flags;
  uint32_t key_count;   /* 1, or the keys of a WAIT; 0 for HELLO, STATUS, BYE */
  StoreBytes keys[STORE_MAX_WAIT_KEYS];
  StoreBytes value, value2;
  int64_t number;       /* rank, timeout_ms or delta */
  int64_t world_size;   /* HELLO */
} StoreRequest;

typedef struct {
  bool keyed;           /* the server holds a job secret: the hello must prove it too */
  uint8_t nonce[STORE_NONCE_BYTES];
} StoreChallenge;

typedef enum { STORE_PROOF_CLIENT = 0, STORE_PROOF_SERVER = 1 } StoreProofRole;

typedef struct {
  uint8_t status;       /* StoreReplyStatus */
  uint8_t swapped;      /* CAS */
  int64_t number;       /* ADD */
  StoreBytes value;     /* GET, CAS, STATUS; the message of an ERROR */
} StoreReply;

/* A growable byte buffer frames are encoded into. */
typedef struct {
  uint8_t *data;
  size_t length, capacity;
} StoreBuffer;

void store_buffer_free(StoreBuffer *b);

typedef enum { FRAME_INCOMPLETE = 0, FRAME_READY = 1, FRAME_INVALID = 2 } FrameState;

/* Looks at the first `available` bytes of a stream: FRAME_READY sets *frame_length (header
 * included); FRAME_INVALID (a length of 0 or over STORE_MAX_FRAME) records the reason. */
FrameState store_frame_check(const uint8_t *data, size_t available, size_t *frame_length);

/* Parse a frame's body (header excluded). WK_ERR_FORMAT names what is wrong: an unknown op, a
 * field past the end, trailing bytes, a key that is empty, too long or holds a NUL, a timeout
 * out of range. Parsed byte strings point into body. */
WkStatus store_parse_request(const uint8_t *body, size_t length, StoreRequest *out);
WkStatus store_parse_reply(StoreOp op, const uint8_t *body, size_t length, StoreReply *out);
WkStatus store_parse_challenge(const uint8_t *body, size_t length, StoreChallenge *out);

/* Append one whole frame (header included). The request/reply must satisfy the limits above. */
WkStatus store_encode_request(StoreBuffer *b, const StoreRequest *request);
WkStatus store_encode_reply(StoreBuffer *b, StoreOp op, const StoreReply *reply);
WkStatus store_encode_challenge(StoreBuffer *b, const StoreChallenge *challenge);

/* What `role` sends to prove it knows the secret, bound to both nonces and the hello's identity
 * (so a proof cannot be replayed on another connection, for another rank, or by the other side). */
void store_proof(const uint8_t *secret, size_t secret_length, StoreProofRole role,
                 const uint8_t server_nonce[STORE_NONCE_BYTES], const uint8_t client_nonce[STORE_NONCE_BYTES],
                 int64_t rank, int64_t world_size, uint8_t out[STORE_PROOF_BYTES]);

const char *store_op_name(int op);  /* "get", ...; "?" when unknown */

/* ---- world.c -------------------------------------------------------------------------------- */

/* The first host of a SLURM node list ("gpu[07-09,12],cpu3" -> "gpu07"). WK_ERR_FORMAT on
 * anything that is not a node list; out gets at most capacity - 1 characters. */
WkStatus world_first_slurm_host(const char *nodelist, char *out, size_t capacity);

/* ---- net.c ---------------------------------------------------------------------------------- */

/* Absolute CLOCK_MONOTONIC deadline in ms for a timeout from now (timeout < 0: none). */
int64_t net_deadline(int64_t timeout_ms);
int64_t net_remaining(int64_t deadline_ms);  /* ms left, 0 when passed, -1 for no deadline */
int64_t net_now_ms(void);
/* Writes all bytes / reads exactly `length` bytes before the deadline; `peer` names the other
 * side in messages. WK_ERR_TIMEOUT, WK_ERR_CLOSED (orderly end of stream) or WK_ERR_NETWORK. */
WkStatus net_write_all(int fd, const void *data, size_t length, int64_t deadline_ms, const char *peer);
WkStatus net_read_exact(int fd, void *data, size_t length, int64_t deadline_ms, const char *peer);
void net_no_delay(int fd);  /* TCP_NODELAY: small store messages must not wait for Nagle */

/* ---- store internals the collectives use -------------------------------------------------- */

/* The server and the client of wick.h with the secret given (length 0: none) instead of the job's
 * (wk_job_secret), and the server's limits: what the public calls do, and what tests use to try
 * other secrets and limits. */
WkStoreServer *store_server_start_keyed(const char *host, int port, int world_size, const uint8_t *secret,
                                        size_t secret_length, StoreLimits limits);
WkStore *store_connect_keyed(const char *host, int port, int rank, int world_size, int64_t timeout_ms,
                             const uint8_t *secret, size_t secret_length);

/* Fire-and-forget SET (no reply awaited): posting progress costs one send(). */
WkStatus store_post(WkStore *store, const char *key, const void *value, size_t length);
/* GET into a malloc'ed buffer (*value, free() it); WK_ERR_TIMEOUT when absent at the deadline. */
WkStatus store_get_alloc(WkStore *store, const char *key, int64_t timeout_ms, uint8_t **value, size_t *length);
/* The local address the store connection uses: the address other ranks can reach us at. */
const char *store_local_address(const WkStore *store);
/* One StoreRankState per rank, as the server sees them (count must be the world size). */
WkStatus store_rank_states(WkStore *store, uint8_t *states, uint32_t count, int64_t timeout_ms);

/* ---- reduce.c ------------------------------------------------------------------------------- */

/* out[i] = op(a[i], b[i]) for n elements of dtype (f32, bf16, f16, i32, i64, u8); out may alias a or
 * b. AVG combines as SUM: dist_finish_average divides once all contributions are in. */
void dist_reduce(void *out, const void *a, const void *b, size_t n, WkDType dtype, WkReduceOp op);
void dist_finish_average(void *data, size_t n, WkDType dtype, int world_size);
bool dist_dtype_supported(WkDType dtype);

/* ---- the collectives every backend implements ------------------------------------------------ */
typedef enum {
  COLL_ALL_REDUCE = 0, COLL_BROADCAST = 1, COLL_ALL_GATHER = 2, COLL_REDUCE_SCATTER = 3, COLL_BARRIER = 4
} CollectiveKind;

/* ---- gloo.cpp: the C face of the C++ shim -------------------------------------------------- */
typedef struct GlooGroup GlooGroup;

/* Connects a full mesh of TCP pairs through the store (keys under prefix); hostname is the
 * address this rank listens on. NULL on failure with the reason recorded. */
GlooGroup *gloo_connect(WkStore *store, const char *prefix, int rank, int size, const char *hostname,
                        int64_t timeout_ms);
void gloo_free(GlooGroup *group);
WkStatus gloo_all_reduce(GlooGroup *group, void *data, size_t count, WkDType dtype, WkReduceOp op,
                         uint32_t tag, int64_t timeout_ms);
WkStatus gloo_broadcast(GlooGroup *group, void *data, size_t bytes, int root, uint32_t tag, int64_t timeout_ms);
WkStatus gloo_all_gather(GlooGroup *group, void *out, const void *in, size_t bytes, uint32_t tag,
                         int64_t timeout_ms);
/* in holds size blocks of count elements; out gets the reduction of block `rank`. */
WkStatus gloo_reduce_scatter(GlooGroup *group, void *out, const void *in, size_t count, WkDType dtype,
                             WkReduceOp op, uint32_t tag, int64_t timeout_ms);
WkStatus gloo_barrier(GlooGroup *group, uint32_t tag, int64_t timeout_ms);

/* ---- nccl_loader.c: the NCCL module (build/libwick_nccl.so), loaded on first use ------------- */
typedef struct NcclGroup NcclGroup;

/* Creates this rank's communicator on cuda:device_index: rank 0 makes the unique id and sets it
 * at id_key, the others get it from there. WK_ERR_UNSUPPORTED without NCCL or a GPU. */
WkStatus nccl_group_open(WkStore *store, const char *id_key, int rank, int size, int device_index,
                         int64_t timeout_ms, NcclGroup **out);
void nccl_group_free(NcclGroup *group);
/* Runs one collective on the communicator's stream after the work queued on `stream` (the
 * caller's; NULL = default), and waits for it at most timeout_ms (then aborts the communicator).
 * count is per rank: the input's elements, the output's for reduce-scatter. */
WkStatus nccl_group_run(NcclGroup *group, CollectiveKind kind, void *out, const void *in, size_t count,
                        WkDType dtype, WkReduceOp op, int root, void *stream, int64_t timeout_ms);

/* ---- report.c ------------------------------------------------------------------------------- */

/* What a rank's progress thread posts to the store about its current collective (key
 * DIST_PROGRESS_KEY + rank). */
typedef struct {
  uint64_t seq;           /* 1 for the first collective of the process group */
  const char *name;       /* "all_reduce", ... */
  int64_t numel;
  WkDType dtype;
  const char *site;       /* "recipe.lua:31" or "" */
} DistProgress;

#define DIST_PROGRESS_KEY "wick/progress/"
#define DIST_FAILED_KEY "wick/failed/"

int dist_format_progress(char *out, size_t capacity, const DistProgress *p);

/* Turns the failure recorded on this thread (a collective `current` that failed or timed out
 * after `elapsed_ns`) into the hang report: asks the store who is behind or gone, and rewrites
 * the thread's error message. Returns the status to report (WK_ERR_TIMEOUT or WK_ERR_NETWORK). */
WkStatus dist_report_failure(WkStore *store, int rank, int world_size, const DistProgress *current,
                             uint64_t elapsed_ns);

#ifdef __cplusplus
}
#endif
#endif /* WK_DIST_H */
