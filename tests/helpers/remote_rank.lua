-- One rank of the remote-cache tests (tests/remote_spec.lua), a real process, often two of them under
-- `run --nproc-per-node 2`:
--   ./run tests/helpers/remote_rank.lua DATA AUDIT CACHE_DIR CACHE_DISK_BYTES [STEPS] [WATCH]
-- Streams one epoch of DATA (or STEPS global steps) with a fixed order, appending every sample to AUDIT,
-- through the disk cache CACHE_DIR of CACHE_DISK_BYTES. With WATCH = 'watch' it sums the sizes of the
-- files under CACHE_DIR after every micro-batch and reports the largest sum. Prints one line of counters.
local data = require 'wick.data'

local SEQ_LEN, GLOBAL_BATCH, BUFFER_TOKENS = 64, 8, 4096

local dir, audit, cache_dir, cache_disk_bytes, steps, watch = ...
local loader = data.loader {
  data = dir, seq_len = SEQ_LEN, global_batch = GLOBAL_BATCH, seed = 5, audit = audit,
  shuffle = { buffer_tokens = BUFFER_TOKENS, window_tokens = 40000 },
  cache_dir = cache_dir, cache_disk_bytes = tonumber(cache_disk_bytes), retries = 2,
}

local function disk_usage()
  local total = 0
  local find = io.popen(('find %q -type f -printf "%%s\\n"'):format(cache_dir))
  for size in find:lines() do total = total + tonumber(size) end
  find:close()
  return total
end

steps = tonumber(steps) or math.floor(loader:epoch_length() / GLOBAL_BATCH)
local largest = 0
for _ = 1, steps do
  local batch = loader:next()
  for _ = 2, batch.micro_steps do
    if watch then largest = math.max(largest, disk_usage()) end
    loader:next()
  end
  if watch then largest = math.max(largest, disk_usage()) end
end
local s = loader:stats()
loader:close()
print(('steps=%d largest=%d requests=%d fetched=%d hits=%d misses=%d prefetched=%d evicted=%d'):format(steps,
  largest, s.remote.requests, s.remote.bytes_fetched, s.remote.cache_hits, s.remote.cache_misses,
  s.remote.prefetched, s.remote.evicted_bytes))
