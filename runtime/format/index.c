/*
 * index.c — the dataset index, index.json: parsing with validation, and deterministic
 * serialization.
 *
 * The index is the one file a reader needs before any shard: it lists the shards with their sizes,
 * token and document counts and header checksums, and the tokenizer. Shard names come from
 * possibly untrusted storage, so they are checked to stay inside the dataset directory.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/json.h"
#include "../tokenizer/tokenizer.h" /* the built-ins' fingerprints, for indexes written before it was recorded */
#include "index.h"
#include "shard.h"  /* WK_SHARD_HEADER_BYTES: the smallest shard */

#define INDEX_FORMAT_NAME "wick-dataset"
#define BAD(...) (wk_fail_at(__FILE__, __LINE__, WK_ERR_FORMAT, __VA_ARGS__))

bool wk_index_name_is_safe(const char *name) {
  if (!name || !name[0] || name[0] == '/' || strlen(name) > 1024) return false;
  const char *component = name;
  for (const char *p = name;; p++) {
    unsigned char c = (unsigned char)*p;
    if (c == '/' || c == '\0') {
      size_t n = (size_t)(p - component);
      if (n == 0 || (n == 1 && component[0] == '.') || (n == 2 && component[0] == '.' && component[1] == '.'))
        return false;
      if (c == '\0') return true;
      component = p + 1;
    } else if (c < 0x20 || c == 0x7f || c == '\\') {
      return false;
    }
  }
}

void wk_index_free(WkIndex *index) {
  if (!index) return;
  for (uint32_t i = 0; i < index->shard_count; i++) free(index->shards[i].name);
  free(index->shards);
  free(index->tokenizer);
  free(index->columns);
  memset(index, 0, sizeof *index);
}

static bool get_u64(const WkJson *object, const char *key, uint64_t *out) {
  return wk_json_u64(wk_json_get(object, key), out);
}

enum { HEX64_DIGITS = 16 };

