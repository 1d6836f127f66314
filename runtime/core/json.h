/*
 * json.h — a small strict JSON reader (runtime/core/json.c), shared by the dataset index, the
 * .jsonl converter and the safetensors header. Internal: Lua never sees it.
 */
#ifndef WK_CORE_JSON_H
#define WK_CORE_JSON_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { WK_JSON_NULL, WK_JSON_FALSE, WK_JSON_TRUE, WK_JSON_NUMBER, WK_JSON_STRING, WK_JSON_ARRAY,
               WK_JSON_OBJECT } WkJsonType;

typedef struct WkJson WkJson;
struct WkJson {
  WkJsonType type;
  char *string;      /* decoded UTF-8 (STRING), or the number's text (NUMBER); NUL-terminated */
  size_t length;     /* string length */
  char *key;         /* member name when inside an object (decoded, NUL-terminated) */
  size_t key_length; /* its length (a name may hold \u0000) */
  WkJson *child;     /* first element/member */
  WkJson *next;      /* next sibling */
};

/* Parses a whole document (trailing whitespace only). Depth and size are bounded. An object with a
 * member name twice is refused (which value is meant is ambiguous). On failure the error says where
 * ("line 3 column 7: expected ':'"). Free with wk_json_free. */
WkStatus wk_json_parse(const char *text, size_t length, WkJson **out);
void wk_json_free(WkJson *value);
const WkJson *wk_json_get(const WkJson *object, const char *key);
/* A non-negative integer that fits in uint64 (no fraction, no exponent). */
bool wk_json_u64(const WkJson *value, uint64_t *out);

/* Finds the top-level string member `field` of the JSON object on a line and decodes it (UTF-8
 * validated) into scratch, setting text and text_length. Validates the whole line. Unlike
 * wk_json_parse it does not look for repeated member names: when `field` appears twice at the top
 * level, the first one is the document (the converter's hot path builds no name table). Returns true, or
 * false with a short reason ("invalid JSON at column 7: ...", "missing field 'text'", "invalid
 * UTF-8"); no thread error is set: bad lines are expected and counted, not raised. */
typedef struct {
  char *data;
  size_t capacity;
} WkScratch;
bool wk_json_line_field(const char *line, size_t length, const char *field, WkScratch *scratch, const char **text,
                        size_t *text_length, char reason[128]);

/* Length of the longest valid UTF-8 prefix; == length when all of it is valid. */
size_t wk_utf8_valid_prefix(const uint8_t *s, size_t length);

#ifdef __cplusplus
}
#endif
#endif /* WK_CORE_JSON_H */
