/*
 * pretokenize.c — text -> pieces with PCRE2 regexes: the patterns of tiktoken encodings and of
 * tokenizer.json pre-tokenizers, matched the way their own engines match them.
 *
 * Compiled with UTF | UCP (Unicode classes and properties; the text is validated UTF-8 before it gets
 * here, so matching skips PCRE2's own check) and DOLLAR_ENDONLY (`$` is the end of the text, as in
 * Rust's regex, not also before a final newline), then JIT-compiled when the platform allows. One
 * rewrite keeps the engines in agreement: Rust's regex and Oniguruma mean Unicode White_Space by \s,
 * while PCRE2's \s also takes U+180E, so \s and \S become \p{White_Space} and \P{White_Space}.
 * The Unicode tables are PCRE2's (Unicode 14.0 in PCRE2 10.42): characters assigned later are not
 * letters or numbers here.
 *
 * Every match is a piece, and so is the unmatched text between matches (Hugging Face's "Isolated"
 * split; tiktoken's patterns match everything). An empty match cuts the text where it is, as
 * Hugging Face's does (a pattern that matches the empty string everywhere splits every character,
 * `(?=a)` cuts before each a). For the patterns of ascii.c, each match that ASCII characters decide
 * is found there, without PCRE2.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bpe.h"

enum {
  JIT_STACK_START = 32 << 10,  /* bytes */
  JIT_STACK_MAX = 8 << 20,     /* enough for the patterns here on any piece; an error past it */
  ERROR_MESSAGE_BYTES = 256,
};

static const uint32_t COMPILE_OPTIONS = PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY | PCRE2_NO_UTF_CHECK;

/* ---- the patterns of known encodings ----------------------------------------------------------- */

static const struct {
  const char *name, *pattern;
  FastPattern fast;
} PATTERNS[] = {
    /* Hugging Face's ByteLevel pre-tokenizer (use_regex = true): GPT-2's original pattern. */
    {"bytelevel", "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+", FAST_GPT2},
    /* tiktoken's r50k_base, p50k_base and gpt2 (the same splits, written faster). */
    {"r50k", "'(?:[sdmt]|ll|ve|re)| ?\\p{L}++| ?\\p{N}++| ?[^\\s\\p{L}\\p{N}]++|\\s++$|\\s+(?!\\S)|\\s", FAST_GPT2},
    {"cl100k", "'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}++|\\p{N}{1,3}+| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*+|"
               "\\s++$|\\s*[\\r\\n]|\\s+(?!\\S)|\\s", FAST_CL100K},
    /* Llama 3's and Qwen 2's tokenizer.json Split regexes. */
    {"llama3", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
               "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+", FAST_LLAMA3},
    {"qwen2", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
              "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+", FAST_QWEN2},
    {"o200k", "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
              "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
              "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
              "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
              "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+", FAST_NONE},
};

const char *pretokenizer_pattern(const char *name) {
  for (size_t i = 0; i < sizeof PATTERNS / sizeof PATTERNS[0]; i++)
    if (strcmp(PATTERNS[i].name, name) == 0) return PATTERNS[i].pattern;
  return NULL;
}

/* ---- compiling ------------------------------------------------------------------------------- */

static const char WHITE_SPACE[] = "\\p{White_Space}", NOT_WHITE_SPACE[] = "\\P{White_Space}";

