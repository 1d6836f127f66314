-- wick.nn.gathered: the weights of a model whose ranks each keep only their slice of them
-- (nn.data_parallel's shard = 'parameters', ZeRO-3 / FSDP), gathered unit by unit where they are used.
--
-- A model is cut into units: each transformer block, and the root (every parameter outside the
-- blocks: the embeddings, the final norm, an untied head). The root is used at both ends of every
-- forward and backward, so it stays gathered, in a buffer of its own, refreshed after each update.
-- The blocks take turns in prefetch + 1 slots of the largest block's size (fewer for a model of
-- fewer blocks): block l lives in slot (l - 1) mod slots + 1, so its parameters are views into that
-- slot, made once. Before block l runs, fetch(l, direction) makes sure the slot holds block l (its
-- all-gathers waited for) and starts gathering the next `prefetch` blocks (l + 1.. forward,
-- l - 1.. backward) into the other slots, which the blocks before l have finished with:
-- communication overlaps with block l's compute. The forward ends holding the last blocks, which
-- are the first the backward needs.
--
-- The gradients follow the same units: the root's in a buffer of its own, block l's in gradient
-- slot (l - 1) mod slots + 1, so that no rank holds the full gradient. Each unit's gradient is
-- reduce-scattered (nn.data_parallel) once its backward is done, every micro-step, into a landing
-- buffer of the unit's slot and from there added into the rank's slice; a block's gradient slot is
-- zeroed for its next occupant once those reduce-scatters are done (reuse(n)).
--
-- A unit's weights lie in the flat storage as a few runs (wick.nn.gpt's flatten puts decayed tensors
-- first: a block is one run of matrices and one of biases and norms); data_parallel cuts its buckets
-- at run boundaries, so a unit is gathered bucket by bucket (wick.nn.shard), each all-gather landing
-- at the bucket's place in the unit's buffer. A replicated bucket is copied from this rank's slice.
local core = require 'wick.core'
local T = require 'wick.tensor'
local view_into = require('wick.nn.gpt').view_into

local C = core.C
local check = core.check

local Gathered = {}
Gathered.__index = Gathered

local MAX_PREFETCH = 16

