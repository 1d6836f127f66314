-- wick.train.pause: training paused at a step boundary, with the REPL on rank 0. A rank asks for it by
-- `kill -USR1` (wick.host.take_pause) or when it reaches `--repl-at=STEP`; the trainer sums the
-- requests over the ranks after every step (with the stop requests, in one all-reduce), so every
-- rank pauses after the same step. Rank 0 then runs a REPL with
--   trainer, model, loader, metrics   the state after the step
--   set_lr(scale)       multiply the learning rate from the next step on (1: the recipe's)
--   set_mix{ name = w } change source weights (the loader reopens from its cursor)
--   stop([why])         end training after this step
--   continue()          leave the REPL and go on
-- and its changes reach the other ranks through the store (they wait there meanwhile), so every
-- rank applies the same ones before the next step. What a rank reads there is input: it checks each
-- change as rank 0's helpers do, and a change it cannot apply ends the run in one line.
local cli = require 'wick.cli'
local repl = require 'wick.repl'

local pause = {}

local MAX_WAIT = 7 * 24 * 3600 -- seconds another rank waits for rank 0's REPL
local MAX_STOP_REASON = 4096     -- bytes of a stop reason

-- The changes as text for the store: one `key=value` a line.
local function encode(changes)
  local lines = {}
  if changes.lr_scale then lines[#lines + 1] = ('lr_scale=%.17g'):format(changes.lr_scale) end
  if changes.stop then lines[#lines + 1] = 'stop=' .. changes.stop:gsub('\n', ' ') end
  for name, w in pairs(changes.mix) do lines[#lines + 1] = ('mix.%s=%.17g'):format(name, w) end
  return table.concat(lines, '\n')
end

local function is_weight(x) return type(x) == 'number' and x >= 0 and x < math.huge end

local function source_names(trainer)
  local names = {}
  for _, entry in ipairs(trainer.config.data.sources) do names[require('wick.recipe').source_name(entry)] = true end
  return names
end

-- The changes of the text rank 0 set for the pause after `step` (nil and why when none came).
local function decode(text, why, trainer, step)
  local function refuse(what) cli.fail(('pause after step %d: %s'):format(step, what)) end
  if type(text) ~= 'string' then refuse('no changes came from rank 0: ' .. tostring(why)) end
  local changes, names = { mix = {} }, source_names(trainer)
  for line in text:gmatch('[^\n]+') do
    local key, value = line:match('^([^=]+)=(.*)$')
    local number = tonumber(value)
    if key == 'lr_scale' and is_weight(number) then changes.lr_scale = number
    elseif key == 'stop' and #value <= MAX_STOP_REASON then changes.stop = value
    elseif key and key:match('^mix%.') and names[key:sub(5)] and is_weight(number) then changes.mix[key:sub(5)] = number
    else
      refuse(('rank 0 sent %q, which is not lr_scale=, mix.SOURCE= with a finite number >= 0 for a source of this '
        .. 'run, or stop= of at most %d bytes'):format(line:sub(1, 200), MAX_STOP_REASON))
    end
  end
  return changes
end

-- The REPL's helpers, recording what they change into `changes`.
local function helpers(trainer, changes)
  return {
    set_lr = function(scale)
      if not is_weight(scale) then
        repl.argument_error(('set_lr(scale): scale must be a finite number >= 0, got %s'):format(tostring(scale)), 2)
      end
      changes.lr_scale = scale
    end,
    set_mix = function(weights)
      if type(weights) ~= 'table' then
        repl.argument_error(('set_mix{ name = weight, ... } takes a table, got %s'):format(type(weights)), 2)
      end
      local unknown = trainer:unknown_source(weights)
      if unknown then repl.argument_error(unknown, 2) end
      for name, w in pairs(weights) do
        if not is_weight(w) then
          repl.argument_error(('set_mix: %s must be a finite number >= 0, got %s'):format(name, tostring(w)), 2)
        end
        changes.mix[name] = w
      end
    end,
    stop = function(why)
      if why ~= nil and (type(why) ~= 'string' or #why > MAX_STOP_REASON or why:find('\n', 1, true)) then
        repl.argument_error(('stop([why]): why must be one line of at most %d bytes, got %s'):format(MAX_STOP_REASON,
          type(why) == 'string' and ('%d bytes'):format(#why) or type(why)), 2)
      end
      changes.stop = why or 'stopped from the REPL'
    end,
    continue = repl.leave,
  }
end

local function apply(trainer, changes)
  if changes.lr_scale then trainer.lr_scale = changes.lr_scale end
  if next(changes.mix) then trainer:set_mix(changes.mix) end
  if changes.stop then trainer:stop(changes.stop) end
end

-- Pauses this rank after trainer.step (every rank calls it after the same step).
function pause.run(trainer, metrics)
  local key = ('wick/pause/%d'):format(trainer.step)
  local text, why
  if trainer.rank == 0 then
    local changes = { mix = {} }
    local globals = helpers(trainer, changes)
    globals.trainer, globals.model, globals.loader, globals.metrics = trainer, trainer.model, trainer.loader, metrics
    for k, v in pairs(globals) do _G[k] = v end
    local gathered = trainer.world_size > 1 and trainer.model.gathered
    if gathered then
      gathered.alone = "model: its weights are gathered from every rank (parallel.shard = 'parameters'), and the other "
        .. "ranks wait for this REPL: to run the model here, train with another parallel.shard"
    end
    repl.pause(('paused after step %d on %d rank%s: trainer, model, loader, metrics; set_lr(scale), ' ..
      'set_mix{name = w}, stop(), continue()'):format(trainer.step, trainer.world_size, trainer.world_size == 1 and '' or 's'))
    if gathered then gathered.alone = nil end
    text = encode(changes)
    if trainer.world_size > 1 then trainer.dist.store:set(key, text) end
  else
    print(('paused after step %d: rank 0 has the REPL'):format(trainer.step))
    text, why = trainer.dist.store:get(key, MAX_WAIT)
  end
  apply(trainer, decode(text, why, trainer, trainer.step))
  if trainer.rank == 0 then print(('continuing after step %d'):format(trainer.step)) end
end

return pause
