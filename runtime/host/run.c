/*
 * run.c — main() of the `run` program.
 *
 *   run [options] script.lua [args...]    run a recipe or any Lua file, `arg` set as in lua(1)
 *   run -e CODE [args...]                 run a chunk of code
 *   run -m MODULE [args...]               run a Lua module as a program (like python -m)
 *   run -i [script.lua [args...]]         REPL, after running the script if one is given
 *   run --nproc-per-node N ...            launch N local ranks of the rest of the command
 *   run --dry-run recipe.lua [args...]    check a recipe and plan it for the world named by
 *                                         --nproc-per-node x --nnodes (or WORLD_SIZE); no ranks start
 *
 * A script that returns a table is a recipe: wick.main.run_recipe trains it (wick.train); a value
 * other than a table, or no recipe for --dry-run, is a usage error.
 *
 * The option table below is the single source of both the parser and the help text.
 */
#include <lauxlib.h>
#include <libgen.h>
#include <limits.h>
#include <lua.h>
#include <lualib.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../wick.h"
#include "host.h"

enum { MAX_CHUNKS = 16, DEFAULT_MULTINODE_PORT = 29500, MAX_RANKS_PER_NODE = 1024,
       MESSAGE_WITH_SITE_CAPACITY = 1280, /* the runtime's message (1024) + " [file:line]" */
       MAX_EXIT_STATUS = 255 };

typedef enum { OPT_EVAL, OPT_MODULE, OPT_INTERACTIVE, OPT_VERSION, OPT_HELP, OPT_NPROC, OPT_NNODES,
               OPT_NODE_RANK, OPT_MASTER_ADDR, OPT_MASTER_PORT, OPT_DRY_RUN, OPT_END } OptionId;

typedef struct {
  OptionId id;
  const char *short_name; /* "-e" or NULL */
  const char *long_name;  /* "--nproc-per-node" or NULL */
  const char *value_name; /* NULL when the option takes no value */
  bool launcher;          /* consumed by the launcher, not passed to ranks */
  const char *help;
} Option;

static const Option options[] = {
    {OPT_EVAL, "-e", NULL, "CODE", false, "run CODE (remaining arguments become arg / ...)"},
    {OPT_MODULE, "-m", NULL, "MODULE", false, "run a Lua module as a program, e.g. -m wick.data.convert"},
    {OPT_INTERACTIVE, "-i", NULL, NULL, false, "interactive REPL (after running the script, if given)"},
    {OPT_VERSION, "-v", "--version", NULL, false, "print the version and build, then exit"},
    {OPT_HELP, "-h", "--help", NULL, false, "print this help, then exit"},
    {OPT_NPROC, NULL, "--nproc-per-node", "N", true, "start N ranks on this node (torchrun-style env)"},
    {OPT_NNODES, NULL, "--nnodes", "K", true, "number of nodes in the job (default 1)"},
    {OPT_NODE_RANK, NULL, "--node-rank", "R", true, "index of this node (default 0)"},
    {OPT_MASTER_ADDR, NULL, "--master-addr", "HOST", true, "rank 0's host (default 127.0.0.1)"},
    {OPT_MASTER_PORT, NULL, "--master-port", "PORT", true, "rendezvous port (default: free port, 29500 multi-node)"},
    {OPT_DRY_RUN, NULL, "--dry-run", NULL, true, "check the recipe and plan it for the world given; train nothing"},
    {OPT_END, "--", NULL, NULL, false, "end of options: the next argument is the script"},
};
enum { OPTION_COUNT = sizeof options / sizeof options[0] };

typedef struct {
  const char *chunks[MAX_CHUNKS]; /* -e code, in order */
  int chunk_count;
  const char *module;
  bool interactive;
  const char *script;
  char **args; /* arguments after the script / code / module */
  int arg_count;
  LaunchConfig launch;
  bool launch_requested;
  bool dry_run;
} Command;

