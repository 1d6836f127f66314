-- Columns (format version 2) through wick.data.dataset and `inspect --records`: a dataset written by the
-- shard writer (build/tests/test_columns write DIR: 2 shards of 3 records with tokens, loss_mask, label,
-- score, emb f32[2,3] and image blobs) reads back what was written, bad input is one line naming the file,
-- and a dataset of tokens only is still version 1.
local helper = require 'helper'
local corpus = require 'helpers.corpus'
local dataset = require 'wick.data.dataset'
local q = helper.shell_quote

local function write_records(dir)
  local r = helper.sh(q(helper.ROOT .. '/build/tests/test_columns') .. ' write ' .. q(dir))
  assert(r.rc == 0, 'test_columns write failed (make build/tests/test_columns):\n' .. r.out .. r.err)
  return dir
end

local function list(values, count)
  local out = {}
  for i = 0, count - 1 do out[i + 1] = tonumber(values[i]) end
  return out
end

local function u32(data, offset)
  local b1, b2, b3, b4 = data:byte(offset + 1, offset + 4)
  return b1 + b2 * 256 + b3 * 65536 + b4 * 16777216
end
local function u64(data, offset) return u32(data, offset) + u32(data, offset + 4) * 4294967296 end

-- The stored offset of block b of extra column c (0-based, tokens excluded) of a version 2 shard.
local function column_block_offset(data, c, b)
  local column_table = u64(data, 88) + 8 * u64(data, 40)
  local block_table = u64(data, column_table + 128 * c + 88)
  return u64(data, block_table + 24 * b)
end

