-- One rank of the remote-cache tests (tests/io/remote_spec.lua), a real process, often two of them under
-- `run --nproc-per-node 2`:
--   ./run tests/helpers/remote_rank.lua DATA AUDIT CACHE_DIR CACHE_DISK_BYTES [STEPS] [WATCH] [OPTIONS]
-- Streams one epoch of DATA (or STEPS global steps) with a fixed order, appending every sample to AUDIT,
-- through the disk cache CACHE_DIR of CACHE_DISK_BYTES. With WATCH = 'watch' it sums the sizes of the
-- files under CACHE_DIR after every micro-batch and reports the largest sum. OPTIONS: more loader
-- options as a Lua table ("{ retries = 4 }"). Prints one line of counters, or the error and exits 1.
local data = require 'wick.data'

local SEQ_LEN, GLOBAL_BATCH, BUFFER_TOKENS = 64, 8, 4096

local dir, audit, cache_dir, cache_disk_bytes, steps, watch, extra = ...
local options = {
  data = dir, seq_len = SEQ_LEN, global_batch = GLOBAL_BATCH, seed = 5, audit = audit,
  shuffle = { pool_tokens = BUFFER_TOKENS, window_tokens = 40000 },
  cache_dir = cache_dir, cache_disk_bytes = tonumber(cache_disk_bytes), retries = 2,
}
for k, v in pairs(extra and assert(loadstring('return ' .. extra))() or {}) do options[k] = v end
local ok, loader = pcall(data.loader, options)
if not ok then
  io.stderr:write(tostring(loader), '\n')
  os.exit(1)
end

local function disk_usage()
  local total = 0
  local find = io.popen(('find %q -type f -printf "%%s\\n"'):format(cache_dir))
  for size in find:lines() do total = total + tonumber(size) end
  find:close()
  return total
end

local largest = 0
local streamed, err = pcall(function()
  steps = tonumber(steps) or math.floor(loader:epoch_length() / GLOBAL_BATCH)
  for _ = 1, steps do
    local batch = loader:next()
    for _ = 2, batch.micro_steps do
      if watch == 'watch' then largest = math.max(largest, disk_usage()) end
      loader:next()
    end
    if watch == 'watch' then largest = math.max(largest, disk_usage()) end
  end
end)
if not streamed then
  io.stderr:write(tostring(err), '\n')
  os.exit(1)
end
local r = loader:stats().remote
loader:close()
print(('steps=%d largest=%d requests=%d fetched=%d hits=%d misses=%d prefetched=%d evicted=%d connect=%d reset=%d '
  .. 'timeout=%d server=%d throttle=%d corrupt=%d wait_ns=%d'):format(steps, largest, r.requests, r.bytes_fetched,
  r.cache_hits, r.cache_misses, r.prefetched, r.evicted_bytes, r.retries_connect, r.retries_reset, r.retries_timeout,
  r.retries_server, r.retries_throttle, r.retries_corrupt, r.wait_ns))
