-- wick.schema: each set of options is declared once — name, type, integer or not, range, choices,
-- default, help — and that one table checks what a user passed, fills in defaults, and writes the
-- help text, so a typo is an error instead of a silently ignored key.
--
--   local schema = require 'wick.schema'
--   local LOADER = schema.define('loader option', {
--     { 'seq_len', 'integer', min = 1, max = 2 ^ 24, default = 1024, help = 'tokens per sample minus one' },
--     { 'mode', 'enum', values = { 'packed', 'pad' }, default = 'packed' },
--     { 'seed', 'uint64', default = 0 },
--   })
--   local opts = LOADER:check(user_opts, 2)   -- raises at the caller's caller on any bad value
--
-- Types: integer (a whole, finite number in [min, max]), number (finite, in [min, max]), uint64 (a
-- whole number in [0, 2^64): a Lua number below 2^53, a decimal string, or a 64-bit cdata; checked
-- exactly, returned as uint64_t cdata), boolean, string, enum (one of `values`), table, function, and
-- any other name given a `check = function(value) return ok, why end`. `types = { 'boolean', 'table' }`
-- accepts any of several. Unknown keys are refused with the nearest known name.
local ffi = require 'ffi'

local schema = {}
local Schema = {}
Schema.__index = Schema

local UINT64_MAX_DECIMAL = '18446744073709551615'
local EXACT_INTEGER = 2 ^ 53 -- Lua numbers are exact below this

