-- The one parameter model (runtime/core/param.c): every subsystem with integer knobs answers a bounds
-- query for each of them, its setter accepts exactly that range and refuses the rest in one message
-- format, and the Lua options take their ranges from the query.
local helper = require 'helper'
local corpus = require 'helpers.corpus'
local core = require 'wick.core'
local ffi, C = core.ffi, core.C
local q = helper.shell_quote

local function int(v) return (tostring(v):gsub('[UL]+$', '')) end -- an int64 cdata in full, without its suffix

-- Checks that set(p, v) accepts min and max and refuses one past each (where that is an int64) with
-- "<owner> <name>=<value> is outside [min, max]"; skip(p) names the parameters a test cannot set freely.
local function check_table(owner, count, query, set, skip)
  local lo, hi = ffi.new('int64_t[1]'), ffi.new('int64_t[1]')
  for p = 0, count - 1 do
    assert.are.equal(0, query(p, lo, hi), core.last_error())
    local min, max = lo[0], hi[0]
    assert.is_true(min <= max, owner .. ' parameter ' .. p)
    if not (skip and skip(p)) then
      for _, v in ipairs { min, max } do assert.are.equal(0, set(p, v), core.last_error()) end
      local outside = {}
      if min > -9223372036854775807LL then outside[#outside + 1] = min - 1 end
      if max < 9223372036854775807LL then outside[#outside + 1] = max + 1 end
      for _, v in ipairs(outside) do
        assert.are_not.equal(0, set(p, v), owner .. ' parameter ' .. p .. ' took ' .. int(v))
        local message = core.last_error()
        assert.matches('^' .. owner .. ' [%w_]+=', message)
        local tail = ('=%s is outside [%s, %s]'):format(int(v), int(min), int(max))
        assert.are.equal(tail, message:sub(-#tail), message)
      end
    end
  end
  assert.are_not.equal(0, query(count, lo, hi))
  assert.are.equal(('unknown %s parameter %d'):format(owner, count), core.last_error())
end

describe('the parameter model', function()
  local root
  setup(function() root = helper.tmpdir() end)
  teardown(function() helper.rmtree(root) end)

  it('gives the converter a bounds query its setter agrees with (zstd levels asked of zstd)', function()
    local cv = ffi.gc(C.wk_converter_new(root .. '/never', 'bytes'), C.wk_converter_free)
    check_table('converter', C.WK_CONVERT_PARAM_COUNT, C.wk_converter_param_bounds,
      function(p, v) return C.wk_converter_set(cv, p, v) end)
    local lo, hi = ffi.new('int64_t[1]'), ffi.new('int64_t[1]')
    assert.are.equal(0, C.wk_converter_param_bounds(C.WK_CONVERT_LEVEL, lo, hi))
    assert.is_true(lo[0] < 0 and hi[0] >= 19, 'zstd levels: ' .. tostring(lo[0]) .. '..' .. tostring(hi[0]))
  end)

  it('gives the dataset, the loader, its remote options and the tokenize tool the same', function()
    helper.write_file(root .. '/a.txt', corpus.text(3, 200))
    local r = corpus.convert(q(root .. '/a.txt') .. ' -o ' .. q(root .. '/ds') .. ' -q')
    assert.are.equal(0, r.rc, r.err)
    local ds = ffi.gc(C.wk_dataset_open(root .. '/ds'), C.wk_dataset_close)
    check_table('dataset', C.WK_DATASET_PARAM_COUNT, C.wk_dataset_param_bounds,
      function(p, v) return C.wk_dataset_set(ds, p, v) end,
      function(p) return p == C.WK_DATASET_BLOCK_CACHE_BYTES end) -- its max would be a cache of 8 EiB
    local loader = ffi.gc(C.wk_loader_new(), C.wk_loader_free)
    check_table('loader', C.WK_LOADER_PARAM_COUNT, C.wk_loader_param_bounds,
      function(p, v) return C.wk_loader_set(loader, p, v) end,
      function(p) return p == C.WK_LOADER_DEVICE end) -- a device index is also checked against the machine
    local fields = { [C.WK_REMOTE_CACHE_DISK_BYTES] = 'cache_disk_bytes', [C.WK_REMOTE_RETRIES] = 'retries',
                     [C.WK_REMOTE_PREFETCH_BYTES] = 'prefetch_bytes', [C.WK_REMOTE_MAX_TRANSFERS] = 'max_transfers',
                     [C.WK_REMOTE_CONNECT_TIMEOUT_MS] = 'connect_timeout_ms',
                     [C.WK_REMOTE_STALL_TIMEOUT_MS] = 'stall_timeout_ms',
                     [C.WK_REMOTE_REQUEST_TIMEOUT_MS] = 'request_timeout_ms',
                     [C.WK_REMOTE_LOW_SPEED_BYTES_PER_S] = 'low_speed_bytes_per_s',
                     [C.WK_REMOTE_LOW_SPEED_WINDOW_MS] = 'low_speed_window_ms' }
    check_table('remote option', C.WK_REMOTE_PARAM_COUNT, C.wk_remote_param_bounds, function(p, v)
      local options = ffi.new('WkRemoteOptions') -- the loader takes them as one struct, checked as it enters
      C.wk_remote_options_default(options)
      options[fields[p]] = v
      return C.wk_loader_set_remote(loader, options)
    end)
    local tok = ffi.gc(C.wk_tokenizer_open('bytes', nil), C.wk_tokenizer_free)
    check_table('tokenize', C.WK_TOKENIZE_PARAM_COUNT, C.wk_tokenize_param_bounds,
      function(_, v) -- threads is an argument: a value in range gets as far as opening the input
        local s = ffi.new('WkTokenizeStats')
        local status = C.wk_tokenize_jsonl(tok, root .. '/none.jsonl', root .. '/out.jsonl', 'text', 0, v, s)
        return core.last_error():find('none.jsonl', 1, true) and 0 or status
      end)
  end)

  it("narrows a tokenizer's EOS to its vocabulary, and says so in the same format", function()
    local tok = ffi.gc(C.wk_tokenizer_open('bytes', nil), C.wk_tokenizer_free)
    local lo, hi = ffi.new('int64_t[1]'), ffi.new('int64_t[1]')
    assert.are.equal(0, C.wk_tokenizer_param_bounds(nil, C.WK_TOKENIZER_EOS, lo, hi))
    assert.are.equal(0xFFFFFFFE, tonumber(hi[0]))
    assert.are.equal(0, C.wk_tokenizer_param_bounds(tok, C.WK_TOKENIZER_EOS, lo, hi))
    assert.are.equal(256, tonumber(hi[0]))
    check_table('tokenizer', C.WK_TOKENIZER_PARAM_COUNT,
      function(p, min, max) return C.wk_tokenizer_param_bounds(tok, p, min, max) end,
      function(p, v) return C.wk_tokenizer_set(tok, p, v) end)
  end)

  it('is where the Lua options take their ranges from', function()
    local function bounds(query, p) return { core.bounds(query, p) } end
    local shard = require('wick.data.convert').SPEC
    local function range(spec, name)
      for _, o in ipairs(spec.options) do if o[1] == name then return { o.min, o.max } end end
    end
    assert.are.same(bounds(C.wk_converter_param_bounds, C.WK_CONVERT_THREADS), range(shard, 'threads'))
    assert.are.same(bounds(C.wk_converter_param_bounds, C.WK_CONVERT_SHARD_TOKENS), range(shard, 'shard_size'))
    assert.are.same(bounds(C.wk_converter_param_bounds, C.WK_CONVERT_BLOCK_TOKENS), range(shard, 'block_size'))
    assert.are.same(bounds(C.wk_tokenize_param_bounds, C.WK_TOKENIZE_THREADS),
                    range(require('wick.data.tokenize').SPEC, 'threads'))
    local eos = require('wick.data.tokenizer').OPTIONS:option('eos')
    local lo, hi = ffi.new('int64_t[1]'), ffi.new('int64_t[1]')
    assert.are.equal(0, C.wk_tokenizer_param_bounds(nil, C.WK_TOKENIZER_EOS, lo, hi))
    assert.are.same({ tonumber(lo[0]), tonumber(hi[0]) }, { eos.min, eos.max })
  end)

  it('gives the defaults too, which the Lua tools show instead of writing them again', function()
    local function option(spec, name)
      for _, o in ipairs(spec.options) do if o[1] == name then return o end end
    end
    local shard = require('wick.data.convert').SPEC
    assert.are.equal(core.default(C.wk_converter_param_default, C.WK_CONVERT_SHARD_TOKENS), option(shard, 'shard_size').default)
    assert.are.equal(core.default(C.wk_converter_param_default, C.WK_CONVERT_BLOCK_TOKENS), option(shard, 'block_size').default)
    assert.are.equal(2 ^ 26, option(shard, 'shard_size').default) -- what the converter writes when not told
    local r = helper.run('-m wick.data.inspect --help')
    local help = r.out .. r.err
    for name, param in pairs { ['window-tokens'] = C.WK_LOADER_WINDOW_TOKENS, ['seq-len'] = C.WK_LOADER_SEQ_LEN } do
      local default = core.default(C.wk_loader_param_default, param)
      local shown = help:match('%-%-' .. name:gsub('%-', '%%-') .. ' N[^\n]*default ([^)]+)%)')
      assert.truthy(shown, name .. ' in ' .. help)
      assert.are.equal(default, shown:match('^2%^(%d+)$') and 2 ^ tonumber(shown:match('^2%^(%d+)$')) or tonumber(shown))
    end
    local value = ffi.new('int64_t[1]')
    assert.are_not.equal(0, C.wk_loader_param_default(C.WK_LOADER_PARAM_COUNT, value))
    assert.are.equal(('unknown loader parameter %d'):format(C.WK_LOADER_PARAM_COUNT), core.last_error())
  end)
end)
