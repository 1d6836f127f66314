-- One reading for the flat-memory test (tests/loader/order_spec.lua), run as its own process so that
-- no earlier spec's freed memory going back to the system shows up as this loader shrinking:
--   ./run tests/helpers/resident_growth.lua DATA
-- Reads one epoch of DATA and prints how many KiB of resident memory (anonymous, file-backed and shared)
-- the open loader added to the process.
local core = require 'wick.core'
local data = require 'wick.data'

local dir = ...

local function resident_kb()
  local status = assert(core.read_file('/proc/self/status'))
  local kb = 0
  for _, kind in ipairs { 'RssAnon', 'RssFile', 'RssShmem' } do
    kb = kb + tonumber(status:match(kind .. ':%s*(%d+) kB'))
  end
  return kb
end

local function settled_kb()
  collectgarbage('collect')
  collectgarbage('collect')
  return resident_kb()
end

local before = settled_kb()
local loader = data.loader { data = dir, seq_len = 128, global_batch = 16, shuffle = { pool_tokens = 8 * 4096 },
                             node_cache_bytes = 2 ^ 20 }
for _ = 1, math.floor(loader:epoch_length() / 16) do loader:next() end
local after = settled_kb()
loader:close()
print(after - before)
