-- wick.train.model: the model a recipe's model section describes, for the trainer and the dry run
-- alike. Its shape comes from the section and the data (a GPT-2 or a Llama trained from scratch) or
-- from a Hugging Face directory's config.json (model.from_pretrained, fine-tuned); the data is
-- checked against it (its vocabulary, data.seq_len, a directory's tokenizer), each problem saying what
-- to change. Then its
-- parameters and FLOPs, the devices of a rank (wick.device), and the model itself, built or loaded.
--
--   local shape, problems = model.shape(config, data_vocab)
--   -- shape: { arch = 'gpt2'|'llama', vocab =, seq_len =, layers =, heads =, dim =, recompute =, and
--   --          for a Llama kv_heads =, ffn_dim =, tie_embeddings =, qkv_bias =, options = wick.nn.llama's }
--   local on = model.devices(config, local_rank, local_world, wick.device.count())  -- on.model, on.data, on.text
--   local m = model.build(shape, config, on.model)
local cost = require 'wick.nn.cost'
local gpt = require 'wick.nn.gpt'
local llama = require 'wick.nn.llama'
local pretrained = require 'wick.nn.pretrained'
local tokenizer = require 'wick.data.tokenizer'
local device = require 'wick.device'

local model = {}

local function from_directory(dir)
  local found = pretrained.config(dir)
  local o = found.options
  if found.family == 'gpt2' then
    return { arch = 'gpt2', vocab = o.vocab, seq_len = o.seq_len, layers = o.layers, heads = o.heads, dim = o.dim }
  end
  return { arch = 'llama', vocab = o.vocab, seq_len = o.max_positions, layers = o.layers, heads = o.heads, dim = o.dim,
    kv_heads = o.kv_heads, ffn_dim = o.ffn_dim, tie_embeddings = o.tie_embeddings, qkv_bias = o.qkv_bias, options = o }
end

local function from_scratch(m, vocab, seq_len)
  local shape = { arch = m.arch or 'gpt2', vocab = vocab, seq_len = seq_len, layers = m.layers, heads = m.heads,
    dim = m.dim }
  if shape.arch == 'llama' then
    shape.kv_heads, shape.ffn_dim, shape.tie_embeddings = m.kv_heads or m.heads, m.ffn_dim, m.tie_embeddings or false
    shape.qkv_bias = false
    shape.options = { vocab = vocab, dim = m.dim, layers = m.layers, heads = m.heads, kv_heads = shape.kv_heads,
      ffn_dim = m.ffn_dim, rope = { theta = m.rope_theta }, max_positions = seq_len,
      tie_embeddings = shape.tie_embeddings }
  end
  return shape
end

-- The shape of a checked recipe's model on data of `data_vocab` token ids, and the list of what the
-- data and the model disagree on; a directory that cannot be read gives nil and its one problem.
function model.shape(config, data_vocab)
  local m, seq_len, problems = config.model, config.data.seq_len, {}
  if m.from_pretrained then
    local ok, shape = pcall(from_directory, m.from_pretrained)
    if not ok then return nil, { 'model.from_pretrained: ' .. tostring(shape):gsub('^.-:%d+: ', '') } end
    shape.recompute = m.recompute
    if data_vocab > shape.vocab then
      problems[#problems + 1] = ("model.from_pretrained %s: its vocab_size %d is below the data's vocabulary %d: " ..
        "convert the data with the model's tokenizer (its tokenizer.json)"):format(m.from_pretrained, shape.vocab, data_vocab)
    end
    if seq_len > shape.seq_len then
      problems[#problems + 1] = ('data.seq_len %d is above the %d positions of model.from_pretrained %s: lower data.seq_len')
        :format(seq_len, shape.seq_len, m.from_pretrained)
    end
    return shape, problems
  end
  if m.vocab and m.vocab < data_vocab then
    problems[#problems + 1] = ("model.vocab %d is below the data's vocabulary %d (token ids would not fit)")
      :format(m.vocab, data_vocab)
  end
  if m.seq_len and m.seq_len < seq_len then
    problems[#problems + 1] = ('model.seq_len %d is below data.seq_len %d'):format(m.seq_len, seq_len)
  end
  local shape = from_scratch(m, m.vocab or data_vocab, m.seq_len or seq_len)
  shape.recompute = m.recompute
  return shape, problems
end

-- Why a source's tokens are not the fine-tuned directory's (nil when they are, or when either side
-- does not say): `info` is the source's { tokenizer = name, fingerprint = }, from its index.
function model.tokenizer_problem(config, source, info)
  local dir = config.model.from_pretrained
  if not dir or not info.fingerprint then return nil end
  -- A Wick checkpoint records the tokenizer it trained with (its tokenizer.json may be a Hugging Face
  -- spelling of a built-in one, as 'bytes')
  local _, state = require('wick.safetensors').header(dir .. '/state.safetensors')
  local recorded = type(state) == 'table' and state.tokenizer_fingerprint
  if recorded then
    if recorded == info.fingerprint then return nil end
    return ("source %s was tokenized by %s, not by %s, which model.from_pretrained's checkpoint trained with " ..
      '(its state.safetensors): convert it with that tokenizer'):format(source, info.tokenizer, state.tokenizer)
  end
  local path = dir .. '/tokenizer.json'
  local file = io.open(path, 'rb')
  if not file then return nil end
  file:close()
  local tok = tokenizer.open(path)
  if not tok then return nil end  -- a tokenizer.json Wick cannot read: the converter says why
  local same = tok.fingerprint == info.fingerprint
  tok:close()
  if same then return nil end
  return ("source %s was tokenized by %s, not by model.from_pretrained's %s: convert it with that tokenizer"):format(
    source, info.tokenizer, path)
end

function model.parameter_count(shape)
  if shape.arch == 'llama' then return llama.parameter_count(shape) end
  return cost.parameter_count(shape)
end

-- The parameters of one of its blocks (wick.nn.gathered gathers them together).
function model.block_parameter_count(shape)
  if shape.arch == 'llama' then return llama.block_parameter_count(shape) end
  return cost.block_parameter_count(shape)
end

-- FLOPs per token and MFU on rows of T tokens, the trained data.seq_len (shape.seq_len is the
-- positions the model holds: a Llama-3.2-1B's 131072 would count its attention 250x at T = 512).
function model.flops_per_token(shape, T) return cost.flops_per_token(shape, T, model.parameter_count(shape)) end

function model.mfu(shape, T, tokens_per_s, peak_flops)
  return cost.mfu(shape, T, tokens_per_s, peak_flops, model.parameter_count(shape))
end

-- Where local rank `local_rank` of `local_world` on a machine of `count` CUDA devices keeps the model
-- and the batches: model.device and data.device, each following the other when only one is set, 'auto'
-- when neither is. { model =, data = (wick.tensor devices), text = what the run says it uses }, or nil
-- and why not, naming the field.
function model.devices(config, local_rank, local_world, count)
  local set = { model = config.model.device, data = config.data.device }
  -- per part: the name it takes, and the field that gave it (the default's: the model's)
  local names = { model = { set.model or set.data or 'auto', set.model and 'model' or (set.data and 'data' or 'model') } }
  names.data = set.data and { set.data, 'data' } or names.model
  local on = {}
  for _, part in ipairs({ 'model', 'data' }) do
    local name, field = names[part][1], names[part][2]
    local why
    on[part], why = device.choose(name, local_rank, local_world, count)
    if not on[part] then
      return nil, ("%s.device '%s'%s: %s"):format(field, name, set[field] and '' or ' (the default)', why)
    end
  end
  on.text = device.describe(names.model[1], on.model, local_world)
  if on.data ~= on.model then on.text = on.text .. ', batches on ' .. device.describe(names.data[1], on.data, local_world) end
  return on
end

-- The model of `shape` under the recipe's precision, on `on` (a wick.tensor device): a directory's
-- weights, or initialised from the recipe's seed.
function model.build(shape, config, on)
  local m = config.model
  if m.from_pretrained then
    return pretrained.from_pretrained(m.from_pretrained, { precision = config.precision, device = on,
      recompute = m.recompute })
  end
  if shape.arch == 'llama' then
    local o = {}
    for k, v in pairs(shape.options) do o[k] = v end
    o.precision, o.device, o.seed, o.recompute = config.precision, on, config.seed, m.recompute
    return llama.new(o)
  end
  return gpt.new { vocab = shape.vocab, seq_len = shape.seq_len, layers = shape.layers, heads = shape.heads,
    dim = shape.dim, precision = config.precision, device = on, seed = config.seed, recompute = m.recompute }
end

return model
