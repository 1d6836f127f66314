-- The node's shared memory (/dev/shm) at its trust boundary, with real rank processes: a region another
-- user planted under a job's name is refused naming the file and its owner (planted by a throwaway
-- user for a job run as root, and by root for a job run as that user), names depend on the job's
-- secret and the user, and regions of jobs whose ranks were killed or died of an error are reclaimed by
-- the next job on the node and by the launcher when its job ends.
local helper = require 'helper'
local data_helper = require 'helpers.data'
local q = helper.shell_quote

local SEQ, BUFFER, CACHE = 32, 2048, 600 * 1024
local SECRET = 'shared-memory-spec-secret-0123456789'

local NO_STRANGER = 'no second user: needs root, useradd and runuser, and a checkout other users may run'
local root, data, stranger
setup(function()
  root = helper.tmpdir()
  os.execute('chmod 755 ' .. q(root))
  data = data_helper.make_dataset(root .. '/zstd', data_helper.documents(1500, 60, 9),
    { shard_size = 8192, block_size = 512, compression = 'zstd' })
  -- A throwaway user, when we may make one (root, useradd) and it may run this checkout (runuser).
  local name = 'wkshm' .. helper.read_file('/proc/sys/kernel/random/uuid'):gsub('%W', ''):sub(1, 8)
  if helper.sh('useradd --no-create-home --shell /bin/false ' .. name).rc == 0 then
    if helper.sh(('runuser -u %s -- %s -e "return 0"'):format(name, q(helper.RUN))).rc == 0 then
      stranger = name
    else
      os.execute('userdel ' .. name)
    end
  end
end)
teardown(function()
  if stranger then os.execute('userdel ' .. stranger .. ' 2>/dev/null') end
  helper.rmtree(root)
end)

local function unique(prefix)
  return prefix .. helper.read_file('/proc/sys/kernel/random/uuid'):gsub('%W', '')
end

