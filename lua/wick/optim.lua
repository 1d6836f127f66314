-- wick.optim: optimizers over a model's flat parameter storage (model:flat_parameters()).
--   local opt = wick.optim.adamw { lr = 6e-4, betas = { 0.9, 0.95 }, eps = 1e-8,
--                                  weight_decay = 0.1, clip = 1.0 }
--   local applied, grad_norm = opt:step(model)
-- Under a sharded nn.data_parallel, opt:step(model, layout) updates this rank's pieces only.
-- lr may be a number or a function(step) -> number (a schedule). One step: the global gradient
-- norm is measured (after undoing the fp16 loss scale); a non-finite norm skips the step and
-- lowers the loss scale; otherwise the gradient is scaled by the clip coefficient inside the
-- fused AdamW kernel. Weight decay applies to matrices and embeddings only.
local core = require 'wick.core'
local schema = require 'wick.schema'
local T = require 'wick.tensor'

local C = core.C
local check = core.check

local optim = {}

local AdamW = {}
AdamW.__index = AdamW

local CLIP_EPS = 1e-6

local function is_beta(x) return type(x) == 'number' and x >= 0 and x < 1 end

local ADAMW = schema.define('optim.adamw option', {
  { 'lr', 'lr', check = function(v)
      return type(v) == 'function' or (type(v) == 'number' and v >= 0 and v < math.huge),
        'must be a finite number >= 0 or a function of the step'
    end, parse = 'number', default = 1e-3, help = 'learning rate, or fn(step) -> rate' },
  { 'betas', 'betas', check = function(v)
      return type(v) == 'table' and #v == 2 and is_beta(v[1]) and is_beta(v[2]), 'must be { beta1, beta2 } in [0, 1)'
    end, default = { 0.9, 0.999 }, help = 'moment decay rates' },
  { 'eps', 'number', min = 1e-30, max = 1, default = 1e-8, help = 'added to the second moment root' },
  { 'weight_decay', 'number', min = 0, max = 1, default = 0.01, help = 'decoupled, on matrices and embeddings' },
  { 'clip', 'number', min = 1e-12, help = 'global gradient norm to clip to (default: no clipping)' },
})
optim.ADAMW_OPTIONS = ADAMW

function optim.adamw(opts)
  opts = ADAMW:check(opts or {}, 2)
  return setmetatable({
    lr = opts.lr,
    beta1 = opts.betas[1],
    beta2 = opts.betas[2],
    eps = opts.eps,
    weight_decay = opts.weight_decay,
    clip = opts.clip,  -- nil: no clipping
    step_count = 0,
    sumsq = core.ffi.new('double[1]'),
    groups = nil,      -- { params, grads, m, v, decay } views, built on the first step
  }, AdamW)
end

-- Views of elements first .. first + numel - 1 (0-based, within piece p) of the parameters (the f32
-- masters: the flat ones, or a sharded layout's slice of them, at p.at), their gradients (p.grads)
-- and the moments (at p.at in them); nil when empty.
local function group(flat, p, m, v, first, numel, decay, masters)
  if numel <= 0 then return nil end
  local params = masters and masters:narrow(1, p.at + first + 1, numel)
    or flat.params:narrow(1, p.offset + first + 1, numel)
  return {
    params = params, grads = p.grads:narrow(1, first + 1, numel),
    m = m:narrow(1, p.at + first + 1, numel), v = v:narrow(1, p.at + first + 1, numel), decay = decay,
  }
end

-- Moments for the parameters this rank updates: all of them, or with a layout (wick.nn.shard,
-- from a sharded nn.data_parallel) its pieces only, each { offset, numel, at, grads }.
function AdamW:build(model, layout)
  self:free()
  local flat = model:flat_parameters()
  local pieces = layout and layout.pieces or { { offset = 0, numel = flat.numel, at = 0, grads = flat.grads } }
  local n = layout and layout.numel or flat.numel
  self.m = T.zeros({ n }, 'f32', model.device)
  self.v = T.zeros({ n }, 'f32', model.device)
  self.flat, self.layout, self.groups = flat, layout, {}
  local masters = layout and layout.masters
  for _, p in ipairs(pieces) do -- the decayed elements come first in the flat storage
    local decayed = math.max(0, math.min(p.numel, flat.decay_numel - p.offset))
    self.groups[#self.groups + 1] = group(flat, p, self.m, self.v, 0, decayed, true, masters)
    self.groups[#self.groups + 1] = group(flat, p, self.m, self.v, decayed, p.numel - decayed, false, masters)
  end
end

-- Releases the moment buffers now (they are as large as the model, or as this rank's slice).
function AdamW:free()
  if self.m then self.m:free() end
  if self.v then self.v:free() end
  for _, g in pairs(self.groups or {}) do
    for _, t in pairs(g) do
      if type(t) ~= 'boolean' then t:free() end
    end
  end
  self.groups, self.flat, self.layout, self.m, self.v = nil, nil, nil, nil, nil
end

-- The L2 norm of all gradients, unscaled: with a layout, each rank's pieces' sum of squares summed
-- over the ranks.
function AdamW:grad_norm(model, loss_scale)
  local layout = self.layout
  if not layout then
    check(C.wk_op_sumsq(model:flat_parameters().grads, self.sumsq))
    return math.sqrt(self.sumsq[0]) / loss_scale
  end
  local sum = 0
  for _, p in ipairs(layout.pieces) do
    if layout:counts(p) then
      check(C.wk_op_sumsq(p.grads, self.sumsq))
      sum = sum + self.sumsq[0]
    end
  end
  return math.sqrt(layout:sum(sum, layout.site)) / loss_scale
end

-- The moments m and v of the parameters this rank updates (all of them, or a layout's pieces, at
-- their `at`), built (zeros) when not yet: what a checkpoint saves and loads.
function AdamW:moments(model, layout)
  if not self.m or self.flat ~= model:flat_parameters() or self.layout ~= layout then self:build(model, layout) end
  return self.m, self.v
end

-- layout: as build's (nil: every parameter, the same update on every rank).
function AdamW:step(model, layout)
  self:moments(model, layout)
  local scaler = model.policy and model.policy.scaler
  local loss_scale = scaler and scaler.scale or 1
  local norm = self:grad_norm(model, loss_scale)
  local finite = norm == norm and norm ~= math.huge
  if scaler then
    if not scaler:update(finite) then return false, norm end
  elseif not finite then -- the run's failure, not a bug here: one line (exit 1), no traceback
    local cli = require 'wick.cli'
    local lr = type(self.lr) == 'function' and self.lr(self.step_count + 1) or self.lr
    cli.fail(('optim.adamw: gradient norm is %s at step %d, lr %.3g (a diverged loss or bad data; lower the lr)')
      :format(tostring(norm), self.step_count + 1, lr), cli.EXIT_DATA)
  end
  local coef = 1
  if self.clip and norm > self.clip then coef = self.clip / (norm + CLIP_EPS) end
  self.step_count = self.step_count + 1
  local lr = type(self.lr) == 'function' and self.lr(self.step_count) or self.lr
  for _, g in pairs(self.groups) do
    check(C.wk_op_adamw(g.params, g.grads, g.m, g.v, lr, self.beta1, self.beta2, self.eps,
      g.decay and self.weight_decay or 0, self.step_count, coef / loss_scale))
  end
  return true, norm
end

return optim
