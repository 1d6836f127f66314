-- The audit that proves "nothing lost, nothing repeated" with real rank processes: 4 ranks stream
-- part of an epoch and save the cursor, 2 ranks resume from it and finish the epoch; the audit
-- lines of all six processes cover every sample of the epoch exactly once.
local helper = require 'helper'
local data_helper = require 'helpers.data'
local data = require 'wick.data'
local q = helper.shell_quote

describe('a sample audit', function()
  local root
  before_each(function() root = helper.tmpdir() end)
  after_each(function() helper.rmtree(root) end)

  local function stream(ranks, dataset, steps, extra)
    local r = helper.run(('--nproc-per-node %d %s/recipes/stream.lua --data %s --seq-len 16 --global-batch 8 ' ..
      '--micro-batch 1 --steps %d --compute-ms 0 --audit %s %s'):format(ranks, helper.ROOT, q(dataset), steps,
      q(root .. '/audit'), extra))
    assert.are.equal(0, r.rc, r.out .. r.err)
  end

  it('proves an epoch is delivered exactly once across a resume onto another world size', function()
    local dataset = data_helper.make_dataset(root .. '/data', data_helper.documents(300, 30, 9), { shard_size = 512 })
    local probe = data.loader { data = dataset, seq_len = 16, global_batch = 8 }
    local steps = math.floor(probe:epoch_length() / 8)
    probe:close()
    local first = math.floor(steps / 3)
    stream(4, dataset, first, '--save-cursor ' .. q(root .. '/cursor'))
    stream(2, dataset, steps - first, '--resume ' .. q(root .. '/cursor'))

    local seen, lines, ranks_before, ranks_after = {}, 0, {}, {}
    for line in io.lines(root .. '/audit') do
      local step, rank, id, epoch = line:match('^step=(%d+) micro=%d+ rank=(%d+) row=%d+ id=(%S+) epoch=(%d+)')
      assert.is_not_nil(step, line)
      assert.are.equal('0', epoch)
      assert.is_nil(seen[id], 'sample ' .. id .. ' delivered twice')
      seen[id] = true
      lines = lines + 1
      if tonumber(step) < first then ranks_before[rank] = true else ranks_after[rank] = true end
    end
    assert.are.equal(steps * 8, lines)
    assert.are.same({ ['0'] = true, ['1'] = true, ['2'] = true, ['3'] = true }, ranks_before)
    assert.are.same({ ['0'] = true, ['1'] = true }, ranks_after)
  end)
end)