/* \s -> \p{White_Space}, \S -> \P{White_Space}, outside \Q...\E; everything else as written. */
static char *rewrite_space(const char *pattern, size_t length) {
  size_t extra = 0;
  for (size_t i = 0; i + 1 < length; i++)
    if (pattern[i] == '\\') extra += sizeof WHITE_SPACE, i++;
  char *out = malloc(length + extra + 1);
  if (!out) return NULL;
  size_t n = 0;
  bool quoted = false;
  for (size_t i = 0; i < length; i++) {
    char c = pattern[i];
    if (c != '\\' || i + 1 == length) {
      out[n++] = c;
      continue;
    }
    char e = pattern[i + 1];
    i++;
    if (quoted) {
      if (e == 'E') quoted = false;
      out[n++] = c, out[n++] = e;
    } else if (e == 'Q') {
      quoted = true;
      out[n++] = c, out[n++] = e;
    } else if (e == 's' || e == 'S') {
      const char *with = e == 's' ? WHITE_SPACE : NOT_WHITE_SPACE;
      memcpy(out + n, with, sizeof WHITE_SPACE - 1);
      n += sizeof WHITE_SPACE - 1;
    } else {
      out[n++] = c, out[n++] = e;
    }
  }
  out[n] = '\0';
  return out;
}

/* The hand-written matcher of a pattern written exactly as one of PATTERNS. */
static FastPattern fast_pattern_of(const char *pattern, size_t length) {
  for (size_t i = 0; i < sizeof PATTERNS / sizeof PATTERNS[0]; i++)
    if (strlen(PATTERNS[i].pattern) == length && memcmp(PATTERNS[i].pattern, pattern, length) == 0)
      return PATTERNS[i].fast;
  return FAST_NONE;
}

/* A regex compiled (and JIT-compiled when the platform allows; *jit says so). */
static WkStatus compile(const char *pattern, size_t length, pcre2_code **out, bool *jit, const char *what) {
  int code;
  PCRE2_SIZE offset;
  pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, length, COMPILE_OPTIONS, &code, &offset, NULL);
  if (!re) {
    PCRE2_UCHAR message[ERROR_MESSAGE_BYTES];
    pcre2_get_error_message(code, message, sizeof message);
    return WK_FAIL(WK_ERR_FORMAT, "%s: the regex does not compile at offset %zu: %s (PCRE2 %d.%d; pattern: %.200s)",
                   what, (size_t)offset, (const char *)message, PCRE2_MAJOR, PCRE2_MINOR, pattern);
  }
  /* Without JIT (a platform or policy without executable memory) the interpreter matches the same. */
  int rc = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
  if (rc != 0) wk_logf(WK_LOG_INFO, "%s: PCRE2 JIT unavailable (error %d); matching interpreted", what, rc);
  *jit = rc == 0;
  *out = re;
  return WK_OK;
}

static WkStatus add_compiled(Pretokenizer *pt, const char *pattern, size_t length, const char *what) {
  if (pt->levels == PRETOKENIZE_MAX_LEVELS)
    return WK_FAIL(WK_ERR_UNSUPPORTED, "%s: more than %d regex splits in a row", what, PRETOKENIZE_MAX_LEVELS);
  pcre2_code *re;
  WK_TRY(compile(pattern, length, &re, &pt->jit[pt->levels], what));
  pt->code[pt->levels++] = re;
  return WK_OK;
}

WkStatus pretokenizer_add(Pretokenizer *pt, const char *pattern, size_t length, const char *what) {
  char *rewritten = rewrite_space(pattern, length);
  if (!rewritten) return WK_FAIL(WK_ERR_NOMEM, "%s: out of memory compiling a regex", what);
  WkStatus status = add_compiled(pt, rewritten, strlen(rewritten), what);
  free(rewritten);
  if (status == WK_OK) pt->fast[pt->levels - 1] = fast_pattern_of(pattern, length);
  return status;
}

WkStatus pretokenizer_add_matches(Pretokenizer *pt, const char *pattern, const char *what) {
  WK_TRY(pretokenizer_add(pt, pattern, strlen(pattern), what));
  pt->matches_only[pt->levels - 1] = true;
  return WK_OK;
}

/* ---- Replace's regexes (normalize.c) ----------------------------------------------------------- */

