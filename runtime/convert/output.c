/*
 * output.c — the converter's output directory: a lock, a staging directory the run writes into, and
 * the swap that publishes it, so an existing dataset stays whole and readable until its replacement
 * is complete.
 *
 * For an output directory D in parent P (names resolved, symlinks followed):
 *   P/.D.lock         flock'd for the whole run; holds the converter's pid. A second converter into D
 *                     fails at once naming that pid. Removed by its holder at the end.
 *   P/.D.converting   the staging directory: shards and index.json of this run. A run that fails or
 *                     is killed leaves it; the next run into D reclaims it (--resume keeps the shards
 *                     in it that match, otherwise it is emptied first).
 *   P/.D.old          the replaced dataset, between the swap and its removal.
 * Publishing exchanges staging and D in one renameat2(RENAME_EXCHANGE) (two renames where the file
 * system cannot exchange), then removes the old dataset's files. Files in D that the converter did not
 * write (anything but index.json, shard-*.wks and their .tmp files) are moved into the new D, never
 * deleted. A run killed at any point leaves D either old or new, whole; the next run finishes
 * whatever cleanup was cut short.
 *
 * Not here: writing shards (shard_writer.c) and the index (convert.c).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>     /* AT_FDCWD, open */
#include <inttypes.h>
#include <limits.h>    /* PATH_MAX */
#include <stdio.h>     /* renameat2, RENAME_EXCHANGE */
#include <stdlib.h>    /* realpath */
#include <string.h>
#include <sys/file.h>  /* flock */
#include <sys/stat.h>
#include <unistd.h>

#include "convert.h"

enum {
  LOCK_TRIES = 100,  /* a lock file removed by its holder between our open and flock: open it again */
  PID_TEXT_BYTES = 32,
};

static char *joined(const char *dir, const char *prefix, const char *name, const char *suffix) {
  size_t n = strlen(dir) + strlen(prefix) + strlen(name) + strlen(suffix) + 2;
  char *p = wk_malloc(n, "path");
  if (p) snprintf(p, n, "%s/%s%s%s", dir, prefix, name, suffix);
  return p;
}

static WkStatus make_dirs(const char *path) {
  char *copy = strdup(path);
  if (!copy) return WK_FAIL(WK_ERR_NOMEM, "out of memory");
  WkStatus status = WK_OK;
  for (char *p = copy + 1;; p++) {
    if (*p == '/' || *p == '\0') {
      char saved = *p;
      *p = '\0';
      if (mkdir(copy, 0777) != 0 && errno != EEXIST) {
        status = WK_FAIL_ERRNO("create directory", copy);
        break;
      }
      *p = saved;
      if (saved == '\0') break;
    }
  }
  free(copy);
  struct stat st;
  if (status == WK_OK && (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)))
    status = WK_FAIL(WK_ERR_IO, "'%s' exists and is not a directory", path);
  return status;
}

static bool exists(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0;
}

/* ---- which files are the converter's ----------------------------------------------------------- */

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

static bool is_shard_name(const char *name) {
  return strncmp(name, "shard-", 6) == 0 && (ends_with(name, ".wks") || ends_with(name, ".wks.tmp"));
}

/* What a conversion writes (and so may delete): index.json, shard-*.wks and their temporaries. */
static bool is_dataset_file(const char *name) {
  return strcmp(name, "index.json") == 0 || strcmp(name, "index.json.tmp") == 0 || is_shard_name(name);
}

/* Is name one of the first `shards` shards of a finished conversion (or its index)? */
static bool is_published(const char *name, uint32_t shards) {
  if (strcmp(name, "index.json") == 0) return true;
  unsigned number;
  char again[32];
  if (sscanf(name, "shard-%u.wks", &number) != 1 || number >= shards) return false;
  snprintf(again, sizeof again, "shard-%05u.wks", number);
  return strcmp(again, name) == 0;
}

