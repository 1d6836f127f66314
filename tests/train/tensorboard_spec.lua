-- log.tensorboard: real 2-rank training runs write event files that TensorBoard's own reader
-- (EventAccumulator, from the pinned test venv) reads back equal to the JSONL log, step by step, and
-- a run killed with SIGKILL and resumed leaves every step in the directory once. Without PyPI (no
-- venv) these tests are pending. The encoder's bytes are tests/c/test_tfevents.c's.
local ffi = require 'ffi'
local helper = require 'helper'
local data_helper = require 'helpers.data'
local json = require 'wick.json'
local q = helper.shell_quote

pcall(ffi.cdef, 'int usleep(unsigned int usec);')

local POLL_US = 20000
local WAIT_POLLS = 1500 -- 30 s
local READER = helper.ROOT .. '/tests/helpers/tensorboard_reader.py'

-- The JSONL records of a log, by step.
local function records(path)
  local out = {}
  for line in helper.read_file(path):gmatch('[^\n]+') do
    local r = assert(json.decode(line))
    assert.is_nil(out[r.step], 'step ' .. r.step .. ' twice in ' .. path)
    out[r.step] = r
  end
  return out
end

-- What each numeric field of a JSONL record is called in TensorBoard, written down here (not taken
-- from wick.tensorboard): tag -> value.
local function expected_scalars(r)
  local out = {}
  for k, v in pairs(r) do
    if type(v) == 'number' and k ~= 'step' then out[k == 'eval_loss' and 'eval/loss' or 'train/' .. k] = v end
  end
  for i, rank in ipairs(r.ranks) do
    for k, v in pairs(rank) do out[('ranks/%d/%s'):format(i - 1, k)] = v end
  end
  return out
end

local function float32(x) return tonumber(ffi.new('float[1]', x)[0]) end

