/*
 * settings.c — a converter and its settings, before a run: the parameter table (bounds, defaults), the
 * tokenizer, the field names, the include patterns and the list of inputs; after a run, its stats and
 * the bad lines it kept.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>  /* sysconf */

#include <zstd.h>    /* ZSTD_minCLevel, ZSTD_maxCLevel */

#include "converter.h"

/* THREADS' default (0) is replaced by the online CPUs when the converter is made; LEVEL's bounds are
 * zstd's, asked of the library at run time (wk_converter_param_bounds). */
static const WkParamSpec PARAM_SPECS[WK_CONVERT_PARAM_COUNT] = {
    [WK_CONVERT_THREADS] = {1, MAX_THREADS, 0, "threads"},
    [WK_CONVERT_SHARD_TOKENS] = {1, INT64_C(1) << 40, INT64_C(1) << 26, "shard_tokens"},
    [WK_CONVERT_BLOCK_TOKENS] = {1, WK_SHARD_MAX_BLOCK_TOKENS, WK_SHARD_DEFAULT_BLOCK_TOKENS, "block_tokens"},
    [WK_CONVERT_COMPRESSION] = {0, 1, WK_CODEC_ZSTD, "compression"},
    [WK_CONVERT_LEVEL] = {0, 0, 3, "level"},
    [WK_CONVERT_STRICT] = {0, 1, 0, "strict"},
    [WK_CONVERT_PROGRESS] = {0, 1, 0, "progress"},
    [WK_CONVERT_RESUME] = {0, 1, 0, "resume"},
    [WK_CONVERT_TEXT_SPLIT] = {WK_TEXT_SPLIT_FILE, WK_TEXT_SPLIT_LINE, WK_TEXT_SPLIT_FILE, "text_split"},
    [WK_CONVERT_HEADERLESS_BIN] = {0, 1, 0, "headerless_bin"},
    [WK_CONVERT_VOCAB_SIZE] = {0, MAX_DECLARED_VOCAB, 0, "vocab_size"},
    [WK_CONVERT_EOS] = {-1, MAX_DECLARED_VOCAB - 1, -1, "eos"},
    [WK_CONVERT_NO_TEXT] = {0, 1, 0, "no_text"},
};
static const WkParamTable PARAMS = {"converter", PARAM_SPECS, WK_CONVERT_PARAM_COUNT};

WkConverter *wk_converter_new(const char *out_dir, const char *tokenizer) {
  if (!out_dir || !out_dir[0]) {
    WK_FAIL(WK_ERR_INVALID_ARG, "converter: an output directory is required");
    return NULL;
  }
  WkConverter *cv = wk_calloc(1, sizeof *cv, "converter");
  if (!cv) return NULL;
  /* A built-in describes, a file is opened here: its errors are the caller's at once, not the run's. */
  cv->tokenizer = tokenizer ? wk_tokenizer_find(tokenizer) : NULL;
  if (tokenizer && !cv->tokenizer) {
    cv->owned = wk_tokenizer_open(tokenizer, NULL);
    if (!cv->owned) {
      wk_error_context("converter: tokenizer");
      free(cv);
      return NULL;
    }
    cv->tokenizer = cv->owned;
  }
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  wk_param_defaults(&PARAMS, cv->params);
  cv->params[WK_CONVERT_THREADS] = cpus < 1 ? 1 : cpus > MAX_THREADS ? MAX_THREADS : cpus;
  cv->out_dir = strdup(out_dir);
  cv->field = strdup("text");
  cv->json_field = strdup("text");
  if (!cv->out_dir || !cv->field || !cv->json_field) {
    wk_converter_free(cv);
    WK_FAIL(WK_ERR_NOMEM, "out of memory creating the converter");
    return NULL;
  }
  return cv;
}

static void free_include(WkConverter *cv) {
  for (size_t i = 0; cv->include && cv->include[i]; i++) free(cv->include[i]);
  free(cv->include);
  cv->include = NULL;
}

void wk_converter_free(WkConverter *cv) {
  if (!cv) return;
  free_include(cv);
  for (size_t i = 0; i < cv->input_count; i++) free(cv->inputs[i].path);
  free(cv->inputs);
  convert_remote_close(cv->remote);
  for (size_t i = 0; i < cv->bad_kept; i++) free(cv->bad_lines[i]);
  free(cv->bad_lines);
  free(cv->out_dir);
  wk_tokenizer_free(cv->owned);
  free(cv->field);
  free(cv->json_field);
  free(cv);
}

WkStatus wk_converter_param_bounds(WkConvertParam param, int64_t *min, int64_t *max) {
  WK_TRY(wk_param_bounds(&PARAMS, (int)param, min, max));
  if (param == WK_CONVERT_LEVEL) *min = ZSTD_minCLevel(), *max = ZSTD_maxCLevel();
  return WK_OK;
}

WkStatus wk_converter_param_default(WkConvertParam param, int64_t *value) {
  return wk_param_default(&PARAMS, (int)param, value);
}

