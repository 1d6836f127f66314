/*
 * terminal.c — the width of a terminal row, and the start of a line that fits it (terminal.h).
 */
#include "terminal.h"

#include <stdlib.h>
#include <sys/ioctl.h> /* TIOCGWINSZ */

enum { DEFAULT_COLUMNS = 80, MAX_COLUMNS = 100000 };

/* The columns of fd's terminal; COLUMNS where it reports none, else 80. */
static size_t terminal_columns(int fd) {
  struct winsize size;
  if (ioctl(fd, TIOCGWINSZ, &size) == 0 && size.ws_col > 1) return size.ws_col;
  const char *columns = getenv("COLUMNS");
  if (!columns || !*columns) return DEFAULT_COLUMNS;
  char *end;
  long n = strtol(columns, &end, 10);
  return *end == '\0' && n > 1 && n < MAX_COLUMNS ? (size_t)n : DEFAULT_COLUMNS;
}

size_t wk_terminal_fit(int fd, const char *text, size_t length) {
  size_t width = terminal_columns(fd) - 1;
  size_t n = length < width ? length : width;
  while (n > 0 && n < length && ((unsigned char)text[n] & 0xc0) == 0x80) n--; /* not inside a UTF-8 character */
  return n;
}
