/*
 * tokenize.c — JSONL of text <-> JSONL of token ids on all cores, in input order: the engine of
 * `run -m wick.data.tokenize` (wk_tokenize_jsonl in wick.h), the tool people check a tokenizer with
 * against their Python stack.
 *
 * The calling thread reads the input in chunks of whole lines and writes finished chunks in order;
 * worker threads turn chunks into output (a bounded ring of 2 chunks per worker, so memory does not
 * grow with the input). A bad line stops the run: what came before it is written, and the error
 * names the file and line. Blank lines are skipped, as the converter skips them.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>    /* clock_gettime */
#include <unistd.h>  /* sysconf */

#include "../core/json.h"  /* wk_json_line_field, wk_utf8_valid_prefix */
#include "bpe/bpe.h"

enum {
  CHUNK_BYTES = 1 << 20,     /* input read per chunk (a longer line makes a longer chunk) */
  SLOTS_PER_THREAD = 2,
  MAX_THREADS = 256,
  ERROR_BYTES = 1024,
  DECIMAL_BYTES = 11,        /* "4294967295," */
};

typedef enum { SLOT_EMPTY, SLOT_READY, SLOT_BUSY, SLOT_DONE } SlotState;

typedef struct {
  SlotState state;
  uint8_t *data;
  size_t length, capacity;
  uint64_t first_line;  /* number of the chunk's first line */
  WkByteVec out;
  WkStatus status;
  char error[ERROR_BYTES];
  uint64_t lines, text_bytes, tokens;
} Slot;

typedef struct {
  const WkTokenizer *tokenizer;
  const char *input_name, *field;
  bool decode;
  Slot *slots;
  size_t slot_count;
  uint64_t next_ready;  /* next chunk sequence a worker may take */
  uint64_t read_seq;    /* chunks read so far */
  bool stop;
  pthread_mutex_t lock;
  pthread_cond_t work, done;
  double cpu_seconds;
} Run;

static double thread_cpu_seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ---- encoding lines ---------------------------------------------------------------------------- */

static const char DIGIT_PAIRS[] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

static WkStatus append_ids(WkByteVec *out, const uint32_t *ids, size_t count) {
  WK_TRY(wk_byte_vec_reserve(out, count * DECIMAL_BYTES + 3));
  uint8_t *p = out->data + out->length;
  *p++ = '[';
  for (size_t i = 0; i < count; i++) {
    if (i) *p++ = ',';
    /* Two digits per division: ids are written as fast as they are made. */
    char digits[DECIMAL_BYTES];
    int n = DECIMAL_BYTES;
    uint32_t v = ids[i];
    while (v >= 100) {
      uint32_t two = v % 100;
      v /= 100;
      digits[--n] = DIGIT_PAIRS[2 * two + 1];
      digits[--n] = DIGIT_PAIRS[2 * two];
    }
    if (v >= 10) {
      digits[--n] = DIGIT_PAIRS[2 * v + 1];
      digits[--n] = DIGIT_PAIRS[2 * v];
    } else {
      digits[--n] = (char)('0' + v);
    }
    memcpy(p, digits + n, (size_t)(DECIMAL_BYTES - n));
    p += DECIMAL_BYTES - n;
  }
  *p++ = ']';
  *p++ = '\n';
  out->length = (size_t)(p - out->data);
  return WK_OK;
}

/* ---- decoding lines ---------------------------------------------------------------------------- */