-- EventAccumulator's scalars (tag -> list of { step, value }) and the stored events ({ file, step }).
local function read_back(python, dir)
  local r = helper.sh(q(python) .. ' ' .. q(READER) .. ' ' .. q(dir))
  assert.are.equal(0, r.rc, r.err)
  local scalars, events = {}, {}
  for line in r.out:gmatch('[^\n]+') do
    local kind, a, b, c = line:match('^(%S+) (%S+) (%S+) (%S+)')
    if kind == 'scalar' then
      scalars[a] = scalars[a] or {}
      table.insert(scalars[a], { tonumber(b), tonumber(c) })
    else
      events[#events + 1] = { file = a, step = tonumber(b) }
    end
  end
  return scalars, events
end

-- Every scalar equals the log's value (as float32) at its step, every step of the log is there,
-- steps in order and each once.
local function assert_matches_log(scalars, log)
  local steps = 0
  for _ in pairs(log) do steps = steps + 1 end
  local want = {}
  for step, r in pairs(log) do
    for tag, v in pairs(expected_scalars(r)) do
      want[tag] = want[tag] or {}
      want[tag][step] = v
    end
  end
  for tag, by_step in pairs(want) do
    local got = scalars[tag]
    assert.is_not_nil(got, 'no scalar ' .. tag)
    local count = 0
    for _ in pairs(by_step) do count = count + 1 end
    assert.are.equal(count, #got, tag .. ': one scalar per logged step')
    for i, point in ipairs(got) do
      if i > 1 then assert.is_true(point[1] > got[i - 1][1], tag .. ': steps in order') end
      assert.are.equal(float32(by_step[point[1]]), point[2], ('%s at step %d'):format(tag, point[1]))
    end
  end
  for tag in pairs(scalars) do assert.is_not_nil(want[tag], 'a scalar the log does not have: ' .. tag) end
  return steps
end

describe('log.tensorboard', function()
  local root, recipe, python, venv_error
  setup(function()
    root = helper.tmpdir()
    local dataset = data_helper.make_dataset(root .. '/data', data_helper.documents(400, 40, 6), { shard_size = 4096 })
    local held = data_helper.make_dataset(root .. '/held', data_helper.documents(60, 40, 9), { shard_size = 4096 })
    recipe = helper.write_file(root .. '/recipe.lua', ([[
return {
  model = { layers = 1, heads = 2, dim = 16 },
  data = { sources = { %q }, seq_len = 32 },
  batch = { global = 8, micro = 2 },
  optim = { lr = 3e-3, warmup = 2, clip = 1.0 },
  steps = 8, seed = 3, timeout = 30,
  eval = { source = %q, every = 3 },
  log = { peak_flops = 1e9 },
  checkpoint = { every = 2, keep = 2 },
  callbacks = { on_step_end = function(t, m)
    local mark = os.getenv('KILL_MARK')
    if mark and m.step == 5 and t.rank == 0 then -- logged step 5, one past the checkpoint of step 4
      local f = assert(io.open(mark, 'w')); f:write('step 5'); f:close()
      local ffi = require 'ffi'
      pcall(ffi.cdef, 'int usleep(unsigned int usec);')
      for _ = 1, 600 do ffi.C.usleep(100000) end -- until the test kills the job
    end
  end },
}
]]):format(dataset, held))
    python, venv_error = helper.test_python()
  end)
  teardown(function() helper.rmtree(root) end)

  it('writes what the JSONL log has, read back by EventAccumulator, on 2 ranks', function()
    if not python then pending('skipped: ' .. venv_error) return end
    local dir, log = root .. '/tb', root .. '/run.jsonl'
    local r = helper.run(('--nproc-per-node 2 %s --checkpoint.dir=%s --log.tensorboard=%s --log=%s'):format(q(recipe),
      q(root .. '/ck'), q(dir), q(log)))
    assert.are.equal(0, r.rc, r.err)
    local scalars, events = read_back(python, dir)
    assert.are.equal(8, assert_matches_log(scalars, records(log)))
    assert.are.equal(8, #events)
    for _, tag in ipairs({ 'train/loss', 'train/lr', 'train/grad_norm', 'train/tokens_per_s', 'train/data_wait',
      'train/loss_scale', 'train/mfu', 'ranks/0/data', 'ranks/1/compute', 'ranks/1/comm' }) do
      assert.are.equal(8, #scalars[tag], tag)
    end
    assert.are.same({ 3, 6 }, { scalars['eval/loss'][1][1], scalars['eval/loss'][2][1] })
    assert.matches('^events%.out%.tfevents%.%d+%.[^.]+%.%d+$', events[1].file)
  end)

  it('holds every step once after kill -9 and --resume, in the files of both runs', function()
    if not python then pending('skipped: ' .. venv_error) return end
    local dir, log, ck, mark = root .. '/tb-killed', root .. '/killed.jsonl', root .. '/ck-killed', root .. '/mark'
    local args = ('%s --checkpoint.dir=%s --log.tensorboard=%s --log=%s'):format(q(recipe), q(ck), q(dir), q(log))
    local pid = helper.sh(('KILL_MARK=%s setsid %s --nproc-per-node 2 %s >/dev/null 2>&1 & echo $!'):format(q(mark),
      q(helper.RUN), args)).out
    pid = assert(pid:match('%d+'), 'no pid')
    local marked = false
    for _ = 1, WAIT_POLLS do
      marked = io.open(mark) ~= nil
      if marked then break end
      ffi.C.usleep(POLL_US)
    end
    assert.is_true(marked, 'the job never reached step 5')
    os.execute('kill -9 -' .. pid) -- the launcher's process group: the launcher and both ranks
    for _ = 1, WAIT_POLLS do
      if os.execute('kill -0 -' .. pid .. ' 2>/dev/null') ~= 0 then break end
      ffi.C.usleep(POLL_US)
    end
    local _, killed = read_back(python, dir)
    assert.are.equal(5, #killed, 'the killed run had logged steps 1 to 5')
    local resumed = helper.run('--nproc-per-node 2 ' .. args .. ' --resume')
    assert.are.equal(0, resumed.rc, resumed.err)
    assert.matches('resume: ' .. dir .. ': 1 events after step 4 dropped', resumed.out, 1, true)
    assert.matches('resume: ' .. log .. ': 1 records after step 4 dropped', resumed.out, 1, true)
    local scalars, events = read_back(python, dir)
    assert.are.equal(8, assert_matches_log(scalars, records(log)))
    local files, seen = {}, {}
    for i, e in ipairs(events) do
      assert.is_nil(seen[e.step], 'step ' .. e.step .. ' stored twice')
      seen[e.step] = true
      assert.are.equal(i, e.step)
      files[e.file] = true
    end
    local count = 0
    for _ in pairs(files) do count = count + 1 end
    assert.are.equal(2, count, 'steps 1-4 in the killed run\'s file, 5-8 in the resumed run\'s')
  end)

  it('cuts a partial last line of the JSONL log on resume, and refuses a line that is no record', function()
    local log, ck = root .. '/partial.jsonl', root .. '/ck-partial'
    local args = ('%s --checkpoint.dir=%s --log=%s'):format(q(recipe), q(ck), q(log))
    assert.are.equal(0, helper.run(args .. ' --steps=4').rc)
    local f = assert(io.open(log, 'ab'))
    f:write('{"applied":true,"data_wait":0.1,"fing') -- what a kill in the middle of a write leaves
    f:close()
    local r = helper.run(args .. ' --steps=6 --resume')
    assert.are.equal(0, r.rc, r.err)
    local steps = {}
    for step in pairs(records(log)) do steps[#steps + 1] = step end
    table.sort(steps)
    assert.are.same({ 1, 2, 3, 4, 5, 6 }, steps)
    local lines = helper.lines(helper.read_file(log))
    table.insert(lines, 3, 'not json')
    helper.write_file(log, table.concat(lines, '\n') .. '\n')
    local bad = helper.run(args .. ' --steps=8 --resume')
    assert.are.equal(1, bad.rc, bad.err)
    assert.matches(log .. ":3: not a record of a step (is this a log of wick's?)", bad.err, 1, true)
  end)

  it('refuses a log directory that is a file, as a data error naming it', function()
    local file = helper.write_file(root .. '/plain', 'x')
    local r = helper.run(('%s --steps=1 --checkpoint.every=0 --log.tensorboard=%s'):format(q(recipe), q(file)))
    assert.are.equal(1, r.rc, r.err)
    assert.matches("log.tensorboard: .*'" .. file:gsub('%p', '%%%0') .. "'.*[Nn]ot a directory", r.err)
    assert.is_nil(r.err:find('traceback', 1, true), r.err)
  end)
end)
