/*
 * bytelevel.c — GPT-2's byte-level alphabet: each of the 256 bytes stands for one printable
 * character (tokenizer.json vocabularies and merges are written in it, "Ġthe" for " the").
 *
 * Bytes that are printable Latin-1 (! .. ~, ¡ .. ¬, ® .. ÿ) stand for themselves; the other 68, in
 * byte order, for U+0100 onwards (GPT-2's bytes_to_unicode).
 */
#include "bpe.h"

enum { SHIFTED_BASE = 0x100, SHIFTED_COUNT = 68 };

static bool printable(uint32_t c) { return (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF); }

/* The character of byte b. */
static uint32_t char_of(uint8_t b) {
  if (printable(b)) return b;
  uint32_t n = 0;  /* how many non-printable bytes come before b */
  for (uint32_t k = 0; k < b; k++) n += !printable(k);
  return SHIFTED_BASE + n;
}

int bytelevel_byte(uint32_t codepoint) {
  if (codepoint < SHIFTED_BASE) return printable(codepoint) ? (int)codepoint : -1;
  if (codepoint >= SHIFTED_BASE + SHIFTED_COUNT) return -1;
  uint32_t n = codepoint - SHIFTED_BASE;
  for (uint32_t b = 0; b < 256; b++)
    if (!printable(b) && n-- == 0) return (int)b;
  return -1;
}

size_t bytelevel_char(uint8_t b, uint8_t out[2]) {
  uint32_t c = char_of(b);
  if (c < 0x80) {
    out[0] = (uint8_t)c;
    return 1;
  }
  out[0] = (uint8_t)(0xC0 | (c >> 6));
  out[1] = (uint8_t)(0x80 | (c & 0x3F));
  return 2;
}

/* One UTF-8 character of valid text (JSON strings are validated): its code point and length. */
static uint32_t next_char(const uint8_t *s, size_t available, size_t *length) {
  uint8_t c = s[0];
  size_t n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
  if (n > available) n = available;
  uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1Fu) : n == 3 ? (c & 0x0Fu) : (c & 0x07u);
  for (size_t i = 1; i < n; i++) cp = (cp << 6) | (s[i] & 0x3Fu);
  *length = n;
  return cp;
}

size_t bytelevel_decode(const char *text, size_t length, uint8_t *out) {
  const uint8_t *s = (const uint8_t *)text;
  size_t i = 0, n = 0;
  while (i < length) {
    size_t k;
    uint32_t cp = next_char(s + i, length - i, &k);
    int b = bytelevel_byte(cp);
    if (b >= 0) out[n++] = (uint8_t)b;
    else
      for (size_t j = 0; j < k; j++) out[n++] = s[i + j];
    i += k;
  }
  return n;
}
