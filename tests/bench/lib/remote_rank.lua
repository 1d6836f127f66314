-- One rank of the remote benchmark (tests/bench/remote.lua), alone or under the launcher:
--   ./run tests/bench/lib/remote_rank.lua DATA CACHE_DIR STEPS [OPTION=NUMBER ...]
-- Opens a loader on DATA (a URL or a local directory) with a fresh cache in CACHE_DIR (and the loader
-- options given, e.g. node_cache_bytes=8388608 prefetch_bytes=0), then streams STEPS global steps (0: one epoch). Prints one line: the time to the first batch, the bytes fetched
-- by then, the tokens and seconds of the whole stream (timed from the loader's creation), and the
-- bytes fetched in all.
local data = require 'wick.data'
local report = dofile(require('wick.host').home .. '/tests/bench/lib/report.lua')

local SEQ_LEN, GLOBAL_BATCH = 1024, 32

local args = { ... }
local dir, cache_dir, steps = args[1], args[2], args[3]
local options = { data = dir, seq_len = SEQ_LEN, global_batch = GLOBAL_BATCH, cache_dir = cache_dir }
for i = 4, #args do
  local k, v = args[i]:match('^([%w_]+)=(%d+)$')
  options[assert(k, 'OPTION=NUMBER expected: ' .. args[i])] = tonumber(v)
end
local started = report.now()
local loader = data.loader(options)
local batch = loader:next()
local first = report.now() - started
local fetched_first = loader:stats().remote.bytes_fetched
steps = tonumber(steps)
if steps == 0 then steps = math.floor(loader:epoch_length() / GLOBAL_BATCH) end
local tokens = batch.rows * batch.seq_len
for _ = 2, steps * batch.micro_steps do
  batch = loader:next()
  tokens = tokens + batch.rows * batch.seq_len
end
local seconds = report.now() - started
local s = loader:stats().remote
loader:close()
print(('first_s=%.6f fetched_first=%d tokens=%d seconds=%.6f fetched=%d requests=%d hits=%d misses=%d wait_ns=%d')
  :format(first, fetched_first, tokens, seconds, s.bytes_fetched, s.requests, s.cache_hits, s.cache_misses, s.wait_ns))
