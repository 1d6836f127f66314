/*
 * huggingface.c — a Hugging Face tokenizer.json with a BPE or Unigram model -> a tokenizer.
 *
 * Supported, as the `tokenizers` library runs them:
 *   model          BPE: vocab, merges as "a b" strings or ["a", "b"] pairs (a later duplicate pair
 *                  wins), ignore_merges, unk_token, fuse_unk and byte_fallback (SentencePiece-style
 *                  only); dropout null or 0. Unigram: vocab of [piece, score], unk_id (required),
 *                  byte_fallback (../unigram/)
 *   normalizer     none, NFC, NFKC, Lowercase, Strip, Prepend, Replace (String or Regex pattern),
 *                  Precompiled, or a Sequence of them (normalize.c)
 *   pre_tokenizer  ByteLevel (GPT-2's regex when use_regex, add_prefix_space), Split (Regex or String
 *                  pattern, behavior Isolated, not inverted), WhitespaceSplit, Metaspace (last), and
 *                  a Sequence of those; with a ByteLevel (exactly one: Llama 3, Qwen use
 *                  Sequence[Split(regex), ByteLevel(use_regex = false)]) the vocabulary is written in
 *                  GPT-2's byte alphabet, without one (SentencePiece-style: Llama 2, Mistral, Gemma,
 *                  T5) it is text
 *   decoder        ByteLevel or none (byte-level: the tokens' bytes); Replace, ByteFallback, Fuse,
 *                  Strip, Metaspace, or a Sequence of them (SentencePiece-style: decode.c)
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

#include <math.h>  /* isfinite */

#include "bpe.h"
#include "../../core/json.h"
#include "../unigram/unigram.h"

enum { NAME_BYTES = 256, PATH_BYTES = 4096 };