static void print_usage(FILE *out) {
  fprintf(out,
          "usage: run [options] [script.lua [args...]]\n"
          "Wick %u.%u.%u — a Lua-scriptable training runtime (see README.md)\n\n",
          WK_VERSION_MAJOR, WK_VERSION_MINOR, WK_VERSION_PATCH);
  for (int i = 0; i < OPTION_COUNT; i++) {
    const Option *o = &options[i];
    char names[64];
    snprintf(names, sizeof names, "%s%s%s%s%s", o->short_name ? o->short_name : "",
             o->short_name && o->long_name ? ", " : "", o->long_name ? o->long_name : "",
             o->value_name ? " " : "", o->value_name ? o->value_name : "");
    fprintf(out, "  %-24s %s\n", names, o->help);
  }
  fprintf(out, "\nWithout a script, -e or -m: the REPL on a terminal, else the program read from stdin.\n"
               "Environment: WICK_LOG=error|warn|info|debug (default warn; debug adds tracebacks to one-line errors).\n");
}

static int usage_error(const char *fmt, const char *detail) {
  fprintf(stderr, "run: ");
  fprintf(stderr, fmt, detail);
  fprintf(stderr, "\n");
  print_usage(stderr);
  return EXIT_USAGE;
}

static const Option *find_option(const char *word) {
  for (int i = 0; i < OPTION_COUNT; i++) {
    const Option *o = &options[i];
    if ((o->short_name && strcmp(word, o->short_name) == 0) || (o->long_name && strcmp(word, o->long_name) == 0))
      return o;
  }
  return NULL;
}

static bool parse_int(const char *text, int min, int max, int *out) {
  char *end;
  long value = strtol(text, &end, 10);
  if (*text == '\0' || *end != '\0' || value < min || value > max) return false;
  *out = (int)value;
  return true;
}

/* Applies one option with its value; returns 0 or an exit code for a usage error. */
static int apply_option(Command *cmd, const Option *o, const char *value) {
  switch (o->id) {
    case OPT_EVAL:
      if (cmd->chunk_count == MAX_CHUNKS) return usage_error("too many -e options (at most %s)", "16");
      cmd->chunks[cmd->chunk_count++] = value;
      return 0;
    case OPT_MODULE: cmd->module = value; return 0;
    case OPT_INTERACTIVE: cmd->interactive = true; return 0;
    case OPT_NPROC:
      cmd->launch_requested = true;
      return parse_int(value, 1, MAX_RANKS_PER_NODE, &cmd->launch.nproc_per_node)
                 ? 0 : usage_error("--nproc-per-node needs a count from 1 to 1024, got '%s'", value);
    case OPT_NNODES:
      return parse_int(value, 1, INT_MAX / MAX_RANKS_PER_NODE, &cmd->launch.nnodes)
                 ? 0 : usage_error("--nnodes needs a positive count, got '%s'", value);
    case OPT_NODE_RANK:
      return parse_int(value, 0, INT_MAX / MAX_RANKS_PER_NODE, &cmd->launch.node_rank)
                 ? 0 : usage_error("--node-rank needs a non-negative index, got '%s'", value);
    case OPT_MASTER_ADDR: cmd->launch.master_addr = value; return 0;
    case OPT_MASTER_PORT:
      return parse_int(value, 1, 65535, &cmd->launch.master_port)
                 ? 0 : usage_error("--master-port needs a port from 1 to 65535, got '%s'", value);
    case OPT_DRY_RUN: cmd->dry_run = true; return 0;
    case OPT_VERSION: case OPT_HELP: case OPT_END: return 0;
  }
  return 0;
}

/* Parses argv into cmd. Returns -1 to go on, or an exit code (0 for --help / --version). */
static int parse_command(int argc, char **argv, Command *cmd) {
  cmd->launch = (LaunchConfig){.nproc_per_node = 1, .nnodes = 1, .node_rank = 0, .master_addr = "127.0.0.1"};
  int i = 1;
  for (; i < argc; i++) {
    const char *word = argv[i];
    if (word[0] != '-' || strcmp(word, "-") == 0) break;
    const Option *o = find_option(word);
    if (!o) return usage_error("unknown option '%s'", word);
    if (o->id == OPT_END) { i++; break; }
    if (o->id == OPT_HELP) { print_usage(stdout); return 0; }
    if (o->id == OPT_VERSION) {
      WkBuildInfo info;
      wk_build_info(&info);
      printf("Wick %u.%u.%u (%s, %s, CUDA %s)\n", info.major, info.minor, info.patch, info.build_flags,
             info.compiler, info.has_cuda ? "compiled in" : "not compiled");
      return 0;
    }
    const char *value = NULL;
    if (o->value_name) {
      if (i + 1 >= argc) return usage_error("option '%s' needs a value", word);
      value = argv[++i];
    }
    int rc = apply_option(cmd, o, value);
    if (rc) return rc;
    if (o->id == OPT_MODULE) { i++; break; } /* the rest belongs to the module */
  }
  if (cmd->launch.node_rank >= cmd->launch.nnodes)
    return usage_error("--node-rank must be smaller than --nnodes (%s)", "see --help");
  if (cmd->launch.nnodes > 1 && cmd->launch.master_port == 0) cmd->launch.master_port = DEFAULT_MULTINODE_PORT;
  if (!cmd->module && cmd->chunk_count == 0 && i < argc) cmd->script = argv[i++];
  if (cmd->module && cmd->chunk_count > 0) return usage_error("%s", "-m and -e cannot be combined");
  cmd->args = argv + i;
  cmd->arg_count = argc - i;
  return -1;
}

