-- hello.lua: the smallest recipe: what every rank sees of itself and of the runtime.
--   ./run recipes/hello.lua
--   ./run --nproc-per-node 2 recipes/hello.lua
local wick = require 'wick'

local info = wick.build_info()
local rank, world = tonumber(os.getenv('RANK') or 0), tonumber(os.getenv('WORLD_SIZE') or 1)
print(('rank %d of %d: Wick %s (%s), CUDA %s, %d GPU(s) visible'):format(rank, world, info.version,
  info.build_flags, info.has_cuda and 'compiled in' or 'not compiled', info.cuda_devices))
