/*
 * cursor.c — writes and reads the stream cursor:
 *   wick-cursor/2 step=120 micro=0 world=2 global=32 seq=256 seed=7 mode=packed shuffle=1
 *   window=536870912 buffer=4194304 partitions=1 chunk=1 skipped=0 src=9f3c...:3840:0x0p+0 src=...
 * One line of key=value words, a few hundred bytes. Credits are hex floats (%a) so they round-trip
 * exactly. Unknown keys are an error: a cursor from a newer Wick is refused, not half-read.
 */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stream.h"

static const char CURSOR_MAGIC[] = "wick-cursor/";
static const char *const MODE_NAMES[] = {"packed", "pad"};

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
  if (!ok) return WK_FAIL(WK_ERR_INVALID_ARG, "cursor buffer of %zu bytes is too small", capacity);
  *length = used;
  return WK_OK;
}

static WkStatus parse_source(const char *value, WkCursor *out) {
  if (out->sources == WK_MIX_MAX_SOURCES)
    return WK_FAIL(WK_ERR_FORMAT, "cursor has more than %d sources", WK_MIX_MAX_SOURCES);
  char *end;
  uint32_t i = out->sources;
  out->fingerprint[i] = strtoull(value, &end, 16);
  if (*end != ':') return WK_FAIL(WK_ERR_FORMAT, "cursor source '%s': expected FINGERPRINT:DRAWS:CREDIT", value);
  out->position[i].draws = strtoull(end + 1, &end, 10);
  if (*end != ':') return WK_FAIL(WK_ERR_FORMAT, "cursor source '%s': expected FINGERPRINT:DRAWS:CREDIT", value);
  out->position[i].credit = strtod(end + 1, &end);
  if (*end != '\0') return WK_FAIL(WK_ERR_FORMAT, "cursor source '%s': trailing characters", value);
  out->sources++;
  return WK_OK;
}

static WkStatus parse_number(const char *key, const char *value, uint64_t max, uint64_t *out) {
  char *end;
  unsigned long long n = strtoull(value, &end, 10);
  if (*value == '\0' || *end != '\0' || n > max)
    return WK_FAIL(WK_ERR_FORMAT, "cursor field %s='%s' is not a number up to %llu", key, value,
                   (unsigned long long)max);
  *out = n;
  return WK_OK;
}

/* The numeric fields: name in the text, where it lives in WkCursor, and its width. */
typedef struct {
  const char *key;
  size_t offset;
  size_t size;
} NumberField;
#define NUMBER_FIELD(key, member) {key, offsetof(WkCursor, member), sizeof(((WkCursor *)0)->member)}
static const NumberField number_fields[] = {
    NUMBER_FIELD("step", step),         NUMBER_FIELD("micro", micro),   NUMBER_FIELD("world", world),
    NUMBER_FIELD("global", global_batch), NUMBER_FIELD("seq", seq_len), NUMBER_FIELD("seed", seed),
    NUMBER_FIELD("shuffle", shuffle),   NUMBER_FIELD("window", window_tokens),
    NUMBER_FIELD("buffer", buffer_tokens), NUMBER_FIELD("partitions", partitions),
    NUMBER_FIELD("chunk", chunk),       NUMBER_FIELD("skipped", skipped),
};

static WkStatus parse_field(const char *key, const char *value, WkCursor *out) {
  if (strcmp(key, "src") == 0) return parse_source(value, out);
  if (strcmp(key, "mode") == 0) {
    for (int m = 0; m < 2; m++)
      if (strcmp(value, MODE_NAMES[m]) == 0) {
        out->mode = (WkPackMode)m;
        return WK_OK;
      }
    return WK_FAIL(WK_ERR_FORMAT, "cursor mode '%s' is not packed or pad", value);
  }
  for (size_t f = 0; f < sizeof number_fields / sizeof number_fields[0]; f++) {
    const NumberField *field = &number_fields[f];
    if (strcmp(key, field->key) != 0) continue;
    uint64_t n = 0;
    WK_TRY(parse_number(key, value, field->size == sizeof(uint32_t) ? UINT32_MAX : UINT64_MAX, &n));
    if (field->size == sizeof(uint32_t)) {
      uint32_t narrow = (uint32_t)n;
      memcpy((char *)out + field->offset, &narrow, sizeof narrow);
    } else {
      memcpy((char *)out + field->offset, &n, sizeof n);
    }
    return WK_OK;
  }
  return WK_FAIL(WK_ERR_FORMAT, "cursor has an unknown field '%s' (written by a newer Wick?)", key);
}

enum { CURSOR_MAX_LENGTH = 8192 };

WkStatus wk_cursor_parse(const char *text, WkCursor *out) {
  memset(out, 0, sizeof *out);
  size_t magic_length = strlen(CURSOR_MAGIC);
  if (!text || strncmp(text, CURSOR_MAGIC, magic_length) != 0)
    return WK_FAIL(WK_ERR_FORMAT, "not a Wick cursor (it should start with '%s')", CURSOR_MAGIC);
  if (strlen(text) >= CURSOR_MAX_LENGTH) return WK_FAIL(WK_ERR_FORMAT, "cursor is longer than %d bytes", CURSOR_MAX_LENGTH);
  char copy[CURSOR_MAX_LENGTH];
  strcpy(copy, text + magic_length);
  char *save = NULL;
  char *word = strtok_r(copy, " \t\r\n", &save);
  char *end;
  long version = word ? strtol(word, &end, 10) : -1;
  if (word && *end == '\0' && version == 1)
    return WK_FAIL(WK_ERR_FORMAT, "cursor version 1 belongs to the shard-window order of Wick 0.1; this Wick reads "
                   "each block once per epoch in a new order (cursor version %d), so that position does not exist "
                   "here: restart the data stream, or resume with Wick 0.1", WK_CURSOR_VERSION);
  if (!word || *end != '\0' || version != WK_CURSOR_VERSION)
    return WK_FAIL(WK_ERR_FORMAT, "cursor version '%s' is not %d (written by another Wick version)",
                   word ? word : "", WK_CURSOR_VERSION);
  while ((word = strtok_r(NULL, " \t\r\n", &save)) != NULL) {
    char *equals = strchr(word, '=');
    if (!equals) return WK_FAIL(WK_ERR_FORMAT, "cursor word '%s' is not key=value", word);
    *equals = '\0';
    WK_TRY(parse_field(word, equals + 1, out));
  }
  if (out->global_batch == 0 || out->seq_len == 0 || out->world == 0)
    return WK_FAIL(WK_ERR_FORMAT, "cursor lacks global, seq or world");
  return WK_OK;
}