/* Removes the dataset files of dir, but (keep_published) index.json and the first keep_shards shards. */
static WkStatus remove_dataset_files(const char *dir, uint32_t keep_shards, bool keep_published) {
  DIR *d = opendir(dir);
  if (!d) return errno == ENOENT ? WK_OK : WK_FAIL_ERRNO("open directory", dir);
  WkStatus status = WK_OK;
  struct dirent *entry;
  while (status == WK_OK && (errno = 0, entry = readdir(d)) != NULL) {
    const char *name = entry->d_name;
    if (!is_dataset_file(name) || (keep_published && is_published(name, keep_shards))) continue;
    char *path = joined(dir, "", name, "");
    if (!path) status = WK_ERR_NOMEM;
    else if (unlink(path) != 0 && errno != ENOENT) status = WK_FAIL_ERRNO("remove", path);
    free(path);
  }
  if (status == WK_OK && errno != 0) status = WK_FAIL_ERRNO("read directory", dir);
  closedir(d);
  return status;
}

/* Finishes replacing a dataset: the files of the old one (at o->old) that the converter did not write
 * move into the new one, its dataset files are removed, and the directory goes. What cannot be moved
 * (the new directory already has that name) stays, with a warning. */
static WkStatus remove_old(const ConvertOutput *o) {
  DIR *d = opendir(o->old);
  if (!d) return errno == ENOENT ? WK_OK : WK_FAIL_ERRNO("open directory", o->old);
  WkStatus status = WK_OK;
  struct dirent *entry;
  while (status == WK_OK && (errno = 0, entry = readdir(d)) != NULL) {
    const char *name = entry->d_name;
    if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0 || is_dataset_file(name)) continue;
    char *from = joined(o->old, "", name, ""), *to = joined(o->dir, "", name, "");
    if (!from || !to) status = WK_ERR_NOMEM;
    else if (exists(to)) wk_logf(WK_LOG_WARN, "converter: left '%s' in place: '%s' already exists", from, to);
    else if (rename(from, to) != 0) status = WK_FAIL_ERRNO("move into the new dataset", from);
    free(from), free(to);
  }
  if (status == WK_OK && errno != 0) status = WK_FAIL_ERRNO("read directory", o->old);
  closedir(d);
  if (status == WK_OK) status = remove_dataset_files(o->old, 0, false);
  if (status == WK_OK && rmdir(o->old) != 0)
    wk_logf(WK_LOG_WARN, "converter: cannot remove '%s' (%s); what is left there is not part of any dataset",
            o->old, strerror(errno));
  return status;
}

/* ---- resolving the names ------------------------------------------------------------------------ */

/* o->dir: the output directory as an absolute path with symlinks resolved (its parent created when
 * it does not exist yet), and the names next to it. */
static WkStatus resolve(const char *out_dir, ConvertOutput *o) {
  char *given = strdup(out_dir);
  if (!given) return WK_FAIL(WK_ERR_NOMEM, "out of memory");
  for (size_t n = strlen(given); n > 1 && given[n - 1] == '/'; n--) given[n - 1] = '\0';
  WkStatus status = WK_OK;
  char resolved[PATH_MAX];
  struct stat st;
  if (stat(given, &st) == 0) {
    if (!S_ISDIR(st.st_mode))
      status = WK_FAIL(WK_ERR_IO, "output '%s' exists and is %s, not a directory", out_dir,
                       wk_file_kind((unsigned)st.st_mode));
    else if (!realpath(given, resolved))
      status = WK_FAIL_ERRNO("resolve", given);
  } else {
    char *slash = strrchr(given, '/');
    const char *name = slash ? slash + 1 : given;
    char *parent = slash ? strndup(given, (size_t)(slash - given) + (slash == given)) : strdup(".");
    if (!parent) status = WK_FAIL(WK_ERR_NOMEM, "out of memory");
    else if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
      status = WK_FAIL(WK_ERR_INVALID_ARG, "output '%s': name a directory to create", out_dir);
    if (status == WK_OK) status = make_dirs(parent);
    char base[PATH_MAX];
    if (status == WK_OK && !realpath(parent, base)) status = WK_FAIL_ERRNO("resolve", parent);
    if (status == WK_OK && (size_t)snprintf(resolved, sizeof resolved, "%s%s%s", base,
                                            strcmp(base, "/") == 0 ? "" : "/", name) >= sizeof resolved)
      status = WK_FAIL(WK_ERR_INVALID_ARG, "output '%s': path too long", out_dir);
    free(parent);
  }
  free(given);
  WK_TRY(status);
  char *slash = strrchr(resolved, '/');
  if (!slash || !slash[1]) return WK_FAIL(WK_ERR_INVALID_ARG, "output '%s': cannot replace '/'", out_dir);
  const char *name = slash + 1;
  char *parent = strndup(resolved, (size_t)(slash - resolved) + (slash == resolved));
  o->dir = strdup(resolved);
  o->staging = parent ? joined(parent, ".", name, ".converting") : NULL;
  o->old = parent ? joined(parent, ".", name, ".old") : NULL;
  o->lock_path = parent ? joined(parent, ".", name, ".lock") : NULL;
  struct stat parent_st;
  if (parent && o->dir && stat(parent, &parent_st) == 0 && stat(o->dir, &st) == 0 && st.st_dev != parent_st.st_dev)
    status = WK_FAIL(WK_ERR_INVALID_ARG, "output '%s' is a mount point; the converter builds next to the output "
                     "and swaps it in, so give a directory inside it (-o %s/dataset)", out_dir, o->dir);
  free(parent);
  if (status == WK_OK && (!o->dir || !o->staging || !o->old || !o->lock_path))
    status = WK_FAIL(WK_ERR_NOMEM, "out of memory");
  return status;
}