/* "[1, 2, 3]" -> ids; false with a reason. */
static bool parse_ids(const uint8_t *line, size_t length, WkTokenVec *ids, char reason[ERROR_BYTES]) {
  size_t i = 0;
#define SKIP_WS() while (i < length && (line[i] == ' ' || line[i] == '\t')) i++
  SKIP_WS();
  if (i == length || line[i] != '[') return snprintf(reason, ERROR_BYTES, "expected a JSON array of token ids"), false;
  i++;
  SKIP_WS();
  if (i < length && line[i] == ']') {
    i++;
  } else {
    for (;;) {
      SKIP_WS();
      size_t start = i;
      uint64_t v = 0;
      while (i < length && line[i] >= '0' && line[i] <= '9' && v <= UINT32_MAX) v = v * 10 + (line[i++] - '0');
      if (i == start || v >= UINT32_MAX || (i - start > 1 && line[start] == '0'))
        return snprintf(reason, ERROR_BYTES, "column %zu: expected a token id (a whole number below 2^32 - 1)",
                        start + 1), false;
      if (wk_token_vec_reserve(ids, 1) != WK_OK) return snprintf(reason, ERROR_BYTES, "out of memory"), false;
      ids->data[ids->length++] = (uint32_t)v;
      SKIP_WS();
      if (i < length && line[i] == ',') { i++; continue; }
      if (i < length && line[i] == ']') { i++; break; }
      return snprintf(reason, ERROR_BYTES, "column %zu: expected ',' or ']'", i + 1), false;
    }
  }
  SKIP_WS();
#undef SKIP_WS
  if (i != length) return snprintf(reason, ERROR_BYTES, "column %zu: text after the array", i + 1), false;
  return true;
}

/* Length of the invalid bytes at s to stand for by one U+FFFD: the maximal subpart of a sequence
 * (Unicode's recommended practice, which Python's errors="replace" follows). */
static size_t invalid_run(const uint8_t *s, size_t n) {
  uint8_t c = s[0];
  if (c < 0xC2 || c > 0xF4) return 1;
  size_t need = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  uint8_t low = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80, high = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
  size_t i = 1;
  if (i < n && s[i] >= low && s[i] <= high) {
    i++;
    while (i < need && i < n && (s[i] & 0xC0) == 0x80) i++;
  }
  return i;
}

static const char HEX[] = "0123456789abcdef";

/* bytes as the body of a JSON string: escapes, and U+FFFD for what is not UTF-8. */
static WkStatus append_json_string(WkByteVec *out, const uint8_t *s, size_t n) {
  WK_TRY(wk_byte_vec_reserve(out, n * 6));  /* \u00XX is the longest form per byte; U+FFFD is 3 */
  uint8_t *p = out->data + out->length;
  size_t i = 0;
  while (i < n) {
    uint8_t c = s[i];
    if (c >= 0x80) {
      size_t valid = wk_utf8_valid_prefix(s + i, n - i < 4 ? n - i : 4);
      size_t k = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
      if (valid >= k) {
        memcpy(p, s + i, k), p += k, i += k;
      } else {
        memcpy(p, "\xEF\xBF\xBD", 3), p += 3, i += invalid_run(s + i, n - i);
      }
      continue;
    }
    i++;
    if (c == '"' || c == '\\') *p++ = '\\', *p++ = c;
    else if (c == '\n') *p++ = '\\', *p++ = 'n';
    else if (c == '\r') *p++ = '\\', *p++ = 'r';
    else if (c == '\t') *p++ = '\\', *p++ = 't';
    else if (c < 0x20) memcpy(p, "\\u00", 4), p += 4, *p++ = (uint8_t)HEX[c >> 4], *p++ = (uint8_t)HEX[c & 15];
    else *p++ = c;
  }
  out->length = (size_t)(p - out->data);
  return WK_OK;
}

/* ---- a chunk ------------------------------------------------------------------------------------- */

typedef struct {
  WkScratch text;
  WkTokenVec ids;
  WkByteVec bytes;
} Scratch;

static WkStatus process_line(Run *run, Slot *slot, Scratch *sc, const uint8_t *line, size_t n, char reason[]) {
  if (!run->decode) {
    const char *text;
    size_t text_length;
    char why[128];
    if (!wk_json_line_field((const char *)line, n, run->field, &sc->text, &text, &text_length, why)) {
      snprintf(reason, ERROR_BYTES, "%s", why);
      return WK_ERR_FORMAT;
    }
    sc->ids.length = 0;
    WK_TRY(wk_tokenizer_encode_with(run->tokenizer, wk_tokenizer_template_of(run->tokenizer), (const uint8_t *)text,
                                    text_length, &sc->ids));
    slot->text_bytes += text_length;
    slot->tokens += sc->ids.length;
    return append_ids(&slot->out, sc->ids.data, sc->ids.length);
  }
  sc->ids.length = 0;
  if (!parse_ids(line, n, &sc->ids, reason)) return WK_ERR_FORMAT;
  sc->bytes.length = 0;
  WK_TRY(run->tokenizer->decode(run->tokenizer, sc->ids.data, sc->ids.length, &sc->bytes));
  slot->text_bytes += sc->bytes.length;
  slot->tokens += sc->ids.length;
  WK_TRY(wk_byte_vec_append(&slot->out, "{\"", 2));
  WK_TRY(append_json_string(&slot->out, (const uint8_t *)run->field, strlen(run->field)));
  WK_TRY(wk_byte_vec_append(&slot->out, "\":\"", 3));
  WK_TRY(append_json_string(&slot->out, sc->bytes.data, sc->bytes.length));
  return wk_byte_vec_append(&slot->out, "\"}\n", 3);
}

