-- wick.nn.llama on its own: shapes and names, option checks, gradients against finite differences,
-- and training with wick.optim. (tests/nn/llama_spec.lua compares it with transformers.)
local wick = require 'wick'
local core = require 'wick.core'
local gradcheck = require 'helpers.gradcheck'
local T = wick.tensor

local function config(overrides)
  local cfg = { vocab = 11, dim = 8, layers = 2, heads = 4, kv_heads = 2, ffn_dim = 12, max_positions = 16,
    rope = { theta = 1000, type = 'llama3', factor = 4, low_freq_factor = 1, high_freq_factor = 4,
      original_max_position_embeddings = 8 } }
  for k, v in pairs(overrides or {}) do cfg[k] = v end
  return cfg
end

local function batch()
  local idx = T.new({ { 1, 5, 2, 9, 3 }, { 4, 4, 0, 7, 10 } }, 'i32')
  local targets = T.new({ { 5, 2, 9, 3, 6 }, { 4, 0, 7, 10, 1 } }, 'i32')
  local mask = T.new({ { 1, 1, 0, 1, 1 }, { 1, 1, 1, 1, 0 } }, 'u8')
  return idx, targets, mask
end

describe('nn.llama', function()
  it('names its parameters like HF LlamaForCausalLM, with [out, in] projections', function()
    local model = wick.nn.llama(config())
    local p = model:named_parameters()
    assert.are.same({ 11, 8 }, p['model.embed_tokens.weight'].shape)
    assert.are.same({ 8, 8 }, p['model.layers.1.self_attn.q_proj.weight'].shape)
    assert.are.same({ 4, 8 }, p['model.layers.1.self_attn.k_proj.weight'].shape)
    assert.are.same({ 12, 8 }, p['model.layers.0.mlp.gate_proj.weight'].shape)
    assert.are.same({ 8, 12 }, p['model.layers.0.mlp.down_proj.weight'].shape)
    assert.are.same({ 8 }, p['model.norm.weight'].shape)
    assert.are.same({ 11, 8 }, p['lm_head.weight'].shape)
    assert.is_nil(p['model.layers.0.self_attn.q_proj.bias'])
    local count = 0
    for _ in pairs(p) do count = count + 1 end
    assert.are.equal(1 + 2 * 9 + 1 + 1, count)
    assert.are.equal(model:parameter_count(), require('wick.nn.llama').parameter_count(model.config))
    local qwen = wick.nn.llama(config({ tie_embeddings = true, qkv_bias = true, kv_heads = 1 }))
    assert.are.equal(qwen:parameter_count(), require('wick.nn.llama').parameter_count(qwen.config))
    assert.is_nil(qwen:named_parameters()['lm_head.weight'])
    assert.are.same({ 2 }, qwen:named_parameters()['model.layers.0.self_attn.k_proj.bias'].shape)
    model:free()
    qwen:free()
  end)

  it('checks its options', function()
    assert.has_error(function() wick.nn.llama(config({ kv_heads = 3 })) end, 'nn.llama: heads 4 is not a multiple of kv_heads 3')
    assert.has_error(function() wick.nn.llama(config({ heads = 8 })) end,
      'nn.llama: dim 8 must be heads 8 times an even head size')
    assert.has_error(function() wick.nn.llama(config({ rope = { type = 'yarn' } })) end)
    assert.has_error(function() wick.nn.llama(config({ rope = { type = 'linear' } })) end)
    assert.has_error(function() wick.nn.llama(config({ kv_head = 2 })) end)
  end)

  for _, variant in ipairs({ { name = 'GQA, untied head' }, { name = 'one KV head, tied, q/k/v biases',
    overrides = { kv_heads = 1, tie_embeddings = true, qkv_bias = true, rope = { theta = 100 } } } }) do
    it('has gradients that match finite differences for every parameter tensor (' .. variant.name .. ')', function()
      local model = wick.nn.llama(config(variant.overrides))
      local idx, targets, mask = batch()
      local inputs = {}
      for _, name in ipairs(model.order) do
        local p = model:named_parameters()[name]
        -- larger weights than the 0.02 init, so every path carries a measurable gradient
        local values = T.randn(p.shape, { seed = #inputs + 1, std = 0.5 })
        p:copy(values)
        values:free()
        inputs[#inputs + 1] = { p, model:grads()[name] }
      end
      local failure = gradcheck.check {
        inputs = inputs,
        samples = 4,
        step = 1e-3,
        loss = function() return model:forward(idx, targets, mask) end,
        backward = function() model:backward() end,
      }
      assert(failure == nil, failure)
      model:free()
    end)
  end

  -- Without a cache: the whole sequence again for each token, the last position's most likely token.
  local function greedy_without_cache(model, prompt, n)
    local rows = prompt:totable()
    for _ = 1, n do
      local logits = model:forward(T.new(rows, 'i32'))
      for b, row in ipairs(rows) do
        local best, best_value = 0, -math.huge
        for v = 1, model.config.vocab do
          local value = logits:get(b, #row, v)
          if value > best_value then best, best_value = v - 1, value end
        end
        row[#row + 1] = best
      end
    end
    return rows
  end

  -- Weights large enough that the greedy tokens are far from ties.
  local function generating_model(overrides)
    local model = wick.nn.llama(config(overrides))
    for _, p in pairs(model:named_parameters()) do
      if p:dim() == 2 then p:copy(T.randn(p.shape, { seed = p:numel(), std = 0.5 })) end
    end
    return model
  end

  it('generates greedily with its key/value cache the tokens a full recomputation picks', function()
    local model = generating_model({ seed = 9 })
    local prompt = T.new({ { 1, 5, 2 }, { 7, 3, 3 } }, 'i32')
    local ids = model:generate(prompt, { max_new_tokens = 8 })
    assert.are.same({ 2, 11 }, ids.shape)
    assert.are.same(greedy_without_cache(model, prompt, 8), ids:totable())
    -- Sampling: the same seed, the same tokens; top_k = 1 is greedy.
    local a = model:generate(prompt, { max_new_tokens = 8, temperature = 1, seed = 5 }):totable()
    assert.are.same(a, model:generate(prompt, { max_new_tokens = 8, temperature = 1, seed = 5 }):totable())
    assert.are_not.same(a, model:generate(prompt, { max_new_tokens = 8, temperature = 1, seed = 6 }):totable())
    assert.are.same(ids:totable(), model:generate(prompt, { max_new_tokens = 8, temperature = 2, top_k = 1 }):totable())
    assert.are.same(ids:totable(), model:generate(prompt, { max_new_tokens = 8, temperature = 2, top_p = 1e-6 }):totable())
    assert.has_error(function() model:generate(prompt, { max_new_tokens = 14 }) end,
      'generate: 3 prompt + 14 new tokens exceed max_positions 16')
    assert.has_error(function() model:generate(prompt, { max_tokens = 2 }) end)
    model:free()
  end)

  it('generates under bf16 with a bf16 key/value cache the tokens a full bf16 recomputation picks', function()
    local model = generating_model({ seed = 9, precision = 'bf16' })
    local caches = model:new_cache(1, 4)
    assert.are.equal('bf16', caches[1].k.dtype)
    local prompt = T.new({ { 1, 5, 2 }, { 7, 3, 3 } }, 'i32')
    local ids = model:generate(prompt, { max_new_tokens = 8 })
    assert.are.same(greedy_without_cache(model, prompt, 8), ids:totable())
    assert.are.equal('bf16', model.logits.dtype)
    model:free()
  end)

  it('computes under bf16 with rounded weights and activations, close to fp32', function()
    local fp32, bf16 = wick.nn.llama(config({ seed = 2 })), wick.nn.llama(config({ seed = 2, precision = 'bf16' }))
    local idx, targets = batch()
    local exact, rounded = fp32:forward(idx, targets), bf16:forward(idx, targets)
    assert.are_not.equal(exact, rounded)
    assert.is_true(math.abs(exact - rounded) < 1e-2 * exact, ('fp32 %g, bf16 %g'):format(exact, rounded))
    -- 2-byte storage: activations and their gradients are bf16, rstd and parameter gradients f32.
    local block = bf16.blocks[1]
    assert.are.equal('bf16', block.mlp.hidden.dtype)
    assert.are.equal('bf16', block.self_attn.qkv.dtype)
    assert.are.equal('f32', block.input_layernorm.rstd.dtype)
    bf16:backward()
    assert.are.equal('bf16', block.self_attn.grad_q_rot.dtype)
    assert.are.equal('f32', block.self_attn.q_proj.grad_weight.dtype)
    local sum = core.ffi.new('double[1]')
    core.check(core.C.wk_op_sumsq(bf16:flat_parameters().grads, sum))
    assert.is_true(sum[0] > 0 and sum[0] < math.huge)
    fp32:free()
    bf16:free()
  end)

  it('trains with wick.optim.adamw: the loss of a fixed batch falls', function()
    local model = wick.nn.llama(config({ seed = 3 }))
    local opt = wick.optim.adamw { lr = 1e-2 }
    local idx, targets = batch()
    local first = model:forward(idx, targets)
    local last
    for _ = 1, 30 do
      model:zero_grad()
      last = model:forward(idx, targets)
      model:backward()
      opt:step(model)
    end
    assert.is_true(last < first / 2, ('loss went from %g to %g'):format(first, last))
    model:free()
  end)
end)