WkStatus wk_converter_set(WkConverter *cv, WkConvertParam param, int64_t value) {
  if (!cv) return WK_FAIL(WK_ERR_INVALID_ARG, "wk_converter_set: converter is NULL");
  int64_t min, max;
  WK_TRY(wk_converter_param_bounds(param, &min, &max));
  WK_TRY(wk_param_check(&PARAMS, (int)param, value, min, max));
  cv->params[param] = value;
  return WK_OK;
}

WkStatus wk_converter_use_tokenizer(WkConverter *cv, const WkTokenizer *tokenizer) {
  if (!cv) return WK_FAIL(WK_ERR_INVALID_ARG, "wk_converter_use_tokenizer: converter is NULL");
  wk_tokenizer_free(cv->owned);
  cv->owned = NULL;
  cv->tokenizer = tokenizer;
  return WK_OK;
}

static WkStatus set_name(char **slot, const char *value, const char *what) {
  if (!value || !value[0]) return WK_FAIL(WK_ERR_INVALID_ARG, "converter: the %s is empty", what);
  char *copy = strdup(value);
  if (!copy) return WK_FAIL(WK_ERR_NOMEM, "out of memory");
  free(*slot);
  *slot = copy;
  return WK_OK;
}

WkStatus wk_converter_set_field(WkConverter *cv, const char *field) {
  if (!cv) return WK_FAIL(WK_ERR_INVALID_ARG, "wk_converter_set_field: converter is NULL");
  return set_name(&cv->field, field, "field name");
}

WkStatus wk_converter_set_json_field(WkConverter *cv, const char *field) {
  if (!cv) return WK_FAIL(WK_ERR_INVALID_ARG, "wk_converter_set_json_field: converter is NULL");
  return set_name(&cv->json_field, field, "JSON field name");
}

WkStatus wk_converter_add_column(WkConverter *cv, const char *spec) {
  if (!cv) return WK_FAIL(WK_ERR_INVALID_ARG, "wk_converter_add_column: converter is NULL");
  ColumnSpec col;
  WK_TRY(column_spec_parse(spec, &col));
  if (col.kind == COLUMN_TOKENS) {
    if (cv->has_tokens) return WK_FAIL(WK_ERR_INVALID_ARG, "column '%s': the column 'tokens' is given twice", spec);
    cv->tokens = col;
    cv->has_tokens = true;
    return WK_OK;
  }
  for (uint32_t k = 0; k < cv->column_count; k++)
    if (strcmp(cv->columns[k].name, col.name) == 0)
      return WK_FAIL(WK_ERR_INVALID_ARG, "column '%s': a column named '%s' is given twice", spec, col.name);
  if (cv->column_count == COLUMN_MAX)
    return WK_FAIL(WK_ERR_INVALID_ARG, "column '%s': a dataset holds at most %d columns besides 'tokens'", spec,
                   COLUMN_MAX);
  cv->columns[cv->column_count++] = col;
  return WK_OK;
}

WkStatus wk_converter_set_include(WkConverter *cv, const char *patterns) {
  if (!cv) return WK_FAIL(WK_ERR_INVALID_ARG, "wk_converter_set_include: converter is NULL");
  free_include(cv);
  if (!patterns || !patterns[0]) return WK_OK;
  size_t n = 1;
  for (const char *p = patterns; *p; p++) n += *p == ',';
  cv->include = calloc(n + 1, sizeof *cv->include);
  if (!cv->include) return WK_FAIL(WK_ERR_NOMEM, "out of memory");
  size_t k = 0;
  for (const char *p = patterns;;) {
    const char *comma = strchr(p, ',');
    size_t length = comma ? (size_t)(comma - p) : strlen(p);
    if (length > 0) {
      cv->include[k] = strndup(p, length);
      if (!cv->include[k++]) {
        free_include(cv);
        return WK_FAIL(WK_ERR_NOMEM, "out of memory");
      }
    }
    if (!comma) break;
    p = comma + 1;
  }
  return WK_OK;
}

WkStatus wk_converter_add_input(WkConverter *cv, const char *path) {
  if (!cv || !path) return WK_FAIL(WK_ERR_INVALID_ARG, "wk_converter_add_input: NULL argument");
  size_t before = cv->input_count;
  if (wk_blob_is_remote(path))
    WK_TRY(convert_add_remote_input(&cv->remote, path, (const char *const *)cv->include, &cv->inputs, &cv->input_count,
                                    &cv->input_capacity));
  else
    WK_TRY(convert_list_inputs(path, (const char *const *)cv->include, cv->out_dir, &cv->inputs, &cv->input_count,
                               &cv->input_capacity));
  for (size_t i = before; i < cv->input_count; i++) cv->total_input_bytes += cv->inputs[i].size;
  return WK_OK;
}

void wk_converter_stats(const WkConverter *cv, WkConvertStats *out) {
  memset(out, 0, sizeof *out);
  if (cv) *out = cv->stats;
}

const char *wk_converter_bad_line(const WkConverter *cv, uint64_t i) {
  return cv && i < cv->bad_kept ? cv->bad_lines[i] : NULL;
}