static void process_chunk(Run *run, Slot *slot, Scratch *sc) {
  const uint8_t *p = slot->data, *end = slot->data + slot->length;
  uint64_t line = slot->first_line;
  slot->out.length = 0;
  slot->lines = slot->text_bytes = slot->tokens = 0;
  slot->status = WK_OK;
  for (; p < end; line++) {
    const uint8_t *nl = memchr(p, '\n', (size_t)(end - p));
    size_t n = (size_t)((nl ? nl : end) - p);
    if (n && p[n - 1] == '\r') n--;
    bool blank = true;
    for (size_t k = 0; k < n && blank; k++) blank = p[k] == ' ' || p[k] == '\t';
    slot->lines++;
    if (!blank) {
      char reason[ERROR_BYTES] = "";
      WkStatus status = process_line(run, slot, sc, p, n, reason);
      if (status != WK_OK) {
        slot->status = status;
        snprintf(slot->error, sizeof slot->error, "%s:%llu: %s", run->input_name, (unsigned long long)line,
                 reason[0] ? reason : wk_last_error());
        return;
      }
    }
    p = nl ? nl + 1 : end;
  }
}

static void *worker(void *arg) {
  Run *run = arg;
  Scratch sc = {0};
  double cpu_start = thread_cpu_seconds();
  pthread_mutex_lock(&run->lock);
  for (;;) {
    while (!run->stop && run->next_ready == run->read_seq) pthread_cond_wait(&run->work, &run->lock);
    if (run->stop) break;
    Slot *slot = &run->slots[run->next_ready++ % run->slot_count];
    slot->state = SLOT_BUSY;
    pthread_mutex_unlock(&run->lock);
    process_chunk(run, slot, &sc);
    pthread_mutex_lock(&run->lock);
    slot->state = SLOT_DONE;
    pthread_cond_broadcast(&run->done);
  }
  run->cpu_seconds += thread_cpu_seconds() - cpu_start;
  pthread_mutex_unlock(&run->lock);
  free(sc.text.data);
  free(sc.ids.data);
  free(sc.bytes.data);
  return NULL;
}

/* ---- reading and writing ------------------------------------------------------------------------- */

typedef struct {
  FILE *file;
  const char *name;
  uint8_t *carry;  /* the start of a line read past the previous chunk */
  size_t carry_length, carry_capacity;
  bool eof;
  uint64_t next_line;
} Reader;

static WkStatus reserve(uint8_t **data, size_t *capacity, size_t need, const char *what) {
  if (need <= *capacity) return WK_OK;
  size_t cap = *capacity ? *capacity : CHUNK_BYTES;
  while (cap < need) cap *= 2;
  uint8_t *grown = realloc(*data, cap);
  if (!grown) return WK_FAIL(WK_ERR_NOMEM, "out of memory reading %s (%zu bytes)", what, cap);
  *data = grown;
  *capacity = cap;
  return WK_OK;
}

