-- wick.inspector: what `run -i recipe.lua` puts in the REPL. The recipe is built (wick.train.new:
-- loader, model, optimizer, world) and not trained; the globals are
--   recipe   the checked recipe         model, loader, trainer   the built pieces
--   peek([rows])    the next step's first micro-batch as text, without consuming it
--   decode(ids)     token ids (a table, or a tensor row) as text
--   step([n])       n optimizer steps (default 1); prints and returns the last metrics
--   stats(t)        numel, mean, std, min, max and non-finite count of a tensor
--   cursor()        the loader's cursor (what a checkpoint saves)
local T = require 'wick.tensor'

local inspector = {}

local PEEK_ROWS = 2
local PEEK_TOKENS = 64  -- tokens of each row shown

function inspector.stats(t)
  if not T.is_tensor(t) then
    require('wick.repl').argument_error(('stats(t): t must be a tensor, got %s'):format(type(t)), 2)
  end
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
  return { numel = #list, mean = mean, std = n > 0 and math.sqrt(math.max(0, sumsq / n - mean * mean)) or 0,
    min = lo, max = hi, nonfinite = bad, shape = '[' .. table.concat(t.shape, ', ') .. ']', dtype = t.dtype }
end

function inspector.expose(job)
  local trainer = require('wick.train').new(job)
  local function decode(ids)
    if T.is_tensor(ids) then ids = ids:totable() end
    if type(ids[1]) == 'table' then ids = ids[1] end
    return trainer:decode(ids)
  end
  local function peek(rows)
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
      end
    end
    view:close()
    print(#out > 0 and table.concat(out, '\n') or '(the data has ended)')
  end
  local function step(n)
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
