#!/usr/bin/python3
"""A fault-injecting HTTP/1.1 proxy for the remote-data tests (tests/io/remote_faults_spec.lua), Python
standard library only.

    fault_proxy.py UPSTREAM_PORT PORT_FILE CONTROL_FILE LOG_FILE

Listens on 127.0.0.1 at a free port (written to PORT_FILE once it listens) and forwards GET requests to
127.0.0.1:UPSTREAM_PORT (nginx), keep-alive on both sides. CONTROL_FILE, read at every request, holds one
line "MODE [ARGUMENT]":

    pass                  forward everything as it is
    cut N                 every Nth new request: headers and half the body, then close the connection
    reset N               every Nth new request: close the connection without an answer; in this mode every
                          answer says "Connection: close", so that each request comes on a fresh connection
                          (curl itself retries a request whose reused connection closed unanswered, once,
                          unseen by its caller: the fault would not reach the code under test)
    503 N [SECONDS]       every Nth new request: 503 with Retry-After: SECONDS (default 1)
    429 N                 every Nth new request: 429 without Retry-After
    stall N SECONDS       every Nth new request: headers and half the body, then nothing for SECONDS
    flip N                every Nth new request for a byte range: one body byte flipped
    flip-always TEXT      every request for a byte range of a path containing TEXT, but a shard's first and
                          last (its header, its tables): one byte flipped
    stall-always TEXT S   every request for a path containing TEXT: headers and half the body, then S s
    drip N RATE           every Nth new request: the whole answer, headers and body, at RATE bytes/s
    drip-always TEXT RATE every request for a path containing TEXT: the same
    endless-head TEXT RATE  every request for a path containing TEXT: a status line, then header lines
                          without end at RATE bytes/s (a server that is never slow enough to cut for its rate)
    huge-header TEXT BYTES  every request for a path containing TEXT: the answer with one header line of
                          BYTES bytes more
    404 TEXT              every request for a path containing TEXT: 404

"New" means the first time the proxy sees a (path, Range) pair since the mode was set: the fault is
transient, so the client's retry of the same request passes. Each request is appended to LOG_FILE as "PATH RANGE STATUS FAULT".
"""
import http.client
import os
import re
import socket
import socketserver
import sys
import threading
import time

UPSTREAM_PORT, PORT_FILE, CONTROL_FILE, LOG_FILE = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
HOP_BY_HOP = {'connection', 'keep-alive', 'transfer-encoding', 'te', 'trailer', 'upgrade', 'proxy-connection'}

lock = threading.Lock()
seen = {}           # (path, range) -> times seen
new_count = [0]     # distinct (path, range) pairs seen
last_control = [None]


def control():
    try:
        with open(CONTROL_FILE) as f:
            words = f.read().split()
    except OSError:
        words = []
    return words or ['pass']


def log(path, byte_range, status, fault):
    with lock, open(LOG_FILE, 'a') as f:
        f.write('%s %s %s %s\n' % (path, byte_range or '-', status, fault or '-'))


def choose_fault(path, byte_range):
    words = control()
    mode = words[0]
    with lock:
        if words != last_control[0]:  # a new mode: every request is new again
            last_control[0] = words
            seen.clear()
            new_count[0] = 0
        key = (path, byte_range)
        first = key not in seen
        seen[key] = seen.get(key, 0) + 1
        if first:
            new_count[0] += 1
        nth = new_count[0]
    if mode in ('cut', 'reset', '503', '429', 'stall', 'flip', 'drip'):
        every = int(words[1])
        if not first or nth % every != 0 or (mode == 'flip' and not byte_range):
            return None, words
        return mode, words
    if mode == 'flip-always' and byte_range and words[1] in path:
        return mode, words
    if mode == 'stall-always' and words[1] in path:
        return 'stall', [mode, words[1], words[2]]
    if mode == 'drip-always' and words[1] in path:
        return 'drip', [mode, words[1], words[2]]
    if mode in ('404', 'endless-head', 'huge-header') and words[1] in path:
        return mode, words
    return None, words


