-- wick.nn.from_pretrained and save_pretrained without transformers: round trips (Llama, Mistral, GPT-2;
-- f32, bf16 and f16 weights; one file or shards) and every way a directory can be wrong, each refused
-- with one message naming the file and what is wrong. (tests/nn/llama_spec.lua checks the numbers
-- against transformers.)
local helper = require 'helper'
local wick = require 'wick'
local json = require 'wick.json'
local T = wick.tensor

local root

setup(function() root = helper.tmpdir() end)
teardown(function() helper.rmtree(root) end)

local function tiny(overrides)
  local cfg = { vocab = 13, dim = 8, layers = 1, heads = 2, kv_heads = 1, ffn_dim = 10, max_positions = 32,
    rope = { theta = 500000, type = 'llama3', factor = 8, low_freq_factor = 1, high_freq_factor = 4,
      original_max_position_embeddings = 16 }, seed = 4 }
  for k, v in pairs(overrides or {}) do cfg[k] = v end
  return wick.nn.llama(cfg)
end

-- Copies per call: a model reads int32 inputs in place and model:free() frees them with its buffers.
local function idx() return T.new({ { 3, 1, 4, 1, 5, 9 } }, 'i32') end
local function targets() return T.new({ { 1, 4, 1, 5, 9, 2 } }, 'i32') end

local count = 0
local function saved(model, opts)
  count = count + 1
  local dir = root .. '/m' .. count
  model:save_pretrained(dir, opts)
  return dir
end

local function edit_config(dir, change)
  local path = dir .. '/config.json'
  local config = assert(json.decode(helper.read_file(path)))
  change(config)
  helper.write_file(path, json.encode(config))
end

local function refused(dir, message)
  local ok, err = pcall(wick.nn.from_pretrained, dir)
  assert.is_false(ok, 'loaded')
  assert.matches(message, err, 1, true)
end

