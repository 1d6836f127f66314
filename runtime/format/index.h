/*
 * index.h — the dataset index (index.json): its model, parsing with validation (safe shard names,
 * consistent counts) and deterministic serialization (index.c).
 *
 * Internal header: runtime/ code above format/ and tests include it; Lua never sees it.
 */
#ifndef WK_FORMAT_INDEX_H
#define WK_FORMAT_INDEX_H

#include "../core/core.h"
#include "../tokenizer/tokenizer.h"  /* WkTemplate */

#ifdef __cplusplus
extern "C" {
#endif

/* ---- dataset index (index.json) ------------------------------------------------------------------ */

enum { WK_INDEX_VERSION = 2 }; /* the newest this reader knows; a dataset of tokens only is written as 1 */

typedef struct {
  char *name;
  uint64_t tokens, documents, bytes;
  uint64_t checksum;  /* header_hash of the shard */
} WkIndexShard;

typedef struct {
  uint32_t version;
  char *tokenizer;
  uint64_t tokenizer_fingerprint;  /* identity of the ids' meaning (WkTokenizer.fingerprint); 0: unknown
                                      (an index written before it was recorded, by a tokenizer file) */
  uint32_t vocab_size;
  uint32_t eos;
  /* The tokenizer's template around each document's text (index.json "template"), and whether the
   * converter applied it. WK_INDEX_TEMPLATE_NONE (0): none recorded, so none applied (a tokenizer
   * without one, token files, or an index from before templates were applied). */
  enum { WK_INDEX_TEMPLATE_NONE = 0, WK_INDEX_TEMPLATE_SKIPPED = 1, WK_INDEX_TEMPLATE_APPLIED = 2 } template_state;
  WkTemplate template;
  uint32_t token_bytes;
  uint64_t tokens, documents;
  uint32_t shard_count;
  WkIndexShard *shards;
  /* The columns (index.json "columns", version 2): column 0 is always the tokens (element_bytes the
   * stored width); a version 1 index reads as that one column. The writer writes version 2 exactly
   * when column_count > 1 (0 or 1: version 1, no "columns"). */
  uint32_t column_count;
  WkColumnInfo *columns;
} WkIndex;

/* Parses and validates index text (names safe, counts consistent); name is the file for messages. */
WkStatus wk_index_parse(const char *text, size_t length, const char *name, WkIndex *out);
void wk_index_free(WkIndex *index);
/* Column 0 of a dataset of token_bytes-wide tokens: "tokens", its kind, dtype (u16 or i32) and width. */
void wk_index_tokens_column(uint32_t token_bytes, WkColumnInfo *out);
/* Serializes deterministically (fixed key order, no timestamps); *out is malloc'd. extra is a
 * JSON object body (may be NULL) describing how it was made. */
WkStatus wk_index_format(const WkIndex *index, const char *extra, char **out, size_t *length);
/* A shard name is a plain relative path: no leading '/', no '..' or '.' components, no '\\' or
 * control characters, not empty. */
bool wk_index_name_is_safe(const char *name);

#ifdef __cplusplus
}
#endif
#endif /* WK_FORMAT_INDEX_H */
