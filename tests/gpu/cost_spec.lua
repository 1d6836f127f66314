-- wick.nn.cost: the formulas behind the log's MFU, `make bench`'s GPU design figures and
-- `make gpu-check`'s MFU, checked against a real model and GPT-2's published size.
local helper = require 'helper'
local cost = require 'wick.nn.cost'
local wick = require 'wick'

local GPT2_124M = { layers = 12, heads = 12, dim = 768, vocab = 50304, seq_len = 1024 }

describe('wick.nn.cost', function()
  it('counts the parameters wick.nn.gpt allocates', function()
    local shape = { layers = 2, heads = 2, dim = 8, vocab = 13, seq_len = 6 }
    local model = wick.nn.gpt(shape)
    assert.are.equal(model:parameter_count(), cost.parameter_count(shape))
  end)

  it("gives GPT-2 124M llm.c's parameter count and 6N + 6LC(T + 1) FLOPs a token, attention causal", function()
    local P = cost.parameter_count(GPT2_124M)
    assert.are.equal(124475904, P)  -- llm.c's train_gpt2cu with the vocabulary padded to 50304
    assert.are.equal(6 * P + 6 * 12 * 768 * 1025, cost.flops_per_token(GPT2_124M, 1024))
    -- 468K tokens/s on a 989 TFLOP/s H100: about 38.0% (40.7% with the full T x T square)
    assert.is_true(math.abs(cost.mfu(GPT2_124M, 1024, 468e3, 989e12) - 0.380) < 0.001)
  end)

  it('counts a small shape by hand: causal query t attends t keys, the trained T, not the model\'s positions', function()
    -- L = 2, C = 8, trained on rows of T = 4 in a model of 64 positions. Per layer and row, QK^T and
    -- PV forward take 2 C FLOPs per (query, key) pair kept by the mask, 1 + 2 + 3 + 4 = 10 pairs:
    -- 2 * 2 * 8 * 10 = 320 forward, 960 with backward's 2x, 1920 over both layers, 480 a token.
    local shape = { layers = 2, heads = 2, dim = 8, vocab = 13, seq_len = 64 }
    assert.are.equal(480, cost.attention_flops_per_token(shape, 4))
    local P = cost.parameter_count(shape)
    assert.are.equal(6 * P + 480, cost.flops_per_token(shape, 4))
    assert.are.equal((6 * P + 480) * 1000 / 1e9, cost.mfu(shape, 4, 1000, 1e9))
  end)

  it('counts a Llama-3.2-1B shape at data.seq_len 512 by its rows, not its 131072 positions', function()
    local model = require 'wick.train.model'
    local shape = { arch = 'llama', vocab = 128256, seq_len = 131072, layers = 16, heads = 32, kv_heads = 8,
      dim = 2048, ffn_dim = 8192, tie_embeddings = true, qkv_bias = false }
    local P = model.parameter_count(shape)
    assert.are.equal(1235814400, P)  -- meta-llama/Llama-3.2-1B's published count
    local flops = model.flops_per_token(shape, 512)
    assert.are.equal(6 * P + 6 * 16 * 2048 * 513, flops)
    -- the old count, 6N + 12 L C (max positions), was 7.8x this
    local old = 6 * P + 12 * 16 * 2048 * 131072
    assert.is_true(old / flops > 7.7 and old / flops < 7.9)
    assert.are.equal(flops * 2e4 / 989e12, model.mfu(shape, 512, 2e4, 989e12))
  end)

  it('lists the bytes a step moves kernel by kernel, the weights and moments counted where they move', function()
    local kernels, total = cost.bytes_per_step(GPT2_124M, 16)
    local by, sum = {}, 0
    for _, k in ipairs(kernels) do
      by[k.name] = k.bytes
      sum = sum + k.bytes
    end
    assert.are.equal(sum, total)
    assert.are.equal(4 * 7 * 124475904, by.adamw)  -- p, g, m, v read; p, m, v written
    -- the (B, NH, T, T) probabilities (f32 here) are written once and read once: twice 805 MB a layer at least
    assert.is_true(by['causal softmax'] >= 12 * 2 * 4 * 16 * 12 * 1024 * 1024)
    -- twice the micro batch moves twice the activations; the weights' share stays
    local _, double = cost.bytes_per_step(GPT2_124M, 32)
    assert.is_true(double > 1.9 * total - by.adamw and double < 2 * total)
    -- 2-byte storage halves what the activations (the probabilities too) move, not the f32 optimizer
    local _, bf16 = cost.bytes_per_step(GPT2_124M, 16, 2)
    assert.are.equal((total - by.adamw) / 2 + by.adamw, bf16)
  end)

  it('counts the fused residual add + layernorm as the add and the norm it replaces, less a read of x1', function()
    local by = {}
    for _, k in ipairs(cost.kernels(GPT2_124M, 16)) do by[k.name] = k end
    local pass = 4 * 16 * 1024 * 768  -- one f32 pass over [B, T, C]
    assert.are.equal(by['residual add'].bytes + by.layernorm.bytes - pass, by['residual add + layernorm'].bytes)
    assert.are.equal(2 * 12 + 1, by.layernorm.calls + by['residual add + layernorm'].calls)  -- ln_1, ln_2, ln_f
    local forward, backward = cost.residual_fusion_saving(GPT2_124M, 16)
    assert.are.equal(12 * pass, forward)
    assert.are.equal(6 * 12 * pass, backward)  -- the copy, the add and the zero fill of a block's backward
  end)

  it('gives the linear layers 2 FLOPs per row and weight', function()
    local N, C, V = 16 * 1024, 768, GPT2_124M.vocab
    local linear = 0
    for _, k in ipairs(cost.kernels(GPT2_124M, 16)) do
      if not k.name:find('^attention [QP]') then linear = linear + k.flops * k.calls end
    end
    assert.are.equal(2 * N * (12 * 12 * C * C + V * C), linear)
  end)

  it('computes the figures docs/gpu.md quotes for GPT-2 124M at B = 16, T = 1024', function()
    local shape = { layers = 12, heads = 12, dim = 768, vocab = 50257, seq_len = 1024 }  -- the doc's V
    local doc = helper.read_file(helper.ROOT .. '/docs/gpu.md')
    assert.truthy(doc:find(('| forward | | %.1f |'):format(cost.forward_flops(shape, 16) / 1e9), 1, true))
    for _, k in ipairs(cost.kernels(shape, 16)) do
      if k.name == 'cross-entropy backward' then
        assert.truthy(doc:find(('| %d |'):format(math.floor(k.bytes / 1e6 + 0.5)), 1, true))
      end
      if k.name == 'residual add + layernorm' then
        assert.truthy(doc:find(('| residual add + layernorm forward | 4·N·C·4 | %d |'):format(math.floor(k.bytes / 1e6 + 0.5)), 1, true))
      end
    end
    local forward, backward = cost.residual_fusion_saving(shape, 16)
    local forward_bf16, backward_bf16 = cost.residual_fusion_saving(shape, 16, 2)
    assert.truthy(doc:find(('(L·N·C·4 bytes, %.2f GB a step)'):format(forward / 1e9), 1, true))
    assert.truthy(doc:find(('(6·L·N·C·4 bytes, %.2f GB): %.2f GB a step in f32, %.2f GB in bf16'):format(backward / 1e9,
      (forward + backward) / 1e9, (forward_bf16 + backward_bf16) / 1e9), 1, true))
  end)

  it('counts GELU in the MLP GEMMs as 2 [N, 4C] tensors moved a layer, 4 fewer than passes of its own', function()
    local shape = { layers = 12, heads = 12, dim = 768, vocab = 50257, seq_len = 1024 }
    local hidden = 4 * 16 * 1024 * 4 * 768  -- one f32 [N, 4C] tensor at B = 16
    local by = {}
    for _, k in ipairs(cost.kernels(shape, 16)) do by[k.name] = k.bytes end
    assert.are.equal(hidden, by['gelu (mlp up epilogue)'])
    assert.are.equal(hidden, by['gelu backward (mlp down epilogue)'])
    assert.are.equal(4 * hidden * 12, cost.gelu_epilogue_saving(shape, 16))
    assert.are.equal(cost.gelu_epilogue_saving(shape, 16) / 2, cost.gelu_epilogue_saving(shape, 16, 2))
    local doc = helper.read_file(helper.ROOT .. '/docs/gpu.md')
    for _, storage in ipairs({ 4, 2 }) do
      local quoted = ('%.2f GB'):format(cost.gelu_epilogue_saving(shape, 16, storage) / 1e9)
      assert.truthy(doc:find(quoted, 1, true), quoted .. ' is not in docs/gpu.md')
    end
  end)

  it("labels every bench row of the GPU design as computed, not measured", function()
    local r = helper.run('tests/bench/gpu_design.lua')
    assert.are.equal(0, r.rc, r.err)
    local rows = 0
    for _, line in ipairs(helper.lines(r.out)) do
      if not line:match('^GPT%-2 124M:') then
        assert.matches('^design figure %(computed, not measured%):', line)
        rows = rows + 1
      end
    end
    assert.is_true(rows >= 12, rows .. ' rows')
    assert.matches("MFU at llm.c's H100 rate%s+38%.02 %%", r.out)
  end)
end)
