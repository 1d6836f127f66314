-- wick.repl: the interactive loop of `run -i`.
--
-- Each input is first tried as an expression (`return <input>`) so values print, then as a
-- statement; an input that ends early in either form (`<eof>` error: `for i = 1, 3 do`, `1 +`)
-- keeps reading lines. Errors name stdin:LINE (lines counted over the session's input) and their
-- traceback stops at the input's chunk. Chunks run in the global environment, so globals of the
-- script run before the REPL stay inspectable. Line editing and history come from wick.host
-- (libedit); piped input works the same without prompts.
local host = require 'wick.host'

local repl = {}

local HISTORY_FILE = (os.getenv('HOME') or '.') .. '/.wick_history'
local THIS_FILE = debug.getinfo(1, 'S').short_src -- its frames are cut from a traceback
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

-- An error's traceback, cut to the user's frames: from where it was raised down to the input's
-- own chunk (`stdin:LINE: in main chunk`); the REPL's frames below it are left out, except at
-- WICK_LOG=debug.
local function traceback(message)
  local text = debug.traceback(tostring(message), 2)
  if require('wick.log').level() == 'debug' then return text end
  if require('wick.cli').is_user_error(message) then return message.message end -- a helper's one line
  local kept = {}
  for line in text:gmatch('[^\n]+') do
    if line:match('^\t%[C%]: in function \'xpcall\'$') or line:find(THIS_FILE, 1, true) then break end
    kept[#kept + 1] = line
    if line:match('^\tstdin:%d+: in main chunk$') then break end
  end
  return table.concat(kept, '\n')
end

local function ends_early(message) return message ~= nil and message:find("<eof>['\"]?$") ~= nil end

-- Compiles one input, first as an expression (so that its values print), then as a statement. The
-- chunk is named stdin and numbered by the session's input lines, so messages and tracebacks say
-- stdin:LINE. Returns the chunk, or nil, the message and whether the input only ended early (more
-- lines may complete it: `for i = 1, 3 do`, `1 +`).
local function compile(source, first_line)
  local padding = ('\n'):rep(first_line - 1)
  local chunk, expression_error = loadstring(padding .. 'return ' .. source, '=stdin')
  if chunk then
    -- The values go through a call instead of being returned, so that a function the input calls
    -- is not a tail call: an error it raises at level 2 then points at stdin, not at the REPL.
    return loadstring(padding .. 'return (function(...) return ... end)(' .. source .. '\n)', '=stdin') or chunk
  end
  local statement_error
  chunk, statement_error = loadstring(padding .. source, '=stdin')
  if chunk then return chunk end
  return nil, statement_error, ends_early(statement_error) or ends_early(expression_error)
end

local function finish(ok, ...)
  if not ok then
    io.stderr:write(tostring((...)), '\n')
    return false
  end
  print_results(select('#', ...), ...)
  return true
end

-- Runs one complete input, called by xpcall itself (no REPL frame between them); returns false if
-- it raised.
local function execute(chunk)
  return finish(host.interruptible(xpcall, chunk, traceback))
end

-- Raises a helper's refusal of its arguments as a user error: one line, positioned like
-- error(message, level) at the input that called the helper, and shown without a traceback (the
-- helper's own frames say nothing to the user who typed the call).
function repl.argument_error(message, level)
  local caller = debug.getinfo((level or 1) + 1, 'Sl')
  local where = caller and caller.currentline > 0 and ('%s:%d: '):format(caller.short_src, caller.currentline) or ''
  local cli = require 'wick.cli'
  cli.fail(where .. message, cli.EXIT_USAGE)
end

local leaving = false

-- Ends the loop after the input that calls it (the pause REPL's continue()).
function repl.leave() leaving = true end

-- Reads and runs inputs until the end of input or repl.leave(); returns whether any input failed
-- and the input left unfinished, if any.
local function loop(interactive)
  local pending, had_error = nil, false
  local line_number, first_line = 0, 1 -- of the input lines read, and of the pending input's first
  leaving = false
  while not leaving do
    local line, interrupted = host.readline(pending and '>> ' or '> ')
    if interrupted then
      io.write('\n')
      pending, line = nil, ''
    end
    if not line then break end
    line_number = line_number + 1
    if not pending then first_line = line_number end
    local source = pending and (pending .. '\n' .. line) or line
    if source:match('%S') then
      local chunk, err, incomplete = compile(source, first_line)
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
  leaving = false
  return had_error, pending
end

local function session(interactive)
  if interactive then
    host.load_history(HISTORY_FILE)
    host.ignore_interrupts(true) -- Ctrl-C interrupts running code (see execute), not the session
  end
  local had_error, pending = loop(interactive)
  if interactive then
    io.write('\n')
    host.ignore_interrupts(false)
    host.save_history(HISTORY_FILE)
  end
  return had_error, pending
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
  end
  local had_error, pending = session(interactive)
  if not interactive and (had_error or pending) then
    if pending then io.stderr:write('stdin: input ended inside an unfinished statement\n') end
    os.exit(1, true) -- closing the state runs the finalizers of what the session made (tensors, the loader)
  end
end

-- A REPL inside a running program (training paused at a step): returns at continue()
-- (repl.leave) or at the end of input; errors are reported and the session goes on.
function repl.pause(banner)
  io.write(banner, '\n')
  io.flush()
  local interactive = host.take_terminal() -- a launched rank: its prompt on the terminal itself
  session(interactive)
  if interactive then host.give_back_terminal() end
end

return repl