/* WICK_LOG names a level or is unset: `run` sets the level from it before anything runs (so the
 * library never reads it lazily), and refuses a typo rather than running at a level the user did
 * not ask for. */
static int configure_logging(void) {
  const char *name = getenv("WICK_LOG");
  WkLogLevel level = WK_LOG_WARN;
  wk_set_log_level(level);
  if (name && *name && wk_parse_log_level(name, &level) != WK_OK) {
    fprintf(stderr, "run: WICK_LOG='%s' is not one of error, warn, info, debug (unset it for the default, warn)\n",
            name);
    return EXIT_USAGE;
  }
  wk_set_log_level(level);
  return 0;
}

/* argv without the launcher's own options: what each rank runs. */
static char **rank_argv(int argc, char **argv, const char *exe) {
  char **out = calloc((size_t)argc + 1, sizeof *out);
  if (!out) return NULL;
  int n = 0;
  out[n++] = (char *)exe;
  int i = 1;
  for (; i < argc; i++) {
    const Option *o = argv[i][0] == '-' ? find_option(argv[i]) : NULL;
    if (!o) break;
    bool takes_value = o->value_name != NULL;
    if (!o->launcher) out[n++] = argv[i];
    if (takes_value && !o->launcher) out[n++] = argv[i + 1];
    if (takes_value) i++;
    if (o->id == OPT_END || o->id == OPT_MODULE) { i++; break; }
  }
  for (; i < argc; i++) out[n++] = argv[i];
  out[n] = NULL;
  return out;
}

/* ---- Lua state ---------------------------------------------------------------------------------- */

static bool file_exists(const char *path) { return access(path, R_OK) == 0; }

/* Finds the tree holding lua/wick/init.lua: next to the executable (a checkout) or in
 * ../share/wick (an installed prefix). WICK_HOME overrides both. */
static bool find_home(const char *exe, char *home, size_t size) {
  const char *env = getenv("WICK_HOME");
  char probe[PATH_MAX + 64];
  if (env && *env) {
    snprintf(home, size, "%s", env);
    return true;
  }
  char exe_copy[PATH_MAX];
  snprintf(exe_copy, sizeof exe_copy, "%s", exe);
  const char *dir = dirname(exe_copy);
  const char *layouts[] = {"%s", "%s/../share/wick"};
  for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) {
    snprintf(home, size, layouts[k], dir);
    snprintf(probe, sizeof probe, "%s/lua/wick/init.lua", home);
    if (file_exists(probe)) return true;
  }
  return false;
}

static void set_package_path(lua_State *L, const char *home) {
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "path");
  /* lua/ holds the sources; build/lua/ the generated ffi.cdef (an install merges both into lua/). */
  lua_pushfstring(L, "%s/lua/?.lua;%s/lua/?/init.lua;%s/build/lua/?.lua;%s", home, home, home,
                  lua_tostring(L, -1));
  lua_setfield(L, -3, "path");
  lua_pop(L, 2);
  /* The module names that changed keep loading for a release (lua/wick/renamed.lua). An install
   * that lacks the file says so here instead of aborting in an unprotected call. */
  lua_getglobal(L, "require");
  lua_pushstring(L, "wick.renamed");
  if (lua_pcall(L, 1, 0, 0) != 0) {
    fprintf(stderr, "run: %s\n", lua_tostring(L, -1));
    lua_pop(L, 1);
  }
}

