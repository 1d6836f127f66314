-- A real nginx for the remote-data tests: serves a directory on 127.0.0.1 and a free port, from a
-- generated configuration under a temporary prefix, logging each request's URI, Range and status; it
-- is stopped by its PID.
--   local nginx = require 'helpers.nginx'
--   local server = nginx.start(root_dir)          -- or nginx.start(root, { tls = true })
--   server.url                                    -- 'http://127.0.0.1:PORT'
--   server:requests()                    -- { { method, uri, range, status, bytes, protocol }, ... }
--   server:stop()
local helper = require 'helper'
local q = helper.shell_quote

local nginx = {}
local Server = {}
Server.__index = Server

local BINARIES = { '/usr/sbin/nginx', '/usr/bin/nginx' }
local START_ATTEMPTS = 8       -- ports tried (another process may take the one picked)
local READY_POLLS = 100        -- x 20 ms: nginx writes its pid file within milliseconds

function nginx.binary()
  for _, path in ipairs(BINARIES) do
    if helper.sh('test -x ' .. q(path)).rc == 0 then return path end
  end
end

local function random_port()
  local seed = tonumber(helper.sh('od -An -N2 -tu2 /dev/urandom').out)
  return 20000 + seed % 40000
end

local function config(prefix, root, port, opts)
  local listen = ('listen 127.0.0.1:%d%s;'):format(port, opts.tls and ' ssl http2' or '')
  local tls = opts.tls and ('ssl_certificate %s/cert.pem; ssl_certificate_key %s/key.pem;'):format(prefix, prefix) or ''
  return ([[
worker_processes 1;
daemon on;
pid %s/nginx.pid;
error_log %s/error.log warn;
events { worker_connections 256; }
http {
  default_type application/octet-stream;
  log_format wick '$request_method $uri "$http_range" $status $body_bytes_sent $server_protocol';
  access_log %s/access.log wick;
  client_body_temp_path %s/tmp; proxy_temp_path %s/tmp; fastcgi_temp_path %s/tmp;
  uwsgi_temp_path %s/tmp; scgi_temp_path %s/tmp;
  keepalive_requests 100000;
  server { %s %s root %s; location / { } }
}
]]):format(prefix, prefix, prefix, prefix, prefix, prefix, prefix, prefix, listen, tls, root)
end

-- A self-signed certificate for 127.0.0.1 (the test's CA bundle is the certificate itself).
local function make_certificate(prefix)
  local r = helper.sh(('openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=127.0.0.1 '
    .. '-addext subjectAltName=IP:127.0.0.1 -keyout %s/key.pem -out %s/cert.pem'):format(q(prefix), q(prefix)))
  assert(r.rc == 0, 'openssl failed: ' .. r.err)
end

function nginx.start(root, opts)
  opts = opts or {}
  local binary = assert(nginx.binary(), 'nginx is not installed (make deps installs it)')
  local prefix = helper.tmpdir()
  assert(os.execute('mkdir -p ' .. q(prefix .. '/tmp')) == 0)
  if opts.tls then make_certificate(prefix) end
  for _ = 1, START_ATTEMPTS do
    local port = random_port()
    helper.write_file(prefix .. '/nginx.conf', config(prefix, root, port, opts))
    local r = helper.sh(('%s -p %s -c %s/nginx.conf'):format(q(binary), q(prefix), q(prefix)))
    if r.rc == 0 then
      for _ = 1, READY_POLLS do
        local pid = tonumber(helper.read_file(prefix .. '/nginx.pid'):match('%d+'))
        if pid then
          local scheme = opts.tls and 'https' or 'http'
          return setmetatable({ pid = pid, port = port, prefix = prefix, root = root,
                                url = ('%s://127.0.0.1:%d'):format(scheme, port),
                                ca = opts.tls and prefix .. '/cert.pem' or nil }, Server)
        end
        helper.sh('sleep 0.02')
      end
    end
    -- the port was taken (or the start failed): try another
  end
  error('nginx did not start: ' .. helper.read_file(prefix .. '/error.log'))
end

-- Every request so far, in order.
function Server:requests()
  local out = {}
  for line in helper.read_file(self.prefix .. '/access.log'):gmatch('[^\n]+') do
    local method, uri, range, status, bytes, protocol = line:match('^(%S+) (%S+) "([^"]*)" (%d+) (%d+) (%S+)$')
    if method then
      out[#out + 1] = { method = method, uri = uri, range = range ~= '-' and range or nil, status = tonumber(status),
                        bytes = tonumber(bytes), protocol = protocol }
    end
  end
  return out
end

-- Forgets the requests logged so far (nginx appends to its log: truncating it is enough).
function Server:clear_log()
  helper.write_file(self.prefix .. '/access.log', '')
end

function Server:stop()
  if not self.pid then return end
  -- Stopped once gone or a zombie (its parent is init, which may take its time to reap it).
  helper.sh(('kill -TERM %d; for i in $(seq 1 100); do s=$(ps -o stat= -p %d); case "$s" in ""|Z*) exit 0;; esac; '
    .. 'sleep 0.02; done; kill -KILL %d'):format(self.pid, self.pid, self.pid))
  self.pid = nil
  helper.rmtree(self.prefix)
end

return nginx
