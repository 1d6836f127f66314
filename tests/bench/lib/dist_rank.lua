-- One rank of tests/bench/dist.lua: all-reduces f32 tensors of each size (bytes, from the
-- arguments) and prints, on rank 0, "size BYTES best SECONDS" for the fastest of `repeats` runs,
-- each started right after a barrier so that both ranks start together.
--   ./run --nproc-per-node 2 tests/bench/lib/dist_rank.lua REPEAT_BUDGET_BYTES SIZE...
local wick = require 'wick'
local core = require 'wick.core'

local F32_BYTES, MIN_REPEATS, MAX_REPEATS, WARMUP = 4, 5, 200, 2
local budget = tonumber(arg[1])
local dist = wick.dist.init { timeout = 120 }
for k = 2, #arg do
  local bytes = tonumber(arg[k])
  local t = wick.tensor.zeros({ bytes / F32_BYTES })
  local repeats = math.max(MIN_REPEATS, math.min(MAX_REPEATS, math.floor(budget / bytes)))
  for _ = 1, WARMUP do dist:all_reduce(t, 'sum') end
  local best = math.huge
  for _ = 1, repeats do
    dist:barrier()
    local start = core.now()
    dist:all_reduce(t, 'sum')
    best = math.min(best, core.now() - start)
  end
  if dist.rank == 0 then print(('size %d best %.9f'):format(bytes, best)) end
  t:free()
end
dist:close()
