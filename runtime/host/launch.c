/*
 * launch.c — `run --nproc-per-node N ...`: start and supervise the ranks of one node.
 *
 * Follows torchrun's conventions: each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
 * GROUP_RANK, MASTER_ADDR and MASTER_PORT. Each rank runs in its own process group so that a
 * failure can stop the rank together with anything it spawned; PR_SET_PDEATHSIG ends a rank if
 * the launcher itself is killed. Output is read through pipes and re-emitted line by line with a
 * "[rankN] " prefix so lines of different ranks never interleave mid-line.
 *
 * Failure policy: the first rank to exit non-zero (or die from a signal) is named, with any rank
 * that had already exited 0 while the others still ran (a rank that left early is the usual cause
 * of the failures that follow). The others get REPORT_GRACE_MS to finish on their own, which is
 * when wick.dist ranks print their hang report naming the missing rank; then SIGTERM, and SIGKILL
 * after STOP_GRACE_MS. Ctrl-C is forwarded to every rank as SIGINT.
 *
 * The job id: every rank gets WICK_JOB_ID, hex and unique to this launch; the ranks name the regions
 * their node shares in /dev/shm after it (a keyed hash of it and the job's secret), and the launcher
 * removes what ranks killed with SIGKILL or ended by an error could not (the last rank to leave a region
 * normally removes it itself).
 *
 * The job's secret: the ranks' store accepts only connections that prove it (runtime/dist). For a
 * single-node job the launcher makes one (WICK_STORE_SECRET, 32 random bytes as hex) unless the
 * environment already gives one; a multi-node launcher cannot share a secret it made with the
 * launchers of the other nodes, so its ranks use what the environment gives (WICK_STORE_SECRET or
 * WICK_STORE_SECRET_FILE, the same on every node) or none.
 *
 * The live line: when the launcher's stdout is a terminal, rank 0 is told so (WICK_LIVE_LINE=1) and
 * ends its progress line with \r instead of \n; the launcher keeps the latest such line as the
 * bottom line of its terminal and prints every other line above it (clear the line, print, redraw),
 * so lines never mix. Piped output gets plain lines only: no rank is told to draw.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../core/shared.h" /* wk_shared_remove_job */
#include "../core/secret.h"
#include "../core/terminal.h" /* wk_terminal_fit */
#include "host.h"

enum {
  STOP_GRACE_MS = 3000,       /* SIGTERM -> SIGKILL */
  REPORT_GRACE_MS = 2000,     /* first failure -> SIGTERM: time for the others' hang reports */
  POLL_INTERVAL_MS = 100,     /* how often exits are reaped while output is quiet */
  DRAIN_AFTER_EXIT_MS = 1000, /* how long to wait for pipes held open by a rank's leftovers */
  LINE_CAPACITY = 65536,      /* longer lines are emitted in pieces */
  STREAMS_PER_RANK = 2,       /* stdout, stderr */
};

typedef struct {
  int fd;        /* read end of the pipe, -1 once closed */
  FILE *sink;    /* where its lines go: our stdout or stderr */
  size_t length; /* bytes pending in line */
  char line[LINE_CAPACITY];
} Stream;

typedef struct {
  pid_t pid;
  int rank;
  bool running;
  int status; /* waitpid status once exited */
  uint64_t exited_at_ms;
  Stream streams[STREAMS_PER_RANK];
} Rank;

static volatile sig_atomic_t pending_signal;

/* Rank 0's progress line, drawn at the bottom of the launcher's terminal (one launcher, one thread). */
static struct {
  bool enabled;  /* our stdout is a terminal */
  bool drawn;    /* text is on the screen now */
  size_t length;
  char text[LINE_CAPACITY];
} live;

static void remember_signal(int sig) { pending_signal = sig; }

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Asks the kernel for a free TCP port for the rendezvous store of a single-node job. */
static int pick_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t length = sizeof addr;
  int port = 0;
  if (bind(fd, (struct sockaddr *)&addr, sizeof addr) == 0 &&
      getsockname(fd, (struct sockaddr *)&addr, &length) == 0)
    port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

static void set_env_int(const char *name, int value) {
  char text[32];
  snprintf(text, sizeof text, "%d", value);
  setenv(name, text, 1);
}

/* 16 hex digits unique to this launch: the time, the launcher's pid and the kernel's randomness. */
static void make_job_id(char out[17]) {
  uint64_t seed = now_ms() ^ ((uint64_t)getpid() << 40), noise = 0;
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    if (read(fd, &noise, sizeof noise) != (ssize_t)sizeof noise) noise = 0;
    close(fd);
  }
  snprintf(out, 17, "%016llx", (unsigned long long)(seed ^ noise));
}