def drip(wfile, data, rate):
    """Writes data at rate bytes/s, in twentieths of a second (until the client goes)."""
    chunk = max(1, int(rate) // 20)
    for at in range(0, len(data), chunk):
        wfile.write(data[at:at + chunk])
        wfile.flush()
        time.sleep(chunk / float(rate))


def endless_head(wfile, rate):
    line = b'X-Drip: ' + b'a' * 64 + b'\r\n'
    drip(wfile, b'HTTP/1.1 206 Partial Content\r\n', rate)
    while True:
        drip(wfile, line, rate)


class Handler(socketserver.StreamRequestHandler):
    def handle(self):
        upstream = http.client.HTTPConnection('127.0.0.1', UPSTREAM_PORT)
        try:
            while self.one_request(upstream):
                pass
        except (ConnectionError, OSError):
            pass
        finally:
            upstream.close()

    def one_request(self, upstream):
        line = self.rfile.readline(65537)
        if not line:
            return False
        method, path, _ = line.decode('latin-1').split(' ', 2)
        headers = {}
        while True:
            h = self.rfile.readline(65537).decode('latin-1')
            if h in ('\r\n', '\n', ''):
                break
            name, value = h.split(':', 1)
            headers[name.strip().lower()] = value.strip()
        byte_range = headers.get('range')
        fault, words = choose_fault(path, byte_range)
        if fault == 'reset':
            log(path, byte_range, 0, fault)
            return False
        if fault == 'endless-head':
            log(path, byte_range, 206, fault)
            endless_head(self.wfile, float(words[2]))
            return False
        if fault in ('503', '429', '404'):
            status = int(fault)
            reason = {503: 'Service Unavailable', 429: 'Too Many Requests', 404: 'Not Found'}[status]
            extra = 'Retry-After: %s\r\n' % (words[2] if len(words) > 2 else '1') if status == 503 else ''
            body = reason.encode()
            self.wfile.write(('HTTP/1.1 %d %s\r\n%sContent-Length: %d\r\n\r\n' % (status, reason, extra,
                                                                                  len(body))).encode() + body)
            self.wfile.flush()
            log(path, byte_range, status, fault)
            return True
        forward = {k: v for k, v in headers.items() if k not in HOP_BY_HOP and k != 'host'}
        upstream.request(method, path, headers=forward)
        response = upstream.getresponse()
        body = response.read()
        if fault == 'flip-always' and response.status == 206:
            first, last, total = re.match(r'bytes (\d+)-(\d+)/(\d+)', response.getheader('content-range')).groups()
            if first == '0' or int(last) == int(total) - 1:
                fault = None
        if fault in ('flip', 'flip-always') and response.status == 206 and body:
            at = len(body) // 2
            body = body[:at] + bytes([body[at] ^ 0xFF]) + body[at + 1:]
        head = 'HTTP/1.1 %d %s\r\n' % (response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() not in HOP_BY_HOP and name.lower() != 'content-length':
                head += '%s: %s\r\n' % (name, value)
        close = words[0] == 'reset'
        if close:
            head += 'Connection: close\r\n'
        if fault == 'huge-header':
            head += 'X-Huge: %s\r\n' % ('h' * int(words[2]))
        head += 'Content-Length: %d\r\n\r\n' % len(body)
        log(path, byte_range, response.status, fault)
        if fault == 'drip':
            drip(self.wfile, head.encode() + body, float(words[2]))
            return False
        if fault in ('cut', 'stall'):
            self.wfile.write(head.encode() + body[:len(body) // 2])
            self.wfile.flush()
            if fault == 'stall':
                time.sleep(float(words[2]))
            return False
        self.wfile.write(head.encode() + body)
        self.wfile.flush()
        return not close


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    server = Server(('127.0.0.1', 0), Handler)
    port = server.server_address[1]
    with open(PORT_FILE + '.tmp', 'w') as f:
        f.write('%d\n' % port)
    os.rename(PORT_FILE + '.tmp', PORT_FILE)
    server.serve_forever()


if __name__ == '__main__':
    main()
