-- The I/O-aware order on datasets whose shards hold many units (blocks), so samples straddle units and
-- the straddlers' edges are used: the order's invariants, the tokens it delivers, decode amplification
-- through the loader's counters (one process and two real ranks sharing a node cache, one of them
-- killed), the cache budget it needs, flat resident memory, and its mixing against Wick 0.1's order.
local helper = require 'helper'
local data_helper = require 'helpers.data'
local data = require 'wick.data'
local dataset = require 'wick.data.dataset'
local quality = require 'wick.data.quality'
local q = helper.shell_quote

local SEQ = 32
local BLOCK = 512           -- tokens per block: a unit is one block (SEQ + 1 <= BLOCK)
local BUFFER = 4 * BLOCK    -- four units per buffer

local root, zstd, raw
setup(function()
  root = helper.tmpdir()
  local docs = data_helper.documents(3000, 60, 9)
  -- ~1.1M tokens in shards of ~8K tokens (16 blocks each).
  zstd = data_helper.make_dataset(root .. '/zstd', docs, { shard_size = 8192, block_size = BLOCK, compression = 'zstd' })
  raw = data_helper.make_dataset(root .. '/raw', docs, { shard_size = 8192, block_size = BLOCK, compression = 'none' })
end)
teardown(function() helper.rmtree(root) end)

local function loader(opts)
  local o = { data = zstd, seq_len = SEQ, global_batch = 8, seed = 5, shuffle = { pool_tokens = BUFFER },
              node_cache_bytes = 2 ^ 20 }
  for k, v in pairs(opts or {}) do o[k] = v end
  return data.loader(o)
end

local function global_steps(W, steps, opts) return data_helper.global_steps(loader, W, steps, opts) end

local function epoch_steps(opts)
  local l = loader(opts)
  local n = math.floor(l:epoch_length() / (opts and opts.global_batch or 8))
  l:close()
  return n
end

