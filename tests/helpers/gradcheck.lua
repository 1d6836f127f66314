-- Finite-difference gradient checks for CPU ops and models (test helper).
--   gradcheck.check{ inputs = { {x, dx}, ... }, loss = function() return number end,
--                    backward = function() end, samples = 12 }
-- loss() runs the forward pass and returns a scalar (usually weighted_sum(out, weights));
-- backward() must have filled every dx with d loss / d x (the check zeroes them first).
-- Central differences on f32 kernels: h and tolerances are set for values of order one.
local ffi = require 'ffi'
local core = require 'wick.core'
local C = core.C

local gradcheck = {}

local STEP = 1e-2
local ABS_TOL, REL_TOL = 2e-3, 1e-2

local function floats(t) return ffi.cast('float *', t:data()) end
gradcheck.floats = floats

-- sum(out .* weights) in double, so the loss adds no f32 rounding of its own.
function gradcheck.weighted_sum(out, weights)
  local o, w, sum = floats(out), floats(weights), 0
  for i = 0, out:numel() - 1 do sum = sum + o[i] * w[i] end
  return sum
end

-- Deterministic sample of element indices, spread over the tensor.
local function sample_indices(n, count)
  local picked, out = {}, {}
  for k = 0, math.min(count, n) - 1 do
    local i = math.floor((k * 7919 + 13) % n)
    if not picked[i] then
      picked[i] = true
      out[#out + 1] = i
    end
  end
  return out
end

-- Returns the worst (analytic, numeric) mismatch description, or nil when all agree.
function gradcheck.check(spec)
  for _, pair in ipairs(spec.inputs) do core.check(C.wk_op_fill(pair[2], 0)) end
  spec.loss()
  spec.backward()
  local failures = {}
  for k, pair in ipairs(spec.inputs) do
    local x, dx = floats(pair[1]), floats(pair[2])
    for _, i in ipairs(sample_indices(pair[1]:numel(), spec.samples or 12)) do
      local saved = x[i]
      local step = spec.step or STEP
      x[i] = saved + step
      local plus = spec.loss()
      x[i] = saved - step
      local minus = spec.loss()
      x[i] = saved
      local numeric, analytic = (plus - minus) / (2 * step), dx[i]
      if math.abs(numeric - analytic) > ABS_TOL + REL_TOL * math.abs(numeric) then
        failures[#failures + 1] = string.format('input %d element %d: analytic %.6g numeric %.6g', k, i, analytic, numeric)
      end
    end
  end
  spec.loss()  -- leave the forward state consistent with the unperturbed inputs
  if #failures > 0 then return table.concat(failures, '\n') end
end

return gradcheck
