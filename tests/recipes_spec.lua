-- The shipped recipes keep working: each runs for real on a small dataset.
local helper = require 'helper'
local data_helper = require 'data_helper'
local q = helper.shell_quote

describe('recipes', function()
  local root, dataset
  setup(function()
    root = helper.tmpdir()
    dataset = data_helper.make_dataset(root .. '/data', data_helper.documents(400, 40, 6), { shard_size = 4096 })
  end)
  teardown(function() helper.rmtree(root) end)

  it('hello.lua reports every rank', function()
    local r = helper.run('--nproc-per-node 2 ' .. q(helper.ROOT .. '/recipes/hello.lua'))
    assert.are.equal(0, r.rc, r.err)
    assert.matches('%[rank1%] rank 1 of 2: Wick', r.out)
  end)

  it('stream.lua streams on 2 ranks and prints samples and the cursor', function()
    local r = helper.run(('--nproc-per-node 2 %s --data %s --seq-len 32 --global-batch 8 --micro-batch 2 --steps 20 ' ..
      '--compute-ms 0'):format(q(helper.ROOT .. '/recipes/stream.lua'), q(dataset)))
    assert.are.equal(0, r.rc, r.err)
    assert.matches('step   20/20', r.out, 1, true)
    assert.matches('sample shard=', r.out, 1, true)
    assert.matches('cursor: wick%-cursor/2 step=20 ', r.out)
  end)

  it('tiny_gpt.lua trains: the loss falls, weights and cursor are saved', function()
    local out = root .. '/tiny'
    local r = helper.run(('%s --data %s --steps 30 --seq-len 32 --dim 32 --out %s'):format(
      q(helper.ROOT .. '/recipes/tiny_gpt.lua'), q(dataset), q(out)))
    assert.are.equal(0, r.rc, r.err)
    local losses = {}
    for loss in r.out:gmatch('loss (%d+%.%d+)') do losses[#losses + 1] = tonumber(loss) end
    assert.is_true(losses[#losses] < 0.8 * losses[1], r.out)
    assert.matches('step=30 ', helper.read_file(out .. '/cursor.txt'), 1, true)
    local weights = require('wick').safetensors.load(out .. '/model.safetensors')
    assert.is_not_nil(weights['transformer.wte.weight'])
  end)
end)