describe('the block-buffer order', function()
  it('covers every sample of an epoch exactly once, the same on 1, 2 and 4 ranks', function()
    for _, mode in ipairs { 'packed', 'pad' } do
      local steps = epoch_steps { mode = mode }
      local reference = global_steps(1, steps, { mode = mode })
      local seen = {}
      for _, step in ipairs(reference) do
        for _, id in ipairs(step.ids) do
          assert.is_nil(seen[id], mode .. ': sample ' .. id .. ' delivered twice')
          seen[id] = true
        end
      end
      assert.are.same(reference, global_steps(2, steps, { mode = mode, threads = 3 }), mode .. ', 2 ranks')
      assert.are.same(reference, global_steps(4, steps, { mode = mode, micro_batch = 1, threads = 1 }), mode .. ', 4 ranks')
    end
  end)

  it('delivers the stored tokens of every sample, straddlers and edges included', function()
    for _, case in ipairs { { raw, 'packed' }, { zstd, 'packed' }, { zstd, 'pad' } } do
      local dir, mode = case[1], case[2]
      local ds = assert(dataset.open(dir))
      local l = loader { data = dir, mode = mode }
      local straddlers = 0
      for _ = 1, math.floor(l:epoch_length() / 8) do
        local batch = l:next()
        local tokens = data_helper.values(batch.tokens)
        for row = 0, batch.rows - 1 do
          local s = l:sample(row)
          local stored = ds:read(s.shard, s.offset, s.length)
          for t = 0, s.length - 1 do
            if tokens[row * (SEQ + 1) + t] ~= stored[t] then
              error(('%s %s: sample %d:%d token %d is %d, stored %d'):format(dir, mode, s.shard, s.offset, t,
                tokens[row * (SEQ + 1) + t], stored[t]))
            end
          end
          if math.floor(s.offset / BLOCK) ~= math.floor((s.offset + s.length - 1) / BLOCK) then straddlers = straddlers + 1 end
        end
      end
      local stats = l:stats()
      l:close()
      ds:close()
      assert.is_true(straddlers > 100, 'too few straddling samples to test: ' .. straddlers)
      if dir == zstd and mode == 'packed' then assert.is_true(stats.node_edges_used > 50, 'edges used ' .. stats.node_edges_used) end
    end
  end)

  it('resumes exactly onto another world size', function()
    local uninterrupted = global_steps(1, 40)
    local l = loader { world_size = 2 }
    data_helper.read_steps(l, 25)
    local cursor = l:state()
    l:close()
    local resumed = global_steps(4, 15, { cursor = cursor })
    for i = 1, 15 do assert.are.same(uninterrupted[25 + i], resumed[i], 'step ' .. (25 + i)) end
  end)

  it('decodes each unit once per epoch with the smallest cache it accepts, on data eight times larger', function()
    local ok, err = pcall(function() loader({ node_cache_bytes = 4096 }):next() end)
    assert.is_false(ok)
    local minimum = tonumber(err:match('it needs at least (%d+) bytes'))
    assert.is_not_nil(minimum, err)
    assert.matches('shuffle pools of 4 units but %d+ are in use at once', err)
    local l = loader { node_cache_bytes = minimum }
    local steps = math.floor(l:epoch_length() / 8)
    for _ = 1, steps do l:next() end
    local s = l:stats()
    l:close()
    assert.is_true(s.decoded_bytes > 8 * minimum, ('decoded %d bytes, cache %d'):format(s.decoded_bytes, minimum))
    local amplification = s.decoded_bytes / s.delivered_bytes
    assert.is_true(amplification <= 1.05 and amplification > 0.9, ('decode amplification %.3f'):format(amplification))
    -- One process: the node is this loader (but for a unit its threads may be decoding between the two counts).
    assert.is_true(math.abs(s.node_decoded_bytes - s.decoded_bytes) <= 8 * BLOCK * 2,
      ('node decoded %d, this loader %d'):format(s.node_decoded_bytes, s.decoded_bytes))
    assert.are.equal(0, s.node_edges_missing)
  end)

  it('writes int64 tokens in the reader threads with dtype = i64', function()
    local a, b = loader(), loader { dtype = 'i64' }
    for _ = 1, 20 do
      local x, y = a:next(), b:next()
      assert.are.equal('i64', y.dtype)
      assert.are.equal('i64', y.tokens.dtype)
      local xs, ys = data_helper.values(x.tokens), data_helper.values(y.tokens)
      for i = 0, x.rows * (SEQ + 1) - 1 do assert.are.equal(xs[i], tonumber(ys[i])) end
    end
    a:close()
    b:close()
    local ok, err = pcall(loader, { dtype = 'f32' })
    assert.is_false(ok)
    assert.matches('loader option dtype = "f32" must be one of i32, i64', err, 1, true)
  end)

  it('refuses shuffle options counted in shards, unknown shuffle options and cursors of the old order', function()
    local ok, err = pcall(loader, { shuffle = { window = 8 } })
    assert.is_false(ok)
    assert.matches('shuffle.window counted shards', err, 1, true)
    ok, err = pcall(loader, { shuffle = { windw_tokens = 8 } })
    assert.is_false(ok)
    assert.matches("unknown shuffle option 'windw_tokens' (did you mean 'window_tokens'?)", err, 1, true)
    ok, err = pcall(loader, { shuffle = { pool_tokens = 2.5 } })
    assert.is_false(ok)
    assert.matches('shuffle option pool_tokens = 2.5 must be a whole number', err, 1, true)
    local old = 'wick-cursor/1 step=3 micro=0 world=1 global=8 seq=32 seed=5 mode=packed shuffle=1 window=8 ' ..
      'partitions=1 chunk=1 skipped=0 src=0123456789abcdef:24:0x0p+0'
    ok, err = pcall(loader, { cursor = old })
    assert.is_false(ok)
    assert.matches('cursor version 1 belongs to the shard-window order', err, 1, true)
  end)
end)

