-- Reading datasets (wick.dataset over runtime/dataset/dataset.c): lazy opening, bounded memory, and
-- every kind of corruption reported as WK_ERR_FORMAT naming the file, block and reason.
local helper = require 'helper'
local corpus = require 'helpers.corpus'
local dataset = require 'wick.data.dataset'
local core = require 'wick.core'
local ffi, C = core.ffi, core.C
local q = helper.shell_quote

local function convert(inputs, out, extra)
  local r = corpus.convert(inputs .. ' -o ' .. q(out) .. ' ' .. (extra or ''))
  assert(r.rc == 0, r.err)
end

local function u32(data, offset) -- little-endian at a 0-based offset
  local b1, b2, b3, b4 = data:byte(offset + 1, offset + 4)
  return b1 + b2 * 256 + b3 * 65536 + b4 * 16777216
end
local function u64(data, offset) return u32(data, offset) + u32(data, offset + 4) * 4294967296 end

-- Overwrites bytes at a 0-based offset of a file.
local function patch(path, offset, bytes)
  local f = assert(io.open(path, 'r+b'))
  f:seek('set', offset)
  f:write(bytes)
  f:close()
end

local function flip(path, offset)
  local data = helper.read_file(path)
  patch(path, offset, string.char(bit.bxor(data:byte(offset + 1), 0x55)))
end

-- Where the sections of a shard are, from its header (FORMAT.md).
local function layout(path)
  local data = helper.read_file(path)
  local l = { data = data, block_count = u32(data, 56), block_table = u64(data, 80), doc_index = u64(data, 88) }
  l.block = function(i)
    local e = l.block_table + 24 * i
    return { offset = u64(data, e), stored = u32(data, e + 8), codec = u32(data, e + 12) }
  end
  return l
end

local function expect_format_error(ds, shard, offset, count, ...)
  local tokens, message, status = ds:try_read(shard, offset, count)
  assert.is_nil(tokens)
  assert.are.equal('WK_ERR_FORMAT', status)
  for _, needle in ipairs { ... } do assert.matches(needle, message, 1, true) end
  return message
end

