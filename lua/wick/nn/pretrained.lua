-- wick.nn.pretrained: Hugging Face model directories, read and written.
--   wick.nn.from_pretrained(dir [, { device =, precision =, recompute = }]) -> a wick.nn.llama or wick.nn.gpt model
--   model:save_pretrained(dir [, { max_shard_bytes =, dtype = 'f32'|'bf16'|'f16', weights = true }])
--     -- config.json, weights (f32 unless dtype says; none with weights = false), generation_config.json
-- A directory holds config.json and either model.safetensors or a sharded checkpoint
-- (model.safetensors.index.json naming model-0000k-of-0000n.safetensors files beside it). Weights of
-- f32, bf16 or f16 are converted to the model's f32 straight from a mapping of each file, one tensor at
-- a time. What this file knows of HF's config keys (which architectures, what each key means, what is
-- not implemented) lives here and nowhere else: from_pretrained and save_pretrained read the same tables.
-- Every failure is one error naming the file and what is wrong with it.
local ffi = require 'ffi'
local core = require 'wick.core'
local gpt = require 'wick.nn.gpt'
local llama = require 'wick.nn.llama'
local json = require 'wick.json'
local safetensors = require 'wick.safetensors'
local schema = require 'wick.schema'

local pretrained = {}

local CONFIG, INDEX, SINGLE = 'config.json', 'model.safetensors.index.json', 'model.safetensors'
local GENERATION_CONFIG = 'generation_config.json'
local DEFAULT_MAX_SHARD_BYTES = 5 * 1000 ^ 3  -- transformers' default, "5GB"
local WEIGHT_DTYPES = { f32 = true, bf16 = true, f16 = true }
local TRANSFORMERS_VERSION = '4.44.2'  -- the version the files are checked against (tests/nn/llama_spec.lua)

pcall(ffi.cdef, 'int mkdir(const char *path, unsigned int mode);')
pcall(ffi.cdef, 'char *strerror(int errnum);')
local EEXIST, DIRECTORY_MODE = 17, tonumber('755', 8)

local function fail(path, fmt, ...) error(('%s: ' .. fmt):format(path, ...), 0) end

local function read_json(path)
  local f, why = io.open(path, 'rb')
  if not f then fail(path, 'cannot be read (%s)', why) end
  local text = f:read('*a')
  f:close()
  local value, err = json.decode(text)
  if type(value) ~= 'table' or value[1] ~= nil then fail(path, 'is not a JSON object (%s)', err or 'another value') end
  return value
end

local function write_file(path, text)
  local ok, why = core.write_file(path, text)
  if not ok then error('save_pretrained: cannot write ' .. why, 0) end
end

-- ---- config.json of each architecture ---------------------------------------------------------------

-- Keys that describe a checkpoint without changing the model: read and ignored. Wick trains without
-- dropout, so dropout rates are ignored too.
local INFORMATIONAL = { '_name_or_path', 'architectures', 'model_type', 'torch_dtype', 'transformers_version',
  'use_cache', 'bos_token_id', 'eos_token_id', 'pad_token_id', 'initializer_range', 'attention_dropout',
  'pretraining_tp', '_attn_implementation_autoset' }

-- Keys of mixture-of-experts configs (Mixtral, Qwen 2 MoE): refused by name, not as mere unknowns.
local MOE_KEYS = { 'num_local_experts', 'num_experts', 'num_experts_per_tok', 'moe_intermediate_size',
  'shared_expert_intermediate_size', 'router_aux_loss_coef', 'output_router_logits', 'decoder_sparse_step',
  'norm_topk_prob', 'mlp_only_layers', 'router_jitter_noise' }

