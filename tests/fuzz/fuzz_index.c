/*
 * fuzz_index.c — libFuzzer target for everything that parses text from outside: index.json
 * (wk_index_parse: JSON tree, validation, name safety, version 2's columns) and .jsonl lines (wk_json_line_field).
 *
 *   make fuzz && build/fuzz/fuzz_index -max_total_time=60 /tmp/new-inputs tests/fuzz/corpus/index
 */
#include <stdlib.h>
#include <string.h>

#include "core/json.h"   /* wk_json_line_field: the .jsonl reader */
#include "format/index.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  WkIndex index;
  if (wk_index_parse((const char *)data, size, "fuzz/index.json", &index) == WK_OK) {
    /* Whatever parses must serialize and parse back to the same thing. */
    char *text = NULL;
    size_t length = 0;
    if (wk_index_format(&index, NULL, &text, &length) == WK_OK) {
      WkIndex again;
      if (wk_index_parse(text, length, "fuzz/again.json", &again) != WK_OK) abort();
      if (again.shard_count != index.shard_count || again.tokens != index.tokens) abort();
      if (again.column_count != index.column_count ||
          memcmp(again.columns, index.columns, index.column_count * sizeof *index.columns) != 0)
        abort(); /* the columns (format version 2) too */
      for (uint32_t i = 0; i < index.shard_count; i++)
        if (strcmp(again.shards[i].name, index.shards[i].name) != 0 ||
            again.shards[i].checksum != index.shards[i].checksum)
          abort();
      wk_index_free(&again);
      free(text);
    }
    for (uint32_t i = 0; i < index.shard_count; i++)
      if (!wk_index_name_is_safe(index.shards[i].name)) abort();
    wk_index_free(&index);
  }
  WkScratch scratch = {0};
  const char *text;
  size_t length;
  char reason[128];
  if (wk_json_line_field((const char *)data, size, "text", &scratch, &text, &length, reason)) {
    if (wk_utf8_valid_prefix((const uint8_t *)text, length) != length) abort(); /* decoded text is valid UTF-8 */
  }
  free(scratch.data);
  return 0;
}