/* Fills slot with whole lines (the last one may lack its newline at the end of the input). */
static WkStatus read_chunk(Reader *r, Slot *slot) {
  WK_TRY(reserve(&slot->data, &slot->capacity, r->carry_length + CHUNK_BYTES, r->name));
  if (r->carry_length) memcpy(slot->data, r->carry, r->carry_length);
  size_t length = r->carry_length;
  r->carry_length = 0;
  size_t scanned = 0;  /* no newline before this */
  for (;;) {
    if (length == slot->capacity) WK_TRY(reserve(&slot->data, &slot->capacity, length + CHUNK_BYTES, r->name));
    size_t got = fread(slot->data + length, 1, slot->capacity - length, r->file);
    length += got;
    if (got == 0) {
      if (ferror(r->file)) return WK_FAIL(WK_ERR_IO, "reading '%s' failed: %s", r->name, strerror(errno));
      r->eof = true;
      break;
    }
    const uint8_t *last = NULL;
    for (size_t k = length; k > scanned; k--)
      if (slot->data[k - 1] == '\n') {
        last = slot->data + k - 1;
        break;
      }
    if (last) {
      size_t keep = (size_t)(last - slot->data) + 1;
      WK_TRY(reserve(&r->carry, &r->carry_capacity, length - keep, r->name));
      if (length > keep) memcpy(r->carry, slot->data + keep, length - keep);
      r->carry_length = length - keep;
      length = keep;
      break;
    }
    scanned = length;
  }
  slot->length = length;
  slot->first_line = r->next_line;
  for (size_t k = 0; k < length; k++) r->next_line += slot->data[k] == '\n';
  return WK_OK;
}

static WkStatus write_out(FILE *file, const char *name, const WkByteVec *out) {
  if (out->length && fwrite(out->data, 1, out->length, file) != out->length)
    return WK_FAIL(WK_ERR_IO, "writing '%s' failed: %s", name, strerror(errno));
  return WK_OK;
}

/* ---- the run ------------------------------------------------------------------------------------- */

/* Writes finished chunks in order until one is not finished; holds run->lock. */
static WkStatus drain(Run *run, uint64_t *write_seq, FILE *out, const char *output, WkTokenizeStats *stats) {
  for (;;) {
    if (*write_seq == run->read_seq) return WK_OK;
    Slot *slot = &run->slots[*write_seq % run->slot_count];
    if (slot->state != SLOT_DONE) return WK_OK;
    pthread_mutex_unlock(&run->lock);
    WkStatus status = write_out(out, output, &slot->out);
    stats->lines += slot->lines;
    stats->text_bytes += slot->text_bytes;
    stats->tokens += slot->tokens;
    if (status == WK_OK && slot->status != WK_OK) status = WK_FAIL(slot->status, "%s", slot->error);
    pthread_mutex_lock(&run->lock);
    if (status != WK_OK) return status;
    slot->state = SLOT_EMPTY;
    (*write_seq)++;
  }
}

static WkStatus run_pipeline(Run *run, Reader *reader, FILE *out, const char *output, WkTokenizeStats *stats) {
  uint64_t write_seq = 0;
  WkStatus status = WK_OK;
  pthread_mutex_lock(&run->lock);
  for (;;) {
    status = drain(run, &write_seq, out, output, stats);
    if (status != WK_OK) break;
    Slot *next = &run->slots[run->read_seq % run->slot_count];
    if (!reader->eof && next->state == SLOT_EMPTY) {
      pthread_mutex_unlock(&run->lock);
      status = read_chunk(reader, next);
      pthread_mutex_lock(&run->lock);
      if (status != WK_OK) break;
      if (next->length == 0) continue; /* the end, found by this read */
      next->state = SLOT_READY;
      run->read_seq++;
      pthread_cond_signal(&run->work);
      continue;
    }
    if (reader->eof && write_seq == run->read_seq) break;
    pthread_cond_wait(&run->done, &run->lock);
  }
  run->stop = true;
  pthread_cond_broadcast(&run->work);
  pthread_mutex_unlock(&run->lock);
  return status;
}

/* The tool's one parameter is an argument of wk_tokenize_jsonl; its bounds are asked for as the others'. */
static const WkParamSpec PARAM_SPECS[WK_TOKENIZE_PARAM_COUNT] = {
    [WK_TOKENIZE_THREADS] = {0, MAX_THREADS, 0, "threads"},  /* 0: all CPUs */
};
static const WkParamTable PARAMS = {"tokenize", PARAM_SPECS, WK_TOKENIZE_PARAM_COUNT};

WkStatus wk_tokenize_param_bounds(WkTokenizeParam param, int64_t *min, int64_t *max) {
  return wk_param_bounds(&PARAMS, (int)param, min, max);
}

