-- wick.nn.llama and wick.nn.from_pretrained / save_pretrained against Hugging Face transformers
-- 4.44.2 (build/test/hf-venv over Debian's python3-torch, made by third_party/hf-venv.sh). The oracle,
-- tests/helpers/llama_oracle.py, builds two small random models — Llama 3 (grouped-query attention,
-- llama3 rope scaling, an untied head, f32 shards) and Qwen 2 (q/k/v biases, one KV head, tied
-- embeddings, bf16 shards) — saves them with transformers and computes, in float64, the loss and every
-- gradient on a batch. Wick loads each directory, must give that loss and every gradient within 1e-4
-- relative, then saves the model back (sharded), and transformers must load what Wick wrote and give
-- Wick's logits within 1e-5, and its greedy generate the tokens of Wick's (key/value cached) generate.
-- A checkpoint the trainer writes for a Llama recipe loads in transformers the same way.
local helper = require 'helper'
local gradcheck = require 'helpers.gradcheck'
local wick = require 'wick'
local q = helper.shell_quote

local ORACLE = helper.ROOT .. '/tests/helpers/llama_oracle.py'
local PYTHON = helper.HF_PYTHON
local GRAD_TOL, LOGITS_TOL = 1e-4, 1e-5

local venv_error, root

local function oracle(args)
  local r = helper.sh(('%s %s %s'):format(q(PYTHON), q(ORACLE), args))
  assert(r.rc == 0, 'llama_oracle.py ' .. args .. ' failed:\n' .. r.out .. r.err)
end

setup(function()
  local made
  made, venv_error = helper.hf_python()
  if made then root = helper.tmpdir() end
end)

teardown(function()
  if root then helper.rmtree(root) end
end)

-- max |a - b| relative to max |b| (elementwise ratios would be dominated by near-zero entries).
local function relative_error(a, b)
  assert.are.same(b.shape, a.shape)
  local pa, pb, diff, scale = gradcheck.floats(a), gradcheck.floats(b), 0, 0
  for i = 0, b:numel() - 1 do
    diff = math.max(diff, math.abs(pa[i] - pb[i]))
    scale = math.max(scale, math.abs(pb[i]))
  end
  return diff / scale
end

local function load(path)
  local tensors, err = wick.safetensors.load(path)
  assert(tensors, err)
  return tensors
end

describe('the Llama family against transformers', function()
  for _, style in ipairs({ 'llama3', 'qwen2' }) do
    it(style .. ': loss and every gradient, then the logits of the model Wick saves back', function()
      if venv_error then
        pending('skipped: ' .. venv_error)
        return
      end
      local dir = root .. '/' .. style
      oracle(('make %s %s'):format(q(dir), style))
      local ref = load(dir .. '/reference.safetensors')
      local model = wick.nn.from_pretrained(dir .. '/model')
      local loss = model:forward(ref.inputs, ref.targets)
      local expected = ref.loss:get(1)
      assert.is_true(math.abs(loss - expected) <= GRAD_TOL * math.abs(expected),
        ('loss %.9g, transformers %.9g'):format(loss, expected))
      model:backward()
      local compared = 0
      for name, grad in pairs(model:grads()) do
        local theirs = ref['grad.' .. name]
        assert(theirs, 'transformers has no gradient for ' .. name)
        local err = relative_error(grad, theirs)
        assert(err <= GRAD_TOL, ('%s: relative error %.3g'):format(name, err))
        compared = compared + 1
      end
      local reference_grads = 0
      for name in pairs(ref) do
        if name:match('^grad%.') then reference_grads = reference_grads + 1 end
      end
      assert.are.equal(reference_grads, compared)

      local saved = dir .. '/saved'
      model:save_pretrained(saved, { max_shard_bytes = 16 * 1024 })
      assert.is_not_nil(io.open(saved .. '/model.safetensors.index.json'))
      oracle(('logits %s %s %s'):format(q(saved), q(dir .. '/reference.safetensors'), q(dir .. '/logits.safetensors')))
      local theirs = load(dir .. '/logits.safetensors').logits
      local ours = model:forward(ref.inputs)
      local err = relative_error(ours, theirs)
      assert(err <= LOGITS_TOL, ('logits: relative error %.3g'):format(err))

      local new_tokens = 10
      oracle(('generate %s %s %d %s'):format(q(saved), q(dir .. '/reference.safetensors'), new_tokens,
        q(dir .. '/generated.safetensors')))
      local expected_ids = load(dir .. '/generated.safetensors').ids
      assert.are.same(expected_ids:totable(), model:generate(ref.inputs, { max_new_tokens = new_tokens }):totable())
      model:free()
    end)
  end

  it("a Llama recipe's checkpoint is a directory transformers loads, with the trainer's logits", function()
    if venv_error then
      pending('skipped: ' .. venv_error)
      return
    end
    local data = require('helpers.data').make_dataset(root .. '/recipe-data', require('helpers.data').documents(200, 40, 6),
      { shard_size = 4096 })
    local run = helper.run(('%s --data.sources %s --steps 4 --data.seq_len 16 --checkpoint.every 4 --checkpoint.dir %s ' ..
      '--log.sample 0'):format(q(helper.ROOT .. '/recipes/llama_tiny.lua'), q(data), q(root .. '/recipe-ck')))
    assert.are.equal(0, run.rc, run.err)
    local dir = root .. '/recipe-ck/step-00000004'
    local model = wick.nn.from_pretrained(dir)
    local inputs = wick.tensor.new({ { 1, 7, 3, 49, 0, 12 }, { 5, 5, 8, 2, 31, 9 } }, 'i32')
    wick.safetensors.save(root .. '/recipe-batch.safetensors', { inputs = inputs })
    oracle(('logits %s %s %s'):format(q(dir), q(root .. '/recipe-batch.safetensors'), q(root .. '/recipe-logits.safetensors')))
    local err = relative_error(model:forward(inputs), load(root .. '/recipe-logits.safetensors').logits)
    assert(err <= LOGITS_TOL, ('logits: relative error %.3g'):format(err))
    model:free()
  end)

  it('GPT-2 saved by Wick loads in transformers with the same logits', function()
    if venv_error then
      pending('skipped: ' .. venv_error)
      return
    end
    local model = wick.nn.gpt { vocab = 50, seq_len = 16, layers = 2, heads = 2, dim = 16, seed = 3 }
    for _, p in pairs(model:named_parameters()) do
      if p:dim() == 2 then p:copy(wick.tensor.randn(p.shape, { seed = p:numel(), std = 0.3 })) end
    end
    local dir = root .. '/gpt2'
    model:save_pretrained(dir)
    local inputs = wick.tensor.new({ { 1, 7, 3, 49, 0, 12 }, { 5, 5, 8, 2, 31, 9 } }, 'i32')
    wick.safetensors.save(dir .. '/batch.safetensors', { inputs = inputs })
    oracle(('logits %s %s %s'):format(q(dir), q(dir .. '/batch.safetensors'), q(dir .. '/logits.safetensors')))
    local err = relative_error(model:forward(inputs), load(dir .. '/logits.safetensors').logits)
    assert(err <= LOGITS_TOL, ('logits: relative error %.3g'):format(err))
    model:free()
  end)
end)
