-- wick.train.arithmetic: what a checked recipe means on a world of ranks, without training it: the
-- learning rate and the micro batch of each step, the loader's options, the steps of an epoch, the
-- model's parameters and FLOPs per token. The trainer (wick.train, which also offers these to loops
-- of your own) and the dry run (wick.train.plan) both compute with them.
local model = require 'wick.train.model'
local recipe = require 'wick.recipe'
local args = require 'wick.recipe.args'

local arithmetic = {}

local function wick() return require 'wick' end

-- The learning rate of step s (1-based): optim.lr scaled by scale_lr (global / base_batch, its
-- square root, or the world size), linear warmup, then constant, linear or cosine decay to min_lr
-- at step `total`. A function lr is used as it is.
function arithmetic.lr_schedule(optim, total, global_batch, world)
  if type(optim.lr) == 'function' then return optim.lr end
  local ratio = global_batch / optim.base_batch
  local scale = { none = 1, linear = ratio, sqrt = math.sqrt(ratio), world = world }
  local peak = optim.lr * scale[optim.scale_lr]
  local warmup, floor, kind = optim.warmup, optim.min_lr, optim.schedule
  return function(step)
    if step <= warmup then return peak * step / warmup end
    if kind == 'constant' then return peak end
    local progress = math.min(1, (step - warmup) / math.max(1, total - warmup))
    if kind == 'linear' then return floor + (peak - floor) * (1 - progress) end
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * progress))
  end
end

-- The micro batch of step s on `world` ranks: batch.micro (default global / world), or what
-- batch.schedule's accumulation gives. Returns fn(step) -> micro, or nil and why not.
function arithmetic.micro_schedule(batch, world)
  local function micro_for(accumulation, what)
    local rows = world * accumulation
    if batch.global % rows ~= 0 then
      return nil, ('batch.global %d is not divisible by world size %d x %s'):format(batch.global, world, what)
    end
    return batch.global / rows
  end
  if not batch.schedule then
    local micro = batch.micro or batch.global / world
    if micro % 1 ~= 0 or batch.global % (world * micro) ~= 0 then
      return nil, ('batch.global %d is not divisible by world size %d x batch.micro %s'):format(batch.global, world,
        batch.micro or '(global / world)')
    end
    return function() return micro end
  end
  local micros = {}
  for i, point in ipairs(batch.schedule) do
    local micro, why = micro_for(point[2], ('accumulation %d (batch.schedule from step %d)'):format(point[2], point[1]))
    if not micro then return nil, why end
    micros[i] = micro
  end
  return function(step)
    local micro = micros[1]
    for i, point in ipairs(batch.schedule) do if step >= point[1] then micro = micros[i] end end
    return micro
  end
end

-- The data.mix{} of a checked recipe's data section (weights by source name, default 1).
function arithmetic.mix(data, horizon)
  local list = { steps = horizon }
  for i, entry in ipairs(data.sources) do
    local w = data.mix[recipe.source_name(entry)]
    list[i] = { recipe.source_path(entry), weight = w == nil and 1 or w, epochs = type(entry) == 'table' and entry.epochs or nil }
  end
  return wick().data.mix(list)
end

-- The data section's fields that arithmetic.mix turns into the loader's `data`; every other field of the
-- section (recipe.SCHEMA) is a loader option and is passed on as given, so a field added to the
-- schema reaches the loader, which takes it or refuses it by name: none is ignored.
local MIX_FIELDS = { sources = true, mix = true }

-- Loader options for a checked recipe on `world` ranks (rank `rank`), micro batch `micro`.
function arithmetic.loader_options(config, world, rank, micro, horizon)
  local o = { data = arithmetic.mix(config.data, horizon), global_batch = config.batch.global, micro_batch = micro,
    world_size = world, rank = rank, seed = config.seed }
  for _, k in ipairs(recipe.SCHEMA:option('data').schema.names) do
    if not MIX_FIELDS[k] then o[k] = config.data[k] end
  end
  return o
end

-- A model's parameters and FLOPs per token, from its shape: a GPT-2's, or a Llama's when the shape
-- says arch = 'llama' (wick.train.model; wick.nn.cost and wick.nn.llama hold the formulas).
arithmetic.parameter_count = model.parameter_count
arithmetic.flops_per_token = model.flops_per_token

-- Steps of `epochs` passes over the sources: their samples per epoch (read from a loader of equal
-- weights, opened only for this) times epochs, over the global batch.
function arithmetic.epoch_steps(config, world, rank, micro)
  local plain = args.copy(config.data)
  plain.mix = {}
  local o = arithmetic.loader_options({ data = plain, batch = config.batch, seed = config.seed }, world, rank, micro, 1)
  o.audit, o.device = nil, nil -- counts samples only: on the CPU
  local loader = wick().data.loader(o)
  local samples = 0
  for i = 1, #config.data.sources do samples = samples + loader:epoch_length(i) end
  loader:close()
  return math.max(1, math.ceil(config.epochs * samples / config.batch.global))
end

return arithmetic
