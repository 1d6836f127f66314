-- wick.cli: the command line of `run -m` tools and of recipes. Each option is declared once, as a
-- wick.schema option (name, type, range or choices, default, help) plus how it is spelled on the
-- command line, and that one table parses the flags, checks every value by the schema's types and
-- writes --help, so they cannot drift.
--
--   local cli = require 'wick.cli'
--   local spec = cli.spec { name = 'wick.data.inspect', usage = '--data DIR [options]', options = {
--     { 'data', 'path', required = true, help = 'dataset directory' },
--     { 'steps', 'integer', min = 1, max = 2 ^ 31, default = 1, help = 'global steps to print' },
--     cli.from(data.LOADER_OPTIONS, 'seq_len', { default = 256 }),  -- the loader's own declaration
--     { 'strict', 'flag', help = 'fail on the first bad line' } } }
--   local opts, positional = cli.parse(spec, args)   -- opts.seq_len, opts.strict, ...
--
-- Command-line types: flag (present or absent), integer, size (an integer with an optional K, M or
-- G suffix: 2^10, 2^20, 2^30), number (finite), uint64 (decimal, exact up to 2^64 - 1), enum
-- (`values`), string, path (a non-empty string), strings (a repeatable flag: the list of its
-- values). `short = 'o'` adds -o; `value = 'DIR'` names the value in the help. Flags are
-- `--name value` or `--name=value`, dashes for the underscores.
--
-- A user's mistake is raised as a user error (cli.fail): `run` prints its one line, without a
-- traceback unless WICK_LOG=debug, and exits with its status: 2 for usage (an unknown flag, a bad
-- value, a missing option), 1 for data (an input that cannot be read). See runtime/host/host.h.
local schema = require 'wick.schema'

local cli = {}

cli.EXIT_DATA = 1
cli.EXIT_USAGE = 2

-- ---- user errors ---------------------------------------------------------------------------------

local UserError = { __tostring = function(e) return e.message end }

-- Raises a user error: `message` is the whole line the user sees; exit_code the status of `run`.
function cli.fail(message, exit_code)
  error(setmetatable({ message = message, exit_code = exit_code or cli.EXIT_DATA }, UserError), 0)
end

-- Whether an error value is a user error (raised by cli.fail).
function cli.is_user_error(e) return getmetatable(e) == UserError end

-- How to ask a program for its help: recipes are files, tools are modules.
local function command_of(spec)
  if spec.name:find('/', 1, true) or spec.name:match('%.lua$') then return 'run ' .. spec.name end
  return 'run -m ' .. spec.name
end

-- A usage error of the program `spec`: one line naming it and where its usage is.
function cli.usage_error(spec, message)
  cli.fail(('%s: %s (see %s --help)'):format(spec.name, message, command_of(spec)), cli.EXIT_USAGE)
end

-- ---- declarations --------------------------------------------------------------------------------

local SIZE_UNITS = { { 'G', 2 ^ 30 }, { 'M', 2 ^ 20 }, { 'K', 2 ^ 10 } } -- largest first
local UNIT_VALUE = { [''] = 1 }
for _, unit in ipairs(SIZE_UNITS) do UNIT_VALUE[unit[1]] = unit[2] end
local EXACT_INTEGER = 2 ^ 53 -- Lua numbers are exact below this

local function non_empty(v) return type(v) == 'string' and v ~= '', 'must be a non-empty path' end

local function string_list(v)
  if type(v) ~= 'table' then return false, 'must be a list of strings' end
  for _, s in ipairs(v) do
    if type(s) ~= 'string' or s == '' then return false, 'must be a list of non-empty strings' end
  end
  return true
end

