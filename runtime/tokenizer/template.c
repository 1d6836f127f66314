/*
 * template.c — a Hugging Face tokenizer.json's post_processor, read as the ids Hugging Face's
 * add_special_tokens puts around one text (WkTemplate), and encoding with them.
 *
 *   TemplateProcessing  single: special tokens and one $A ("<|begin_of_text|> $A", "[CLS] $A [SEP]");
 *                       each special token stands for the ids of its entry in special_tokens. The pair
 *                       template is checked (one $A, one $B, its tokens known) but not kept: Wick
 *                       encodes one text at a time. type_id is ignored (ids only).
 *   BertProcessing      [cls] $A [sep] (cls and sep as ["token", id])
 *   RobertaProcessing   the same for one text (trim_offsets and add_prefix_space move offsets only)
 *   ByteLevel           nothing for ids (it trims offsets)
 *   Sequence            of the above, each applied to what the one before made, as Hugging Face does:
 *                       a later template wraps the earlier ones
 * Anything else is refused with a message naming the file and the component.
 */
#include <stdio.h>   /* snprintf */
#include <string.h>

#include "tokenizer.h"

#define UNSUPPORTED(path, ...) WK_FAIL(WK_ERR_UNSUPPORTED, __VA_ARGS__), wk_error_context("%s", path)
#define BAD(path, ...) WK_FAIL(WK_ERR_FORMAT, __VA_ARGS__), wk_error_context("%s", path)

typedef struct {
  const char *path;
  uint32_t vocab_size;
} Reader;

static const char *type_of(const WkJson *node) {
  const WkJson *type = wk_json_get(node, "type");
  return type && type->type == WK_JSON_STRING ? type->string : NULL;
}

/* An id of the vocabulary, for messages `what`. */
static WkStatus want_id(const Reader *rd, const WkJson *v, const char *what, uint32_t *id) {
  uint64_t value;
  if (!wk_json_u64(v, &value)) return BAD(rd->path, "post_processor %s is not a token id", what);
  if (value >= rd->vocab_size)
    return BAD(rd->path, "post_processor %s = %llu is outside the vocabulary (%u)", what, (unsigned long long)value,
               rd->vocab_size);
  *id = (uint32_t)value;
  return WK_OK;
}

/* Puts ids before (prefix) or after (suffix) what tpl holds. */
static WkStatus wrap(const Reader *rd, WkTemplate *tpl, const uint32_t *ids, uint32_t count, bool before) {
  if (tpl->prefix + tpl->suffix + count > WK_TEMPLATE_MAX)
    return UNSUPPORTED(rd->path, "post_processor adds more than %d tokens to a text", WK_TEMPLATE_MAX);
  uint32_t at = before ? 0 : tpl->prefix + tpl->suffix;
  memmove(tpl->ids + at + count, tpl->ids + at, (tpl->prefix + tpl->suffix - at) * sizeof *tpl->ids);
  memcpy(tpl->ids + at, ids, count * sizeof *ids);
  if (before) tpl->prefix += count;
  else tpl->suffix += count;
  return WK_OK;
}

/* ---- TemplateProcessing ----------------------------------------------------------------------------- */

/* The ids special token `name` stands for (special_tokens[name].ids). */
static WkStatus special_ids(const Reader *rd, const WkJson *specials, const char *name, uint32_t *ids,
                            uint32_t *count) {
  const WkJson *entry = wk_json_get(specials, name);
  if (!entry) return BAD(rd->path, "post_processor TemplateProcessing uses \"%.100s\", which special_tokens lacks", name);
  const WkJson *list = wk_json_get(entry, "ids");
  if (!list || list->type != WK_JSON_ARRAY || !list->child)
    return BAD(rd->path, "post_processor special_tokens[\"%.100s\"].ids is not a list of token ids", name);
  *count = 0;
  for (const WkJson *v = list->child; v; v = v->next) {
    if (*count == WK_TEMPLATE_MAX)
      return UNSUPPORTED(rd->path, "post_processor special_tokens[\"%.100s\"] has more than %d ids", name,
                         WK_TEMPLATE_MAX);
    WK_TRY(want_id(rd, v, "special_tokens[].ids[]", &ids[(*count)++]));
  }
  return WK_OK;
}

/* A template (single or pair): its pieces in order; sequences[] counts $A and $B. Unless tpl is NULL,
 * its special tokens go around what tpl holds (those before the first sequence before it, the rest
 * after). */
static WkStatus read_pieces(const Reader *rd, const WkJson *node, const WkJson *specials, const char *which,
                            WkTemplate *tpl, int sequences[2]) {
  const WkJson *pieces = wk_json_get(node, which);
  if (!pieces || pieces->type != WK_JSON_ARRAY)
    return BAD(rd->path, "post_processor TemplateProcessing has no %s template (a list of pieces)", which);
  WkTemplate own = {0};
  bool after = false;  /* past the $A */
  for (const WkJson *p = pieces->child; p; p = p->next) {
    const WkJson *special = wk_json_get(p, "SpecialToken"), *sequence = wk_json_get(p, "Sequence");
    const WkJson *id = wk_json_get(special ? special : sequence, "id");
    if (p->type != WK_JSON_OBJECT || !p->child || p->child->next || (!special && !sequence) || !id ||
        id->type != WK_JSON_STRING)
      return BAD(rd->path, "post_processor TemplateProcessing %s: a piece is neither {\"SpecialToken\": {\"id\": ...}} "
                 "nor {\"Sequence\": {\"id\": \"A\"}}", which);
    if (sequence) {
      int k = strcmp(id->string, "A") == 0 ? 0 : strcmp(id->string, "B") == 0 ? 1 : -1;
      if (k < 0) return BAD(rd->path, "post_processor TemplateProcessing %s: sequence \"%.20s\" is neither A nor B",
                            which, id->string);
      sequences[k]++;
      after = true;
      continue;
    }
    uint32_t ids[WK_TEMPLATE_MAX], count;
    WK_TRY(special_ids(rd, specials, id->string, ids, &count));
    WK_TRY(wrap(rd, &own, ids, count, !after));
  }
  if (!tpl) return WK_OK;
  WK_TRY(wrap(rd, tpl, own.ids, own.prefix, true));
  return wrap(rd, tpl, own.ids + own.prefix, own.suffix, false);
}

