/*
 * terminal.c — wick.host.fit_line(text): the start of text that fits one row of stdout's terminal
 * (runtime/core/terminal.h), for a single process's progress line (lua/wick/train/runlog.lua), which
 * is cut as the launcher cuts its live line.
 */
#include <lauxlib.h>
#include <unistd.h>

#include "../core/terminal.h" /* wk_terminal_fit */
#include "host.h"

static int host_fit_line(lua_State *L) {
  size_t length;
  const char *text = luaL_checklstring(L, 1, &length);
  lua_pushlstring(L, text, wk_terminal_fit(STDOUT_FILENO, text, length));
  return 1;
}

void host_register_terminal(lua_State *L) {
  lua_pushcfunction(L, host_fit_line);
  lua_setfield(L, -2, "fit_line");
}