-- Starts the two ranks of one node by hand (as torchrun would: a job id, no launcher), optionally as
-- another user and with the job's secret; waits for both; returns their outputs and exit statuses, and
-- the node caches they name (WICK_LOG=debug, unless opts.quiet: a user's error is then one line).
local function run_pair(opts)
  -- Logs of their own: a job id may be run again, and an old log's exit line must not be read as theirs.
  local job, run = opts.job or unique('j'), root .. '/' .. unique('run')
  local ready = run .. '-ready'
  os.execute('mkdir -p ' .. q(ready) .. ' && chmod 777 ' .. q(ready))
  local logs = {}
  for rank = 0, 1 do
    local log = ('%s-%d.log'):format(run, rank)
    local env = ('RANK=%d WORLD_SIZE=2 LOCAL_RANK=%d LOCAL_WORLD_SIZE=2 WICK_JOB_ID=%s WICK_LOG=%s %s'):format(
      rank, rank, job, opts.quiet and 'warn' or 'debug', opts.secret and ('WICK_STORE_SECRET=' .. q(opts.secret)) or '')
    local as = opts.user and ('runuser -u ' .. opts.user .. ' -- ') or ''
    logs[rank] = log
    os.execute(('( %senv %s %s %s/tests/helpers/stream_rank.lua %s %d 16 %d %d %s %s %s > %s 2>&1; echo "exit=$?" >> %s ) &')
      :format(as, env, q(helper.RUN), helper.ROOT, q(data), SEQ, BUFFER, CACHE, q(ready), opts.die_after or '',
        opts.how or '', q(log), q(log)))
  end
  local outputs, codes = {}, {}
  local deadline = os.time() + 120
  for rank = 0, 1 do
    repeat
      outputs[rank] = helper.read_file(logs[rank])
      codes[rank] = tonumber(outputs[rank]:match('exit=(%d+)\n$'))
      if not codes[rank] then os.execute('sleep 0.1') end
    until codes[rank] or os.time() > deadline
    assert.is_truthy(codes[rank], ('rank %d did not finish in 120 s:\n%s'):format(rank, outputs[rank]))
  end
  local names, bytes = data_helper.node_caches(outputs[0] .. outputs[1])
  return { out = outputs[0] .. outputs[1], codes = codes, names = names, bytes = bytes }
end

-- The name a job's node cache gets and its size, learnt from a run of it that ends normally (and
-- removes it).
local function name_of(opts)
  local r = run_pair(opts)
  assert.are.same({ [0] = 0, [1] = 0 }, r.codes, r.out)
  assert.are.equal(1, #r.names, r.out)
  assert.are.same({}, data_helper.node_caches_left(r.names))
  return r.names[1], r.bytes[r.names[1]]
end

-- A region of the size the job expects, readable and writable by anyone, as `user` (nil: root).
local function plant(name, bytes, user)
  local as = user and ('runuser -u ' .. user .. ' -- ') or ''
  local r = helper.sh(as .. 'sh -c ' .. q(('umask 0 && truncate -s %d %s'):format(bytes, name)))
  assert.are.equal(0, r.rc, r.err)
end

local function assert_refused(r, name, owner)
  for rank = 0, 1 do
    assert.are.equal(1, r.codes[rank], r.out)
  end
  local uid = helper.sh('id -u ' .. owner).out:match('%d+')
  local expected = ("refusing shared memory '%s': owned by '%s' (uid %s) with mode 0666"):format(
    name:gsub('^/dev/shm', '/dev/shm'), owner, uid)
  assert.is_truthy(r.out:find(expected, 1, true), expected .. '\n' .. r.out)
  assert.is_nil(r.out:find('stack traceback', 1, true), r.out)
end

describe('a region planted under a job\'s name', function()
  it('is refused, naming the file and its owner, when another user planted it', function()
    if not stranger then pending(NO_STRANGER) return end
    local job = unique('j')
    local name, bytes = name_of { job = job, secret = SECRET }
    plant(name, bytes, stranger)
    local r = run_pair { job = job, secret = SECRET, quiet = true }
    local left = data_helper.node_caches_left({ name }) -- another user's file: not ours to remove
    os.remove(name)
    assert_refused(r, name, stranger)
    assert.are.same({ name }, left)
  end)

  it('is refused by a job of another user when root planted it (the owner check, not permissions)', function()
    if not stranger then pending(NO_STRANGER) return end
    local job = unique('j')
    local name, bytes = name_of { job = job, secret = SECRET, user = stranger }
    plant(name, bytes) -- root's, mode 0666: the stranger may open it, and must not map it
    local r = run_pair { job = job, secret = SECRET, user = stranger, quiet = true }
    os.remove(name)
    assert_refused(r, name, 'root')
  end)
end)

describe('the names of a job\'s regions', function()
  it('differ with the job\'s secret and with the user, for the same job id', function()
    if not stranger then pending(NO_STRANGER) return end
    local job = unique('j')
    local with_secret = name_of { job = job, secret = SECRET }
    local other_secret = name_of { job = job, secret = SECRET .. '-other' }
    local other_user = name_of { job = job, secret = SECRET, user = stranger }
    assert.are_not.equal(with_secret, other_secret)
    assert.are_not.equal(with_secret:match('^/dev/shm/wick%-%d+%-(.*)'), other_user:match('^/dev/shm/wick%-%d+%-(.*)'))
    assert.is_nil(with_secret:find(job, 1, true), with_secret)
  end)
end)

describe('regions of jobs that ended without removing them', function()
  it('are gone after 20 kill -9 cycles and one normal job', function()
    local dead = {}
    for cycle = 1, 20 do
      local r = run_pair { die_after = 10 }
      assert.are.same({ [0] = 137, [1] = 137 }, r.codes, r.out) -- both ranks SIGKILLed mid-stream
      assert.are.equal(1, #r.names, r.out)
      -- The killed ranks could not remove it; whether it is still there now is not asked: another Wick job
      -- of this user (a second test run) removes dead jobs' regions when it starts, as the normal job below does.
      dead[#dead + 1] = r.names[1]
    end
    local ready = root .. '/' .. unique('ready')
    os.execute('mkdir -p ' .. q(ready))
    local normal = helper.run(('--nproc-per-node 2 %s/tests/helpers/stream_rank.lua %s %d 16 %d %d %s'):format(
      helper.ROOT, q(data), SEQ, BUFFER, CACHE, q(ready)))
    assert.are.equal(0, normal.rc, normal.out .. normal.err)
    assert.are.same({}, data_helper.node_caches_left(dead))
  end)

  it('are removed by the launcher when its job ends, whatever its ranks died of', function()
    for _, how in ipairs { 'kill', 'error' } do
      local ready = root .. '/' .. unique('ready')
      os.execute('mkdir -p ' .. q(ready))
      local r = helper.sh(('WICK_LOG=debug %s --nproc-per-node 2 %s/tests/helpers/stream_rank.lua %s %d 16 %d %d %s 10 %s')
        :format(q(helper.RUN), helper.ROOT, q(data), SEQ, BUFFER, CACHE, q(ready), how))
      assert.are.equal(how == 'kill' and 137 or 1, r.rc, r.out .. r.err)
      local names = data_helper.node_caches(r.out .. r.err)
      assert.are.equal(1, #names, how .. ':\n' .. r.out .. r.err)
      assert.are.same({}, data_helper.node_caches_left(names), how)
    end
  end)
end)
