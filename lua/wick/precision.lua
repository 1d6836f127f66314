-- wick.precision: precision policies and dynamic loss scaling.
--   fp32  everything in f32.
--   bf16  activations, their gradients and a compute copy of the weights are stored as 2-byte bf16
--         tensors; the master weights, the weight gradients and the AdamW state stay f32.
--   fp16  the same in f16, plus dynamic loss scaling: the loss is multiplied by `scale` before
--         backward; a step whose gradients overflowed (inf/nan) is skipped and the scale halved;
--         after `growth_interval` good steps in a row the scale doubles. An activation gradient
--         beyond f16's range is stored as inf, which reaches the weight gradients and so the check.
-- The CPU ops load the 2-byte values, compute in f32 and store their results rounded to nearest
-- even, as the tensor cores' f32 accumulation does (runtime/ops/cpu/stored.h); the CUDA kernels take
-- the same dtypes and round by the same rule (docs/gpu.md).
local schema = require 'wick.schema'

local precision = {}

local POLICIES = { fp32 = 'f32', bf16 = 'bf16', fp16 = 'f16' }
local DEFAULT_SCALE = 2 ^ 16
local DEFAULT_GROWTH_INTERVAL = 2000
local BACKOFF, GROWTH = 0.5, 2
local MIN_SCALE = 1

local Scaler = {}
Scaler.__index = Scaler

-- Records the outcome of a step: finite = whether the gradients were all finite.
-- Returns true when the optimizer should apply the step.
function Scaler:update(finite)
  if not finite then
    self.scale = math.max(self.scale * BACKOFF, MIN_SCALE)
    self.good_steps = 0
    self.skipped = self.skipped + 1
    return false
  end
  self.good_steps = self.good_steps + 1
  if self.good_steps >= self.growth_interval then
    self.scale = self.scale * GROWTH
    self.good_steps = 0
  end
  return true
end

function precision.scaler(opts)
  opts = opts or {}
  return setmetatable({
    scale = opts.scale or DEFAULT_SCALE,
    growth_interval = opts.growth_interval or DEFAULT_GROWTH_INTERVAL,
    good_steps = 0,
    skipped = 0,
  }, Scaler)
end

local SCALER_OPTIONS = schema.define('fp16 precision option', {
  { 'scale', 'number', min = MIN_SCALE, max = 2 ^ 64, help = 'the first loss scale (default 2^16)' },
  { 'growth_interval', 'integer', min = 1, max = 2 ^ 31, help = 'good steps before the scale doubles (default 2000)' },
})

-- The policy's name and its scaler's options, checked: 'bf16' or { 'fp16', scale = 1024, growth_interval = 100 }.
local function parse(spec, level)
  local name, given = spec, {}
  if type(spec) == 'table' then
    name = spec[1] == nil and 'fp32' or spec[1]
    for k, v in pairs(spec) do if k ~= 1 then given[k] = v end end
  end
  if not POLICIES[name] then error("unknown precision '" .. tostring(name) .. "' (fp32, bf16 or fp16)", level) end
  local opts = SCALER_OPTIONS:check(given, level)
  if name ~= 'fp16' and next(opts) then
    error(('precision %s has no loss scaling: scale and growth_interval belong to fp16'):format(name), level)
  end
  return name, opts
end

-- For option schemas: ok, why.
function precision.check(spec)
  local ok, err = pcall(parse, spec, 0)
  return ok, not ok and 'is not a precision policy: ' .. err or nil
end

-- policy('bf16') or policy{ 'fp16', scale = 1024, growth_interval = 100 }
function precision.policy(spec)
  local name, opts = parse(spec == nil and 'fp32' or spec, 2)
  local dtype = POLICIES[name]
  return {
    name = name,
    dtype = dtype,          -- what activations and the weights' compute copy are stored in
    lowp = dtype ~= 'f32',  -- whether a compute copy of the weights is needed
    scaler = name == 'fp16' and precision.scaler(opts) or nil,
  }
end

return precision
