-- wick.nn.cost: its parameter count is the model's, its GEMM FLOPs are 2 x rows x weights, and the
-- figures docs/gpu.md quotes are the ones it computes.
local helper = require 'helper'
local wick = require 'wick'
local cost = require 'wick.nn.cost'

local GPT2 = { vocab = 50257, seq_len = 1024, layers = 12, heads = 12, dim = 768 }

describe('nn.cost', function()
  it('counts the parameters wick.nn.gpt allocates', function()
    local cfg = { vocab = 37, seq_len = 9, layers = 3, heads = 2, dim = 12, seed = 1 }
    local model = wick.nn.gpt(cfg)
    assert.are.equal(model:parameter_count(), cost.gpt(cfg, { batch = 1 }).params)
    model:free()
  end)

  it('gives the linear layers 2 FLOPs per row and weight', function()
    local c, N, C = cost.gpt(GPT2, { batch = 16 }), 16 * 1024, 768
    local linear = 0
    for _, k in ipairs(c.kernels) do
      if not k.name:find('^attention [QP]') then linear = linear + k.flops * k.calls end
    end
    assert.are.equal(2 * N * (12 * 12 * C * C + 50257 * C), linear)
  end)

  it('computes the figures docs/gpu.md quotes for GPT-2 124M at B = 16, T = 1024', function()
    local c = cost.gpt(GPT2, { batch = 16, bytes = 4 })
    local doc = helper.read_file(helper.ROOT .. '/docs/gpu.md')
    assert.truthy(doc:find(('| forward | | %.1f |'):format(c.forward_flops / 1e9), 1, true))
    for _, k in ipairs(c.kernels) do
      if k.name == 'cross-entropy backward' then
        assert.truthy(doc:find(('| %d |'):format(math.floor(k.bytes / 1e6 + 0.5)), 1, true))
      end
    end
  end)
end)