local function option_list(own)
  local list = {}
  for _, o in ipairs(own) do list[#list + 1] = o end
  for _, key in ipairs(INFORMATIONAL) do list[#list + 1] = { key, 'any', check = function() return true end } end
  return list
end

-- A size: a whole number in [1, 2^31).
local function int(key, required) return { key, 'integer', min = 1, max = 2 ^ 31 - 1, required = required } end

local LLAMA_CONFIG = schema.define('config.json key', option_list({
  int('vocab_size', true), int('hidden_size', true), int('intermediate_size', true),
  int('num_hidden_layers', true), int('num_attention_heads', true), int('num_key_value_heads'),
  int('max_position_embeddings'), int('head_dim'),
  { 'rms_norm_eps', 'number', min = 1e-12, max = 1 },
  { 'rope_theta', 'number', min = 1e-6, max = 1e12 },
  { 'rope_scaling', 'table' },
  { 'tie_word_embeddings', 'boolean' },
  { 'attention_bias', 'boolean' }, { 'mlp_bias', 'boolean' },
  { 'hidden_act', 'string' },
  { 'sliding_window', 'integer', min = 0, max = 2 ^ 31 - 1 }, { 'use_sliding_window', 'boolean' },
  { 'max_window_layers', 'integer', min = 0, max = 2 ^ 31 - 1 },
}))

-- Per architecture: the class defaults of transformers that a config.json may leave out, and what
-- it does not have.
local LLAMA_FAMILY = {
  LlamaForCausalLM = { model_type = 'llama', kv_heads = nil, rms_eps = 1e-6, qkv_bias = false },
  MistralForCausalLM = { model_type = 'mistral', kv_heads = 8, rms_eps = 1e-6, qkv_bias = false },
  Qwen2ForCausalLM = { model_type = 'qwen2', kv_heads = 32, rms_eps = 1e-6, qkv_bias = true },
}

-- The first setting of a key that Wick cannot honour, as "key = value (why)", or nil.
local function unsupported(arch, c)
  if c.hidden_act ~= nil and c.hidden_act ~= 'silu' then return ("hidden_act = '%s' (only silu)"):format(c.hidden_act) end
  if c.attention_bias then return 'attention_bias = true (biases on all four attention projections are not implemented)' end
  if c.mlp_bias then return 'mlp_bias = true (feed-forward biases are not implemented)' end
  if arch == 'Qwen2ForCausalLM' and c.use_sliding_window then return 'use_sliding_window = true (sliding-window attention is not implemented)' end
  if arch == 'MistralForCausalLM' and c.sliding_window ~= nil then
    return 'sliding_window = ' .. c.sliding_window .. ' (sliding-window attention is not implemented; null turns it off)'
  end
  if c.head_dim and c.head_dim * c.num_attention_heads ~= c.hidden_size then
    return ('head_dim = %d (must be hidden_size / num_attention_heads = %g)'):format(c.head_dim, c.hidden_size / c.num_attention_heads)
  end
end

local ROPE_SCALING = schema.define('config.json rope_scaling key', {
  { 'rope_type', 'string' }, { 'type', 'string' },
  { 'factor', 'number', min = 1e-6, max = 1e6 },
  { 'low_freq_factor', 'number', min = 1e-6, max = 1e6 }, { 'high_freq_factor', 'number', min = 1e-6, max = 1e6 },
  { 'original_max_position_embeddings', 'integer', min = 1, max = 2 ^ 31 - 1 },
})

-- HF's rope_theta and rope_scaling -> nn.llama's rope option.
local function rope_option(path, c)
  local rope = { theta = c.rope_theta or 10000, type = 'default' }
  local s = c.rope_scaling
  if s == nil then return rope end
  local ok, err = pcall(ROPE_SCALING.check, ROPE_SCALING, s, 0)
  if not ok then fail(path, 'rope_scaling: %s', err) end
  local kind = s.rope_type or s.type or 'default'
  if not llama.ROPE_KINDS[kind] then
    fail(path, "rope_scaling.rope_type = '%s' is not implemented (default, linear, llama3)", kind)
  end
  rope.type = kind
  for _, key in ipairs({ 'factor', 'low_freq_factor', 'high_freq_factor', 'original_max_position_embeddings' }) do
    rope[key] = s[key]
  end
  return rope
end

-- Raises, naming the file, on an MoE key or on any key the architecture's schema refuses.
local function check_keys(keys, path, c)
  for _, key in ipairs(MOE_KEYS) do
    if c[key] ~= nil then fail(path, '%s = %s: mixture-of-experts models are not implemented', key, tostring(c[key])) end
  end
  local ok, err = pcall(keys.check, keys, c, 0)
  if not ok then fail(path, '%s', err) end
end

local function llama_options(path, arch, c)
  check_keys(LLAMA_CONFIG, path, c)
  local family = LLAMA_FAMILY[arch]
  local why = unsupported(arch, c)
  if why then fail(path, '%s', why) end
  return {
    vocab = c.vocab_size, dim = c.hidden_size, layers = c.num_hidden_layers, heads = c.num_attention_heads,
    kv_heads = c.num_key_value_heads or family.kv_heads, ffn_dim = c.intermediate_size,
    rms_eps = c.rms_norm_eps or family.rms_eps, rope = rope_option(path, c),
    max_positions = c.max_position_embeddings, tie_embeddings = c.tie_word_embeddings or false,
    qkv_bias = family.qkv_bias,
  }
end

local GPT2_CONFIG = schema.define('config.json key', option_list({
  int('vocab_size', true), int('n_embd', true), int('n_layer', true), int('n_head', true), int('n_positions', true),
  int('n_ctx'),
  { 'layer_norm_epsilon', 'number', min = 1e-5, max = 1e-5, help = 'the layernorm eps Wick uses' },
  { 'activation_function', 'enum', values = { 'gelu_new' } },
  { 'n_inner', 'integer', min = 0, max = 0, help = 'null: 4 * n_embd' },
  { 'scale_attn_weights', 'boolean' }, { 'scale_attn_by_inverse_layer_idx', 'boolean' },
  { 'reorder_and_upcast_attn', 'boolean' }, { 'tie_word_embeddings', 'boolean' },
  { 'attn_pdrop', 'number' }, { 'embd_pdrop', 'number' }, { 'resid_pdrop', 'number' },
  { 'summary_activation', 'any', check = function() return true end },
  { 'summary_first_dropout', 'number' }, { 'summary_proj_to_labels', 'boolean' },
  { 'summary_type', 'string' }, { 'summary_use_proj', 'boolean' },
  { 'task_specific_params', 'table' }, { 'n_special', 'integer' }, { 'predict_special_tokens', 'boolean' },
}))

local function gpt2_options(path, c)
  check_keys(GPT2_CONFIG, path, c)
  if c.scale_attn_weights == false or c.scale_attn_by_inverse_layer_idx or c.tie_word_embeddings == false then
    fail(path, 'scale_attn_weights = false, scale_attn_by_inverse_layer_idx = true and tie_word_embeddings = false are not implemented')
  end
  return { vocab = c.vocab_size, dim = c.n_embd, layers = c.n_layer, heads = c.n_head, seq_len = c.n_positions }
end

-- ---- weights ------------------------------------------------------------------------------------------

-- A shard's name from the index: a plain file name beside the index, nothing that leaves the directory.
local function shard_name(index_path, tensor, file)
  if type(file) ~= 'string' or file == '' or file:find('/', 1, true) or file == '.' or file == '..' then
    fail(index_path, "weight_map['%s'] = %s is not a file name in this directory", tensor, json.encode(file))
  end
  return file
end

-- { tensor name = file path } from the index or the single file's header, and the open readers.
local function weight_files(dir)
  local index_path = dir .. '/' .. INDEX
  local readers, where = {}, {}
  local function reader(file)
    if not readers[file] then
      local r, err = safetensors.open(dir .. '/' .. file)
      if not r then error(err, 0) end
      readers[file] = r
    end
    return readers[file]
  end
  local index_file = io.open(index_path, 'rb')
  if index_file then
    index_file:close()
    local index = read_json(index_path)
    if type(index.weight_map) ~= 'table' or index.weight_map[1] ~= nil then
      fail(index_path, 'has no weight_map object')
    end
    for name, file in pairs(index.weight_map) do where[name] = reader(shard_name(index_path, name, file)) end
    for file, r in pairs(readers) do
      for name in pairs(r.entries) do
        if where[name] ~= r then fail(r.path, "holds '%s', which %s does not place in %s", name, INDEX, file) end
      end
    end
  else
    local r = reader(SINGLE)
    for name in pairs(r.entries) do where[name] = r end
  end
  return where, readers
end

local function same_shape(a, b) return table.concat(a, ',') == table.concat(b, ',') end

-- Copies every parameter of model from the files; source(name) lists the names a parameter may
-- have in a file, ignored(name, model) says which other tensors a file may hold.
local function load_weights(dir, model, source, ignored)
  local where, readers = weight_files(dir)
  local ok, err = pcall(function()
    local used, problems = {}, {}
    for _, name in ipairs(model.order) do
      local found
      for _, candidate in ipairs(source(name)) do
        if where[candidate] then found = candidate break end
      end
      local target, r = model:named_parameters()[name], where[found]
      local info = r and r.entries[found]
      if not r then
        problems[#problems + 1] = 'missing ' .. name
      elseif not info then
        problems[#problems + 1] = ('%s: the index places %s in this file, which lacks it'):format(r.path, found)
      elseif not WEIGHT_DTYPES[info.dtype] then
        problems[#problems + 1] = ('%s: %s is %s (weights must be f32, bf16 or f16)'):format(r.path, found, info.dtype)
      elseif not same_shape(info.shape, target.shape) then
        problems[#problems + 1] = ('%s: %s is [%s], the model needs [%s]'):format(r.path, found,
          table.concat(info.shape, ', '), table.concat(target.shape, ', '))
      else
        local view = r:view(found)
        target:copy(view)
        view:free()
        used[found] = true
      end
    end
    for name, r in pairs(where) do
      if not used[name] and not ignored(name, model) then problems[#problems + 1] = ('%s: unexpected %s'):format(r.path, name) end
    end
    if #problems > 0 then
      table.sort(problems)
      error(('%s does not fit the model of its %s: %s'):format(dir, CONFIG, table.concat(problems, '; ')), 0)
    end
  end)
  for _, r in pairs(readers) do r:close() end
  if not ok then error(err, 0) end
  if model.flat.compute ~= model.flat.params then model.flat.compute:copy(model.flat.params) end
  return model
end

local function exact(name) return { name } end
-- Older checkpoints keep RoPE's frequencies as buffers; some tied ones keep the head's copy of the embedding.
local function llama_ignored(name, model)
  return name:match('%.rotary_emb%.inv_freq$') ~= nil or (name == 'lm_head.weight' and model.config.tie_embeddings)
end

local GPT2_PREFIX = 'transformer.'
local function gpt2_source(name) return { name, name:sub(#GPT2_PREFIX + 1) } end
local GPT2_IGNORED = { ['attn.bias'] = true, ['attn.masked_bias'] = true }
local function gpt2_ignored(name) return name == 'lm_head.weight' or GPT2_IGNORED[name:match('attn%.[%w_]+$') or ''] end

-- ---- from_pretrained ------------------------------------------------------------------------------------

local LOAD_OPTIONS = schema.define('from_pretrained option', {
  { 'device', 'string', help = "'cpu' or 'cuda:N'" },
  { 'precision', 'precision', check = require('wick.precision').check, help = "'fp32', 'bf16' or 'fp16'" },
  schema.from(gpt.OPTIONS, 'recompute'),
})

-- What a directory's config.json describes: the family ('llama' or 'gpt2'), the options of its model
-- (wick.nn.llama's or wick.nn.gpt's, unchecked by the model yet) and how its files name the weights.
local function read_config(dir)
  local config_path = dir .. '/' .. CONFIG
  local c = read_json(config_path)
  local archs = c.architectures
  if type(archs) ~= 'table' or #archs ~= 1 or type(archs[1]) ~= 'string' then
    fail(config_path, 'architectures must name one architecture, got %s', json.encode(archs))
  end
  local arch = archs[1]
  local found = { path = config_path, architecture = arch, hf = c }
  if LLAMA_FAMILY[arch] then
    found.family, found.new, found.source, found.ignored = 'llama', llama.new_uninitialised, exact, llama_ignored
    found.options = llama_options(config_path, arch, c)
  elseif arch == 'GPT2LMHeadModel' then
    found.family, found.new, found.source, found.ignored = 'gpt2', gpt.new, gpt2_source, gpt2_ignored
    found.options = gpt2_options(config_path, c)
  else
    fail(config_path, "architectures = ['%s'] is not implemented (LlamaForCausalLM, MistralForCausalLM, "
      .. 'Qwen2ForCausalLM, GPT2LMHeadModel)', arch)
  end
  return found
end

-- The family and model options of dir's config.json, read and checked as from_pretrained reads
-- them, without the weights (the dry run plans a fine-tune from this).
function pretrained.config(dir)
  if type(dir) ~= 'string' then error('from_pretrained: dir must be a directory path', 2) end
  local found = read_config(dir)
  return { family = found.family, options = found.options }
end

function pretrained.from_pretrained(dir, opts)
  if type(dir) ~= 'string' then error('from_pretrained: dir must be a directory path', 2) end
  opts = LOAD_OPTIONS:check(opts or {}, 2)
  local found = read_config(dir)
  local model_opts = found.options
  model_opts.device, model_opts.precision, model_opts.recompute = opts.device, opts.precision, opts.recompute
  local ok, model = pcall(found.new, model_opts)  -- the model's own checks (head counts, rope) name the file too
  if not ok then fail(found.path, '%s', model) end
  local c = found.hf
  model.hf = { architecture = found.architecture, bos_token_id = c.bos_token_id, eos_token_id = c.eos_token_id }
  local loaded, err = pcall(load_weights, dir, model, found.source, found.ignored)
  if not loaded then
    model:free()
    error(err, 2)
  end
  return model
end

-- The token ids that end generation by dir's generation_config.json: its eos_token_id (an id or a list
-- of them, as transformers writes either), each below vocab; none when the file or the key is absent.
function pretrained.stop_ids(dir, vocab)
  if type(dir) ~= 'string' then error('stop_ids: dir must be a directory path', 2) end
  if type(vocab) ~= 'number' or vocab % 1 ~= 0 or vocab < 1 then error('stop_ids: vocab must be a positive integer', 2) end
  local path = dir .. '/' .. GENERATION_CONFIG
  local f = io.open(path, 'rb')
  if not f then return {} end
  f:close()
  local eos = read_json(path).eos_token_id
  local ids = type(eos) == 'table' and eos or { eos }
  for i, id in pairs(ids) do
    if type(i) ~= 'number' or type(id) ~= 'number' or id % 1 ~= 0 or id < 0 or id > 2 ^ 31 - 1 then
      fail(path, 'eos_token_id must be a token id or a list of them, got %s', json.encode(eos))
    end
    if id >= vocab then fail(path, 'eos_token_id %d is not below the model vocab %d', id, vocab) end
  end
  return ids
end

-- ---- save_pretrained ------------------------------------------------------------------------------------

-- config.json of each model class, with the keys from_pretrained reads back.
local function llama_config(model)
  local cfg, hf = model.config, model.hf or {}
  local arch = hf.architecture or (cfg.qkv_bias and 'Qwen2ForCausalLM' or 'LlamaForCausalLM')
  if cfg.qkv_bias and arch ~= 'Qwen2ForCausalLM' then
    error('save_pretrained: q/k/v biases exist only in Qwen2ForCausalLM, not ' .. arch, 0)
  end
  local r = cfg.rope
  local scaling = r.type ~= 'default' and { rope_type = r.type, factor = r.factor, low_freq_factor = r.low_freq_factor,
    high_freq_factor = r.high_freq_factor, original_max_position_embeddings = r.original_max_position_embeddings } or nil
  return {
    architectures = { arch }, model_type = LLAMA_FAMILY[arch].model_type, vocab_size = cfg.vocab,
    hidden_size = cfg.dim, intermediate_size = cfg.ffn_dim, num_hidden_layers = cfg.layers,
    num_attention_heads = cfg.heads, num_key_value_heads = cfg.kv_heads, rms_norm_eps = cfg.rms_eps,
    rope_theta = r.theta, rope_scaling = scaling, max_position_embeddings = cfg.max_positions,
    tie_word_embeddings = cfg.tie_embeddings, hidden_act = 'silu', attention_bias = false, mlp_bias = false,
    use_sliding_window = arch == 'Qwen2ForCausalLM' and false or nil,
    bos_token_id = hf.bos_token_id, eos_token_id = hf.eos_token_id, transformers_version = TRANSFORMERS_VERSION,
  }
end

local function gpt2_config(model)
  local cfg, hf = model.config, model.hf or {}
  return {
    architectures = { 'GPT2LMHeadModel' }, model_type = 'gpt2', vocab_size = cfg.vocab, n_embd = cfg.dim,
    n_layer = cfg.layers, n_head = cfg.heads, n_positions = cfg.seq_len, n_ctx = cfg.seq_len,
    layer_norm_epsilon = 1e-5, activation_function = 'gelu_new', attn_pdrop = 0, embd_pdrop = 0, resid_pdrop = 0,
    bos_token_id = hf.bos_token_id, eos_token_id = hf.eos_token_id, transformers_version = TRANSFORMERS_VERSION,
  }
end

-- The dtypes weights may be saved in: bytes an element and torch's name (config.json's torch_dtype).
local SAVE_DTYPES = { f32 = { 4, 'float32' }, bf16 = { 2, 'bfloat16' }, f16 = { 2, 'float16' } }

local SAVE_OPTIONS = schema.define('save_pretrained option', {
  { 'max_shard_bytes', 'integer', min = 1, max = 2 ^ 53, default = DEFAULT_MAX_SHARD_BYTES,
    help = 'weights beyond this many bytes go to further shards, with an index' },
  { 'dtype', 'enum', values = { 'f32', 'bf16', 'f16' }, default = 'f32', help = 'the dtype the weights are saved in' },
  { 'weights', 'boolean', default = true,
    help = 'false: config.json and generation_config.json only, beside weights the caller writes' },
})

local function make_directory(dir)
  if ffi.C.mkdir(dir, DIRECTORY_MODE) ~= 0 and ffi.errno() ~= EEXIST then
    error(("save_pretrained: cannot create '%s': %s"):format(dir, ffi.string(ffi.C.strerror(ffi.errno()))), 0)
  end
end

-- Groups the parameters, in the model's flat order, into shards of at most max_bytes (a larger
-- tensor alone) of elements of elem_bytes: lists of entries (wick.nn.gpt's flatten).
local function shards(model, max_bytes, elem_bytes)
  local out, current, bytes = {}, nil, 0
  for _, p in ipairs(model.entries) do
    local size = p.numel * elem_bytes
    if not current or (bytes > 0 and bytes + size > max_bytes) then
      current, bytes = {}, 0
      out[#out + 1] = current
    end
    current[#current + 1] = p
    bytes = bytes + size
  end
  return out
end

-- One weights file of dtype: each tensor of another dtype (the f32 masters, or a compute copy that
-- stands for released masters) converted first, one shard's worth at a time.
local function save_shard(path, model, group, dtype)
  local stored, converted = {}, {}
  for _, p in ipairs(group) do
    local t = model:named_parameters()[p.name]
    stored[p.name] = t.dtype == dtype and t or t:to(dtype)
    if stored[p.name] ~= t then converted[#converted + 1] = stored[p.name] end
  end
  safetensors.save(path, stored, { format = 'pt' })
  for _, t in ipairs(converted) do t:free() end
end

local function save_pretrained(model, dir, hf_config, opts)
  if type(dir) ~= 'string' then error('save_pretrained: dir must be a directory path', 3) end
  opts = SAVE_OPTIONS:check(opts or {}, 3)
  make_directory(dir)
  local config = hf_config(model)
  local elem_bytes, torch_dtype = unpack(SAVE_DTYPES[opts.dtype])
  config.torch_dtype = torch_dtype
  local groups = shards(model, opts.max_shard_bytes, elem_bytes)
  local total = model:parameter_count() * elem_bytes
  if opts.weights and #groups == 1 then
    save_shard(dir .. '/' .. SINGLE, model, groups[1], opts.dtype)
  elseif opts.weights then
    local weight_map = {}
    for k, group in ipairs(groups) do
      local file = ('model-%05d-of-%05d.safetensors'):format(k, #groups)
      save_shard(dir .. '/' .. file, model, group, opts.dtype)
      for _, p in ipairs(group) do weight_map[p.name] = file end
    end
    write_file(dir .. '/' .. INDEX, json.encode({ metadata = { total_size = total }, weight_map = weight_map }) .. '\n')
  end
  write_file(dir .. '/' .. GENERATION_CONFIG, json.encode({ _from_model_config = true, bos_token_id = config.bos_token_id,
    eos_token_id = config.eos_token_id, transformers_version = TRANSFORMERS_VERSION }) .. '\n')
  write_file(dir .. '/' .. CONFIG, json.encode(config) .. '\n')  -- last: a directory with a config is complete
  return dir
end

function llama.Llama:save_pretrained(dir, opts) return save_pretrained(self, dir, llama_config, opts) end
function gpt.GPT:save_pretrained(dir, opts) return save_pretrained(self, dir, gpt2_config, opts) end

return pretrained