describe('dataset columns', function()
  local dir

  before_each(function() dir = write_records(helper.tmpdir()) end)
  after_each(function() helper.rmtree(dir) end)

  it('lists the columns in order and finds them by name', function()
    local ds = assert(dataset.open(dir))
    local names, kinds = {}, {}
    for i, c in ipairs(ds.columns) do names[i], kinds[i] = c.name, c.kind end
    assert.are.same({ 'tokens', 'loss_mask', 'label', 'score', 'emb', 'image' }, names)
    assert.are.same({ 'tokens', 'token_u8', 'i64', 'f32', 'tensor', 'bytes' }, kinds)
    assert.are.same({ 2, 3 }, ds:column('emb').shape)
    assert.are.equal('f32', ds:column('emb').dtype)
    assert.are.equal(2, ds:column('label').index)
    local none, err = ds:column('labels')
    assert.is_nil(none)
    assert.matches("no column 'labels' %(its columns: tokens, loss_mask:token_u8, label:i64, score:f32, " ..
      'emb:tensor%(f32%[2,3%]%), image:bytes%)', err)
    ds:close()
  end)

  it('reads back every kind as written', function()
    local ds = assert(dataset.open(dir))
    -- Shard 1: records [x] [a b c d] [A]; each EOS repeats its record's last mask value.
    assert.are.same({ 120, 256, 97, 98, 99, 100, 256, 65, 256 }, list(ds:read(1, 0, 9), 9))
    assert.are.same({ 1, 1, 1, 1, 0, 1, 1, 0, 0 }, list(ds:read_column('loss_mask', 1, 0, 9), 9))
    -- Shard 0's second record is empty: its EOS alone, mask 0.
    assert.are.same({ 0, 1, 1, 1, 0, 1, 0, 0 }, list(ds:read_column('loss_mask', 0, 0, 8), 8))
    assert.are.same({ 3, -7, 0 }, list(ds:read_column('label', 0, 0, 3), 3))
    assert.are.same({ 0.5, -1.25, 2 }, list(ds:read_column('score', 0, 0, 3), 3))
    assert.are.same({ 2, 2.25, 2.5, 2.75, 3, 3.25 }, list(ds:read_column('emb', 0, 2, 1), 6))
    assert.are.equal('\137PNG\r\n\26\n', ds:blob('image', 0, 0):sub(1, 8))
    assert.are.equal('hello', ds:blob('image', 0, 2))
    assert.are.equal('', ds:blob('image', 1, 1))
    ds:close()
  end)

  it('refuses a column of the wrong kind and rows past the end, naming them', function()
    local ds = assert(dataset.open(dir))
    assert.has_error(function() ds:read_column('image', 0, 0, 1) end,
      "dataset '" .. dir .. "': wk_dataset_read_column cannot read column 'image' (bytes); its blobs are read by " ..
      'wk_dataset_read_blob')
    assert.has_error(function() ds:blob('label', 0, 0) end,
      "dataset '" .. dir .. "': wk_dataset_read_blob cannot read column 'label' (i64); wk_dataset_read_column " ..
      'reads fixed-width columns')
    assert.has_error(function() ds:read_column('label', 0, 2, 2) end,
      "dataset '" .. dir .. "' shard 0 column 'label': rows [2, +2) past its end (3 rows)")
    assert.has_error(function() ds:read_column('nope', 0, 0, 1) end)
    ds:close()
  end)

  it('names the shard, column and block of a damaged column block', function()
    local path = dir .. '/s0.wks'
    local data = helper.read_file(path)
    local at = column_block_offset(data, 4, 0) -- image, record 0
    helper.write_file(path, data:sub(1, at) .. string.char(bit.bxor(data:byte(at + 1), 0x55)) .. data:sub(at + 2))
    local ds = assert(dataset.open(dir))
    assert.are.equal(5, #ds:blob('image', 0, 2)) -- the others read
    local ok, err = pcall(ds.blob, ds, 'image', 0, 0)
    assert.is_false(ok)
    assert.matches("shard '" .. dir:gsub('%p', '%%%0') .. "/s0.wks' column 'image' block 0: checksum 0x%x+ != 0x%x+ " ..
      '%(file truncated or corrupted', err)
    ds:close()
  end)

  it('refuses an index with two columns of one name or an unknown kind, naming the index', function()
    local index_path = dir .. '/index.json'
    local index = helper.read_file(index_path)
    for _, case in ipairs {
      { index:gsub('"name": "score"', '"name": "label"'), "two columns are named 'label'" },
      { index:gsub('"kind": "f32"', '"kind": "float"'), "column 'score': unknown kind 'float'" },
      { index:gsub('%[{"name": "tokens", "kind": "tokens"}, ', '['), 'the first column must be' },
    } do
      helper.write_file(index_path, case[1])
      local ds, err = dataset.open(dir)
      assert.is_nil(ds)
      assert.matches("^index '" .. index_path:gsub('%p', '%%%0') .. "'", err)
      assert.matches(case[2], err, 1, true)
    end
  end)

  it('keeps a dataset of tokens only at version 1, one column', function()
    local out = helper.tmpdir() .. '/v1'
    local r = corpus.convert(q(helper.ROOT .. '/README.md') .. ' -o ' .. q(out))
    assert.are.equal(0, r.rc, r.err)
    local index = helper.read_file(out .. '/index.json')
    assert.matches('"version": 1,', index, 1, true)
    assert.is_nil(index:find('columns', 1, true))
    assert.are.equal(1, helper.read_file(out .. '/shard-00000.wks'):byte(9)) -- the shard's version
    local ds = assert(dataset.open(out))
    assert.are.equal(1, #ds.columns)
    assert.are.same({ 'tokens', 'tokens', 'u16' }, { ds.columns[1].name, ds.columns[1].kind, ds.columns[1].dtype })
    ds:close()
    helper.rmtree(out)
  end)
end)

describe('inspect --records', function()
  local dir
  before_each(function() dir = write_records(helper.tmpdir()) end)
  after_each(function() helper.rmtree(dir) end)

  it('prints records as stored, one JSON object a line, counted over the shards', function()
    local r = helper.run('-m wick.data.inspect ' .. q(dir) .. ' --records 3 --from 2 --json')
    assert.are.equal(0, r.rc, r.err)
    assert.are.same({
      '{"shard":0,"record":2,"tokens":[111,107],"loss_mask":[1,0],"label":0,"score":2,' ..
        '"emb":[[2,2.25,2.5],[2.75,3,3.25]],"image":{"bytes":5}}',
      '{"shard":1,"record":0,"tokens":[120],"loss_mask":[1],"label":5,"score":0.25,' ..
        '"emb":[[0,0.25,0.5],[0.75,1,1.25]],"image":{"bytes":13,"format":"gif","width":2,"height":3}}',
      '{"shard":1,"record":1,"tokens":[97,98,99,100],"loss_mask":[1,1,0,1],"label":9,"score":3.5,' ..
        '"emb":[[1,1.25,1.5],[1.75,2,2.25]],"image":{"bytes":0}}',
    }, helper.lines(r.out))
    for _, line in ipairs(helper.lines(r.out)) do assert.is_table((require('wick.json').decode(line))) end
  end)

  it('gives image formats and sizes from their headers, and a readable form without --json', function()
    local r = helper.run('-m wick.data.inspect ' .. q(dir) .. ' --records 10 --json')
    assert.are.equal(0, r.rc, r.err)
    local lines = helper.lines(r.out)
    assert.are.equal(6, #lines) -- all there are
    assert.matches('"image":{"bytes":33,"format":"png","width":64,"height":48}}$', lines[1])
    assert.matches('"tokens":%[%],"loss_mask":%[%],"label":%-7,"score":%-1.25,', lines[2])
    assert.matches('"image":{"bytes":23,"format":"jpeg","width":40,"height":30}}$', lines[2])
    assert.matches('"score":0.1,.*"image":{"bytes":30,"format":"webp","width":5,"height":7}}$', lines[6])
    r = helper.run('-m wick.data.inspect ' .. q(dir) .. ' --records 1')
    assert.are.equal(0, r.rc, r.err)
    assert.are.equal('shard 0 record 0: tokens=[72 105 33] loss_mask=[0 1 1] label=3 score=0.5 ' ..
      'emb=[[0 0.25 0.5] [0.75 1 1.25]] image=png 64x48 (33 bytes)\n', r.out)
  end)

  it('refuses unknown flags and a DATASET without --records', function()
    local r = helper.run('-m wick.data.inspect ' .. q(dir) .. ' --records 1 --jsn')
    assert.are.equal(2, r.rc)
    assert.matches("unknown option '--jsn' (did you mean '--json'?)", r.err, 1, true)
    r = helper.run('-m wick.data.inspect ' .. q(dir) .. ' --steps 1')
    assert.are.equal(2, r.rc)
    assert.matches('a DATASET goes with --records', r.err, 1, true)
    r = helper.run('-m wick.data.inspect ' .. q(dir) .. ' --records 1 --from -3')
    assert.are.equal(2, r.rc)
    assert.matches('record number', r.err)
  end)
end)