describe('resident memory', function()
  it('stays flat when the dataset is ten times larger', function()
    if require('wick').build_info().build_flags:find('asan') then
      pending('resident memory is not meaningful under AddressSanitizer')
      return
    end
    -- The same number of shards (open shards' tables are bounded by max_open_shards, not by the data).
    local docs = data_helper.documents(30000, 60, 21)
    local big = data_helper.make_dataset(root .. '/big-raw', docs, { shard_size = 655360, block_size = 4096 })
    local small = data_helper.make_dataset(root .. '/small-raw', { unpack(docs, 1, 3000) },
      { shard_size = 65536, block_size = 4096 })
    -- Each reading is a fresh process: in this one, memory the earlier specs freed goes back to the
    -- system at times of malloc's choosing and made the 1x growth negative.
    local function grown(dir)
      local r = helper.run(('%s/tests/helpers/resident_growth.lua %s'):format(q(helper.ROOT), q(dir)))
      assert.are.equal(0, r.rc, r.err)
      return assert(tonumber(r.out:match('^(%-?%d+)%s*$')), r.out)
    end
    local small_growth, big_growth = grown(small), grown(big)
    -- What grows is the node cache (1 MiB here) and the ring, the same for both.
    assert.is_true(big_growth < small_growth + 1024, ('grew %d KiB on 10x the data, %d KiB on 1x'):format(
      big_growth, small_growth))
  end)
end)

describe('a node cache shared by real ranks', function()
  local function start_rank(rank, job, ready, cache_bytes, die_after)
    local log = ('%s/rank%d.log'):format(root, rank)
    local env = ('RANK=%d WORLD_SIZE=2 LOCAL_RANK=%d LOCAL_WORLD_SIZE=2 WICK_JOB_ID=%s WICK_LOG=debug'):format(rank,
      rank, job)
    os.execute(('( %s %s %s/tests/helpers/stream_rank.lua %s %d 16 %d %d %s %s > %s 2>&1; echo $? >> %s ) &'):format(env,
      q(helper.RUN), helper.ROOT, q(zstd), SEQ, BUFFER, cache_bytes, q(ready), die_after or '', q(log), q(log)))
    return log
  end

  local function wait_for(logs, seconds)
    local deadline = os.time() + seconds
    while os.time() < deadline do
      local done = 0
      for _, log in ipairs(logs) do
        -- the exit status, on a line of its own after the counters (whose last one ends in a digit too)
        if ('\n' .. helper.read_file(log)):match('\n%d+\n$') then done = done + 1 end
      end
      if done == #logs then return true end
      os.execute('sleep 0.1')
    end
    return false
  end

  it('decodes each unit once per node, and a rank killed mid-stream does not stop the other', function()
    -- Decoded once per node holds whatever the ranks' relative speed when the cache holds every unit
    -- (8 MiB; the dataset decodes to ~2.5 MB). A smaller cache makes a rank that runs ahead evict units
    -- the other has yet to read, which the bench measures (amplification per node) under real load; here
    -- a killed rank must not pin a small cache (600 KiB) and stop the survivor.
    for _, case in ipairs { { name = 'both finish', cache = 8 * 2 ^ 20 },
                            { name = 'rank 1 killed', cache = 600 * 1024, die_after = 40 } } do
      -- Unique across concurrent suites (math.random is unseeded: the same sequence in every process).
      local job = 'j' .. helper.read_file('/proc/sys/kernel/random/uuid'):gsub('%W', '')
      local ready = root .. '/ready-' .. job
      os.execute('mkdir -p ' .. q(ready))
      local logs = { start_rank(0, job, ready, case.cache), start_rank(1, job, ready, case.cache, case.die_after) }
      assert.is_true(wait_for(logs, 60), case.name .. ': ranks did not finish in 60 s:\n' ..
        helper.read_file(logs[1]) .. helper.read_file(logs[2]))
      local first = helper.read_file(logs[1])
      assert.matches('\n0\n$', first, case.name .. ': rank 0 failed:\n' .. first)
      if case.die_after then
        assert.matches('\n137\n$', helper.read_file(logs[2])) -- SIGKILL
      else
        local second = helper.read_file(logs[2])
        assert.matches('\n0\n$', second)
        -- The node's counters as the last rank to finish saw them: the first may have decoded units for
        -- the other's future batches, so its own view overstates the ratio.
        local last = {}
        for _, log in ipairs { first, second } do
          local counters = {}
          for k, v in log:gmatch('([%w_]+)=(%d+)') do counters[k] = tonumber(v) end
          if (counters.node_delivered or 0) > (last.node_delivered or 0) then last = counters end
        end
        local amplification = last.node_decoded / last.node_delivered
        assert.is_true(amplification <= 1.05, ('node decode amplification %.3f:\n%s%s'):format(amplification, first, second))
      end
      -- The last reader to leave removes the node cache's name; a killed rank's is reclaimed by the survivor.
      local names = data_helper.node_caches(helper.read_file(logs[1]) .. helper.read_file(logs[2]))
      assert.are.equal(1, #names, case.name)
      assert.are.same({}, data_helper.node_caches_left(names), case.name)
    end
  end)
end)

describe('shuffle quality', function()
  it("reproduces Wick 0.1's order exactly (the reference the figures are compared with)", function()
    -- Ids printed by Wick 0.1 (`run -m wick.data.inspect --data DIR --seq-len 16 --global-batch 24
    -- --seed 7 --window 4`) for this dataset, made by this converter.
    local dir = data_helper.make_dataset(root .. '/v1', data_helper.documents(600, 40, 1), { shard_size = 1024 })
    local expected = '47:672 61:256 61:624 37:320 61:928 37:160 37:304 61:64 61:144 37:928 37:256 37:736 69:832 ' ..
      '47:560 69:960 47:1040 61:1024 37:128 37:912 61:352 47:944 47:864 61:464 69:48'
    local ds = assert(dataset.open(dir))
    local order = quality.reference_order(ds, { seq_len = 16, seed = 7, window = 4 })
    ds:close()
    local got = {}
    for i = 1, 24 do got[i] = ('%d:%d'):format(order[i].shard, order[i].offset) end
    assert.are.equal(expected, table.concat(got, ' '))
  end)

  it('mixes global batches at least as well as the old order, uncorrelated with the stored order', function()
    for _, mode in ipairs { 'packed', 'pad' } do
      local ds = assert(dataset.open(zstd))
      local new = quality.measure(quality.loader_order { data = zstd, seq_len = SEQ, global_batch = 16, mode = mode,
                                                         shuffle = { pool_tokens = 64 * BLOCK } }, 16, ds)
      local old = quality.measure(quality.reference_order(ds, { seq_len = SEQ, window = 8, mode = mode }), 16, ds)
      ds:close()
      assert.is_true(new.shards_per_batch >= 0.9 * old.shards_per_batch,
        ('%s: %.2f shards per batch, the old order %.2f'):format(mode, new.shards_per_batch, old.shards_per_batch))
      assert.is_true(math.abs(new.correlation) < 0.2, ('%s: position correlation %.3f'):format(mode, new.correlation))
      assert.is_true(new.neighbour_distance > 0.2, ('%s: neighbour distance %.3f'):format(mode, new.neighbour_distance))
    end
  end)

  it('prints the figures next to the old order with inspect --quality', function()
    local r = helper.run(('-m wick.data.inspect --data %s --seq-len %d --global-batch 16 --pool-tokens %d ' ..
      '--quality'):format(q(zstd), SEQ, 64 * BLOCK))
    assert.are.equal(0, r.rc, r.err)
    assert.matches('distinct shards per batch %(mean%)%s+[%d%.]+%s+[%d%.]+', r.out)
    assert.matches('position correlation%s+%-?[%d%.]+%s+%-?[%d%.]+', r.out)
    assert.matches('Wick 0.1 %(8%)', r.out)
  end)
end)
