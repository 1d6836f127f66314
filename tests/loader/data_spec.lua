-- The stream's invariants on real datasets made by the real converter: coverage, determinism,
-- world-size independence, exact resume (also across epochs, world sizes and mix changes), mix
-- proportions, shuffle quality, packing, corruption skipping and bounded memory.
local helper = require 'helper'
local data_helper = require 'helpers.data'
local data = require 'wick.data'
local q = helper.shell_quote

local SEQ = 16

local root, corpus, small, other
setup(function()
  root = helper.tmpdir()
  corpus = data_helper.make_dataset(root .. '/corpus', data_helper.documents(600, 40, 1), { shard_size = 1024 })
  small = data_helper.make_dataset(root .. '/small', data_helper.documents(40, 20, 2), { shard_size = 256 })
  other = data_helper.make_dataset(root .. '/other', data_helper.documents(300, 30, 3), { shard_size = 512 })
end)
teardown(function() helper.rmtree(root) end)

-- Options for a loader over `source`, overridable.
local function loader(opts)
  local o = { data = corpus, seq_len = SEQ, global_batch = 8, world_size = 1, rank = 0, seed = 7 }
  for k, v in pairs(opts or {}) do o[k] = v end
  return data.loader(o)
end

local read_steps = data_helper.read_steps
local function global_steps(W, steps, opts) return data_helper.global_steps(loader, W, steps, opts) end