static WkStatus read_template(const Reader *rd, const WkJson *node, WkTemplate *tpl) {
  const WkJson *specials = wk_json_get(node, "special_tokens");
  if (specials && specials->type != WK_JSON_OBJECT && specials->type != WK_JSON_NULL)
    return BAD(rd->path, "post_processor TemplateProcessing special_tokens is not an object");
  int single[2] = {0, 0}, pair[2] = {0, 0};
  WK_TRY(read_pieces(rd, node, specials, "single", tpl, single));
  if (single[0] != 1 || single[1] != 0)
    return UNSUPPORTED(rd->path, "post_processor TemplateProcessing single template with %d $A and %d $B is not "
                       "supported (exactly one $A)", single[0], single[1]);
  if (!wk_json_get(node, "pair")) return WK_OK;
  WK_TRY(read_pieces(rd, node, specials, "pair", NULL, pair));
  if (pair[0] != 1 || pair[1] != 1)
    return UNSUPPORTED(rd->path, "post_processor TemplateProcessing pair template with %d $A and %d $B is not "
                       "supported (one of each)", pair[0], pair[1]);
  return WK_OK;
}

/* ---- BertProcessing, RobertaProcessing ---------------------------------------------------------------- */

/* cls or sep: ["token", id]. */
static WkStatus read_named_id(const Reader *rd, const WkJson *node, const char *key, uint32_t *id) {
  const WkJson *v = wk_json_get(node, key);
  if (!v || v->type != WK_JSON_ARRAY || !v->child || v->child->type != WK_JSON_STRING || !v->child->next ||
      v->child->next->next)
    return BAD(rd->path, "post_processor %s.%s is not [\"token\", id]", type_of(node), key);
  char what[64];
  snprintf(what, sizeof what, "%s.%s", type_of(node), key);
  return want_id(rd, v->child->next, what, id);
}

static WkStatus read_cls_sep(const Reader *rd, const WkJson *node, WkTemplate *tpl) {
  uint32_t cls, sep;
  WK_TRY(read_named_id(rd, node, "cls", &cls));
  WK_TRY(read_named_id(rd, node, "sep", &sep));
  WK_TRY(wrap(rd, tpl, &cls, 1, true));
  return wrap(rd, tpl, &sep, 1, false);
}

/* ---- the post_processor -------------------------------------------------------------------------- */

static WkStatus read_processor(const Reader *rd, const WkJson *node, bool in_sequence, WkTemplate *tpl) {
  const char *type = type_of(node);
  if (!type) return BAD(rd->path, "a post_processor without a type");
  if (strcmp(type, "TemplateProcessing") == 0) return read_template(rd, node, tpl);
  if (strcmp(type, "BertProcessing") == 0 || strcmp(type, "RobertaProcessing") == 0) return read_cls_sep(rd, node, tpl);
  if (strcmp(type, "ByteLevel") == 0) return WK_OK;
  if (strcmp(type, "Sequence") == 0 && !in_sequence) {
    const WkJson *list = wk_json_get(node, "processors");
    if (!list || list->type != WK_JSON_ARRAY) return BAD(rd->path, "post_processor Sequence without a processors array");
    for (const WkJson *item = list->child; item; item = item->next) WK_TRY(read_processor(rd, item, true, tpl));
    return WK_OK;
  }
  return UNSUPPORTED(rd->path, "post_processor %s%s is not supported (supported: TemplateProcessing, BertProcessing, "
                     "RobertaProcessing, ByteLevel, a Sequence of them)", type, in_sequence ? " (in a Sequence)" : "");
}

WkStatus wk_template_read(const WkJson *post_processor, const char *path, uint32_t vocab_size, WkTemplate *out) {
  memset(out, 0, sizeof *out);
  if (!post_processor || post_processor->type == WK_JSON_NULL) return WK_OK;
  Reader rd = {.path = path, .vocab_size = vocab_size};
  WkStatus status = read_processor(&rd, post_processor, false, out);
  if (status != WK_OK) memset(out, 0, sizeof *out);
  return status;
}

/* ---- encoding ------------------------------------------------------------------------------------ */

static WkStatus append(WkTokenVec *out, const uint32_t *ids, uint32_t count) {
  if (count == 0) return WK_OK;
  WK_TRY(wk_token_vec_reserve(out, count));
  memcpy(out->data + out->length, ids, count * sizeof *ids);
  out->length += count;
  return WK_OK;
}

const WkTemplate *wk_tokenizer_template_of(const WkTokenizer *t) {
  return !t->bare && t->single.prefix + t->single.suffix > 0 ? &t->single : NULL;
}

WkStatus wk_tokenizer_encode_with(const WkTokenizer *t, const WkTemplate *tpl, const uint8_t *text, size_t length,
                                  WkTokenVec *out) {
  if (!t->encode) return WK_FAIL(WK_ERR_UNSUPPORTED, "tokenizer '%s' cannot encode text", t->name);
  if (tpl) WK_TRY(append(out, tpl->ids, tpl->prefix));
  WK_TRY(t->encode(t, text, length, out));
  return tpl ? append(out, tpl->ids + tpl->prefix, tpl->suffix) : WK_OK;
}
