/*
 * huggingface.c — a Hugging Face tokenizer.json with a byte-level BPE model -> a tokenizer.
 *
 * Supported, as the `tokenizers` library runs them:
 *   model          BPE: vocab, merges as "a b" strings or ["a", "b"] pairs (a later duplicate pair
 *                  wins), ignore_merges, unk_token; dropout null or 0
 *   normalizer     none, or NFC (Qwen 2; encode.c)
 *   pre_tokenizer  ByteLevel (GPT-2's regex when use_regex, add_prefix_space), Split (Regex or String
 *                  pattern, behavior Isolated, not inverted), and a Sequence of those with exactly one
 *                  ByteLevel (Llama 3, Qwen: Sequence[Split(regex), ByteLevel(use_regex = false)])
 *   decoder        ByteLevel or none (decoding concatenates the tokens' bytes)
 *   added_tokens   content, special, lstrip, rstrip, normalized
 *   post_processor TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel and a Sequence of
 *                  them, as the ids put around a text (../template.c; applied unless the tokenizer is
 *                  set bare, as Hugging Face's add_special_tokens)
 * Anything else is refused with a message naming the component and the file. The EOS token is the
 * eos_token of a tokenizer_config.json next to the file when there is one, else a token with a usual
 * EOS name (encode.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>  /* XXH3_64bits */

#include "bpe.h"
#include "../../core/json.h"

enum { NAME_BYTES = 256, PATH_BYTES = 4096 };

typedef struct {
  const char *path;
  Bpe *bpe;
  uint8_t *scratch;  /* decoded token bytes, room for the longest string of the file */
  size_t scratch_capacity;
  int bytelevels;    /* ByteLevel pre-tokenizers seen */
} Loader;

#define UNSUPPORTED(ld, ...) WK_FAIL(WK_ERR_UNSUPPORTED, __VA_ARGS__), wk_error_context("%s", (ld)->path)
#define BAD(ld, ...) WK_FAIL(WK_ERR_FORMAT, __VA_ARGS__), wk_error_context("%s", (ld)->path)

static const char *type_name(const WkJson *node) {
  const WkJson *type = wk_json_get(node, "type");
  return type && type->type == WK_JSON_STRING ? type->string : NULL;
}

static bool is_null(const WkJson *v) { return !v || v->type == WK_JSON_NULL; }

static bool flag(const WkJson *object, const char *key, bool fallback) {
  const WkJson *v = wk_json_get(object, key);
  if (!v || v->type == WK_JSON_NULL) return fallback;
  return v->type == WK_JSON_TRUE;
}

static WkStatus want_bool(Loader *ld, const WkJson *object, const char *key, const char *where) {
  const WkJson *v = wk_json_get(object, key);
  if (v && v->type != WK_JSON_TRUE && v->type != WK_JSON_FALSE && v->type != WK_JSON_NULL)
    return BAD(ld, "%s.%s must be true or false", where, key);
  return WK_OK;
}

/* ---- the model ---------------------------------------------------------------------------------- */

static WkStatus reserve_scratch(Loader *ld, size_t n) {
  if (n <= ld->scratch_capacity) return WK_OK;
  uint8_t *grown = realloc(ld->scratch, n);
  if (!grown) return WK_FAIL(WK_ERR_NOMEM, "%s: out of memory reading tokens", ld->path);
  ld->scratch = grown;
  ld->scratch_capacity = n;
  return WK_OK;
}

static WkStatus read_vocab(Loader *ld, const WkJson *vocab) {
  if (!vocab || vocab->type != WK_JSON_OBJECT) return BAD(ld, "model.vocab is missing or not an object");
  uint64_t max_id = 0, count = 0;
  for (const WkJson *m = vocab->child; m; m = m->next, count++) {
    uint64_t id;
    if (!wk_json_u64(m, &id) || id >= BPE_MAX_VOCAB)
      return BAD(ld, "model.vocab[\"%.100s\"] is not a token id (a whole number below 2^22)", m->key);
    if (id > max_id) max_id = id;
  }
  if (count == 0) return BAD(ld, "model.vocab is empty");
  WK_TRY(vocab_init(&ld->bpe->vocab, (uint32_t)max_id + 1));
  for (const WkJson *m = vocab->child; m; m = m->next) {
    size_t length = strlen(m->key);
    WK_TRY(reserve_scratch(ld, length + 1));
    size_t n = bytelevel_decode(m->key, length, ld->scratch);
    uint64_t id;
    wk_json_u64(m, &id);
    if (vocab_set(&ld->bpe->vocab, (uint32_t)id, ld->scratch, n, "model.vocab") != WK_OK)
      return wk_error_context("%s", ld->path);
  }
  if (vocab_finish(&ld->bpe->vocab) != WK_OK) return wk_error_context("%s: model.vocab", ld->path);
  return WK_OK;
}

