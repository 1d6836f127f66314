-- wick.recipe.args: the command line after a recipe, `run recipe.lua [--key=value ...] [--flag]`.
-- Words are the run's own flags (a schema of them, declared by wick.recipe) or overrides of the
-- recipe's fields, each read from its text by the field's own type (wick.schema.parse) and applied
-- to a copy of the table the recipe returned, which wick.recipe then checks whole.
local schema = require 'wick.schema'

local args = {}

-- A usage error of the recipe `name`: one line, exit 2.
function args.fail(name, message)
  local cli = require 'wick.cli'
  cli.fail(('%s: %s (see run %s --help)'):format(name, message, name), cli.EXIT_USAGE)
end
local fail = args.fail

local function flag_name(key) return '--' .. key:gsub('_', '-') end

-- A value flag's text as its declaration's checked value, or a usage error saying what it needs.
local function flag_value(flags, name, key, text)
  local option = flags:option(key)
  local value = schema.parse(option, text)
  local ok, checked = false, nil
  if value ~= nil then ok, checked = pcall(flags.check_value, flags, key, value, 0) end
  if not ok then fail(name, ("%s needs %s, got '%s'"):format(flag_name(key), option.expects, text)) end
  return checked
end

-- The flags of run's launcher (runtime/host/run.c), which go before the recipe: after it, torchrun's
-- habit, they would be taken for overrides of fields no recipe has.
local LAUNCHER_FLAGS = { nproc_per_node = true, nnodes = true, node_rank = true, master_addr = true, master_port = true }

-- Splits argv into the flags (checked by the schema `flags`: a boolean one is present or absent, any
-- other takes a value) and the overrides { path, text }; raises usage errors naming the word.
function args.parse(flags, name, argv)
  local given, overrides = {}, {}
  local i = 1
  while i <= #argv do
    local word = argv[i]
    local key, inline = word:match('^%-%-([^=]+)=(.*)$')
    key = key or word:match('^%-%-(.+)$')
    if not key then fail(name, ("unexpected argument '%s' (overrides are --key=value)"):format(word)) end
    key = key:gsub('%-', '_')
    if LAUNCHER_FLAGS[key] then
      local value = inline or (argv[i + 1] and argv[i + 1]:sub(1, 1) ~= '-' and argv[i + 1])
      local launch = flag_name(key) .. (value and (' ' .. value) or '')
      fail(name, ('%s is a flag of the launcher: launcher flags go before the recipe (run %s %s ...)'):format(
        flag_name(key), launch, name))
    end
    local flag = flags:option(key)
    if flag and flag[2] == 'boolean' then
      if inline then fail(name, ('--%s takes no value'):format(word:match('^%-%-([^=]+)'))) end
      given[key] = true
    else
      local text = inline
      if text == nil then
        i = i + 1
        text = argv[i]
        if text == nil then fail(name, ('--%s needs a value'):format(key)) end
      end
      if flag then
        given[key] = flag_value(flags, name, key, text)
      else
        overrides[#overrides + 1] = { key, text }
      end
    end
    i = i + 1
  end
  return given, overrides
end

-- How the flags of `flags` are written in a usage line: [--resume] [--log=FILE] ...
function args.usage(flags)
  local words = {}
  for _, option in ipairs(flags.options) do
    if option[1] ~= 'help' then
      words[#words + 1] = '[' .. flag_name(option[1]) .. (option[2] == 'boolean' and '' or ('=' .. option.value)) .. ']'
    end
  end
  return table.concat(words, ' ')
end

-- Sets raw[a][b][c] = value for the path 'a.b.c', making tables on the way.
local function set_path(raw, path, value)
  local t = raw
  local keys = {}
  for key in path:gmatch('[^.]+') do keys[#keys + 1] = key end
  for i = 1, #keys - 1 do
    if type(t[keys[i]]) ~= 'table' then t[keys[i]] = {} end
    t = t[keys[i]]
  end
  t[keys[#keys]] = value
end

-- A deep copy of plain tables (functions, cdata and tables with a metatable are shared), or nil
-- and the path of a table that holds one of the tables around it (a cycle would recurse forever).
-- `open` maps the tables being copied to their paths.
local function copy_tree(t, path, open)
  if type(t) ~= 'table' or getmetatable(t) then return t end
  if open[t] then return nil, ('%s refers back to %s'):format(path, open[t]) end
  open[t] = path
  local out = {}
  for k, v in pairs(t) do
    local copy, why = copy_tree(v, path == '' and tostring(k) or (path .. '.' .. tostring(k)), open)
    if why then return nil, why end
    out[k] = copy
  end
  open[t] = nil
  return out
end

local CYCLE_HINT = '(a recipe is a tree of tables: a cycle cannot be checked)'

function args.copy(t)
  local copy, why = copy_tree(t, '', {})
  if why then error(('recipe.copy: %s %s'):format(why, CYCLE_HINT), 2) end
  return copy
end

-- Applies overrides to a copy of the raw recipe: each value read by its declaration in `fields`
-- (the recipe's schema); a mix weight (data.mix.NAME) is a number.
function args.apply(fields, name, raw, overrides)
  local copy, cycle = copy_tree(raw, '', {})
  if cycle then fail(name, cycle .. ' ' .. CYCLE_HINT) end
  local applied = {}
  for _, o in ipairs(overrides) do
    local path, text = o[1], o[2]
    local value, why
    local target = path -- in current names: an option's old spelling sets its new one
    local mix_source = path:match('^data%.mix%.([%w_%-]+)$')
    if mix_source then
      value = tonumber(text)
      if value == nil then why = 'must be a number' end
    else
      local option, found = fields:find(path)
      if option then
        target = found
        value, why = schema.parse(option, text)
      else
        why = found
      end
    end
    if value == nil then fail(name, ('--%s: %s'):format(path, (why:gsub('^' .. path:gsub('%p', '%%%0') .. ': ', '')))) end
    set_path(copy, target, value)
    applied[#applied + 1] = path .. '=' .. text
  end
  return copy, applied
end

return args
