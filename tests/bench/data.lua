-- Data benchmark (issue goals in brackets), each next to a baseline measured in this run:
--   tokens/s per rank, 2 ranks reading concurrently, raw shards, in output bytes   vs memcpy     [>= 0.5x]
--   the same tokens/s                                                              vs torch      [>= 8x]
--   CPU ns per delivered token (raw)                                                             [<= 1 ns]
--   zstd shards: decoded bytes/s of one thread reading whole blocks                vs zstd -d    [>= 0.8x]
--   time to first batch                                                                          [<= 10 ms]
--   peak RSS                                                              vs ring + cache + an idle run
-- The corpus is the embedded default (wick.data.corpus), converted once into build/bench/.
local host = require 'wick.host'
package.path = host.home .. '/tests/bench/lib/?.lua;' .. package.path
local report = require 'report'
local corpus = require 'wick.data.corpus'
local wick_dataset = require 'wick.dataset'
local ffi = require 'ffi'

local BENCH = host.home .. '/build/bench'
local RUN = "'" .. host.exe .. "'"
local RANKS = 2
local RAW_TOKENS, ZSTD_TOKENS, TORCH_TOKENS = 4e8, 1e8, 5e7 -- per rank
local SEQ_LEN, MICRO_BATCH = 1024, 16
local CACHE_BYTES = 64 * 2 ^ 20
local MEMCPY_BYTES, MEMCPY_ROUNDS = 64 * 2 ^ 20, 8
local REPEATS = 3
local PYTHON = '/usr/bin/python3'

local function sh(cmd)
  local pipe = io.popen(cmd .. ' 2>&1')
  local out = pipe:read('*a')
  pipe:close()
  return out
end

local function parse(line)
  local fields = {}
  for k, v in line:gmatch('([%w_]+)=([%d%.]+)') do fields[k] = tonumber(v) end
  return fields
end

-- Each rank prints one line of key=value results: their mean over the ranks.
local function mean_of_ranks(out, ranks, what)
  local sum, n = {}, 0
  for line in out:gmatch('[^\n]+') do
    if line:find('tokens_per_s=', 1, true) then
      n = n + 1
      for k, v in pairs(parse(line)) do sum[k] = (sum[k] or 0) + v end
    end
  end
  if n ~= ranks then error(what .. ' failed:\n' .. out, 0) end
  for k, v in pairs(sum) do sum[k] = v / n end
  return sum
end

os.execute('mkdir -p ' .. BENCH)
local raw = corpus.dataset(BENCH .. '/raw', { compression = 'none', ['shard-size'] = '1M', threads = '2' })
local zstd = corpus.dataset(BENCH .. '/zstd', { compression = 'zstd:3', ['shard-size'] = '1M', threads = '2' })

-- The same token stream as one uint16 file, for the zstd CLI and the torch baselines.
local TOKENS_FILE = BENCH .. '/tokens.u16'
local function dump_tokens()
  local ds = assert(wick_dataset.open(raw))
  local out = assert(io.open(TOKENS_FILE, 'wb'))
  local total = 0
  for s = 0, ds.shards - 1 do
    local n = ds:shard(s).tokens
    local tokens = ds:read(s, 0, n)
    local narrow = ffi.new('uint16_t[?]', n)
    for i = 0, n - 1 do narrow[i] = tokens[i] end
    out:write(ffi.string(narrow, 2 * n))
    total = total + n
  end
  out:close()
  ds:close()
  return total
