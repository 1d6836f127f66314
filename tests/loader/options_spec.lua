-- Every value from outside the loader is checked where it enters: its options (one schema, unknown
-- keys named with the nearest valid one), the environment it reads, mix weights and schedules, and
-- the cursor (exact syntax, ranges, a checksum). Each case here was accepted, silently, before.
local helper = require 'helper'
local data_helper = require 'helpers.data'
local data = require 'wick.data'
local schedule = require 'wick.schedule'
local ffi = require 'ffi'
local q = helper.shell_quote

pcall(ffi.cdef, 'uint64_t XXH3_64bits(const void *data, size_t length);')
local xxhash = ffi.load('xxhash')

local root, corpus
setup(function()
  root = helper.tmpdir()
  corpus = data_helper.make_dataset(root .. '/corpus', data_helper.documents(300, 40, 3), { shard_size = 1024 })
end)
teardown(function() helper.rmtree(root) end)

local function loader(opts)
  local o = { data = corpus, seq_len = 16, global_batch = 8 }
  for k, v in pairs(opts or {}) do o[k] = v end
  return data.loader(o)
end

local function refused(opts, pattern)
  local ok, err = pcall(function() loader(opts):next() end)
  assert.is_false(ok, 'accepted ' .. pattern)
  assert.matches(pattern, err, 1, true)
  return err
end