/* ---- the lock ----------------------------------------------------------------------------------- */

static long holder_pid(int fd) {
  char text[PID_TEXT_BYTES] = {0};
  ssize_t n = pread(fd, text, sizeof text - 1, 0);
  char *end = NULL;
  long pid = n > 0 ? strtol(text, &end, 10) : 0;
  return end && end != text && pid > 0 ? pid : 0;
}

/* Takes the lock file's flock, or fails at once naming the converter holding it. The holder removes
 * the file on its way out, so a file we opened may be gone by the time we hold it: then open again. */
static WkStatus lock(ConvertOutput *o) {
  for (int attempt = 0; attempt < LOCK_TRIES; attempt++) {
    int fd = open(o->lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return WK_FAIL_ERRNO("create lock file", o->lock_path);
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      int error = errno;
      long pid = error == EWOULDBLOCK ? holder_pid(fd) : 0;
      close(fd);
      if (error != EWOULDBLOCK) {
        errno = error;
        return WK_FAIL_ERRNO("lock", o->lock_path);
      }
      char who[64];
      if (pid) snprintf(who, sizeof who, "pid %ld", pid);
      else snprintf(who, sizeof who, "pid unknown");
      return WK_FAIL(WK_ERR_IO, "output '%s' is being written by another converter (%s, lock '%s'); wait for it to "
                     "finish or stop it", o->dir, who, o->lock_path);
    }
    struct stat held, now;
    if (fstat(fd, &held) == 0 && stat(o->lock_path, &now) == 0 && held.st_ino == now.st_ino &&
        held.st_dev == now.st_dev) {
      char text[PID_TEXT_BYTES];
      int n = snprintf(text, sizeof text, "%ld\n", (long)getpid());
      if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)n, 0) != n) {
        WkStatus status = WK_FAIL_ERRNO("write lock file", o->lock_path);
        close(fd);
        return status;
      }
      o->lock_fd = fd;
      return WK_OK;
    }
    close(fd);
  }
  return WK_FAIL(WK_ERR_IO, "lock '%s' keeps disappearing; is another converter starting and stopping?",
                 o->lock_path);
}

/* ---- the run's life ----------------------------------------------------------------------------- */

WkStatus convert_output_open(const char *out_dir, bool resume, ConvertOutput *o) {
  memset(o, 0, sizeof *o);
  o->lock_fd = -1;
  WkStatus status = resolve(out_dir, o);
  if (status == WK_OK) status = lock(o);
  /* What a killed run may have left: a swap cut between its two renames (D missing: the old dataset is
   * whole at .old, put it back), or the old dataset not yet removed. */
  if (status == WK_OK && exists(o->old)) {
    if (exists(o->dir)) status = remove_old(o);
    else if (rename(o->old, o->dir) != 0) status = WK_FAIL_ERRNO("restore the dataset", o->old);
  }
  if (status == WK_OK && mkdir(o->staging, 0777) != 0 && errno != EEXIST)
    status = WK_FAIL_ERRNO("create directory", o->staging);
  /* A staging directory of an interrupted run: its finished shards are candidates for --resume. */
  if (status == WK_OK) status = remove_dataset_files(o->staging, resume ? UINT32_MAX : 0, resume);
  if (status != WK_OK) convert_output_close(o, true);
  return status;
}