describe('from_pretrained and save_pretrained', function()
  it('round-trip a Llama model through shards: same names, same loss', function()
    local model = tiny()
    local loss = model:forward(idx(), targets())
    local dir = saved(model, { max_shard_bytes = 600 })
    local index = assert(json.decode(helper.read_file(dir .. '/model.safetensors.index.json')))
    local files, shards = {}, 0
    for _, file in pairs(index.weight_map) do
      if not files[file] then shards = shards + 1 end
      files[file] = true
    end
    assert.is_true(shards > 2)
    for k = 1, shards do assert.is_true(files[('model-%05d-of-%05d.safetensors'):format(k, shards)]) end
    local config = assert(json.decode(helper.read_file(dir .. '/config.json')))
    assert.are.equal('LlamaForCausalLM', config.architectures[1])
    assert.are.equal('llama3', config.rope_scaling.rope_type)
    assert.is_not_nil(io.open(dir .. '/generation_config.json'))
    local back = wick.nn.from_pretrained(dir)
    assert.are.equal(loss, back:forward(idx(), targets()))
    assert.are.same(model.order, back.order)
    model:free()
    back:free()
  end)

  it('reads bf16 and f16 weights as the f32 values they hold', function()
    local model = tiny({ tie_embeddings = true })
    local dir = saved(model)
    for _, dtype in ipairs({ 'bf16', 'f16' }) do
      local converted = {}
      for name, p in pairs(model:named_parameters()) do converted[name] = p:to(dtype) end
      wick.safetensors.save(dir .. '/model.safetensors', converted)
      local back = wick.nn.from_pretrained(dir)
      local name = 'model.layers.0.mlp.up_proj.weight'
      local expected = converted[name]:float()
      assert.are.same(expected:totable(), back:named_parameters()[name]:totable())
      assert.are_not.same(model:named_parameters()[name]:totable(), expected:totable())  -- rounded indeed
      back:free()
    end
    -- A tied checkpoint that also stores the head's copy of the embedding loads.
    local tensors = {}
    for name, p in pairs(model:named_parameters()) do tensors[name] = p end
    tensors['lm_head.weight'] = model:named_parameters()['model.embed_tokens.weight']
    wick.safetensors.save(dir .. '/model.safetensors', tensors)
    wick.nn.from_pretrained(dir):free()
    model:free()
  end)

  it('save weights in bf16 or f16 when asked, shards sized by that dtype', function()
    local model = tiny()
    for _, dtype in ipairs({ 'bf16', 'f16' }) do
      local dir = saved(model, { dtype = dtype, max_shard_bytes = 600 })
      local config = assert(json.decode(helper.read_file(dir .. '/config.json')))
      assert.are.equal(dtype == 'bf16' and 'bfloat16' or 'float16', config.torch_dtype)
      local index = assert(json.decode(helper.read_file(dir .. '/model.safetensors.index.json')))
      assert.are.equal(model:parameter_count() * 2, index.metadata.total_size)
      local file = dir .. '/' .. index.weight_map['model.norm.weight']
      assert.are.equal(dtype, assert(wick.safetensors.header(file))['model.norm.weight'].dtype)
      local back = wick.nn.from_pretrained(dir)
      local name = 'model.layers.0.self_attn.o_proj.weight'
      local rounded = model:named_parameters()[name]:to(dtype)
      assert.are.same(rounded:float():totable(), back:named_parameters()[name]:totable())
      back:free()
    end
    assert.has_error(function() model:save_pretrained(root .. '/f64', { dtype = 'f64' }) end)
    model:free()
  end)

  it('load a Mistral config without a sliding window, and refuse one with it', function()
    local dir = saved(tiny({ kv_heads = 2, rope = { theta = 10000 } }))
    edit_config(dir, function(c)
      c.architectures, c.model_type, c.sliding_window = { 'MistralForCausalLM' }, 'mistral', nil
    end)
    local model = wick.nn.from_pretrained(dir)
    assert.are.equal(2, model.config.kv_heads)
    model:free()
    edit_config(dir, function(c) c.sliding_window = 4096 end)
    refused(dir, dir .. '/config.json: sliding_window = 4096 (sliding-window attention is not implemented')
  end)

  it('round-trip GPT-2, which gains a config.json', function()
    local model = wick.nn.gpt { vocab = 13, seq_len = 8, layers = 1, heads = 2, dim = 8, seed = 2 }
    local loss = model:forward(idx(), targets())
    local dir = saved(model)
    local config = assert(json.decode(helper.read_file(dir .. '/config.json')))
    assert.are.equal('GPT2LMHeadModel', config.architectures[1])
    local back = wick.nn.from_pretrained(dir)
    assert.are.equal(loss, back:forward(idx(), targets()))
    model:free()
    back:free()
  end)

  it('refuse a config.json that is not JSON, names an unknown architecture, key or value', function()
    local dir = saved(tiny())
    local config_path = dir .. '/config.json'
    local good = helper.read_file(config_path)
    helper.write_file(config_path, '{"architectures": ["LlamaForCausalLM"],')
    refused(dir, config_path .. ': is not a JSON object')
    local cases = {
      { function(c) c.architectures = { 'FalconForCausalLM' } end,
        "architectures = ['FalconForCausalLM'] is not implemented" },
      { function(c) c.architectures = nil end, 'architectures must name one architecture' },
      { function(c) c.num_local_experts = 8 end, 'num_local_experts = 8: mixture-of-experts models are not implemented' },
      { function(c) c.rope_scaling = { rope_type = 'yarn', factor = 4 } end,
        "rope_scaling.rope_type = 'yarn' is not implemented" },
      { function(c) c.rope_scaling.factor = nil end, "rope type 'llama3' needs factor" },
      { function(c) c.attention_bias = true end, 'attention_bias = true (biases on all four attention projections' },
      { function(c) c.hidden_act = 'gelu' end, "hidden_act = 'gelu' (only silu)" },
      { function(c) c.num_attention_heads = 2.5 end, 'num_attention_heads' },
      { function(c) c.vocab_size = 'many' end, 'vocab_size' },
      { function(c) c.hidden_size = -8 end, 'hidden_size' },
      { function(c) c.num_key_value_heads = 3 end, 'heads 2 is not a multiple of kv_heads 3' },
      { function(c) c.head_dim = 2 end, 'head_dim = 2 (must be hidden_size / num_attention_heads = 4)' },
      { function(c) c.vocab_sise = 13 end, 'vocab_sise' },
    }
    for _, case in ipairs(cases) do
      helper.write_file(config_path, good)
      edit_config(dir, case[1])
      refused(dir, config_path .. ': ')
      refused(dir, case[2])
    end
    helper.write_file(config_path, good)
    edit_config(dir, function(c) c.architectures, c.use_sliding_window = { 'Qwen2ForCausalLM' }, true end)
    refused(dir, 'use_sliding_window = true (sliding-window attention is not implemented)')
  end)

  it('refuse an index that names a missing shard or a file outside the directory', function()
    local dir = saved(tiny(), { max_shard_bytes = 600 })
    local index_path = dir .. '/model.safetensors.index.json'
    local good = helper.read_file(index_path)
    for _, bad in ipairs({ '../x.safetensors', '/etc/passwd', 'sub/x.safetensors', '..' }) do
      local index = assert(json.decode(good))
      index.weight_map['model.norm.weight'] = bad
      helper.write_file(index_path, json.encode(index))
      refused(dir, ("%s: weight_map['model.norm.weight'] = \"%s\" is not a file name in this directory"):format(
        index_path, bad))
    end
    local shard = assert(json.decode(good)).weight_map['model.norm.weight']
    os.remove(dir .. '/' .. shard)
    helper.write_file(index_path, good)
    refused(dir, dir .. '/' .. shard)
    helper.write_file(index_path, '[1, 2]')
    refused(dir, index_path .. ': is not a JSON object')
  end)

  it('name a missing, extra or wrongly shaped weight, and a header that lies', function()
    local model = tiny()
    local dir = saved(model)
    local file = dir .. '/model.safetensors'
    local function write(change)
      local tensors = {}
      for name, p in pairs(model:named_parameters()) do tensors[name] = p end
      change(tensors)
      wick.safetensors.save(file, tensors)
    end
    write(function(t) t['model.norm.weight'] = nil end)
    refused(dir, 'missing model.norm.weight')
    write(function(t) t['model.layers.0.self_attn.rotary_emb.inv_freq'] = T.zeros({ 2 }) end)
    wick.nn.from_pretrained(dir):free()  -- an old checkpoint's frequency buffer is not a weight
    write(function(t) t['model.layers.0.self_attn.q_proj.bias'] = T.zeros({ 8 }) end)
    refused(dir, file .. ': unexpected model.layers.0.self_attn.q_proj.bias')
    write(function(t) t['model.layers.0.mlp.up_proj.weight'] = T.zeros({ 8, 10 }) end)
    refused(dir, file .. ': model.layers.0.mlp.up_proj.weight is [8, 10], the model needs [10, 8]')
    write(function(t) t['model.norm.weight'] = T.zeros({ 8 }, 'i32') end)
    refused(dir, file .. ': model.norm.weight is i32 (weights must be f32, bf16 or f16)')
    -- A header whose data_offsets give a tensor more bytes than its shape needs.
    write(function() end)
    local bytes = helper.read_file(file)
    local lying = bytes:gsub('"data_offsets":%[0,(%d+)%]', function(n) return '"data_offsets":[0,' .. (n + 4) .. ']' end, 1)
    assert.are_not.equal(bytes, lying)
    helper.write_file(file, lying)
    refused(dir, file .. ": tensor '")
    refused(dir, 'needs')
    model:free()
  end)

  it('check their options', function()
    local model = tiny()
    assert.has_error(function() model:save_pretrained(root .. '/opts', { max_shard_bytes = 0 }) end)
    assert.has_error(function() model:save_pretrained(root .. '/opts', { max_shard = 10 }) end)
    assert.has_error(function() wick.nn.from_pretrained(root, { devise = 'cpu' }) end)
    model:free()
  end)
end)