-- A cursor text with its checksum recomputed, so a test reaches the check behind the checksum.
local function signed(text)
  return ('%s sum=%s'):format(text, bit.tohex(xxhash.XXH3_64bits(text, #text), 16))
end

local function first_ids(opts)
  local l = loader(opts)
  local b = l:next()
  local ids = {}
  for row = 0, b.rows - 1 do
    local s = l:sample(row)
    ids[#ids + 1] = s.shard .. ':' .. s.offset
  end
  l:close()
  return table.concat(ids, ' ')
end

describe('loader options', function()
  it('refuse unknown keys, naming the nearest valid one', function()
    refused({ seq_length = 32 }, "unknown loader option 'seq_length' (did you mean 'seq_len'?)")
    refused({ shufle = false }, "unknown loader option 'shufle' (did you mean 'shuffle'?)")
    refused({ shuffle = { buffer = 4 } }, "unknown shuffle option 'buffer'")
  end)

  it('refuse fractional, non-finite and out-of-range numbers, naming the key', function()
    refused({ micro_batch = 0 }, 'loader option micro_batch = 0 must be within [1, ')
    refused({ rank = 1.5 }, 'loader option rank = 1.5 must be a whole number')
    refused({ seq_len = 10.5 }, 'loader option seq_len = 10.5 must be a whole number')
    refused({ seq_len = 0 / 0 }, 'loader option seq_len = nan must be finite')
    refused({ global_batch = math.huge }, 'loader option global_batch = inf must be finite')
    refused({ threads = 65 }, 'loader option threads = 65 must be within [1, 64]')
    refused({ mode = 'padded' }, 'loader option mode = "padded" must be one of packed, pad')
    refused({ document_ids = 1 }, 'loader option document_ids = 1 must be a boolean')
  end)

  it('take seeds as exact 64-bit integers', function()
    local a = first_ids { seed = '9223372036854775808' }
    local b = first_ids { seed = '9223372036854775809' }
    local c = first_ids { seed = 9223372036854775809ULL }
    assert.are_not.equal(a, b) -- every seed >= 2^63 used to collapse to one value
    assert.are.equal(b, c)
    refused({ seed = 2 ^ 63 }, 'is above 2^53, where Lua numbers are not exact')
    refused({ seed = -1 }, 'loader option seed = -1 must be a whole number >= 0')
    refused({ seed = '18446744073709551616' }, 'must be a decimal number from 0 to 18446744073709551615')
    local l = loader { seed = '18446744073709551615' }
    l:next()
    local cursor = l:state()
    l:close()
    assert.matches(' seed=18446744073709551615 ', cursor, 1, true)
    l = loader { seed = '18446744073709551615', cursor = cursor }
    l:next()
    l:close()
  end)

  it('check RANK and WORLD_SIZE from the environment like the options they stand for', function()
    local r = helper.sh(('RANK=1.5 WORLD_SIZE=2 %s -e %s'):format(q(helper.RUN),
      q(("require('wick').data.loader{ data = %q, seq_len = 16, global_batch = 8 }:next()"):format(corpus))))
    assert.are.equal(1, r.rc)
    assert.matches('RANK="1.5" is not a valid rank', r.err, 1, true)
  end)
end)

describe('mix weights', function()
  it('refuse infinite, NaN and negative weights, constant or scheduled', function()
    local function mix_refused(weight, pattern)
      local ok, err = pcall(data.mix, { { corpus, weight = weight }, steps = 100 })
      assert.is_false(ok)
      assert.matches(pattern, err, 1, true)
    end
    mix_refused(1 / 0, 'weight inf at step 0 must be a finite number >= 0')
    mix_refused(0 / 0, 'weight nan at step 0 must be a finite number >= 0')
    mix_refused(-1, 'weight -1 at step 0 must be a finite number >= 0')
    mix_refused(schedule.linear(1, math.huge, 10), 'weight inf at step 10 must be a finite number >= 0')
    mix_refused(function(step) return step > 50 and 0 / 0 or 1 end, 'must be a finite number >= 0')
    local ok, err = pcall(data.mix, { { corpus, wieght = 2 } })
    assert.is_false(ok)
    assert.matches("unknown mix source option 'wieght' (did you mean 'weight'?)", err, 1, true)
  end)

  it('are refused by the C loader too, whoever calls it', function()
    local C = require('wick.core').C
    local handle = C.wk_loader_new()
    local index = ffi.new('uint32_t[1]')
    assert.are.equal(0, C.wk_loader_add_source(handle, corpus, 0, index))
    local steps, weights = ffi.new('double[1]', 0), ffi.new('double[1]', math.huge)
    assert.are_not.equal(0, C.wk_loader_set_weight(handle, 0, steps, weights, 1))
    assert.matches('must be a finite number >= 0', ffi.string(C.wk_last_error()), 1, true)
    C.wk_loader_free(handle)
  end)
end)

describe('the cursor', function()
  local function saved()
    local l = loader()
    for _ = 1, 3 do l:next() end
    local cursor = l:state()
    l:close()
    return cursor
  end

  local function cursor_refused(cursor, pattern)
    refused({ cursor = cursor }, pattern)
  end

  it('restores exactly as written, or is refused when cut short or edited', function()
    local cursor = saved()
    local l = loader { cursor = cursor }
    l:next()
    l:close()
    cursor_refused(cursor:gsub(' src=.*$', ''), 'cursor has no checksum at its end')
    cursor_refused(cursor:gsub('step=3', 'step=2'), 'cursor checksum does not match its text')
    cursor_refused(cursor:gsub(' sum=%x+$', ''), 'cursor has no checksum at its end')
  end)

  it('refuses every field out of its syntax or range, behind a valid checksum', function()
    local body = saved():gsub(' sum=%x+$', '')
    local function edited(from, to, pattern)
      local text, n = body:gsub(from, to)
      assert.are.equal(1, n, from)
      cursor_refused(signed(text), pattern)
    end
    edited('step=3', 'step=-3', "cursor field step='-3' is not a whole number")
    edited('step=3', 'step=+3', "cursor field step='+3' is not a whole number")
    edited('world=1', 'world=0', "cursor field world='0' is not a whole number in [1, ")
    edited('global=8', 'global=18446744073709551616', "cursor field global='18446744073709551616'")
    edited(':0x0p%+0', ':nan', "credit 'nan' is not a finite number")
    edited(':0x0p%+0', ':inf', "credit 'inf' is not a finite number")
    edited(':0x0p%+0', ':0x1p+60', "credit '0x1p+60' is not a finite number within a global batch")
    edited(' src=%x+:%d+:[^ ]+', '', 'cursor has no src= position of any source')
    edited(' seq=16', '', "cursor lacks its 'seq' field")
    edited(' seq=16', ' seq=16 seq=16', "cursor field 'seq' appears twice")
  end)
end)

describe('optimizer options', function()
  it('are checked by optim.adamw: unknown keys, non-finite rates, betas outside [0, 1)', function()
    local adamw = require('wick').optim.adamw
    local function refuse(opts, pattern)
      local ok, err = pcall(adamw, opts)
      assert.is_false(ok)
      assert.matches(pattern, err, 1, true)
    end
    refuse({ weight_decy = 0.1 }, "unknown optim.adamw option 'weight_decy' (did you mean 'weight_decay'?)")
    refuse({ lr = 0 / 0 }, 'optim.adamw option lr = nan must be a finite number >= 0')
    refuse({ betas = { 0.9, 1 } }, 'must be { beta1, beta2 } in [0, 1)')
    refuse({ clip = -1 }, 'optim.adamw option clip = -1 must be within')
    assert.are.equal(0.1, adamw({ weight_decay = 0.1 }).weight_decay)
  end)
end)

describe('model options', function()
  local gpt = require('wick').nn.gpt
  local function config(extra)
    local cfg = { vocab = 10, seq_len = 4, layers = 1, heads = 2, dim = 8 }
    for k, v in pairs(extra) do cfg[k] = v end
    return cfg
  end
  local function refuse(extra, pattern)
    local ok, err = pcall(gpt, config(extra))
    assert.is_false(ok, 'accepted ' .. pattern)
    assert.matches(pattern, err, 1, true)
  end

  it('are checked by nn.gpt: unknown keys, whole numbers in range, required sizes, seeds', function()
    refuse({ sed = 1 }, "unknown nn.gpt option 'sed' (did you mean 'seed'?)")
    refuse({ vocab = 10.5 }, 'nn.gpt option vocab = 10.5 must be a whole number')
    refuse({ layers = 0 }, 'nn.gpt option layers = 0 must be within')
    refuse({ dim = 0 / 0 }, 'nn.gpt option dim = nan')
    refuse({ heads = 3 }, 'nn.gpt: dim 8 is not divisible by heads 3')
    refuse({ seed = -1 }, 'nn.gpt option seed = -1 must be within [0, 4294967295]')
    local ok, err = pcall(gpt, { vocab = 10, seq_len = 4, layers = 1, heads = 2 })
    assert.is_false(ok)
    assert.matches('nn.gpt option dim is required', err, 1, true)
    local model = gpt(config { seed = 7 })
    assert.are.equal(8, model.config.dim)
    model:free()
  end)

  it('check the precision policy and its loss-scaling options', function()
    refuse({ precision = 'fp8' }, "unknown precision 'fp8' (fp32, bf16 or fp16)")
    refuse({ precision = { 'bf16', scale = 4 } }, 'precision bf16 has no loss scaling')
    refuse({ precision = { 'fp16', scale = 0 / 0 } }, 'fp16 precision option scale = nan must be finite')
    refuse({ precision = { 'fp16', growth = 3 } }, "unknown fp16 precision option 'growth'")
    local model = gpt(config { precision = { 'fp16', scale = 8, growth_interval = 3 } })
    assert.are.equal(8, model.policy.scaler.scale)
    assert.are.equal(3, model.policy.scaler.growth_interval)
    model:free()
  end)
end)
