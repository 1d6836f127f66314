-- wick.train: the trainer. `wick.train(recipe)` trains a recipe table (wick.recipe checks it) on
-- the world it finds (wick.dist); `run recipe.lua [--key=value ...]` does the same with overrides.
--
--   local trainer = wick.train.new(job)   -- job = wick.recipe.load(path, table, args)
--   trainer:train_step()  -- one optimizer step: the metrics table below, or nil at the end of the data
--   trainer:evaluate()    -- the held-out loss (eval.source), all ranks
--   trainer:save()        -- a checkpoint now (wick.checkpoint)
--   trainer:stop(why)     -- training ends after this step, on every rank
--   trainer:run()         -- the loop: steps, eval, logs, checkpoints, callbacks
--   trainer:sample(n)     -- text from the model (wick.train.sampling); the lines it prints: wick.train.progress
--
-- A step takes the global batch: on W ranks each accumulates global / (W x micro) micro-batches
-- (batch.schedule can change that count from a step on: the loader is reopened from its cursor
-- with the new micro batch, so the samples of every step stay the same), normalised by the step's
-- global target count (wick.nn.data_parallel; parallel.shard splits AdamW's state and the reduced
-- gradients over the ranks, a checkpoint gathers the moments whole), clipped (optim.clip), stepped
-- by AdamW with the learning rate of its schedule, under the recipe's precision policy. Metrics of
-- a step: step, loss, lr, tokens, tokens_per_s, data_wait (seconds this rank waited for data),
-- grad_norm, loss_scale, fingerprint (of the step's global batch, equal on every rank), micro_steps, ranks
-- (each rank's data/compute/comm/total seconds), applied (false: an fp16 overflow skipped it),
-- eval_loss (when evaluated), mfu (with log.peak_flops). Callbacks get (trainer, metrics).
local core = require 'wick.core'
local device = require 'wick.device'
local checkpoint = require 'wick.train.checkpoint'
local cli = require 'wick.cli'
local json = require 'wick.json'
local model = require 'wick.train.model'
local recipe = require 'wick.recipe'
local provenance = require 'wick.recipe.provenance'
local runlog = require 'wick.train.runlog'
local T = require 'wick.tensor'
local arithmetic = require 'wick.train.arithmetic'
local progress = require 'wick.train.progress'
local sampling = require 'wick.train.sampling'
local tokenizer_files = require 'wick.train.tokenizer_files'

local train = {}
local Trainer = {}
Trainer.__index = Trainer
train.Trainer = Trainer

local now = core.now
local say, announce = progress.say, progress.announce

local function wick() return require 'wick' end

-- The job's arithmetic, for loops of your own: wick.train.lr_schedule, micro_schedule, mix,
-- loader_options, parameter_count, flops_per_token, epoch_steps (wick.train.arithmetic).
for name, fn in pairs(arithmetic) do train[name] = fn end

-- Text from the model: trainer:sample(n), trainer:decode(ids), trainer:printable(ids).
Trainer.sample, Trainer.decode, Trainer.printable = sampling.sample, sampling.decode, sampling.printable

-- ---- the trainer ---------------------------------------------------------------------------------

local function fail(self, message) cli.fail(self.job.name .. ': ' .. message, cli.EXIT_USAGE) end

-- Every callback of an event, in order; they may read metrics and call trainer:stop().
local function emit(self, event, metrics)
  for _, set in ipairs(self.callbacks) do
    if set[event] then set[event](self, metrics) end
  end
end

-- fn(...) for a loader of the recipe's: one the run cannot start (a source too small for data.seq_len,
-- a cache too small for the ring, sources of different tokenizers or of the same data) is the
-- recipe's mistake: one usage line (exit 2), as the dry run reports it; a shard that cannot be read
-- stays the data error it is.
local function with_loader(self, fn, ...)
  local ok, result = pcall(fn, ...)
  if ok then return result end
  if core.C.wk_last_status() == core.C.WK_ERR_INVALID_ARG then fail(self, (tostring(result):gsub('^.-:%d+: ', ''))) end
  error(result, 0)
end

-- The loader options of this rank; a mix weight the data cannot take (a function whose value is
-- infinite at some step) is the recipe's mistake: one usage line (exit 2).
local function rank_loader_options(self, micro)
  local ok, o = pcall(arithmetic.loader_options, self.config, self.world_size, self.rank, micro, self.horizon)
  if not ok then fail(self, (tostring(o):gsub('^.-:%d+: ', ''))) end
  o.device = self.on.data
  return o
end

local function open_loader(self, micro, cursor)
  local o = rank_loader_options(self, micro)
  o.cursor = cursor
  self.loader = wick().data.loader(o)
  self.micro = micro
  with_loader(self, self.loader.start, self.loader)
end

-- The recipe since the checkpoint: printed; a change that cannot resume is refused.
local function check_resume(self, state)
  local old = {}
  for k, v in pairs(state) do
    local path = k:match('^recipe%.(.+)$')
    if path then old[path] = v end
  end
  local d = provenance.diff(old, recipe.flatten(self.config))
  for _, line in ipairs(d.changes) do say(self, 'resume: changed since the checkpoint: %s', line) end
  if #d.refused > 0 then fail(self, 'cannot resume from ' .. self.resumed_from .. ': ' .. table.concat(d.refused, '; ')) end
end

-- The runtime version and, per source, the hash of its index.json: what the data was.
local function manifests(config)
  local out = {}
  for _, path in ipairs(recipe.dataset_paths(config)) do
    local index = path:match('%.json$') and path or (path .. '/index.json')
    local text = core.read_file(index)
    out[path] = text and provenance.hash(text) or 'unreadable'
  end
  return out
end

-- Whether a run saves anything by itself: at the end (checkpoint.final) or every N steps.
local function saves(c) return c.checkpoint.final or c.checkpoint.every > 0 end

-- Rank 0 writes the checkpoints: it holds checkpoint.dir's lock from the start of run() (a second
-- run on it is refused, and a directory that cannot be written is found before any step; `run -i`
-- builds a trainer without taking it), and a fresh run refuses a directory that holds checkpoints,
-- this recipe's or another's (a later --resume would continue the newest of either run), unless
-- checkpoint.overwrite removes them first. Nil, or why not.
local function take_checkpoint_dir(self)
  if self.checkpoint_lock then return nil end
  local c = self.config.checkpoint
  local lock, why = checkpoint.lock(c.dir)
  if not lock then return why end
  self.checkpoint_lock = lock
  if self.job.flags.resume then return nil end
  if c.overwrite then return checkpoint.clear(c.dir) end
  return checkpoint.occupied(c.dir, self.job.hash)
