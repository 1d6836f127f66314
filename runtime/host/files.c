/*
 * files.c — what a path names, for the `wick.host` module (file_kind), so that a tool can decide
 * how to take a path the user gave (a dataset directory, a .lua file to run) from what it is rather
 * than from how it is spelled, and without opening it (a FIFO would block).
 */
#include <errno.h>
#include <lauxlib.h>
#include <string.h>
#include <sys/stat.h>

#include "host.h"

/* file_kind(path) -> 'file' | 'directory' | 'other' (a FIFO, socket or device), following
 * symlinks; nil, message when the path does not exist or cannot be examined. */
static int host_file_kind(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  struct stat st;
  if (stat(path, &st) != 0) {
    lua_pushnil(L);
    lua_pushfstring(L, "'%s': %s", path, strerror(errno));
    return 2;
  }
  lua_pushstring(L, S_ISREG(st.st_mode) ? "file" : S_ISDIR(st.st_mode) ? "directory" : "other");
  return 1;
}

void host_register_files(lua_State *L) {
  lua_pushcfunction(L, host_file_kind);
  lua_setfield(L, -2, "file_kind");
}