-- Edit distance, for "did you mean": small names only, so the quadratic table is fine.
local function distance(a, b)
  local previous = {}
  for j = 0, #b do previous[j] = j end
  for i = 1, #a do
    local current = { [0] = i }
    for j = 1, #b do
      local cost = a:byte(i) == b:byte(j) and 0 or 1
      current[j] = math.min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
    end
    previous = current
  end
  return previous[#b]
end

function schema.nearest(name, candidates)
  local best, best_distance = nil, math.huge
  for _, candidate in ipairs(candidates) do
    local d = distance(name, candidate)
    if d < best_distance then best, best_distance = candidate, d end
  end
  if best and best_distance <= math.max(2, math.floor(#name / 3)) then return best end
end

local function describe(value)
  if type(value) == 'string' then return ('%q'):format(value) end
  if type(value) == 'table' then return '{...}' end -- an address would say nothing
  return tostring(value)
end

local function is_integral(x) return x == math.floor(x) end

-- uint64 from a Lua number, decimal string or 64-bit cdata, checked exactly.
local function to_uint64(value)
  if type(value) == 'number' then
    if value ~= value or value < 0 or not is_integral(value) then return nil, 'must be a whole number >= 0' end
    if value >= EXACT_INTEGER then
      return nil, 'is above 2^53, where Lua numbers are not exact: pass it as a string or a ULL literal'
    end
    return ffi.new('uint64_t', value)
  elseif type(value) == 'string' then
    if not value:match('^%d+$') or #value > #UINT64_MAX_DECIMAL or (#value == #UINT64_MAX_DECIMAL and value > UINT64_MAX_DECIMAL) then
      return nil, 'must be a decimal number from 0 to ' .. UINT64_MAX_DECIMAL
    end
    local x = ffi.new('uint64_t', 0)
    for i = 1, #value do x = x * 10 + (value:byte(i) - 48) end
    return x
  elseif type(value) == 'cdata' and (ffi.istype('uint64_t', value) or ffi.istype('int64_t', value)) then
    if ffi.istype('int64_t', value) and value < 0 then return nil, 'must be >= 0' end
    return ffi.new('uint64_t', value)
  end
  return nil, 'must be a whole number (a number, a decimal string or a 64-bit cdata)'
end

-- Returns the checked value, or nil and why not.
local function check_one(option, value)
  local kind = option[2]
  if kind == 'integer' or kind == 'number' then
    if type(value) ~= 'number' then return nil, 'must be a number' end
    if value ~= value or value == math.huge or value == -math.huge then return nil, 'must be finite' end
    if kind == 'integer' and not is_integral(value) then return nil, 'must be a whole number' end
    if (option.min and value < option.min) or (option.max and value > option.max) then
      return nil, ('must be within [%s, %s]'):format(tostring(option.min or '-inf'), tostring(option.max or 'inf'))
    end
    return value
  elseif kind == 'uint64' then
    return to_uint64(value)
  elseif kind == 'enum' then
    for _, allowed in ipairs(option.values) do
      if value == allowed then return value end
    end
    return nil, 'must be one of ' .. table.concat(option.values, ', ')
  elseif kind == 'boolean' or kind == 'string' or kind == 'table' or kind == 'function' then
    if type(value) ~= kind then return nil, 'must be a ' .. kind end
    return value
  elseif option.check then
    local ok, why = option.check(value)
    if not ok then return nil, why end
    return value
  end
  error('wick.schema: option ' .. option[1] .. ' has an unknown type ' .. tostring(kind), 3)
end

local function check_typed(option, value)
  if not option.types then return check_one(option, value) end
  local reasons = {}
  for _, kind in ipairs(option.types) do
    local alternative = setmetatable({ [1] = option[1], [2] = kind }, { __index = option })
    local checked, why = check_one(alternative, value)
    if checked ~= nil then return checked end
    reasons[#reasons + 1] = why
  end
  return nil, table.concat(reasons, ', or ')
end

-- what: how messages name one option ("loader option"); options: { name, type, key = value... }.
function schema.define(what, options)
  local self = setmetatable({ what = what, options = options, by_name = {}, names = {} }, Schema)
  for _, option in ipairs(options) do
    self.by_name[option[1]] = option
    self.names[#self.names + 1] = option[1]
  end
  return self
end

function Schema:option(name) return self.by_name[name] end

-- error() levels: `level` counts from the caller of the method; 0 means no position (the message is
-- re-raised by whoever knows the user's call site).
local function above(level) return level == 0 and 0 or (level or 1) + 1 end

-- Checks one value of a known option; raises (at `level`) with the option's name and the reason.
function Schema:check_value(name, value, level)
  local option = self.by_name[name]
  local checked, why = check_typed(option, value)
  if checked == nil then error(('%s %s = %s %s'):format(self.what, name, describe(value), why), above(level)) end
  return checked
end

-- A new table: every key of `given` checked, every missing one with a default filled in. `given` may
-- hold keys of other option sets listed in `pass` (a set of names checked elsewhere).
function Schema:check(given, level, pass)
  level = above(level)
  if type(given) ~= 'table' then error(('%ss must be a table, got %s'):format(self.what, type(given)), level) end
  local out = {}
  for key, value in pairs(given) do
    if type(key) ~= 'string' then
      error(('%ss are named: got a %s key %s'):format(self.what, type(key), describe(key)), level)
    elseif self.by_name[key] then
      out[key] = self:check_value(key, value, level == 0 and 0 or level)
    elseif not (pass and pass[key]) then
      local near = schema.nearest(key, self.names)
      error(("unknown %s '%s'%s"):format(self.what, key, near and (" (did you mean '" .. near .. "'?)") or ''), level)
    else
      out[key] = value
    end
  end
  for _, option in ipairs(self.options) do
    if out[option[1]] == nil and option.default ~= nil then out[option[1]] = option.default end
    if out[option[1]] == nil and option.required then
      error(('%s %s is required'):format(self.what, option[1]), level)
    end
  end
  return out
end

-- One line per option: name, type, range or choices, default and help.
function Schema:help(prefix)
  local lines = {}
  for _, option in ipairs(self.options) do
    local kind = option.types and table.concat(option.types, '|') or option[2]
    if kind == 'enum' then kind = table.concat(option.values, '|') end
    local range = (option.min or option.max) and (' in [%s, %s]'):format(tostring(option.min or '-inf'),
      tostring(option.max or 'inf')) or ''
    local default = option.default ~= nil and (' (default %s)'):format(tostring(option.default)) or ''
    lines[#lines + 1] = ('%s%-16s %s%s%s  %s'):format(prefix or '  ', option[1], kind, range, default, option.help or '')
  end
  return table.concat(lines, '\n')
end

return schema
