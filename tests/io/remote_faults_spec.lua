-- Remote datasets through a fault-injecting proxy (tests/helpers/fault_proxy.py) in front of a real
-- nginx: connections cut mid-body, reset, 503 with Retry-After, 429, stalls longer than the stall timeout,
-- answers dripped slower than the low-speed limit, headers without end, a huge header, flipped bytes, 404.
-- Each case either delivers exactly the samples of local reading or stops with a clear error (URL, status,
-- attempts, offset, the rate seen) within a bounded time.
local helper = require 'helper'
local data_helper = require 'helpers.data'
local nginx = require 'helpers.nginx'
local core = require 'wick.core'
local q = helper.shell_quote

local PYTHON = '/usr/bin/python3'
-- Fast failures for the test: three retries, stalls detected after 0.4 s.
local OPTIONS = 'retries = 3, stall_timeout_ms = 400, connect_timeout_ms = 2000, max_transfers = 4'
-- A drip is judged over 1 s windows: fewer than 1000 bytes in one is too slow (the answers here are a few
-- kilobytes at most, served in milliseconds; the drips send 20 bytes/s, every 50 ms). The stall timeout is
-- the default's: a drip is never silent that long.
local LOW_SPEED = 'stall_timeout_ms = 30000, low_speed_bytes_per_s = 1000, low_speed_window_ms = 1000'
local LIMIT_S = 90 -- a run that regresses to waiting on the server is killed after this, and fails
local STEPS = 32 -- global steps of 8 samples: 4 shuffle buffers, a third of an epoch

if not nginx.binary() or helper.sh('test -x ' .. PYTHON).rc ~= 0 then
  describe('remote faults', function() pending('need nginx and ' .. PYTHON .. ' (make deps installs them)') end)
  return
end

local Proxy = {}
Proxy.__index = Proxy

local function start_proxy(upstream_port)
  local dir = helper.tmpdir()
  local self = setmetatable({ dir = dir, control = dir .. '/control', log = dir .. '/log' }, Proxy)
  helper.write_file(self.control, 'pass\n')
  local r = helper.sh(('%s %s/tests/helpers/fault_proxy.py %d %s %s %s > %s/out 2>&1 & echo $!'):format(PYTHON,
    q(helper.ROOT), upstream_port, q(dir .. '/port'), q(self.control), q(self.log), q(dir)))
  self.pid = tonumber(r.out:match('%d+'))
  for _ = 1, 250 do
    local port = tonumber(helper.read_file(dir .. '/port'):match('%d+'))
    if port then
      self.url = ('http://127.0.0.1:%d'):format(port)
      return self
    end
    helper.sh('sleep 0.02')
  end
  error('the fault proxy did not start: ' .. helper.read_file(dir .. '/out'))
end

function Proxy:set(mode) helper.write_file(self.control, mode .. '\n') end

function Proxy:faults()
  local n = 0
  for line in helper.read_file(self.log):gmatch('[^\n]+') do
    if not line:match(' %-$') then n = n + 1 end
  end
  return n
end

function Proxy:stop()
  helper.sh(('kill %d; sleep 0.05; kill -9 %d 2>/dev/null'):format(self.pid, self.pid))
  helper.rmtree(self.dir)
end

