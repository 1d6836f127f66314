/*
 * cursor.c — writes and reads the stream cursor:
 *   wick-cursor/2 step=120 micro=0 world=2 global=32 seq=256 seed=7 mode=packed shuffle=1
 *   window=536870912 buffer=4194304 partitions=1 chunk=1 skipped=0 src=9f3c...:3840:0x0p+0 src=...
 *   sum=1a2b3c4d5e6f7081
 * One line of key=value words, a few hundred bytes. Credits are hex floats (%a) so they round-trip
 * exactly. A cursor comes from outside (a file, a checkpoint, a command line), so every field is
 * required once, in range, in its exact syntax (digits only: no sign, no spaces), and the last word is
 * a checksum of the rest: a cursor cut short or edited is refused rather than restoring the wrong
 * position. Unknown keys are an error: a cursor from a newer Wick is refused, not half-read.
 */
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "stream.h"

static const char CURSOR_MAGIC[] = "wick-cursor/";
static const char SUM_KEY[] = " sum=";
static const char *const MODE_NAMES[] = {"packed", "pad"};

enum {
  CURSOR_MAX_LENGTH = 8192,
  FINGERPRINT_DIGITS = 16,
  SUM_DIGITS = 16,
};

/* Appends to buffer; returns false once out of room (the caller reports it). */
static bool append(char *buffer, size_t capacity, size_t *used, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bool append(char *buffer, size_t capacity, size_t *used, const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  int n = vsnprintf(buffer + *used, capacity - *used, fmt, args);
  va_end(args);
  if (n < 0 || (size_t)n >= capacity - *used) return false;
  *used += (size_t)n;
  return true;
}

static uint64_t checksum(const char *text, size_t length) { return XXH3_64bits(text, length); }

WkStatus wk_cursor_format(const WkCursor *c, char *buffer, size_t capacity, size_t *length) {
  size_t used = 0;
  bool ok = capacity > 0 &&
            append(buffer, capacity, &used,
                   "%s%d step=%" PRIu64 " micro=%u world=%u global=%u seq=%u seed=%" PRIu64
                   " mode=%s shuffle=%d window=%" PRIu64 " buffer=%" PRIu64 " partitions=%u chunk=%u skipped=%" PRIu64,
                   CURSOR_MAGIC, WK_CURSOR_VERSION, c->step, c->micro, c->world, c->global_batch, c->seq_len,
                   c->seed, MODE_NAMES[c->mode], c->shuffle ? 1 : 0, c->window_tokens, c->buffer_tokens,
                   c->partitions, c->chunk, c->skipped);
  for (uint32_t i = 0; ok && i < c->sources; i++)
    ok = append(buffer, capacity, &used, " src=%016" PRIx64 ":%" PRIu64 ":%a", c->fingerprint[i],
                c->position[i].draws, c->position[i].credit);
  if (ok) ok = append(buffer, capacity, &used, "%s%016" PRIx64, SUM_KEY, checksum(buffer, used));
  if (!ok) return WK_FAIL(WK_ERR_INVALID_ARG, "cursor buffer of %zu bytes is too small", capacity);
  *length = used;
  return WK_OK;
}

/* ---- reading ------------------------------------------------------------------------------------- */

/* A run of digits (base 10 or 16) and nothing else, at most max; *end gets what follows it. */
static bool parse_digits(const char *text, int base, uint64_t max, uint64_t *out, const char **end) {
  uint64_t n = 0;
  const char *p = text;
  for (; *p; p++) {
    int d = *p >= '0' && *p <= '9' ? *p - '0' : base == 16 && *p >= 'a' && *p <= 'f' ? *p - 'a' + 10 : -1;
    if (d < 0) break;
    if (n > (max - (uint64_t)d) / (uint64_t)base) return false; /* past max */
    n = n * (uint64_t)base + (uint64_t)d;
  }
  *out = n;
  *end = p;
  return p > text;
}

/* The numeric fields: name in the text, where it lives in WkCursor, its width, and its range (what a
 * loader could have written: the loader's own parameter bounds). */
typedef struct {
  const char *key;
  size_t offset;
  size_t size;
  uint64_t min, max;
} NumberField;
#define FIELD(key, member, min, max) {key, offsetof(WkCursor, member), sizeof(((WkCursor *)0)->member), min, max}
static const NumberField NUMBER_FIELDS[] = {
    FIELD("step", step, 0, INT64_MAX),
    FIELD("micro", micro, 0, (1u << 24) - 1),
    FIELD("world", world, 1, 1u << 20),
    FIELD("global", global_batch, 1, 1u << 24),
    FIELD("seq", seq_len, 1, 1u << 24),
    FIELD("seed", seed, 0, UINT64_MAX),
    FIELD("shuffle", shuffle, 0, 1),
    FIELD("window", window_tokens, 1, 1ull << 40),
    FIELD("buffer", buffer_tokens, 1, 1ull << 40),
    FIELD("partitions", partitions, 1, 1u << 20),
    FIELD("chunk", chunk, 1, 1u << 24),
    FIELD("skipped", skipped, 0, INT64_MAX),
};
enum { NUMBER_FIELD_COUNT = sizeof NUMBER_FIELDS / sizeof NUMBER_FIELDS[0], MODE_FIELD = NUMBER_FIELD_COUNT };

static WkStatus parse_number(const NumberField *field, const char *value, WkCursor *out) {
  uint64_t n = 0;
  const char *end;
  if (!parse_digits(value, 10, field->max, &n, &end) || *end != '\0' || n < field->min)
    return WK_FAIL(WK_ERR_FORMAT, "cursor field %s='%s' is not a whole number in [%llu, %llu]", field->key, value,
                   (unsigned long long)field->min, (unsigned long long)field->max);
  if (field->size == sizeof(uint32_t)) {
    uint32_t narrow = (uint32_t)n;
    memcpy((char *)out + field->offset, &narrow, sizeof narrow);
  } else {
    memcpy((char *)out + field->offset, &n, sizeof n);
  }
  return WK_OK;
}

/* src=FINGERPRINT:DRAWS:CREDIT — 16 hex digits, digits, a finite hex float within one global batch. */
static WkStatus parse_source(const char *value, WkCursor *out) {
  if (out->sources == WK_MIX_MAX_SOURCES)
    return WK_FAIL(WK_ERR_FORMAT, "cursor has more than %d sources", WK_MIX_MAX_SOURCES);
  uint32_t i = out->sources;
  const char *p;
  uint64_t draws;
  if (!parse_digits(value, 16, UINT64_MAX, &out->fingerprint[i], &p) || p - value != FINGERPRINT_DIGITS || *p != ':' ||
      !parse_digits(p + 1, 10, INT64_MAX, &draws, &p) || *p != ':')
    return WK_FAIL(WK_ERR_FORMAT, "cursor source '%s': expected FINGERPRINT:DRAWS:CREDIT (16 hex digits, digits, "
                   "a hex float)", value);
  char *end;
  double credit = strtod(p + 1, &end);
  if (end == p + 1 || *end != '\0' || !isfinite(credit) || fabs(credit) > (double)(1u << 24))
    return WK_FAIL(WK_ERR_FORMAT, "cursor source '%s': credit '%s' is not a finite number within a global batch",
                   value, p + 1);
  out->position[i] = (WkSourcePosition){.draws = draws, .credit = credit};
  out->sources++;
  return WK_OK;
}

/* Sets one field; `seen` has a bit per named field, so each appears exactly once. */
static WkStatus parse_field(const char *key, const char *value, WkCursor *out, uint32_t *seen) {
  if (strcmp(key, "src") == 0) return parse_source(value, out);
  int field = -1;
  for (int f = 0; f < NUMBER_FIELD_COUNT; f++)
    if (strcmp(key, NUMBER_FIELDS[f].key) == 0) field = f;
  if (strcmp(key, "mode") == 0) field = MODE_FIELD;
  if (field < 0) return WK_FAIL(WK_ERR_FORMAT, "cursor has an unknown field '%s' (written by a newer Wick?)", key);
  if (*seen & (1u << field)) return WK_FAIL(WK_ERR_FORMAT, "cursor field '%s' appears twice", key);
  *seen |= 1u << field;
  if (field != MODE_FIELD) return parse_number(&NUMBER_FIELDS[field], value, out);
  for (int m = 0; m < 2; m++)
    if (strcmp(value, MODE_NAMES[m]) == 0) {
      out->mode = (WkPackMode)m;
      return WK_OK;
    }
  return WK_FAIL(WK_ERR_FORMAT, "cursor mode '%s' is not packed or pad", value);
}

/* The last word must be sum= of everything before it. */
static WkStatus check_sum(const char *text, size_t length) {
  const char *sum = NULL;
  for (const char *p = strstr(text, SUM_KEY); p; p = strstr(p + 1, SUM_KEY)) sum = p;
  uint64_t want = 0;
  const char *end;
  if (!sum || !parse_digits(sum + strlen(SUM_KEY), 16, UINT64_MAX, &want, &end) ||
      end - (sum + strlen(SUM_KEY)) != SUM_DIGITS || (size_t)(end - text) != length)
    return WK_FAIL(WK_ERR_FORMAT, "cursor has no checksum at its end (sum=16 hex digits): cut short, or not written "
                   "by loader:state()?");
  if (checksum(text, (size_t)(sum - text)) != want)
    return WK_FAIL(WK_ERR_FORMAT, "cursor checksum does not match its text: it was cut or edited; use the cursor "
                   "exactly as loader:state() wrote it");
  return WK_OK;
}

WkStatus wk_cursor_parse(const char *text, WkCursor *out) {
  memset(out, 0, sizeof *out);
  size_t magic_length = strlen(CURSOR_MAGIC);
  if (!text || strncmp(text, CURSOR_MAGIC, magic_length) != 0)
    return WK_FAIL(WK_ERR_FORMAT, "not a Wick cursor (it should start with '%s')", CURSOR_MAGIC);
  size_t length = strlen(text);
  if (length >= CURSOR_MAX_LENGTH) return WK_FAIL(WK_ERR_FORMAT, "cursor is longer than %d bytes", CURSOR_MAX_LENGTH);
  while (length > 0 && (text[length - 1] == '\n' || text[length - 1] == '\r')) length--; /* a line read from a file */
  char copy[CURSOR_MAX_LENGTH];
  memcpy(copy, text, length);
  copy[length] = '\0';
  char *save = NULL;
  char *word = strtok_r(copy + magic_length, " ", &save);
  uint64_t version = 0;
  const char *end = "";
  bool numeric = word && parse_digits(word, 10, UINT32_MAX, &version, &end) && *end == '\0';
  if (numeric && version == 1)
    return WK_FAIL(WK_ERR_FORMAT, "cursor version 1 belongs to the shard-window order of Wick 0.1; this Wick reads "
                   "each block once per epoch in a new order (cursor version %d), so that position does not exist "
                   "here: restart the data stream, or resume with Wick 0.1", WK_CURSOR_VERSION);
  if (!numeric || version != WK_CURSOR_VERSION)
    return WK_FAIL(WK_ERR_FORMAT, "cursor version '%s' is not %d (written by another Wick version)",
                   word ? word : "", WK_CURSOR_VERSION);
  memcpy(copy, text, length); /* strtok_r cut the copy: check the sum on the text as written */
  copy[length] = '\0';
  WK_TRY(check_sum(copy, length));
  copy[strrchr(copy, ' ') - copy] = '\0'; /* drop the sum word */
  strtok_r(copy + magic_length, " ", &save);
  uint32_t seen = 0;
  while ((word = strtok_r(NULL, " ", &save)) != NULL) {
    char *equals = strchr(word, '=');
    if (!equals) return WK_FAIL(WK_ERR_FORMAT, "cursor word '%s' is not key=value", word);
    *equals = '\0';
    WK_TRY(parse_field(word, equals + 1, out, &seen));
  }
  for (int f = 0; f <= MODE_FIELD; f++)
    if (!(seen & (1u << f)))
      return WK_FAIL(WK_ERR_FORMAT, "cursor lacks its '%s' field", f == MODE_FIELD ? "mode" : NUMBER_FIELDS[f].key);
  if (out->sources == 0) return WK_FAIL(WK_ERR_FORMAT, "cursor has no src= position of any source");
  return WK_OK;
}
