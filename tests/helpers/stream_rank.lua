-- One rank for the node-cache tests (tests/loader/order_spec.lua), run as a real process:
--   ./run tests/helpers/stream_rank.lua DATA SEQ_LEN GLOBAL_BATCH POOL_TOKENS NODE_CACHE_BYTES READY_DIR [DIE_AFTER [HOW]]
-- RANK, WORLD_SIZE, LOCAL_WORLD_SIZE (and a job id) come from the environment. Starts its loader, marks
-- itself ready in READY_DIR and waits until WORLD_SIZE ranks are (so no rank streams a whole epoch
-- before the other has joined the node cache), then reads one epoch. With DIE_AFTER it kills itself
-- (SIGKILL) after that many micro-batches, in the middle of the stream, or with HOW 'error' raises a Lua
-- error there without closing its loader. Prints its job id when started and one line of counters at the
-- end.
local data = require 'wick.data'
local ffi = require 'ffi'
pcall(ffi.cdef, 'int kill(int pid, int sig); int getpid(void);')
local SIGKILL = 9

local dir, seq_len, global_batch, pool_tokens, node_cache_bytes, ready_dir, die_after, how = ...
local world = tonumber(os.getenv('WORLD_SIZE'))
local loader = data.loader {
  data = dir, seq_len = tonumber(seq_len), global_batch = tonumber(global_batch),
  node_cache_bytes = tonumber(node_cache_bytes),
  shuffle = { pool_tokens = tonumber(pool_tokens) }, seed = 11,
}
loader:start()
io.stdout:write('job=', os.getenv('WICK_JOB_ID') or '', '\n')
io.stdout:flush()
io.open(('%s/%s'):format(ready_dir, os.getenv('RANK')), 'w'):close()
local deadline = os.time() + 30
repeat
  local ready = 0
  for r = 0, world - 1 do
    local f = io.open(('%s/%d'):format(ready_dir, r))
    if f then f:close() ready = ready + 1 end
  end
until ready == world or os.time() > deadline
local steps = math.floor(loader:epoch_length() / tonumber(global_batch))
local batches = 0
for _ = 1, steps do
  local batch = loader:next()
  for _ = 2, batch.micro_steps do loader:next() end
  batches = batches + batch.micro_steps
  if die_after and batches >= tonumber(die_after) then
    if how == 'error' then error('stream_rank: a Lua error, the loader left open') end
    ffi.C.kill(ffi.C.getpid(), SIGKILL)
  end
end
local s = loader:stats()
loader:close()
print(('steps=%d decoded=%d delivered=%d node_decoded=%d node_delivered=%d private=%d steals=%d waits=%d ' ..
  'edges_missing=%d edges_dropped=%d'):format(steps, s.decoded_bytes, s.delivered_bytes, s.node_decoded_bytes,
  s.node_delivered_bytes, s.node_private_decodes, s.node_steals, s.node_waits, s.node_edges_missing,
  s.node_edges_dropped))
