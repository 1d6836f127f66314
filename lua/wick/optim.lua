-- wick.optim: optimizers over a model's flat parameter storage (model:flat_parameters()).
--   local opt = wick.optim.adamw { lr = 6e-4, betas = { 0.9, 0.95 }, eps = 1e-8,
--                                  weight_decay = 0.1, clip = 1.0 }
--   local applied, grad_norm = opt:step(model)
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

local function group(flat, m, v, first, numel, decay)
  if numel == 0 then return nil end
  return {
    params = flat.params:narrow(1, first, numel), grads = flat.grads:narrow(1, first, numel),
    m = m:narrow(1, first, numel), v = v:narrow(1, first, numel), decay = decay,
  }
end

function AdamW:build(model)
  local flat = model:flat_parameters()
  local n = flat.params:numel()
  self.m = T.zeros({ n }, 'f32', flat.params.device)
  self.v = T.zeros({ n }, 'f32', flat.params.device)
  self.flat = flat
  self.groups = {
    group(flat, self.m, self.v, 1, flat.decay_numel, true),
    group(flat, self.m, self.v, flat.decay_numel + 1, n - flat.decay_numel, false),
  }
end

-- Releases the moment buffers now (they are as large as the model).
function AdamW:free()
  if self.m then self.m:free() end
  if self.v then self.v:free() end
  for _, g in pairs(self.groups or {}) do
    for _, t in pairs(g) do
      if type(t) ~= 'boolean' then t:free() end
    end
  end
  self.groups, self.flat = nil, nil
end

-- The L2 norm of all gradients, unscaled.
function AdamW:grad_norm(model, loss_scale)
  check(C.wk_op_sumsq(model:flat_parameters().grads, self.sumsq))
  return math.sqrt(self.sumsq[0]) / loss_scale
end

function AdamW:step(model)
  if not self.groups or self.flat ~= model:flat_parameters() then self:build(model) end
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
