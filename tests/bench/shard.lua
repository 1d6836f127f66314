-- Sharded data parallelism on 4 CPU ranks (issue 20): each level's peak tensor memory per rank and
-- step time next to plain data parallelism (parallel.shard = 'none'), measured in this run on the
-- same recipe.
--   ./run tests/bench/shard.lua     (make bench runs it; about a minute, plus converting the demo
--                                    corpus into build/demo/ the first time)
--
-- The job: recipes/tiny.lua with a wider model (4 layers, dim 256: 3.3M parameters), micro batch 1
-- of 64 tokens and a global batch of 4, so that the model's state (the f32 weights, the gradient
-- buffer and AdamW's two moments: 16 bytes a parameter) dominates what a rank holds. The peak is
-- the run's last line (the most tensor memory any rank held at once: the allocator's count, the
-- same the dry run estimates); the step time is the median over a run's steps after the first
-- WARMUP, best of REPEATS runs, the levels interleaved.
-- Goals: AdamW's moments fall W-fold, so a rank's peak falls by 8P(W-1)/W - 4P/W bytes (the
-- moments freed, less the slice buffer the updated weights are gathered from): the row "freed per
-- rank" is none's peak less the level's, next to that amount (P from the dry run); goal x0.98.
-- Under bf16 the f32 masters are sliced too: 'optimizer' frees 12P(W-1)/W - 2P/W (the moments and
-- the masters, less the 2-byte slice the compute copy is gathered from), against bf16 'none'. A
-- sharded step costs at most 25% more than none's on loopback (ratio >= 0.8).
package.path = require('wick.host').home .. '/tests/bench/lib/?.lua;' .. package.path
local report = require 'report'
local host = require 'wick.host'
local json = require 'wick.json'

local WORLD = 4
local STEPS, WARMUP, REPEATS = 10, 2, 2
local LEVELS = { 'none', 'optimizer', 'gradients', 'parameters' }
local LAYERS, DIM = 4, 256
local DIR = host.home .. '/build/bench/shard'
local UNITS = { bytes = 1, KiB = 2 ^ 10, MiB = 2 ^ 20, GiB = 2 ^ 30 }
local MEMORY_GOAL = 0.98 -- bytes freed / the moments' share freed, less the slice
local TIME_GOAL = 0.8    -- none's step time / a level's

report.sh('shard bench', 'mkdir -p ' .. DIR, true)

local function median(values)
  table.sort(values)
  return values[math.floor((#values + 1) / 2)]
end

-- One run of a level: the peak per rank (bytes) and the median step time (seconds).
-- The command line of the job at `level`; `flags` go to run (--dry-run), `overrides` to the recipe.
local function job(level, flags, overrides)
  return ("'%s' %s --nproc-per-node %d '%s/recipes/tiny.lua' --model.layers=%d --model.dim=%d --batch.global=%d " ..
    '--batch.micro=1 --steps=%d --log.sample=0 --parallel.shard=%s %s'):format(host.exe, flags, WORLD, host.home, LAYERS,
    DIM, WORLD, STEPS, level, overrides)
end

local function run(level, precision)
  local log = ('%s/%s.jsonl'):format(DIR, level)
  os.remove(log)
  local out, ok = report.capture(job(level, '', '--log=' .. log .. ' --precision=' .. (precision or 'fp32')))
  if not ok then error('shard bench: the ' .. level .. ' run failed:\n' .. out) end
  local value, unit = out:match('peak tensor memory per rank: most ([%d.]+) (%a+)')
  if not value then value, unit = out:match('peak tensor memory per rank: ([%d.]+) (%a+) on each of') end
  if not value then error('shard bench: no peak memory line in the ' .. level .. ' run:\n' .. out) end
  local seconds = {}
  for line in io.lines(log) do
    local record = json.decode(line)
    if record.step > WARMUP then seconds[#seconds + 1] = record.ranks[1].total end
  end
  return tonumber(value) * UNITS[unit], median(seconds)
end

local peak, time = {}, {}
for _ = 1, REPEATS do
  for _, level in ipairs(LEVELS) do
    local bytes, seconds = run(level)
    peak[level] = math.min(peak[level] or math.huge, bytes)
    time[level] = math.min(time[level] or math.huge, seconds)
  end
end

local plan = report.capture(job('none', '--dry-run', ''))
local P = tonumber(plan:match('(%d+) parameters'))
if not P then error('shard bench: the dry run printed no parameter count:\n' .. plan) end
local F32, MiB = 4, 2 ^ 20
local share = (2 * F32 * P * (WORLD - 1) - F32 * P) / WORLD -- the moments freed, less the slice buffer
print(('model: %d parameters (%.2f MiB of f32 state a rank unsharded: weights, gradients, m, v); none peaks at %.2f MiB')
  :format(P, 4 * F32 * P / MiB, peak.none / MiB))
for _, level in ipairs({ 'optimizer', 'gradients' }) do
  report.row(('shard=%s, %d ranks: freed per rank (MiB)'):format(level, WORLD), (peak.none - peak[level]) / MiB, 'MiB',
    "8P(W-1)/W - 4P/W", share / MiB, true, MEMORY_GOAL)
  print(('  peak per rank %.2f MiB'):format(peak[level] / MiB))
end
local gathered = P - (LAYERS - 2) * require('wick.nn.cost').block_parameter_count({ dim = DIM })
report.row(('shard=parameters, %d ranks: freed per rank (MiB)'):format(WORLD), (peak.none - peak.parameters) / MiB, 'MiB',
  '16P(W-1)/W - 8G - 4G/W', F32 * (4 * P * (WORLD - 1) / WORLD - 2 * gathered - gathered / WORLD) / MiB, true, MEMORY_GOAL)
print(('  peak per rank %.2f MiB'):format(peak.parameters / MiB))
local bf16 = {}
for _, level in ipairs({ 'none', 'optimizer', 'parameters' }) do bf16[level] = run(level, 'bf16') end
report.row(('bf16, shard=optimizer, %d ranks: freed per rank (MiB)'):format(WORLD), (bf16.none - bf16.optimizer) / MiB,
  'MiB', '12P(W-1)/W - 2P/W', (3 * F32 * P * (WORLD - 1) - 2 * P) / WORLD / MiB, true, MEMORY_GOAL)
print(('  peak per rank %.2f MiB, bf16 none %.2f MiB'):format(bf16.optimizer / MiB, bf16.none / MiB))
report.row(('bf16, shard=parameters, %d ranks: freed per rank (MiB)'):format(WORLD), (bf16.none - bf16.parameters) / MiB,
  'MiB', '18P(W-1)/W - 6G - 4G/W', (18 * P * (WORLD - 1) / WORLD - 6 * gathered - 4 * gathered / WORLD) / MiB, true,
  MEMORY_GOAL)
print(('  peak per rank %.2f MiB'):format(bf16.parameters / MiB))
for _, level in ipairs({ 'optimizer', 'gradients', 'parameters' }) do
  report.row(('shard=%s, %d ranks: step time (s)'):format(level, WORLD), time[level], 's', "shard=none's step",
    time.none, false, TIME_GOAL)
end
