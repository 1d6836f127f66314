-- Remote datasets over HTTP(S) from a real nginx (tests/helpers/nginx.lua) serving datasets the real
-- converter made: the samples a rank receives are exactly those of the same dataset read locally; the
-- node-shared disk cache downloads each range once and stays within its budget; errors name the URL,
-- the status and the attempts.
local helper = require 'helper'
local data_helper = require 'helpers.data'
local nginx = require 'helpers.nginx'
local q = helper.shell_quote

local INSPECT = '-m wick.data.inspect --seq-len 64 --global-batch 12 --micro-batch 2 --pool-tokens 4096 '
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
    local r = inspect(server.url .. '/zstd', '--world 1 --steps 1 --threads 1 --stats', with_cache(cache))
    assert.are.equal(0, r.rc, r.err)
    local requests, whole, index, bytes = server:requests(), 0, 0, 0
    for _, request in ipairs(requests) do
      if request.uri:match('index%.json$') then index = index + 1
      elseif not request.range then whole = whole + 1 end
      assert.are.equal(request.range and 206 or 200, request.status)
      bytes = bytes + request.bytes
    end
    assert.are.equal(1, index)
    assert.are.equal(0, whole, 'no shard is downloaded whole')
    local stats = {}
    for k, v in r.out:match('stats remote: ([^\n]*)'):gmatch('([%w_]+)=(%d+)') do stats[k] = tonumber(v) end
    -- inspect --stats counts what the server logged, as far as it had got when it printed them: the
    -- readers (and the read-ahead) run on past the printed steps, and the log is read after the exit
    assert.is_true(stats.requests > 2 and stats.requests <= #requests, stats.requests .. ' of ' .. #requests)
    assert.is_true(stats.bytes_fetched > 0 and stats.bytes_fetched <= bytes, stats.bytes_fetched .. ' of ' .. bytes)
    assert.is_true(stats.cache_misses > 0 and stats.wait_ns > 0)
    assert.are.equal(0, stats.retries_reset + stats.retries_server + stats.retries_timeout)
    assert.is_true(stats.disk_bytes > 0)
    helper.rmtree(cache)
  end)

  it('is opened by wick.dataset.open, with the same tokens as the local copy', function()
    local cache = helper.tmpdir()
    local code = ([[
      local dataset = require 'wick.data.dataset'
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

describe("docs/data.md's remote commands", function()
  it('run as written against a real server (the s3:// one in s3_spec.lua)', function()
    local docs = require 'helpers.docs'
    local root = helper.tmpdir()
    assert(os.execute(('mkdir -p %s/corpus %s/data'):format(q(root), q(root))) == 0)
    for i, doc in ipairs(data_helper.documents(200, 40, 9)) do helper.write_file(('%s/corpus/%d.txt'):format(root, i), doc) end
    local server = nginx.start(root .. '/data')
    local cache = helper.tmpdir()
    local ran = 0
    for _, line in ipairs(docs.commands('docs/data.md', 'Remote datasets')) do
      if not line:find('s3://', 1, true) then
        line = docs.substitute(line, { ['./run'] = q(helper.RUN), ['corpus/'] = q(root .. '/corpus'),
                                         ['data/web'] = q(root .. '/data/web'),
                                         ['https://data.example.org'] = server.url })
        local r = helper.sh('WICK_CACHE_DIR=' .. q(cache) .. ' ' .. line)
        assert.are.equal(0, r.rc, line .. '\n' .. r.out .. r.err)
        ran = ran + 1
      end
    end
    assert.are.equal(2, ran)
    assert.is_true(#server:requests() > 2)
    server:stop()
    helper.rmtree(cache)
    helper.rmtree(root)
  end)
end)

describe('converter inputs at URLs', function()
  it('are streamed by range and make the same shards as the local files; a missing one is named', function()
    local root = helper.tmpdir()
    assert(os.execute(('mkdir -p %s/in'):format(q(root))) == 0)
    -- ~3 MB of lines: the converter reads them in 1 MiB pieces, so by several Range requests
    local lines = {}
    for i, doc in ipairs(data_helper.documents(6000, 500, 5)) do
      lines[i] = ('{"text": "%s"}'):format(doc:gsub('[\\"]', ''):gsub('%c', ' '))
    end
    helper.write_file(root .. '/in/a.jsonl', table.concat(lines, '\n') .. '\n')
    helper.write_file(root .. '/in/b.txt', data_helper.documents(1, 3000, 6)[1])
    local server = nginx.start(root)
    local cache = helper.tmpdir()
    local function convert(a, b, out)
      return helper.sh(('%s %s -m wick.data.convert %s %s -o %s --shard-size 200000 -q'):format(with_cache(cache),
        q(helper.RUN), q(a), q(b), q(root .. '/' .. out)))
    end
    local here = convert(root .. '/in/a.jsonl', root .. '/in/b.txt', 'local')
    assert.are.equal(0, here.rc, here.err)
    server:clear_log()
    local there = convert(server.url .. '/in/a.jsonl', server.url .. '/in/b.txt', 'remote')
    assert.are.equal(0, there.rc, there.err)
    local shards = helper.sh(('cd %s/local && ls *.wks'):format(q(root))).out
    assert.is_true(#helper.lines(shards) > 2, shards)
    for _, name in ipairs(helper.lines(shards)) do
      assert.are.equal(helper.read_file(root .. '/local/' .. name), helper.read_file(root .. '/remote/' .. name), name)
    end
    local ranges = 0
    for _, request in ipairs(server:requests()) do
      assert.is_truthy(request.range, 'no input is fetched whole: ' .. request.uri)
      assert.are.equal(206, request.status)
      if request.uri == '/in/a.jsonl' then ranges = ranges + 1 end
    end
    assert.is_true(ranges >= 4, ranges .. ' requests for a.jsonl') -- its size, then its pieces
    local missing = convert(server.url .. '/in/a.jsonl', server.url .. '/in/nothing.jsonl', 'missing')
    assert.are_not.equal(0, missing.rc)
    assert.matches(server.url .. '/in/nothing.jsonl', missing.err, 1, true)
    assert.matches('HTTP 404', missing.err, 1, true)
    server:stop()
    helper.rmtree(cache)
    helper.rmtree(root)
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

describe('the node-shared disk cache', function()
  local root, server, zstd, dataset_bytes
  setup(function()
    root = helper.tmpdir()
    zstd = data_helper.make_dataset(root .. '/ds', data_helper.documents(2400, 60, 3),
      { shard_size = 24000, block_size = 512, compression = 'zstd' })
    dataset_bytes = tonumber(helper.sh('cat ' .. q(zstd) .. '/*.wks | wc -c').out)
    server = nginx.start(root)
  end)
  teardown(function()
    if server then server:stop() end
    helper.rmtree(root)
  end)

  -- Streams with tests/helpers/remote_rank.lua on `nproc` local ranks; returns the sorted audit lines,
  -- each rank's counters and what the ranks wrote to stderr.
  local function stream(data, cache, nproc, budget, extra)
    local audit = root .. '/audit-' .. math.random(1e9)
    local r = helper.run(('--nproc-per-node %d %s/tests/helpers/remote_rank.lua %s %s %s %d %s'):format(nproc,
      helper.ROOT, q(data), q(audit), q(cache), budget or 2 ^ 40, extra or ''))
    assert.are.equal(0, r.rc, r.out .. r.err)
    local lines = helper.lines(helper.read_file(audit))
    table.sort(lines)
    os.remove(audit)
    local counters = {}
    for line in r.out:gmatch('[^\n]+') do
      local c = {}
      for k, v in line:gmatch('([%w_]+)=(%d+)') do c[k] = tonumber(v) end
      counters[#counters + 1] = c
    end
    return lines, counters, r.err
  end

  local function data_requests()
    local seen, count, bytes, repeated = {}, 0, 0, 0
    for _, request in ipairs(server:requests()) do
      if not request.uri:match('index%.json$') then
        local key = request.uri .. ' ' .. tostring(request.range)
        if seen[key] then repeated = repeated + 1 end
        seen[key] = true
        count, bytes = count + 1, bytes + request.bytes
      end
    end
    return count, bytes, repeated
  end

  local function index_requests()
    local n = 0
    for _, request in ipairs(server:requests()) do
      if request.uri:match('index%.json$') then n = n + 1 end
    end
    return n
  end

  it('lets two local ranks download each range once, the index once, and deliver the local samples', function()
    local cache = helper.tmpdir()
    local here = stream(zstd, cache, 2)
    server:clear_log()
    local there = stream(server.url .. '/ds', cache, 2)
    assert.are.same(here, there)
    local _, bytes, repeated = data_requests()
    assert.are.equal(0, repeated, 'a range was downloaded twice')
    assert.are.equal(1, index_requests(), 'the index is fetched once per node')
    -- every byte of the shards at most once: headers, tables and blocks, not all the alignment padding
    -- between blocks (64-byte aligned blocks of ~220 bytes here: up to a fifth of the file)
    assert.is_true(bytes <= dataset_bytes and bytes > 0.8 * dataset_bytes,
      ('downloaded %d bytes of a %d-byte dataset'):format(bytes, dataset_bytes))
    helper.rmtree(cache)
  end)

  it('needs no data request when warm, and sees a changed remote dataset by its index', function()
    local cache = helper.tmpdir()
    stream(server.url .. '/ds', cache, 1)
    server:clear_log()
    local warm, counters = stream(server.url .. '/ds', cache, 1)
    assert.are.equal(0, (data_requests()), 'a warm cache asked for data')
    assert.are.equal(1, index_requests())
    assert.are.equal(304, server:requests()[1].status)
    assert.are.equal(0, counters[1].misses)
    assert.are.same(stream(zstd, cache, 1), warm)
    -- another dataset under the same URL: its own samples, none of the cached ones
    local changed = root .. '/changed'
    data_helper.make_dataset(changed, data_helper.documents(1500, 50, 99), { shard_size = 24000, block_size = 512,
      compression = 'zstd' })
    assert(os.execute(('mv %s %s/old && mv %s %s'):format(q(zstd), q(root), q(changed), q(zstd))) == 0)
    local new_here, new_there = stream(zstd, cache, 1), stream(server.url .. '/ds', cache, 1)
    assert(os.execute(('rm -rf %s && mv %s/old %s'):format(q(zstd), q(root), q(zstd))) == 0)
    assert.are.same(new_here, new_there)
    assert.are_not.same(warm, new_there)
    helper.rmtree(cache)
  end)

  it('keeps its files under a budget smaller than the dataset for a whole epoch', function()
    local cache = helper.tmpdir()
    local budget = math.floor(dataset_bytes / 3)
    local here = stream(zstd, cache, 1)
    local there, counters = stream(server.url .. '/ds', cache, 1, budget, 'all watch')
    assert.are.same(here, there)
    assert.is_true(counters[1].largest <= budget, ('%d bytes on disk, budget %d'):format(counters[1].largest, budget))
    assert.is_true(counters[1].largest > budget / 2, 'the cache was used')
    assert.is_true(counters[1].evicted > 0)
    helper.rmtree(cache)
  end)

  it('reads through without caching when the cache file system fills up, with one warning', function()
    local cache = helper.tmpdir()
    if helper.sh('mount -t tmpfs -o size=1M tmpfs ' .. q(cache)).rc ~= 0 then
      helper.rmtree(cache)
      pending('cannot mount a 1 MiB tmpfs here (the test needs root)')
      return
    end
    -- 192 KiB left: room for a few dozen ranges (a page each), far less than the epoch reads
    local room = 192 * 1024
    assert.are.equal(0, helper.sh(('head -c %d /dev/zero > %s/filler'):format(1024 * 1024 - room, q(cache))).rc)
    local local_cache = helper.tmpdir()
    local here = stream(zstd, local_cache, 1)
    helper.rmtree(local_cache)
    local ok, there, counters, err = pcall(stream, server.url .. '/ds', cache, 1, 2 ^ 40, 'all')
    local entries = tonumber(helper.sh('find ' .. q(cache .. '/v1/data') .. ' -type f | wc -l').out)
    local full = tonumber(helper.sh('df --output=avail -B1 ' .. q(cache) .. ' | tail -1').out)
    helper.sh('umount ' .. q(cache))
    helper.rmtree(cache)
    assert.is_true(ok, tostring(there))
    assert.are.same(here, there)
    assert.is_true(entries > 0, 'ranges were cached until the file system was full')
    assert.is_true(full < 8192, full .. ' bytes still free: the file system never filled')
    local warnings = select(2, err:gsub("wick%S* warn: cache '[^\n]*': the file system has no room %([^\n]*No space left on "
      .. 'device%): reading through without caching', ''))
    assert.are.equal(1, warnings, err)
    assert.is_true(counters[1].misses > entries, 'reads went past the full cache')
  end)
end)
