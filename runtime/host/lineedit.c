/*
 * lineedit.c — the `wick.host` module the REPL uses for input: line editing and history through
 * libedit (BSD-licensed, readline-compatible) on a terminal, plain fgets when input is piped. The
 * module also carries file_kind (files.c), the pause signal (signals.c) and fit_line (terminal.c).
 * The REPL logic itself (incomplete chunks, printing values) lives in lua/wick/repl.lua.
 */
#include <editline/readline.h>
#include <errno.h>
#include <fcntl.h>     /* open */
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

/* ---- a rank's terminal: the REPL of a paused run ------------------------------------------------- */

/* A rank started by the launcher runs in its own process group, in the background of the terminal
 * its stdin names, and its stdout is a pipe to the launcher. take_terminal() opens /dev/tty (once:
 * libedit keeps the streams it first read from), makes this process group the terminal's
 * foreground (with SIGTTOU blocked, as job-control shells do) and points libedit at the terminal,
 * so the prompt and the typed line are on the terminal itself. give_back_terminal() hands the
 * foreground back to whoever had it. */
static FILE *tty_stream;
static pid_t previous_foreground = -1;

static int set_foreground(int fd, pid_t group) {
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGTTOU);
  sigprocmask(SIG_BLOCK, &block, &old);
  int rc = tcsetpgrp(fd, group);
  int saved = errno;
  sigprocmask(SIG_SETMASK, &old, NULL);
  errno = saved;
  return rc;
}

/* take_terminal() -> true, or false and why not (no terminal: the caller reads stdin as it is). */
static int host_take_terminal(lua_State *L) {
  if (!isatty(STDIN_FILENO)) {
    lua_pushboolean(L, 0);
    lua_pushliteral(L, "standard input is not a terminal");
    return 2;
  }
  if (!tty_stream) {
    int fd = open("/dev/tty", O_RDWR | O_CLOEXEC);
    if (fd < 0 || !(tty_stream = fdopen(fd, "r+"))) {
      if (fd >= 0) close(fd);
      lua_pushboolean(L, 0);
      lua_pushfstring(L, "cannot open /dev/tty: %s", strerror(errno));
      return 2;
    }
  }
  int fd = fileno(tty_stream);
  previous_foreground = tcgetpgrp(fd);
  if (previous_foreground != getpgrp() && set_foreground(fd, getpgrp()) != 0) {
    lua_pushboolean(L, 0);
    lua_pushfstring(L, "cannot take the terminal's foreground (tcsetpgrp): %s", strerror(errno));
    return 2;
  }
  rl_instream = tty_stream;
  rl_outstream = tty_stream;
  lua_pushboolean(L, 1);
  return 1;
}

static int host_give_back_terminal(lua_State *L) {
  if (tty_stream && previous_foreground > 0 && previous_foreground != getpgrp() &&
      set_foreground(fileno(tty_stream), previous_foreground) != 0)
    return luaL_error(L, "wick.host.give_back_terminal: tcsetpgrp: %s", strerror(errno));
  previous_foreground = -1;
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
      {"take_terminal", host_take_terminal},
      {"give_back_terminal", host_give_back_terminal},
      {NULL, NULL},
  };
  lua_newtable(L);
  luaL_register(L, NULL, functions);
  host_register_files(L);
  host_register_signals(L);
  host_register_terminal(L);
  return 1;
}
