-- wick.repl: the interactive loop of `run -i`.
--
-- Each input is first tried as an expression (`return <input>`) so values print, then as a
-- statement; an input that ends early (`<eof>` error) keeps reading lines. Chunks run in the global
-- environment, so globals of the script run before the REPL stay inspectable. Line editing and
-- history come from wick.host (libedit); piped input works the same without prompts.
local host = require 'wick.host'

local repl = {}

local HISTORY_FILE = (os.getenv('HOME') or '.') .. '/.wick_history'
local MAX_TABLE_ITEMS = 16  -- a printed table shows at most this many entries

local function render_scalar(value)
  if type(value) == 'string' then return string.format('%q', value) end
  return tostring(value)
end

-- One line for a table: {1, 2, x = 3, ...}; nested tables show as their address.
local function render(value)
  local mt = getmetatable(value)
  if type(value) ~= 'table' or (mt and mt.__tostring) then return render_scalar(value) end
  local parts, shown = {}, 0
  for i, v in ipairs(value) do
    if shown == MAX_TABLE_ITEMS then break end
    parts[#parts + 1] = render_scalar(v)
    shown = shown + 1
  end
  for k, v in pairs(value) do
    local is_array_key = type(k) == 'number' and k >= 1 and k <= #value and k % 1 == 0
    if not is_array_key then
      if shown == MAX_TABLE_ITEMS then parts[#parts + 1] = '...'; break end
      local key = type(k) == 'string' and k:match('^[%a_][%w_]*$') and k or '[' .. render_scalar(k) .. ']'
      parts[#parts + 1] = key .. ' = ' .. render_scalar(v)
      shown = shown + 1
    end
  end
  return '{' .. table.concat(parts, ', ') .. '}'
end
repl.render = render

local function print_results(n, ...)
  if n == 0 then return end
  local parts = {}
  for i = 1, n do parts[i] = render((select(i, ...))) end
  io.write(table.concat(parts, '\t'), '\n')
end

local function traceback(message)
  return debug.traceback(tostring(message), 2)
end

-- Compiles input as an expression or statement: chunk, or nil + error, incomplete flag.
local function compile(source)
  local chunk = loadstring('return ' .. source, '=stdin')
  if chunk then return chunk end
  local err
  chunk, err = loadstring(source, '=stdin')
  if chunk then return chunk end
  return nil, err, err:find("<eof>['\"]?$") ~= nil
end

-- Runs one complete input; returns false if it raised.
local function execute(chunk)
  local results = { n = 0 }
  local function capture(...) results = { n = select('#', ...), ... } end
  local ok, err = host.interruptible(xpcall, function() capture(chunk()) end, traceback)
  if not ok then
    io.stderr:write(err, '\n')
    return false
  end
  print_results(results.n, unpack(results, 1, results.n))
  return true
end

function repl.start(result_count, ...)
  if result_count and result_count > 0 then
    _G.recipe = (...)
  end
  local interactive = host.isatty(0)
  if interactive then
    io.write(string.format('Wick %s REPL — expressions print their value; Ctrl-C interrupts; Ctrl-D exits.\n',
      require('wick').version))
    if _G.recipe ~= nil then io.write('The script returned a value: it is in `recipe`.\n') end
    host.load_history(HISTORY_FILE)
    host.ignore_interrupts(true) -- Ctrl-C interrupts running code (see execute), not the session
  end
  local pending, had_error = nil, false
  while true do
    local line, interrupted = host.readline(pending and '>> ' or '> ')
    if interrupted then
      io.write('\n')
      pending, line = nil, ''
    end
    if not line then break end
    local source = pending and (pending .. '\n' .. line) or line
    if source:match('%S') then
      local chunk, err, incomplete = compile(source)
      if chunk then
        pending = nil
        if interactive then host.add_history(source) end
        had_error = not execute(chunk) or had_error
      elseif incomplete then
        pending = source
      else
        pending = nil
        io.stderr:write(err, '\n')
        had_error = true
      end
    end
  end
  if interactive then
    io.write('\n')
    host.ignore_interrupts(false)
    host.save_history(HISTORY_FILE)
  elseif had_error or pending then
    if pending then io.stderr:write('stdin: input ended inside an unfinished statement\n') end
    os.exit(1)
  end
end

return repl