describe('the sample order', function()
  it('covers every sample of an epoch exactly once over all ranks', function()
    local l = loader()
    local epoch = l:epoch_length()
    l:close()
    local G, W = 8, 4
    local steps = math.floor(epoch / G)
    local seen, count = {}, 0
    for _, step in ipairs(global_steps(W, steps, { global_batch = G })) do
      for _, id in ipairs(step.ids) do
        assert.is_nil(seen[id], 'sample ' .. id .. ' delivered twice')
        assert.matches(':0$', id) -- all from epoch 0
        seen[id] = true
        count = count + 1
      end
    end
    assert.are.equal(steps * G, count)
    -- Every packed window of every shard is in the epoch (steps * G covers all but < G of them).
    assert.is_true(epoch - count < G)
  end)

  it('is the same for the same seed and different for another seed', function()
    local a = global_steps(1, 5)
    local b = global_steps(1, 5)
    local c = global_steps(1, 5, { seed = 8 })
    assert.are.same(a, b)
    assert.are_not.same(a[1].ids, c[1].ids)
  end)

  it('gives the same global batches on 1, 2, 4 and 8 ranks, with any micro batch and thread count', function()
    local reference = global_steps(1, 6, { global_batch = 16 })
    for _, W in ipairs { 2, 4, 8 } do
      assert.are.same(reference, global_steps(W, 6, { global_batch = 16 }), 'world size ' .. W)
    end
    assert.are.same(reference, global_steps(2, 6, { global_batch = 16, micro_batch = 2, threads = 3 }))
    assert.are.same(reference, global_steps(1, 6, { global_batch = 16, micro_batch = 4, threads = 1 }))
  end)

  it('starts a new, differently shuffled epoch when the source runs out', function()
    local l = loader({ data = small })
    local epoch = l:epoch_length()
    local steps = read_steps(l, math.floor(2 * epoch / 8) + 1)
    l:close()
    local first, second = {}, {}
    for _, step in ipairs(steps) do
      for _, id in ipairs(step.ids) do
        local key, e = id:match('^(.*):(%d+)$')
        if e == '0' then first[#first + 1] = key elseif e == '1' then second[#second + 1] = key end
      end
    end
    assert.are.equal(epoch, #first)
    assert.is_true(#second >= epoch - 8)
    assert.are_not.same(first, { unpack(second, 1, #first) })
  end)

  it('shuffles well: sample positions are uncorrelated with the stored order', function()
    -- A window of about 4 of the corpus's 1024-token shards, as the old 4-shard window.
    local l = loader({ global_batch = 8, shuffle = { window_tokens = 4 * 1024 } })
    local steps = math.floor(l:epoch_length() / 8)
    local canonical, shuffled = {}, {}
    -- stored order index of a sample: (shard, offset) sorted
    for _, step in ipairs(read_steps(l, steps)) do
      for _, id in ipairs(step.ids) do
        local shard, offset = id:match('^%d+:(%d+):(%d+)')
        shuffled[#shuffled + 1] = tonumber(shard) * 1e6 + tonumber(offset)
      end
    end
    l:close()
    for i, v in ipairs(shuffled) do canonical[i] = v end
    table.sort(canonical)
    local rank_of = {}
    for i, v in ipairs(canonical) do rank_of[v] = i end
    local n, sx, sy, sxx, syy, sxy = #shuffled, 0, 0, 0, 0, 0
    for position, v in ipairs(shuffled) do
      local x, y = position, rank_of[v]
      sx, sy, sxx, syy, sxy = sx + x, sy + y, sxx + x * x, syy + y * y, sxy + x * y
    end
    local r = (n * sxy - sx * sy) / math.sqrt((n * sxx - sx * sx) * (n * syy - sy * sy))
    assert.is_true(math.abs(r) < 0.2, ('position correlation %.3f over %d samples'):format(r, n))
    -- Neighbours rarely come from the same shard (a window of 4 shards is mixed).
    local same = 0
    for i = 2, n do
      if math.floor(shuffled[i] / 1e6) == math.floor(shuffled[i - 1] / 1e6) then same = same + 1 end
    end
    assert.is_true(same / n < 0.4, ('%.2f of neighbours share a shard'):format(same / n))
  end)

  it('keeps each node on its own shards with canonical partitions', function()
    -- 2 partitions x chunk 4 = 2 nodes of 2 ranks each, global batch 8: ranks 0-1 read partition 0.
    local opts = { global_batch = 8, partitions = 2, chunk = 4 }
    local shards_of_node = { {}, {} }
    for r = 0, 3 do
      local o = { world_size = 4, rank = r }
      for k, v in pairs(opts) do o[k] = v end
      local l = loader(o)
      for _, step in ipairs(read_steps(l, 20)) do
        for _, id in ipairs(step.ids) do shards_of_node[math.floor(r / 2) + 1][id:match('^%d+:(%d+)')] = true end
      end
      l:close()
    end
    for shard in pairs(shards_of_node[1]) do assert.is_nil(shards_of_node[2][shard], 'shard ' .. shard .. ' on both nodes') end
  end)
end)

describe('the cursor', function()
  local function resume_equals_uninterrupted(opts_before, opts_after, k, n)
    local uninterrupted = global_steps(1, k + n)
    local cursors = {}
    for r = 0, opts_before.world_size - 1 do
      local l = loader { world_size = opts_before.world_size, rank = r }
      read_steps(l, k)
      cursors[r] = l:state()
      l:close()
    end
    -- every rank holds the same cursor, apart from its local skip count
    for r = 1, opts_before.world_size - 1 do assert.are.equal(cursors[0], cursors[r]) end
    assert.is_true(#cursors[0] < 400, 'cursor is ' .. #cursors[0] .. ' bytes')
    local resumed = global_steps(opts_after.world_size, n, { cursor = cursors[0] })
    for i = 1, n do assert.are.same(uninterrupted[k + i], resumed[i], 'step ' .. (k + i)) end
    return cursors[0]
  end

  it('resumes exactly on another world size with the same global batch', function()
    resume_equals_uninterrupted({ world_size = 2 }, { world_size = 4 }, 5, 5)
  end)

  it('resumes a resumed run exactly', function()
    local uninterrupted = global_steps(1, 12)
    local l = loader()
    read_steps(l, 4)
    local c1 = l:state()
    l:close()
    l = loader { cursor = c1, world_size = 2 }
    read_steps(l, 4)
    local c2 = l:state()
    l:close()
    local resumed = global_steps(1, 4, { cursor = c2 })
    for i = 1, 4 do assert.are.same(uninterrupted[8 + i], resumed[i]) end
  end)

  it('resumes exactly across an epoch boundary', function()
    local l = loader { data = small }
    local steps_per_epoch = l:epoch_length() / 8
    l:close()
    local k = math.floor(steps_per_epoch) - 1
    local uninterrupted = global_steps(1, k + 4, { data = small })
    l = loader { data = small }
    read_steps(l, k)
    local cursor = l:state()
    l:close()
    local resumed = global_steps(2, 4, { data = small, cursor = cursor })
    for i = 1, 4 do assert.are.same(uninterrupted[k + i], resumed[i]) end
  end)

  it('resumes mid-step on the same world size', function()
    local uninterrupted = global_steps(1, 3, { micro_batch = 2 })
    local l = loader { micro_batch = 2 }
    l:next()
    l:next() -- two of the four micro-batches of step 0
    local cursor = l:state()
    assert.matches('micro=2', cursor, 1, true)
    l:close()
    l = loader { micro_batch = 2, cursor = cursor }
    local ids = {}
    for _ = 1, 2 do
      l:next()
      for row = 0, 1 do
        local s = l:sample(row)
        ids[#ids + 1] = ('%d:%d:%d:%d'):format(s.source, s.shard, s.offset, s.epoch)
      end
    end
    l:close()
    assert.are.same({ unpack(uninterrupted[1].ids, 5, 8) }, ids)
  end)

  it('refuses a cursor of another order, and a mid-step cursor on another world size', function()
    local l = loader { micro_batch = 4 }
    l:next()
    local cursor = l:state()
    l:close()
    local ok, err = pcall(function() loader({ seed = 8, cursor = cursor }):next() end)
    assert.is_false(ok)
    assert.matches('seed 7 but this loader has 8', err, 1, true)
    ok, err = pcall(function() loader({ world_size = 2, cursor = cursor }):next() end)
    assert.is_false(ok)
    assert.matches('needs a cursor saved at a step boundary', err, 1, true)
    ok, err = pcall(function() loader({ cursor = 'hello' }) end)
    assert.is_false(ok)
    assert.matches('not a Wick cursor', err, 1, true)
  end)

  it('saves and restores through the inspect tool', function()
    local args = ('--data %s --seq-len %d --global-batch 8 --world 2 --rank 1 --seed 7 '):format(q(corpus), SEQ)
    local full = helper.run('-m wick.data.inspect ' .. args .. '--steps 6')
    assert.are.equal(0, full.rc, full.err)
    local cursor = root .. '/cursor.txt'
    local first = helper.run('-m wick.data.inspect ' .. args .. '--steps 3 --save-cursor ' .. q(cursor))
    local rest = helper.run('-m wick.data.inspect ' .. args .. '--steps 3 --from ' .. q(cursor))
    assert.are.equal(0, rest.rc, rest.err)
    assert.are.equal(full.out, first.out .. rest.out)
    assert.matches('^step=0 rank=1 id=0:%d+:%d+ hash=%x+ ', full.out)
    assert.are.equal(4 * 6, #helper.lines(full.out))
  end)
end)

describe('mixing', function()
  local function source_counts(step)
    local counts = {}
    for _, id in ipairs(step.ids) do
      local source = tonumber(id:match('^(%d+):'))
      counts[source] = (counts[source] or 0) + 1
    end
    return counts
  end

  it('gives each source its exact share in every global batch', function()
    local mix = data.mix { { corpus, weight = 3 }, { other, weight = 1 } }
    for _, step in ipairs(global_steps(2, 10, { data = mix })) do
      assert.are.same({ [0] = 6, [1] = 2 }, source_counts(step))
    end
  end)

  it('keeps proportions within one sample when shares are fractional or scheduled', function()
    local mix = data.mix { { corpus, weight = 1 }, { other, weight = 2 } }
    local total = { [0] = 0, [1] = 0 }
    for s, step in ipairs(global_steps(1, 30, { data = mix })) do
      local counts = source_counts(step)
      total[0], total[1] = total[0] + (counts[0] or 0), total[1] + (counts[1] or 0)
      assert.is_true(math.abs(total[0] - s * 8 / 3) < 1, 'step ' .. s .. ': ' .. total[0])
    end
    local scheduled = data.mix { { corpus, weight = require('wick.schedule').linear(1, 0, 10) }, { other, weight = 0.5 } }
    local steps = global_steps(1, 12, { data = scheduled })
    assert.are.same({ [0] = 5, [1] = 3 }, source_counts(steps[1]))  -- 1 : 0.5 of 8, rounded with credit
    assert.are.same({ [1] = 8 }, source_counts(steps[12]))          -- weight 0 after step 10
  end)

  it('resumes with changed weights without repeating or skipping a sample of any source', function()
    local before = data.mix { { corpus, weight = 1 }, { other, weight = 1 } }
    local after = data.mix { { corpus, weight = 3 }, { other, weight = 1 } }
    local l = loader { data = before }
    local seen = read_steps(l, 6)
    local cursor = l:state()
    l:close()
    for _, step in ipairs(global_steps(1, 6, { data = after, cursor = cursor })) do seen[#seen + 1] = step end
    -- Per source, the samples drawn are exactly the first ones of that source's own sequence.
    for source, path in pairs { [0] = corpus, [1] = other } do
      local drawn = {}
      for _, step in ipairs(seen) do
        for _, id in ipairs(step.ids) do
          if id:match('^' .. source .. ':') then drawn[#drawn + 1] = id:match('^%d+:(.*)$') end
        end
      end
      local alone = loader { data = path, global_batch = 1 }
      for i = 1, #drawn do
        alone:next()
        local s = alone:sample(0)
        assert.are.equal(('%d:%d:%d'):format(s.shard, s.offset, s.epoch), drawn[i], 'source ' .. source .. ' draw ' .. i)
      end
      alone:close()
    end
  end)

  it('adds a source at resume time: only future draws change', function()
    local l = loader { data = corpus }
    local seen = read_steps(l, 3)
    local cursor = l:state()
    l:close()
    local mix = data.mix { { corpus, weight = 1 }, { other, weight = 1 } }
    local resumed = global_steps(1, 3, { data = mix, cursor = cursor })
    local drawn = {}
    for _, step in ipairs(seen) do for _, id in ipairs(step.ids) do drawn[#drawn + 1] = id end end
    for _, step in ipairs(resumed) do
      for _, id in ipairs(step.ids) do if id:match('^0:') then drawn[#drawn + 1] = id end end
    end
    local alone = global_steps(1, 5, { data = corpus })
    local expected = {}
    for _, step in ipairs(alone) do for _, id in ipairs(step.ids) do expected[#expected + 1] = id end end
    assert.are.same({ unpack(expected, 1, #drawn) }, drawn)
  end)

  it('reports realized proportions and stops a source after its epochs', function()
    local mix = data.mix { { corpus, weight = 1 }, { small, weight = 1, epochs = 1 } }
    local l = loader { data = mix }
    local small_epoch = l:epoch_length(2)
    local steps = read_steps(l, math.floor(3 * small_epoch / 4))
    local shares, draws = l:proportions()
    l:close()
    assert.are.equal(small_epoch, draws[2])
    assert.is_true(shares[1] > 0.5)
    for _, id in ipairs(steps[#steps].ids) do assert.matches('^0:', id) end
  end)

  it('stops with an error when every weight of a schedule reaches zero', function()
    local schedule = require('wick.schedule')
    local mix = data.mix { { corpus, weight = schedule.linear(1, 0, 3) }, { other, weight = schedule.linear(1, 0, 3) } }
    local l = loader { data = mix }
    local ok, err = pcall(function() for _ = 1, 10 do l:next() end end)
    l:close()
    assert.is_false(ok)
    assert.matches('every weight of the mix is 0 at step 3', err, 1, true)
  end)

  it('refuses the same dataset twice in one mix', function()
    local ok, err = pcall(function() loader({ data = data.mix { corpus, { corpus, weight = 2 } } }):next() end)
    assert.is_false(ok)
    assert.matches('hold the same data', err, 1, true)
  end)

  it('ends finite sources by dropping or padding the last partial batch', function()
    local l = loader { data = data.mix { { small, epochs = 1 } } }
    local epoch = l:epoch_length()
    local steps = read_steps(l, 1000)
    l:close()
    assert.are.equal(math.floor(epoch / 8), #steps)
    l = loader { data = data.mix { { small, epochs = 1 } }, at_end = 'pad' }
    steps = read_steps(l, 1000)
    l:close()
    assert.are.equal(math.ceil(epoch / 8), #steps)
  end)
end)

describe('packing', function()
  it('cuts packed windows of seq_len + 1 tokens from documents joined by EOS', function()
    local l = loader { document_ids = true, shuffle = false, global_batch = 2 }
    local batch = l:next()
    local width = SEQ + 1
    local tokens = l:row_tokens(0)
    assert.are.equal(width, #tokens)
    -- stored order: the first window starts with document 1 ("doc1 ...")
    local text = {}
    for i = 1, 4 do text[i] = string.char(tokens[i]) end
    assert.are.equal('doc1', table.concat(text))
    -- the second row continues where the first one ended (overlap of one token)
    assert.are.equal(tokens[width], l:row_tokens(1)[1])
    local mask, doc_ids, positions = data_helper.values(batch.loss_mask), data_helper.values(batch.doc_ids),
      data_helper.values(batch.positions)
    for t = 0, SEQ - 1 do assert.are.equal(1, mask[t]) end
    -- doc ids count EOS tokens; positions restart after each
    local row = l:row_tokens(1)
    local doc, position = 0, 0
    for t = 0, width - 1 do
      assert.are.equal(doc, doc_ids[width + t])
      assert.are.equal(position, positions[width + t])
      position = position + 1
      if row[t + 1] == 256 then doc, position = doc + 1, 0 end
    end
    l:close()
  end)

  it('puts one document per row in pad mode, masking targets after its EOS', function()
    local L = 512
    local l = loader { mode = 'pad', seq_len = L, shuffle = false, global_batch = 2 }
    local batch = l:next()
    local s = l:sample(0)
    local tokens = l:row_tokens(0)
    local doc = data_helper.documents(600, 40, 1)[1]
    assert.are.equal(#doc, s.length)
    for i = 1, #doc do assert.are.equal(doc:byte(i), tokens[i]) end
    for t = #doc + 1, L + 1 do assert.are.equal(256, tokens[t]) end -- EOS, then EOS padding
    local mask = data_helper.values(batch.loss_mask)
    for t = 0, L - 1 do
      assert.are.equal(t + 1 <= #doc and 1 or 0, mask[t], 'mask at ' .. t)
    end
    l:close()
    -- A document longer than the row is truncated: every target counts.
    l = loader { mode = 'pad', seq_len = 32, shuffle = false, global_batch = 2 }
    batch = l:next()
    mask = data_helper.values(batch.loss_mask)
    for t = 0, 31 do assert.are.equal(1, mask[t]) end
    assert.are.equal(doc:byte(33), l:row_tokens(0)[33])
    l:close()
  end)
end)

describe('the pipeline', function()
  it('keeps the step loop JIT-compiled: next() causes no trace aborts', function()
    local l = loader { global_batch = 8 }
    -- start() runs once per loader (its loops over the ring's slots and the counters may or may not be
    -- hot, by what ran before): the step loop measured is next() on a started loader
    l:start()
    local aborts, traces = {}, 0
    local events = {}
    -- A trace that starts inside next() (at its entry or a side exit) and returns into this spec's loop
    -- before the loop has a trace of its own is abandoned at the loop's header, "loop unroll limit
    -- reached" (reason 10); whether next()'s hot counter fires before the loop's depends on where the
    -- bytecode lies in memory (hot counters are hashed by address), not on next(). The loop's own trace
    -- follows. busted's own environment (busted/environment.lua) answers the global lookups of code
    -- it loads through a recursive getEnv, which a trace may abandon ("call unroll limit reached",
    -- reason 13): the harness's, not next()'s, which under ./run reads its globals from _G. Any other
    -- abort, and any abort inside lua/wick, is next()'s.
    local LOOP_UNROLL_LIMIT, this_spec = 10, debug.getinfo(1, 'S').source
    local function harness(info) return info.source:match('/busted/environment%.lua$') ~= nil end
    local function on_trace(what, _, func, pc, reason)
      events[#events + 1] = what
      if what == 'stop' then traces = traces + 1 end
      local info = what == 'abort' and require('jit.util').funcinfo(func, pc)
      if info and not (reason == LOOP_UNROLL_LIMIT and info.source == this_spec) and not harness(info) then
        aborts[#aborts + 1] = ('%s:%s %s'):format(info.source, tostring(info.currentline), tostring(reason))
      end
    end
    jit.flush() -- start from no traces, so the loop below must be recorded anew
    jit.attach(on_trace, 'trace')
    local rows = 0
    for _ = 1, 500 do rows = rows + l:next().rows end
    jit.attach(on_trace) -- detach
    l:close()
    assert.are.equal(4000, rows)
    assert.is_true(traces > 0, 'no trace was compiled; jit: ' .. tostring(jit.status()) .. ' events ' .. table.concat(events, ','))
    assert.are.same({}, aborts)
  end)

  it('reports how long next() waited and keeps its ring within the memory budget', function()
    local l = loader { memory_budget = 4096, prefetch = 64, global_batch = 8 }
    l:next()
    local stats = l:stats()
    assert.is_true(stats.buffers >= 2)
    assert.is_true(stats.buffers * stats.buffer_bytes <= 4096)
    assert.is_true(l.batch.wait_ns >= 0)
    l:close()
    local ok, err = pcall(function() loader({ memory_budget = 100 }):next() end)
    assert.is_false(ok)
    assert.matches('memory budget 100 bytes', err, 1, true)
  end)

  it('rejects shapes that do not divide, naming the numbers', function()
    local ok, err = pcall(function() loader({ global_batch = 10, world_size = 4 }):next() end)
    assert.is_false(ok)
    assert.matches('global batch 10 is not divisible by world size 4', err, 1, true)
    ok, err = pcall(function() loader({ global_batch = 8, micro_batch = 3 }):next() end)
    assert.is_false(ok)
    assert.matches('micro batch 3 does not divide', err, 1, true)
  end)
end)

describe('bad data', function()
  local function corrupted(name, compression)
    local dir = data_helper.make_dataset(root .. '/' .. name, data_helper.documents(60, 20, 4),
      { shard_size = 100000, block_size = 256, compression = compression })
    data_helper.corrupt_payload(dir .. '/shard-00000.wks', 600) -- inside block 1 (256 u16 = 512 bytes each)
    return dir
  end

  it('stops with an error naming the file, the block and the reason', function()
    for _, compression in ipairs { 'none', 'zstd' } do
      local dir = corrupted('bad-error-' .. compression, compression)
      local l = loader { data = dir, shuffle = false, global_batch = 4 }
      local ok, err = pcall(function() while l:next() do end end)
      l:close()
      assert.is_false(ok)
      assert.matches('shard-00000.wks', err, 1, true)
      assert.matches(compression == 'none' and 'block 1' or 'block %d+', err)
      assert.matches('checksum', err, 1, true)
    end
  end)

  it("skips, masks and counts corrupt samples with on_corrupt = 'skip', and resumes exactly", function()
    local dir = corrupted('bad-skip', 'none')
    local l = loader { data = dir, shuffle = false, global_batch = 4, on_corrupt = 'skip' }
    local epoch = l:epoch_length()
    local skipped_rows = 0
    for _ = 1, math.floor(epoch / 4) do
      local batch = l:next()
      for row = 0, batch.rows - 1 do
        local s = l:sample(row)
        if s.status == 'skipped' then
          skipped_rows = skipped_rows + 1
          -- a sample overlapping block 1 (tokens 256..511), fully masked
          assert.is_true(s.offset + s.length > 256 and s.offset < 512)
          local mask = data_helper.values(batch.loss_mask)
          for t = 0, batch.seq_len - 1 do assert.are.equal(0, mask[row * batch.seq_len + t]) end
        end
      end
    end
    local cursor = l:state()
    l:close()
    assert.is_true(skipped_rows > 0)
    assert.matches('skipped=' .. skipped_rows, cursor, 1, true)
    assert.are.equal(skipped_rows, (function()
      local again = loader { data = dir, shuffle = false, global_batch = 4, on_corrupt = 'skip', cursor = cursor }
      local n = tonumber(again:state():match('skipped=(%d+)'))
      again:close()
      return n
    end)())
  end)
end)

describe('memory', function()
  it('stays within its budget on a dataset larger than the budget', function()
    if require('wick').build_info().build_flags:find('asan') then
      -- ASan's quarantine holds freed memory on purpose: resident size says nothing there.
      pending('resident memory is not meaningful under AddressSanitizer')
      return
    end
    -- ~2.5 MB of text, zstd blocks of 4096 tokens; cache budget 64 KiB, ring budget 64 KiB.
    local dir = data_helper.make_dataset(root .. '/large', data_helper.documents(20000, 60, 5),
      { shard_size = 65536, block_size = 4096, compression = 'zstd' })
    local CACHE, RING = 65536, 65536
    local l = loader { data = dir, seq_len = 128, global_batch = 16, node_cache_bytes = CACHE, memory_budget = RING,
      shuffle = { window_tokens = 2 * 65536, pool_tokens = 2 * 4096 } }
    l:next()
    local before = data_helper.anon_rss()
    local rows = 0
    for _ = 1, math.floor(l:epoch_length() / 16) - 1 do rows = rows + l:next().rows end
    local growth = data_helper.anon_rss() - before
    local stats = l:stats()
    l:close()
    assert.is_true(rows * 129 * 2 > 4 * (CACHE + RING), 'the dataset must be larger than the budgets')
    assert.is_true(stats.buffers * stats.buffer_bytes <= RING)
    assert.is_true(growth < CACHE + RING + 2 * 1024 * 1024, ('anonymous memory grew by %d bytes'):format(growth))
  end)
end)

describe('batches as tensors', function()
  local ffi = require 'ffi'
  local wick = require 'wick'
  local T = wick.tensor
  local C = require('wick.core').C

  local function cpu_allocs()
    local stats = ffi.new('WkAllocatorStats')
    C.wk_allocator_stats(C.WK_DEVICE_CPU, 0, stats)
    return tonumber(stats.device_allocs)
  end

  it('are tensors made once per ring slot: the same objects whenever a slot comes back, no allocation per next()', function()
    local l = loader { document_ids = true, prefetch = 3, global_batch = 4 }
    local batch = l:next()
    local ring = l:stats().buffers
    assert.are.same({ 4, SEQ + 1 }, batch.tokens.shape)
    assert.are.same({ 'i32', 'cpu' }, { batch.tokens.dtype, batch.tokens.device })
    assert.are.same({ 4, SEQ }, batch.inputs.shape)
    assert.are.same({ 4, SEQ }, batch.targets.shape)
    assert.are.same({ 4, SEQ }, batch.loss_mask.shape)
    assert.are.equal('u8', batch.loss_mask.dtype)
    assert.are.same({ 4, SEQ + 1 }, batch.doc_ids.shape)
    assert.are.same({ 4, SEQ + 1 }, batch.positions.shape)
    -- inputs and targets are views of the tokens, one token apart
    assert.is_true(C.wk_tensor_same_storage(batch.inputs, batch.tokens) == 1)
    assert.are.equal(ffi.cast('char *', batch.tokens:data()) + 4, ffi.cast('char *', batch.targets:data()))
    assert.are.same(l:row_tokens(1), batch.tokens:narrow(1, 2, 1):totable()[1])
    local first = {}
    for s = 1, ring do
      if s > 1 then batch = l:next() end
      first[s] = { tokens = batch.tokens, inputs = batch.inputs, mask = batch.loss_mask }
    end
    local allocs = cpu_allocs()
    for round = 1, 3 do
      for s = 1, ring do
        batch = l:next()
        assert.is_true(rawequal(first[s].tokens, batch.tokens), 'slot ' .. s .. ', round ' .. round)
        assert.is_true(rawequal(first[s].inputs, batch.inputs))
        assert.is_true(rawequal(first[s].mask, batch.loss_mask))
      end
    end
    assert.are.equal(allocs, cpu_allocs())
    l:close()
  end)

  it('keep the micro-batches of a step valid together until the next step begins', function()
    -- 4 micro-batches a step, and readers 2 ahead: they would refill a given-back slot at once.
    local l = loader { global_batch = 8, micro_batch = 2, prefetch = 2, threads = 2 }
    local micro, seen = {}, {}
    for m = 1, 4 do
      local batch = l:next()
      assert.are.equal(m - 1, batch.micro_step)
      micro[m], seen[m] = batch.tokens, batch.tokens:totable()
    end
    helper.sh('sleep 0.2')  -- time for the readers to fill whatever they may
    for m = 1, 4 do assert.are.same(seen[m], micro[m]:totable(), 'micro-batch ' .. m) end
    assert.are.equal(2 + 3, l:stats().buffers)  -- prefetch, plus three held
    l:close()
  end)

  it('feed the model without a copy: the embedding and the loss read the ring slot in place', function()
    local l = loader { global_batch = 4 }
    local model = wick.nn.gpt { vocab = 257, seq_len = SEQ, layers = 1, heads = 2, dim = 8, seed = 3 }
    for step = 1, 3 do
      local batch = l:next()
      local before = cpu_allocs()
      model:zero_grad()
      model:forward(batch.inputs, batch.targets, batch.loss_mask, batch.rows * SEQ)
      model:backward()
      if step > 1 then assert.are.equal(before, cpu_allocs(), 'step ' .. step .. ' allocated') end
      -- what the ops read is the loader's memory itself
      assert.are.equal(batch.inputs:data(), model.given.idx:data())
      assert.are.equal(batch.targets:data(), model.given.targets:data())
      assert.are.equal(batch.loss_mask:data(), model.given.mask:data())
      assert.are.equal(ffi.cast('char *', batch.tokens:data()) + 4, ffi.cast('char *', model.given.targets:data()))
    end
    -- forward_tokens (its own two views) gives the same loss as the batch's views
    local batch = l:next()
    local a = model:forward(batch.inputs, batch.targets, batch.loss_mask)
    local b = model:forward_tokens(batch.tokens, batch.loss_mask)
    assert.are.equal(a, b)
    assert.are.equal(batch.tokens:data(), model.given.idx:data())
    model:free()
    l:close()
  end)

  it("refuse device = 'cuda:0' on a machine without one, saying what to do instead", function()
    if C.wk_cuda_device_count() > 0 then
      pending('this machine has a CUDA device (tests/ops/cuda_spec.lua covers it)')
      return
    end
    local ok, err = pcall(loader, { device = 'cuda:0' })
    assert.is_false(ok)
    assert.matches('loader device cuda:0: this machine has 0 CUDA device(s) (no GPU, no driver, or a libwick built ' ..
      'without CUDA); leave the loader on the CPU', err, 1, true)
    ok, err = pcall(loader, { device = 'tpu' })
    assert.is_false(ok)
    assert.matches("unknown device 'tpu'", err, 1, true)
    local l = loader { device = 'cpu' }
    assert.are.equal('cpu', l:next().tokens.device)
    l:close()
  end)
end)

describe('what the loader tells a recipe', function()
  local function cursor_draws(cursor)
    local draws = {}
    for n in cursor:gmatch(' src=%x+:(%d+):') do draws[#draws + 1] = tonumber(n) end
    return draws
  end

  it('gives the vocabulary and EOS of its sources, and per-source draws that agree with the cursor', function()
    local mix = data.mix { { corpus, weight = 3 }, { other, weight = 1 } }
    local l = loader { data = mix }
    assert.are.equal(257, l:vocab_size())  -- the bytes tokenizer: 256 bytes and EOS, before any batch
    assert.are.equal(256, l:eos())
    local _, draws = l:proportions()
    assert.are.same({ 0, 0 }, draws)
    read_steps(l, 7)
    local shares
    shares, draws = l:proportions()
    local cursor = l:state()
    assert.are.same(cursor_draws(cursor), draws)
    assert.are.equal(7 * 8, draws[1] + draws[2])
    assert.is_true(math.abs(shares[1] - 0.75) <= 1 / (7 * 8), 'share ' .. shares[1])
    l:close()
    -- a restored loader counts from the cursor
    local again = loader { data = mix, cursor = cursor }
    assert.are.same({ select(2, again:proportions()) }, { draws })
    again:close()
  end)
end)
