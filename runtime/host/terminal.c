/*
 * terminal.c — how much of a line fits one row of the terminal on stdout, for the two progress lines
 * that are redrawn in place: the launcher's live line (launch.c) and a single process's own
 * (lua/wick/train/runlog.lua, through wick.host.fit_line). A line wider than the terminal wraps, and
 * the \r that starts its redraw reaches back only to the last row, so each redraw left a trail.
 */
#include <lauxlib.h>
#include <stdlib.h>
#include <sys/ioctl.h> /* TIOCGWINSZ */
#include <unistd.h>

#include "host.h"

enum { DEFAULT_COLUMNS = 80 };

/* The columns of stdout's terminal; COLUMNS where it reports none (not a terminal), else 80. */
static size_t terminal_columns(void) {
  struct winsize size;
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 1) return size.ws_col;
  const char *columns = getenv("COLUMNS");
  char *end;
  long n = columns ? strtol(columns, &end, 10) : 0;
  return columns && *columns && *end == '\0' && n > 1 && n < 100000 ? (size_t)n : DEFAULT_COLUMNS;
}

size_t host_fit_line(const char *text, size_t length) {
  size_t width = terminal_columns() - 1; /* the last column left free: some terminals wrap on filling it */
  size_t n = length < width ? length : width;
  while (n > 0 && n < length && ((unsigned char)text[n] & 0xc0) == 0x80) n--; /* not inside a UTF-8 character */
  return n;
}

/* fit_line(text) -> the start of text that fits one row of the terminal (bytes: the progress lines
 * are ASCII, and a UTF-8 character is never cut). */
static int host_fit_line_lua(lua_State *L) {
  size_t length;
  const char *text = luaL_checklstring(L, 1, &length);
  lua_pushlstring(L, text, host_fit_line(text, length));
  return 1;
}

void host_register_terminal(lua_State *L) {
  lua_pushcfunction(L, host_fit_line_lua);
  lua_setfield(L, -2, "fit_line");
}