-- Per command-line type: the schema type that checks it, how text becomes a value (a reader of
-- its own, or the schema type's: wick.schema.parse), the help's placeholder for the value.
local KINDS = {
  flag = { schema = 'boolean' },
  integer = { schema = 'integer', parse = 'integer', placeholder = 'N' },
  size = { schema = 'integer', placeholder = 'N[K|M|G]', parse = function(text)
    local digits, unit = text:match('^(%d+)([KMG]?)$')
    return digits and tonumber(digits) * UNIT_VALUE[unit]
  end },
  number = { schema = 'number', parse = 'number', placeholder = 'X' },
  uint64 = { schema = 'uint64', parse = 'uint64', placeholder = 'N' },
  enum = { schema = 'enum', parse = 'enum' },
  string = { schema = 'string', parse = 'string', placeholder = 'TEXT' },
  path = { schema = 'path', check = non_empty, parse = 'string', placeholder = 'PATH' },
  strings = { schema = 'strings', check = string_list, placeholder = 'TEXT', repeated = true },
}

local function flag_name(name) return '--' .. name:gsub('_', '-') end

cli.from = schema.from -- an option declaration copied from another set (the loader's, say)

-- Completes a program's declaration: every option gets its flag (`long`), --help is added, and the
-- schemas that check the values are built: one naming flags (for the command line), one naming
-- the Lua keys (cli.check, for callers of a tool's functions). Returns spec; parse and help call it.
function cli.spec(spec)
  if spec.schema then return spec end
  local flag_entries, key_entries = {}, {}
  spec.by_flag, spec.old_flags = {}, {}
  local has_help = false
  for _, option in ipairs(spec.options) do has_help = has_help or option[1] == 'help' end
  if not has_help then spec.options[#spec.options + 1] = { 'help', 'flag', short = 'h', help = 'show this help and exit' } end
  for _, option in ipairs(spec.options) do
    local kind = KINDS[option[2]]
    if not kind then error(('wick.cli: %s option %s has no command-line type %s'):format(spec.name, option[1],
      tostring(option[2])), 2) end
    option.long = option[1]:gsub('_', '-')
    spec.by_flag['--' .. option.long] = option
    if option.short then spec.by_flag['-' .. option.short] = option end
    if option.alias then -- a renamed option: its old spelling works for one release
      local old = '--' .. option.alias:gsub('_', '-')
      spec.by_flag[old], spec.old_flags[old] = option, true
    end
    local entry = {}
    for k, v in pairs(option) do entry[k] = v end
    -- An option's own check (a string of a given form, say) replaces its type's.
    entry[2], entry.check = option.check and option[2] .. ' (checked)' or kind.schema, option.check or kind.check
    entry.parse = kind.parse
    local flag_entry = setmetatable({ [1] = flag_name(option[1]) }, { __index = entry })
    flag_entries[#flag_entries + 1] = flag_entry
    key_entries[#key_entries + 1] = entry
  end
  spec.schema = schema.define(spec.name .. ':', flag_entries)
  spec.keys = schema.define(spec.name .. ' option', key_entries)
  spec.flags = {}
  for flag in pairs(spec.by_flag) do
    if flag:sub(1, 2) == '--' then spec.flags[#spec.flags + 1] = flag end
  end
  table.sort(spec.flags)
  return spec
end

-- Checks a table of option values keyed by Lua name (what a tool's functions take from Lua), by the
-- same declarations: unknown keys, types and ranges; fills in the defaults. Raises at `level`.
function cli.check(spec, values, level)
  return cli.spec(spec).keys:check(values, (level or 1) + 1)
end

-- ---- help ----------------------------------------------------------------------------------------

local POWER_NOTATION_FROM = 2 ^ 20 -- powers of two this large read better as 2^k

-- A bound as people write it: 1024, 2^40, 0.5.
local function bound_text(x)
  if x == nil then return nil end
  local exponent = x >= POWER_NOTATION_FROM and math.floor(math.log(x) / math.log(2) + 0.5)
  if exponent and 2 ^ exponent == x then return ('2^%d'):format(exponent) end
  if x == math.floor(x) and math.abs(x) < EXACT_INTEGER then return ('%d'):format(x) end
  return ('%.14g'):format(x)
end

cli.bound_text = bound_text

-- A value as the option is written: sizes with their unit (64M), other numbers as bound_text.
local function value_text(option, x)
  if option[2] == 'size' and type(x) == 'number' then
    for _, unit in ipairs(SIZE_UNITS) do
      if x >= unit[2] and x % unit[2] == 0 then return ('%d%s'):format(x / unit[2], unit[1]) end
    end
  end
  if type(x) == 'number' then return bound_text(x) end
  return tostring(x)
end

local function describe_range(option)
  if option[2] == 'enum' then return 'one of ' .. table.concat(option.values, ', ') end
  if option[2] == 'uint64' then return 'an integer from 0 to 2^64 - 1' end
  local article = (option[2] == 'number') and 'a number' or 'an integer'
  if option.min and option.max then
    return ('%s in [%s, %s]'):format(article, value_text(option, option.min), value_text(option, option.max))
  elseif option.min or option.max then
    return ('%s %s %s'):format(article, option.min and '>=' or '<=', value_text(option, option.min or option.max))
  end
end

function cli.help(spec)
  spec = cli.spec(spec)
  local lines = { ('usage: %s %s'):format(command_of(spec), spec.usage or '[options]') }
  if spec.description then lines[#lines + 1] = spec.description end
  lines[#lines + 1] = ''
  lines[#lines + 1] = 'options:'
  local rows, width = {}, 0
  for _, option in ipairs(spec.options) do
    local kind = KINDS[option[2]]
    local value = option.value or kind.placeholder or (option[2] == 'enum' and table.concat(option.values, '|'))
    local names = (option.short and ('-' .. option.short .. ', ') or '    ') .. '--' .. option.long ..
        (value and option[2] ~= 'flag' and (' ' .. value) or '')
    local notes = {}
    local range = describe_range(option)
    if range then notes[#notes + 1] = range end
    if option.default ~= nil then notes[#notes + 1] = 'default ' .. value_text(option, option.default) end
    if option.required then notes[#notes + 1] = 'required' end
    if kind.repeated then notes[#notes + 1] = 'repeatable' end
    rows[#rows + 1] = { names, (option.help or '') .. (#notes > 0 and (' (' .. table.concat(notes, '; ') .. ')') or '') }
    width = math.max(width, #names)
  end
  for _, row in ipairs(rows) do lines[#lines + 1] = ('  %-' .. width .. 's  %s'):format(row[1], row[2]) end
  return table.concat(lines, '\n') .. '\n'
end

-- ---- parsing -------------------------------------------------------------------------------------

-- Turns the text of one value into its checked value, or raises a usage error naming the flag.
local function convert(spec, option, flag, text)
  local value = schema.parse(spec.keys:option(option[1]), text)
  if value == nil then
    local expected = option[2] == 'size' and 'a whole number with an optional K, M or G' or 'a number'
    cli.usage_error(spec, ("%s needs %s, got '%s'"):format(flag, expected, text))
  end
  local ok, checked = pcall(spec.schema.check_value, spec.schema, '--' .. option.long, value, 0)
  if not ok then
    cli.fail(('%s (see %s --help)'):format(tostring(checked), command_of(spec)), cli.EXIT_USAGE)
  end
  return checked
end

local function unknown(spec, word)
  local near = schema.nearest(word, spec.flags)
  cli.usage_error(spec, ("unknown option '%s'%s"):format(word, near and (" (did you mean '" .. near .. "'?)") or ''))
end

-- Returns the options (by Lua name, defaults filled in) and the positional arguments, which only a
-- spec with `positional` (the help's name for them) accepts. Raises usage errors; prints the help
-- and exits 0 for -h / --help.
function cli.parse(spec, args)
  spec = cli.spec(spec)
  local ok, host = pcall(require, 'wick.host')
  if ok then host.tool = spec.name end -- the runtime's refusals of what this tool passes on are usage errors
  local opts, positional, seen = {}, {}, {}
  local i = 1
  while i <= #args do
    local word = args[i]
    local flag, inline = word:match('^(%-%-[^=]+)=(.*)$')
    flag = flag or word
    local option = spec.by_flag[flag]
    if spec.old_flags[flag] then require('wick.core').renamed(spec.name, flag, '--' .. option.long) end
    if word == '--' then
      if args[i + 1] and not spec.positional then cli.usage_error(spec, ("unexpected argument '%s'"):format(args[i + 1])) end
      for k = i + 1, #args do positional[#positional + 1] = args[k] end
      break
    elseif option and option[1] == 'help' then
      io.stdout:write(cli.help(spec))
      io.stdout:flush()
      os.exit(0)
    elseif option then
      if seen[option[1]] and not KINDS[option[2]].repeated then
        cli.usage_error(spec, ('%s is given twice'):format(flag))
      end
      seen[option[1]] = true
      if option[2] == 'flag' then
        if inline then cli.usage_error(spec, ('%s takes no value'):format(flag)) end
        opts[option[1]] = true
      else
        local text = inline
        if text == nil then
          i = i + 1
          text = args[i]
          if text == nil then
            cli.usage_error(spec, ('%s needs a value (%s)'):format(flag, option.value or KINDS[option[2]].placeholder
              or table.concat(option.values or {}, '|')))
          end
        end
        if KINDS[option[2]].repeated then
          if text == '' then cli.usage_error(spec, ('%s needs a non-empty value'):format(flag)) end
          opts[option[1]] = opts[option[1]] or {}
          table.insert(opts[option[1]], text)
        else
          opts[option[1]] = convert(spec, option, flag, text)
        end
      end
    elseif word:sub(1, 1) == '-' and word ~= '-' then
      unknown(spec, flag)
    elseif spec.positional then
      positional[#positional + 1] = word
    else
      cli.usage_error(spec, ("unexpected argument '%s'"):format(word))
    end
    i = i + 1
  end
  for _, option in ipairs(spec.options) do
    if opts[option[1]] == nil then opts[option[1]] = option.default end
    if option.required and opts[option[1]] == nil then
      cli.usage_error(spec, ('%s%s is required'):format(option.short and ('-' .. option.short .. ' / ') or '',
        flag_name(option[1])))
    end
  end
  opts.help = nil
  return opts, positional
end

return cli