typedef struct {
  const char *path;
  Bpe *bpe;
  uint8_t *scratch;  /* decoded token bytes, room for the longest string of the file */
  size_t scratch_capacity;
  int bytelevels;    /* ByteLevel pre-tokenizers seen */
  NormalizeScratch normalized;  /* added tokens' contents normalized */
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

/* A vocabulary string -> the bytes it stands for, in the loader's scratch: byte-level files write
 * bytes in GPT-2's alphabet, SentencePiece-style ones write text. */
static WkStatus token_bytes(Loader *ld, const char *text, size_t length, size_t at, size_t *n) {
  WK_TRY(reserve_scratch(ld, at + length + 1));
  if (ld->bpe->chars) {
    memcpy(ld->scratch + at, text, length);
    *n = length;
  } else {
    *n = bytelevel_decode(text, length, ld->scratch + at);
  }
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
    size_t n;
    WK_TRY(token_bytes(ld, m->key, strlen(m->key), 0, &n));
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
  size_t a, b;
  WK_TRY(token_bytes(ld, left, left_length, 0, &a));
  WK_TRY(token_bytes(ld, right, right_length, a, &b));
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

/* The <0xNN> tokens of byte_fallback (Hugging Face falls back to a character's bytes only when the
 * model has every one of them). */
static void read_fallback_tokens(Loader *ld) {
  for (int b = 0; b < 256; b++) {
    char name[sizeof "<0x00>"];
    snprintf(name, sizeof name, "<0x%02X>", b);
    ld->bpe->fallback_token[b] = vocab_find(&ld->bpe->vocab, (const uint8_t *)name, strlen(name));
  }
}

/* A Unigram model: vocab as [[piece, score], ...] (the id is the place), unk_id, byte_fallback. */
static WkStatus read_unigram(Loader *ld, const WkJson *model) {
  if (!ld->bpe->chars) return UNSUPPORTED(ld, "a Unigram model with a ByteLevel pre-tokenizer is not supported");
  WK_TRY(want_bool(ld, model, "byte_fallback", "model"));
  for (const char *const *key = (const char *const[]){"alpha", "nbest_size", NULL}; *key; key++)
    if (!is_null(wk_json_get(model, *key)))
      return UNSUPPORTED(ld, "model.%s is not supported (sampling makes encoding random)", *key);
  const WkJson *vocab = wk_json_get(model, "vocab");
  if (!vocab || vocab->type != WK_JSON_ARRAY || !vocab->child)
    return BAD(ld, "model.vocab is missing, empty or not an array of [piece, score]");
  size_t count = 0;
  for (const WkJson *m = vocab->child; m; m = m->next) count++;
  if (count >= BPE_MAX_VOCAB) return BAD(ld, "model.vocab has %zu pieces, more than 2^22", count);
  uint64_t unk;
  const WkJson *unk_id = wk_json_get(model, "unk_id");
  if (is_null(unk_id)) return BAD(ld, "model.unk_id is missing (a Unigram model needs its unk token)");
  if (!wk_json_u64(unk_id, &unk) || unk >= count)
    return BAD(ld, "model.unk_id is not the place of a piece of model.vocab (0 to %zu)", count - 1);
  WK_TRY(vocab_init(&ld->bpe->vocab, (uint32_t)count));
  double *scores = wk_malloc(count * sizeof *scores, "Unigram scores");
  if (!scores) return wk_last_status();
  WkStatus status = WK_OK;
  size_t k = 0;
  for (const WkJson *m = vocab->child; m && status == WK_OK; m = m->next, k++) {
    const WkJson *piece = m->type == WK_JSON_ARRAY ? m->child : NULL, *score = piece ? piece->next : NULL;
    char *end = NULL;
    if (!piece || piece->type != WK_JSON_STRING || !score || score->next)
      status = BAD(ld, "model.vocab[%zu] is not [piece, score]", k);
    else if (score->type != WK_JSON_NUMBER || !isfinite(scores[k] = strtod(score->string, &end)) || *end)
      status = BAD(ld, "model.vocab[%zu] (\"%.100s\"): the score is not a finite number", k, piece->string);
    else if (vocab_set(&ld->bpe->vocab, (uint32_t)k, (const uint8_t *)piece->string, piece->length,
                       "model.vocab") != WK_OK)
      status = wk_error_context("%s", ld->path);
  }
  if (status == WK_OK && vocab_finish(&ld->bpe->vocab) != WK_OK) status = wk_error_context("%s: model.vocab", ld->path);
  if (status == WK_OK) {
    if (flag(model, "byte_fallback", false)) read_fallback_tokens(ld);
    ld->bpe->unk = (uint32_t)unk;
    char what[NAME_BYTES];
    snprintf(what, sizeof what, "%s: model", ld->path);
    status = unigram_new(ld->bpe, scores, (uint32_t)unk, what, &ld->bpe->unigram);
  }
  free(scores);
  return status;
}

static WkStatus read_model(Loader *ld, const WkJson *model) {
  if (!model || model->type != WK_JSON_OBJECT) return BAD(ld, "no \"model\" object (not a tokenizer.json?)");
  const char *type = type_name(model);
  if (type && strcmp(type, "Unigram") == 0) return read_unigram(ld, model);
  /* Old files have no type; they are BPE when they have merges. */
  if (type ? strcmp(type, "BPE") != 0 : !wk_json_get(model, "merges"))
    return UNSUPPORTED(ld, "model type '%s' is not supported (only BPE and Unigram)", type ? type : "(none)");
  const WkJson *dropout = wk_json_get(model, "dropout");
  if (!is_null(dropout) && !(dropout->type == WK_JSON_NUMBER && strspn(dropout->string, "0.") == dropout->length))
    return UNSUPPORTED(ld, "model.dropout %s is not supported (dropout makes encoding random)",
                       dropout->type == WK_JSON_NUMBER ? dropout->string : "(not a number)");
  WK_TRY(want_empty(ld, model, "continuing_subword_prefix"));
  WK_TRY(want_empty(ld, model, "end_of_word_suffix"));
  WK_TRY(want_bool(ld, model, "byte_fallback", "model"));
  WK_TRY(want_bool(ld, model, "ignore_merges", "model"));
  WK_TRY(want_bool(ld, model, "fuse_unk", "model"));
  bool byte_fallback = flag(model, "byte_fallback", false);
  if (byte_fallback && !ld->bpe->chars)
    return UNSUPPORTED(ld, "model.byte_fallback with a ByteLevel pre-tokenizer is not supported (byte-level BPE has a "
                       "token for every byte already)");
  WK_TRY(read_vocab(ld, wk_json_get(model, "vocab")));
  WK_TRY(read_merges(ld, wk_json_get(model, "merges")));
  ld->bpe->ignore_merges = flag(model, "ignore_merges", false);
  ld->bpe->fuse_unk = flag(model, "fuse_unk", false);
  if (byte_fallback) read_fallback_tokens(ld);
  const WkJson *unk = wk_json_get(model, "unk_token");
  if (!is_null(unk)) {
    if (unk->type != WK_JSON_STRING) return BAD(ld, "model.unk_token is not a string");
    size_t n;
    WK_TRY(token_bytes(ld, unk->string, unk->length, 0, &n));
    ld->bpe->unk = vocab_find(&ld->bpe->vocab, ld->scratch, n);
    if (ld->bpe->unk == BPE_NO_TOKEN) return BAD(ld, "model.unk_token \"%.100s\" is not in the vocabulary", unk->string);
    if (ld->bpe->fuse_unk && !ld->bpe->chars)
      return UNSUPPORTED(ld, "model.fuse_unk is not supported with a ByteLevel pre-tokenizer");
  }
  return WK_OK;
}

/* ---- normalizers -------------------------------------------------------------------------------- */

/* A string option: its bytes (non-empty unless empty_ok). */
static WkStatus want_string(Loader *ld, const WkJson *node, const char *key, const char *where, bool empty_ok,
                            const WkJson **out) {
  const WkJson *v = wk_json_get(node, key);
  if (!v || v->type != WK_JSON_STRING || (!empty_ok && v->length == 0))
    return BAD(ld, "%s.%s is missing or not a%s string", where, key, empty_ok ? "" : " non-empty");
  *out = v;
  return WK_OK;
}

/* The pattern of Replace: {"String": "x"}, or {"Regex": "x"} where regex may hold it (else NULL). */
static WkStatus want_pattern(Loader *ld, const WkJson *node, const char *where, const WkJson **out, void **regex) {
  const WkJson *pattern = wk_json_get(node, "pattern");
  const WkJson *re = wk_json_get(pattern, "Regex");
  if (re && regex && re->type == WK_JSON_STRING) {
    char what[NAME_BYTES];
    snprintf(what, sizeof what, "%s: %s", ld->path, where);
    *out = re;
    return normalize_regex(re->string, re->length, regex, what);
  }
  if (re) return UNSUPPORTED(ld, "%s with a Regex pattern is not supported (only String)", where);
  const WkJson *literal = wk_json_get(pattern, "String");
  if (!literal || literal->type != WK_JSON_STRING || literal->length == 0)
    return BAD(ld, "%s has no pattern {\"String\": \"...\"} (a non-empty string)", where);
  *out = literal;
  return WK_OK;
}

/* Precompiled's precompiled_charsmap: base64 of SentencePiece's blob (precompiled.c). */
static WkStatus read_charsmap(Loader *ld, const WkJson *node, Charsmap **out) {
  const WkJson *text = NULL;
  WK_TRY(want_string(ld, node, "precompiled_charsmap", "normalizer Precompiled", false, &text));
  WK_TRY(reserve_scratch(ld, text->length));
  long n = base64_decode(text->string, text->length, ld->scratch);
  if (n < 0) return BAD(ld, "normalizer Precompiled.precompiled_charsmap is not base64");
  char what[NAME_BYTES];
  snprintf(what, sizeof what, "%s: normalizer Precompiled", ld->path);
  return charsmap_load(ld->scratch, (size_t)n, out, what);
}

/* A Replace's strings, borrowed from the JSON (normalizer_add and decoder_add copy them). */
static Rewrite rewrite_of(const WkJson *text, const WkJson *with) {
  return (Rewrite){.text = (uint8_t *)text->string, .text_length = text->length, .with = (uint8_t *)with->string,
                   .with_length = with->length};
}

static WkStatus read_normalizer(Loader *ld, const WkJson *node, bool in_sequence) {
  const char *type = type_name(node);
  if (!type) return BAD(ld, "a normalizer without a type");
  char what[NAME_BYTES];
  snprintf(what, sizeof what, "%s: normalizer %s", ld->path, type);
  NormalizeStep step = {0};
  const WkJson *text = NULL, *with = NULL;
  if (strcmp(type, "NFC") == 0 || strcmp(type, "NFKC") == 0 || strcmp(type, "Lowercase") == 0) {
    step.kind = type[0] == 'L' ? NORMALIZE_LOWERCASE : type[2] == 'C' ? NORMALIZE_NFC : NORMALIZE_NFKC;
  } else if (strcmp(type, "Strip") == 0) {
    WK_TRY(want_bool(ld, node, "strip_left", "normalizer Strip"));
    WK_TRY(want_bool(ld, node, "strip_right", "normalizer Strip"));
    step = (NormalizeStep){.kind = NORMALIZE_STRIP, .left = flag(node, "strip_left", false),
                           .right = flag(node, "strip_right", false)};
  } else if (strcmp(type, "Precompiled") == 0) {
    step.kind = NORMALIZE_PRECOMPILED;
    WK_TRY(read_charsmap(ld, node, &step.charsmap));
  } else if (strcmp(type, "Prepend") == 0) {
    WK_TRY(want_string(ld, node, "prepend", "normalizer Prepend", false, &text));
    step = (NormalizeStep){.kind = NORMALIZE_PREPEND, .rewrite = {.text = (uint8_t *)text->string,
                                                                  .text_length = text->length}};
  } else if (strcmp(type, "Replace") == 0) {
    void *regex = NULL;
    WK_TRY(want_pattern(ld, node, "normalizer Replace", &text, &regex));
    step = (NormalizeStep){.kind = NORMALIZE_REPLACE, .regex = regex};
    if (want_string(ld, node, "content", "normalizer Replace", true, &with) != WK_OK) {
      if (regex) normalize_regex_free(regex);
      return wk_last_status();
    }
    step.rewrite = rewrite_of(text, with);
  } else if (strcmp(type, "Sequence") == 0 && !in_sequence) {
    const WkJson *list = wk_json_get(node, "normalizers");
    if (!list || list->type != WK_JSON_ARRAY) return BAD(ld, "normalizer Sequence without a normalizers array");
    for (const WkJson *item = list->child; item; item = item->next) WK_TRY(read_normalizer(ld, item, true));
    return WK_OK;
  } else {
    return UNSUPPORTED(ld, "normalizer %s%s is not supported (supported: NFC, NFKC, Lowercase, Strip, Prepend, "
                       "Replace, Precompiled, a Sequence of them)", type, in_sequence ? " (in a Sequence)" : "");
  }
  /* The normalizer owns the step's regex and charsmap once added; until then they are the step's. */
  if (normalizer_add(&ld->bpe->normalizer, &step, what) != WK_OK) {
    if (step.regex) normalize_regex_free(step.regex);
    charsmap_free(step.charsmap);
    return wk_error_context("%s", ld->path);
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

/* Metaspace's options, as a pre-tokenizer and as a decoder: replacement, prepend_scheme ("always" when
 * absent), split (true when absent); older files' add_prefix_space must agree (false: "never"), as
 * Hugging Face reads them. */
static WkStatus read_metaspace(Loader *ld, const WkJson *node, const char *where, Metaspace *m) {
  const WkJson *rep = NULL;
  WK_TRY(want_string(ld, node, "replacement", where, false, &rep));
  if (utf8_length((uint8_t)rep->string[0]) != rep->length)
    return BAD(ld, "%s.replacement \"%.20s\" is not one character", where, rep->string);
  WK_TRY(want_bool(ld, node, "add_prefix_space", where));
  WK_TRY(want_bool(ld, node, "split", where));
  *m = (Metaspace){.on = true, .replacement_length = rep->length, .split = flag(node, "split", true),
                   .prepend = PREPEND_ALWAYS};
  memcpy(m->replacement, rep->string, rep->length);
  const WkJson *scheme = wk_json_get(node, "prepend_scheme");
  if (!is_null(scheme)) {
    const char *names[] = {[PREPEND_ALWAYS] = "always", [PREPEND_FIRST] = "first", [PREPEND_NEVER] = "never"};
    int k = 0;
    while (k < 3 && !(scheme->type == WK_JSON_STRING && strcmp(scheme->string, names[k]) == 0)) k++;
    if (k == 3) return BAD(ld, "%s.prepend_scheme is not \"always\", \"first\" or \"never\"", where);
    m->prepend = (PrependScheme)k;
  }
  if (!flag(node, "add_prefix_space", true) && m->prepend != PREPEND_NEVER)
    return BAD(ld, "%s.add_prefix_space is false but prepend_scheme is not \"never\"", where);
  return WK_OK;
}

static WkStatus read_pretokenizer(Loader *ld, const WkJson *node, size_t position, bool in_sequence) {
  const char *type = type_name(node);
  if (!type) return BAD(ld, "a pre_tokenizer without a type");
  if (ld->bpe->metaspace.on) return UNSUPPORTED(ld, "pre_tokenizer %s after Metaspace is not supported", type);
  if (strcmp(type, "Metaspace") == 0) return read_metaspace(ld, node, "pre_tokenizer Metaspace", &ld->bpe->metaspace);
  if (strcmp(type, "ByteLevel") == 0) return read_bytelevel(ld, node, position);
  if (strcmp(type, "WhitespaceSplit") == 0) {
    char what[NAME_BYTES];
    snprintf(what, sizeof what, "%s: pre_tokenizer WhitespaceSplit", ld->path);
    return pretokenizer_add_matches(&ld->bpe->pre, "\\S+", what);
  }
  if (strcmp(type, "Split") == 0) return read_split(ld, node);
  if (strcmp(type, "Sequence") == 0 && !in_sequence) {
    const WkJson *list = wk_json_get(node, "pretokenizers");
    if (!list || list->type != WK_JSON_ARRAY) return BAD(ld, "pre_tokenizer Sequence without a pretokenizers array");
    size_t k = 0;
    for (const WkJson *item = list->child; item; item = item->next, k++) WK_TRY(read_pretokenizer(ld, item, k, true));
    return WK_OK;
  }
  return UNSUPPORTED(ld, "pre_tokenizer %s%s is not supported (supported: ByteLevel, Split, WhitespaceSplit, "
                     "Metaspace, a Sequence of them)", type, in_sequence ? " (in a Sequence)" : "");
}

/* ---- decoders ------------------------------------------------------------------------------------ */

/* A whole number option of at most max. */
static WkStatus want_count(Loader *ld, const WkJson *node, const char *key, const char *where, size_t *out) {
  uint64_t v;
  if (!wk_json_u64(wk_json_get(node, key), &v) || v > UINT32_MAX)
    return BAD(ld, "%s.%s is missing or not a whole number", where, key);
  *out = (size_t)v;
  return WK_OK;
}

static WkStatus read_decoder(Loader *ld, const WkJson *node, bool in_sequence) {
  const char *type = type_name(node);
  if (!type) return BAD(ld, "a decoder without a type");
  if (strcmp(type, "ByteLevel") == 0 && !in_sequence) {
    if (ld->bpe->chars) return UNSUPPORTED(ld, "decoder ByteLevel without a ByteLevel pre-tokenizer is not supported");
    return WK_OK;
  }
  if (!ld->bpe->chars)
    return UNSUPPORTED(ld, "decoder %s is not supported with a ByteLevel pre-tokenizer (only ByteLevel)", type);
  char what[NAME_BYTES];
  snprintf(what, sizeof what, "%s: decoder %s", ld->path, type);
  DecodeStep step = {0};
  const WkJson *text = NULL, *with = NULL;
  if (strcmp(type, "Replace") == 0) {
    WK_TRY(want_pattern(ld, node, "decoder Replace", &text, NULL));
    WK_TRY(want_string(ld, node, "content", "decoder Replace", true, &with));
    step = (DecodeStep){.kind = DECODE_REPLACE, .rewrite = rewrite_of(text, with)};
  } else if (strcmp(type, "ByteFallback") == 0) {
    step.kind = DECODE_BYTE_FALLBACK;
  } else if (strcmp(type, "Fuse") == 0) {
    step.kind = DECODE_FUSE;
  } else if (strcmp(type, "Strip") == 0) {
    WK_TRY(want_string(ld, node, "content", "decoder Strip", false, &text));
    size_t k = utf8_length((uint8_t)text->string[0]);
    if (k != text->length) return BAD(ld, "decoder Strip.content \"%.20s\" is not one character", text->string);
    step = (DecodeStep){.kind = DECODE_STRIP, .content = utf8_decode((const uint8_t *)text->string, k)};
    WK_TRY(want_count(ld, node, "start", "decoder Strip", &step.start));
    WK_TRY(want_count(ld, node, "stop", "decoder Strip", &step.stop));
  } else if (strcmp(type, "Metaspace") == 0) {
    step.kind = DECODE_METASPACE;
    WK_TRY(read_metaspace(ld, node, "decoder Metaspace", &step.metaspace));
  } else if (strcmp(type, "Sequence") == 0 && !in_sequence) {
    const WkJson *list = wk_json_get(node, "decoders");
    if (!list || list->type != WK_JSON_ARRAY) return BAD(ld, "decoder Sequence without a decoders array");
    for (const WkJson *item = list->child; item; item = item->next) WK_TRY(read_decoder(ld, item, true));
    return WK_OK;
  } else {
    return UNSUPPORTED(ld, "decoder %s%s is not supported (supported: ByteLevel, Replace, ByteFallback, Fuse, Strip, "
                       "Metaspace, a Sequence of them)", type, in_sequence ? " (in a Sequence)" : "");
  }
  if (decoder_add(&ld->bpe->decoder, &step, what) != WK_OK) return wk_error_context("%s", ld->path);
  return WK_OK;
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
    /* A normalized token is looked for normalized, as Hugging Face's split_normalized_trie has it. */
    const uint8_t *match = (const uint8_t *)content->string;
    size_t match_length = content->length;
    if (normalized && normalize(&ld->bpe->normalizer, &ld->normalized, &match, &match_length) != WK_OK)
      return wk_error_context("%s: added_tokens[%zu]", ld->path, k);
    WK_TRY(added_add(&ld->bpe->added[normalized ? 1 : 0], (uint32_t)value, (const uint8_t *)content->string,
                     content->length, match, match_length, special, flag(t, "lstrip", false),
                     flag(t, "rstrip", false)));
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
  const WkJson *normalizer = wk_json_get(root, "normalizer");
  if (!is_null(normalizer)) WK_TRY(read_normalizer(ld, normalizer, false));
  /* Without a ByteLevel pre-tokenizer the vocabulary is text (SentencePiece-style): known before it is read. */
  const WkJson *pre = wk_json_get(root, "pre_tokenizer");
  if (!is_null(pre)) WK_TRY(read_pretokenizer(ld, pre, 0, false));
  if (ld->bytelevels && ld->bpe->metaspace.on)
    return UNSUPPORTED(ld, "pre_tokenizer Metaspace with a ByteLevel pre-tokenizer is not supported");
  ld->bpe->chars = ld->bytelevels == 0;
  WK_TRY(read_model(ld, wk_json_get(root, "model")));
  const WkJson *decoder = wk_json_get(root, "decoder");
  if (!is_null(decoder)) WK_TRY(read_decoder(ld, decoder, false));
  if (!ld->bpe->unigram) bpe_find_word_mark(ld->bpe);
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
  normalize_scratch_free(&ld.normalized);
  if (status != WK_OK) {
    bpe_free(ld.bpe);
    return status;
  }
  ld.bpe->base.fingerprint = XXH3_64bits(text, length);
  *out = ld.bpe;
  return WK_OK;
}