end

-- At the start of run(), on every rank: rank 0's verdict reaches the others through the store, so every rank
-- ends at once with its message (rank 0 alone leaving would hold the others until their timeout).
local CLAIM_KEY = 'wick/train/checkpoint_dir'
local function claim_checkpoints(self)
  local why = self.rank == 0 and take_checkpoint_dir(self) or nil
  if self.world_size > 1 then
    local store = self.dist.store
    if self.rank == 0 then
      store:set(CLAIM_KEY, why or '')
    else
      local verdict, err = store:get(CLAIM_KEY)
      if not verdict then fail(self, 'rank 0 never said whether checkpoint.dir is usable: ' .. err) end
      why = verdict ~= '' and verdict or nil
    end
  end
  if why then fail(self, why) end
end

-- The loader at a checkpoint's cursor: a cursor the loader refuses names the state's file.
local function open_loader_at(self, micro, cursor)
  if not cursor then return open_loader(self, micro) end
  local ok, err = pcall(open_loader, self, micro, cursor)
  if not ok and cli.is_user_error(err) then error(err, 0) end -- the recipe's mistake, not the cursor's
  if not ok then
    local why = tostring(err):gsub('^.-:%d+: ', '')
    cli.fail(('checkpoint: %s/state.safetensors: cursor: %s'):format(self.resumed_from, why), cli.EXIT_DATA)
  end
