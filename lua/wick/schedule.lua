-- wick.schedule: values that change over training steps (mix weights, learning rates).
-- A schedule is plain data ({ kind = 'points', steps = {...}, values = {...} }, piecewise linear,
-- constant outside its points) so C can evaluate it on its own threads; wick.schedule.at()
-- evaluates one in Lua.
local schedule = {}

local MAX_POINTS = 64  -- what the C side keeps per schedule (WK_SCHEDULE_MAX_POINTS)
schedule.MAX_POINTS = MAX_POINTS

local mt = { __index = schedule }

local function points(steps, values)
  assert(#steps == #values and #steps >= 1 and #steps <= MAX_POINTS, 'a schedule has 1 to 64 points')
  for i = 2, #steps do
    if not (steps[i] >= steps[i - 1]) then error('schedule steps must be increasing', 3) end
  end
  return setmetatable({ kind = 'points', steps = steps, values = values }, mt)
end

function schedule.constant(value) return points({ 0 }, { value }) end

-- from `from` at step 0 (or `start`) to `to` at step `steps`, constant after.
function schedule.linear(from, to, steps, start)
  start = start or 0
  return points({ start, start + steps }, { from, to })
end

-- { {step, value}, ... } linearly interpolated.
function schedule.piecewise(list)
  local steps, values = {}, {}
  for i, point in ipairs(list) do steps[i], values[i] = point[1], point[2] end
  return points(steps, values)
end

-- A Lua function of the step, sampled up front at evenly spaced steps over [0, horizon]:
-- C threads never call back into Lua.
function schedule.sampled(fn, horizon)
  if type(horizon) ~= 'number' or horizon <= 0 then
    error('a function schedule needs a horizon (total steps) to be sampled over', 2)
  end
  local n = math.min(MAX_POINTS, horizon + 1)
  local steps, values = {}, {}
  for i = 1, n do
    steps[i] = math.floor((i - 1) * horizon / (n - 1) + 0.5)
    values[i] = fn(steps[i])
  end
  return points(steps, values)
end

-- Normalizes a number / schedule / function (with horizon) into a points schedule.
function schedule.of(value, horizon)
  if type(value) == 'number' then return schedule.constant(value) end
  if type(value) == 'function' then return schedule.sampled(value, horizon) end
  if type(value) == 'table' and value.kind == 'points' then return value end
  error('expected a number, a wick.schedule or a function of the step, got ' .. type(value), 2)
end

function schedule.at(s, step)
  local steps, values = s.steps, s.values
  if step <= steps[1] then return values[1] end
  for i = 2, #steps do
    if step <= steps[i] then
      local span = steps[i] - steps[i - 1]
      local t = span > 0 and (step - steps[i - 1]) / span or 1
      return values[i - 1] + t * (values[i] - values[i - 1])
    end
  end
  return values[#values]
end

return schedule