/* Removes the regions of this job's node (runtime/core/shared.c) that ranks left: killed, or gone
 * without closing their loaders. Their names are keyed by the job's secret, which this process reads
 * from the environment the ranks inherited. */
static void remove_job_regions(const char *job) {
  if (wk_shared_remove_job(job) != WK_OK)
    fprintf(stderr, "run: the job's shared memory in /dev/shm is left: %s\n", wk_last_error());
}

static bool environment_has(const char *name) {
  const char *value = getenv(name);
  return value && *value;
}

/* Gives the ranks of a single-node job a secret of their own, unless the environment has one. */
static bool give_store_secret(const LaunchConfig *config) {
  if (config->nnodes > 1 || environment_has("WICK_STORE_SECRET") || environment_has("WICK_STORE_SECRET_FILE"))
    return true;
  uint8_t secret[WK_SECRET_GENERATED_BYTES];
  if (wk_random_bytes(secret, sizeof secret) != WK_OK) {
    fprintf(stderr, "run: cannot make the job's secret: %s\n", wk_last_error());
    return false;
  }
  char hex[2 * WK_SECRET_GENERATED_BYTES + 1];
  for (size_t i = 0; i < sizeof secret; i++) snprintf(hex + 2 * i, 3, "%02x", secret[i]);
  explicit_bzero(secret, sizeof secret);
  bool given = setenv("WICK_STORE_SECRET", hex, 1) == 0; /* inherited by every rank */
  explicit_bzero(hex, sizeof hex);
  if (!given) fprintf(stderr, "run: cannot pass the job's secret to its ranks: %s\n", strerror(errno));
  return given;
}

static void set_rank_environment(const LaunchConfig *config, int local_rank, int master_port) {
  set_env_int("RANK", config->node_rank * config->nproc_per_node + local_rank);
  set_env_int("WORLD_SIZE", config->nnodes * config->nproc_per_node);
  set_env_int("LOCAL_RANK", local_rank);
  set_env_int("LOCAL_WORLD_SIZE", config->nproc_per_node);
  set_env_int("GROUP_RANK", config->node_rank);
  set_env_int("MASTER_PORT", master_port);
  setenv("MASTER_ADDR", config->master_addr, 1);
}

/* ---- the live line ------------------------------------------------------------------------------ */

static const char LIVE_VARIABLE[] = "WICK_LIVE_LINE"; /* read by lua/wick/train/runlog.lua */
static const char CLEAR_LINE[] = "\r\033[K";

/* In a child: rank 0 may draw when we show its line; no other rank ever (nor one the user's own
 * environment told so). */
static void offer_live_line(bool global_rank_zero) {
  if (live.enabled && global_rank_zero)
    setenv(LIVE_VARIABLE, "1", 1);
  else
    unsetenv(LIVE_VARIABLE);
}

static void live_hide(void) {
  if (!live.drawn) return;
  fputs(CLEAR_LINE, stdout);
  fflush(stdout);
  live.drawn = false;
}

static void live_show(void) {
  if (!live.enabled || live.length == 0 || live.drawn) return;
  fprintf(stdout, "%s%.*s", CLEAR_LINE, (int)wk_terminal_fit(STDOUT_FILENO, live.text, live.length), live.text);
  fflush(stdout);
  live.drawn = true;
}

static void live_set(const char *text, size_t length) {
  memcpy(live.text, text, length);
  live.length = length;
  live.drawn = false; /* the next show draws it over the old one */
  live_show();
}

/* The live line is gone for good: rank 0 printed its progress as a plain line, or the job ends. */
static void live_drop(void) {
  live_hide();
  live.length = 0;
}

/* In the child: own process group, die with the launcher, output into the pipes, exec. */
static void exec_rank(const LaunchConfig *config, int local_rank, int master_port, pid_t launcher,
                      int out_fd, int err_fd, const char *exe, char **argv) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != launcher) _exit(EXIT_FAILURE); /* the launcher died before prctl took effect */
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  dup2(out_fd, STDOUT_FILENO);
  dup2(err_fd, STDERR_FILENO);
  set_rank_environment(config, local_rank, master_port);
  offer_live_line(config->node_rank * config->nproc_per_node + local_rank == 0);
  execv(exe, argv);
  fprintf(stderr, "run: cannot execute '%s': %s\n", exe, strerror(errno));
  _exit(127);
}