end
local total_tokens = dump_tokens()
print(('corpus: %.1f M tokens (%d files); %d ranks, seq_len %d, micro batch %d'):format(total_tokens / 1e6,
  #corpus.files(), RANKS, SEQ_LEN, MICRO_BATCH))

-- Baseline: memcpy bandwidth of one thread.
local src, dst = ffi.new('uint8_t[?]', MEMCPY_BYTES), ffi.new('uint8_t[?]', MEMCPY_BYTES)
ffi.fill(src, MEMCPY_BYTES, 1)
ffi.copy(dst, src, MEMCPY_BYTES)
local memcpy_s = report.best(REPEATS, function()
  for _ = 1, MEMCPY_ROUNDS do ffi.copy(dst, src, MEMCPY_BYTES) end
end)
local memcpy_gbs = MEMCPY_BYTES * MEMCPY_ROUNDS / memcpy_s / 1e9
src, dst = nil, nil
collectgarbage()

-- Baseline: the zstd CLI decompressing the same tokens (level 3, as the shards).
sh(('zstd -3 -q -f %s -o %s.zst'):format(TOKENS_FILE, TOKENS_FILE))
local zstd_cli_s = report.best(REPEATS, function() sh(('zstd -d -q -c %s.zst > /dev/null'):format(TOKENS_FILE)) end)
local zstd_cli_mbs = total_tokens * 2 / zstd_cli_s / 1e6
-- The stricter baseline: zstd's own in-memory benchmark (no process start, no output writes).
local zstd_memory_mbs
for mbs in sh(('zstd -b3 -i1 %s'):format(TOKENS_FILE)):gmatch('([%d%.]+) MB/s') do zstd_memory_mbs = tonumber(mbs) end

-- Wick: RANKS ranks reading concurrently; returns the mean of each field over ranks.
local function wick_ranks(dir, tokens, ranks, threads)
  local out = sh(('%s --nproc-per-node %d %s/tests/bench/lib/data_rank.lua --data %s --tokens %d --seq-len %d ' ..
    '--micro-batch %d --threads %d --cache-bytes %d'):format(RUN, ranks, host.home, dir, tokens, SEQ_LEN,
    MICRO_BATCH, threads, CACHE_BYTES))
  return mean_of_ranks(out, ranks, 'bench ranks')
end

-- Baseline: torch DataLoader + DistributedSampler, num_workers=0, RANKS processes at once.
local function torch_ranks()
  if sh(PYTHON .. ' -c "import torch" && echo ok'):match('ok') == nil then return nil end
  local cmd = {}
  for r = 0, RANKS - 1 do
    cmd[#cmd + 1] = ('%s %s/tests/bench/torch_loader.py %s %d %d %d %d %d &'):format(PYTHON, host.home, TOKENS_FILE,
      r, RANKS, SEQ_LEN, MICRO_BATCH, TORCH_TOKENS)
  end
  return mean_of_ranks(sh('( ' .. table.concat(cmd, ' ') .. ' wait )'), RANKS, 'torch baseline')
end

local idle = parse(sh(RUN .. [[ -e 'local f = io.open("/proc/self/status"):read("*a")
  print("peak_rss=" .. f:match("VmHWM:%s*(%d+)") * 1024)']]))
local raw_result = wick_ranks(raw, RAW_TOKENS, RANKS, 1)
local zstd_result = wick_ranks(zstd, ZSTD_TOKENS, RANKS, 1)
-- Decoding alone, one thread: every zstd block read whole through wick.dataset with no cache, so
-- each read verifies, decompresses and widens one block (what a loader thread does per miss).
local function decode_rate(dir)
  local ds = assert(wick_dataset.open(dir))
  ds:set('cache_bytes', 0)
  local BLOCK = 65536
  local out = ffi.new('uint32_t[?]', BLOCK)
  local seconds = report.best(REPEATS, function()
    for s = 0, ds.shards - 1 do
      local n = ds:shard(s).tokens
      for offset = 0, n - 1, BLOCK do ds:read(s, offset, math.min(BLOCK, n - offset), out) end
    end
  end)
  ds:close()
  return total_tokens * 2 / seconds / 1e6
end
local zstd_decode_mbs = decode_rate(zstd)
local torch = torch_ranks()

local out_gbs = raw_result.tokens_per_s * 4 / 1e9 -- int32 tokens out
report.row('raw: output GB/s per rank (2 ranks)', out_gbs, 'GB/s', 'memcpy, one thread', memcpy_gbs, true)
if torch then
  report.row('raw: tokens/s per rank (2 ranks)', raw_result.tokens_per_s / 1e6, 'M tok/s', 'torch DataLoader',
    torch.tokens_per_s / 1e6, true)
  report.row('zstd: tokens/s per rank (2 ranks)', zstd_result.tokens_per_s / 1e6, 'M tok/s', 'torch DataLoader',
    torch.tokens_per_s / 1e6, true)
  report.row('time to first batch (raw)', raw_result.first_batch_ms, 'ms', 'torch DataLoader', torch.first_batch_ms,
    false)
else
  print('torch baseline skipped: ' .. PYTHON .. ' cannot import torch (apt-get install python3-torch)')
end
report.row('raw: CPU ns per token (goal <= 1)', raw_result.cpu_ns_per_token, 'ns', 'goal', 1, false)
report.row('zstd: decoded MB/s, 1 thread (verify+decode+widen)', zstd_decode_mbs, 'MB/s', 'zstd -d CLI',
  zstd_cli_mbs, true)
if zstd_memory_mbs then
  report.row('zstd: the same', zstd_decode_mbs, 'MB/s', 'zstd -b3 (in memory)', zstd_memory_mbs, true)
end
report.row('time to first batch (zstd, goal <= 10)', zstd_result.first_batch_ms, 'ms', 'goal', 10, false)
local budget = raw_result.ring_bytes + CACHE_BYTES + idle.peak_rss
report.row('peak RSS per rank (zstd)', zstd_result.peak_rss / 2 ^ 20, 'MiB', 'ring + cache + idle run',
  budget / 2 ^ 20, false)