/* One merge: the ids of its two sides and of what they make. */
static WkStatus read_merge(Loader *ld, size_t rank, const char *left, size_t left_length, const char *right,
                           size_t right_length) {
  const Vocab *v = &ld->bpe->vocab;
  WK_TRY(reserve_scratch(ld, left_length + right_length + 1));
  size_t a = bytelevel_decode(left, left_length, ld->scratch);
  size_t b = bytelevel_decode(right, right_length, ld->scratch + a);
  uint32_t left_id = vocab_find(v, ld->scratch, a), right_id = vocab_find(v, ld->scratch + a, b);
  uint32_t merged = vocab_find(v, ld->scratch, a + b);
  if (left_id == BPE_NO_TOKEN || right_id == BPE_NO_TOKEN || merged == BPE_NO_TOKEN)
    return BAD(ld, "model.merges[%zu] (\"%.*s\" + \"%.*s\"): %s is not in the vocabulary", rank, (int)left_length,
               left, (int)right_length, right,
               left_id == BPE_NO_TOKEN ? "the left side" : right_id == BPE_NO_TOKEN ? "the right side" : "the merge");
  return pairs_put(&ld->bpe->pairs, left_id, right_id, (uint32_t)rank, merged);
}

static WkStatus read_merges(Loader *ld, const WkJson *merges) {
  if (!merges) return BAD(ld, "model.merges is missing (a BPE model needs its merges)");
  if (merges->type != WK_JSON_ARRAY) return BAD(ld, "model.merges is not an array");
  size_t count = 0;
  for (const WkJson *m = merges->child; m; m = m->next) count++;
  if (count >= UINT32_MAX) return BAD(ld, "model.merges has more than 2^32 - 1 merges");
  WK_TRY(pairs_init(&ld->bpe->pairs, count));
  size_t rank = 0;
  for (const WkJson *m = merges->child; m; m = m->next, rank++) {
    if (m->type == WK_JSON_STRING) {
      /* "a b": exactly one space (the byte-level alphabet writes a space in a token as Ġ). */
      const char *space = strchr(m->string, ' ');
      if (!space || strchr(space + 1, ' '))
        return BAD(ld, "model.merges[%zu] \"%.100s\" is not two tokens separated by one space", rank, m->string);
      WK_TRY(read_merge(ld, rank, m->string, (size_t)(space - m->string), space + 1, strlen(space + 1)));
    } else if (m->type == WK_JSON_ARRAY && m->child && m->child->type == WK_JSON_STRING && m->child->next &&
               m->child->next->type == WK_JSON_STRING && !m->child->next->next) {
      const WkJson *a = m->child, *b = m->child->next;
      WK_TRY(read_merge(ld, rank, a->string, a->length, b->string, b->length));
    } else {
      return BAD(ld, "model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", rank);
    }
  }
  return WK_OK;
}

/* A string option that must be empty or null. */
static WkStatus want_empty(Loader *ld, const WkJson *model, const char *key) {
  const WkJson *v = wk_json_get(model, key);
  if (is_null(v) || (v->type == WK_JSON_STRING && v->length == 0)) return WK_OK;
  return UNSUPPORTED(ld, "model.%s is not supported (byte-level BPE has none)", key);
}

