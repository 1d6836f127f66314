/*
 * lineedit.c — the `wick.host` module the REPL uses for input: line editing and history through
 * libedit (BSD-licensed, readline-compatible) on a terminal, plain fgets when input is piped.
 * The REPL logic itself (incomplete chunks, printing values) lives in lua/wick/repl.lua.
 */
#include <editline/readline.h>
#include <lauxlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host.h"

enum { PIPED_LINE_CAPACITY = 65536 };

static int host_isatty(lua_State *L) {
  lua_pushboolean(L, isatty((int)luaL_checkinteger(L, 1)));
  return 1;
}

/* readline(prompt) -> line without its newline, or nil at end of input. */
static int host_readline(lua_State *L) {
  const char *prompt = luaL_optstring(L, 1, "");
  if (isatty(STDIN_FILENO)) {
    char *line = readline(prompt);
    if (!line) return 0;
    lua_pushstring(L, line);
    free(line);
    return 1;
  }
  static char buffer[PIPED_LINE_CAPACITY];
  if (!fgets(buffer, sizeof buffer, stdin)) return 0;
  size_t length = strlen(buffer);
  if (length > 0 && buffer[length - 1] == '\n') buffer[--length] = '\0';
  lua_pushlstring(L, buffer, length);
  return 1;
}

static int host_add_history(lua_State *L) {
  add_history(luaL_checkstring(L, 1));
  return 0;
}

static int host_load_history(lua_State *L) {
  read_history(luaL_checkstring(L, 1)); /* a missing history file is the normal first run */
  return 0;
}

static int host_save_history(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  if (write_history(path) != 0) {
    lua_pushnil(L);
    lua_pushfstring(L, "cannot write history file '%s'", path);
    return 2;
  }
  lua_pushboolean(L, 1);
  return 1;
}

int luaopen_wick_host(lua_State *L) {
  static const luaL_Reg functions[] = {
      {"isatty", host_isatty},
      {"readline", host_readline},
      {"add_history", host_add_history},
      {"load_history", host_load_history},
      {"save_history", host_save_history},
      {NULL, NULL},
  };
  lua_newtable(L);
  luaL_register(L, NULL, functions);
  return 1;
}
