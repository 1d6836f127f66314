-- Remote datasets over HTTP(S) from a real nginx (tests/helpers/nginx.lua) serving datasets the real
-- converter made: the samples a rank receives are exactly those of the same dataset read locally; the
-- node-shared disk cache downloads each range once and stays within its budget; errors name the URL,
-- the status and the attempts.
local helper = require 'helper'
local data_helper = require 'data_helper'
local nginx = require 'helpers.nginx'
local q = helper.shell_quote

local INSPECT = '-m wick.data.inspect --seq-len 64 --global-batch 12 --micro-batch 2 --buffer-tokens 4096 '
  .. '--window-tokens 40000'

local function inspect(data, args, env)
  return helper.sh(('%s %s %s --data %s %s'):format(env or '', q(helper.RUN), INSPECT, q(data), args or ''))
end

local function with_cache(cache, extra)
  return ('WICK_CACHE_DIR=%s %s'):format(q(cache), extra or '')
end

if not nginx.binary() then
  describe('remote datasets', function()
    pending('need nginx (make deps installs it: apt-get install nginx)')
  end)
  return
end

describe('a remote dataset over HTTP', function()
  local root, server, zstd, raw
  setup(function()
    root = helper.tmpdir()
    zstd = data_helper.make_dataset(root .. '/zstd', data_helper.documents(2400, 60),
      { shard_size = 24000, block_size = 512, compression = 'zstd' })
    raw = data_helper.make_dataset(root .. '/raw', data_helper.documents(900, 60, 7),
      { shard_size = 16000, block_size = 512, compression = 'none' })
    server = nginx.start(root)
  end)
  teardown(function()
    if server then server:stop() end
    helper.rmtree(root)
  end)

  it('gives every rank exactly the samples of local reading, zstd and raw, and after a resume', function()
    for _, name in ipairs { 'zstd', 'raw' } do
      local cache = helper.tmpdir()
      for rank = 0, 2 do
        local args = ('--world 3 --rank %d --steps 4'):format(rank)
        local here, there = inspect(root .. '/' .. name, args), inspect(server.url .. '/' .. name, args, with_cache(cache))
        assert.are.equal(0, here.rc, here.err)
        assert.are.equal(0, there.rc, there.err)
        assert.are.equal(4 * 4, #helper.lines(here.out))
        assert.are.equal(here.out, there.out, name .. ' rank ' .. rank)
      end
      -- save a cursor after 3 steps remotely, resume it locally and remotely: the same lines
      local cursor = cache .. '/cursor'
      local saved = inspect(server.url .. '/' .. name, '--world 3 --rank 1 --steps 3 --save-cursor ' .. q(cursor),
        with_cache(cache))
      assert.are.equal(0, saved.rc, saved.err)
      local args = '--world 3 --rank 1 --steps 3 --from ' .. q(cursor)
      local here, there = inspect(root .. '/' .. name, args), inspect(server.url .. '/' .. name .. '/index.json', args,
        with_cache(cache))
      assert.are.equal(0, there.rc, there.err)
      assert.are.equal(here.out, there.out)
      assert.matches('step=3 ', there.out)
      helper.rmtree(cache)
    end
  end)

  it('reads by range: the index once, each shard header and tables, then only the blocks drawn', function()
    local cache = helper.tmpdir()
    server:clear_log()
    local r = inspect(server.url .. '/zstd', '--world 1 --steps 1 --threads 1', with_cache(cache))
    assert.are.equal(0, r.rc, r.err)
    local requests, whole, index = server:requests(), 0, 0
    for _, request in ipairs(requests) do
      if request.uri:match('index%.json$') then index = index + 1
      elseif not request.range then whole = whole + 1 end
      assert.are.equal(request.range and 206 or 200, request.status)
    end
    assert.are.equal(1, index)
    assert.are.equal(0, whole, 'no shard is downloaded whole')
    helper.rmtree(cache)
  end)

  it('is opened by wick.dataset.open, with the same tokens as the local copy', function()
    local cache = helper.tmpdir()
    local code = ([[
      local dataset = require 'wick.dataset'
      local here = assert(dataset.open(%q))
      local there = assert(dataset.open(%q, { cache_dir = %q, max_transfers = 4 }))
      assert(here.shards == there.shards and here.tokens == there.tokens)
      for shard = 0, here.shards - 1, 5 do
        local n = here:shard(shard).tokens
        local a, b = here:read(shard, 0, n), there:read(shard, 0, n)
        for i = 0, n - 1 do assert(a[i] == b[i], 'token ' .. i .. ' of shard ' .. shard) end
      end
      local s = there:stats().remote
      print(s.requests > 0, s.bytes_fetched > 0, s.cache_misses > 0)
    ]]):format(zstd, server.url .. '/zstd', cache)
    local r = helper.run('-e ' .. q(code))
    assert.are.equal(0, r.rc, r.err)
    assert.are.equal('true\ttrue\ttrue\n', r.out)
    helper.rmtree(cache)
  end)

  it('fails at once on 404 with the URL, the status and the attempt count', function()
    local cache = helper.tmpdir()
    local started = require('wick.core').now()
    local r = inspect(server.url .. '/nothing-here', '', with_cache(cache))
    assert.are_not.equal(0, r.rc)
    assert.matches(server.url .. '/nothing-here/index.json', r.err, 1, true)
    assert.matches('HTTP 404', r.err, 1, true)
    assert.matches('attempt 1', r.err, 1, true)
    assert.is_true(require('wick.core').now() - started < 5)
    helper.rmtree(cache)
  end)

  it('gives up on a server that is not there after its retries, naming the URL and the attempts', function()
    local cache = helper.tmpdir()
    local started = require('wick.core').now()
    -- a port nothing listens on: the one of a stopped server
    local gone = nginx.start(root)
    local url = gone.url
    gone:stop()
    local code = ([[
      local ok, err = pcall(require('wick.data').loader, { data = %q, cache_dir = %q, retries = 2,
                                                            connect_timeout_ms = 500 })
      print(ok, err)
    ]]):format(url .. '/zstd', cache)
    local r = helper.run('-e ' .. q(code))
    assert.are.equal(0, r.rc, r.err)
    assert.matches('^false', r.out)
    assert.matches(url .. '/zstd/index.json', r.out, 1, true)
    assert.matches('gave up after 3 attempts', r.out, 1, true)
    assert.is_true(require('wick.core').now() - started < 10)
    helper.rmtree(cache)
  end)
end)

describe('a remote dataset over HTTPS', function()
  local root, server
  setup(function()
    root = helper.tmpdir()
    data_helper.make_dataset(root .. '/ds', data_helper.documents(600, 40), { shard_size = 12000, block_size = 512,
      compression = 'zstd' })
    server = nginx.start(root, { tls = true })
  end)
  teardown(function()
    if server then server:stop() end
    helper.rmtree(root)
  end)

  it('verifies the certificate (WICK_CA_BUNDLE names the CA) and speaks HTTP/2', function()
    local cache = helper.tmpdir()
    local refused = inspect(server.url .. '/ds', '--steps 1', with_cache(cache))
    assert.are_not.equal(0, refused.rc)
    assert.matches('WICK_CA_BUNDLE', refused.err, 1, true)
    local here = inspect(root .. '/ds', '--steps 2')
    local there = inspect(server.url .. '/ds', '--steps 2', with_cache(cache, 'WICK_CA_BUNDLE=' .. q(server.ca)))
    assert.are.equal(0, there.rc, there.err)
    assert.are.equal(here.out, there.out)
    local protocols = {}
    for _, request in ipairs(server:requests()) do protocols[request.protocol] = true end
    assert.is_true(protocols['HTTP/2.0'], 'requests were made over HTTP/2')
    helper.rmtree(cache)
  end)
end)
