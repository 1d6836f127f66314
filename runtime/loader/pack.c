/*
 * pack.c — completes one row of a micro-batch around a sample's tokens: loss mask, padding, document
 * ids and positions. The tokens themselves are read into the row first (node_reader.c), as int32 or
 * int64, so a row is written once, in the dtype the model consumes.
 *
 * Packed mode: the sample is seq_len+1 consecutive tokens of a shard's stream (documents joined by
 * EOS); every target counts, and doc ids / positions restart after each EOS so attention and
 * position embeddings can respect document boundaries.
 * Pad mode: the sample is one document, followed by EOS, truncated to seq_len+1 tokens or padded
 * with EOS; targets past the document's EOS are masked out.
 * Either way a "loss_mask" column of the record (read into the row like its tokens) masks targets more.
 */
#include <string.h>

#include "stream.h"

static int64_t token_at(const WkRows *rows, size_t index) {
  if (rows->token_bytes == sizeof(int64_t)) return ((const int64_t *)rows->tokens)[index];
  return ((const int32_t *)rows->tokens)[index];
}

static void set_token(WkRows *rows, size_t index, int64_t value) {
  if (rows->token_bytes == sizeof(int64_t)) ((int64_t *)rows->tokens)[index] = value;
  else ((int32_t *)rows->tokens)[index] = (int32_t)value;
}

void *wk_rows_tokens(const WkRows *rows, uint32_t seq_len, uint32_t row) {
  return (uint8_t *)rows->tokens + (size_t)row * (seq_len + 1u) * rows->token_bytes;
}

static void fill_packed_metadata(const WkRows *rows, size_t first, int64_t eos, uint32_t count) {
  int32_t doc = 0, position = 0;
  for (uint32_t t = 0; t < count; t++) {
    rows->doc_ids[first + t] = doc;
    rows->positions[first + t] = position++;
    if (token_at(rows, first + t) == eos) {
      doc++;
      position = 0;
    }
  }
}

/* Target t is token t + 1: it counts only where the record's own mask (a TOKEN_U8 column, aligned with
 * the tokens) is not 0 there. Branch-free (& of 0/1, not &&), so the loop is vectorized: it runs over
 * every token of a masked batch. */
static void fold_mask_column(const WkRows *rows, uint32_t seq_len, uint32_t row, uint8_t *mask) {
  const uint8_t *column = rows->mask_column + row * ((size_t)seq_len + 1);
  for (size_t t = 0; t < seq_len; t++) mask[t] = (uint8_t)(mask[t] & (column[t + 1] != 0));
}

void wk_pack_row(WkPackMode mode, uint32_t seq_len, uint32_t eos, const WkSampleLoc *loc, WkRows *rows,
                 uint32_t row) {
  size_t width = (size_t)seq_len + 1, first = row * width;
  uint8_t *mask = rows->loss_mask + row * (size_t)seq_len;
  uint64_t length = loc->length < width ? loc->length : width;
  if (mode == WK_PACK_PACKED) {
    memset(mask, 1, seq_len);
    if (rows->mask_column) fold_mask_column(rows, seq_len, row, mask);
    if (rows->doc_ids) fill_packed_metadata(rows, first, eos, (uint32_t)width);
    return;
  }
  /* Pad mode: document, EOS, then EOS padding; targets 1..length (the EOS included) count. */
  for (size_t t = length; t < width; t++) set_token(rows, first + t, eos);
  for (size_t t = 0; t < seq_len; t++) mask[t] = t + 1 <= length;
  if (rows->mask_column) fold_mask_column(rows, seq_len, row, mask);
  if (rows->doc_ids) {
    for (size_t t = 0; t < width; t++) {
      rows->doc_ids[first + t] = 0;
      rows->positions[first + t] = (int32_t)t;
    }
  }
}

void wk_pack_empty_row(uint32_t seq_len, uint32_t pad_token, WkRows *rows, uint32_t row) {
  size_t width = (size_t)seq_len + 1, first = row * width;
  for (size_t t = 0; t < width; t++) set_token(rows, first + t, pad_token);
  memset(rows->loss_mask + row * (size_t)seq_len, 0, seq_len);
  for (uint32_t c = 0; c < rows->column_count; c++) {
    const WkRowColumn *column = &rows->columns[c];
    memset(column->data + row * column->row_bytes, 0, column->row_bytes);
    if (column->sizes) column->sizes[row] = 0;
  }
  if (!rows->doc_ids) return;
  for (size_t t = 0; t < width; t++) {
    rows->doc_ids[first + t] = 0;
    rows->positions[first + t] = (int32_t)t;
  }
}