WkStatus normalize_regex(const char *pattern, size_t length, void **out, const char *what) {
  char *rewritten = rewrite_space(pattern, length);
  if (!rewritten) return WK_FAIL(WK_ERR_NOMEM, "%s: out of memory compiling a regex", what);
  pcre2_code *re = NULL;
  bool jit;
  WkStatus status = compile(rewritten, strlen(rewritten), &re, &jit, what);
  free(rewritten);
  *out = re;
  return status;
}

void normalize_regex_free(void *regex) { pcre2_code_free(regex); }

WkStatus regex_replace_all(const void *regex, void **match, WkByteVec *out, const uint8_t *text, size_t length,
                           const uint8_t *with, size_t with_length) {
  if (!*match) {
    *match = pcre2_match_data_create(1, NULL);
    if (!*match) return WK_FAIL(WK_ERR_NOMEM, "out of memory for PCRE2 match data");
  }
  size_t at = 0, done = 0;
  while (at < length) {
    int rc = pcre2_match(regex, text, length, at, PCRE2_NO_UTF_CHECK, *match, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) return WK_FAIL(WK_ERR_UNSUPPORTED, "normalizer Replace: the regex failed on %zu bytes (PCRE2 %d)",
                               length, rc);
    const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(*match);
    if (ov[1] == ov[0]) { /* an empty match replaces nothing */
      at = ov[0] + (ov[0] < length ? utf8_length(text[ov[0]]) : 1);
      continue;
    }
    WK_TRY(wk_byte_vec_append(out, text + done, ov[0] - done));
    WK_TRY(wk_byte_vec_append(out, with, with_length));
    done = at = ov[1];
  }
  return wk_byte_vec_append(out, text + done, length - done);
}

WkStatus pretokenizer_add_literal(Pretokenizer *pt, const char *literal, size_t length, const char *what) {
  /* Each character escaped as \x{..} or kept when alphanumeric: no quoting rule to get wrong. */
  char *pattern = malloc(length * 6 + 1);
  if (!pattern) return WK_FAIL(WK_ERR_NOMEM, "%s: out of memory compiling a split", what);
  size_t n = 0;
  for (size_t i = 0; i < length; i++) {
    unsigned char c = (unsigned char)literal[i];
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c >= 0x80) pattern[n++] = (char)c;
    else n += (size_t)snprintf(pattern + n, 7, "\\x{%x}", c);
  }
  WkStatus status = add_compiled(pt, pattern, n, what);
  free(pattern);
  return status;
}

void pretokenizer_free(Pretokenizer *pt) {
  for (int i = 0; i < pt->levels; i++) pcre2_code_free(pt->code[i]);
  memset(pt, 0, sizeof *pt);
}

/* ---- matching ---------------------------------------------------------------------------------- */

struct PretokenizeState {
  pcre2_match_data *match;
  pcre2_match_context *context;
  pcre2_jit_stack *stack;
};

PretokenizeState *pretokenize_state_new(void) {
  PretokenizeState *s = wk_calloc(1, sizeof *s, "regex state");
  if (!s) return NULL;
  s->match = pcre2_match_data_create(1, NULL);
  s->context = pcre2_match_context_create(NULL);
  s->stack = pcre2_jit_stack_create(JIT_STACK_START, JIT_STACK_MAX, NULL);
  if (!s->match || !s->context || !s->stack) {
    pretokenize_state_free(s);
    WK_FAIL(WK_ERR_NOMEM, "out of memory for PCRE2 match data and its JIT stack");
    return NULL;
  }
  pcre2_jit_stack_assign(s->context, NULL, s->stack);
  return s;
}

void pretokenize_state_free(PretokenizeState *s) {
  if (!s) return;
  pcre2_match_data_free(s->match);
  pcre2_match_context_free(s->context);
  pcre2_jit_stack_free(s->stack);
  free(s);
}

