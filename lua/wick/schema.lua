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
--
-- Each type also reads its values from text (schema.parse: a command line's --key=value); a type of
-- an option's own brings its reader as `parse = function(text) ... end`, or the name of the type
-- whose reader it borrows (`parse = 'number'`). Without one, the option cannot be set from text.
--
-- A renamed option says so with `alias = 'old_name'`: for one release its old spelling is read as the
-- new one wherever options enter (check, check_tree, find; wick.cli's flags), with one warning.
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

-- ---- text -> value -------------------------------------------------------------------------------

local function same_text(text) return text end

-- Per type: the value `text` stands for, or nil when it stands for none. The check that follows
-- judges the value (a uint64 is read from its decimal text exactly by the check itself).
local PARSE = {
  integer = tonumber, number = tonumber, uint64 = same_text, string = same_text, enum = same_text,
  boolean = function(text)
    if text == 'true' then return true elseif text == 'false' then return false end
  end,
}

local function reader(option, kind)
  local parse = option.parse
  if type(parse) == 'string' then return PARSE[parse] end
  return parse or PARSE[kind]
end

-- The value `text` stands for as `option`'s type, unchecked: value, or nil and why not. The first
-- of option.types that reads it wins.
function schema.parse(option, text)
  local readable = false
  for _, kind in ipairs(option.types or { option[2] }) do
    local parse = reader(option, kind)
    if parse then
      readable = true
      local value = parse(text)
      if value ~= nil then return value end
    end
  end
  if not readable then return nil, 'cannot be set from the command line (set it in the recipe)' end
  return nil, ("cannot read '%s' as %s"):format(text, option[2])
end

-- what: how messages name one option ("loader option"); options: { name, type, key = value... }.
function schema.define(what, options)
  local self = setmetatable({ what = what, options = options, by_name = {}, names = {}, renamed = {} }, Schema)
  for _, option in ipairs(options) do
    self.by_name[option[1]] = option
    self.names[#self.names + 1] = option[1]
    if option.alias then self.renamed[option.alias] = option[1] end
  end
  return self
end

-- An option declared with `alias = 'old_name'` was renamed: for one release the old spelling is read
-- as the new one, with a warning naming both. Returns the key's current name, or nil and why when
-- `given` holds both spellings. `where` names the option set (or the path) in the warning.
function Schema:current_name(key, given, where)
  local new = self.renamed[key]
  if not new then return key end
  if given and given[new] ~= nil then return nil, ('both %s and its old name %s are given'):format(new, key) end
  require('wick.core').renamed(where or self.what, key, new) -- late: wick.core loads the C library
  return new
end

function Schema:option(name) return self.by_name[name] end

-- error() levels: `level` counts from the caller of the method; 0 means no position (the message is
-- re-raised by whoever knows the user's call site).
local function above(level) return level == 0 and 0 or (level or 1) + 1 end

-- The message for a key that names no option, with the nearest name that does.
function Schema:unknown(key)
  local near = schema.nearest(key, self.names)
  return ("unknown %s '%s'%s"):format(self.what, key, near and (" (did you mean '" .. near .. "'?)") or '')
end

-- The option a key names (an old spelling read as its new one, with the warning); raises the
-- unknown-key message at `level` when it names none.
function Schema:named(key, level)
  local option = type(key) == 'string' and self.by_name[self:current_name(key)]
  if not option then error(self:unknown(tostring(key)), above(level)) end
  return option
end

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
    end
    local why
    key, why = self:current_name(key, given)
    if not key then
      error(('%ss: %s'):format(self.what, why), level)
    elseif self.by_name[key] then
      out[key] = self:check_value(key, value, level == 0 and 0 or level)
    elseif not (pass and pass[key]) then
      error(self:unknown(key), level)
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

-- A copy of an option declaration, so its type and range are written once; `overrides` may rename
-- it ([1]) and change default, help or anything else.
function schema.copy(option, overrides)
  local copy = {}
  for k, v in pairs(option) do copy[k] = v end
  for k, v in pairs(overrides or {}) do copy[k] = v end
  return copy
end

-- An option declaration copied from another set (the loader's, say): schema.copy of its `name`.
function schema.from(set, name, overrides)
  return schema.copy(assert(set:option(name), 'no option ' .. name), overrides)
end

-- ---- nested tables -------------------------------------------------------------------------------
-- An option { 'batch', 'section', schema = BATCH } holds a table checked by another schema;
-- check_tree walks them all and names every key by its path: `batch.mciro: unknown key (did you
-- mean batch.micro?)`, `batch.micro = 0: must be within [1, 16777216]`.

local function joined(prefix, key) return prefix and (prefix .. '.' .. key) or key end

-- Returns the checked copy of `given` (defaults filled in), or nil and the first problem.
function Schema:check_tree(given, prefix)
  if type(given) ~= 'table' then return nil, ('%s: must be a table, got %s'):format(prefix or self.what, type(given)) end
  local out = {}
  local keys = {}
  for key in pairs(given) do keys[#keys + 1] = key end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end) -- the same first problem every run
  for _, given_key in ipairs(keys) do
    local value, key = given[given_key], given_key
    if type(key) == 'string' then
      local why
      key, why = self:current_name(key, given, prefix)
      if not key then return nil, ('%s: %s'):format(prefix or self.what, why) end
    end
    local option = type(key) == 'string' and self.by_name[key]
    local path = joined(prefix, tostring(key))
    if not option then
      local near = type(key) == 'string' and schema.nearest(key, self.names)
      return nil, ('%s: unknown key%s'):format(path, near and (' (did you mean ' .. joined(prefix, near) .. '?)') or '')
    elseif option[2] == 'section' then
      local checked, why = option.schema:check_tree(value, path)
      if not checked then return nil, why end
      out[key] = checked
    else
      local checked, why = check_typed(option, value)
      if checked == nil then return nil, ('%s = %s: %s'):format(path, describe(value), why) end
      out[key] = checked
    end
  end
  for _, option in ipairs(self.options) do
    local name = option[1]
    if out[name] == nil and option[2] == 'section' then
      local checked, why = option.schema:check_tree({}, joined(prefix, name))
      if not checked then return nil, why end
      out[name] = checked
    end
    if out[name] == nil and option.default ~= nil then out[name] = option.default end
    if out[name] == nil and option.required then return nil, joined(prefix, name) .. ': required' end
  end
  return out
end

-- The option at a dotted path ('batch.micro') and that path in current names (an old spelling read as
-- its new one), or nil and why not (with the nearest name).
function Schema:find(path)
  local set, prefix = self, nil
  for key, after in path:gmatch('([^.]+)()') do
    key = set:current_name(key, nil, prefix)
    local option = set.by_name[key]
    if not option then
      local near = schema.nearest(key, set.names)
      return nil, ('%s: unknown key%s'):format(joined(prefix, key),
        near and (' (did you mean ' .. joined(prefix, near) .. '?)') or '')
    end
    prefix = joined(prefix, key)
    set = option[2] == 'section' and option.schema or nil
    if not set then
      if after <= #path then return nil, ('%s: %s is not a table of options'):format(path, prefix) end
      return option, prefix
    end
  end
  return nil, path .. ': is a table of options; name one of its keys'
end

-- Every leaf option with its dotted path, in declaration order: { path, option } pairs.
function Schema:leaves(prefix, out)
  out = out or {}
  for _, option in ipairs(self.options) do
    local path = joined(prefix, option[1])
    if option[2] == 'section' then option.schema:leaves(path, out) else out[#out + 1] = { path, option } end
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