static void register_host_module(lua_State *L, const char *exe, const char *home) {
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "preload");
  lua_pushcfunction(L, luaopen_wick_host);
  lua_setfield(L, -2, "wick.host");
  lua_pop(L, 2);
  /* wick.host also tells Lua where it runs from, for tools that start more processes. */
  lua_getglobal(L, "require");
  lua_pushstring(L, "wick.host");
  lua_call(L, 1, 1);
  lua_pushstring(L, exe);
  lua_setfield(L, -2, "exe");
  lua_pushstring(L, home);
  lua_setfield(L, -2, "home");
  lua_pop(L, 1);
}

/* wick.host.dry_run = the world to plan for (0: WORLD_SIZE, or 1), and dry_run_local its ranks on
 * this machine (0: LOCAL_WORLD_SIZE, or 1): recipes check and plan only. */
static void set_dry_run(lua_State *L, int world, int local) {
  lua_getglobal(L, "require");
  lua_pushstring(L, "wick.host");
  lua_call(L, 1, 1);
  lua_pushinteger(L, world);
  lua_setfield(L, -2, "dry_run");
  lua_pushinteger(L, local);
  lua_setfield(L, -2, "dry_run_local");
  lua_pop(L, 1);
}

/* ---- errors: a user's mistake in one line, a bug with its traceback (host.h) ---------------- */

/* The exit status for the error being reported, chosen by the message handler. */
static int failure_exit_code = EXIT_LUA_ERROR;

static bool ends_with(const char *text, const char *suffix) {
  size_t n = strlen(text), k = strlen(suffix);
  return k > 0 && k <= n && memcmp(text + n - k, suffix, k) == 0;
}

/* The name of the command-line tool running (wick.host.tool, set by wick.cli), or NULL. */
static const char *running_tool(lua_State *L) {
  lua_getglobal(L, "package");
  if (!lua_istable(L, -1)) { lua_pop(L, 1); return NULL; }
  lua_getfield(L, -1, "loaded");
  if (!lua_istable(L, -1)) { lua_pop(L, 2); return NULL; }
  lua_getfield(L, -1, "wick.host");
  const char *tool = NULL;
  if (lua_istable(L, -1)) {
    lua_getfield(L, -1, "tool");
    tool = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL; /* the string stays in wick.host */
    lua_pop(L, 1);
  }
  lua_pop(L, 3);
  return tool;
}

/* A user error object: a table with a string `message` and an integer `exit_code` (wick.cli).
 * Pushes the message and returns true, setting *code. */
static bool push_user_error(lua_State *L, int *code) {
  if (!lua_istable(L, 1)) return false;
  lua_getfield(L, 1, "message");
  lua_getfield(L, 1, "exit_code");
  lua_Integer status = lua_tointeger(L, -1);
  bool is_user = lua_type(L, -2) == LUA_TSTRING && lua_type(L, -1) == LUA_TNUMBER && status > 0 &&
                 status <= MAX_EXIT_STATUS;
  if (is_user) *code = (int)status;
  lua_pop(L, 1);
  if (!is_user) lua_pop(L, 1);
  return is_user;
}

/* A failure of the runtime raised as a Lua error (its message ends with wk_last_error(), plus the
 * " [site]" of WICK_LOG=debug) that is the user's: data that cannot be read (WK_ERR_FORMAT,
 * WK_ERR_IO), a server or peer that failed or did not answer in time (WK_ERR_NETWORK,
 * WK_ERR_TIMEOUT: the message names it, and a script's keeps the line that waited), or a tool's
 * argument the runtime refused (WK_ERR_INVALID_ARG while a tool runs).
 * Pushes the runtime's message, named by the tool, and returns true, setting *code. */
