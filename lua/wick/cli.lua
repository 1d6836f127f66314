-- wick.cli: command-line parsing for `run -m` tools. One table of options is both the parser
-- and the help text, so they cannot drift.
--   local cli = require 'wick.cli'
--   local spec = { name = 'wick.data.inspect', usage = '--data SPEC [options]', options = {
--     { 'data', 'string', required = true, help = 'dataset directory or mix' },
--     { 'steps', 'number', default = 1, help = 'steps to print' },
--     { 'strict', 'flag', help = 'fail on the first bad line' } } }
--   local opts, positional = cli.parse(spec, args)   -- raises a usage error (exit 2) on bad input
local cli = {}

local function flag_name(option) return '--' .. option[1]:gsub('_', '-') end

function cli.help(spec)
  local lines = { ('usage: run -m %s %s'):format(spec.name, spec.usage or '[options]') }
  if spec.description then lines[#lines + 1] = spec.description end
  lines[#lines + 1] = ''
  for _, option in ipairs(spec.options) do
    local left = flag_name(option) .. (option[2] == 'flag' and '' or ' ' .. option[2]:upper())
    local default = option.default ~= nil and (' (default ' .. tostring(option.default) .. ')') or ''
    local required = option.required and ' (required)' or ''
    lines[#lines + 1] = ('  %-28s %s%s%s'):format(left, option.help or '', default, required)
  end
  return table.concat(lines, '\n')
end

-- A usage error: message + help on stderr, exit status 2 (as `run` itself does).
function cli.usage_error(spec, message)
  io.stderr:write(('%s: %s\n%s\n'):format(spec.name, message, cli.help(spec)))
  os.exit(2)
end

local function convert(spec, option, text)
  if option[2] == 'number' then
    local value = tonumber(text)
    if not value then cli.usage_error(spec, ('%s needs a number, got %q'):format(flag_name(option), text)) end
    return value
  end
  return text
end

function cli.parse(spec, args)
  local by_flag, opts, positional = {}, {}, {}
  for _, option in ipairs(spec.options) do
    by_flag[flag_name(option)] = option
    opts[option[1]] = option.default
  end
  local i = 1
  while i <= #args do
    local word = args[i]
    local flag, inline = word:match('^(%-%-[^=]+)=(.*)$')
    flag = flag or word
    local option = by_flag[flag]
    if word == '-h' or word == '--help' then
      io.write(cli.help(spec), '\n')
      os.exit(0)
    elseif option and option[2] == 'flag' then
      opts[option[1]] = true
    elseif option then
      local value = inline
      if value == nil then
        i = i + 1
        value = args[i]
        if value == nil then cli.usage_error(spec, flag .. ' needs a value') end
      end
      opts[option[1]] = convert(spec, option, value)
    elseif word:sub(1, 2) == '--' then
      cli.usage_error(spec, ("unknown option '%s'"):format(word))
    else
      positional[#positional + 1] = word
    end
    i = i + 1
  end
  for _, option in ipairs(spec.options) do
    if option.required and opts[option[1]] == nil then cli.usage_error(spec, flag_name(option) .. ' is required') end
  end
  return opts, positional
end

return cli
