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

  it("gives GPT-2 124M llm.c's parameter count and 6N + 12LCT FLOPs a token", function()
    local P = cost.parameter_count(GPT2_124M)
    assert.are.equal(124475904, P)  -- llm.c's train_gpt2cu with the vocabulary padded to 50304
    assert.are.equal(6 * P + 12 * 12 * 768 * 1024, cost.flops_per_token(GPT2_124M))
    -- 468K tokens/s on a 989 TFLOP/s H100: about 40.7%
    assert.is_true(math.abs(cost.mfu(GPT2_124M, 468e3, 989e12) - 0.407) < 0.001)
  end)

  it('splits the bytes a step moves by kernel family, the weights and moments counted where they move', function()
    local families, total = cost.bytes_per_step(GPT2_124M, 16)
    local by, sum = {}, 0
    for _, f in ipairs(families) do
      by[f.family] = f.bytes
      sum = sum + f.bytes
    end
    assert.are.equal(sum, total)
    assert.are.equal(4 * 7 * 124475904, by.adamw)  -- p, g, m, v read; p, m, v written
    -- the (B, NH, T, T) weights are written once and read once: twice 805 MB a layer at least
    assert.is_true(by.attention > 12 * 2 * 4 * 16 * 12 * 1024 * 1024)
    -- twice the micro batch moves twice the activations; the weights' share stays
    local _, double = cost.bytes_per_step(GPT2_124M, 32)
    assert.is_true(double > 1.9 * total - by.adamw and double < 2 * total)
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
    assert.matches("MFU at llm.c's H100 rate%s+40%.7 %%", r.out)
  end)
end)
