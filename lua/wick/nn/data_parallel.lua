-- wick.nn.data_parallel: one model replicated over the ranks of a wick.dist group.
--
--   local dp = wick.nn.data_parallel(model, dist, { bucket_bytes = 25 * 2^20, grad_dtype = 'fp32', shard = 'none',
--                                                   prefetch = 1 })
--   local r = dp:step(loader, opt)   -- one optimizer step over the loader's next global batch
--   -- r.loss (mean over the step's target tokens, all ranks), r.tokens (their count),
--   -- r.applied, r.grad_norm, r.ranks[k] = { data =, compute =, comm =, total = } (seconds, rank k-1)
--   -- and .peak_bytes (the most tensor memory rank k-1 has held on the model's device so far),
--   -- r.slowest (rank), r.overlapped (buckets whose all-reduce started before the backward pass
--   -- reached its last gradient group); dp:timing(r) is one line for the log
--
-- At creation the parameters are broadcast from rank 0. A step then:
--   1. takes this rank's micro-batches of the step from the loader (micro_steps of them: the
--      global batch over world size x micro batch; the loader keeps a step's batches valid
--      together, so they are used in place, not copied), and counts their target tokens;
--   2. all-reduces that count: every micro-batch's loss is divided by the step's global count
--      of target tokens, so neither the world size nor the accumulation split nor the padding
--      changes the gradient (the mean over micro-batch means that bit HF Trainer in 2024 cannot
--      happen here);
--   3. runs forward and backward per micro-batch; only the last backward communicates: its
--      gradient buckets (contiguous ranges of the flat gradient, bucket_bytes each) are
--      all-reduced (summed) on the group's worker thread as soon as the backward pass has
--      finished every parameter in them, overlapping with the rest of the backward; with
--      grad_dtype = 'bf16' a bucket travels as a bf16 copy (half the bytes on the wire), is
--      summed in bf16 (each addition in f32, rounded) and cast back (a sum, not an average: the
--      loss is already divided by the step's global count);
--   4. steps the optimizer (the same gradients everywhere, so the same update), and gathers
--      each rank's time split into data wait, compute and communication.
-- Sharded (wick.nn.shard says which part of the flat parameters a rank owns, block by bucket):
--   shard = 'optimizer' (ZeRO-1): each rank keeps AdamW's moments for its slice only; gradients
--      are all-reduced as above, each rank updates its slice of the f32 weights, and the updated
--      slices are all-gathered into every rank's full weights; under bf16/fp16 each rank keeps the
--      f32 masters of its slice only, and the 2-byte compute copy is what is all-gathered;
--   shard = 'gradients' (ZeRO-2): as 'optimizer', but step 3 reduce-scatters each bucket instead
--      (overlapped the same way) into this rank's slice of the gradient, so no rank holds the
--      reduced full gradient; the full-size buffer stays, backward accumulates into it;
--   shard = 'parameters' (ZeRO-3): each rank keeps the f32 masters of its slice only, under fp32
--      too; the model keeps no full weights but what wick.nn.gathered gathers from the slice, unit
--      by unit, before each block runs (the next `prefetch` blocks' gathers overlapping with the
--      current one's compute), and no full gradient: each unit's gradient is reduce-scattered
--      after its backward, every micro-step, and summed into the slice. The buckets are cut at the
--      runs of those units.
-- Gradient clipping then takes the global norm from each rank's sum of squares over its slice.
-- For a loop of your own: dp:global_count(n), then per micro-batch model:forward(batch.inputs,
-- batch.targets, batch.loss_mask, count) and dp:backward(is_last_micro_step).
local ffi = require 'ffi'
local core = require 'wick.core'
local schema = require 'wick.schema'
local T = require 'wick.tensor'
local shard = require 'wick.nn.shard'
local gathered = require 'wick.nn.gathered'

local C = core.C
local check = core.check
local now = core.now

local DEFAULT_BUCKET_BYTES = 25 * 2 ^ 20   -- torch DDP's default
local F32_BYTES = 4
local STATS = 6                            -- loss (a double's bits), data, compute, comm, total (ns), peak bytes
local NS = 1e9

local DataParallel = {}
DataParallel.__index = DataParallel

local OPTIONS = schema.define('nn.data_parallel option', {
  { 'bucket_bytes', 'integer', min = F32_BYTES, max = 2 ^ 40, default = DEFAULT_BUCKET_BYTES,
    help = 'gradient bytes per all-reduce (torch DDP: 25 MiB)' },
  { 'grad_dtype', 'enum', values = { 'fp32', 'bf16' }, default = 'fp32',
    help = "dtype the gradients are all-reduced in: 'bf16' halves the bytes on the wire" },
  { 'shard', 'enum', values = { 'none', 'optimizer', 'gradients', 'parameters' }, default = 'none',
    help = "what the ranks split into 1/world slices: 'optimizer' AdamW's moments, 'gradients' also the reduced "
      .. "gradients, 'parameters' also the weights (gathered block by block)" },
  { 'prefetch', 'integer', min = 1, max = gathered.MAX_PREFETCH, default = 1,
    help = "blocks whose weights are gathered ahead of the one running, under shard = 'parameters'" },
  { 'site', 'string', help = "where a hang report says the step's collectives come from (default: the line "
      .. 'that calls dp:step, outside Wick)' },
})
local WIRE_DTYPE = { fp32 = 'f32', bf16 = 'bf16' }  -- grad_dtype -> the dtype a bucket is all-reduced in

-- Gradient ranges in flat order: { offset, numel, ready, unit } where ready is the gradient group
-- after which backward() leaves the range alone (the last group + 1 when the model has none), and
-- unit (unit_of given: shard = 'parameters') the unit whose weights are gathered together
-- (wick.nn.gathered). From the model's placements (model.entries, wick.nn.gpt's flatten), so no
-- gradient need exist yet.
local function gradient_ranges(model, unit_of)
  local groups = model.gradient_groups and model:gradient_groups() or {}
  local ready_of = {}  -- module -> key -> group
  for g, modules in ipairs(groups) do
    for _, module in ipairs(modules) do
      for _, p in ipairs(module:parameters()) do
        ready_of[p.module] = ready_of[p.module] or {}
        ready_of[p.module][p.key] = g
      end
    end
  end
  local ranges = {}
  for _, p in ipairs(model.entries) do
    ranges[#ranges + 1] = { offset = p.offset, numel = p.numel, ready = (ready_of[p.module] or {})[p.key] or #groups + 1,
      unit = unit_of and unit_of[p] }
  end
  return ranges, #groups
end

-- Walks the flat gradient from its end (the backward pass finishes the last layers first) and
-- cuts it into buckets of at most bucket_bytes; a bucket is ready when its last range is. A bucket
-- never spans two units (ranges of different .unit, consecutive ones of a unit making a run). With
-- multiple > 1 (sharded: the world size) every bucket holds a multiple of it, but for the head of
-- each run, its numel mod multiple elements, which becomes a replicated bucket (wick.nn.shard).
local function make_buckets(ranges, bucket_bytes, multiple)
  local limit = math.max(multiple, math.floor(bucket_bytes / F32_BYTES / multiple) * multiple)
  local buckets, current = {}, nil
  local function end_run()  -- current is the run's first bucket, the only one that may be short
    local head = current.numel % multiple
    if head == 0 then return end
    local replicated = { hi = current.hi - current.numel + head, numel = head, ready = current.ready,
      unit = current.unit, replicated = true }
    current.numel = current.numel - head
    buckets[current.numel == 0 and #buckets or #buckets + 1] = replicated
  end
  for i = #ranges, 1, -1 do
    local r = ranges[i]
    if current and current.unit ~= r.unit then
      end_run()
      current = nil
    end
    local hi = r.offset + r.numel
    while hi > r.offset do
      if not current or current.numel == limit then
        current = { hi = hi, numel = 0, ready = 0, unit = r.unit }
        buckets[#buckets + 1] = current
      end
      local take = math.min(limit - current.numel, hi - r.offset)
      current.numel = current.numel + take
      current.ready = math.max(current.ready, r.ready)
      hi = hi - take
    end
  end
  if current then end_run() end
  for _, b in ipairs(buckets) do b.offset = b.hi - b.numel end
  -- Launch order: by readiness, then from the end; the same on every rank.
  table.sort(buckets, function(a, b)
    if a.ready ~= b.ready then return a.ready < b.ready end
    return a.offset > b.offset
  end)
  return buckets
end

-- The layout and this rank's slice of the f32 masters (layout.masters, where the optimizer updates
-- them) where the model gives up its full ones: under bf16/fp16, whereupon the model keeps its
-- compute copy only, and the updated compute copy is all-gathered from self.compute_slice in its
-- 2-byte dtype; and under 'parameters', whereupon the model keeps no weights at all but what
-- wick.nn.gathered gathers from self.compute_slice (the masters themselves under fp32). Before the
-- gradients exist, so the full masters and the full gradients are never held together.
local function shard_masters(self, model, unit_of)
  local flat = model.flat
  self.layout = shard.layout(self.dist, self.buckets)
  if not (model.policy.lowp or unit_of) then return end
  local n = self.layout.numel
  self.layout.masters = T.empty({ n }, 'f32', self.device)
  self.layout:pack(self.layout.masters, flat.params)
  self.compute_slice = model.policy.lowp and T.empty({ n }, model.policy.dtype, self.device) or self.layout.masters
  if not unit_of then
    model:release_masters()
    return
  end
  self.compute_slice:copy(self.layout.masters)
  model:release_weights()
  model.gathered = gathered.new(model, self.dist, self.buckets, self.compute_slice, unit_of, self.prefetch)
end

-- This rank's f32 slice (self.slice, its pieces packed in flat order): the gradients' destination
-- under 'gradients' and 'parameters' and, under fp32 'optimizer', the updated weights' all-gather
-- source; and each piece's gradients, in the slice or in the full buffer. Under 'parameters' every
-- piece's gradients are in the slice (replicated ones too: the step's sum over its micro-steps),
-- and each bucket lands (b.landing) where wick.nn.gathered says before it is added there.
local function shard_gradients(self, wire)
  local n, gathered = self.layout.numel, self.model.gathered
  if self.scatters or not self.layout.masters then self.slice = T.empty({ n }, 'f32', self.device) end
  for _, b in ipairs(self.buckets) do
    local p = b.piece
    b.scatter = self.scatters and not p.replicated
    if b.scatter or gathered then
      p.grads = self.slice:narrow(1, p.at + 1, p.numel)
      if b.scatter and b.wire then b.wire_out = T.empty({ p.numel }, wire, self.device) end
    else
      p.grads = self.model.flat.grads:narrow(1, p.offset + 1, p.numel)
    end
    if gathered then b.landing = b.scatter and b.gathered.landing or b.view end
  end
end

-- Under 'parameters': the buckets of each unit, and the block whose backward follows gradient group
-- g (model:gradient_groups(): a block's group holds the block alone).
local function unit_schedule(self, model)
  self.unit_buckets = {}
  for i, b in ipairs(self.buckets) do
    self.unit_buckets[b.unit] = self.unit_buckets[b.unit] or {}
    table.insert(self.unit_buckets[b.unit], i)
  end
  local block_of = {}
  for l, block in ipairs(model.blocks) do block_of[block] = l end
  self.block_after = {}
  for g, modules in ipairs(model:gradient_groups()) do
    if g > 1 and #modules == 1 and block_of[modules[1]] then self.block_after[g - 1] = block_of[modules[1]] end
  end
end

function DataParallel.new(model, dist, opts)
  opts = OPTIONS:check(opts or {}, 2)
  local wire = WIRE_DTYPE[opts.grad_dtype]
  if not (model.flat_parameters and dist and dist.world_size) then
    error('nn.data_parallel(model, dist): a model with flat parameters and a wick.dist group', 2)
  end
  local params = model.flat.params
  if not params then error('nn.data_parallel: the model\'s masters belong to another data parallelism', 2) end
  local self = setmetatable({ model = model, dist = dist, world_size = dist.world_size, rank = dist.rank,
    device = params.device }, DataParallel)
  dist:broadcast(params, 0)  -- every rank starts from rank 0's weights
  self.shard, self.prefetch, self.site = opts.shard, opts.prefetch, opts.site
  self.scatters = self.shard == 'gradients' or self.shard == 'parameters'  -- gradients reduce-scattered
  local unit_of = self.shard == 'parameters' and model:units() or nil
  local ranges, groups = gradient_ranges(model, unit_of)
  self.buckets = make_buckets(ranges, opts.bucket_bytes, self.shard == 'none' and 1 or self.world_size)
  if self.shard ~= 'none' then shard_masters(self, model, unit_of) end
  local flat = model:flat_parameters()  -- the gradients are made here (under 'parameters' by wick.nn.gathered)
  self.launch_at = {}  -- gradient group -> buckets to launch once it is done
  for g = 1, groups + 1 do self.launch_at[g] = {} end
  for i, b in ipairs(self.buckets) do
    b.view = b.gathered and b.gathered.grads or flat.grads:narrow(1, b.offset + 1, b.numel)
    if wire ~= 'f32' then b.wire = T.empty({ b.numel }, wire, self.device) end
    local list = self.launch_at[b.ready]
    list[#list + 1] = i
  end
  if self.shard ~= 'none' then shard_gradients(self, wire) end
  if model.gathered then unit_schedule(self, model) end
  self.works, self.started = {}, {}
  self.on_ready = function(g)
    if g == groups then self.overlapped = self.launched end  -- on their way before the last group
    for _, i in ipairs(self.launch_at[g]) do self:launch(i) end
    if model.gathered then self:clear_for(self.block_after[g]) end
  end
  self.count = T.zeros({ 1 }, 'i64')
  self.count_ptr = ffi.cast('int64_t *', self.count:data())
  self.stats = T.zeros({ STATS }, 'i64')
  self.gathered = T.zeros({ STATS * self.world_size }, 'i64')
  self.scalar = ffi.new('double[1]')
  -- The step's status on the model's device: its micro-batches' loss sums and bad-index marks, read
  -- once a step, so a GPU step has no host sync before its update (WkStepStatus in wick.h).
  self.status = T.zeros({ ffi.sizeof('WkStepStatus') }, 'u8', self.device)
  self.micro = {}  -- this step's micro-batches: { inputs =, targets =, mask = } (the loader's tensors)
  return self
end

-- What the hang report quotes for this model's collectives: the site option, or the line of the
-- loop that calls dp:step, found once (debug.getinfo is not compiled by the JIT, and a training loop
-- calls from the same line every step).
local function site_of(self)
  if not self.site_known then
    self.site = self.site or require('wick.dist').call_site() or '?'
    if self.layout then self.layout.site = self.site end
    if self.model.gathered then self.model.gathered.site = self.site end
    self.site_known = true
  end
  return self.site
end

function DataParallel:launch(i)
  if self.started[i] then return end  -- this backward's, in flight or finished already
  self.started[i] = true
  local b = self.buckets[i]
  if b.wire then b.wire:copy(b.view) end
  if b.scatter then
    local out = b.wire_out or b.landing or b.piece.grads
    self.works[i] = self.dist:reduce_scatter_start(out, b.wire or b.view, 'sum', site_of(self))
  else
    self.works[i] = self.dist:all_reduce_start(b.wire or b.view, 'sum', site_of(self))
  end
  self.launched = self.launched + 1
end

-- Waits for bucket i's collective and puts its result in place: cast back from the wire dtype, and
-- under 'parameters' added from where it landed into the slice.
function DataParallel:finish(i)
  local work = self.works[i]
  if not work then return end
  self.works[i] = nil
  work:wait()
  local b = self.buckets[i]
  if b.wire_out then (b.landing or b.piece.grads):copy(b.wire_out) elseif b.wire then b.view:copy(b.wire) end
  if b.landing then check(C.wk_op_axpy(b.piece.grads, 1, b.landing)) end
end

-- Under 'parameters', before block n's backward: the reduce-scatters of the block whose gradient
-- slot it takes over done, and the slot zeroed.
function DataParallel:clear_for(n)
  local gathered = self.model.gathered
  local before = n and gathered:previous_occupant(n)
  if not before then return end
  for _, i in ipairs(self.unit_buckets[before]) do self:finish(i) end
  gathered:clear_gradients(n)
end

-- Backward for one micro-batch; with sync (the last micro-batch of a step), also the gradient
-- all-reduce (or reduce-scatter), returning once the summed gradients are in place. Under
-- 'parameters' every micro-batch's gradients are reduce-scattered (no rank keeps a full gradient
-- to accumulate into), and the slice sums them.
function DataParallel:backward(sync)
  local model = self.model
  local gathered = model.gathered
  if not (sync or gathered) or (self.world_size == 1 and not self.scatters) then
    model:backward()
    return
  end
  site_of(self)
  self.launched, self.overlapped, self.started = 0, 0, {}
  if gathered then gathered:zero_gradients() end
  model:backward(self.on_ready)
  for i = 1, #self.buckets do self:launch(i) end
  for i = 1, #self.buckets do self:finish(i) end
end

-- The sum of n over all ranks (n: this rank's target tokens in the step).
function DataParallel:global_count(n)
  if self.world_size == 1 then return n end
  self.count_ptr[0] = n
  self.dist:all_reduce(self.count, 'sum', site_of(self))
  return tonumber(self.count_ptr[0])
end

-- The number of 1s of a u8 mask, through a reused f32 buffer on the mask's device.
function DataParallel:count_targets(mask)
  if not self.mask_f32 or self.mask_f32:numel() ~= mask:numel() or self.mask_f32.device ~= mask.device then
    if self.mask_f32 then self.mask_f32:free() end
    self.mask_f32 = T.empty(mask.shape, 'f32', mask.device)
  end
  self.mask_f32:copy(mask)
  check(C.wk_op_sumsq(self.mask_f32, self.scalar))  -- a 0/1 mask: its sum of squares counts it
  return self.scalar[0]
end

-- Takes this rank's micro-batches of the next step from the loader into self.micro; returns their
-- count and their target tokens, or nil at the end of the stream (an evaluation reads them too).
function DataParallel:take(loader)
  local batch = loader:next()
  if not batch then return nil end
  local n, targets = batch.micro_steps, 0
  for m = 1, n do
    if m > 1 then batch = loader:next() end
    if not batch or batch.micro_step ~= m - 1 then
      error('nn.data_parallel: the loader did not deliver micro-step ' .. (m - 1) .. ' of ' .. n .. ' of a step', 2)
    end
    local micro = self.micro[m] or {}
    micro.inputs, micro.targets, micro.mask = batch.inputs, batch.targets, batch.loss_mask
    self.micro[m] = micro
    targets = targets + self:count_targets(batch.loss_mask)
  end
  return n, targets
end

-- Time this rank has spent blocked in collectives so far.
local function comm_seconds(self)
  return self.world_size == 1 and 0 or self.dist:stats().wait_s
end

local function ms(seconds) return ('%.0f ms'):format(seconds * 1000) end

local function split_line(t)
  return ('data %s, compute %s, comm %s'):format(ms(t.data), ms(t.compute), ms(t.comm))
end

-- Gathers every rank's loss share and time split; all ranks get all of it.
local function gather(self, loss_share, data, comm, total)
  local p = ffi.cast('int64_t *', self.stats:data())
  ffi.cast('double *', p)[0] = loss_share
  p[1], p[2], p[3], p[4] = data * NS, (total - data - comm) * NS, comm * NS, total * NS
  p[5] = T.memory(self.device).peak
  local ranks, loss = {}, 0
  if self.world_size == 1 then
    self.gathered:copy(self.stats)
  else
    self.dist:all_gather(self.gathered, self.stats, site_of(self))
  end
  local g = ffi.cast('int64_t *', self.gathered:data())
  local slowest = 0
  for r = 0, self.world_size - 1 do
    local base = g + r * STATS
    loss = loss + ffi.cast('double *', base)[0]  -- in rank order: the same sum everywhere
    ranks[r + 1] = { data = tonumber(base[1]) / NS, compute = tonumber(base[2]) / NS, comm = tonumber(base[3]) / NS,
      total = tonumber(base[4]) / NS, peak_bytes = tonumber(base[5]) }
    if ranks[r + 1].total > ranks[slowest + 1].total then slowest = r end
  end
  return loss, ranks, slowest
end

-- This rank's share of the step's loss from the step's status; a bad token id or target in one of
-- its micro-batches fails the step before the update, in one line naming the step and the index.
local function read_status(self, opt)
  if C.wk_op_step_status(self.status, self.scalar) ~= 0 then
    require('wick.cli').fail(('step %d, rank %d: %s'):format(opt.step_count + 1, self.rank, core.last_error()))
  end
  return self.scalar[0]
end

-- One optimizer step (see the top of this file); nil at the end of the loader's stream.
function DataParallel:step(loader, opt)
  local model = self.model
  local start = now()
  local comm_before = comm_seconds(self)
  local n, local_targets = self:take(loader)
  if not n then return nil end
  local data = now() - start
  site_of(self)
  local tokens = self:global_count(local_targets)
  local loss_share, applied, norm = 0, false, nil
  if tokens > 0 then  -- an all-padding step has no target to learn from, on every rank alike
    if model.gathered then check(C.wk_op_fill(self.slice, 0)) else model:zero_grad() end
    check(C.wk_op_fill(self.status, 0))
    for m = 1, n do
      local micro = self.micro[m]
      model:forward(micro.inputs, micro.targets, micro.mask, tokens, self.status)
      self:backward(m == n)
    end
    loss_share = read_status(self, opt)
    applied, norm = opt:step(model, self.layout)
    if applied and self.layout and (self.world_size > 1 or self.layout.masters) then self:gather_parameters() end
  end
  local comm = comm_seconds(self) - comm_before
  local loss, ranks, slowest = gather(self, loss_share, data, comm, now() - start)
  return {
    loss = loss, tokens = tokens, applied = applied, grad_norm = norm, micro_steps = n,
    ranks = ranks, slowest = slowest, overlapped = self.overlapped,
  }
end

-- Every rank's updated slice into every rank's full weights: of the f32 weights, or under bf16/fp16
-- of the compute copy, cast from the master slice (rounded as an unsharded forward's refresh rounds);
-- under 'parameters' into the gathered root, the blocks gathered when they run.
function DataParallel:gather_parameters()
  local layout, flat = self.layout, self.model:flat_parameters()
  if self.model.gathered then
    if self.compute_slice ~= layout.masters then self.compute_slice:copy(layout.masters) end
    site_of(self)
    self.model.gathered:refresh()
  elseif layout.masters then
    self.compute_slice:copy(layout.masters)
    layout:gather(flat.compute, self.compute_slice, site_of(self))
  else
    layout:pack(self.slice, flat.params)
    layout:gather(flat.params, self.slice, site_of(self))
  end
end

-- The weights the model computes with, from this rank's slice of the masters wherever it holds one
-- (after they changed outside a step: a resume reads them into the slice).
function DataParallel:refresh_weights()
  if self.layout and self.layout.masters then self:gather_parameters() end
end

-- One log line from a step's result: this rank's split and the slowest rank's.
function DataParallel:timing(r)
  local mine, worst = r.ranks[self.rank + 1], r.ranks[r.slowest + 1]
  return ('rank %d: %s (%s); slowest rank %d: %s (%s)'):format(self.rank, ms(mine.total), split_line(mine), r.slowest,
    ms(worst.total), split_line(worst))
end

function DataParallel:free()
  for _, b in ipairs(self.buckets) do
    b.view:free()
    for _, t in pairs({ b.wire, b.wire_out, b.piece and b.piece.grads }) do t:free() end
  end
  if self.layout then
    for _, t in pairs({ self.slice, self.compute_slice, self.layout.masters }) do t:free() end
    self.layout:free()
  end
  for _, t in pairs({ self.count, self.stats, self.gathered, self.mask_f32, self.status }) do t:free() end
  self.micro, self.buckets = {}, {}
end

return { new = DataParallel.new, OPTIONS = OPTIONS }
