-- All-reduce bus bandwidth on 2 CPU ranks (loopback TCP), Wick's Gloo path next to PyTorch's Gloo
-- backend, over message sizes from 4 KiB to 64 MiB, measured in this run: each side runs ROUNDS
-- times, interleaved, and each size keeps its best (a barrier, then one timed f32 all-reduce).
-- Bus bandwidth = size x 2(n-1)/n / time (NCCL's convention), which for n = 2 is size / time.
--   ./run tests/bench/dist.lua        (baseline: tests/bench/dist_torch.py, Debian's python3-torch)
package.path = require('wick.host').home .. '/tests/bench/lib/?.lua;' .. package.path
local report = require 'report'
local host = require 'wick.host'

local WORLD = 2
local SIZES = { 4096, 65536, 1048576, 16777216, 67108864 }
local ROUNDS = 3
local REPEAT_BUDGET = 256 * 2 ^ 20  -- bytes all-reduced per size and round (at least 5 repeats)
local TORCH_PORT = 29613 + math.random(0, 999)

local function run(command)
  local pipe = io.popen(command .. ' 2>&1')
  local out = pipe:read('*a')
  pipe:close()
  local best = {}
  for size, seconds in out:gmatch('size (%d+) best ([%d.]+)') do best[tonumber(size)] = tonumber(seconds) end
  return best, out
end

local function keep_best(into, from)
  for size, seconds in pairs(from) do into[size] = math.min(into[size] or math.huge, seconds) end
end

local sizes = table.concat(SIZES, ' ')
local wick, torch, torch_failure = {}, {}, nil
for _ = 1, ROUNDS do
  local w, out = run(("'%s' --nproc-per-node %d '%s/tests/bench/lib/dist_rank.lua' %d %s"):format(host.exe, WORLD,
    host.home, REPEAT_BUDGET, sizes))
  if not next(w) then error('bench dist: the Wick ranks printed no result:\n' .. out) end
  keep_best(wick, w)
  if not torch_failure then
    local t, tout = run(("/usr/bin/python3 '%s/tests/bench/dist_torch.py' %d %d %s"):format(host.home, TORCH_PORT,
      REPEAT_BUDGET, sizes))
    if next(t) then keep_best(torch, t) else torch_failure = tout:gsub('\n', ' '):sub(1, 200) end
  end
end

local function label(bytes)
  return bytes >= 2 ^ 20 and ('%d MiB'):format(bytes / 2 ^ 20) or ('%d KiB'):format(bytes / 2 ^ 10)
end

local bus_factor = 2 * (WORLD - 1) / WORLD
for _, size in ipairs(SIZES) do
  local ours = size * bus_factor / wick[size] / 1e9
  local what = ('all_reduce %s f32, %d CPU ranks, bus bandwidth'):format(label(size), WORLD)
  if torch[size] then
    report.row(what, ours, 'GB/s', 'torch.distributed gloo', size * bus_factor / torch[size] / 1e9, true)
  else
    print(('%s: %.3f GB/s (torch baseline skipped: %s)'):format(what, ours, torch_failure or 'no result'))
  end
end