/* A string of prefix + 16 lowercase hex digits. */
static bool parse_hex64(const WkJson *v, const char *prefix, uint64_t *out) {
  size_t skip = strlen(prefix);
  if (!v || v->type != WK_JSON_STRING || v->length != skip + HEX64_DIGITS || strncmp(v->string, prefix, skip) != 0)
    return false;
  uint64_t x = 0;
  for (size_t i = skip; i < skip + HEX64_DIGITS; i++) {
    char c = v->string[i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return false;
    x = x << 4 | (uint64_t)d;
  }
  *out = x;
  return true;
}

/* "template": {"applied": bool, "prefix": [ids], "suffix": [ids]}, every id below the vocabulary. */
static WkStatus parse_template(const WkJson *node, const char *name, WkIndex *ix) {
  ix->template_state = WK_INDEX_TEMPLATE_NONE;
  if (!node) return WK_OK;
  const WkJson *applied = wk_json_get(node, "applied");
  if (node->type != WK_JSON_OBJECT || !applied || (applied->type != WK_JSON_TRUE && applied->type != WK_JSON_FALSE))
    return BAD("index '%s': \"template\" must be {\"applied\": true or false, \"prefix\": [ids], \"suffix\": [ids]}",
               name);
  const char *const parts[2] = {"prefix", "suffix"};
  uint32_t counts[2] = {0, 0};
  for (int k = 0; k < 2; k++) {
    const WkJson *list = wk_json_get(node, parts[k]);
    if (!list || list->type != WK_JSON_ARRAY) return BAD("index '%s': \"template\".%s must be a list of ids", name, parts[k]);
    for (const WkJson *v = list->child; v; v = v->next) {
      uint64_t id;
      if (counts[0] + counts[1] == WK_TEMPLATE_MAX)
        return BAD("index '%s': \"template\" has more than %d ids", name, WK_TEMPLATE_MAX);
      if (!wk_json_u64(v, &id) || id >= ix->vocab_size)
        return BAD("index '%s': \"template\".%s[%u] is not a token id below the vocabulary (%u)", name, parts[k],
                   counts[k], ix->vocab_size);
      ix->template.ids[counts[0] + counts[1]] = (uint32_t)id;
      counts[k]++;
    }
  }
  ix->template.prefix = counts[0];
  ix->template.suffix = counts[1];
  ix->template_state = applied->type == WK_JSON_TRUE ? WK_INDEX_TEMPLATE_APPLIED : WK_INDEX_TEMPLATE_SKIPPED;
  return WK_OK;
}

void wk_index_tokens_column(uint32_t token_bytes, WkColumnInfo *out) {
  *out = (WkColumnInfo){.name = "tokens", .kind = WK_COLUMN_TOKENS, .dtype = token_bytes == 2 ? WK_U16 : WK_I32,
                        .element_bytes = token_bytes};
}

/* One "columns" entry besides the tokens: {"name": ..., "kind": ...} and, for a tensor, "dtype" and "shape". */
static WkStatus parse_column(const WkJson *node, const char *name, uint32_t c, WkColumnInfo *info) {
  const WkJson *column_name = wk_json_get(node, "name"), *kind = wk_json_get(node, "kind");
  if (node->type != WK_JSON_OBJECT || !column_name || column_name->type != WK_JSON_STRING || !kind ||
      kind->type != WK_JSON_STRING)
    return BAD("index '%s' column %u: needs a \"name\" and a \"kind\" string", name, c);
  if (!wk_column_name_is_valid(column_name->string, column_name->length))
    return BAD("index '%s' column %u: name '%s' is not [A-Za-z_][A-Za-z0-9_]* of at most %d characters", name, c,
               column_name->string, WK_COLUMN_NAME_BYTES - 1);
  memcpy(info->name, column_name->string, column_name->length);
  if (!wk_column_kind_parse(kind->string, &info->kind) || info->kind == WK_COLUMN_TOKENS)
    return BAD("index '%s' column '%s': unknown kind '%s' (expected token_u8, i64, f32, tensor or bytes)", name,
               info->name, kind->string);
  static const uint32_t KIND_DTYPE[WK_COLUMN_KIND_COUNT] = {
      [WK_COLUMN_TOKEN_U8] = WK_U8, [WK_COLUMN_I64] = WK_I64, [WK_COLUMN_F32] = WK_F32, [WK_COLUMN_BYTES] = WK_U8};
  info->dtype = KIND_DTYPE[info->kind];
  if (info->kind == WK_COLUMN_TENSOR) {
    const WkJson *dtype = wk_json_get(node, "dtype"), *shape = wk_json_get(node, "shape");
    if (!dtype || dtype->type != WK_JSON_STRING || !wk_column_dtype_parse(dtype->string, &info->dtype) ||
        !shape || shape->type != WK_JSON_ARRAY)
      return BAD("index '%s' column '%s': a tensor needs \"dtype\" (f32, i32, i64 or u8) and \"shape\" (a list of "
                 "1 to 4 sizes)",
                 name, info->name);
    for (const WkJson *d = shape->child; d; d = d->next) {
      uint64_t size = 0;
      if (info->ndim == WK_COLUMN_MAX_DIMS || !wk_json_u64(d, &size) || size == 0 || size > UINT32_MAX)
        return BAD("index '%s' column '%s': \"shape\" must be 1 to 4 sizes of at least 1", name, info->name);
      info->shape[info->ndim++] = (uint32_t)size;
    }
  }
  char where[1100];
  snprintf(where, sizeof where, "index '%s'", name);
  return wk_column_info_check(info, where);
}

/* "columns" (version 2): the tokens first, then the others, names unique. Version 1: the tokens alone. */
static WkStatus parse_columns(const WkJson *node, const char *name, WkIndex *ix) {
  uint64_t count = 1;
  if (ix->version >= 2) {
    if (!node || node->type != WK_JSON_ARRAY || !node->child)
      return BAD("index '%s': version %u needs a \"columns\" list starting with {\"name\": \"tokens\", \"kind\": "
                 "\"tokens\"}",
                 name, ix->version);
    count = 0;
    for (const WkJson *c = node->child; c; c = c->next) count++;
    if (count > WK_MAX_COLUMNS)
      return BAD("index '%s': %llu columns, at most %d", name, (unsigned long long)count, WK_MAX_COLUMNS);
  }
  ix->columns = wk_calloc(count, sizeof *ix->columns, "index columns");
  if (!ix->columns) return WK_ERR_NOMEM;
  ix->column_count = (uint32_t)count;
  wk_index_tokens_column(ix->token_bytes, &ix->columns[0]);
  if (ix->version < 2) return WK_OK;
  const WkJson *first = node->child, *first_name = wk_json_get(first, "name"), *first_kind = wk_json_get(first, "kind");
  if (!first_name || first_name->type != WK_JSON_STRING || strcmp(first_name->string, "tokens") != 0 || !first_kind ||
      first_kind->type != WK_JSON_STRING || strcmp(first_kind->string, "tokens") != 0)
    return BAD("index '%s': the first column must be {\"name\": \"tokens\", \"kind\": \"tokens\"}", name);
  uint32_t c = 1;
  for (const WkJson *node_c = first->next; node_c; node_c = node_c->next, c++) {
    WK_TRY(parse_column(node_c, name, c, &ix->columns[c]));
    for (uint32_t o = 0; o < c; o++)
      if (strcmp(ix->columns[o].name, ix->columns[c].name) == 0)
        return BAD("index '%s': two columns are named '%s'", name, ix->columns[c].name);
  }
  return WK_OK;
}

static int compare_names(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static WkStatus parse_tree(const WkJson *root, const char *name, WkIndex *ix) {
  if (root->type != WK_JSON_OBJECT) return BAD("index '%s': not a JSON object", name);
  const WkJson *format = wk_json_get(root, "format");
  if (!format || format->type != WK_JSON_STRING || strcmp(format->string, INDEX_FORMAT_NAME) != 0)
    return BAD("index '%s': \"format\" is not \"" INDEX_FORMAT_NAME "\" (not a Wick dataset index)", name);
  uint64_t version = 0, vocab = 0, eos = 0, width = 0;
  if (!get_u64(root, "version", &version) || version == 0)
    return BAD("index '%s': missing or bad \"version\"", name);
  if (version > WK_INDEX_VERSION)
    return BAD("index '%s': format version %llu is newer than this reader's %d (upgrade Wick to read it)", name,
               (unsigned long long)version, WK_INDEX_VERSION);
  ix->version = (uint32_t)version;
  const WkJson *tokenizer = wk_json_get(root, "tokenizer");
  if (!tokenizer || tokenizer->type != WK_JSON_STRING || tokenizer->length == 0)
    return BAD("index '%s': missing \"tokenizer\"", name);
  ix->tokenizer = strdup(tokenizer->string);
  if (!ix->tokenizer) return WK_FAIL(WK_ERR_NOMEM, "out of memory reading index '%s'", name);
  /* Older indexes lack the fingerprint: a built-in's name still says which it is. */
  const WkJson *fingerprint = wk_json_get(root, "tokenizer_fingerprint");
  const WkTokenizer *builtin = wk_tokenizer_find(ix->tokenizer);
  if (fingerprint && !parse_hex64(fingerprint, "", &ix->tokenizer_fingerprint))
    return BAD("index '%s': \"tokenizer_fingerprint\" must be a string of 16 hex digits", name);
  if (!fingerprint && builtin) ix->tokenizer_fingerprint = builtin->fingerprint;
  if (!get_u64(root, "vocab_size", &vocab) || !get_u64(root, "eos", &eos) || !get_u64(root, "token_bytes", &width) ||
      !get_u64(root, "tokens", &ix->tokens) || !get_u64(root, "documents", &ix->documents))
    return BAD("index '%s': \"vocab_size\", \"eos\", \"token_bytes\", \"tokens\" and \"documents\" must be "
               "non-negative integers",
               name);
  if ((width != 2 && width != 4) || vocab == 0 || vocab > UINT32_MAX || eos >= vocab ||
      (width == 2 && vocab > 65536))
    return BAD("index '%s': vocabulary %llu with EOS %llu does not fit %llu-byte tokens", name,
               (unsigned long long)vocab, (unsigned long long)eos, (unsigned long long)width);
  ix->vocab_size = (uint32_t)vocab;
  ix->eos = (uint32_t)eos;
  ix->token_bytes = (uint32_t)width;
  WK_TRY(parse_template(wk_json_get(root, "template"), name, ix));
  WK_TRY(parse_columns(wk_json_get(root, "columns"), name, ix));

  const WkJson *shards = wk_json_get(root, "shards");
  if (!shards || shards->type != WK_JSON_ARRAY) return BAD("index '%s': missing \"shards\" array", name);
  uint64_t count = 0;
  for (const WkJson *s = shards->child; s; s = s->next) count++;
  if (count > UINT32_MAX) return BAD("index '%s': %llu shards are too many", name, (unsigned long long)count);
  ix->shards = wk_calloc(count, sizeof *ix->shards, "index shards");
  if (!ix->shards) return WK_ERR_NOMEM;
  uint64_t tokens = 0, documents = 0;
  uint32_t i = 0;
  for (const WkJson *s = shards->child; s; s = s->next, i++) {
    WkIndexShard *sh = &ix->shards[i];
    const WkJson *shard_name = wk_json_get(s, "name");
    if (!shard_name || shard_name->type != WK_JSON_STRING) return BAD("index '%s' shard %u: missing \"name\"", name, i);
    if (!wk_index_name_is_safe(shard_name->string) || strlen(shard_name->string) != shard_name->length)
      return BAD("index '%s' shard %u: unsafe name '%s' (names must be relative, without '..', '.' or empty "
                 "components)",
                 name, i, shard_name->string);
    sh->name = strdup(shard_name->string);
    ix->shard_count = i + 1; /* so wk_index_free releases what is parsed so far */
    if (!sh->name) return WK_FAIL(WK_ERR_NOMEM, "out of memory reading index '%s'", name);
    if (!get_u64(s, "tokens", &sh->tokens) || !get_u64(s, "documents", &sh->documents) ||
        !get_u64(s, "bytes", &sh->bytes) || !parse_hex64(wk_json_get(s, "checksum"), "xxh3:", &sh->checksum))
      return BAD("index '%s' shard '%s': needs integer \"tokens\", \"documents\", \"bytes\" and a "
                 "\"checksum\" like \"xxh3:0123456789abcdef\"",
                 name, sh->name);
    if (sh->documents > sh->tokens || (sh->tokens > 0 && sh->documents == 0) || sh->bytes < WK_SHARD_HEADER_BYTES)
      return BAD("index '%s' shard '%s': %llu tokens, %llu documents, %llu bytes are inconsistent", name, sh->name,
                 (unsigned long long)sh->tokens, (unsigned long long)sh->documents,
                 (unsigned long long)sh->bytes);
    if (tokens + sh->tokens < tokens || documents + sh->documents < documents)
      return BAD("index '%s': token or document counts overflow", name);
    tokens += sh->tokens;
    documents += sh->documents;
  }
  /* Duplicate names: sort a list of pointers and compare neighbours. */
  const char **names = wk_calloc(ix->shard_count, sizeof *names, "shard name list");
  if (!names) return WK_ERR_NOMEM;
  for (uint32_t a = 0; a < ix->shard_count; a++) names[a] = ix->shards[a].name;
  qsort(names, ix->shard_count, sizeof *names, compare_names);
  for (uint32_t a = 1; a < ix->shard_count; a++) {
    if (strcmp(names[a - 1], names[a]) == 0) {
      WkStatus status = BAD("index '%s': shard '%s' is listed twice", name, names[a]);
      free(names);
      return status;
    }
  }
  free(names);
  if (tokens != ix->tokens || documents != ix->documents)
    return BAD("index '%s': shards add up to %llu tokens and %llu documents, but the totals say %llu and %llu", name,
               (unsigned long long)tokens, (unsigned long long)documents, (unsigned long long)ix->tokens,
               (unsigned long long)ix->documents);
  return WK_OK;
}

WkStatus wk_index_parse(const char *text, size_t length, const char *name, WkIndex *out) {
  memset(out, 0, sizeof *out);
  WkJson *root = NULL;
  if (wk_json_parse(text, length, &root) != WK_OK) return wk_error_context("index '%s'", name);
  WkStatus status = parse_tree(root, name, out);
  wk_json_free(root);
  if (status != WK_OK) wk_index_free(out);
  return status;
}

/* ---- writing ------------------------------------------------------------------------------------ */

typedef struct {
  char *data;
  size_t length, capacity;
  bool failed;
} Buffer;

static void append(Buffer *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void append(Buffer *b, const char *fmt, ...) {
  if (b->failed) return;
  for (;;) {
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(b->data ? b->data + b->length : NULL, b->data ? b->capacity - b->length : 0, fmt, args);
    va_end(args);
    if (n < 0) { b->failed = true; return; }
    if (b->data && b->length + (size_t)n < b->capacity) {
      b->length += (size_t)n;
      return;
    }
    size_t cap = b->capacity ? b->capacity * 2 : 4096;
    while (cap < b->length + (size_t)n + 1) cap *= 2;
    char *d = realloc(b->data, cap);
    if (!d) { b->failed = true; return; }
    b->data = d;
    b->capacity = cap;
  }
}

/* Names are safe (checked) and plain; escape the JSON specials anyway. */
static void append_string(Buffer *b, const char *s) {
  append(b, "\"");
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') append(b, "\\%c", c);
    else if (c < 0x20) append(b, "\\u%04x", c);
    else append(b, "%c", c);
  }
  append(b, "\"");
}

/* "columns": [{"name": "tokens", "kind": "tokens"}, ..., {"name": "emb", "kind": "tensor", "dtype": "f32", "shape": [4, 8]}] */
static void append_columns(Buffer *b, const WkIndex *ix) {
  append(b, "  \"columns\": [");
  for (uint32_t c = 0; c < ix->column_count; c++) {
    const WkColumnInfo *info = &ix->columns[c];
    append(b, "%s{\"name\": ", c ? ", " : "");
    append_string(b, info->name);
    append(b, ", \"kind\": \"%s\"", wk_column_kind_name(info->kind));
    if (info->kind == WK_COLUMN_TENSOR) {
      const char *dtype = wk_column_dtype_name(info->dtype);
      append(b, ", \"dtype\": \"%s\", \"shape\": [", dtype ? dtype : "?");
      for (uint32_t d = 0; d < info->ndim; d++) append(b, "%s%u", d ? ", " : "", info->shape[d]);
      append(b, "]");
    }
    append(b, "}");
  }
  append(b, "],\n");
}

WkStatus wk_index_format(const WkIndex *ix, const char *extra, char **out, size_t *length) {
  Buffer b = {0};
  append(&b, "{\n  \"format\": \"" INDEX_FORMAT_NAME "\",\n  \"version\": %d,\n  \"tokenizer\": ",
         ix->column_count > 1 ? 2 : 1);
  append_string(&b, ix->tokenizer);
  if (ix->tokenizer_fingerprint) append(&b, ",\n  \"tokenizer_fingerprint\": \"%016" PRIx64 "\"", ix->tokenizer_fingerprint);
  append(&b, ",\n  \"vocab_size\": %u,\n  \"eos\": %u,\n  \"token_bytes\": %u,\n", ix->vocab_size, ix->eos,
         ix->token_bytes);
  if (ix->template_state != WK_INDEX_TEMPLATE_NONE) {
    const WkTemplate *t = &ix->template;
    append(&b, "  \"template\": {\"applied\": %s, \"prefix\": [",
           ix->template_state == WK_INDEX_TEMPLATE_APPLIED ? "true" : "false");
    for (uint32_t i = 0; i < t->prefix; i++) append(&b, "%s%u", i ? ", " : "", t->ids[i]);
    append(&b, "], \"suffix\": [");
    for (uint32_t i = 0; i < t->suffix; i++) append(&b, "%s%u", i ? ", " : "", t->ids[t->prefix + i]);
    append(&b, "]},\n");
  }
  if (ix->column_count > 1) append_columns(&b, ix);
  append(&b, "  \"tokens\": %" PRIu64 ",\n  \"documents\": %" PRIu64 ",\n", ix->tokens, ix->documents);
  if (extra && extra[0]) append(&b, "  \"converter\": {%s},\n", extra);
  append(&b, "  \"shards\": [");
  for (uint32_t i = 0; i < ix->shard_count; i++) {
    const WkIndexShard *s = &ix->shards[i];
    append(&b, "%s\n    {\"name\": ", i ? "," : "");
    append_string(&b, s->name);
    append(&b, ", \"bytes\": %" PRIu64 ", \"tokens\": %" PRIu64 ", \"documents\": %" PRIu64
               ", \"checksum\": \"xxh3:%016" PRIx64 "\"}",
           s->bytes, s->tokens, s->documents, s->checksum);
  }
  append(&b, "%s]\n}\n", ix->shard_count ? "\n  " : "");
  if (b.failed) {
    free(b.data);
    return WK_FAIL(WK_ERR_NOMEM, "out of memory formatting the dataset index");
  }
  *out = b.data;
  *length = b.length;
  return WK_OK;
}