static WkStatus read_model(Loader *ld, const WkJson *model) {
  if (!model || model->type != WK_JSON_OBJECT) return BAD(ld, "no \"model\" object (not a tokenizer.json?)");
  const char *type = type_name(model);
  /* Old files have no type; they are BPE when they have merges. */
  if (type ? strcmp(type, "BPE") != 0 : !wk_json_get(model, "merges"))
    return UNSUPPORTED(ld, "model type '%s' is not supported (only BPE)", type ? type : "(none)");
  const WkJson *dropout = wk_json_get(model, "dropout");
  if (!is_null(dropout) && !(dropout->type == WK_JSON_NUMBER && strspn(dropout->string, "0.") == dropout->length))
    return UNSUPPORTED(ld, "model.dropout %s is not supported (dropout makes encoding random)",
                       dropout->type == WK_JSON_NUMBER ? dropout->string : "(not a number)");
  WK_TRY(want_empty(ld, model, "continuing_subword_prefix"));
  WK_TRY(want_empty(ld, model, "end_of_word_suffix"));
  WK_TRY(want_bool(ld, model, "byte_fallback", "model"));
  WK_TRY(want_bool(ld, model, "ignore_merges", "model"));
  WK_TRY(want_bool(ld, model, "fuse_unk", "model"));
  if (flag(model, "byte_fallback", false))
    return UNSUPPORTED(ld, "model.byte_fallback is not supported (SentencePiece-style BPE, e.g. Llama 2 or Mistral: "
                       "only byte-level BPE is)");
  WK_TRY(read_vocab(ld, wk_json_get(model, "vocab")));
  WK_TRY(read_merges(ld, wk_json_get(model, "merges")));
  ld->bpe->ignore_merges = flag(model, "ignore_merges", false);
  const WkJson *unk = wk_json_get(model, "unk_token");
  if (!is_null(unk)) {
    if (unk->type != WK_JSON_STRING) return BAD(ld, "model.unk_token is not a string");
    WK_TRY(reserve_scratch(ld, unk->length + 1));
    size_t n = bytelevel_decode(unk->string, unk->length, ld->scratch);
    ld->bpe->unk = vocab_find(&ld->bpe->vocab, ld->scratch, n);
    if (ld->bpe->unk == BPE_NO_TOKEN) return BAD(ld, "model.unk_token \"%.100s\" is not in the vocabulary", unk->string);
    if (flag(model, "fuse_unk", false)) return UNSUPPORTED(ld, "model.fuse_unk is not supported");
  }
  return WK_OK;
}

/* ---- pre-tokenizers ------------------------------------------------------------------------------ */

static WkStatus read_pretokenizer(Loader *ld, const WkJson *node, size_t position, bool in_sequence);

static WkStatus read_split(Loader *ld, const WkJson *node) {
  const WkJson *behavior = wk_json_get(node, "behavior");
  if (!behavior || behavior->type != WK_JSON_STRING || strcmp(behavior->string, "Isolated") != 0)
    return UNSUPPORTED(ld, "pre_tokenizer Split with behavior '%s' is not supported (only Isolated)",
                       behavior && behavior->type == WK_JSON_STRING ? behavior->string : "(none)");
  WK_TRY(want_bool(ld, node, "invert", "pre_tokenizer Split"));
  if (flag(node, "invert", false)) return UNSUPPORTED(ld, "pre_tokenizer Split with invert = true is not supported");
  const WkJson *pattern = wk_json_get(node, "pattern");
  const WkJson *regex = wk_json_get(pattern, "Regex"), *literal = wk_json_get(pattern, "String");
  char what[NAME_BYTES];
  snprintf(what, sizeof what, "%s: pre_tokenizer Split", ld->path);
  if (regex && regex->type == WK_JSON_STRING) return pretokenizer_add(&ld->bpe->pre, regex->string, regex->length, what);
  if (literal && literal->type == WK_JSON_STRING) /* "" matches empty everywhere: every character a piece */
    return pretokenizer_add_literal(&ld->bpe->pre, literal->string, literal->length, what);
  return BAD(ld, "pre_tokenizer Split has no pattern {\"Regex\": ...} or {\"String\": ...}");
}

static WkStatus read_bytelevel(Loader *ld, const WkJson *node, size_t position) {
  WK_TRY(want_bool(ld, node, "add_prefix_space", "pre_tokenizer ByteLevel"));
  WK_TRY(want_bool(ld, node, "use_regex", "pre_tokenizer ByteLevel"));
  if (ld->bytelevels++) return UNSUPPORTED(ld, "more than one ByteLevel pre-tokenizer is not supported");
  if (flag(node, "add_prefix_space", false)) {
    /* The space goes in front of each piece the pre-tokenizers before this one made: only the first
     * pre-tokenizer's is the same as a space in front of each run of text. */
    if (position > 0) return UNSUPPORTED(ld, "ByteLevel with add_prefix_space after another pre-tokenizer is not supported");
    ld->bpe->add_prefix_space = true;
  }
  if (!flag(node, "use_regex", true)) return WK_OK;
  char what[NAME_BYTES];
  snprintf(what, sizeof what, "%s: pre_tokenizer ByteLevel", ld->path);
  const char *pattern = pretokenizer_pattern("bytelevel");
  return pretokenizer_add(&ld->bpe->pre, pattern, strlen(pattern), what);
}

