-- The data loader feeding the model: a tiny GPT trains on batches of a real converted dataset, the
-- loader's own tensors read in place (tokens int32 [rows, T+1], loss mask u8 [rows, T]).
local helper = require 'helper'
local data_helper = require 'helpers.data'
local wick = require 'wick'
local T = wick.tensor

local SEQ = 16

describe('training from the data loader', function()
  local root
  setup(function() root = helper.tmpdir() end)
  teardown(function() helper.rmtree(root) end)

  it('lowers the loss of a small GPT over a few steps of real batches', function()
    local corpus = data_helper.make_dataset(root .. '/corpus', data_helper.documents(60, 10, 4), { shard_size = 1024 })
    local loader = wick.data.loader { data = corpus, seq_len = SEQ, global_batch = 4, world_size = 1, rank = 0, seed = 1 }
    local vocab = loader:vocab_size()
    local model = wick.nn.gpt { vocab = vocab, seq_len = SEQ, layers = 1, heads = 2, dim = 16, seed = 1 }
    local opt = wick.optim.adamw { lr = 3e-3, weight_decay = 0 }
    local losses = {}
    for step = 1, 40 do
      local batch = assert(loader:next())
      model:zero_grad()
      losses[step] = model:forward_tokens(batch.tokens, batch.loss_mask)
      model:backward()
      opt:step(model)
    end
    loader:close()
    local function mean(first, last)
      local sum = 0
      for i = first, last do sum = sum + losses[i] end
      return sum / (last - first + 1)
    end
    assert.is_true(losses[1] > 0.8 * math.log(vocab), 'starts near log(vocab): ' .. losses[1])
    assert.is_true(mean(31, 40) < 0.8 * mean(1, 10), ('first %.3f, last %.3f'):format(mean(1, 10), mean(31, 40)))
    model:free()
    opt:free()
  end)
end)
