-- Batches as tables: a records dataset's columns (a per-token loss_mask, an i64 label, a bytes blob)
-- ride with the tokens under the stream's invariants: the same seed gives the same batches, a cursor
-- saved on 2 ranks resumes on 4 (also after kill -9) to exactly the batches of an uninterrupted run,
-- a re-weighted mix keeps every column of every sample in place (each row checked against the record
-- its sample info names); what cannot work is refused in one line; a mask trains exactly its tokens.
local helper = require 'helper'
local data_helper = require 'helpers.data'
local data = require 'wick.data'
local dataset = require 'wick.data.dataset'
local q = helper.shell_quote

local SEQ = 48  -- longer than every record: a pad-mode row holds its record whole, then EOS
local COLUMNS = { 'loss_mask', 'label', 'image' }

local root, records, a, b, b_records
setup(function()
  root = helper.tmpdir()
  records = data_helper.records(160, 'a', 1)
  a = data_helper.make_records_dataset(root .. '/a', records)
  b_records = data_helper.records(90, 'b', 2)
  b = data_helper.make_records_dataset(root .. '/b', b_records, { per_shard = 13 })
end)
teardown(function() helper.rmtree(root) end)

local function loader(opts)
  local o = { data = a, seq_len = SEQ, global_batch = 8, world_size = 1, rank = 0, seed = 5, mode = 'pad',
    columns = COLUMNS }
  for k, v in pairs(opts or {}) do o[k] = v end
  return data.loader(o)
end

-- ---- a row against its record --------------------------------------------------------------------

local datasets = {}
local function open(path)
  datasets[path] = datasets[path] or assert(dataset.open(path))
  return datasets[path]
end

-- The record a row holds, found from its sample info (source, shard, offset) in the dataset itself.
local function record_of(l, row, sources)
  local s = l:sample(row)
  local source = sources[s.source + 1]
  local ds = open(source.path)
  local head = ds:text(ds:read(s.shard, s.offset, math.min(s.length, 8)), math.min(s.length, 8))
  local i = tonumber(head:match('^' .. source.tag .. '(%d+) '))
  assert(i, ('row %d: sample %d:%d:%d starts %q'):format(row, s.source, s.shard, s.offset, head))
  return source.records[i], i, s
end