static WkStatus read_pretokenizer(Loader *ld, const WkJson *node, size_t position, bool in_sequence) {
  const char *type = type_name(node);
  if (!type) return BAD(ld, "a pre_tokenizer without a type");
  if (strcmp(type, "ByteLevel") == 0) return read_bytelevel(ld, node, position);
  if (strcmp(type, "Split") == 0) return read_split(ld, node);
  if (strcmp(type, "Sequence") == 0 && !in_sequence) {
    const WkJson *list = wk_json_get(node, "pretokenizers");
    if (!list || list->type != WK_JSON_ARRAY) return BAD(ld, "pre_tokenizer Sequence without a pretokenizers array");
    size_t k = 0;
    for (const WkJson *item = list->child; item; item = item->next, k++) WK_TRY(read_pretokenizer(ld, item, k, true));
    return WK_OK;
  }
  return UNSUPPORTED(ld, "pre_tokenizer %s%s is not supported (supported: ByteLevel, Split, a Sequence of them)", type,
                     in_sequence ? " (in a Sequence)" : "");
}

/* ---- the rest -------------------------------------------------------------------------------------- */

/* An added token may be a token of the vocabulary, by the same id; an id the vocabulary gives to
 * other bytes would make one id two strings (decoding would write the added one for both). */
static WkStatus check_added_id(Loader *ld, size_t k, uint32_t id, const WkJson *content) {
  if (!vocab_has(&ld->bpe->vocab, id)) return WK_OK;
  size_t length;
  const uint8_t *bytes = vocab_bytes(&ld->bpe->vocab, id, &length);
  if (length == content->length && memcmp(bytes, content->string, length) == 0) return WK_OK;
  return BAD(ld, "added_tokens[%zu] \"%.100s\" has id %u, which model.vocab gives to \"%.*s\" (one id, two strings)", k,
             content->string, id, (int)(length < 100 ? length : 100), (const char *)bytes);
}

static WkStatus read_added(Loader *ld, const WkJson *list) {
  if (is_null(list)) return WK_OK;
  if (list->type != WK_JSON_ARRAY) return BAD(ld, "added_tokens is not an array");
  size_t k = 0;
  for (const WkJson *t = list->child; t; t = t->next, k++) {
    const WkJson *id = wk_json_get(t, "id"), *content = wk_json_get(t, "content");
    uint64_t value;
    if (!wk_json_u64(id, &value) || value >= BPE_MAX_VOCAB)
      return BAD(ld, "added_tokens[%zu].id is not a token id (a whole number below 2^22)", k);
    if (!content || content->type != WK_JSON_STRING || content->length == 0)
      return BAD(ld, "added_tokens[%zu].content is missing or empty", k);
    for (const char *const *key = (const char *const[]){"special", "lstrip", "rstrip", "normalized", "single_word", NULL};
         *key; key++)
      WK_TRY(want_bool(ld, t, *key, "added_tokens[]"));
    if (flag(t, "single_word", false))
      return UNSUPPORTED(ld, "added_tokens[%zu] (\"%.100s\"): single_word is not supported", k, content->string);
    WK_TRY(check_added_id(ld, k, (uint32_t)value, content));
    bool special = flag(t, "special", false);
    bool normalized = flag(t, "normalized", !special);
    WK_TRY(added_add(&ld->bpe->added[normalized ? 1 : 0], (uint32_t)value, (const uint8_t *)content->string,
                     content->length, special, flag(t, "lstrip", false), flag(t, "rstrip", false)));
  }
  return WK_OK;
}

