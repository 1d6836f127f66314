/*
 * fuzz_cursor.c — libFuzzer target for the stream cursor (wk_cursor_parse): text from a file, a
 * checkpoint or a command line. Each input is parsed as it is and, since a mutated checksum almost
 * never matches, again with a correct `sum=` appended, so the field parser itself is fuzzed too.
 * Whatever parses must format and parse back to the same cursor.
 *
 *   make fuzz && build/fuzz/fuzz_cursor -max_total_time=60 /tmp/new-inputs tests/fuzz/corpus/cursor
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "loader/stream.h"

enum { MAX_TEXT = 8192 };

static void round_trip(const char *text) {
  WkCursor cursor, again;
  if (wk_cursor_parse(text, &cursor) != WK_OK) return;
  char formatted[MAX_TEXT];
  size_t length = 0;
  if (wk_cursor_format(&cursor, formatted, sizeof formatted, &length) != WK_OK) abort();
  if (wk_cursor_parse(formatted, &again) != WK_OK) abort();
  if (again.step != cursor.step || again.seed != cursor.seed || again.sources != cursor.sources ||
      again.window_tokens != cursor.window_tokens || again.mode != cursor.mode)
    abort();
  for (uint32_t i = 0; i < cursor.sources; i++)
    if (again.fingerprint[i] != cursor.fingerprint[i] || again.position[i].draws != cursor.position[i].draws ||
        again.position[i].credit != cursor.position[i].credit)
      abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char text[MAX_TEXT + 32];
  if (size > MAX_TEXT) return 0;
  memcpy(text, data, size);
  text[size] = '\0';
  round_trip(text);
  size_t length = strlen(text); /* up to the first NUL, as a C string is read */
  snprintf(text + length, sizeof text - length, " sum=%016" PRIx64, (uint64_t)XXH3_64bits(text, length));
  round_trip(text);
  return 0;
}
