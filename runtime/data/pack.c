/*
 * pack.c — turns a located sample into one row of tokens, loss mask, document ids and positions.
 *
 * Packed mode: the sample is seq_len+1 consecutive tokens of a shard's stream (documents joined by
 * EOS); every target counts, and doc ids / positions restart after each EOS so attention and
 * position embeddings can respect document boundaries.
 * Pad mode: the sample is one document, followed by EOS, truncated to seq_len+1 tokens or padded
 * with EOS; targets past the document's EOS are masked out.
 */
#include <string.h>

#include "stream.h"

static void fill_packed_metadata(const int32_t *tokens, int32_t eos, uint32_t count, int32_t *doc_ids,
                                 int32_t *positions) {
  int32_t doc = 0, position = 0;
  for (uint32_t t = 0; t < count; t++) {
    doc_ids[t] = doc;
    positions[t] = position++;
    if (tokens[t] == eos) {
      doc++;
      position = 0;
    }
  }
}

WkStatus wk_pack_row(WkDataset *ds, WkPackMode mode, uint32_t seq_len, const WkSampleLoc *loc, WkRows *rows,
                     uint32_t row) {
  size_t width = (size_t)seq_len + 1;
  int32_t *tokens = rows->tokens + row * width;
  uint8_t *mask = rows->loss_mask + row * (size_t)seq_len;
  uint32_t eos = wk_dataset_eos(ds);
  uint64_t length = loc->length < width ? loc->length : width;
  /* Token ids are below 2^31 (the vocabulary is), so the uint32 read can land in the int32 row. */
  WK_TRY(wk_dataset_read(ds, loc->shard, loc->offset, length, (uint32_t *)tokens));
  if (mode == WK_PACK_PACKED) {
    memset(mask, 1, seq_len);
    if (rows->doc_ids)
      fill_packed_metadata(tokens, (int32_t)eos, (uint32_t)width, rows->doc_ids + row * width,
                           rows->positions + row * width);
    return WK_OK;
  }
  /* Pad mode: document, EOS, then EOS padding; targets 1..length (the EOS included) count. */
  for (size_t t = length; t < width; t++) tokens[t] = (int32_t)eos;
  for (size_t t = 0; t < seq_len; t++) mask[t] = t + 1 <= length;
  if (rows->doc_ids) {
    for (size_t t = 0; t < width; t++) {
      rows->doc_ids[row * width + t] = 0;
      rows->positions[row * width + t] = (int32_t)t;
    }
  }
  return WK_OK;
}

void wk_pack_empty_row(uint32_t seq_len, uint32_t pad_token, WkRows *rows, uint32_t row) {
  size_t width = (size_t)seq_len + 1;
  for (size_t t = 0; t < width; t++) rows->tokens[row * width + t] = (int32_t)pad_token;
  memset(rows->loss_mask + row * (size_t)seq_len, 0, seq_len);
  if (!rows->doc_ids) return;
  for (size_t t = 0; t < width; t++) {
    rows->doc_ids[row * width + t] = 0;
    rows->positions[row * width + t] = (int32_t)t;
  }
}
