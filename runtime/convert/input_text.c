/*
 * input_text.c — any other file is text: the whole file is one document (source trees, books), or with
 * --split each paragraph or each line is. The worker reads the file itself (one chunk per file); a
 * document that is not UTF-8 is skipped and reported at its line. Its only field is the text itself
 * (named by --field for --column).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert.h"

/* One text document, checked for UTF-8 (a bad one is skipped and reported at its line). */
static WkStatus text_document(const ChunkContext *ctx, Chunk *c, const uint8_t *text, size_t length,
                              uint64_t first_line) {
  size_t valid = wk_utf8_valid_prefix(text, length);
  if (valid < length) {
    uint64_t line = first_line;
    for (size_t k = 0; k < valid; k++) line += text[k] == '\n';
    char reason[128];
    snprintf(reason, sizeof reason, "invalid UTF-8 at byte %zu of the document (document skipped)", valid);
    return convert_chunk_bad_line(c, line, reason);
  }
  if (!ctx->records) return convert_chunk_add_text(ctx, c, text, length);
  /* A text file's one field is its text, named by --field: a column can read only that. */
  Value value = {.type = VALUE_STRING, .bytes = text, .length = length}, missing = {.type = VALUE_MISSING};
  Value columns[COLUMN_MAX];
  for (uint32_t k = 0; k < ctx->column_count; k++)
    columns[k] = strcmp(ctx->columns[k].field, ctx->field) == 0 ? value : missing;
  bool named = !ctx->tokens || strcmp(ctx->tokens->field, ctx->field) == 0;
  return convert_chunk_add_record(ctx, c, named ? &value : &missing, columns, first_line);
}

static bool is_blank(const uint8_t *p, const uint8_t *end) {
  for (; p < end; p++)
    if (*p != ' ' && *p != '\t') return false;
  return true;
}

/* Splits a text file into documents: the whole file, or paragraphs (runs of non-blank lines, blank
 * lines between them dropped), or non-blank lines (newlines and a CR before them dropped). */
static WkStatus split_text(const ChunkContext *ctx, Chunk *c, const uint8_t *text, size_t length) {
  if (ctx->split == WK_TEXT_SPLIT_FILE) return text_document(ctx, c, text, length, 1);
  const uint8_t *p = text, *end = text + length, *doc = NULL, *doc_end = NULL;
  uint64_t line = 1, doc_line = 1;
  WkStatus status = WK_OK;
  while (p < end && status == WK_OK) {
    const uint8_t *nl = memchr(p, '\n', (size_t)(end - p));
    const uint8_t *line_end = nl ? nl : end;
    if (line_end > p && line_end[-1] == '\r') line_end--;
    bool blank = is_blank(p, line_end);
    if (ctx->split == WK_TEXT_SPLIT_LINE) {
      if (!blank) status = text_document(ctx, c, p, (size_t)(line_end - p), line);
    } else if (blank) {
      if (doc) status = text_document(ctx, c, doc, (size_t)(doc_end - doc), doc_line);
      doc = NULL;
    } else {
      if (!doc) doc = p, doc_line = line;
      doc_end = line_end;
    }
    line++;
    p = nl ? nl + 1 : end;
  }
  if (status == WK_OK && doc) status = text_document(ctx, c, doc, (size_t)(doc_end - doc), doc_line);
  return status;
}

WkStatus convert_process_text(const ChunkContext *ctx, const Input *in, Chunk *c) {
  WkBlob *src = convert_open_input(in);
  if (!src) return wk_last_status();
  WkStatus status = WK_OK;
  uint8_t *copy = NULL;
  const uint8_t *text = src->size ? src->map(src, 0, (size_t)src->size) : (const uint8_t *)"";
  if (!text) {
    copy = malloc((size_t)src->size);
    if (!copy) status = WK_FAIL(WK_ERR_NOMEM, "out of memory reading '%s'", in->path);
    else status = src->read_at(src, 0, (size_t)src->size, copy);
    text = copy;
  }
  if (status == WK_OK) status = split_text(ctx, c, text, (size_t)src->size);
  free(copy);
  src->close(src);
  return status;
}