-- Each unit's runs ({ offset, numel, at }: at is the run's place in the unit's buffer) and numel,
-- from the units of the entries (unit_of[entry]: 0 for the root, l for block l) in flat order.
local function unit_runs(entries, unit_of, blocks)
  local units = { [0] = { runs = {}, numel = 0, entries = {} } }
  for l = 1, blocks do units[l] = { runs = {}, numel = 0, entries = {} } end
  local last
  for _, p in ipairs(entries) do
    local u = units[unit_of[p]]
    local run = u.runs[#u.runs]
    if last ~= u or not run then
      run = { offset = p.offset, numel = 0, at = u.numel }
      u.runs[#u.runs + 1] = run
    end
    p.unit_at = run.at + p.offset - run.offset  -- where the parameter lies in its unit's buffer
    run.numel, u.numel = run.numel + p.numel, u.numel + p.numel
    u.entries[#u.entries + 1] = p
    last = u
  end
  return units
end

-- The run of unit u that holds the flat range [offset, offset + numel).
local function run_holding(u, offset, numel)
  for _, run in ipairs(u.runs) do
    if offset >= run.offset and offset + numel <= run.offset + run.numel then return run end
  end
  error('nn.gathered: a bucket that crosses the runs of its unit')
end

-- Gives every unit the records of its buckets (each also the data_parallel bucket's .gathered): where
-- it lies in the unit's buffer (at), this rank's piece of the source slice (src), and for a sharded
-- bucket where its reduce-scatter lands in the unit's landing (landing_at); and each unit's landing size.
local function record_buckets(units, buckets, source)
  for _, b in ipairs(buckets) do
    local u = units[b.unit]
    local run = run_holding(u, b.offset, b.numel)
    u.buckets, u.landing = u.buckets or {}, u.landing or 0
    local sharded = not b.piece.replicated
    b.gathered = { at = run.at + b.offset - run.offset, numel = b.numel, replicated = not sharded,
      src = source:narrow(1, b.piece.at + 1, b.piece.numel), landing_at = sharded and u.landing or nil }
    u.buckets[#u.buckets + 1] = b.gathered
    if sharded then u.landing = u.landing + b.piece.numel end
  end
end

-- The root's buffers and `count` block slots (weights in dtype; f32 gradients and landings), sized
-- for the largest block.
function Gathered:allocate(count, dtype, device)
  local root, largest, landing = self.units[0], 0, 0
  for l = 1, self.blocks do
    largest, landing = math.max(largest, self.units[l].numel), math.max(landing, self.units[l].landing or 0)
  end
  self.root = T.empty({ root.numel }, dtype, device)
  self.root_grads = T.empty({ root.numel }, 'f32', device)
  self.root_landing = T.empty({ root.landing or 0 }, 'f32', device)
  self.slots, self.grad_slots, self.landings = {}, {}, {}
  for s = 1, count do
    self.slots[s], self.pending[s] = T.empty({ largest }, dtype, device), {}
    self.grad_slots[s], self.landings[s] = T.empty({ largest }, 'f32', device), T.empty({ landing }, 'f32', device)
  end
end

-- dist: the group; buckets: data_parallel's (cut at runs, each with .unit and its wick.nn.shard
-- piece); source: this rank's slice in the compute dtype (what the all-gathers send); unit_of:
-- entry -> unit; prefetch: blocks gathered ahead, 1 to MAX_PREFETCH.
function Gathered.new(model, dist, buckets, source, unit_of, prefetch)
  local blocks = #model.blocks
  local self = setmetatable({ dist = dist, blocks = blocks, prefetch = prefetch,
    units = unit_runs(model.entries, unit_of, blocks), holds = {}, pending = {} }, Gathered)
  record_buckets(self.units, buckets, source)
  self:allocate(math.min(prefetch + 1, blocks), source.dtype, source.device)
  for u = 0, blocks do
    local s = u > 0 and self:slot_of(u)
    self:place(u, s and self.slots[s] or self.root, s and self.grad_slots[s] or self.root_grads,
      s and self.landings[s] or self.root_landing)
  end
  self:refresh()
  return self
end

function Gathered:slot_of(l) return (l - 1) % #self.slots + 1 end

-- Points unit u's parameters (module[key]) and their gradients (module['grad_' .. key]) into
-- buffer and grads, and its buckets' all-gather destinations (dst), gradients (grads) and
-- reduce-scatter destinations (landing, for a sharded bucket) into buffer, grads and landing.
function Gathered:place(u, buffer, grads, landing)
  local unit = self.units[u]
  for _, p in ipairs(unit.entries) do
    p.module[p.key] = view_into(buffer, p.unit_at, p.shape, p.numel)
    p.module['grad_' .. p.key] = view_into(grads, p.unit_at, p.shape, p.numel)
  end
  for _, b in ipairs(unit.buckets or {}) do
    b.dst, b.grads = buffer:narrow(1, b.at + 1, b.numel), grads:narrow(1, b.at + 1, b.numel)
    if b.landing_at then b.landing = landing:narrow(1, b.landing_at + 1, b.src:numel()) end
  end
end

-- Zeroes the gradient buffers before a backward (every micro-step reduce-scatters what it adds).
function Gathered:zero_gradients()
  for _, t in ipairs({ self.root_grads, unpack(self.grad_slots) }) do check(C.wk_op_fill(t, 0)) end
end

-- The block whose gradient slot block n takes over in a backward (n + slots), or nil when n is among
-- the first blocks of the backward, whose slots zero_gradients cleared.
function Gathered:previous_occupant(n)
  local before = n + #self.slots
  return before <= self.blocks and before or nil
end

-- Block n's gradient slot zeroed for it (its previous occupant's reduce-scatters waited for already).
function Gathered:clear_gradients(n)
  check(C.wk_op_fill(self.grad_slots[self:slot_of(n)], 0))
end

-- Starts gathering unit u into its buffer; returns the works to wait for (replicated buckets are
-- copied at once).
function Gathered:start(u)
  local works = {}
  for _, b in ipairs(self.units[u].buckets or {}) do
    if b.replicated then
      b.dst:copy(b.src)
    else
      works[#works + 1] = self.dist:all_gather_start(b.dst, b.src, self.site)
    end
  end
  return works
end

-- Waits for works in the order they started; each leaves the list first, so after a failure (a
-- dead rank: the hang report) the list holds only those not waited for.
local function wait_all(works)
  while #works > 0 do table.remove(works, 1):wait() end
end

-- Block l into its slot (waiting for what the slot is still receiving), started, not waited for.
function Gathered:start_block(l)
  local s = self:slot_of(l)
  if self.holds[s] == l then return end
  wait_all(self.pending[s])
  self.holds[s], self.pending[s] = l, self:start(l)
end

-- Before block l runs: its weights in place, and the next blocks' (l + direction ..) on their way.
-- Refused, naming why, while self.alone says this rank runs without the others (a paused run's REPL).
function Gathered:fetch(l, direction)
  if self.alone then error(self.alone, 0) end
  self:start_block(l)
  wait_all(self.pending[self:slot_of(l)])
  for k = 1, self.prefetch do
    local ahead = l + k * direction
    if ahead < 1 or ahead > self.blocks then break end
    self:start_block(ahead)
  end
end

-- After the source slice changed (an optimizer step, a resume): the root gathered again, the
-- blocks at their next fetch.
function Gathered:refresh()
  for s = 1, #self.slots do
    wait_all(self.pending[s])
    self.pending[s], self.holds[s] = {}, nil
  end
  wait_all(self:start(0))
end

-- Frees the buffers once no collective writes into them: after a failed one (the group failed, so
-- the others fail at once) the error was the caller's already.
function Gathered:free()
  for s = 1, #self.slots do
    for _, w in ipairs(self.pending[s]) do pcall(w.wait, w) end
  end
  for u = 0, self.blocks do
    for _, b in ipairs(self.units[u].buckets or {}) do
      for _, t in pairs({ b.src, b.dst, b.grads, b.landing }) do t:free() end
    end
  end
  local root = { self.root, self.root_grads, self.root_landing }
  for _, group in ipairs({ root, self.slots, self.grad_slots, self.landings }) do
    for _, t in ipairs(group) do t:free() end
  end
  self.pending = {}
end

return { new = Gathered.new, MAX_PREFETCH = MAX_PREFETCH }
