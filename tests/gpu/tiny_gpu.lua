-- recipes/tiny.lua with the model and its batches on this rank's GPU (cuda:LOCAL_RANK), for
-- `make gpu-check`: the same job the CPU runs, so their losses can be compared step by step.
--   ./run tests/gpu/tiny_gpu.lua --steps=20 --log.sample=0
local wick = require 'wick'

local job = wick.recipe.copy(wick.recipe.include '../../recipes/tiny.lua')
job.model.device = 'cuda' -- this rank's GPU, refused where there is none (the batches follow the model)
return job