-- Checks every column of row `row` against its record; returns the row's identity and contents.
local function check_row(l, batch, row, sources)
  local r, i, s = record_of(l, row, sources)
  local where = ('row %d (record %s%d)'):format(row, sources[s.source + 1].tag, i)
  local tokens = l:row_tokens(row)
  local n = #r.text
  for t = 1, n do assert.are.equal(r.text:byte(t), tokens[t], where) end
  local columns = {}
  for _, c in ipairs(l:row_columns(row)) do columns[c.name] = c.value end
  assert.are.equal(r.label, columns.label, where)
  assert.are.equal(r.blob, columns.image, where)
  -- token_u8 aligned with the tokens: the record's mask, its EOS taking the last token's value, then 0
  local mask = columns.loss_mask
  assert.are.equal(SEQ + 1, #mask)
  for t = 1, SEQ + 1 do
    local want = t <= n and r.mask[t] or t == n + 1 and r.mask[n] or 0
    assert.are.equal(want, mask[t], where .. ' mask position ' .. (t - 1))
  end
  -- target t (token t + 1) trains where pad mode counts it (up to the EOS) and the mask is not 0
  local folded = batch.loss_mask:narrow(1, row + 1, 1)
  local trained = folded:totable()[1]
  folded:free()
  local count = 0
  for t = 0, SEQ - 1 do
    local want = (t + 1 <= n and mask[t + 2] ~= 0) and 1 or 0
    assert.are.equal(want, trained[t + 1], where .. ' target ' .. t)
    count = count + want
  end
  return ('%d:%d:%d:%d %s%d'):format(s.source, s.shard, s.offset, s.epoch, sources[s.source + 1].tag, i), count
end

local A = function() return { { path = a, tag = 'a', records = records } } end

-- `steps` global steps of a loader, each row checked: per step, its rows' identities in rank order.
local function read_checked(l, steps, sources)
  local out = {}
  while #out < steps or (out[#out] and out[#out].partial) do
    local batch = l:next()
    if not batch then break end
    if batch.micro_step == 0 then out[#out + 1] = { rows = {}, trained = 0, partial = true } end
    local step = out[#out]
    for row = 0, batch.rows - 1 do
      local id, count = check_row(l, batch, row, sources)
      step.rows[#step.rows + 1] = id
      step.trained = step.trained + count
    end
    step.partial = batch.micro_step < batch.micro_steps - 1 or nil
  end
  return out
end

-- Every rank's rows of `steps` steps, assembled per step in rank order.
local function global_checked(W, steps, opts, sources)
  local merged = {}
  for r = 0, W - 1 do
    local o = { world_size = W, rank = r }
    for k, v in pairs(opts or {}) do o[k] = v end
    local l = loader(o)
    for s, step in ipairs(read_checked(l, steps, sources or A())) do
      merged[s] = merged[s] or { rows = {}, trained = 0 }
      for _, id in ipairs(step.rows) do table.insert(merged[s].rows, id) end
      merged[s].trained = merged[s].trained + step.trained
    end
    l:close()
  end
  return merged
end

-- ---- the invariants ------------------------------------------------------------------------------

describe('records with columns', function()
  it('carry every column of every sample in place, the same for the same seed', function()
    local first, again = global_checked(1, 6), global_checked(1, 6)
    assert.are.same(first, again)
    local other = global_checked(1, 6, { seed = 6 })
    assert.are_not.same(first[1].rows, other[1].rows)
    local l = loader()
    local batch = l:next()
    assert.are.same({ 8, SEQ + 1 }, batch.columns.loss_mask.shape)
    assert.are.equal('u8', batch.columns.loss_mask.dtype)
    assert.are.same({ 8 }, batch.label.shape)
    assert.are.equal('i64', batch.label.dtype)
    assert.are.same({ 8, 2 ^ 20 }, batch.image.shape)
    assert.are.same({ 8 }, batch.sizes.image.shape)
    assert.are.equal(batch.columns.label, batch.label)
    l:close()
  end)

  it('resume from a cursor of 2 ranks on 4 ranks to exactly the uninterrupted batches', function()
    local uninterrupted = global_checked(1, 10)
    local cursors = {}
    for r = 0, 1 do
      local l = loader { world_size = 2, rank = r }
      read_checked(l, 4, A())
      cursors[r] = l:state()
      l:close()
    end
    assert.are.equal(cursors[0], cursors[1])
    local resumed = global_checked(4, 6, { cursor = cursors[0] })
    for i = 1, 6 do assert.are.same(uninterrupted[4 + i], resumed[i], 'step ' .. (4 + i)) end
  end)

  it('resume after kill -9 of real ranks to exactly the uninterrupted batches', function()
    local uninterrupted = global_checked(1, 12)
    local cursor = root .. '/killed.cursor'
    local r = helper.sh(('cd %s && timeout 120 %s --nproc-per-node 2 tests/helpers/columns_rank.lua %s %d %s %d 2>&1')
      :format(q(helper.ROOT), q(helper.RUN), q(a), SEQ, q(cursor), 5))
    assert.are_not.equal(0, r.rc, r.out)
    assert.matches('killed by signal 9', r.out)
    -- what the ranks printed before dying: the uninterrupted run's rows, step by step
    local printed = {}
    for step, rank, ids in r.out:gmatch('step=(%d+) rank=(%d) rows=([^\n]+)') do
      printed[tonumber(step) + 1] = printed[tonumber(step) + 1] or {}
      printed[tonumber(step) + 1][tonumber(rank) + 1] = ids
    end
    -- (rank 1 runs on until the launcher stops it: it may not have printed them all)
    for step = 1, 5 do
      local ids = {}
      for i, id in ipairs(uninterrupted[step].rows) do ids[i] = id:match('^%S+') end
      assert.are.equal(table.concat(ids, ' ', 1, 4), printed[step][1], 'step ' .. step)
      if printed[step][2] then assert.are.equal(table.concat(ids, ' ', 5, 8), printed[step][2], 'step ' .. step) end
    end
    local text = assert(helper.read_file(cursor), 'no cursor saved:\n' .. r.out)
    local k = tonumber(text:match('step=(%d+)'))
    assert.are.equal(5, k, text)
    local resumed = global_checked(4, 12 - k, { cursor = text })
    for i = 1, 12 - k do assert.are.same(uninterrupted[k + i], resumed[i], 'step ' .. (k + i)) end
  end)

  it('keep their place in a re-weighted mix of two records sources', function()
    local sources = { { path = a, tag = 'a', records = records }, { path = b, tag = 'b', records = b_records } }
    local function mixed(wa, wb, extra)
      local o = { data = data.mix { { a, weight = wa }, { b, weight = wb } } }
      for k, v in pairs(extra or {}) do o[k] = v end
      return o
    end
    local l = loader(mixed(3, 1))
    local before = read_checked(l, 5, sources)
    local cursor = l:state()
    l:close()
    for _, step in ipairs(before) do
      local from_b = 0
      for _, id in ipairs(step.rows) do from_b = from_b + (id:match(' b%d+$') and 1 or 0) end
      assert.are.equal(2, from_b)
    end
    local after = global_checked(2, 5, mixed(1, 1, { cursor = cursor }), sources)
    local seen, drawn = {}, { a = 0, b = 0 }
    for _, steps in ipairs { before, after } do
      for _, step in ipairs(steps) do
        for _, id in ipairs(step.rows) do
          local record = id:match(' (%a%d+)$')
          assert.is_nil(seen[record], record .. ' drawn twice')
          seen[record] = true
          drawn[record:sub(1, 1)] = drawn[record:sub(1, 1)] + 1
        end
      end
    end
    assert.are.same({ a = 30 + 20, b = 10 + 20 }, drawn)
  end)
end)

describe("a recipe's data.columns", function()
  it("reach the trainer's batches, refused by name when the data lacks one, and peek shows them", function()
    local recipe = helper.write_file(root .. '/columns.lua', ([[
return {
  model = { layers = 1, heads = 2, dim = 16 },
  data = { sources = { %q }, seq_len = %d, mode = 'pad', columns = { 'loss_mask', 'label', 'image' } },
  batch = { global = 4 }, steps = 2, seed = 3, timeout = 30,
}
]]):format(a, SEQ))
    local r = helper.run('-i ' .. q(recipe), { stdin = 'peek(1)\n' })
    assert.are.equal(0, r.rc, r.err)
    local text, mask, label, image = r.out:match('step 1 row 0: "(a%d+ [^"]*)[^\n]*\n  loss_mask = {([%d ]+) ...}\n'
      .. '  label = (%d+)\n  image = %d+ bytes "([^"]*)"')
    assert(text, r.out)
    local i = tonumber(text:match('^a(%d+) '))
    assert.are.equal(records[i].label, tonumber(label))
    assert.are.equal(records[i].blob, image)
    assert.are.equal(table.concat(records[i].mask, ' '), mask:sub(1, 2 * #records[i].mask - 1))
    r = helper.run(q(recipe) .. ' --data.columns=labels')
    assert.are_not.equal(0, r.rc)
    assert.matches("has no column 'labels'", r.err)
  end)

  it('shape the held-out loss too: eval reads the run\'s rows, its mask included', function()
    -- one step, then eval.source = the same records in stored order: with the mask the loss counts the
    -- records' trained tokens only, so it differs from the loss over every token pad mode keeps
    local function eval_loss(columns)
      local recipe = helper.write_file(root .. '/eval.lua', ([[
return {
  model = { layers = 1, heads = 2, dim = 16 },
  data = { sources = { %q }, seq_len = %d, mode = 'pad', columns = { %s } },
  eval = { source = %q, every = 1 }, checkpoint = { final = false },
  batch = { global = 4 }, steps = 1, seed = 3, timeout = 30,
}
]]):format(a, SEQ, columns, a))
      local r = helper.run(q(recipe))
      assert.are.equal(0, r.rc, r.err)
      local loss = tonumber((r.out .. r.err):match('eval ([%d.]+)'))
      assert(loss, r.out .. r.err)
      return loss
    end
    local masked, plain = eval_loss("'loss_mask'"), eval_loss('')
    assert.is_true(math.abs(masked - plain) > 1e-3, ('eval loss %g with the mask, %g without'):format(masked, plain))
  end)
end)

describe('columns refused', function()
  local function fails(opts, pattern)
    local ok, err = pcall(function()
      local l = loader(opts)
      l:next()
      l:close()
    end)
    assert.is_false(ok)
    assert.matches(pattern, tostring(err))
    return tostring(err)
  end

  it('a column a source lacks, naming its columns', function()
    local err = fails({ columns = { 'labels' } }, "has no column 'labels'")
    for _, name in ipairs { 'tokens', 'loss_mask', 'label', 'image' } do assert.matches(name, err, 1, true) end
    assert.matches(a, err, 1, true)
  end)

  it('a per-record column in packed mode', function()
    fails({ mode = 'packed', columns = { 'label' } },
      "column 'label' of source '.-' holds one i64 per record, but packed rows cut across records")
  end)

  it('sources that disagree on a column', function()
    local c = data_helper.make_records_dataset(root .. '/c', data_helper.records(40, 'c', 3), { label_kind = 'f32' })
    fails({ data = data.mix { a, c }, columns = { 'label' } }, "column 'label' is i64 in source '.-' but f32 in source")
  end)

  it('a blob larger than blob_bytes, naming the file and the record', function()
    local err = fails({ blob_bytes = 16, columns = { 'image' } },
      "shard '[^']+' record %d+: column 'image' holds %d+ bytes, more than a row's 16 %(raise blob_bytes")
    local shard, record, size = err:match("shard '([^']+)' record (%d+): column 'image' holds (%d+) bytes")
    local ds = open(a)
    for s = 0, ds.shards - 1 do
      if ds:shard(s).name == shard then
        local start, length = ds:document(s, tonumber(record))
        local i = tonumber(ds:text(ds:read(s, start, length), length):match('^a(%d+) '))
        assert.are.equal(#records[i].blob, tonumber(size))
        return
      end
    end
    error('no shard ' .. shard)
  end)

  it('bad column lists, before anything is opened', function()
    fails({ columns = { 'label', 'label' } }, 'names column label twice')
    fails({ columns = 'label' }, 'must be a list of column names')
    fails({ columns = { 'tokens' } }, "column 'tokens' is always in the batch")
  end)
end)

describe('a mask column', function()
  it('masks packed rows too: a target trains where the mask is not 0', function()
    local l = loader { mode = 'packed', columns = { 'loss_mask' } }
    local batch = l:next()
    local mask = data_helper.values(batch.columns.loss_mask)
    local trained = data_helper.values(batch.loss_mask)
    for row = 0, 7 do
      for t = 0, SEQ - 1 do
        assert.are.equal(mask[row * (SEQ + 1) + t + 1] ~= 0 and 1 or 0, trained[row * SEQ + t])
      end
    end
    l:close()
  end)

  it('trains exactly its tokens: the loss is the mean over the k targets it keeps, the step counts k', function()
    local wick = require 'wick'
    local expected = global_checked(1, 1, { global_batch = 4, micro_batch = 2 })[1].trained
    local l = loader { global_batch = 4, micro_batch = 2, columns = { 'loss_mask' } }
    local plain = loader { global_batch = 4, micro_batch = 2, columns = {} }
    local model = wick.nn.gpt { vocab = l:vocab_size(), seq_len = SEQ, layers = 1, heads = 2, dim = 16, seed = 1 }
    local dist = wick.dist.init { timeout = 30 }
    local dp = wick.nn.data_parallel(model, dist)
    local n, k = dp:take(l)
    local _, all = dp:take(plain)
    assert.are.equal(2, n)
    assert.are.equal(expected, k)
    assert.is_true(k > 0 and k < all, ('the mask trains %d of the %d targets pad mode counts'):format(k, all))
    -- the first micro-batch's loss over k equals the mean of its targets' own losses
    local micro = dp.micro[1]
    local loss = model:forward(micro.inputs, micro.targets, micro.mask, k)
    local one = wick.tensor.zeros(micro.mask.shape, 'u8')
    local values = data_helper.values(micro.mask)
    local sum, kept = 0, 0
    for i = 0, micro.mask:numel() - 1 do
      if values[i] ~= 0 then
        data_helper.values(one)[i] = 1
        sum, kept = sum + model:forward(micro.inputs, micro.targets, one, 1), kept + 1
        data_helper.values(one)[i] = 0
      end
    end
    assert.is_true(kept > 0)
    assert.is_true(math.abs(loss - sum / k) <= 1e-5 * math.abs(loss), ('%g vs %g'):format(loss, sum / k))
    one:free()
    dp:free()
    dist:close()
    l:close()
    plain:close()
  end)
end)
