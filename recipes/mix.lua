-- mix.lua: three sources with a weight schedule. The embedded corpus split three ways (top-level
-- Python modules, Python packages, license texts: recipes/lib/corpus.lua); the licenses' share
-- grows from 0.1 to 0.4 over the run while the packages' shrinks. Each source keeps its own
-- cursor, so a resumed run may change the weights (`--data.mix.licenses=0.2 --resume`).
--   ./run --nproc-per-node 2 recipes/mix.lua
local wick = require 'wick'
local corpus = wick.recipe.include 'lib/corpus.lua'
local shape = wick.recipe.include 'lib/small_gpt.lua'

local STEPS = 300

return {
  model = shape.model,
  data = {
    sources = { corpus.part('modules'), corpus.part('packages'), corpus.part('licenses') },
    mix = { modules = 0.4, packages = wick.schedule.linear(0.5, 0.2, STEPS), licenses = wick.schedule.linear(0.1, 0.4, STEPS) },
    seq_len = 64,
  },
  batch = { global = 16, micro = 8 },
  optim = shape.optim,
  steps = STEPS,
  seed = 1,
}