WkStatus convert_output_adopt(const ConvertOutput *o, const char *name) {
  char *from = joined(o->dir, "", name, ""), *to = joined(o->staging, "", name, "");
  WkStatus status = from && to ? WK_OK : WK_ERR_NOMEM;
  if (status == WK_OK && unlink(to) != 0 && errno != ENOENT) status = WK_FAIL_ERRNO("remove", to);
  if (status == WK_OK && link(from, to) != 0) status = WK_FAIL_ERRNO("link", to);
  free(from), free(to);
  return status;
}

char *convert_output_path(const ConvertOutput *o, const char *name) {
  return joined(o->staging, "", name, "");
}

/* Exchanges staging and D; afterwards the old dataset (if any) is at o->old. */
static WkStatus swap(const ConvertOutput *o) {
  struct stat st;
  if (stat(o->dir, &st) != 0) {
    if (rename(o->staging, o->dir) != 0) return WK_FAIL_ERRNO("rename into place", o->dir);
    return WK_OK;
  }
  if (chmod(o->staging, st.st_mode & 07777) != 0) /* the new directory keeps the old one's permissions */
    wk_logf(WK_LOG_WARN, "converter: cannot give '%s' the permissions of '%s': %s", o->staging, o->dir,
            strerror(errno));
  if (renameat2(AT_FDCWD, o->staging, AT_FDCWD, o->dir, RENAME_EXCHANGE) == 0) {
    if (rename(o->staging, o->old) != 0) return WK_FAIL_ERRNO("move the old dataset to", o->old);
    return WK_OK;
  }
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) return WK_FAIL_ERRNO("swap into place", o->dir);
  /* No atomic exchange here: for a moment D does not exist (a run killed then is undone by the next). */
  if (rename(o->dir, o->old) != 0) return WK_FAIL_ERRNO("move the old dataset to", o->old);
  if (rename(o->staging, o->dir) != 0) {
    WkStatus status = WK_FAIL_ERRNO("rename into place", o->dir);
    if (rename(o->old, o->dir) != 0) wk_logf(WK_LOG_ERROR, "converter: the old dataset is at '%s'", o->old);
    return status;
  }
  return WK_OK;
}

WkStatus convert_output_publish(ConvertOutput *o, uint32_t shards) {
  WK_TRY(remove_dataset_files(o->staging, shards, true)); /* shards of an earlier, larger run */
  WK_TRY(swap(o));
  o->published = true;
  if (remove_old(o) != WK_OK) { /* the new dataset is in place: a leftover is the next run's to remove */
    wk_logf(WK_LOG_WARN, "converter: the new dataset is in place, but %s", wk_last_error());
    wk_clear_error();
  }
  return WK_OK;
}

/* After a failure: the staging directory's temporaries go (its finished shards stay for --resume), and
 * the directory too when nothing is left in it. Quiet: the run's own error stays the one reported. */
static void remove_temporaries(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *entry;
  while ((entry = readdir(d)) != NULL) {
    const char *name = entry->d_name;
    if (!is_dataset_file(name) || !ends_with(name, ".tmp")) continue;
    size_t n = strlen(dir) + strlen(name) + 2;
    char *path = malloc(n);
    if (!path) break;
    snprintf(path, n, "%s/%s", dir, name);
    if (unlink(path) != 0) wk_logf(WK_LOG_DEBUG, "converter: cannot remove '%s': %s", path, strerror(errno));
    free(path);
  }
  closedir(d);
  rmdir(dir); /* fails, as it should, while shards are in it */
}

void convert_output_close(ConvertOutput *o, bool failed) {
  /* Only the lock's holder may touch the staging directory: without the lock it is another run's. */
  if (failed && o->lock_fd >= 0 && !o->published) remove_temporaries(o->staging);
  if (o->lock_fd >= 0) {
    if (unlink(o->lock_path) != 0) wk_logf(WK_LOG_WARN, "converter: cannot remove lock '%s'", o->lock_path);
    close(o->lock_fd);
  }
  free(o->dir);
  free(o->staging);
  free(o->old);
  free(o->lock_path);
  memset(o, 0, sizeof *o);
  o->lock_fd = -1;
}