/* eos_token of tokenizer_config.json beside the file, when there is one ("x" or {"content": "x"}). */
static WkStatus read_config_eos(Loader *ld) {
  const char *slash = strrchr(ld->path, '/');
  size_t dir = slash ? (size_t)(slash - ld->path) + 1 : 0;
  char config_path[PATH_BYTES];
  if (dir + sizeof "tokenizer_config.json" > sizeof config_path) return WK_OK;
  memcpy(config_path, ld->path, dir);
  memcpy(config_path + dir, "tokenizer_config.json", sizeof "tokenizer_config.json");
  FILE *probe = fopen(config_path, "rb");
  if (!probe) return WK_OK;
  fclose(probe);
  char *text;
  size_t length;
  WK_TRY(bpe_read_file(config_path, &text, &length));
  WkJson *root;
  WkStatus status = wk_json_parse(text, length, &root);
  free(text);
  if (status != WK_OK) return wk_error_context("%s", config_path);
  const WkJson *eos = wk_json_get(root, "eos_token");
  if (eos && eos->type == WK_JSON_OBJECT) eos = wk_json_get(eos, "content");
  if (eos && eos->type == WK_JSON_STRING) {
    uint32_t id = ld->bpe->base.token_id(&ld->bpe->base, (const uint8_t *)eos->string, eos->length);
    if (id == BPE_NO_TOKEN)
      status = WK_FAIL(WK_ERR_FORMAT, "%s: eos_token \"%.100s\" is not a token of %s", config_path, eos->string,
                       ld->path);
    else ld->bpe->base.eos = id;
  }
  wk_json_free(root);
  return status;
}

/* "dir/tokenizer.json" is named by its folder too: "Llama-3-8B/tokenizer.json". */
static void name_of(const char *path, char *name, size_t size) {
  const char *slash = strrchr(path, '/');
  const char *start = path;
  if (slash) {
    start = slash + 1;
    const char *parent = slash;
    while (parent > path && parent[-1] != '/') parent--;
    if (parent < slash && strcmp(start, "tokenizer.json") == 0) start = parent;
  }
  snprintf(name, size, "%s", start);
}

static WkStatus read_tokenizer(Loader *ld, const WkJson *root) {
  if (root->type != WK_JSON_OBJECT) return BAD(ld, "not a JSON object (not a tokenizer.json?)");
  WK_TRY(read_model(ld, wk_json_get(root, "model")));
  const WkJson *normalizer = wk_json_get(root, "normalizer");
  const char *normalizer_type = type_name(normalizer);
  if (normalizer_type && strcmp(normalizer_type, "NFC") == 0) ld->bpe->nfc = true;
  else if (!is_null(normalizer))
    return UNSUPPORTED(ld, "normalizer %s is not supported (only NFC, or none)",
                       normalizer_type ? normalizer_type : "(without a type)");
  const WkJson *pre = wk_json_get(root, "pre_tokenizer");
  if (!is_null(pre)) WK_TRY(read_pretokenizer(ld, pre, 0, false));
  if (ld->bytelevels == 0)
    return UNSUPPORTED(ld, "pre_tokenizer %s is not supported: only byte-level BPE is (a ByteLevel pre-tokenizer)",
                       is_null(pre) ? "(none)" : type_name(pre));
  const WkJson *decoder = wk_json_get(root, "decoder");
  if (!is_null(decoder) && !(type_name(decoder) && strcmp(type_name(decoder), "ByteLevel") == 0))
    return UNSUPPORTED(ld, "decoder %s is not supported (only ByteLevel)",
                       type_name(decoder) ? type_name(decoder) : "(without a type)");
  WK_TRY(read_added(ld, wk_json_get(root, "added_tokens")));
  WkStatus status = bpe_finish(ld->bpe);
  if (status != WK_OK) return wk_error_context("%s", ld->path);
  WK_TRY(wk_template_read(wk_json_get(root, "post_processor"), ld->path, ld->bpe->base.vocab_size,
                          &ld->bpe->base.single));
  return read_config_eos(ld);
}

WkStatus bpe_load_huggingface(const char *path, const char *text, size_t length, Bpe **out) {
  *out = NULL;
  WkJson *root;
  if (wk_json_parse(text, length, &root) != WK_OK) return wk_error_context("%s", path);
  char name[NAME_BYTES];
  name_of(path, name, sizeof name);
  Loader ld = {.path = path, .bpe = bpe_new(name)};
  WkStatus status = ld.bpe ? read_tokenizer(&ld, root) : wk_last_status();
  wk_json_free(root);
  free(ld.scratch);
  if (status != WK_OK) {
    bpe_free(ld.bpe);
    return status;
  }
  ld.bpe->base.fingerprint = XXH3_64bits(text, length);
  *out = ld.bpe;
  return WK_OK;
}