static WkStatus split_level(const Pretokenizer *pt, PretokenizeState *s, int level, const uint8_t *text,
                            size_t length, PieceFn piece, void *context) {
  if (level >= pt->levels || level >= PRETOKENIZE_MAX_LEVELS) return piece(context, text, length);
  const pcre2_code *re = pt->code[level];
  FastPattern fast = pt->fast[level];
  bool gaps = !pt->matches_only[level];  /* unmatched text is a piece too */
  size_t at = 0, done = 0; /* search from `at`; text before `done` is already split */
  while (at < length) {
    /* The known patterns match at every position: where ASCII decides, no regex is needed. */
    size_t fast_end = fast ? fast_match(fast, text, length, at) : 0;
    if (fast_end) {
      WK_TRY(split_level(pt, s, level + 1, text + at, fast_end - at, piece, context));
      done = at = fast_end;
      continue;
    }
    /* pcre2_jit_match skips pcre2_match's checks of what was checked at compile time. */
    int rc = pt->jit[level] ? pcre2_jit_match(re, text, length, at, PCRE2_NO_UTF_CHECK, s->match, s->context)
                            : pcre2_match(re, text, length, at, PCRE2_NO_UTF_CHECK, s->match, s->context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[ERROR_MESSAGE_BYTES];
      pcre2_get_error_message(rc, message, sizeof message);
      return WK_FAIL(WK_ERR_UNSUPPORTED, "pre-tokenizer regex failed on a piece of %zu bytes at byte %zu: %s", length,
                     at, (const char *)message);
    }
    const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->match);
    size_t start = ov[0], end = ov[1];
    if (end == start) { /* empty: a cut here (Hugging Face's Isolated split); look again one character on */
      if (start >= length) break;
      if (gaps && start > done) WK_TRY(split_level(pt, s, level + 1, text + done, start - done, piece, context));
      done = start;
      at = start + utf8_length(text[start]);
      continue;
    }
    if (gaps && start > done) WK_TRY(split_level(pt, s, level + 1, text + done, start - done, piece, context));
    WK_TRY(split_level(pt, s, level + 1, text + start, end - start, piece, context));
    done = at = end;
  }
  if (gaps && done < length) WK_TRY(split_level(pt, s, level + 1, text + done, length - done, piece, context));
  return WK_OK;
}

WkStatus pretokenize(const Pretokenizer *pt, PretokenizeState *s, const uint8_t *text, size_t length,
                     PieceFn piece, void *context) {
  if (length == 0) return WK_OK;
  return split_level(pt, s, 0, text, length, piece, context);
}

/* ---- Metaspace --------------------------------------------------------------------------------- */

WkStatus metaspace_split(const Metaspace *m, WkByteVec *buffer, const uint8_t *text, size_t length, bool starts_text,
                         PieceFn piece, void *context) {
  const uint8_t *rep = m->replacement;
  size_t r = m->replacement_length;
  buffer->length = 0;
  bool prepend = m->prepend == PREPEND_ALWAYS || (m->prepend == PREPEND_FIRST && starts_text);
  /* Spaces become the replacement first: a piece that starts with one has its replacement. */
  if (prepend && length && text[0] != ' ' && !(length >= r && memcmp(text, rep, r) == 0))
    WK_TRY(wk_byte_vec_append(buffer, rep, r));
  WK_TRY(replace_all(buffer, text, length, (const uint8_t *)" ", 1, rep, r));
  const uint8_t *s = buffer->data;
  size_t n = buffer->length;
  if (!m->split || n == 0) return piece(context, s, n);
  /* A piece begins at each run of replacements (Hugging Face's MergedWithNext). */
  size_t start = 0;
  bool previous = false;
  for (size_t at = 0; at < n;) {
    bool is_rep = n - at >= r && memcmp(s + at, rep, r) == 0;
    if (is_rep && !previous && at > start) {
      WK_TRY(piece(context, s + start, at - start));
      start = at;
    }
    previous = is_rep;
    at += is_rep ? r : utf8_length(s[at]);
  }
  return piece(context, s + start, n - start);
}
