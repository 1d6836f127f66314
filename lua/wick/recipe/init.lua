-- wick.recipe: what a recipe file may say, checked whole. A recipe is a Lua file returning a table
-- (model, data, batch, precision, optim, steps or epochs, eval, checkpoint, log, callbacks); this
-- module declares those fields once (reusing the loader's, the model's and the optimizer's own
-- declarations, so a bound is written in one place), and the run's flags beside them; checks a
-- recipe against them naming each key by its path (`batch.mciro: unknown key (did you mean
-- batch.micro?)`), after the command line's overrides typed by the same declarations
-- (`--data.seq_len=256`, wick.recipe.args); flattens a checked recipe into `path = value` lines
-- (wick.recipe.provenance writes the values) and lists the fields (for --help and docs/reference/recipe.md).
-- It builds nothing: wick.train does.
--
--   local recipe = require 'wick.recipe'
--   local job = recipe.load('recipes/tiny.lua', table_it_returned, { '--steps=10', '--resume' })
--   -- job.config (checked, defaults filled), job.flags { resume, log, dry_run }, job.overrides,
--   -- job.text and job.hash (the file's), job.name
local core = require 'wick.core'
local schema = require 'wick.schema'
local args = require 'wick.recipe.args'
local provenance = require 'wick.recipe.provenance'
local has_host, host = pcall(require, 'wick.host') -- absent in a Lua embedding other than `run`

local recipe = {}

local LOADER = require('wick.data').LOADER_OPTIONS
local GPT = require('wick.nn.gpt').OPTIONS
local LLAMA = require('wick.nn.llama').OPTIONS
local LLAMA_ROPE = require('wick.nn.llama').ROPE
local ADAMW = require('wick.optim').ADAMW_OPTIONS
local DATA_PARALLEL = require('wick.nn.data_parallel').OPTIONS

local MAX_STEPS = 2 ^ 53
local DEFAULT_KEEP = 3
local DEFAULT_BASE_BATCH = 256     -- timm's lr_base_size
local DIST = require 'wick.dist'
local DEVICE = require 'wick.device'
local EVENTS = { 'on_train_begin', 'on_step_end', 'on_log', 'on_eval', 'on_checkpoint', 'on_train_end' }
local IS_EVENT = {}
for _, e in ipairs(EVENTS) do IS_EVENT[e] = true end
recipe.EVENTS = EVENTS

local function is_name(s) return type(s) == 'string' and s:match('^[%a_][%w_%-]*$') ~= nil end

-- What a { 'path', ... } source entry may say after its path.
local SOURCE = schema.define('source', {
  { 'name', 'name', check = function(v) return is_name(v), 'must be an identifier' end,
    help = "what data.mix weighs it by (default: the path's last component)" },
  { 'epochs', 'integer', min = 0, max = MAX_STEPS, help = 'passes over the source (default: no end)' },
})

-- data.sources: a list of 'path' or { 'path', name = 'web', epochs = n }; names default to the
-- path's last component and must be unique (data.mix weighs sources by name).
local function check_sources(list)
  if type(list) == 'string' then list = { list } end
  if type(list) ~= 'table' or #list == 0 then return false, "must be a path or a list of sources ('path' or { 'path', name =, epochs = })" end
  local seen = {}
  for i, entry in ipairs(list) do
    local path = recipe.source_path(entry)
    if type(path) ~= 'string' or path == '' then return false, ('source %d needs a path'):format(i) end
    if type(entry) == 'table' then
      local named = {}
      for k, v in pairs(entry) do if k ~= 1 then named[k] = v end end
      local checked, why = SOURCE:check_tree(named, ('sources[%d]'):format(i))
      if not checked then return false, why end
    end
    local name = recipe.source_name(entry)
    if seen[name] then return false, ('two sources are named %s: give one a name ='):format(name) end
    seen[name] = true
  end
  return true
end

-- A data.sources entry's path: the entry itself, or the first item of its table.
function recipe.source_path(entry)
  if type(entry) == 'table' then return entry[1] end
  return entry
end

-- A source's name: its name =, else its path's last component made an identifier.
function recipe.source_name(entry)
  if type(entry) == 'table' and entry.name then return entry.name end
  local path = recipe.source_path(entry)
  local base = path:gsub('/index%.json$', ''):gsub('/+$', ''):match('([^/]+)$') or path
  return (base:gsub('[^%w_%-]', '_'))
end

-- data.mix: weight per source name, each a number, a wick.schedule or fn(step).
local function check_mix(mix)
  if type(mix) ~= 'table' then return false, 'must be a table of weights by source name' end
  for name, w in pairs(mix) do
    if not is_name(name) then return false, 'is keyed by source names, got ' .. tostring(name) end
    local kind = type(w)
    if not (kind == 'table' or kind == 'function' or (kind == 'number' and w >= 0 and w < math.huge)) then
      return false, ('%s must be a number >= 0, a wick.schedule or fn(step)'):format(name)
    end
  end
  return true
end

-- batch.schedule: { { step, accumulation }, ... } from each step on, that many micro-steps a rank
-- (Lightning's GradientAccumulationScheduler, over steps); steps increasing, the first one 1.
local function check_accumulation(list)
  if type(list) ~= 'table' or #list == 0 then return false, 'must be a list of { step, accumulation }' end
  for i, point in ipairs(list) do
    local step, k = type(point) == 'table' and point[1], type(point) == 'table' and point[2]
    if type(step) ~= 'number' or step % 1 ~= 0 or step < 1 or (i == 1 and step ~= 1) or
        (i > 1 and step <= list[i - 1][1]) then
      return false, ('entry %d: steps must be whole, increasing, and start at 1'):format(i)
    end
    if type(k) ~= 'number' or k % 1 ~= 0 or k < 1 or k > LOADER:option('global_batch').max then
      return false, ('entry %d: accumulation must be a whole number >= 1'):format(i)
    end
  end
  return true
end

local function check_callbacks(value)
  local list = (type(value) == 'table' and #value > 0) and value or { value }
  for i, set in ipairs(list) do
    if type(set) ~= 'table' then return false, 'must be a table of functions by event, or a list of them' end
    for event, fn in pairs(set) do
      if not IS_EVENT[event] then
        local near = type(event) == 'string' and schema.nearest(event, EVENTS)
        return false, ('%s is no event%s (%s)'):format(tostring(event), near and (', did you mean ' .. near .. '?') or '',
          table.concat(EVENTS, ', '))
      end
      if type(fn) ~= 'function' then return false, ('%s (set %d) must be a function'):format(event, i) end
    end
  end
  return true
end

local function section(name, set, help) return { name, 'section', schema = set, help = help } end

-- model.device and data.device: a name wick.device.choose resolves on each rank; either follows the
-- other when only one is set (wick.train.model.devices).
local function device_field(help)
  return { 'device', 'device', check = DEVICE.check_name, parse = 'string', help = help }
end

-- A shape key of one architecture: optional here (wick.train.model says which the recipe needs), no
-- default (an unset key stays out of the flattened recipe).
local function shape_key(set, name, help, key)
  local option = schema.from(set, name, { key or name, required = false, help = help })
  option.default = nil
  return option
end

local MODEL = schema.define('model', {
  { 'arch', 'enum', values = { 'gpt2', 'llama' }, help = 'what to train from scratch: gpt2 (default) or llama' },
  { 'from_pretrained', 'string', help = 'a Hugging Face model directory to fine-tune: its config.json gives the shapes' },
  shape_key(GPT, 'layers', 'transformer blocks'), shape_key(GPT, 'heads', 'attention heads; divide dim'),
  shape_key(GPT, 'dim', 'model width'),
  shape_key(LLAMA, 'kv_heads', 'llama: key/value heads, dividing heads (default heads)'),
  shape_key(LLAMA, 'ffn_dim', 'llama: width of the SwiGLU feed-forward'),
  shape_key(LLAMA_ROPE, 'theta', 'llama: base of the rotary frequencies (default 10000)', 'rope_theta'),
  shape_key(LLAMA, 'tie_embeddings', 'llama: the output head is the token embedding (default false)'),
  schema.from(GPT, 'vocab', { required = false, help = "token ids are below this (default: the data's vocabulary)" }),
  schema.from(GPT, 'seq_len', { required = false, help = 'the longest sequence (default: data.seq_len)' }),
  device_field("'auto' (this rank's GPU, cuda:LOCAL_RANK, else the CPU), 'cpu', 'cuda' (this rank's GPU) or " ..
    "'cuda:N' (default data.device, else auto)"),
  schema.from(GPT, 'recompute'),
})

local DATA = schema.define('data', {
  { 'sources', 'sources', check = check_sources, parse = 'string', required = true,
    help = "a dataset path, or a list of 'path' / { 'path', name = 'web', epochs = n }" },
  { 'mix', 'mix', check = check_mix, default = {},
    help = 'weight per source name: a number, a wick.schedule or fn(step) (default 1)' },
  schema.from(LOADER, 'seq_len', { default = 1024, help = 'tokens per sample minus one' }),
  schema.from(LOADER, 'shuffle'),
  schema.from(LOADER, 'mode'), schema.from(LOADER, 'threads'), schema.from(LOADER, 'prefetch'),
  schema.from(LOADER, 'node_cache_bytes'), schema.from(LOADER, 'memory_budget'), schema.from(LOADER, 'on_corrupt'),
  device_field("where batches live: as model.device (default model.device)"), schema.from(LOADER, 'audit'),
  schema.from(LOADER, 'columns'), schema.from(LOADER, 'blob_bytes'),
})

local BATCH = schema.define('batch', {
  schema.from(LOADER, 'global_batch', { 'global', required = true, help = 'samples per optimizer step, all ranks' }),
  schema.from(LOADER, 'micro_batch', { 'micro', help = 'rows per forward/backward on a rank (default: global / world)' }),
  { 'schedule', 'accumulation', check = check_accumulation,
    help = 'micro-steps per rank from a step on: { {1, 4}, {100, 2} } (instead of micro)' },
})

local OPTIM = schema.define('optim', {
  schema.from(ADAMW, 'lr', { default = 3e-4, help = 'peak learning rate (before scale_lr)' }),
  schema.from(ADAMW, 'betas'), schema.from(ADAMW, 'eps'), schema.from(ADAMW, 'weight_decay'), schema.from(ADAMW, 'clip'),
  { 'schedule', 'enum', values = { 'constant', 'linear', 'cosine' }, default = 'cosine',
    help = 'after warmup: constant, linear or cosine decay to min_lr at the last step' },
  { 'warmup', 'integer', min = 0, max = MAX_STEPS, default = 0, help = 'steps of linear warmup from 0' },
  { 'min_lr', 'number', min = 0, default = 0, help = 'the rate the decay ends at' },
  { 'scale_lr', 'enum', values = { 'none', 'linear', 'sqrt', 'world' }, default = 'none',
    help = 'scale lr by batch.global / base_batch (timm), its square root, or the world size' },
  { 'base_batch', 'integer', min = 1, max = 2 ^ 40, default = DEFAULT_BASE_BATCH, help = 'the batch lr is given for' },
})

local EVAL = schema.define('eval', {
  { 'source', 'string', help = 'held-out dataset path' },
  { 'every', 'integer', min = 0, max = MAX_STEPS, default = 0, help = 'evaluate every N steps (0: never)' },
  { 'batches', 'integer', min = 1, max = 2 ^ 20, default = 1, help = 'global batches per evaluation' },
})

local CHECKPOINT = schema.define('checkpoint', {
  { 'every', 'integer', min = 0, max = MAX_STEPS, default = 0, help = 'also save every N steps (0: no periodic saves)' },
  { 'final', 'boolean', default = true, help = 'save the model when the run ends (false, with every = 0: save nothing)' },
  { 'dir', 'string', help = 'where step-N/ directories go (default: checkpoints/<recipe name>, from the working directory)' },
  { 'keep', 'integer', min = 1, max = 2 ^ 20, default = DEFAULT_KEEP, help = 'complete checkpoints kept' },
  { 'overwrite', 'boolean', default = false,
    help = "a run without --resume removes the directory's checkpoints first (else it is refused)" },
})

local LOG = schema.define('log', {
  { 'every', 'integer', min = 0, max = MAX_STEPS, default = 0, help = 'a plain line every N steps (0: 10 lines a run)' },
  { 'file', 'string', help = 'JSONL: one record per step (also --log=FILE)' },
  { 'tensorboard', 'string', help = 'a directory: rank 0 writes TensorBoard event files there, a scalar per JSONL field' },
  { 'sample', 'integer', min = 0, max = 2 ^ 20, default = 0, help = 'tokens of text rank 0 samples at the end' },
  { 'peak_flops', 'number', min = 0, help = 'FLOP/s of one device: the log adds MFU' },
})

local PARALLEL = schema.define('parallel', {
  schema.from(DATA_PARALLEL, 'grad_dtype'),
  schema.from(DATA_PARALLEL, 'shard'),
  schema.from(DATA_PARALLEL, 'bucket_bytes'),
  schema.from(DATA_PARALLEL, 'prefetch'),
})

local RECIPE = schema.define('recipe', {
  section('model', MODEL, 'the model: a GPT-2 or Llama from scratch, or a Hugging Face directory'),
  section('data', DATA, 'what to train on'),
  section('batch', BATCH, 'batch sizes'),
  schema.from(GPT, 'precision', { default = 'fp32' }),
  section('optim', OPTIM, 'AdamW and its learning-rate schedule'),
  { 'steps', 'integer', min = 1, max = MAX_STEPS, help = 'optimizer steps (or epochs)' },
  { 'epochs', 'number', min = 0, max = MAX_STEPS, help = 'passes over the sources, instead of steps' },
  schema.from(GPT, 'seed', { help = 'seeds the model and the data order' }),
  section('eval', EVAL, 'held-out loss'),
  section('checkpoint', CHECKPOINT, 'checkpoints'),
  section('log', LOG, 'progress, metrics'),
  { 'callbacks', 'callbacks', check = check_callbacks, help = 'fn(trainer, metrics) by event: ' .. table.concat(EVENTS, ', ') },
  { 'timeout', 'number', min = 1, max = DIST.MAX_TIMEOUT, default = DIST.DEFAULT_TIMEOUT, help = 'seconds a collective may wait' },
  section('parallel', PARALLEL, 'how the ranks share a step'),
})
recipe.SCHEMA = RECIPE

-- The run's own flags, which the command line after a recipe gives beside its --key=value
-- overrides (wick.recipe.args reads both).
local FLAGS = schema.define('flag', {
  { 'resume', 'boolean', help = 'continue from the newest complete checkpoint of checkpoint.dir' },
  { 'log', 'string', value = 'FILE', expects = 'a file', help = 'JSONL log, one record per step (log.file)' },
  { 'dry_run', 'boolean', help = 'check and plan the run, train nothing (wick.train.plan)' },
  { 'repl_at', 'integer', min = 1, max = MAX_STEPS, value = 'STEP', expects = 'a step number >= 1',
    help = 'pause after this step with the REPL on rank 0 (wick.train.pause)' },
  { 'help', 'boolean', help = 'the fields, and exit' },
})
recipe.FLAGS = FLAGS

-- ---- checking ------------------------------------------------------------------------------------

local fail = args.fail

-- The model section's keys that shape a model, and those only a Llama has.
local SHAPE_KEYS = { 'arch', 'layers', 'heads', 'dim', 'kv_heads', 'ffn_dim', 'rope_theta', 'tie_embeddings', 'vocab',
  'seq_len' }
local LLAMA_KEYS = { 'kv_heads', 'ffn_dim', 'rope_theta', 'tie_embeddings' }

-- A model from a directory takes its shapes from there; one from scratch needs its own, those of
-- its architecture only.
local function check_model(m)
  if m.from_pretrained then
    for _, key in ipairs(SHAPE_KEYS) do
      if m[key] ~= nil then
        return ("model.%s: model.from_pretrained's config.json gives the model's shape: drop model.%s"):format(key, key)
      end
    end
    return nil
  end
  local needed = { 'layers', 'heads', 'dim' }
  if m.arch == 'llama' then needed[#needed + 1] = 'ffn_dim' end
  for _, key in ipairs(needed) do
    if m[key] == nil then return ('model.%s is required (or model.from_pretrained = a model directory)'):format(key) end
  end
  if m.arch ~= 'llama' then
    for _, key in ipairs(LLAMA_KEYS) do
      if m[key] ~= nil then return ("model.%s is a Llama's: set model.arch = 'llama', or drop it"):format(key) end
    end
  end
  if m.dim % m.heads ~= 0 then return ('model.dim %d is not divisible by model.heads %d'):format(m.dim, m.heads) end
  if m.kv_heads and m.heads % m.kv_heads ~= 0 then
    return ('model.heads %d is not a multiple of model.kv_heads %d'):format(m.heads, m.kv_heads)
  end
  if m.arch == 'llama' and (m.dim / m.heads) % 2 ~= 0 then
    return ('model.dim / model.heads = %d must be even (RoPE rotates pairs)'):format(m.dim / m.heads)
  end
end

-- What the tree cannot say: one of steps and epochs, the model's shape, the eval source.
local function check_relations(c)
  if (c.steps == nil) == (c.epochs == nil) then return ('give steps or epochs (%s)'):format(c.steps and 'not both' or 'one of them') end
  local why = check_model(c.model)
  if why then return why end
  if c.batch.schedule and c.batch.micro then return 'batch.schedule sets the micro batch: drop batch.micro' end
  if c.eval.every > 0 and not c.eval.source then return 'eval.every needs eval.source' end
  local drawn = false -- a source whose weight is not the number 0 (a schedule's is judged at its steps)
  for _, entry in ipairs(c.data.sources) do drawn = drawn or c.data.mix[recipe.source_name(entry)] ~= 0 end
  if not drawn then return 'data.mix: every weight is 0: no source would be drawn' end
  for name in pairs(c.data.mix) do
    local found = false
    for _, entry in ipairs(type(c.data.sources) == 'table' and c.data.sources or { c.data.sources }) do
      found = found or recipe.source_name(entry) == name
    end
    if not found then return ('data.mix.%s: no source is named %s'):format(name, name) end
  end
end

-- Every dataset a checked recipe reads: its sources' paths, then the eval source's.
function recipe.dataset_paths(config)
  local paths = {}
  for i, entry in ipairs(config.data.sources) do paths[i] = recipe.source_path(entry) end
  if config.eval.source then paths[#paths + 1] = config.eval.source end
  return paths
end

-- Where a recipe's checkpoints go when it does not say: checkpoints/<its file's name less .lua>, from
-- the working directory (as Lightning's lightning_logs/), so two recipes never share one.
function recipe.default_checkpoint_dir(name)
  return 'checkpoints/' .. (name:match('([^/]+)$') or name):gsub('%.lua$', '')
end

-- The checked recipe (defaults filled) or raises a usage error naming `name` and the key's path.
function recipe.check(raw, name)
  local config, why = RECIPE:check_tree(raw)
  if not config then fail(name, why) end
  if type(config.data.sources) == 'string' then config.data.sources = { config.data.sources } end
  why = check_relations(config)
  if why then fail(name, why) end
  config.checkpoint.dir = config.checkpoint.dir or recipe.default_checkpoint_dir(name)
  return config
end

-- ---- text, hashes, flattening ----------------------------------------------------------------------

-- A checked recipe as { path = text } for every field that is set (mix weights by source name).
function recipe.flatten(config)
  local out = {}
  for _, leaf in ipairs(RECIPE:leaves()) do
    local path = leaf[1]
    local value = config
    for key in path:gmatch('[^.]+') do value = type(value) == 'table' and value[key] or nil end
    if path == 'data.mix' then -- every source's weight, the default 1 too
      for _, entry in ipairs(config.data.sources) do
        local source = recipe.source_name(entry)
        local w = value[source]
        out['data.mix.' .. source] = provenance.render(w == nil and 1 or w)
      end
    elseif value ~= nil then
      out[path] = provenance.render(value)
    end
  end
  return out
end

-- ---- the list of fields ----------------------------------------------------------------------------

-- One line per field: path, type and range, default, help (--help; docs/reference/recipe.md has them too).
function recipe.fields()
  local lines = {}
  for _, leaf in ipairs(RECIPE:leaves()) do
    local path, o = leaf[1], leaf[2]
    local kind = o.types and table.concat(o.types, '|') or o[2]
    if kind == 'enum' then kind = table.concat(o.values, '|') end
    local bound = require('wick.cli').bound_text
    if o.min or o.max then kind = ('%s in [%s, %s]'):format(kind, bound(o.min) or '-inf', bound(o.max) or 'inf') end
    local default = o.default ~= nil and type(o.default) ~= 'table' and ('; default %s'):format(provenance.render(o.default)) or ''
    lines[#lines + 1] = ('%-20s %s%s%s: %s'):format(path, kind, default, o.required and '; required' or '', o.help or '')
  end
  return lines
end

-- ---- loading -------------------------------------------------------------------------------------

local included = {}

-- Where recipes keep what they make (datasets, checkpoints): build/ of the checkout or prefix.
recipe.build_dir = (has_host and host.home or '.') .. '/build'

-- Runs a Lua file named relative to the calling file's directory, once (like #include "..."):
-- recipes share pieces that way (recipes/lib/). Returns what the file returns.
function recipe.include(name)
  local source = debug.getinfo(2, 'S').source
  local dir = source:sub(1, 1) == '@' and source:sub(2):match('^(.*)/') or '.'
  local path = name:sub(1, 1) == '/' and name or (dir .. '/' .. name)
  if included[path] == nil then
    local chunk, err = loadfile(path)
    if not chunk then error('recipe.include: ' .. err, 2) end
    local value = chunk()
    included[path] = value == nil and true or value
  end
  return included[path]
end

-- A deep copy of a recipe's tables: include returns the one table every includer shares, so a recipe
-- that edits an included one copies it first.
recipe.copy = args.copy

-- Whether a script's returned table is a recipe: it names at least one of the recipe's fields (a
-- script may return other tables; a recipe with a typo still names most of its fields).
function recipe.is_recipe(value)
  if type(value) ~= 'table' or getmetatable(value) then return false end
  for key in pairs(value) do
    if type(key) == 'string' and RECIPE:option(key) then return true end
  end
  return false
end

-- A job from a recipe file's returned table and the command line after it.
function recipe.load(path, raw, argv)
  local home = has_host and host.home .. '/'
  local name = (home and path:sub(1, #home) == home) and path:sub(#home + 1) or path -- recipes/tiny.lua
  local flags, overrides = args.parse(FLAGS, name, argv or {}, RECIPE)
  if flags.help then
    io.stdout:write(('usage: run %s [--key=value ...] %s\n\nfields:\n  %s\n'):format(
      name, args.usage(FLAGS), table.concat(recipe.fields(), '\n  ')))
    os.exit(0)
  end
  if type(raw) ~= 'table' then fail(name, 'a recipe returns a table') end
  local resolved_raw, applied = args.apply(RECIPE, name, raw, overrides)
  -- steps and epochs are one choice: --steps=N replaces the recipe's epochs and --epochs=X its steps
  -- (both on the command line stay refused by the check)
  local given = {}
  for _, o in ipairs(overrides) do given[o[1]] = true end
  if given.steps and not given.epochs then resolved_raw.epochs = nil end
  if given.epochs and not given.steps then resolved_raw.steps = nil end
  if flags.log then resolved_raw.log = resolved_raw.log or {}; resolved_raw.log.file = flags.log end
  local config = recipe.check(resolved_raw, name)
  local text, err = core.read_file(path)
  if not text then
    local cli = require 'wick.cli'
    cli.fail(('%s: cannot read it for its provenance: %s'):format(name, err), cli.EXIT_DATA)
  end
  return { name = name, path = path, config = config, flags = flags, overrides = applied, text = text,
    hash = provenance.hash(text) }
end

return recipe
