/*
 * json.c — a small strict JSON reader (RFC 8259) for index.json, .jsonl lines and safetensors
 * headers, and a UTF-8 check.
 *
 * Two entry points share one lexer: wk_json_parse builds a tree (index files: small, read once);
 * wk_json_line_field validates a whole line without building anything and decodes one top-level
 * string member (the converter's hot path). Nesting depth is bounded so hostile input cannot
 * exhaust the stack. Numbers are kept as text; callers convert what they need exactly. The tree
 * parser refuses an object that names a member twice; the line reader takes the first (json.h).
 */
#include <stdio.h>   /* snprintf */
#include <stdlib.h>
#include <string.h>

#include "json.h"

enum { MAX_DEPTH = 128 };

/* ---- UTF-8 ------------------------------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence starting at s (1..4), or 0 when it is invalid (overlong forms,
 * surrogates and code points past U+10FFFF are invalid). */
static size_t utf8_sequence(const uint8_t *s, size_t available) {
  uint8_t c = s[0];
  if (c < 0x80) return 1;
  size_t n;
  uint32_t min, cp;
  if ((c & 0xE0) == 0xC0) n = 2, min = 0x80, cp = c & 0x1F;
  else if ((c & 0xF0) == 0xE0) n = 3, min = 0x800, cp = c & 0x0F;
  else if ((c & 0xF8) == 0xF0) n = 4, min = 0x10000, cp = c & 0x07;
  else return 0;
  if (available < n) return 0;
  for (size_t i = 1; i < n; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (s[i] & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

size_t wk_utf8_valid_prefix(const uint8_t *s, size_t length) {
  size_t i = 0;
  while (i < length) {
    /* ASCII runs, 8 bytes at a time. */
    while (i + 8 <= length) {
      uint64_t word;
      memcpy(&word, s + i, 8);
      if (word & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= length) break;
    size_t n = utf8_sequence(s + i, length - i);
    if (n == 0) return i;
    i += n;
  }
  return length;
}

/* ---- lexer ------------------------------------------------------------------------------------- */

typedef struct {
  const char *start, *p, *end;
  int depth;
  char reason[128];
  bool utf8_error;  /* the failure was bad UTF-8 (reported as such to the converter) */
} Lexer;

static bool fail(Lexer *lx, const char *what) {
  if (!lx->reason[0]) snprintf(lx->reason, sizeof lx->reason, "%s", what);
  return false;
}

static void skip_ws(Lexer *lx) {
  while (lx->p < lx->end && (*lx->p == ' ' || *lx->p == '\t' || *lx->p == '\n' || *lx->p == '\r')) lx->p++;
}

static bool scratch_reserve(WkScratch *s, size_t need) {
  if (need <= s->capacity) return true;
  size_t cap = s->capacity ? s->capacity : 256;
  while (cap < need) cap *= 2;
  char *d = realloc(s->data, cap);
  if (!d) return false;
  s->data = d;
  s->capacity = cap;
  return true;
}

static int hex4(const char *p) {
  int v = 0;
  for (int i = 0; i < 4; i++) {
    char c = p[i];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= c - '0';
    else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
    else return -1;
  }
  return v;
}

static size_t put_utf8(char *out, uint32_t cp) {
  if (cp < 0x80) { out[0] = (char)cp; return 1; }
  if (cp < 0x800) { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
  if (cp < 0x10000) {
    out[0] = (char)(0xE0 | (cp >> 12)); out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = (char)(0xF0 | (cp >> 18)); out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
  out[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); out[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

/* True when none of the 8 bytes is a quote, a backslash, a control character or non-ASCII (the
 * classic "has byte less than / equal to" bit tricks: no false "true"). */
static inline bool plain8(uint64_t w) {
  const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
  uint64_t control = (w - ones * 0x20) & ~w & highs;
  uint64_t q = w ^ (ones * '"'), quote = (q - ones) & ~q & highs;
  uint64_t b = w ^ (ones * '\\'), backslash = (b - ones) & ~b & highs;
  return ((w & highs) | control | quote | backslash) == 0;
}

/* At an opening quote. Validates the string; when out is given, decodes it there (NUL-terminated,
 * *length set). A decoded string is never longer than its source text. */
static bool lex_string(Lexer *lx, WkScratch *out, size_t *length) {
  lx->p++; /* the quote */
  const char *begin = lx->p;
  char *dst = NULL;
  if (out) {
    if (!scratch_reserve(out, (size_t)(lx->end - begin) + 1)) return fail(lx, "out of memory");
    dst = out->data;
  }
  size_t n = 0;
  while (lx->p < lx->end) {
    /* Fast path: 8 bytes at a time while they are plain ASCII (no quote, backslash or control). */
    while (lx->end - lx->p >= 8) {
      uint64_t w;
      memcpy(&w, lx->p, 8);
      if (!plain8(w)) break;
      if (out) memcpy(dst + n, lx->p, 8);
      n += 8;
      lx->p += 8;
    }
    if (lx->p >= lx->end) break;
    uint8_t c = (uint8_t)*lx->p;
    if (c == '"') {
      lx->p++;
      if (out) { dst[n] = '\0'; *length = n; }
      return true;
    }
    if (c < 0x20) return fail(lx, "control character in string");
    if (c == '\\') {
      if (lx->end - lx->p < 2) break;
      char e = lx->p[1];
      lx->p += 2;
      char single = 0;
      switch (e) {
        case '"': single = '"'; break;
        case '\\': single = '\\'; break;
        case '/': single = '/'; break;
        case 'b': single = '\b'; break;
        case 'f': single = '\f'; break;
        case 'n': single = '\n'; break;
        case 'r': single = '\r'; break;
        case 't': single = '\t'; break;
        case 'u': {
          if (lx->end - lx->p < 4) return fail(lx, "truncated \\u escape");
          int hi = hex4(lx->p);
          if (hi < 0) return fail(lx, "bad \\u escape");
          lx->p += 4;
          uint32_t cp = (uint32_t)hi;
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            int lo = -1;
            if (lx->end - lx->p >= 6 && lx->p[0] == '\\' && lx->p[1] == 'u') lo = hex4(lx->p + 2);
            if (lo < 0xDC00 || lo > 0xDFFF) {
              lx->utf8_error = true;
              return fail(lx, "invalid UTF-8 (unpaired surrogate escape)");
            }
            lx->p += 6;
            cp = 0x10000 + ((cp - 0xD800) << 10) + ((uint32_t)lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            lx->utf8_error = true;
            return fail(lx, "invalid UTF-8 (unpaired surrogate escape)");
          }
          if (out) n += put_utf8(dst + n, cp);
          continue;
        }
        default: return fail(lx, "bad escape in string");
      }
      if (out) dst[n++] = single;
      continue;
    }
    if (c < 0x80) {
      if (out) dst[n++] = (char)c;
      lx->p++;
      continue;
    }
    size_t len = utf8_sequence((const uint8_t *)lx->p, (size_t)(lx->end - lx->p));
    if (len == 0) {
      lx->utf8_error = true;
      return fail(lx, "invalid UTF-8");
    }
    if (out) memcpy(dst + n, lx->p, len), n += len;
    lx->p += len;
  }
  return fail(lx, "unterminated string");
}

static bool lex_number(Lexer *lx) {
  const char *p = lx->p;
  if (p < lx->end && *p == '-') p++;
  if (p >= lx->end) return fail(lx, "bad number");
  if (*p == '0') p++;
  else if (*p >= '1' && *p <= '9') while (p < lx->end && *p >= '0' && *p <= '9') p++;
  else return fail(lx, "bad number");
  if (p < lx->end && *p == '.') {
    p++;
    if (p >= lx->end || *p < '0' || *p > '9') return fail(lx, "bad number");
    while (p < lx->end && *p >= '0' && *p <= '9') p++;
  }
  if (p < lx->end && (*p == 'e' || *p == 'E')) {
    p++;
    if (p < lx->end && (*p == '+' || *p == '-')) p++;
    if (p >= lx->end || *p < '0' || *p > '9') return fail(lx, "bad number");
    while (p < lx->end && *p >= '0' && *p <= '9') p++;
  }
  lx->p = p;
  return true;
}

static bool lex_literal(Lexer *lx, const char *word) {
  size_t n = strlen(word);
  if ((size_t)(lx->end - lx->p) < n || memcmp(lx->p, word, n) != 0) return fail(lx, "unexpected character");
  lx->p += n;
  return true;
}

/* Validates one value without building anything. */
static bool skip_value(Lexer *lx) {
  skip_ws(lx);
  if (lx->p >= lx->end) return fail(lx, "unexpected end of input");
  char c = *lx->p;
  if (c == '"') return lex_string(lx, NULL, NULL);
  if (c == '{' || c == '[') {
    if (++lx->depth > MAX_DEPTH) return fail(lx, "nested too deeply");
    char close = c == '{' ? '}' : ']';
    lx->p++;
    skip_ws(lx);
    if (lx->p < lx->end && *lx->p == close) {
      lx->p++;
      lx->depth--;
      return true;
    }
    for (;;) {
      if (c == '{') {
        skip_ws(lx);
        if (lx->p >= lx->end || *lx->p != '"') return fail(lx, "expected a member name");
        if (!lex_string(lx, NULL, NULL)) return false;
        skip_ws(lx);
        if (lx->p >= lx->end || *lx->p != ':') return fail(lx, "expected ':'");
        lx->p++;
      }
      if (!skip_value(lx)) return false;
      skip_ws(lx);
      if (lx->p < lx->end && *lx->p == ',') { lx->p++; continue; }
      if (lx->p < lx->end && *lx->p == close) { lx->p++; lx->depth--; return true; }
      return fail(lx, c == '{' ? "expected ',' or '}'" : "expected ',' or ']'");
    }
  }
  if (c == 't') return lex_literal(lx, "true");
  if (c == 'f') return lex_literal(lx, "false");
  if (c == 'n') return lex_literal(lx, "null");
  if (c == '-' || (c >= '0' && c <= '9')) return lex_number(lx);
  return fail(lx, "unexpected character");
}

/* ---- .jsonl lines --------------------------------------------------------------------------- */

bool wk_json_line_field(const char *line, size_t length, const char *field, WkScratch *scratch, const char **text,
                        size_t *text_length, char reason[128]) {
  Lexer lx = {.start = line, .p = line, .end = line + length};
  size_t field_length = strlen(field);
  bool found = false, not_string = false;
  skip_ws(&lx);
  if (lx.p >= lx.end || *lx.p != '{') {
    fail(&lx, "not a JSON object");
    goto bad;
  }
  lx.p++;
  lx.depth = 1;
  skip_ws(&lx);
  if (lx.p < lx.end && *lx.p == '}') {
    lx.p++;
  } else {
    for (;;) {
      skip_ws(&lx);
      if (lx.p >= lx.end || *lx.p != '"') { fail(&lx, "expected a member name"); goto bad; }
      /* Member names are compared raw when they have no escapes, which is every real dataset. */
      const char *name = lx.p + 1;
      if (!lex_string(&lx, NULL, NULL)) goto bad;
      size_t name_length = (size_t)(lx.p - 1 - name);
      bool match = !found && name_length == field_length && memcmp(name, field, field_length) == 0;
      skip_ws(&lx);
      if (lx.p >= lx.end || *lx.p != ':') { fail(&lx, "expected ':'"); goto bad; }
      lx.p++;
      skip_ws(&lx);
      if (match && lx.p < lx.end && *lx.p == '"') {
        if (!lex_string(&lx, scratch, text_length)) goto bad;
        found = true;
      } else {
        if (match) not_string = true;
        if (!skip_value(&lx)) goto bad;
      }
      skip_ws(&lx);
      if (lx.p < lx.end && *lx.p == ',') { lx.p++; continue; }
      if (lx.p < lx.end && *lx.p == '}') { lx.p++; break; }
      fail(&lx, "expected ',' or '}'");
      goto bad;
    }
  }
  skip_ws(&lx);
  if (lx.p != lx.end) { fail(&lx, "text after the object"); goto bad; }
  if (!found) {
    snprintf(reason, 128, not_string ? "field '%s' is not a string" : "missing field '%s'", field);
    return false;
  }
  *text = scratch->data;
  return true;
bad:
  if (lx.utf8_error)
    snprintf(reason, 128, "%s", lx.reason);
  else
    snprintf(reason, 128, "invalid JSON at column %zu: %s", (size_t)(lx.p - line) + 1, lx.reason);
  return false;
}

/* ---- tree parser (index.json) -------------------------------------------------------------- */

/* An object's member names are checked as they are read: by a linear scan of the members while there
 * are few, through a hash table of them once there are more, so an object with millions of members
 * still parses in linear time. */
enum { LINEAR_MEMBERS = 16, SHOWN_NAME_BYTES = 64 };

typedef struct {
  const WkJson *object;
  size_t count;
  const WkJson **table;  /* open addressing; NULL while count <= LINEAR_MEMBERS */
  size_t table_size;     /* a power of two, more than twice count */
} Members;

static uint64_t name_hash(const char *s, size_t n) { /* FNV-1a */
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
  return h;
}

static bool same_name(const WkJson *member, const char *name, size_t n) {
  return member->key_length == n && memcmp(member->key, name, n) == 0;
}

/* The slot of name in the table: where it is, or the empty one where it would go. */
static const WkJson **table_slot(const Members *m, const char *name, size_t n) {
  size_t mask = m->table_size - 1;
  for (size_t i = (size_t)name_hash(name, n) & mask;; i = (i + 1) & mask)
    if (!m->table[i] || same_name(m->table[i], name, n)) return &m->table[i];
}

/* Rebuilds the table for at least `need` members (all of the object's members so far go in). */
static bool table_grow(Lexer *lx, Members *m, size_t need) {
  size_t size = LINEAR_MEMBERS * 4;
  while (size <= 2 * need) size *= 2;
  const WkJson **table = calloc(size, sizeof *table);
  if (!table) return fail(lx, "out of memory");
  free(m->table);
  m->table = table;
  m->table_size = size;
  for (const WkJson *e = m->object->child; e; e = e->next) *table_slot(m, e->key, e->key_length) = e;
  return true;
}

static bool duplicate_name(Lexer *lx, const char *name, size_t n) {
  char shown[SHOWN_NAME_BYTES + 1];
  size_t k = 0;
  for (; k < n && k < SHOWN_NAME_BYTES; k++) shown[k] = name[k] >= 0x20 && name[k] != 0x7f ? name[k] : '?';
  shown[k] = '\0';
  snprintf(lx->reason, sizeof lx->reason, "member name \"%s\"%s appears twice in one object (which value is "
           "meant is ambiguous)", shown, n > SHOWN_NAME_BYTES ? "..." : "");
  return false;
}

/* Fails when the object already has a member of this name. */
static bool members_check(Lexer *lx, const Members *m, const char *name, size_t n) {
  if (m->table) return *table_slot(m, name, n) ? duplicate_name(lx, name, n) : true;
  for (const WkJson *e = m->object->child; e; e = e->next)
    if (same_name(e, name, n)) return duplicate_name(lx, name, n);
  return true;
}

/* Records a member appended to the object (after members_check said its name is new). */
static bool members_add(Lexer *lx, Members *m, const WkJson *member) {
  m->count++;
  if (m->count <= LINEAR_MEMBERS) return true;
  if (!m->table || 2 * m->count >= m->table_size) return table_grow(lx, m, m->count);
  *table_slot(m, member->key, member->key_length) = member;
  return true;
}

static WkJson *new_node(Lexer *lx, WkJsonType type) {
  WkJson *v = calloc(1, sizeof *v);
  if (!v) fail(lx, "out of memory");
  if (v) v->type = type;
  return v;
}

static char *copy_text(const char *s, size_t n) {
  char *c = malloc(n + 1);
  if (c) memcpy(c, s, n), c[n] = '\0';
  return c;
}

static WkJson *parse_value(Lexer *lx, WkScratch *scratch);

static bool parse_string_copy(Lexer *lx, WkScratch *scratch, char **out, size_t *length) {
  size_t n = 0;
  if (!lex_string(lx, scratch, &n)) return false;
  *out = copy_text(scratch->data, n);
  if (!*out) return fail(lx, "out of memory");
  if (length) *length = n;
  return true;
}

static WkJson *parse_container(Lexer *lx, WkScratch *scratch, bool object) {
  if (++lx->depth > MAX_DEPTH) return fail(lx, "nested too deeply"), NULL;
  WkJson *v = new_node(lx, object ? WK_JSON_OBJECT : WK_JSON_ARRAY);
  if (!v) return NULL;
  char close = object ? '}' : ']';
  lx->p++;
  skip_ws(lx);
  if (lx->p < lx->end && *lx->p == close) {
    lx->p++;
    lx->depth--;
    return v;
  }
  WkJson **tail = &v->child;
  Members members = {.object = v};
  for (;;) {
    char *key = NULL;
    size_t key_length = 0;
    if (object) {
      skip_ws(lx);
      if (lx->p >= lx->end || *lx->p != '"') { fail(lx, "expected a member name"); break; }
      const char *name_at = lx->p;
      if (!parse_string_copy(lx, scratch, &key, &key_length)) break;
      if (!members_check(lx, &members, key, key_length)) {
        lx->p = name_at; /* the error points at the second occurrence */
        free(key);
        break;
      }
      skip_ws(lx);
      if (lx->p >= lx->end || *lx->p != ':') { free(key); fail(lx, "expected ':'"); break; }
      lx->p++;
    }
    WkJson *item = parse_value(lx, scratch);
    if (!item) { free(key); break; }
    item->key = key;
    item->key_length = key_length;
    *tail = item;
    tail = &item->next;
    if (object && !members_add(lx, &members, item)) break;
    skip_ws(lx);
    if (lx->p < lx->end && *lx->p == ',') { lx->p++; continue; }
    if (lx->p < lx->end && *lx->p == close) {
      lx->p++;
      lx->depth--;
      free(members.table);
      return v;
    }
    fail(lx, object ? "expected ',' or '}'" : "expected ',' or ']'");
    break;
  }
  free(members.table);
  wk_json_free(v);
  return NULL;
}

static WkJson *parse_value(Lexer *lx, WkScratch *scratch) {
  skip_ws(lx);
  if (lx->p >= lx->end) return fail(lx, "unexpected end of input"), NULL;
  char c = *lx->p;
  if (c == '{' || c == '[') return parse_container(lx, scratch, c == '{');
  if (c == '"') {
    WkJson *v = new_node(lx, WK_JSON_STRING);
    if (v && !parse_string_copy(lx, scratch, &v->string, &v->length)) {
      wk_json_free(v);
      return NULL;
    }
    return v;
  }
  if (c == '-' || (c >= '0' && c <= '9')) {
    const char *begin = lx->p;
    if (!lex_number(lx)) return NULL;
    WkJson *v = new_node(lx, WK_JSON_NUMBER);
    if (!v) return NULL;
    v->length = (size_t)(lx->p - begin);
    v->string = copy_text(begin, v->length);
    if (!v->string) { wk_json_free(v); return fail(lx, "out of memory"), NULL; }
    return v;
  }
  WkJsonType type = c == 't' ? WK_JSON_TRUE : c == 'f' ? WK_JSON_FALSE : WK_JSON_NULL;
  if (!lex_literal(lx, c == 't' ? "true" : c == 'f' ? "false" : "null")) return NULL;
  return new_node(lx, type);
}

static void position(const Lexer *lx, size_t *line, size_t *column) {
  *line = 1;
  const char *line_start = lx->start;
  for (const char *q = lx->start; q < lx->p && q < lx->end; q++)
    if (*q == '\n') (*line)++, line_start = q + 1;
  *column = (size_t)(lx->p - line_start) + 1;
}

WkStatus wk_json_parse(const char *text, size_t length, WkJson **out) {
  *out = NULL;
  Lexer lx = {.start = text, .p = text, .end = text + length};
  WkScratch scratch = {0};
  WkJson *v = parse_value(&lx, &scratch);
  if (v) {
    skip_ws(&lx);
    if (lx.p != lx.end) {
      fail(&lx, "text after the value");
      wk_json_free(v);
      v = NULL;
    }
  }
  free(scratch.data);
  if (!v) {
    size_t line, column;
    position(&lx, &line, &column);
    return WK_FAIL(WK_ERR_FORMAT, "invalid JSON at line %zu column %zu: %s", line, column, lx.reason);
  }
  *out = v;
  return WK_OK;
}

void wk_json_free(WkJson *value) {
  while (value) {
    WkJson *next = value->next;
    wk_json_free(value->child);
    free(value->string);
    free(value->key);
    free(value);
    value = next;
  }
}

const WkJson *wk_json_get(const WkJson *object, const char *key) {
  if (!object || object->type != WK_JSON_OBJECT) return NULL;
  size_t n = strlen(key);
  for (const WkJson *m = object->child; m; m = m->next)
    if (same_name(m, key, n)) return m;
  return NULL;
}

bool wk_json_u64(const WkJson *value, uint64_t *out) {
  if (!value || value->type != WK_JSON_NUMBER || value->length == 0 || value->length > 20) return false;
  uint64_t v = 0;
  for (size_t i = 0; i < value->length; i++) {
    char c = value->string[i];
    if (c < '0' || c > '9') return false;
    uint64_t d = (uint64_t)(c - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}
