-- wick.dist with real ranks: `run --nproc-per-node N` starts real processes that meet through the
-- TCP store and all-reduce through Gloo; the hang tests kill, stop or misroute one of them and
-- read what the others and the launcher say.
local helper = require 'helper'
local stranger = require 'helpers.stranger'
local q = helper.shell_quote

local FIXTURES = 'tests/fixtures/dist/'  -- relative to the checkout: reports quote it as given
local HANG_TIMEOUT = 3     -- seconds: the dist timeout the hang fixture runs with
local HANG_LINE = 'tests/fixtures/dist/hang.lua:31'  -- its all_reduce call

local function launch(nproc, script, args, limit, env)
  local started = require('wick.core').now()
  local r = helper.sh(('cd %s && %s timeout %d %s --nproc-per-node %d %s %s'):format(q(helper.ROOT), env or '',
    limit or 120, q(helper.RUN), nproc, q(script), args or ''))
  r.seconds = require('wick.core').now() - started
  return r
end

local function lines_of(text, rank)
  local out = {}
  for line in text:gmatch('[^\n]+') do
    local body = line:match('^%[rank' .. rank .. '%] (.*)$')
    if body then out[#out + 1] = body end
  end
  return out
end

describe('wick.dist collectives', function()
  for _, nproc in ipairs({ 1, 2, 3, 4 }) do
    it(('are exact on %d rank%s over f32, bf16, f16, i32, i64 and u8, sizes 0, 1, 7 and 1048583'):format(nproc,
      nproc > 1 and 's' or ''), function()
      local r = launch(nproc, FIXTURES .. 'collectives.lua')
      assert.are.equal(0, r.rc, r.out .. r.err)
      for rank = 0, nproc - 1 do
        local lines = lines_of(r.out, rank)
        assert.matches('^checked %d+$', lines[#lines] or '', 1, false, 'rank ' .. rank .. ':\n' .. r.out .. r.err)
      end
    end)
  end

  it('is a world of 1 without the launcher variables, and opens no socket at all', function()
    local code = [[
      local wick = require 'wick'
      local d = wick.dist.init { timeout = 5 }
      local t = wick.tensor.full({ 3 }, 2)
      d:all_reduce(t, 'avg')
      local out = wick.tensor.zeros({ 3 })
      d:all_gather(out, t)
      d:barrier()
      local sockets = io.popen('ls -l /proc/' .. require('ffi').C.getpid() .. '/fd'):read('*a'):match('socket:') and 'yes' or 'no'
      print(d.rank, d.world_size, d.local_rank, d.local_world_size, t:get(1), out:get(3), sockets, d.store == nil)
      d:close()]]
    local r = helper.sh('env -u RANK -u WORLD_SIZE -u SLURM_PROCID ' .. q(helper.RUN) .. ' -e '
      .. q("require('ffi').cdef('int getpid(void);')") .. ' -e ' .. q(code))
    assert.are.equal(0, r.rc, r.err)
    assert.are.equal('0\t1\t0\t1\t2\t2\tno\ttrue\n', r.out)
  end)

  it('refuses a bad environment with the variable named, in one line (exit 2)', function()
    local r = helper.sh('env RANK=2 WORLD_SIZE=2 ' .. q(helper.RUN) .. ' -e ' .. q("require('wick').dist.init{}"))
    assert.are.equal(2, r.rc)
    assert.are.equal('RANK=2 is not below the world size 2\n', r.err)
    r = helper.sh('env WICK_STORE_SECRET=short ' .. q(helper.RUN) .. ' --nproc-per-node 2 -e '
      .. q("require('wick').dist.init { timeout = 5 }"))
    assert.are.equal(2, r.rc, r.err)
    assert.matches('%[rank1%] [^\n]*WICK_STORE_SECRET: the job secret must be 16 to 1024 bytes, not 5\n', r.err)
    assert.is_nil(r.err:find('traceback', 1, true), r.err)
    r = helper.sh(q(helper.RUN) .. ' -e ' .. q("require('wick').dist.init{ timeout = -1 }"))
    assert.matches('dist.init option timeout = %-1 must be a number of seconds in %(0, 604800%]', r.err)
    r = helper.sh(q(helper.RUN) .. ' -e ' .. q("require('wick').dist.init{ timout = 1 }"))
    assert.matches("unknown dist.init option 'timout' (did you mean 'timeout'?)", r.err, 1, true)
  end)

  it('shares the store with every rank: add, compare_set and wait across processes', function()
    local code = [[
      local d = require('wick').dist.init { timeout = 10 }
      local n = d.store:add('arrived', 1)
      local value, won = d.store:compare_set('leader', '', 'rank' .. d.rank)
      d.store:set('done/' .. d.rank, 'x')
      local keys = {}
      for r = 0, d.world_size - 1 do keys[#keys + 1] = 'done/' .. r end
      assert(d.store:wait(keys, 10))
      assert(d.store:get('arrived') == tostring(d.world_size))
      print(won and 'won' or 'lost', value:match('^rank%d$') ~= nil, n >= 1 and n <= d.world_size)
      assert(d.store:get('nobody', 0) == nil)
      d:close()]]
    local r = helper.run('--nproc-per-node 3 -e ' .. q(code))
    assert.are.equal(0, r.rc, r.err)
    local won = select(2, r.out:gsub('won\ttrue\ttrue', ''))
    local lost = select(2, r.out:gsub('lost\ttrue\ttrue', ''))
    assert.are.same({ 1, 2 }, { won, lost }, r.out)
  end)
end)

describe('wick.dist store: the job\'s alone', function()
  local function start_job(nproc)
    local ready, finish = stranger.start_job { function(args)
      return ('timeout 120 %s --nproc-per-node %d %s %s'):format(q(helper.RUN), nproc, q(FIXTURES .. 'stranger.lua'), args)
    end }
    return ready, function() return finish()[1] end
  end

  it('serves no process of another user: each attempt refused and logged, no key set, the secret unreadable, job exact', function()
    local ready, finish = start_job(2)
    local addr, port, pid = ready()
    local r, why = stranger.as_other_user(('sh -c %s; %s'):format(
      q('cat /proc/' .. pid .. '/environ > /dev/null 2>&1 && echo environ-readable'), stranger.command(addr, port, 2)))
    local job = finish()
    if not r then
      pending(why)
      return
    end
    assert.are.equal(0, job.rc, job.out .. job.err)
    assert.are.equal('', r.out, 'the other user read the ranks\' environment')
    for rank = 0, 1 do
      assert.matches('%[rank' .. rank .. '%] key absent, sum 3, sockets on', job.out)
    end
    local _, refused = job.err:gsub('%[rank0%] [^\n]*store server: refused the connection from 127%.0%.0%.1:%d+: ', '')
    assert.are.equal(stranger.ATTEMPTS, refused, job.err)
    assert.is_nil(job.err:find('unauthenticated', 1, true), job.err)
  end)

  it('listens and talks on loopback only for a single-node job: the store and Gloo\'s pairs', function()
    local ready, finish = start_job(3)
    ready()
    local job = finish()
    assert.are.equal(0, job.rc, job.out .. job.err)
    local addresses, listeners = stranger.addresses(job.out)
    for _, address in ipairs(addresses) do assert.matches('^127%.0%.0%.1:%d+$', address, 1, false, job.out) end
    assert.are.equal(1, listeners, job.out) -- the store; Gloo closed its listeners once connected
    assert.is_true(#addresses >= 1 + 3 * 3, job.out) -- and each rank's store connection and 2 Gloo pairs
  end)

  it('serve_store and connect_store take the job\'s secret from the environment and check the world size', function()
    local code = [[
      local dist = require('wick').dist
      local server = dist.serve_store { world_size = 2 }
      local a = dist.connect_store { port = server:port(), rank = 0, world_size = 2, timeout = 5 }
      a:set('k', 'v')
      local ok, err = pcall(dist.connect_store, { port = server:port(), rank = 1, world_size = 3, timeout = 5 })
      print(a:get('k', 0), ok, err:match('WORLD_SIZE=3, but rank 0 has WORLD_SIZE=2') ~= nil)
      ok, err = pcall(dist.connect_store, { port = server:port(), rank = 1 })
      print(ok, err:match('rank and world_size name a rank of the job: give both or neither') ~= nil)
      ok, err = pcall(a.add, a, 'n', 0.5)
      print(ok, err:match('argument delta = 0.5 must be a whole number') ~= nil)
      ok, err = pcall(a.get, a, 'k', -1)
      print(ok, err:match('argument timeout = %-1 must be a number of seconds') ~= nil)
      a:close()
      server:stop()]]
    local r = helper.sh(('env WICK_STORE_SECRET=%s %s -e %s'):format(string.rep('k', 32), q(helper.RUN), q(code)))
    assert.are.equal(0, r.rc, r.err)
    assert.are.equal('v\tfalse\ttrue\n' .. string.rep('false\ttrue\n', 3), r.out)
    assert.is_nil(r.err:find('unauthenticated', 1, true), r.err)
  end)

  it('checks every option and argument where it enters: type, integrality, range, unknown keys', function()
    local dist = require('wick').dist
    local function refused(fn, ...)
      local ok, err = pcall(fn, ...)
      assert.is_false(ok)
      return err
    end
    assert.matches("unknown dist.serve_store option 'prot' (did you mean 'port'?)",
      refused(dist.serve_store, { prot = 1 }), 1, true)
    assert.matches('dist.serve_store option port = 70000 must be within [0, 65535]',
      refused(dist.serve_store, { port = 70000 }), 1, true)
    assert.matches('dist.serve_store option world_size = 1.5 must be a whole number',
      refused(dist.serve_store, { world_size = 1.5 }), 1, true)
    assert.matches('dist.serve_store option host = "" must be a host name or address',
      refused(dist.serve_store, { host = '' }), 1, true)
    assert.matches('dist.connect_store option port is required', refused(dist.connect_store, {}), 1, true)
    assert.matches('dist.connect_store: rank 2 is not below world_size 2',
      refused(dist.connect_store, { port = 1, rank = 2, world_size = 2 }), 1, true)
    assert.matches('dist.connect_store option timeout = nan must be a number of seconds',
      refused(dist.connect_store, { port = 1, timeout = 0 / 0 }), 1, true)
    local group = dist.init { timeout = 5 }
    local t = require('wick').tensor.zeros { 1 }
    assert.matches('root 1 is not a rank of this world of 1', refused(group.broadcast, group, t, 1), 1, true)
    assert.matches('argument root = -1 must be within', refused(group.broadcast, group, t, -1), 1, true)
    group:close()
  end)

  it('fails ranks that disagree on WORLD_SIZE at the handshake, in one line naming both values', function()
    local port = 20000 + tonumber(helper.read_file('/proc/self/stat'):match('^(%d+)')) % 20000
    local env = ('env WICK_STORE_SECRET=%s MASTER_ADDR=127.0.0.1 MASTER_PORT=%d '):format(string.rep('s', 32), port)
    local code = q("require('wick').dist.init { timeout = 10 } print('joined')")
    local r = helper.sh(('%s RANK=0 WORLD_SIZE=2 timeout 60 %s -e %s & %s RANK=1 WORLD_SIZE=3 timeout 60 %s -e %s; wait')
      :format(env, q(helper.RUN), code, env, q(helper.RUN), code))
    assert.matches('rank 1 has WORLD_SIZE=3, but rank 0 has WORLD_SIZE=2', r.err)
    assert.is_nil(r.err:find('sizeof', 1, true), r.err)
    assert.is_nil(r.err:find('traceback', 1, true), r.err)
    assert.is_nil(r.out:find('joined', 1, true), r.out)
  end)
end)

describe('wick.dist hang reports', function()
  -- Runs the hang fixture on 4 ranks with rank 2 misbehaving; returns the result and the
  -- report lines of the survivors.
  -- A rank that leaves early leaks by design: under ASan, leak checking would turn its exit 0 into
  -- a failure of its own.
  local function misbehave(mode)
    local r = launch(4, FIXTURES .. 'hang.lua', ('%s 2 %d'):format(mode, HANG_TIMEOUT), 60, 'ASAN_OPTIONS=detect_leaks=0')
    local reports = {}
    for _, rank in ipairs({ 0, 1, 3 }) do
      for _, line in ipairs(lines_of(r.err, rank)) do
        if line:match('rank %d: all_reduce #3') then reports[rank] = line end
      end
    end
    return r, reports
  end

  local function check_reports(r, reports, cause)
    for _, rank in ipairs({ 0, 1, 3 }) do
      local line = reports[rank]
      assert.is_not_nil(line, 'rank ' .. rank .. ' printed no report:\n' .. r.err)
      -- the collective, its sequence number and size, and the recipe line that called it
      assert.matches(HANG_LINE .. ': rank ' .. rank .. ': all_reduce #3 %(1000 f32%) at ' .. HANG_LINE, line)
      assert.matches(cause, line)
      -- within the timeout: the report's own clock, from entering the collective to failing
      local waited = tonumber(line:match(' after ([%d.]+) s'))
      assert.is_true(waited ~= nil and waited <= HANG_TIMEOUT + 1, line)
    end
    assert.is_true(r.seconds < HANG_TIMEOUT + 20, ('the job took %.1f s'):format(r.seconds))
  end

  it('names a rank killed with SIGKILL, and the launcher reports it', function()
    local r, reports = misbehave('sigkill')
    assert.are.equal(128 + 9, r.rc)
    check_reports(r, reports, 'waiting for 1 rank: rank 2 left without dist:close%(%) %(killed, crashed or '
      .. 'exited early%) after entering all_reduce #2 %(1000 f32%) at ' .. HANG_LINE)
    assert.matches('run: rank 2 %(pid %d+%) was killed by signal 9', r.err)
  end)

  it('names a rank that exits 0 early, and the launcher reports it', function()
    local r, reports = misbehave('exit0')
    assert.are.equal(1, r.rc)
    check_reports(r, reports, 'rank 2 left without dist:close%(%)')
    assert.matches('run: rank 2 %(pid %d+%) had exited with status 0 [%d.]+ s before, while the others still ran', r.err)
  end)

  it('names a rank that closed its process group early', function()
    local r, reports = misbehave('close')
    assert.are.equal(1, r.rc)
    check_reports(r, reports, 'rank 2 called dist:close%(%) after all_reduce #2')
  end)

  it('names a rank that fell behind, within the timeout', function()
    local r, reports = misbehave('behind')
    assert.are_not.equal(0, r.rc)
    -- 'timed out after', or 'failed after' when a peer's own timeout closed its connection first
    check_reports(r, reports, 'after [%d.]+ s waiting for 1 rank: rank 2 is behind, last in all_reduce #2')
    assert.is_true(r.seconds >= HANG_TIMEOUT, 'failed before the timeout')
  end)

  it('names a rank that went into another collective', function()
    local r, reports = misbehave('astray')
    assert.are_not.equal(0, r.rc)
    check_reports(r, reports, 'rank 2 is in a different collective, barrier #3 at tests/fixtures/dist/hang.lua:28')
  end)
end)

describe('wick.dist over NCCL', function()
  local module = helper.ROOT .. '/build/libwick_nccl.so'
  local function smoke()
    return helper.sh(('cd %s && ASAN_OPTIONS=detect_leaks=0 %s tests/fixtures/dist/nccl_smoke.lua'):format(
      q(helper.ROOT), q(helper.RUN)))
  end

  it('has a module that links against NCCL and makes a unique id (no GPU needed)', function()
    if not io.open(module) then
      pending('skipped: libwick was built without NCCL (make prints ✗ NCCL and why)')
      return
    end
    local r = smoke()
    assert.are.equal(0, r.rc, r.out .. r.err)
    assert.matches('unique id: 128 bytes', r.out)
  end)

  -- nccl_module.h's list is the one declaration: the module is compiled against it and the smoke
  -- test's cdef made from it, so the functions the module exports are the ones the cdef declares.
  it("exports exactly the functions the smoke test's cdef declares (no GPU needed)", function()
    if not io.open(module) then
      pending('skipped: libwick was built without NCCL (make prints ✗ NCCL and why)')
      return
    end
    local declared, exported = {}, {}
    for name in require('wick.nccl_cdef'):gmatch('(wk_nccl_[%w_]+)%s*%(') do declared[#declared + 1] = name end
    local r = helper.sh('nm -D --defined-only ' .. q(module))
    assert.are.equal(0, r.rc, r.err)
    for name in r.out:gmatch(' T (wk_nccl_[%w_]+)') do exported[#exported + 1] = name end
    table.sort(declared)
    table.sort(exported)
    assert.are.same({ 'wk_nccl_free', 'wk_nccl_init', 'wk_nccl_run', 'wk_nccl_unique_id' }, declared)
    assert.are.same(declared, exported)
  end)

  -- The modules are opened with RTLD_NOW: a libwick function they call that libwick does not
  -- export would make every load fail (or, loaded lazily, crash at the first call).
  it('calls only functions libwick exports, so the loader can open it (no GPU needed)', function()
    if not io.open(module) then
      pending('skipped: libwick was built without NCCL (make prints ✗ NCCL and why)')
      return
    end
    local exported = {}
    local lib = helper.sh('nm -D --defined-only ' .. q(helper.ROOT .. '/build/libwick.so'))
    for name in lib.out:gmatch(' [TDB] (wk_[%w_]+)') do exported[name] = true end
    local calls = helper.sh('nm -D --undefined-only ' .. q(module))
    local called = 0
    for name in calls.out:gmatch('U (wk_[%w_]+)') do
      assert.is_true(exported[name], name .. ' is called by the NCCL module but not exported by libwick.so')
      called = called + 1
    end
    assert.is_true(called > 0, calls.out)
  end)

  local function gpus_or_skip(wanted)
    local count = require('wick.core').C.wk_cuda_device_count()
    if count >= wanted and io.open(module) then return count end
    local reason = ('needs %d GPU%s and the NCCL module (found %d GPU%s)'):format(wanted, wanted > 1 and 's' or '',
      count, count == 1 and '' or 's')
    if os.getenv('WICK_REQUIRE_GPU') == '1' and count == 0 then error('WICK_REQUIRE_GPU=1 but ' .. reason) end
    pending('skipped: ' .. reason)
  end

  it('all-reduces, broadcasts, gathers and scatters CUDA tensors on one GPU #gpu', function()
    if not gpus_or_skip(1) then return end
    local r = smoke()
    assert.are.equal(0, r.rc, r.out .. r.err)
    assert.matches('nccl smoke ok', r.out)
  end)

  -- NCCL's timeout reaches the same hang report as Gloo's (comm.c's execute writes it for both).
  it('names a rank that fell behind in an NCCL all-reduce, with the collective and its line #gpu', function()
    if not gpus_or_skip(2) then return end
    local r = launch(2, FIXTURES .. 'hang.lua', ('behind 1 %d cuda'):format(HANG_TIMEOUT), 60, 'ASAN_OPTIONS=detect_leaks=0')
    assert.are_not.equal(0, r.rc)
    local report
    for _, line in ipairs(lines_of(r.err, 0)) do
      if line:match('rank 0: all_reduce #3') then report = line end
    end
    assert.is_not_nil(report, 'rank 0 printed no report:\n' .. r.err)
    assert.matches('rank 0: all_reduce #3 %(1000 f32%) at ' .. HANG_LINE .. ' [%a ]+ after [%d.]+ s waiting for 1 rank: '
      .. 'rank 1 is behind, last in all_reduce #2', report)
    assert.matches('NCCL', report)  -- the backend's own words, kept at the end
  end)

  it('is exact over every dtype and size with one rank per GPU #gpu', function()
    local count = gpus_or_skip(2)
    if not count then return end
    local r = launch(count, FIXTURES .. 'collectives.lua', 'cuda')
    assert.are.equal(0, r.rc, r.out .. r.err)
    for rank = 0, count - 1 do
      local lines = lines_of(r.out, rank)
      assert.matches('^checked %d+$', lines[#lines] or '')
    end
  end)
end)