describe('a remote dataset through faults', function()
  local root, server, proxy, local_lines
  -- the shard of the n-th sample read: one the stream certainly reaches
  local function shard_of(n) return ('shard-%05d'):format(tonumber(local_lines[n]:match(' id=%d+:(%d+):'))) end
  local function stream(data, cache, options)
    local audit = root .. '/audit-' .. math.random(1e9)
    local started = core.now()
    local r = helper.sh(('timeout -k 5 %d %s %s/tests/helpers/remote_rank.lua %s %s %s %d %d - %s'):format(LIMIT_S,
      q(helper.RUN), helper.ROOT, q(data), q(audit), q(cache), 2 ^ 40, STEPS,
      q('{ ' .. OPTIONS .. ', ' .. (options or '') .. ' }')))
    local lines = helper.lines(helper.read_file(audit))
    os.remove(audit)
    local counters = {}
    for k, v in r.out:gmatch('([%w_]+)=(%d+)') do counters[k] = tonumber(v) end
    return { rc = r.rc, err = r.err, lines = lines, counters = counters, seconds = core.now() - started }
  end

  setup(function()
    root = helper.tmpdir()
    data_helper.make_dataset(root .. '/ds', data_helper.documents(900, 60, 17),
      { shard_size = 20000, block_size = 1024, compression = 'zstd' })
    server = nginx.start(root)
    proxy = start_proxy(server.port)
    local cache = helper.tmpdir()
    local_lines = stream(root .. '/ds', cache).lines
    helper.rmtree(cache)
    assert.are.equal(STEPS * 8, #local_lines)
  end)
  teardown(function()
    if proxy then proxy:stop() end
    if server then server:stop() end
    helper.rmtree(root)
  end)

  local cases = {
    { mode = 'cut 3', counter = 'reset', what = 'connections cut mid-body (resumed by Range)' },
    { mode = 'reset 3', counter = 'reset', what = 'connections closed without an answer' },
    { mode = '503 8', counter = 'throttle', what = '503 with Retry-After' },
    { mode = '429 3', counter = 'throttle', what = '429' },
    { mode = 'stall 6 3', counter = 'timeout', what = 'stalls longer than the stall timeout' },
    { mode = 'drip 6 20', counter = 'timeout', options = LOW_SPEED,
      what = 'answers dripped at 20 bytes/s, headers and body (under the low-speed limit)' },
    { mode = 'flip 3', counter = 'corrupt', what = 'flipped bytes (checksums fail, fetched again)' },
  }
  for _, case in ipairs(cases) do
    it('delivers exactly the local samples through ' .. case.what, function()
      local cache = helper.tmpdir()
      proxy:set(case.mode)
      local faults = proxy:faults()
      local r = stream(proxy.url .. '/ds', cache, case.options)
      proxy:set('pass')
      assert.are.equal(0, r.rc, r.err)
      assert.are.same(local_lines, r.lines)
      assert.is_true(proxy:faults() > faults, 'the proxy injected faults')
      assert.is_true(r.counters[case.counter] > 0, case.counter .. ' retries counted: ' .. r.err)
      assert.is_true(r.seconds < 30, ('took %.1f s'):format(r.seconds))
      helper.rmtree(cache)
    end)
  end

  it('stops with the URL and offset when a block is corrupt on the server, fetched twice', function()
    local cache = helper.tmpdir()
    local shard = shard_of(math.floor(#local_lines / 2))
    proxy:set('flip-always ' .. shard)
    local r = stream(proxy.url .. '/ds', cache)
    proxy:set('pass')
    assert.are_not.equal(0, r.rc)
    assert.matches(proxy.url .. '/ds/' .. shard .. '.wks', r.err, 1, true)
    assert.matches("%.wks' bytes %d+%-%d+ %(block %d+%) are corrupt on the server: .*checksum", r.err)
    assert.matches('fetched anew', r.err, 1, true)
    assert.is_true(r.seconds < 20, ('took %.1f s'):format(r.seconds))
    helper.rmtree(cache)
  end)

  it('stops at once on a 404 for one shard, naming its URL, the status and the attempt', function()
    local cache = helper.tmpdir()
    local shard = shard_of(#local_lines)
    proxy:set('404 ' .. shard)
    local r = stream(proxy.url .. '/ds', cache)
    proxy:set('pass')
    assert.are_not.equal(0, r.rc)
    assert.matches(proxy.url .. '/ds/' .. shard .. '.wks', r.err, 1, true)
    assert.matches('HTTP 404', r.err, 1, true)
    assert.matches('attempt 1', r.err, 1, true)
    assert.is_true(r.seconds < 20, ('took %.1f s'):format(r.seconds))
    helper.rmtree(cache)
  end)

  it('gives up on a server that always stalls within the retries and their timeouts', function()
    local cache = helper.tmpdir()
    proxy:set('stall-always ' .. shard_of(1) .. ' 30')
    local r = stream(proxy.url .. '/ds', cache)
    proxy:set('pass')
    assert.are_not.equal(0, r.rc)
    assert.matches('stalled', r.err, 1, true)
    assert.matches('gave up after 4 attempts', r.err, 1, true)
    assert.is_true(r.seconds < 20, ('took %.1f s'):format(r.seconds))
    helper.rmtree(cache)
  end)

  it('gives up on a server that always drips, naming the URL, the rate seen and the attempts', function()
    local cache = helper.tmpdir()
    local shard = shard_of(1)
    proxy:set('drip-always ' .. shard .. ' 200') -- header lines arrive whole: at 200 bytes/s, a few per window
    local r = stream(proxy.url .. '/ds', cache, LOW_SPEED)
    proxy:set('pass')
    assert.are_not.equal(0, r.rc)
    assert.matches(proxy.url .. '/ds/' .. shard .. '.wks', r.err, 1, true)
    assert.matches('too slow: [1-9]%d* bytes in 1%.%d s %([1-9]%d* B/s%), under the low%-speed limit of 1000 B/s', r.err)
    assert.matches('gave up after 4 attempts', r.err, 1, true)
    assert.is_true(r.seconds < 60, ('took %.1f s'):format(r.seconds))
    helper.rmtree(cache)
  end)

  it("cuts headers that never end at the attempt's deadline, sized to the bytes asked for", function()
    local cache = helper.tmpdir()
    local shard = shard_of(1)
    -- 4000 bytes/s of header lines: never under the low-speed limit, never silent; the shard's first read
    -- asks for a few kilobytes, so each attempt may take 2 s (connect) + 1 s (a window) + a few seconds
    proxy:set('endless-head ' .. shard .. ' 4000')
    local r = stream(proxy.url .. '/ds', cache, LOW_SPEED .. ', retries = 1')
    proxy:set('pass')
    assert.are_not.equal(0, r.rc)
    assert.matches(proxy.url .. '/ds/' .. shard .. '.wks', r.err, 1, true)
    assert.matches("not done by this attempt's deadline, %d+%.%d s after it began %(%d+ bytes asked for; %d+ bytes "
      .. 'of headers and body came, %d+ B/s%)', r.err)
    assert.matches('gave up after 2 attempts (last HTTP status 206)', r.err, 1, true)
    assert.is_true(r.seconds < 60, ('took %.1f s'):format(r.seconds))
    helper.rmtree(cache)
  end)

  it('ends a request at request_timeout_ms, all its attempts together', function()
    local cache = helper.tmpdir()
    local shard = shard_of(1)
    proxy:set('drip-always ' .. shard .. ' 20')
    local r = stream(proxy.url .. '/ds', cache, LOW_SPEED .. ', retries = 50, request_timeout_ms = 4000')
    proxy:set('pass')
    assert.are_not.equal(0, r.rc)
    assert.matches(proxy.url .. '/ds/' .. shard .. '.wks', r.err, 1, true)
    assert.matches('gave up after %d+ attempts in %d%.%d s: request_timeout_ms=4000 bounds a request with all its '
      .. 'attempts', r.err)
    assert.is_true(r.seconds < 30, ('took %.1f s'):format(r.seconds))
    helper.rmtree(cache)
  end)

  it('logs one line when it waits long for a Retry-After, and delivers the local samples', function()
    local cache = helper.tmpdir()
    proxy:set('503 12 4')
    local faults = proxy:faults()
    local r = stream(proxy.url .. '/ds', cache)
    proxy:set('pass')
    assert.are.equal(0, r.rc, r.err)
    assert.are.same(local_lines, r.lines)
    local injected = proxy:faults() - faults
    local waits = select(2, r.err:gsub('wick warn: waiting 4%.0 s before attempt 2 of GET [^\n]*, as the server asked '
      .. '%(Retry%-After: 4 s%): HTTP 503', ''))
    assert.is_true(injected > 0, 'the proxy injected faults')
    assert.is_true(waits >= 1 and waits <= injected, ('%d lines for %d waits:\n%s'):format(waits, injected, r.err))
    helper.rmtree(cache)
  end)

  it('gives up at once when Retry-After asks for longer than the request may take', function()
    local cache = helper.tmpdir()
    proxy:set('503 1 100000')
    local r = stream(proxy.url .. '/ds', cache, 'request_timeout_ms = 30000')
    proxy:set('pass')
    assert.are_not.equal(0, r.rc)
    assert.matches('HTTP 503; gave up after 1 attempt in %d%.%d s: request_timeout_ms=30000 bounds a request with all '
      .. 'its attempts, and the next could not start before it ends, waiting as the server asked %(Retry%-After: '
      .. '100000 s, honoured up to 60 s%)', r.err)
    assert.is_true(r.seconds < 15, ('took %.1f s'):format(r.seconds))
    helper.rmtree(cache)
  end)

  it('names a response header too large for libcurl instead of running out of memory', function()
    local cache = helper.tmpdir()
    local shard = shard_of(1)
    proxy:set('huge-header ' .. shard .. ' 200000')
    local r = stream(proxy.url .. '/ds', cache)
    proxy:set('pass')
    assert.are_not.equal(0, r.rc)
    assert.matches(proxy.url .. '/ds/' .. shard .. '.wks', r.err, 1, true)
    assert.matches("the response's headers are too large: a header line longer than libcurl's limit", r.err, 1, true)
    assert.matches('HTTP status 206; not retried', r.err, 1, true)
    assert.not_matches('Out of memory', r.err, 1, true)
    assert.is_true(r.seconds < 20, ('took %.1f s'):format(r.seconds))
    helper.rmtree(cache)
  end)
end)