static int default_threads(void) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  return cpus < 1 ? 1 : cpus > MAX_THREADS ? MAX_THREADS : (int)cpus;
}

WkStatus wk_tokenize_jsonl(const WkTokenizer *t, const char *input, const char *output, const char *field,
                           int decode, int threads, WkTokenizeStats *stats) {
  memset(stats, 0, sizeof *stats);
  if (!t || !input || !output || !field || !field[0])
    return WK_FAIL(WK_ERR_INVALID_ARG, "wk_tokenize_jsonl: tokenizer, input, output and field are required");
  int64_t min, max;
  WK_TRY(wk_tokenize_param_bounds(WK_TOKENIZE_THREADS, &min, &max));
  WK_TRY(wk_param_check(&PARAMS, WK_TOKENIZE_THREADS, threads, min, max));
  if (!decode && !t->encode) return WK_FAIL(WK_ERR_UNSUPPORTED, "tokenizer '%s' cannot encode text", t->name);
  if (decode && !t->decode) return WK_FAIL(WK_ERR_UNSUPPORTED, "tokenizer '%s' cannot decode tokens", t->name);
  if (threads == 0) threads = default_threads();
  bool from_stdin = strcmp(input, "-") == 0, to_stdout = strcmp(output, "-") == 0;
  FILE *in = from_stdin ? stdin : fopen(input, "rb");
  if (!in) return WK_FAIL_ERRNO("open", input);
  FILE *out = to_stdout ? stdout : fopen(output, "wb");
  if (!out) {
    WkStatus status = WK_FAIL_ERRNO("create", output);
    if (!from_stdin) fclose(in);
    return status;
  }
  uint64_t started = wk_now_ns();
  Run run = {.tokenizer = t, .input_name = from_stdin ? "<stdin>" : input, .field = field, .decode = decode != 0,
             .slot_count = (size_t)threads * SLOTS_PER_THREAD};
  Reader reader = {.file = in, .name = run.input_name, .next_line = 1};
  pthread_mutex_init(&run.lock, NULL);
  pthread_cond_init(&run.work, NULL);
  pthread_cond_init(&run.done, NULL);
  pthread_t *ids = wk_calloc((size_t)threads, sizeof *ids, "tokenizer threads");
  run.slots = wk_calloc(run.slot_count, sizeof *run.slots, "tokenizer chunks");
  WkStatus status = ids && run.slots ? WK_OK : wk_last_status();
  int started_threads = 0;
  for (; status == WK_OK && started_threads < threads; started_threads++) {
    int rc = wk_thread_create(&ids[started_threads], worker, &run);
    if (rc != 0) status = WK_FAIL(WK_ERR_NOMEM, "cannot start tokenizer thread %d: %s", started_threads, strerror(rc));
    if (rc != 0) break;
  }
  if (status == WK_OK) {
    status = run_pipeline(&run, &reader, out, output, stats);
  } else {
    pthread_mutex_lock(&run.lock);
    run.stop = true;
    pthread_cond_broadcast(&run.work);
    pthread_mutex_unlock(&run.lock);
  }
  for (int i = 0; i < started_threads; i++) pthread_join(ids[i], NULL);
  if (fflush(out) != 0 && status == WK_OK) status = WK_FAIL(WK_ERR_IO, "writing '%s' failed: %s", output, strerror(errno));
  if (!to_stdout && fclose(out) != 0 && status == WK_OK)
    status = WK_FAIL(WK_ERR_IO, "closing '%s' failed: %s", output, strerror(errno));
  if (!from_stdin) fclose(in);
  for (size_t i = 0; run.slots && i < run.slot_count; i++) {
    free(run.slots[i].data);
    free(run.slots[i].out.data);
  }
  free(run.slots);
  free(ids);
  free(reader.carry);
  pthread_mutex_destroy(&run.lock);
  pthread_cond_destroy(&run.work);
  pthread_cond_destroy(&run.done);
  stats->seconds = (double)(wk_now_ns() - started) * 1e-9;
  stats->cpu_seconds = run.cpu_seconds;
  stats->threads = (uint32_t)threads;
  return status;
}