describe('wick.dataset', function()
  local root, text, text_b
  setup(function()
    root = helper.tmpdir()
    text, text_b = corpus.text(7, 40000), corpus.text(8, 500)
    local files = { ['in/a.txt'] = text, ['in/b.txt'] = text_b }
    for i = 1, 20 do files[string.format('many/%02d.txt', i)] = corpus.text(100 + i, 100) end
    corpus.tree(root, files)
  end)
  teardown(function() helper.rmtree(root) end)

  local n = 0
  local function fresh(extra, input)
    n = n + 1
    local out = root .. '/ds' .. n
    convert(q(root .. '/' .. (input or 'in')), out, extra or '--block-size 4K')
    return out, out .. '/shard-00000.wks'
  end

  it('opens from the directory or the index file, touching no shard', function()
    local dir = fresh('--shard-size 1K')
    local ds = assert(dataset.open(dir .. '/index.json'))
    assert.are.equal(2, ds.shards)
    ds:close()
    os.remove(dir .. '/shard-00000.wks')
    os.remove(dir .. '/shard-00001.wks')
    ds = assert(dataset.open(dir)) -- shards are opened lazily
    assert.are.equal(2, ds.shards)
    local _, message, status = ds:try_read(0, 0, 1)
    assert.are.equal('WK_ERR_IO', status)
    assert.matches("shard-00000.wks': No such file", message, 1, true)
    ds:close()
    ds:close() -- idempotent
    assert.has_error(function() ds:read(0, 0, 1) end)
  end)

  it('names what is missing, and the URL of a remote location it cannot reach', function()
    local ds, err = dataset.open(root .. '/nowhere')
    assert.is_nil(ds)
    assert.matches("nowhere': No such file or directory", err, 1, true)
    assert.are.equal(C.WK_ERR_IO, C.wk_last_status())
    local cache = root .. '/remote-cache'
    for _, case in ipairs { { 'https://data.example/fineweb/index.json', 'https://data.example/fineweb/index.json' },
                            { 's3://bucket/prefix', 'prefix/index.json' } } do
      ds, err = dataset.open(case[1], { cache_dir = cache, retries = 0 })
      assert.is_nil(ds)
      assert.matches(case[2], err, 1, true)
      assert.matches('attempt', err, 1, true)
      assert.are.equal(C.WK_ERR_NETWORK, C.wk_last_status())
    end
    assert.has_error(function() dataset.open('https://data.example/x', { retries = -1 }) end,
      'remote option retries = -1 must be within [0, 100]')
    assert.has_error(function() dataset.open('https://data.example/x', { cache_dri = cache }) end,
      "unknown remote option 'cache_dri' (did you mean 'cache_dir'?)")
  end)

  it('reads any range, across blocks, equal to the source text', function()
    for _, mode in ipairs { '--compression none', '--compression zstd' } do
      local dir = fresh('--block-size 1K ' .. mode)
      local ds = assert(dataset.open(dir))
      for _, range in ipairs { { 0, 1 }, { 1000, 100 }, { 1023, 2 }, { 5000, 3000 }, { #text - 10, 10 } } do
        local t = ds:read(0, range[1], range[2])
        assert.are.equal(text:sub(range[1] + 1, range[1] + range[2]), ds:text(t, range[2]))
      end
      assert.are.equal(256, ds:read(0, #text, 1)[0]) -- EOS after the document
      local _, _, status = ds:try_read(0, ds:shard(0).tokens - 1, 2)
      assert.are.equal('WK_ERR_INVALID_ARG', status)
      ds:close()
    end
  end)

  it('keeps decoded blocks within the cache budget and decodes each block once when reading in order', function()
    local dir = fresh('--block-size 1K')
    local ds = assert(dataset.open(dir))
    local budget = 16 * 1024 -- 8 decoded blocks of 1K u16 tokens; the shard has ~130 blocks
    ds:set('block_cache_bytes', budget)
    assert.are.equal(budget, ds:get('block_cache_bytes'))
    local info = ds:shard(0)
    local parts, out = {}, ffi.new('uint32_t[100]')
    for offset = 0, info.tokens - 1, 100 do
      local count = math.min(100, info.tokens - offset)
      ds:read(0, offset, count, out)
      parts[#parts + 1] = ds:text(out, count, '')
    end
    assert.are.equal(text .. text_b, table.concat(parts))
    local s = ds:stats()
    local blocks = math.ceil(info.tokens / 1024)
    assert.is_true(info.tokens * 2 > 10 * budget, 'the dataset must be larger than the budget')
    assert.is_true(s.cache_peak_bytes <= budget, 'peak ' .. s.cache_peak_bytes)
    assert.are.equal(blocks, s.blocks_decoded)
    assert.is_true(s.cache_hits > s.cache_misses)
    -- No cache at all still reads correctly.
    ds:set('block_cache_bytes', 0)
    assert.are.equal(0, ds:stats().cache_bytes)
    assert.are.equal(text:sub(2001, 2100), ds:text(ds:read(0, 2000, 100), 100))
    ds:close()
  end)

  it("still takes the block cache's old name, cache_bytes, for one release, and warns once", function()
    local dir = fresh()
    local script = root .. '/old_name.lua'
    helper.write_file(script, ([[
      local ds = assert(require('wick.data.dataset').open(%q))
      ds:set('cache_bytes', 4096)
      ds:set('cache_bytes', 8192)
      io.write(ds:get('cache_bytes'), ' ', ds:get('block_cache_bytes'))
    ]]):format(dir))
    local r = helper.run(q(script))
    assert.are.equal(0, r.rc, r.err)
    assert.are.equal('8192 8192', r.out)
    local warnings = select(2, r.err:gsub("'cache_bytes' is now 'block_cache_bytes'", ''))
    assert.are.equal(1, warnings, r.err)
    local ds = assert(dataset.open(dir))
    assert.has_error(function() ds:set('cache', 1) end, "unknown wick.dataset setting 'cache'")
    ds:close()
  end)

  it('keeps at most max_open_shards shards open', function()
    local dir = fresh('--shard-size 256 --block-size 64', 'many')
    local ds = assert(dataset.open(dir))
    assert.is_true(ds.shards > 10)
    ds:set('max_open_shards', 2)
    for s = 0, ds.shards - 1 do
      ds:read(s, 0, ds:shard(s).tokens)
      assert.is_true(ds:stats().open_shards <= 2)
    end
    ds:close()
  end)

  it('agrees with C about the layout of every struct it shares', function()
    for struct, fields in pairs {
      WkShardInfo = { 'name', 'tokens', 'documents', 'bytes' },
      WkDatasetStats = { 'cache_bytes', 'cache_peak_bytes', 'cache_budget', 'cache_hits', 'cache_misses',
                         'blocks_decoded', 'blocks_verified', 'open_shards' },
      WkConvertStats = { 'inputs', 'input_bytes', 'documents', 'tokens', 'shards', 'output_bytes', 'bad', 'empty',
                         'seconds', 'reused', 'nulls' },
    } do
      assert.are.equal(ffi.sizeof(struct), tonumber(C.wk_abi_layout(struct, nil)), struct)
      for _, field in ipairs(fields) do
        assert.are.equal(ffi.offsetof(struct, field), tonumber(C.wk_abi_layout(struct, field)), struct .. '.' .. field)
      end
    end
  end)

  -- Opening a FIFO blocks until a writer comes: each case runs in a child under a timeout, so a
  -- regression fails the test instead of hanging the suite.
  local HANG_SECONDS = 20
  local function open_in_child(target, shard)
    local code = ([[local ds, err = require('wick.data.dataset').open(%q)
      if not ds then io.write('open: ', err) return end
      local _, message = ds:try_read(%d, 0, 1)
      io.write('read: ', tostring(message))]]):format(target, shard or 0)
    return helper.sh(('timeout %d %s -e %s'):format(HANG_SECONDS, q(helper.RUN), q(code)))
  end

  it('refuses an index or shard that is a FIFO, a directory or a device, naming it, without blocking', function()
    local dir = fresh()
    local shard = dir .. '/shard-00000.wks'
    os.rename(shard, dir .. '/saved.wks')
    assert.are.equal(0, helper.sh('mkfifo ' .. q(shard)).rc)
    local r = open_in_child(dir)
    assert.are.equal(0, r.rc, 'timed out or failed: ' .. r.err)
    assert.matches("read: dataset '" .. dir .. "': '" .. shard .. "' is a FIFO (named pipe), not a regular file", r.out,
      1, true)
    os.remove(shard)
    assert.are.equal(0, helper.sh('mkdir ' .. q(shard)).rc)
    assert.matches("'" .. shard .. "' is a directory, not a regular file", open_in_child(dir).out, 1, true)
    helper.rmtree(shard)
    assert.are.equal(0, helper.sh('ln -s /dev/null ' .. q(shard)).rc)
    assert.matches("'" .. shard .. "' is a character device, not a regular file", open_in_child(dir).out, 1, true)
    os.remove(shard)
    os.rename(dir .. '/saved.wks', shard)

    local index = dir .. '/index.json'
    os.rename(index, dir .. '/saved.json')
    assert.are.equal(0, helper.sh('mkfifo ' .. q(index)).rc)
    for _, target in ipairs { dir, index } do
      r = open_in_child(target)
      assert.are.equal(0, r.rc, 'timed out or failed: ' .. r.err)
      assert.matches("open: dataset '" .. target .. "': '" .. index .. "' is a FIFO (named pipe)", r.out, 1, true)
    end
    os.remove(index)
    os.rename(dir .. '/saved.json', index)
    assert.matches('read: nil', open_in_child(dir).out, 1, true) -- whole again
  end)

  it('refuses an index that names a member twice, saying which name and which file', function()
    local dir = fresh()
    local path = dir .. '/index.json'
    local index = helper.read_file(path)
    local many = {}
    for i = 1, 40 do many[i] = ('"note%d": %d'):format(i, i) end
    local cases = {
      -- Both values agree with the shards, so only the repetition can be wrong (first/last win alike).
      { (index:gsub('"version": 1,', '"version": 1, "version": 1,')), '"version" appears twice', 'line 3' },
      { (index:gsub('"tokens": (%d+),\n', '"tokens": %1, "tokens": %1,\n', 1)), '"tokens" appears twice' },
      { (index:gsub('"checksum": ("[^"]+")', '"checksum": %1, "checksum": %1')), '"checksum" appears twice' },
      -- A large object (past the linear scan, through the hash table) and a name spelled with an escape.
      { (index:gsub('"converter": {', '"converter": {' .. table.concat(many, ', ') .. ', "note33": 0, ')),
        '"note33" appears twice' },
      { (index:gsub('"version": 1,', '"version": 1, "v\\u0065rsion": 1,')), '"version" appears twice' },
    }
    for _, case in ipairs(cases) do
      assert.are_not.equal(index, case[1])
      helper.write_file(path, case[1])
      local ds, err = dataset.open(dir)
      assert.is_nil(ds, case[2])
      assert.matches("index '" .. path .. "': invalid JSON at " .. (case[3] or 'line'), err, 1, true)
      assert.matches(case[2], err, 1, true)
      assert.are.equal(C.WK_ERR_FORMAT, C.wk_last_status())
    end
    -- Forty distinct names are fine.
    helper.write_file(path, (index:gsub('"converter": {', '"converter": {' .. table.concat(many, ', ') .. ', ')))
    local ds = assert(dataset.open(dir))
    assert.are.equal(text:sub(1, 50), ds:text(ds:read(0, 0, 50), 50))
    ds:close()
  end)

  describe('corruption', function()
    it('a flipped byte in a zstd or raw block fails that block only, naming shard, block and checksum', function()
      for _, mode in ipairs { '--compression zstd', '--compression none' } do
        local dir, shard = fresh('--block-size 4K ' .. mode)
        local l = layout(shard)
        local b = l.block(1)
        flip(shard, b.offset + math.floor(b.stored / 2))
        local ds = assert(dataset.open(dir))
        expect_format_error(ds, 0, 4096, 10, 'shard-00000.wks', 'block 1: checksum', 'corrupted')
        expect_format_error(ds, 0, 4000, 200, 'block 1: checksum') -- a range that spans it
        assert.are.equal(text:sub(1, 100), ds:text(ds:read(0, 0, 100), 100)) -- block 0 is intact
        assert.are.equal(text:sub(8193, 8292), ds:text(ds:read(0, 8192, 100), 100)) -- so is block 2
        expect_format_error(ds, 0, 4096, 1, 'block 1: checksum') -- and it stays refused
        ds:close()
      end
    end)

    it('a truncated shard is refused before anything is read from it', function()
      local dir, shard = fresh()
      local data = helper.read_file(shard)
      helper.write_file(shard, data:sub(1, #data - 7))
      local ds = assert(dataset.open(dir))
      expect_format_error(ds, 0, 0, 1, 'shard-00000.wks', 'index says ' .. #data .. ' bytes but the file has ' ..
        (#data - 7))
      ds:close()
      -- With an index that agrees on the size, the header still knows better.
      local index = helper.read_file(dir .. '/index.json'):gsub('"bytes": ' .. #data, '"bytes": ' .. (#data - 7))
      helper.write_file(dir .. '/index.json', index)
      ds = assert(dataset.open(dir))
      expect_format_error(ds, 0, 0, 1, 'header says ' .. #data .. ' bytes but the file has ' .. (#data - 7))
      ds:close()
      -- Shorter than a header.
      helper.write_file(shard, data:sub(1, 50))
      helper.write_file(dir .. '/index.json', index:gsub('"bytes": ' .. (#data - 7), '"bytes": 50'))
      local ds2, err = dataset.open(dir)
      if ds2 then
        expect_format_error(ds2, 0, 0, 1, 'shorter than the 128-byte header')
        ds2:close()
      else
        assert.matches('bytes', err) -- an index with bytes < 128 is refused at open
      end
    end)

    it('bad magic, a future version, unknown flags and a damaged header are named as such', function()
      local cases = {
        { function(p) patch(p, 0, 'NOTWICK!') end, "bad magic 'NOTWICK!'" },
        { function(p) patch(p, 8, corpus.le(3, 4)) end, 'format version 3 is newer than this reader' },
        { function(p) patch(p, 32, corpus.le(12345, 8)) end, 'header: checksum' },
      }
      for _, case in ipairs(cases) do
        local dir, shard = fresh()
        case[1](shard)
        local ds = assert(dataset.open(dir))
        expect_format_error(ds, 0, 0, 1, 'shard-00000.wks', case[2])
        assert.is_nil((ds:check(0)))
        ds:close()
      end
    end)

    it('a damaged block table or document index is caught by its checksum', function()
      local dir, shard = fresh()
      local l = layout(shard)
      flip(shard, l.block_table + 3)
      local ds = assert(dataset.open(dir))
      expect_format_error(ds, 0, 0, 1, 'block table: checksum')
      ds:close()
      dir, shard = fresh()
      l = layout(shard)
      flip(shard, l.doc_index + 1)
      ds = assert(dataset.open(dir))
      expect_format_error(ds, 0, 0, 1, 'document index: checksum')
      ds:close()
    end)

    it('an index that disagrees with its shard (counts, checksum) is refused', function()
      local replacements = {
        { '"checksum": "xxh3:%x+"', '"checksum": "xxh3:0123456789abcdef"' },
        { '("documents": )(%d+)(, "checksum")', function(a, d, b) return a .. (d + 1) .. b end, true },
      }
      for _, r in ipairs(replacements) do
        local dir = fresh()
        local index = helper.read_file(dir .. '/index.json')
        index = index:gsub(r[1], r[2])
        if r[3] then index = index:gsub('("documents": )(%d+)(,\n)', function(a, d, b) return a .. (d + 1) .. b end) end
        helper.write_file(dir .. '/index.json', index)
        local ds = assert(dataset.open(dir))
        expect_format_error(ds, 0, 0, 1, 'disagrees with the index')
        ds:close()
      end
      -- Same sizes and checksum, but the index claims another vocabulary.
      local dir = fresh()
      local index = helper.read_file(dir .. '/index.json'):gsub('"vocab_size": 257', '"vocab_size": 300')
      helper.write_file(dir .. '/index.json', index)
      local ds = assert(dataset.open(dir))
      expect_format_error(ds, 0, 0, 1, 'vocabulary 257', 'the index says 2, 300, 256')
      ds:close()
      -- A shard swapped in from another dataset: sizes may even match, the header checksum does not.
      local a, b = fresh(), fresh('--block-size 2K')
      os.execute('cp ' .. q(b .. '/shard-00000.wks') .. ' ' .. q(a .. '/shard-00000.wks'))
      index = helper.read_file(a .. '/index.json')
      local size = #helper.read_file(a .. '/shard-00000.wks')
      helper.write_file(a .. '/index.json', (index:gsub('"bytes": %d+', '"bytes": ' .. size, 1)))
      ds = assert(dataset.open(a))
      expect_format_error(ds, 0, 0, 1, 'disagrees with the index')
      ds:close()
    end)

    it('refuses index names that leave the dataset directory, and broken or future indexes', function()
      local dir = fresh()
      local index = helper.read_file(dir .. '/index.json')
      local cases = {
        { index:gsub('shard%-00000%.wks', '../shard-00000.wks'), 'unsafe name' },
        { index:gsub('shard%-00000%.wks', '/etc/passwd'), 'unsafe name' },
        { index:gsub('shard%-00000%.wks', 'a/./b.wks'), 'unsafe name' },
        { index:gsub('shard%-00000%.wks', ''), 'unsafe name' },
        { index:gsub('"version": 1', '"version": 9'), 'format version 9 is newer' },
        { index:sub(1, 100), 'invalid JSON at line' },
        { index:gsub('"tokens": (%d+),\n', '"tokens": 1,\n'), 'add up to' },
        { index:gsub('"wick%-dataset"', '"something-else"'), 'not a Wick dataset index' },
      }
      for _, case in ipairs(cases) do
        helper.write_file(dir .. '/index.json', case[1])
        local ds, err = dataset.open(dir)
        assert.is_nil(ds, case[2])
        assert.matches(case[2], err, 1, true)
        assert.matches('index.json', err, 1, true)
        assert.are.equal(C.WK_ERR_FORMAT, C.wk_last_status())
      end
    end)
  end)
end)
