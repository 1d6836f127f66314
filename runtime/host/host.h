/*
 * runtime/host — the `run` program: embeds LuaJIT, runs recipes, the REPL and the local launcher.
 *
 * Owns: command-line parsing, locating lua/ relative to the executable, turning Lua errors into
 * exit codes (a user's mistake in one line, a bug with its traceback), line editing for the REPL,
 * telling tools what a path names, SIGUSR1 as a request to pause training, and spawning/supervising rank processes. It is the only
 * place in Wick allowed to exit(). It links libwick.so, so Lua reaches the runtime through ffi.C.
 */
#ifndef WK_HOST_H
#define WK_HOST_H

#include <lua.h>

/* Exit codes of `run`, and what it prints for each.
 *   EXIT_USAGE       a usage error: one line (an unknown flag, a bad value, a bad WICK_LOG)
 *   EXIT_DATA_ERROR  a data error: one line, the runtime's message naming the file, offset and reason
 *   EXIT_LUA_ERROR   any other error (a bug): file:line: message and the Lua traceback
 * A user's mistake is one line, without a traceback unless WICK_LOG=debug. It is either a Lua error
 * object that is a table with a string `message` and an integer `exit_code` (raised by wick.cli), or
 * a runtime failure raised as a Lua error (its message ends with wk_last_error()) whose status is
 * WK_ERR_FORMAT or WK_ERR_IO, or WK_ERR_INVALID_ARG while a command-line tool runs (wick.cli sets
 * wick.host.tool to its name, and what the runtime refuses is then the user's argument). */
enum { EXIT_LUA_ERROR = 1, EXIT_DATA_ERROR = 1, EXIT_USAGE = 2 };

/* ---- launch.c: N local ranks of the same command --------------------------------------------- */
typedef struct {
  int nproc_per_node;       /* ranks on this node */
  int nnodes;               /* nodes in the job */
  int node_rank;            /* this node's index */
  const char *master_addr;  /* rank 0's host, for the rendezvous store */
  int master_port;          /* 0: pick a free port (single node only) */
} LaunchConfig;

/* Starts the ranks (each runs `exe child_argv[1..]`), prefixes their output, forwards Ctrl-C,
 * stops all when one fails. Returns the exit code for `run`. */
int launch_ranks(const LaunchConfig *config, const char *exe, char **child_argv);

/* ---- lineedit.c: the `wick.host` Lua module (readline, history, isatty) ------------------------ */
int luaopen_wick_host(lua_State *L);

/* ---- files.c: wick.host.file_kind(path), added to the module table on top of the stack -------- */
void host_register_files(lua_State *L);

/* ---- signals.c: wick.host.watch_pause() and take_pause() (SIGUSR1 pauses training) ------------- */
void host_register_signals(lua_State *L);

/* ---- terminal.c: wick.host.fit_line(text), what fits a row of stdout's terminal ------------------ */
void host_register_terminal(lua_State *L);

#endif /* WK_HOST_H */
