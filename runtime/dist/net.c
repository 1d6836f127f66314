/*
 * net.c — what both ends of the store need from sockets: deadlines on CLOCK_MONOTONIC, and
 * reads and writes that finish, time out or say why the peer went away.
 *
 * Sockets stay blocking; every wait goes through poll() with the time left, so no call here can
 * block past its deadline. EINTR is retried.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "dist.h"

int64_t net_now_ms(void) { return (int64_t)(wk_now_ns() / 1000000u); }

int64_t net_deadline(int64_t timeout_ms) { return timeout_ms < 0 ? -1 : net_now_ms() + timeout_ms; }

int64_t net_remaining(int64_t deadline_ms) {
  if (deadline_ms < 0) return -1;
  int64_t left = deadline_ms - net_now_ms();
  return left > 0 ? left : 0;
}

/* Waits until fd is ready for events; WK_ERR_TIMEOUT at the deadline. */
static WkStatus wait_ready(int fd, short events, int64_t deadline_ms, const char *verb, const char *peer) {
  for (;;) {
    int64_t left = net_remaining(deadline_ms);
    if (left == 0) return WK_FAIL(WK_ERR_TIMEOUT, "%s %s: timed out", verb, peer);
    struct pollfd p = {.fd = fd, .events = events};
    int n = poll(&p, 1, left < 0 || left > INT32_MAX ? -1 : (int)left);
    if (n > 0) return WK_OK;
    if (n < 0 && errno != EINTR) return WK_FAIL(WK_ERR_NETWORK, "%s %s: poll: %s", verb, peer, strerror(errno));
  }
}

WkStatus net_write_all(int fd, const void *data, size_t length, int64_t deadline_ms, const char *peer) {
  const char *p = data;
  while (length > 0) {
    WK_TRY(wait_ready(fd, POLLOUT, deadline_ms, "sending to", peer));
    ssize_t n = send(fd, p, length, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      if (errno == EPIPE || errno == ECONNRESET)
        return WK_FAIL(WK_ERR_CLOSED, "sending to %s: the connection was closed by the peer", peer);
      return WK_FAIL(WK_ERR_NETWORK, "sending to %s: %s", peer, strerror(errno));
    }
    p += n;
    length -= (size_t)n;
  }
  return WK_OK;
}

WkStatus net_read_exact(int fd, void *data, size_t length, int64_t deadline_ms, const char *peer) {
  char *p = data;
  while (length > 0) {
    WK_TRY(wait_ready(fd, POLLIN, deadline_ms, "waiting for", peer));
    ssize_t n = recv(fd, p, length, MSG_DONTWAIT);
    if (n == 0) return WK_FAIL(WK_ERR_CLOSED, "reading from %s: the connection was closed by the peer", peer);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      if (errno == ECONNRESET) return WK_FAIL(WK_ERR_CLOSED, "reading from %s: the connection was reset by the peer", peer);
      return WK_FAIL(WK_ERR_NETWORK, "reading from %s: %s", peer, strerror(errno));
    }
    p += n;
    length -= (size_t)n;
  }
  return WK_OK;
}

void net_no_delay(int fd) {
  int on = 1;
  /* Only latency depends on it: a failure is not worth failing the connection for. */
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on) != 0)
    wk_logf(WK_LOG_DEBUG, "store: TCP_NODELAY: %s", strerror(errno));
}
