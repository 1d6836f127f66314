-- The command line of the tools (`run -m wick.data.convert`, `run -m wick.data.inspect`) and recipes: every
-- option declared once through wick.schema, every bad value refused as a one-line usage error
-- (exit 2), a bad dataset as a one-line data error (exit 1), and --data a path, never Lua.
local helper = require 'helper'
local data_helper = require 'helpers.data'
local q = helper.shell_quote

local SEQ = 16

-- A user's mistake: one line on stderr, nothing printed of Lua's internals.
local function assert_one_line(r, rc, text)
  assert.are.equal(rc, r.rc, r.err)
  assert.are.equal(1, #helper.lines(r.err), r.err)
  assert.matches(text, r.err, 1, true)
  assert.is_nil(r.err:find('traceback', 1, true), r.err)
  assert.is_nil(r.err:find('.lua:%d+'), r.err)
end

describe('tool options', function()
  local root, dataset
  local function inspect(args, env)
    return helper.sh((env or '') .. ' ' .. q(helper.RUN) .. ' -m wick.data.inspect ' .. args)
  end

  setup(function()
    root = helper.tmpdir()
    dataset = data_helper.make_dataset(root .. '/ds', data_helper.documents(200))
  end)
  teardown(function() helper.rmtree(root) end)

  it('refuses values that are not of the option type or range, naming the flag (exit 2)', function()
    for args, says in pairs {
      ['--micro-batch 0'] = "--micro-batch = 0 must be within [1, ",
      ['--rank 1.5'] = '--rank = 1.5 must be a whole number',
      ['--seq-len 10.5'] = '--seq-len = 10.5 must be a whole number',
      ['--seq-len ten'] = "--seq-len needs a number, got 'ten'",
      ['--global-batch inf'] = '--global-batch = inf must be finite',
      ['--threads 65'] = '--threads = 65 must be within [1, 64]',
      ['--mode fast'] = '--mode = "fast" must be one of packed, pad',
      ['--seed -1'] = '--seed = "-1" must be a decimal number',
      ['--seed 18446744073709551616'] = 'must be a decimal number from 0 to 18446744073709551615',
      ['--steps 0'] = '--steps = 0 must be within [1, ',
      ['--seq-len'] = '--seq-len needs a value',
      ['--steps 1 --steps 2'] = '--steps is given twice',
      ['--fingerprint=yes'] = '--fingerprint takes no value',
      ['extra'] = "unexpected argument 'extra'",
    } do
      local r = inspect('--data ' .. q(dataset) .. ' ' .. args)
      assert_one_line(r, 2, says)
      assert.matches('wick.data.inspect: ', r.err, 1, true)
      assert.matches('--help', r.err, 1, true)
    end
  end)

  it('names the nearest flag for an unknown one', function()
    assert_one_line(inspect('--data ' .. q(dataset) .. ' --seq-length 16'), 2,
      "unknown option '--seq-length' (did you mean '--seq-len'?)")
    assert_one_line(helper.run('-m wick.data.convert x -o y --shard-sise 1K'), 2,
      "unknown option '--shard-sise' (did you mean '--shard-size'?)")
  end)

  it('takes seeds as exact 64-bit integers, beyond 2^53', function()
    local cursor = root .. '/seed.txt'
    local function run_seed(seed)
      local r = inspect(('--data %s --seq-len %d --global-batch 8 --seed %s --save-cursor %s'):format(q(dataset), SEQ,
        seed, q(cursor)))
      assert.are.equal(0, r.rc, r.err)
      return r.out, helper.read_file(cursor)
    end
    local top, top_cursor = run_seed('18446744073709551615')
    local below, below_cursor = run_seed('18446744073709551614')
    local above_2_53 = run_seed('9007199254740993')
    local at_2_53 = run_seed('9007199254740992')
    assert.matches('seed=18446744073709551615 ', top_cursor, 1, true)
    assert.matches('seed=18446744073709551614 ', below_cursor, 1, true)
    assert.are_not.equal(top, below)
    assert.are_not.equal(above_2_53, at_2_53)
  end)

  it('gives every numeric option of every tool a range, shown in --help', function()
    local specs = { require('wick.data.convert').SPEC, require('wick.data.inspect').spec, require('wick.plot').SPEC }
    for _, spec in ipairs(specs) do
      local help = helper.run('-m ' .. spec.name .. ' --help')
      assert.are.equal(0, help.rc, help.err)
      for _, option in ipairs(spec.options) do
        assert.matches('--' .. option.long, help.out, 1, true)
        if option[2] == 'integer' or option[2] == 'size' then
          assert.is_truthy(option.min and option.max, spec.name .. ' --' .. option.long)
        elseif option[2] == 'number' then
          assert.is_truthy(option.min or option.max, spec.name .. ' --' .. option.long)
        end
      end
    end
    local r = helper.run('-m wick.data.inspect --help')
    assert.matches('%-%-seq%-len N%s+tokens per sample minus one %(an integer in %[1, 2%^24%]; default 1024%)', r.out)
  end)

  it('refuses bad values of the recipes too, in one line (exit 2)', function()
    local recipes = helper.ROOT .. '/recipes/'
    for args, says in pairs {
      ['stream.lua --data D --steps 0'] = '--steps = 0 must be within',
      ['stream.lua --data D --compute-ms -1'] = '--compute-ms = -1 must be within [0, ',
      ['stream.lua --steps 3'] = '--data is required',
      ['stream.lua --data D --bogus'] = "unknown option '--bogus'",
      ['tiny.lua --data.sources D --precision fp8'] = 'precision = "fp8": is not a precision policy',
      ['tiny.lua --data.sources D --model.dim 30'] = 'model.dim 30 is not divisible by model.heads 4',
      ['tiny.lua --data.sources D --optim.lr nan'] = 'optim.lr = nan: must be a finite number',
    } do
      local r = helper.run(q(recipes) .. args:gsub(' D', ' ' .. q(dataset)))
      assert_one_line(r, 2, says)
      assert.matches('(see run recipes/', r.err, 1, true)
    end
  end)

  it("reports the runtime's refusal of a tool's arguments as a usage error (exit 2)", function()
    -- The README's old example: 512 / 64 = 8 samples a rank, so a micro batch of 16 cannot work.
    local r = inspect(('--data %s --seq-len %d --global-batch 512 --micro-batch 16 --world 64 --rank 3'):format(
      q(dataset), SEQ))
    assert_one_line(r, 2, 'wick.data.inspect: micro batch 16 does not divide the 8 samples per rank')
  end)

  it('reports a bad dataset in one line naming the file and the reason (exit 1), with a traceback at debug', function()
    local bad = data_helper.make_dataset(root .. '/bad', data_helper.documents(200), { block_size = 256 })
    data_helper.corrupt_payload(bad .. '/shard-00000.wks', 600)
    local args = ('--data %s --seq-len %d --global-batch 8 --no-shuffle --steps 40'):format(q(bad), SEQ)
    local r = inspect(args)
    assert_one_line(r, 1, "shard '" .. bad .. "/shard-00000.wks' block 1: checksum")
    assert.matches('^wick.data.inspect: ', r.err)
    r = inspect('--data ' .. q(root .. '/missing') .. ' --seq-len 16')
    assert_one_line(r, 1, root .. "/missing': No such file or directory")
    local debug = inspect(args, 'WICK_LOG=debug')
    assert.are.equal(1, debug.rc)
    assert.matches('checksum', debug.err, 1, true)
    assert.matches('stack traceback:', debug.err, 1, true)
    local cursor = inspect('--data ' .. q(dataset) .. ' --from ' .. q(root .. '/no-cursor.txt'))
    assert_one_line(cursor, 1, 'no-cursor.txt: No such file or directory')
  end)

  it('reports a server that does not answer in one line naming the URL and the attempts (exit 1)', function()
    local free = helper.sh([[python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0));]] ..
      [[ print(s.getsockname()[1])']]) -- a port nothing listens on
    local url = ('http://127.0.0.1:%d/data'):format(tonumber(free.out))
    local r = inspect(('--data %s --seq-len 16 --retries 0 --cache-dir %s'):format(url, q(root .. '/cache')))
    assert_one_line(r, 1, "GET '" .. url .. "/index.json': Couldn't connect to server")
    assert.matches('gave up after 1 attempt (last HTTP status 0)', r.err, 1, true)
  end)

  it('reports what the converter refuses: options in one line (exit 2), inputs in one line (exit 1)', function()
    helper.write_file(root .. '/a.txt', 'some text')
    local function shard(args) return helper.run('-m wick.data.convert ' .. q(root .. '/a.txt') .. ' -o ' .. q(root .. '/o') .. args) end
    assert_one_line(shard(' --shard-size 12Q'), 2, "--shard-size needs a whole number with an optional K, M or G")
    assert_one_line(shard(' --block-size 32M'), 2, '--block-size = 33554432 must be within [1, 16777216]')
    assert_one_line(shard(' --compression zstd:99'), 2, 'wick.data.convert: converter level=99 is outside [')
    assert_one_line(shard(' --tokenizer nope'), 2, "tokenizer 'nope' is neither a built-in (bytes) nor a readable file")
    assert_one_line(helper.run('-m wick.data.convert ' .. q(root .. '/none.txt') .. ' -o ' .. q(root .. '/o')), 1,
      "none.txt': No such file or directory")
    local ok = shard(' --shard-size 1K --block-size 256 -q')
    assert.are.equal(0, ok.rc, ok.err)
  end)
end)

describe('inspect --data', function()
  local root, dataset, expected

  local function inspect(args) return helper.run('-m wick.data.inspect --seq-len 16 --global-batch 8 ' .. args) end

  setup(function()
    root = helper.tmpdir()
    dataset = data_helper.make_dataset(root .. '/ds', data_helper.documents(200))
    expected = inspect('--data ' .. q(dataset))
    assert.are.equal(0, expected.rc, expected.err)
  end)
  teardown(function() helper.rmtree(root) end)

  it('opens a directory as a dataset whatever its name looks like', function()
    for _, name in ipairs { 'data(v2)', 'x.lua', 'data.mix{1}' } do
      local dir = root .. '/' .. name
      assert.are.equal(0, helper.sh('cp -r ' .. q(dataset) .. ' ' .. q(dir)).rc)
      local r = inspect('--data ' .. q(dir))
      assert.are.equal(0, r.rc, name .. ': ' .. r.err)
      assert.are.equal(expected.out, r.out, name)
    end
  end)

  it('refuses a cursor file that is a FIFO in one line, without waiting for a writer', function()
    local pipe = root .. '/cursor.fifo'
    assert.are.equal(0, helper.sh('mkfifo ' .. q(pipe)).rc)
    local r = helper.sh(('timeout 20 %s -m wick.data.inspect --seq-len 16 --global-batch 8 --data %s --from %s'):format(
      q(helper.RUN), q(dataset), q(pipe)))
    assert_one_line(r, 1, "cannot read '" .. pipe .. "': not a regular file")
  end)

  it('never evaluates a path as Lua: a path that does not exist is a missing dataset', function()
    local r = inspect([[--data "os.exit(7)"]])
    assert_one_line(r, 1, "dataset 'os.exit(7)'")
    r = inspect([[--data "data.mix{ 'x' }"]])
    assert_one_line(r, 1, "dataset 'data.mix{ 'x' }'")
  end)

  it('runs a regular .lua file for its mix, and takes a mix expression with --mix', function()
    local file = helper.write_file(root .. '/mix.lua', ('return data.mix{ { %q, weight = 1 } }'):format(dataset)
      :gsub('data.mix', 'require("wick.data").mix'))
    local r = inspect('--data ' .. q(file))
    assert.are.equal(0, r.rc, r.err)
    assert.are.equal(expected.out, r.out)
    r = inspect('--mix ' .. q(('data.mix{ { %q } }'):format(dataset)))
    assert.are.equal(0, r.rc, r.err)
    assert.are.equal(expected.out, r.out)
    assert_one_line(inspect('--mix ' .. q('data.mix{')), 2, "--mix:1: unexpected symbol near '<eof>'")
    assert_one_line(inspect('--mix 42'), 2, '--mix must give a data.mix{} or a dataset path, not a number')
    assert_one_line(inspect('--data ' .. q(dataset) .. ' --mix ' .. q('data.mix{ "x" }')), 2,
      '--data and --mix exclude each other')
    assert_one_line(inspect(''), 2, '--data PATH or --mix EXPR is required')
  end)

  it("keeps the traceback of an error that is not the user's command line: a bug in a mix file", function()
    local file = helper.write_file(root .. '/broken.lua', 'local mix = nil\nreturn mix.sources\n')
    local r = inspect('--data ' .. q(file))
    assert.are.equal(1, r.rc)
    assert.matches("broken.lua:2: attempt to index local 'mix' (a nil value)", r.err, 1, true)
    assert.matches('stack traceback:', r.err, 1, true)
  end)
end)

describe('a renamed module', function()
  it('still runs under its old name with -m, saying the new one once on stderr', function()
    local root = helper.tmpdir()
    helper.write_file(root .. '/a.txt', 'some text')
    local r = helper.run('-m wick.shard ' .. q(root .. '/a.txt') .. ' -o ' .. q(root .. '/o') .. ' -q')
    local converted = io.open(root .. '/o/index.json')
    if converted then converted:close() end
    helper.rmtree(root)
    assert.are.equal(0, r.rc, r.err)
    assert.are.equal('wick.shard is now wick.data.convert; the old name goes in the next release\n', r.err)
    assert.is_not_nil(converted)
  end)

  it('loads as the new module under require, warning once per name', function()
    local r = helper.run('-e ' .. q([[
      local old = require 'wick.dataset'
      require 'wick.dataset'
      io.write(tostring(old == require 'wick.data.dataset'), ' ',
        tostring(require 'wick.checkpoint' == require('wick').checkpoint))]]))
    assert.are.equal(0, r.rc, r.err)
    assert.are.equal('true true', r.out)
    assert.are.same({
      'wick.dataset is now wick.data.dataset; the old name goes in the next release',
      'wick.checkpoint is now wick.train.checkpoint; the old name goes in the next release',
    }, helper.lines(r.err))
  end)
end)
