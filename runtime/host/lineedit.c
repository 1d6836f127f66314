/*
 * lineedit.c — the `wick.host` module the REPL uses for input: line editing and history through
 * libedit (BSD-licensed, readline-compatible) on a terminal, plain fgets when input is piped. The
 * module also carries file_kind (files.c).
 * The REPL logic itself (incomplete chunks, printing values) lives in lua/wick/repl.lua.
 */
#include <editline/readline.h>
#include <lauxlib.h>
#include <signal.h>
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

/* Set by Ctrl-C at the prompt (see host_ignore_interrupts). */
static volatile sig_atomic_t interrupt_seen;

/* readline(prompt) -> line without its newline; nil at end of input; nil, "interrupted" when
 * Ctrl-C abandoned the line. */
static int host_readline(lua_State *L) {
  const char *prompt = luaL_optstring(L, 1, "");
  if (isatty(STDIN_FILENO)) {
    interrupt_seen = 0;
    char *line = readline(prompt);
    if (!line && interrupt_seen) {
      lua_pushnil(L);
      lua_pushliteral(L, "interrupted");
      return 2;
    }
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

/* ---- Ctrl-C while a REPL input runs ----------------------------------------------------------- */

/* As lua.c does: the signal handler only arms a hook; the hook raises "interrupted" at the next
 * call, return or instruction count in interpreted code. JIT-compiled loops never run hooks, so
 * the handler also restores the default action: a second Ctrl-C ends the process. */
static lua_State *interrupted_state;

static void raise_interrupted(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_sethook(L, NULL, 0, 0);
  luaL_error(L, "interrupted (Ctrl-C)");
}

static void on_interrupt(int sig) {
  signal(sig, SIG_DFL);
  lua_sethook(interrupted_state, raise_interrupted, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
}

/* interruptible(f, ...) -> the results of f(...): Ctrl-C raises an error inside f. */
static int host_interruptible(lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  interrupted_state = L;
  struct sigaction action = {.sa_handler = on_interrupt}, previous;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, &previous);
  int status = lua_pcall(L, lua_gettop(L) - 1, LUA_MULTRET, 0);
  sigaction(SIGINT, &previous, NULL);
  lua_sethook(L, NULL, 0, 0);
  if (status != 0) return lua_error(L);
  return lua_gettop(L);
}

static void note_interrupt(int sig) {
  (void)sig;
  interrupt_seen = 1;
}

/* ignore_interrupts(true|false): Ctrl-C at the REPL prompt abandons the line rather than ending
 * the session (readline then returns nil, "interrupted"). */
static int host_ignore_interrupts(lua_State *L) {
  struct sigaction action = {.sa_handler = lua_toboolean(L, 1) ? note_interrupt : SIG_DFL};
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, NULL);
  return 0;
}

int luaopen_wick_host(lua_State *L) {
  static const luaL_Reg functions[] = {
      {"isatty", host_isatty},
      {"readline", host_readline},
      {"add_history", host_add_history},
      {"load_history", host_load_history},
      {"save_history", host_save_history},
      {"interruptible", host_interruptible},
      {"ignore_interrupts", host_ignore_interrupts},
      {NULL, NULL},
  };
  lua_newtable(L);
  luaL_register(L, NULL, functions);
  host_register_files(L);
  return 1;
}
