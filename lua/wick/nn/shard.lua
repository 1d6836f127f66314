-- wick.nn.shard: which part of a model's flat parameters each rank owns under sharded data
-- parallelism (nn.data_parallel's shard = 'optimizer' | 'gradients' | 'parameters'), and the
-- collectives that move owned parts: packing them into a rank's slice, gathering slices back into
-- full tensors, and summing a number over the ranks in rank order.
--
-- The layout follows data_parallel's gradient buckets. Sharded, every bucket holds a multiple of
-- the world size W of elements, except a replicated one: the head of a run of the flat storage (its
-- numel mod W elements, fewer than W; one run unless the buckets are cut at the units of
-- 'parameters'), which every rank keeps whole (all-reduced and updated alike everywhere). Every
-- other bucket is cut into W equal blocks, block r owned by rank r. Blocks of each bucket rather than
-- one contiguous 1/W of the storage: a bucket's reduce-scatter then delivers exactly this rank's part
-- of it as soon as backward finishes the bucket, with no re-layout, and each collective is shared
-- evenly. A rank's slice is its pieces (blocks and the replicated heads) packed in flat order; every
-- rank's slice has the same size (one run: N div W + N mod W).
local ffi = require 'ffi'
local T = require 'wick.tensor'

local Layout = {}
Layout.__index = Layout

-- buckets: data_parallel's, each { offset, numel, replicated } (0-based offsets into the flat
-- storage); sets each non-replicated bucket's block (elements a rank owns of it) and piece.
local function new(dist, buckets)
  local self = setmetatable({ dist = dist, rank = dist.rank, world_size = dist.world_size, pieces = {} }, Layout)
  local W = self.world_size
  for _, b in ipairs(buckets) do
    if b.replicated then
      b.piece = { offset = b.offset, numel = b.numel, replicated = true }
    else
      assert(b.numel % W == 0, 'nn.shard: a bucket of a size that is not a multiple of the world size')
      b.block = b.numel / W
      b.piece = { offset = b.offset + self.rank * b.block, numel = b.block, bucket = b }
    end
    self.pieces[#self.pieces + 1] = b.piece
  end
  table.sort(self.pieces, function(a, b) return a.offset < b.offset end)
  local at = 0
  for _, p in ipairs(self.pieces) do
    p.at = at  -- 0-based, in the slice
    at = at + p.numel
  end
  self.numel = at
  self.part = T.zeros({ 1 }, 'i64')
  self.parts = T.zeros({ W }, 'i64')
  return self
end

-- Whether this rank adds piece p to a sum over the ranks (a replicated piece counts once: rank 0's).
function Layout:counts(p) return not p.replicated or self.rank == 0 end

-- The sum of x over the ranks, as doubles added in rank order: the same bits on every rank (site:
-- the recipe line a hang report quotes, as wick.dist's collectives take it).
function Layout:sum(x, site)
  if self.world_size == 1 then return x end
  ffi.cast('double *', self.part:data())[0] = x
  self.dist:all_gather(self.parts, self.part, site)
  local parts, sum = ffi.cast('double *', self.parts:data()), 0
  for r = 0, self.world_size - 1 do sum = sum + parts[r] end
  return sum
end

-- Copies this rank's pieces of full (the flat storage's size) into slice (the slice's).
function Layout:pack(slice, full)
  for _, p in ipairs(self.pieces) do
    local src, dst = full:narrow(1, p.offset + 1, p.numel), slice:narrow(1, p.at + 1, p.numel)
    dst:copy(src)
    src:free()
    dst:free()
  end
end

-- Fills full from every rank's slice: each bucket's blocks all-gathered, the replicated head copied.
function Layout:gather(full, slice, site)
  for _, p in ipairs(self.pieces) do
    local b = p.bucket
    local dst = full:narrow(1, (b and b.offset or p.offset) + 1, b and b.numel or p.numel)
    local src = slice:narrow(1, p.at + 1, p.numel)
    if b then self.dist:all_gather(dst, src, site) else dst:copy(src) end
    src:free()
    dst:free()
  end
end

function Layout:free()
  self.part:free()
  self.parts:free()
end

return { layout = new }
