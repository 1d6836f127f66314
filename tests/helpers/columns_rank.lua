-- One rank of the kill -9 resume test of records with columns (tests/loader/columns_spec.lua), run as a
-- real process by `run --nproc-per-node 2`:
--   run --nproc-per-node 2 tests/helpers/columns_rank.lua DATA SEQ_LEN CURSOR DIE_AFTER
-- Reads 12 steps of a pad-mode loader asking for the loss_mask, label and image columns (two micro-batches
-- a step), printing per step "step=S rank=R rows=ID ..." (ID: source:shard:offset:epoch) once it checked
-- each row's label against the record its text names. Rank 0 saves the cursor to CURSOR after each step
-- (whole: written aside, then renamed) and, after DIE_AFTER steps, takes the next step's first
-- micro-batch and kills itself with SIGKILL.
local data = require 'wick.data'
local ffi = require 'ffi'
pcall(ffi.cdef, 'int kill(int pid, int sig); int getpid(void);')
local SIGKILL = 9

local dir, seq_len, cursor, die_after = arg[1], tonumber(arg[2]), arg[3], tonumber(arg[4])
local rank = tonumber(os.getenv('RANK'))
local loader = data.loader { data = dir, seq_len = seq_len, global_batch = 8, micro_batch = 2, seed = 5, mode = 'pad',
  columns = { 'loss_mask', 'label', 'image' } }

local function checked_id(row)
  local s = loader:sample(row)
  local tokens = loader:row_tokens(row)
  local head = {}
  for t = 1, 8 do head[t] = string.char(tokens[t] % 256) end
  local i = assert(tonumber(table.concat(head):match('^a(%d+) ')), 'row ' .. row .. ': no record name')
  local columns = {}
  for _, c in ipairs(loader:row_columns(row)) do columns[c.name] = c.value end
  assert(columns.label == 7 * i, ('row %d: label %s for record a%d'):format(row, tostring(columns.label), i))
  return ('%d:%d:%d:%d'):format(s.source, s.shard, s.offset, s.epoch)
end

for step = 0, 11 do
  local ids = {}
  for _ = 1, 2 do
    local batch = assert(loader:next(), 'the stream ended')
    for row = 0, batch.rows - 1 do ids[#ids + 1] = checked_id(row) end
  end
  print(('step=%d rank=%d rows=%s'):format(step, rank, table.concat(ids, ' ')))
  io.stdout:flush()
  if rank == 0 then
    local f = assert(io.open(cursor .. '.tmp', 'w'))
    f:write(loader:state())
    f:close()
    assert(os.rename(cursor .. '.tmp', cursor))
    if step + 1 == die_after then
      loader:next()
      ffi.C.kill(ffi.C.getpid(), SIGKILL)
    end
  end
end
loader:close()