static bool start_rank(Rank *rank, const LaunchConfig *config, int master_port, const char *exe,
                       char **argv) {
  int pipes[STREAMS_PER_RANK][2];
  for (int s = 0; s < STREAMS_PER_RANK; s++) {
    if (pipe2(pipes[s], O_CLOEXEC) != 0) {
      fprintf(stderr, "run: pipe for rank %d: %s\n", rank->rank, strerror(errno));
      return false;
    }
  }
  fflush(NULL);
  pid_t launcher = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "run: fork for rank %d: %s\n", rank->rank, strerror(errno));
    return false;
  }
  if (pid == 0) exec_rank(config, rank->rank - config->node_rank * config->nproc_per_node,
                          master_port, launcher, pipes[0][1], pipes[1][1], exe, argv);
  setpgid(pid, pid); /* also here, so the group exists before we might signal it */
  rank->pid = pid;
  rank->running = true;
  FILE *sinks[STREAMS_PER_RANK] = {stdout, stderr};
  for (int s = 0; s < STREAMS_PER_RANK; s++) {
    close(pipes[s][1]);
    rank->streams[s].fd = pipes[s][0];
    rank->streams[s].sink = sinks[s];
    rank->streams[s].length = 0;
  }
  return true;
}

static bool is_live_stream(const Rank *rank, const Stream *stream) {
  return live.enabled && rank->rank == 0 && stream == &rank->streams[0];
}

/* A plain line, above the live line; one of rank 0's own ends its live line (it says the same, later). */
static void emit_line(const Rank *rank, Stream *stream) {
  if (is_live_stream(rank, stream))
    live_drop();
  else
    live_hide();
  fprintf(stream->sink, "[rank%d] %.*s\n", rank->rank, (int)stream->length, stream->line);
  fflush(stream->sink);
  stream->length = 0;
  live_show();
}

/* Reads what is available; emits complete lines; returns false at end of stream. */
static bool pump_stream(const Rank *rank, Stream *stream) {
  char chunk[4096];
  ssize_t n = read(stream->fd, chunk, sizeof chunk);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (n <= 0) {
    if (stream->length > 0) emit_line(rank, stream);
    close(stream->fd);
    stream->fd = -1;
    return false;
  }
  for (ssize_t i = 0; i < n; i++) {
    if (chunk[i] == '\n') {
      emit_line(rank, stream);
    } else if (chunk[i] == '\r' && is_live_stream(rank, stream)) {
      live_set(stream->line, stream->length);
      stream->length = 0;
    } else {
      stream->line[stream->length++] = chunk[i];
      if (stream->length == LINE_CAPACITY) emit_line(rank, stream);
    }
  }
  return true;
}

/* Polls every open stream once; returns how many remain open. */
static int pump_output(Rank *ranks, int count, int timeout_ms) {
  struct pollfd fds[count * STREAMS_PER_RANK];
  Stream *owners[count * STREAMS_PER_RANK];
  const Rank *owner_ranks[count * STREAMS_PER_RANK];
  int n = 0;
  for (int r = 0; r < count; r++) {
    for (int s = 0; s < STREAMS_PER_RANK; s++) {
      if (ranks[r].streams[s].fd < 0) continue;
      fds[n] = (struct pollfd){.fd = ranks[r].streams[s].fd, .events = POLLIN};
      owners[n] = &ranks[r].streams[s];
      owner_ranks[n] = &ranks[r];
      n++;
    }
  }
  if (n == 0) return 0;
  if (poll(fds, (nfds_t)n, timeout_ms) <= 0) return n;
  int open_streams = n;
  for (int i = 0; i < n; i++) {
    if (fds[i].revents && !pump_stream(owner_ranks[i], owners[i])) open_streams--;
  }
  return open_streams;
}

static void signal_ranks(Rank *ranks, int count, int sig) {
  for (int r = 0; r < count; r++)
    if (ranks[r].running) kill(-ranks[r].pid, sig);
}

static void describe_exit(const Rank *rank) {
  if (WIFSIGNALED(rank->status))
    fprintf(stderr, "run: rank %d (pid %d) was killed by signal %d (%s)\n", rank->rank, (int)rank->pid,
            WTERMSIG(rank->status), strsignal(WTERMSIG(rank->status)));
  else
    fprintf(stderr, "run: rank %d (pid %d) exited with status %d\n", rank->rank, (int)rank->pid,
            WEXITSTATUS(rank->status));
}

static bool failed(int status) { return !WIFEXITED(status) || WEXITSTATUS(status) != 0; }

/* Ranks that exited 0 before `failure` while others still ran: they left the job early. */
static void describe_early_exits(const Rank *ranks, int count, const Rank *failure) {
  for (int r = 0; r < count; r++) {
    const Rank *e = &ranks[r];
    if (e == failure || e->running || failed(e->status) || e->exited_at_ms > failure->exited_at_ms) continue;
    fprintf(stderr, "run: rank %d (pid %d) had exited with status 0 %.1f s before, while the others still ran\n",
            e->rank, (int)e->pid, (double)(failure->exited_at_ms - e->exited_at_ms) / 1000.0);
  }
}