static bool push_runtime_user_error(lua_State *L, int *code) {
  const char *message = lua_tostring(L, 1);
  const char *last = wk_last_error();
  if (!message || !last[0]) return false;
  char with_site[MESSAGE_WITH_SITE_CAPACITY];
  snprintf(with_site, sizeof with_site, "%s [%s]", last, wk_last_error_site());
  if (!ends_with(message, last) && !ends_with(message, with_site)) return false;
  WkStatus status = wk_last_status();
  const char *tool = running_tool(L);
  bool peer = status == WK_ERR_NETWORK || status == WK_ERR_TIMEOUT;
  if (status == WK_ERR_FORMAT || status == WK_ERR_IO || peer) {
    *code = EXIT_DATA_ERROR;
  } else if (status == WK_ERR_INVALID_ARG && tool) {
    *code = EXIT_USAGE;
  } else {
    return false;
  }
  if (tool)
    lua_pushfstring(L, "%s: %s", tool, last);
  else if (peer)
    lua_pushvalue(L, 1); /* a script's line that waited on the peer stays in front */
  else
    lua_pushstring(L, last);
  return true;
}

/* The message handler of every protected call: decides the exit status and what is printed. */
static int message_handler(lua_State *L) {
  int code = EXIT_LUA_ERROR;
  bool user = push_user_error(L, &code) || push_runtime_user_error(L, &code);
  failure_exit_code = code;
  if (user && wk_log_level() < WK_LOG_DEBUG) return 1;
  const char *message = user ? lua_tostring(L, -1) : lua_tostring(L, 1);
  if (!message) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
    message = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  luaL_traceback(L, L, message, 1);
  return 1;
}

/* Calls the function sitting below its nargs arguments, with a traceback on error. */
static int protected_call(lua_State *L, int nargs, int nresults) {
  int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, message_handler);
  lua_insert(L, base);
  failure_exit_code = EXIT_LUA_ERROR;
  int rc = lua_pcall(L, nargs, nresults, base);
  lua_remove(L, base);
  return rc;
}

static int report(lua_State *L, int rc) {
  if (rc != 0) {
    const char *message = lua_tostring(L, -1);
    fprintf(stderr, "%s\n", message ? message : "(error without a message)");
    lua_pop(L, 1);
    return rc == LUA_ERRRUN ? failure_exit_code : EXIT_LUA_ERROR;
  }
  return 0;
}

static void set_arg_table(lua_State *L, const char *exe, const char *name, char **args, int count) {
  lua_createtable(L, count, 2);
  lua_pushstring(L, exe);
  lua_rawseti(L, -2, -1);
  lua_pushstring(L, name);
  lua_rawseti(L, -2, 0);
  for (int i = 0; i < count; i++) {
    lua_pushstring(L, args[i]);
    lua_rawseti(L, -2, i + 1);
  }
  lua_setglobal(L, "arg");
}

static int push_args(lua_State *L, char **args, int count) {
  luaL_checkstack(L, count, "too many arguments");
  for (int i = 0; i < count; i++) lua_pushstring(L, args[i]);
  return count;
}

/* Loads a script; a missing or unreadable file is reported with its path. */
static int load_script(lua_State *L, const char *path) {
  if (strcmp(path, "-") == 0) return luaL_loadfile(L, NULL);
  if (!file_exists(path)) {
    lua_pushfstring(L, "run: cannot open script '%s': no such file or not readable", path);
    return LUA_ERRFILE;
  }
  return luaL_loadfile(L, path);
}

/* Runs wick.main.<entry>(...) from lua/wick/main.lua: module running and the REPL are Lua. */
static int call_main_entry(lua_State *L, const char *entry, int nargs) {
  lua_getglobal(L, "require");
  lua_pushstring(L, "wick.main");
  int rc = protected_call(L, 1, 1);
  if (rc != 0) {
    lua_insert(L, -1 - nargs);
    lua_pop(L, nargs);
    return rc;
  }
  lua_getfield(L, -1, entry);
  lua_remove(L, -2);
  lua_insert(L, -1 - nargs);
  return protected_call(L, nargs, 0);
}

