/*
 * signals.c — SIGUSR1 as a request to pause, for the `wick.host` module: `kill -USR1` a rank and
 * the trainer pauses every rank at the next step boundary and opens the REPL on rank 0
 * (lua/wick/train/pause.lua). The handler only sets a flag; Lua polls it between steps.
 *   watch_pause()   installs the handler (the default action, ending the process, until then)
 *   take_pause()    true once for each signal received since the last call
 */
#include <errno.h>
#include <lauxlib.h>
#include <signal.h>
#include <string.h>

#include "host.h"

static volatile sig_atomic_t pause_requested;

static void note_pause(int sig) {
  (void)sig;
  pause_requested = 1;
}

static int host_watch_pause(lua_State *L) {
  struct sigaction action = {.sa_handler = note_pause};
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART; /* a rank blocked in a read or a collective goes on waiting */
  if (sigaction(SIGUSR1, &action, NULL) != 0)
    return luaL_error(L, "wick.host.watch_pause: sigaction(SIGUSR1) failed: %s", strerror(errno));
  return 0;
}

static int host_take_pause(lua_State *L) {
  lua_pushboolean(L, pause_requested);
  pause_requested = 0;
  return 1;
}

void host_register_signals(lua_State *L) {
  lua_pushcfunction(L, host_watch_pause);
  lua_setfield(L, -2, "watch_pause");
  lua_pushcfunction(L, host_take_pause);
  lua_setfield(L, -2, "take_pause");
}
