/*
 * runtime/host — the `run` program: embeds LuaJIT, runs recipes, the REPL and the local launcher.
 *
 * Owns: command-line parsing, locating lua/ relative to the executable, turning Lua errors into
 * exit codes, line editing for the REPL, and spawning/supervising rank processes. It is the only
 * place in Wick allowed to exit(). It links libwick.so, so Lua reaches the runtime through ffi.C.
 */
#ifndef WK_HOST_H
#define WK_HOST_H

#include <lua.h>

/* Exit codes of `run`. */
enum { EXIT_LUA_ERROR = 1, EXIT_USAGE = 2 };

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

#endif /* WK_HOST_H */