end

-- --repl-at names a step this run trains: after the one it resumes from, at most the last.
local function check_repl_at(self, step)
  if step and (step > self.total or step <= self.step) then
    fail(self, ('--repl-at=%d is not a step of this run (it trains steps %d to %d)'):format(step, self.step + 1,
      self.total))
  end
end

function train.new(job)
  local config = job.config
  local w = wick()
  local self = setmetatable({ job = job, config = config, step = 0, tokens_seen = 0, stopping = nil,
    callbacks = {}, history = {} }, Trainer)
  local cbs = config.callbacks
  if cbs then self.callbacks = (#cbs > 0) and cbs or { cbs } end
  self.dist = w.dist.init { timeout = config.timeout }
  self.rank, self.world_size = self.dist.rank, self.dist.world_size
  local why
  self.on, why = model.devices(config, self.dist.local_rank, self.dist.local_world_size, device.count())
  if not self.on then fail(self, why) end
  self.micro_at, why = arithmetic.micro_schedule(config.batch, self.world_size)
  if not self.micro_at then fail(self, why) end
  local state
  if job.flags.resume and config.checkpoint.overwrite then
    fail(self, '--resume continues from the checkpoints of checkpoint.dir, checkpoint.overwrite removes them: drop one')
  end
  if job.flags.resume then
    local latest = checkpoint.latest(config.checkpoint.dir)
    if latest then
      self.resumed_from = latest.path
      state = checkpoint.state(latest.path)
      check_resume(self, state)
      self.step = state.step
    else
      say(self, 'resume: no complete checkpoint in %s: starting from step 0', config.checkpoint.dir)
    end
  end
  self.horizon = config.steps or with_loader(self, arithmetic.epoch_steps, config, self.world_size, self.rank,
    self.micro_at(1))
  open_loader_at(self, self.micro_at(self.step + 1), state and state.cursor)
  self.total = self.horizon
  if state and self.step >= self.total then
    fail(self, ('--resume: %s is step %d and this run ends at step %d: nothing left to train (raise steps to train ' ..
      'on from it, or start again: drop --resume and pass --checkpoint.overwrite or another checkpoint.dir)')
      :format(self.resumed_from, self.step, self.total))
  end
  check_repl_at(self, job.flags.repl_at)
  local problems
  self.model_config, problems = model.shape(config, self.loader:vocab_size())
  if #problems > 0 then fail(self, problems[1]) end
  self.model = model.build(self.model_config, config, self.on.model)
  self.lr_at = arithmetic.lr_schedule(config.optim, self.total, config.batch.global, self.world_size)
  local o = config.optim
  self.lr_scale = state and state.lr_scale or 1 -- set_lr() of a paused run's REPL
  self.opt = w.optim.adamw { lr = function(s) return self.lr_at(s) * self.lr_scale end, betas = o.betas, eps = o.eps,
    weight_decay = o.weight_decay, clip = o.clip }
  self.dp = w.nn.data_parallel(self.model, self.dist, { grad_dtype = config.parallel.grad_dtype,
    shard = config.parallel.shard, bucket_bytes = config.parallel.bucket_bytes, prefetch = config.parallel.prefetch,
    site = job.name .. " (wick.train's step)" })
  if state then -- after the data parallelism's broadcast of rank 0's weights, and with its layout
    local layout = self.dp.layout
    if not checkpoint.load_optimizer(self.resumed_from, self.opt, self.model, self.step, layout) then -- the masters?
      checkpoint.load_model(self.resumed_from .. '/model.safetensors', self.model, layout)
    end
    self.dp:refresh_weights()
    say(self, 'resume: from %s (step %d)', self.resumed_from, self.step)
  end
  self.flag = T.zeros({ 1 }, 'f32')
  local host = require 'wick.host'
  self.live = runlog.live_mode(self.rank) -- rank 0's progress line: 'terminal', 'launcher' or nil
  self.repl_at = job.flags.repl_at
  if host.watch_pause then host.watch_pause() end -- kill -USR1: pause at the next step boundary
  self.take_pause = host.take_pause or function() return false end
  return self
end

function Trainer:stop(reason) self.stopping = reason or 'stopped by a callback' end

-- Why `weights` names no source of this run (set_mix's check), or nil: the name, and the names there are.
function Trainer:unknown_source(weights)
  local names = {}
  for i, entry in ipairs(self.config.data.sources) do names[i] = recipe.source_name(entry) end
  for name in pairs(weights) do
    local known = false
    for _, n in ipairs(names) do known = known or n == name end
    if not known then
      return ('set_mix: no source is named %s (the sources: %s)'):format(tostring(name), table.concat(names, ', '))
    end
  end
end

-- New weights by source name from the next step on: the loader reopens from its cursor (each source
-- keeps its own cursor, so only future draws change).
function Trainer:set_mix(weights)
  if type(weights) ~= 'table' then error(('set_mix{ name = weight, ... } takes a table, got %s'):format(type(weights)), 2) end
  local why = self:unknown_source(weights)
  if why then error(why, 2) end
  for name, w in pairs(weights) do self.config.data.mix[name] = w end
  local cursor = self.loader:state()
  self.loader:close()
  open_loader(self, self.micro, cursor)
end

-- The sum of x over the ranks (f32: for metrics, not for exact sums).
function Trainer:sum_over_ranks(x)
  if self.world_size == 1 then return x end
  self.flag:set(1, x)
  self.dist:all_reduce(self.flag, 'sum')
  return self.flag:get(1)
end

function Trainer:train_step()
  local step = self.step + 1
  local micro = self.micro_at(step)
  if micro ~= self.micro then -- an accumulation schedule's change: same samples, other split
    local cursor = self.loader:state()
    self.loader:close()
    open_loader(self, micro, cursor)
  end
  local start = now()
  local r = self.dp:step(self.loader, self.opt)
  if not r then return nil end
  local seconds = now() - start
  self.step = step
  self.tokens_seen = self.tokens_seen + r.tokens
  local scaler = self.model.policy.scaler
  local metrics = {
    step = step, loss = r.loss, lr = self.lr_at(math.max(1, self.opt.step_count)) * self.lr_scale, tokens = r.tokens,
    tokens_per_s = r.tokens / seconds, seconds = seconds, data_wait = r.ranks[self.rank + 1].data,
    grad_norm = r.grad_norm, loss_scale = scaler and scaler.scale or 1, fingerprint = self.loader.batch.fingerprint,
    micro_steps = r.micro_steps, micro_batch = micro, applied = r.applied, ranks = r.ranks, slowest = r.slowest,
  }
  if self.config.log.peak_flops then
    metrics.mfu = model.mfu(self.model_config, self.config.data.seq_len, metrics.tokens_per_s,
      self.config.log.peak_flops * self.world_size)
  end
  self.last = r
  return metrics
end

-- The mean loss over eval.batches global batches of eval.source, from its start, on every rank.
function Trainer:evaluate()
  local c = self.config
  -- The run's own rows (seq_len, pack mode, columns and their loss mask, dtype, device) over the eval
  -- source, in stored order, from its start: the held-out loss counts what training counts.
  local o = rank_loader_options(self, self.micro)
  o.data, o.shuffle, o.audit = c.eval.source, false, nil
  local loader = wick().data.loader(o)
  local total, batches = 0, 0
  for _ = 1, c.eval.batches do
    local n, targets = self.dp:take(loader)
    if not n then break end
    local count = self.dp:global_count(targets)
    local share = 0
    for m = 1, n do
      local micro = self.dp.micro[m]
      if count > 0 then share = share + self.model:forward(micro.inputs, micro.targets, micro.mask, count) end
    end
    total, batches = total + self:sum_over_ranks(share), batches + 1
  end
  loader:close()
  return batches > 0 and total / batches or nil
end

-- Rank 0's temporary checkpoint directory, told to every rank through the store (a key per save:
-- every rank saves the same number of times).
local function shared_directory(self, tmp)
  self.saves = (self.saves or 0) + 1
  local key = ('checkpoint/save-%d'):format(self.saves)
  if self.rank == 0 then
    self.dist.store:set(key, tmp)
    return tmp
  end
  local value, why = self.dist.store:get(key)
  if not value then cli.fail(('checkpoint: rank 0 did not start the save of step %d: %s'):format(self.step, why)) end
  if not checkpoint.is_temporary(self.config.checkpoint.dir, self.step, value) then
    cli.fail(("checkpoint: the store names '%s' for step %d's save, not a temporary directory of checkpoint.dir '%s'")
      :format(value, self.step, self.config.checkpoint.dir))
  end
  return value
end

function Trainer:save()
  local c = self.config
  local meta = { step = self.step, cursor = self.loader:state(), seed = c.seed, recipe_text = self.job.text,
    recipe_hash = self.job.hash, recipe_name = self.job.name, overrides = table.concat(self.job.overrides, '\n'),
    version = wick().version, world_size = self.world_size,
    lr_scale = ('%.17g'):format(self.lr_scale) }
  for path, value in pairs(recipe.flatten(c)) do meta['recipe.' .. path] = value end
  local layout = self.dp.layout
  local sharded = layout and self.world_size > 1 -- each rank writes its own optimizer slice
  local path, tmp
  if self.rank == 0 then
    local why = take_checkpoint_dir(self) -- taken already, unless a save() of a run that saves nothing itself
    if why then fail(self, why) end
    self.manifests = self.manifests or json.encode(manifests(c)) -- hashed once a run
    meta.data = self.manifests
    tmp = checkpoint.start(c.checkpoint.dir, self.step)
    checkpoint.create_model(tmp, self.model) -- before any rank writes its part
    if self.tokenizer_info == nil then
      self.tokenizer_info = tokenizer_files.of(c) or false
      if self.tokenizer_info and self.tokenizer_info.missing then
        say(self, 'checkpoint: no tokenizer files beside the model: %s', self.tokenizer_info.missing)
      end
    end
    for key, value in pairs(tokenizer_files.write(tmp, self.tokenizer_info or nil, c)) do meta[key] = value end
  end
  if sharded then tmp = shared_directory(self, tmp) end
  local masters = layout and layout.masters -- sliced: each rank writes its own
  if self.rank == 0 or (sharded and masters) then checkpoint.write_model(tmp, self.model, layout) end
  if self.rank == 0 or sharded then checkpoint.save_optimizer(tmp, self.opt, self.model, layout) end
  if sharded then self.dist:barrier() end -- every slice written before DONE
  if self.rank == 0 then
    checkpoint.finish_model(tmp, self.model)
    path = checkpoint.finish(c.checkpoint.dir, tmp, self.step, meta, c.checkpoint.keep)
  end
  if self.world_size > 1 then self.dist:barrier() end -- no rank runs ahead of a checkpoint
  return path
end

-- Agrees on stopping and pausing: any rank's request holds for every rank after the same step.
-- One sum over the ranks carries both (stops + pauses x (world + 1): exact in f32 for any world
-- Gloo serves).
local function agree(self)
  local stop = self.stopping and 1 or 0
  local pause = (self.take_pause() or self.repl_at == self.step) and 1 or 0
  if self.world_size == 1 then return stop > 0, pause > 0 end
  local base = self.world_size + 1
  local sum = self:sum_over_ranks(stop + pause * base)
  return sum % base > 0, sum >= base
end

function Trainer:run()
  local c = self.config
  if saves(c) then claim_checkpoints(self) end
  if self.rank == 0 then
    self.log = runlog.open(c.log, self.step, self.resumed_from ~= nil, self.job.name, function(...) say(self, ...) end)
  end
  self.first_step, self.elapsed, self.waited, self.tokens_run = self.step, 0, 0, 0
  say(self, '%s: %d rank%s, %d steps of %d samples x %d tokens (micro batch %d), %.2fM parameters, %s, on %s',
    self.job.name, self.world_size, self.world_size == 1 and '' or 's', self.total, c.batch.global, c.data.seq_len, self.micro,
    self.model:parameter_count() / 1e6, type(c.precision) == 'table' and 'fp16' or c.precision, self.on.text)
  emit(self, 'on_train_begin')
  local last_saved, last_path = self.step, nil
  local function save()
    last_path, last_saved = self:save(), self.step
    emit(self, 'on_checkpoint', { step = self.step, path = last_path })
  end
  while self.step < self.total do
    local m = self:train_step()
    if not m then
      announce(self, 'the data ended after step %d', self.step)
      break
    end
    self.elapsed, self.waited, self.tokens_run = self.elapsed + m.seconds, self.waited + m.data_wait,
      self.tokens_run + m.tokens
    if c.eval.every > 0 and m.step % c.eval.every == 0 then
      m.eval_loss = self:evaluate()
      emit(self, 'on_eval', m)
    end
    self.history[#self.history + 1] = m.loss
    if self.log then self.log:write(m) end
    if progress.report(self, m) then emit(self, 'on_log', m) end
    emit(self, 'on_step_end', m)
    local stop, paused = agree(self)
    if paused then
      require('wick.train.pause').run(self, m)
      stop = stop or self.stopping ~= nil
    end
    if c.checkpoint.every > 0 and m.step % c.checkpoint.every == 0 then save() end
    if stop then
      announce(self, 'stopped after step %d: %s', self.step, self.stopping or 'another rank stopped')
      break
    end
  end
  if c.checkpoint.final and last_saved ~= self.step then save() end -- the run's result, however it ended
  if c.checkpoint.final and last_path and last_saved == self.step then
    say(self, 'saved: %s (a Hugging Face model directory)', last_path)
  end
  if self.last then progress.peak_memory(self, self.last.ranks) end
  emit(self, 'on_train_end', { step = self.step, losses = self.history })
  -- Sharded weights are gathered block by block with every rank: each samples the same text then.
  if c.log.sample > 0 and (self.rank == 0 or self.model.gathered) then
    local text = self:printable(self:sample(c.log.sample))
    if self.rank == 0 then say(self, 'sample:\n%s', text) end
  end
  return self
end

function Trainer:close()
  if self.log then self.log:close() end
  self.log = nil
  if self.loader then self.loader:close() end
  if self.dp then self.dp:free() end
  if self.model then self.model:free() end
  if self.opt then self.opt:free() end
  if self.flag then self.flag:free() end
  if self.tokenizer then self.tokenizer:close() end
  if self.dist then self.dist:close() end
  checkpoint.unlock(self.checkpoint_lock)
  self.loader, self.dp, self.model, self.opt, self.flag, self.dist, self.tokenizer = nil, nil, nil, nil, nil, nil, nil
end

-- wick.train(recipe_table [, args]) from a script: checks, trains, closes; returns the losses.
function train.run(job)
  local trainer = train.new(job)
  local ok, err = pcall(trainer.run, trainer)
  local losses = trainer.history
  trainer:close()
  if not ok then error(err, 0) end
  return losses
end

return setmetatable(train, {
  __call = function(_, raw, args)
    local info = debug.getinfo(2, 'S')
    local path = info.source:sub(1, 1) == '@' and info.source:sub(2) or 'recipe'
    return train.run(recipe.load(path, raw, args or {}))
  end,
})