static int exit_code_of(int status) {
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

/* Reaps exited ranks; returns the number still running. Records the first failure. */
static int reap_ranks(Rank *ranks, int count, Rank **first_failure) {
  int running = 0;
  for (int r = 0; r < count; r++) {
    if (!ranks[r].running) continue;
    int status;
    if (waitpid(ranks[r].pid, &status, WNOHANG) == ranks[r].pid) {
      ranks[r].running = false;
      ranks[r].status = status;
      ranks[r].exited_at_ms = now_ms();
      kill(-ranks[r].pid, SIGKILL); /* whatever the rank left behind in its group */
      if (failed(status) && !*first_failure) *first_failure = &ranks[r];
    } else {
      running++;
    }
  }
  return running;
}

static void install_signal_handlers(void) {
  struct sigaction action = {.sa_handler = remember_signal};
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, NULL);
  sigaction(SIGTERM, &action, NULL);
  sigaction(SIGHUP, &action, NULL);
  signal(SIGPIPE, SIG_IGN);
}

int launch_ranks(const LaunchConfig *config, const char *exe, char **child_argv) {
  int count = config->nproc_per_node;
  int master_port = config->master_port;
  if (master_port == 0) master_port = pick_free_port();
  Rank *ranks = calloc((size_t)count, sizeof *ranks);
  if (!ranks) {
    fprintf(stderr, "run: out of memory for %d ranks\n", count);
    return EXIT_FAILURE;
  }
  if (!give_store_secret(config)) {
    free(ranks);
    return EXIT_FAILURE;
  }
  install_signal_handlers();
  live.enabled = isatty(STDOUT_FILENO);
  char job[17];
  make_job_id(job);
  setenv("WICK_JOB_ID", job, 1); /* inherited by every rank */
  int started = 0;
  for (; started < count; started++) {
    ranks[started].rank = config->node_rank * count + started;
    if (!start_rank(&ranks[started], config, master_port, exe, child_argv)) break;
  }
  Rank *first_failure = NULL;
  bool stopping = started < count;
  uint64_t report_deadline = 0; /* after a failure: when the others are stopped */
  uint64_t kill_deadline = stopping ? now_ms() + STOP_GRACE_MS : 0;
  if (stopping) signal_ranks(ranks, started, SIGTERM);
  int interrupts = 0;
  uint64_t all_exited_at = 0;

  for (;;) {
    int open_streams = pump_output(ranks, started, POLL_INTERVAL_MS);
    int running = reap_ranks(ranks, started, &first_failure);
    if (pending_signal) {
      int sig = pending_signal;
      pending_signal = 0;
      interrupts++;
      /* First Ctrl-C: pass it on and let ranks clean up; a second one forces the stop. */
      signal_ranks(ranks, started, interrupts == 1 ? (sig == SIGINT ? SIGINT : SIGTERM) : SIGKILL);
      if (!stopping) kill_deadline = now_ms() + STOP_GRACE_MS;
      stopping = true;
    }
    if (first_failure && !stopping && !report_deadline) {
      live_drop(); /* the failure's lines are the last word */
      describe_exit(first_failure);
      describe_early_exits(ranks, started, first_failure);
      if (running > 0)
        fprintf(stderr, "run: stopping the other ranks in %.0f s unless they exit first\n", REPORT_GRACE_MS / 1000.0);
      report_deadline = now_ms() + REPORT_GRACE_MS;
    }
    if (report_deadline && !stopping && running > 0 && now_ms() >= report_deadline) {
      fprintf(stderr, "run: stopping the other ranks\n");
      signal_ranks(ranks, started, SIGTERM);
      stopping = true;
      kill_deadline = now_ms() + STOP_GRACE_MS;
    }
    if (stopping && running > 0 && now_ms() >= kill_deadline) signal_ranks(ranks, started, SIGKILL);
    if (running == 0) {
      if (!all_exited_at) all_exited_at = now_ms();
      if (open_streams == 0 || now_ms() - all_exited_at > DRAIN_AFTER_EXIT_MS) break;
    }
  }

  live_drop();
  int code = 0;
  if (first_failure) {
    code = exit_code_of(first_failure->status);
  } else if (interrupts > 0) {
    code = 128 + SIGINT;
  } else if (started < count) {
    code = EXIT_FAILURE;
  }
  free(ranks);
  remove_job_regions(job);
  return code;
}
