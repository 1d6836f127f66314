-- wick.data.quality: how well a sample order mixes, measured over one epoch rather than assumed.
--
--   local quality = require 'wick.data.quality'
--   local order = quality.loader_order { data = 'data/web', seq_len = 1024, global_batch = 512 }
--   local figures = quality.measure(order, 512, ds)   -- ds: the wick.dataset of the same data
--
-- An order is a list of samples { shard, offset, item } in draw order. The figures, per epoch:
--   shards_per_batch, shards_per_batch_min   distinct shards in a global batch (mean, worst)
--   docs_per_batch                           distinct documents (of the samples' first tokens)
--   correlation                              Pearson r of draw index against stored position
--   neighbour_distance                       mean |stored position step| between consecutive
--                                            samples, as a fraction of the epoch (random: ~1/3)
-- quality.reference_order reproduces the order of Wick 0.1 (every sample of a window of shards
-- shuffled together, the window counted in shards), so a dataset's figures can be compared with it.
-- This is a tool: it walks an epoch in Lua, which training never does.
local core = require 'wick.core'
local data = require 'wick.data'
local ffi, C = core.ffi, core.C

local quality = {}

local u64 = ffi.typeof('uint64_t')
local KEY_SHARDS, KEY_WINDOW = 1, 2 -- Wick 0.1's permutation purposes

-- The samples of one epoch as the loader delivers them (world size 1: the global order itself).
function quality.loader_order(opts)
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  o.world_size, o.rank, o.micro_batch = 1, 0, nil
  local loader = data.loader(o)
  local steps = math.floor(loader:epoch_length() / (o.global_batch or 8))
  local order = {}
  for _ = 1, steps do
    local batch = loader:next()
    for row = 0, batch.rows - 1 do
      local s = loader:sample(row)
      order[#order + 1] = { shard = s.shard, offset = s.offset, epoch = s.epoch }
    end
  end
  loader:close()
  return order
end

local function samples_of_shard(info, seq_len, mode)
  if mode == 'pad' then return info.documents end
  return info.tokens > seq_len and math.floor((info.tokens - 1) / seq_len) or 0
end

-- Wick 0.1's content fingerprint: the shard count, then each shard's name bytes, tokens, documents.
local function reference_fingerprint(ds)
  local fp = u64(ds.shards)
  for s = 0, ds.shards - 1 do
    local info = ds:shard(s)
    for i = 1, #info.name do fp = C.wk_mix64(fp, info.name:byte(i)) end
    fp = C.wk_mix64(fp, info.tokens)
    fp = C.wk_mix64(fp, info.documents)
  end
  return fp
end

-- Epoch `epoch` of Wick 0.1's order (one partition): shards permuted, then the samples of each run of
-- `window` shards permuted together. opts: seq_len, seed, window (shards), mode ('packed' or 'pad').
function quality.reference_order(ds, opts)
  local L, window, mode = opts.seq_len or 1024, opts.window or 8, opts.mode or 'packed'
  local epoch = u64(opts.epoch or 0)
  local fp = reference_fingerprint(ds)
  local function key(purpose) return C.wk_mix64(C.wk_mix64(C.wk_mix64(u64(opts.seed or 0), fp), epoch), purpose) end
  local shards, counts = {}, {}
  for t = 0, ds.shards - 1 do
    local shard = tonumber(C.wk_permute(key(KEY_SHARDS), ds.shards, t))
    shards[t + 1] = shard
    counts[t + 1] = samples_of_shard(ds:shard(shard), L, mode)
  end
  local order = {}
  for first = 1, #shards, window do
    local last = math.min(first + window - 1, #shards)
    local size = 0
    for t = first, last do size = size + counts[t] end
    local window_key = C.wk_mix64(key(KEY_WINDOW), math.floor((first - 1) / window))
    for q = 0, size - 1 do
      local r = tonumber(C.wk_permute(window_key, size, q))
      local t = first
      while r >= counts[t] do r, t = r - counts[t], t + 1 end
      local offset = mode == 'pad' and ds:document(shards[t], r) or r * L
      order[#order + 1] = { shard = shards[t], offset = offset }
    end
  end
  return order
end

-- The figures of an order (see the top of this file); ds is the dataset the order draws from.
function quality.measure(order, global_batch, ds)
  local n = #order
  local ranks, sorted = {}, {}
  for i = 1, n do sorted[i] = i end
  table.sort(sorted, function(a, b)
    local x, y = order[a], order[b]
    if x.shard ~= y.shard then return x.shard < y.shard end
    return x.offset < y.offset
  end)
  for rank, i in ipairs(sorted) do ranks[i] = rank end
  local doc = ffi.new('uint64_t[1]')
  local batches, shard_sum, shard_min, doc_sum = 0, 0, math.huge, 0
  for first = 1, n - global_batch + 1, global_batch do
    local shards, docs, ns, nd = {}, {}, 0, 0
    for i = first, first + global_batch - 1 do
      local s = order[i]
      if not shards[s.shard] then shards[s.shard], ns = true, ns + 1 end
      core.check(C.wk_dataset_document_at(ds.handle, s.shard, s.offset, doc), 2)
      local id = s.shard * 2 ^ 32 + tonumber(doc[0])
      if not docs[id] then docs[id], nd = true, nd + 1 end
    end
    batches, shard_sum, doc_sum = batches + 1, shard_sum + ns, doc_sum + nd
    shard_min = math.min(shard_min, ns)
  end
  local sx, sy, sxx, syy, sxy, steps = 0, 0, 0, 0, 0, 0
  for i = 1, n do
    local x, y = i, ranks[i]
    sx, sy, sxx, syy, sxy = sx + x, sy + y, sxx + x * x, syy + y * y, sxy + x * y
    if i > 1 then steps = steps + math.abs(ranks[i] - ranks[i - 1]) end
  end
  local spread = math.sqrt((n * sxx - sx * sx) * (n * syy - sy * sy))
  return {
    samples = n, batches = batches,
    shards_per_batch = batches > 0 and shard_sum / batches or 0, shards_per_batch_min = batches > 0 and shard_min or 0,
    docs_per_batch = batches > 0 and doc_sum / batches or 0,
    correlation = spread > 0 and (n * sxy - sx * sy) / spread or 0,
    neighbour_distance = n > 1 and steps / (n - 1) / n or 0,
  }
end

return quality
