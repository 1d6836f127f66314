-- wick.train.inspector: what `run -i recipe.lua` puts in the REPL. The recipe is built (wick.train.new:
-- loader, model, optimizer, world) and not trained; the globals are
--   recipe   the checked recipe         model, loader, trainer   the built pieces
--   peek([rows])    the next step's first micro-batch as text (and its rows' columns, data.columns),
--                   without consuming it
--   decode(ids)     token ids (a table, or a tensor row) as text
--   step([n])       n optimizer steps (default 1); prints and returns the last metrics
--   stats(t)        numel, mean, std, min, max and non-finite count of a tensor
--   cursor()        the loader's cursor (what a checkpoint saves)
-- A helper given an argument it cannot take says so in one line at the typed line (wick.repl).
local T = require 'wick.tensor'

local inspector = {}

local PEEK_ROWS = 2
local PEEK_TOKENS = 64  -- tokens of each row shown (and values of a column's row)
local MAX_COUNT = 2 ^ 31 -- of steps or rows a helper is asked for

-- A helper's refusal of its arguments, blamed on the typed line `level` frames up (wick.repl).
local function argument_error(message, level) require('wick.repl').argument_error(message, level + 1) end

-- A helper's optional count (`what(n)`): nil, or a whole number in [1, MAX_COUNT]; raised at the
-- input that called the helper.
local function check_count(what, n)
  if n ~= nil and (type(n) ~= 'number' or n % 1 ~= 0 or n < 1 or n > MAX_COUNT) then
    argument_error(('%s(n): n must be a whole number from 1 to 2^31, got %s'):format(what, tostring(n)), 3)
  end
end

-- Token ids as decode takes them: a tensor, or a list (of whole numbers >= 0, or one such list).
local function check_ids(ids)
  if T.is_tensor(ids) then return end
  local list = type(ids) == 'table' and type(ids[1]) == 'table' and ids[1] or ids
  local ok = type(list) == 'table'
  for _, id in ipairs(ok and list or {}) do ok = ok and type(id) == 'number' and id >= 0 and id % 1 == 0 end
  if not ok then argument_error(('decode(ids): ids must be a tensor or a list of token ids, got %s'):format(
    type(ids)), 3) end
end

-- What print() and the REPL show of stats(t): one line.
local Stats = { __tostring = function(s)
  return ('%s %s: %d values, mean %.6g, std %.6g, min %.6g, max %.6g, %d non-finite'):format(s.shape, s.dtype, s.numel,
    s.mean, s.std, s.min, s.max, s.nonfinite)
end }

function inspector.stats(t)
  if not T.is_tensor(t) then argument_error(('stats(t): t must be a tensor, got %s'):format(type(t)), 2) end
  local values = t:float()
  local list = values:view({ values:numel() }):totable()
  values:free()
  local n, sum, sumsq, lo, hi, bad = 0, 0, 0, math.huge, -math.huge, 0
  for _, v in ipairs(list) do
    if v ~= v or v == math.huge or v == -math.huge then
      bad = bad + 1
    else
      n, sum, sumsq = n + 1, sum + v, sumsq + v * v
      lo, hi = math.min(lo, v), math.max(hi, v)
    end
  end
  local mean = n > 0 and sum / n or 0
  return setmetatable({ numel = #list, mean = mean, std = n > 0 and math.sqrt(math.max(0, sumsq / n - mean * mean)) or 0,
    min = lo, max = hi, nonfinite = bad, shape = '[' .. table.concat(t.shape, ', ') .. ']', dtype = t.dtype }, Stats)
end

-- A row's column as peek shows it: a number; the first values of a per-token column or a tensor; a
-- blob's size and its first bytes.
local function column_text(column)
  local v = column.value
  if type(v) == 'number' then return ('%s = %.9g'):format(column.name, v) end
  if type(v) == 'string' then return ('%s = %d bytes %q'):format(column.name, #v, v:sub(1, PEEK_TOKENS)) end
  local shown = {}
  for i = 1, math.min(#v, PEEK_TOKENS) do shown[i] = ('%.9g'):format(v[i]) end
  return ('%s = {%s%s}'):format(column.name, table.concat(shown, ' '), #v > PEEK_TOKENS and ' ...' or '')
end

function inspector.expose(job)
  local trainer = require('wick.train').new(job)
  local function decode(ids)
    check_ids(ids)
    if T.is_tensor(ids) then ids = ids:totable() end
    if type(ids[1]) == 'table' then ids = ids[1] end
    return trainer:decode(ids)
  end
  local function peek(rows)
    check_count('peek', rows)
    local o = require('wick.train').loader_options(trainer.config, trainer.world_size, trainer.rank, trainer.micro,
      trainer.horizon)
    o.cursor, o.audit = trainer.loader:state(), nil
    local view = require('wick.data').loader(o)
    local batch = view:next()
    local out = {}
    if batch then
      for r = 0, math.min(rows or PEEK_ROWS, batch.rows) - 1 do
        local ids = view:row_tokens(r)
        local shown = {}
        for i = 1, math.min(#ids, PEEK_TOKENS) do shown[i] = ids[i] end
        out[#out + 1] = ('step %d row %d: %q'):format(batch.step + 1, r, decode(shown)) -- steps count from 1
        for _, column in ipairs(view:row_columns(r)) do out[#out + 1] = '  ' .. column_text(column) end
      end
    end
    view:close()
    print(#out > 0 and table.concat(out, '\n') or '(the data has ended)')
  end
  local function step(n)
    check_count('step', n)
    local m
    for _ = 1, n or 1 do m = trainer:train_step() end
    if m then print(('step %d loss %.4f lr %.3e grad norm %.4f'):format(m.step, m.loss, m.lr, m.grad_norm or 0)) end
    return m
  end
  _G.recipe, _G.trainer, _G.model, _G.loader = job.config, trainer, trainer.model, trainer.loader
  _G.peek, _G.decode, _G.step, _G.stats = peek, decode, step, inspector.stats
  _G.cursor = function() return trainer.loader:state() end
end

return inspector
