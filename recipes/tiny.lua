-- tiny.lua: the default job (`make demo`). A small GPT-2 trained on the embedded corpus (converted
-- once into build/demo/data), on 2 local ranks for a few minutes (4000 steps of 1024 tokens: 3.7 min
-- on 2 shared cores; each rank takes its own GPU where there is one: model.device 'auto'); the loss falls from 5.4 to about 1.5, and rank 0 prints a
-- short sample of text from the model at the end.
--   ./run --nproc-per-node 2 recipes/tiny.lua
--   ./run recipes/tiny.lua --steps=20 --batch.micro=8          # any field: --key=value
--   ./run --dry-run --nproc-per-node 8 recipes/tiny.lua        # check and plan for 8 ranks
local wick = require 'wick'
local corpus = wick.recipe.include 'lib/corpus.lua'
local shape = wick.recipe.include 'lib/small_gpt.lua'

return {
  model = shape.model,
  data = { sources = { corpus.all() }, seq_len = 64 },
  batch = { global = 16, micro = 8 },
  precision = 'fp32',
  optim = shape.optim,
  steps = 4000,
  seed = 1,
  checkpoint = { every = 0, dir = wick.recipe.build_dir .. '/tiny/checkpoints' },
  log = { sample = 200 },
}
