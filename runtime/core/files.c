/*
 * files.c — opening a local file that must be a regular one. A FIFO, device or socket where a file is
 * expected would block open() or read() forever (a FIFO waits for a writer), so every reader of
 * datasets, inputs and checkpoints opens through here and gets a refusal naming what the path is.
 */
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core.h"

const char *wk_file_kind(unsigned mode) {
  switch (mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFIFO: return "a FIFO (named pipe)";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFSOCK: return "a socket";
    case S_IFLNK: return "a symbolic link";
    default: return "not a regular file";
  }
}

WkStatus wk_open_regular(const char *path, const char *what, int *fd_out, uint64_t *size_out) {
  *fd_out = -1;
  /* O_NONBLOCK: a FIFO opens at once (instead of waiting for a writer) so fstat can refuse it. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return WK_FAIL_ERRNO("open", path);
  struct stat st;
  WkStatus status = WK_OK;
  int flags;
  if (fstat(fd, &st) != 0)
    status = WK_FAIL_ERRNO("stat", path);
  else if (!S_ISREG(st.st_mode))
    status = WK_FAIL(WK_ERR_IO, "'%s' is %s, not a regular file (%s are read from regular files only)", path,
                     wk_file_kind((unsigned)st.st_mode), what);
  else if ((flags = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0)
    status = WK_FAIL_ERRNO("clear O_NONBLOCK on", path);
  if (status != WK_OK) {
    close(fd);
    return status;
  }
  *fd_out = fd;
  *size_out = (uint64_t)st.st_size;
  return WK_OK;
}
