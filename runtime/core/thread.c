/*
 * thread.c — starting worker threads that leave the process's signals to the host.
 *
 * Every thread libwick starts (readers, fetchers, the converter's workers, the collectives' worker),
 * and every thread a library starts for it (Gloo's loop), blocks the signals a person or a launcher
 * sends a process, so the host's thread (run's main thread, which installed the handlers) is the one
 * the kernel delivers them to.
 */
#include "core.h"

static const int HOST_SIGNALS[] = {SIGUSR1, SIGINT, SIGTERM, SIGHUP, SIGQUIT};

void wk_signals_block(sigset_t *previous) {
  sigset_t block;
  sigemptyset(&block);
  for (size_t i = 0; i < sizeof HOST_SIGNALS / sizeof HOST_SIGNALS[0]; i++) sigaddset(&block, HOST_SIGNALS[i]);
  pthread_sigmask(SIG_BLOCK, &block, previous);
}

void wk_signals_restore(const sigset_t *previous) { pthread_sigmask(SIG_SETMASK, previous, NULL); }

int wk_thread_create(pthread_t *thread, void *(*start)(void *), void *arg) {
  sigset_t previous;
  wk_signals_block(&previous);  /* the new thread inherits the creator's mask */
  int rc = pthread_create(thread, NULL, start, arg);
  wk_signals_restore(&previous);
  return rc;
}