static int run_command(lua_State *L, const Command *cmd, const char *exe) {
  int rc = 0;
  const char *name = cmd->script ? cmd->script : cmd->module ? cmd->module : "-e";
  set_arg_table(L, exe, name, cmd->args, cmd->arg_count);
  for (int c = 0; c < cmd->chunk_count && rc == 0; c++) {
    rc = luaL_loadbuffer(L, cmd->chunks[c], strlen(cmd->chunks[c]), "=(command line)");
    if (rc == 0) rc = protected_call(L, push_args(L, cmd->args, cmd->arg_count), 0);
  }
  if (rc == 0 && cmd->module) {
    lua_pushstring(L, cmd->module);
    rc = call_main_entry(L, "run_module", 1 + push_args(L, cmd->args, cmd->arg_count));
  }
  bool read_stdin = !cmd->script && !cmd->module && cmd->chunk_count == 0 && !cmd->interactive &&
                    !isatty(STDIN_FILENO);
  const char *script = read_stdin ? "-" : cmd->script;
  int script_results = 0;
  if (rc == 0 && script) {
    rc = load_script(L, script);
    if (rc == 0) {
      int top = lua_gettop(L) - 1;
      rc = protected_call(L, push_args(L, cmd->args, cmd->arg_count), LUA_MULTRET);
      script_results = rc == 0 ? lua_gettop(L) - top : 0;
    }
  }
  if (rc == 0 && (cmd->interactive || (!script && !cmd->module && cmd->chunk_count == 0))) {
    lua_pushinteger(L, script_results); /* the REPL keeps a script's return value as `recipe` */
    lua_insert(L, -1 - script_results);
    rc = call_main_entry(L, "repl", 1 + script_results);
  } else if (rc == 0 && (cmd->dry_run || (script_results > 0 && !lua_isnil(L, -script_results)))) {
    /* a recipe, or what a script meant as one returned (nothing for --dry-run, a number):
     * wick.main.run_recipe(path, value, args...) trains it or says what is wrong with it */
    if (script_results == 0) lua_pushnil(L);
    else lua_pop(L, script_results - 1);
    lua_pushstring(L, script);
    lua_insert(L, -2);
    rc = call_main_entry(L, "run_recipe", 2 + push_args(L, cmd->args, cmd->arg_count));
  } else if (script_results > 0) {
    lua_pop(L, script_results);
  }
  return report(L, rc);
}

/* OpenBLAS chose its kernels when it loaded, with this process; when it fell back to pre-AVX2 ones on
 * a CPU that runs better (wk_blas_better_kernels), start again with those named, before anything
 * else happens. The variable is then set, so this happens once, and every rank inherits it. */
static void run_on_better_blas_kernels(char **argv) {
  const char *kernels = wk_blas_better_kernels();
  if (!kernels || setenv("OPENBLAS_CORETYPE", kernels, 1) != 0) return;
  execv("/proc/self/exe", argv);
  unsetenv("OPENBLAS_CORETYPE");  /* not started again: go on with OpenBLAS's pick */
}

int main(int argc, char **argv) {
  run_on_better_blas_kernels(argv);
  /* Logs must reach a supervisor promptly, also when stdout is a pipe. */
  setvbuf(stdout, NULL, _IOLBF, 0);
  Command cmd = {0};
  int parsed = parse_command(argc, argv, &cmd);
  if (parsed >= 0) return parsed;
  int log_refused = configure_logging();
  if (log_refused) return log_refused;

  char exe[PATH_MAX];
  ssize_t length = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (length <= 0) {
    fprintf(stderr, "run: cannot find my own executable through /proc/self/exe\n");
    return EXIT_FAILURE;
  }
  exe[length] = '\0';

  if (cmd.launch_requested && !cmd.dry_run) {
    char **child_argv = rank_argv(argc, argv, exe);
    if (!child_argv) return EXIT_FAILURE;
    int code = launch_ranks(&cmd.launch, exe, child_argv);
    free(child_argv);
    return code;
  }

  char home[PATH_MAX];
  if (!find_home(exe, home, sizeof home)) {
    fprintf(stderr, "run: cannot find lua/wick/init.lua next to %s or in ../share/wick; set WICK_HOME\n", exe);
    return EXIT_FAILURE;
  }
  lua_State *L = luaL_newstate();
  if (!L) {
    fprintf(stderr, "run: cannot create a Lua state (out of memory)\n");
    return EXIT_FAILURE;
  }
  luaL_openlibs(L);
  set_package_path(L, home);
  register_host_module(L, exe, home);
  if (cmd.dry_run)
    set_dry_run(L, cmd.launch_requested ? cmd.launch.nproc_per_node * cmd.launch.nnodes : 0,
                cmd.launch_requested ? cmd.launch.nproc_per_node : 0);
  int code = run_command(L, &cmd, exe);
  lua_close(L);
  return code;
}
