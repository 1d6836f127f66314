-- wick.train.tensorboard: the trainer's curves as TensorBoard event files (log.tensorboard = DIR), through
-- runtime/core/tfevents.c. Each numeric field of a JSONL log record becomes a scalar at its step:
-- train/<field>, eval/loss for eval_loss, ranks/<r>/<field> for each rank's seconds (r from 0).
--
--   local w = tensorboard.open(dir, start)  -- cuts the directory's files after step `start` first
--   w:write(record)                         -- one Event, written through (TensorBoard sees it live)
--   w:close()
local ffi = require 'ffi'
local core = require 'wick.core'
local C = core.C

pcall(ffi.cdef, 'typedef struct { int64_t sec, usec; } wk_tb_timeval; int gettimeofday(wk_tb_timeval *tv, void *tz);')

local tensorboard = {}
local Writer = {}
Writer.__index = Writer
local own_handle, close_handle = core.handle(C.wk_events_close)

local RENAMED = { eval_loss = 'eval/loss' }
local NOT_CURVES = { step = true } -- the event's own step

-- Seconds since the epoch, to the microsecond (os.time() has whole seconds only).
local timeval = ffi.new('wk_tb_timeval')
local function wall_time()
  ffi.C.gettimeofday(timeval, nil)
  return tonumber(timeval.sec) + tonumber(timeval.usec) * 1e-6
end

-- The tags and values of a log record, in tag order (the same bytes for the same record).
function tensorboard.scalars(record)
  local pairs_ = {}
  local function add(tag, v) if type(v) == 'number' then pairs_[#pairs_ + 1] = { tag, v } end end
  for k, v in pairs(record) do
    if not NOT_CURVES[k] then add(RENAMED[k] or 'train/' .. k, v) end
  end
  for i, r in ipairs(record.ranks or {}) do
    for k, v in pairs(r) do add(('ranks/%d/%s'):format(i - 1, k), v) end
  end
  table.sort(pairs_, function(a, b) return a[1] < b[1] end)
  local tags, values = {}, {}
  for i, p in ipairs(pairs_) do tags[i], values[i] = p[1], p[2] end
  return tags, values
end

-- A writer of a new file in dir, after every older file there was cut after step `start` (a resumed
-- run logs the later steps again): nil, why on failure; the count of records cut.
function tensorboard.open(dir, start)
  local removed = ffi.new('uint64_t[1]')
  local ok, why = core.try(C.wk_events_truncate_dir(dir, start, removed))
  if not ok then return nil, why end
  local handle = C.wk_events_open(dir, wall_time())
  if handle == nil then return nil, core.last_error() end
  handle = own_handle(handle) -- a backstop: close() is what closes it, and says how it went
  return setmetatable({ handle = handle, path = ffi.string(C.wk_events_path(handle)) }, Writer), tonumber(removed[0])
end

function Writer:write(record)
  local tags, values = tensorboard.scalars(record)
  local n = #tags
  local c_tags, c_values = ffi.new('const char *[?]', n), ffi.new('float[?]', n)
  for i = 1, n do c_tags[i - 1], c_values[i - 1] = tags[i], values[i] end
  return core.try(C.wk_events_write_scalars(self.handle, record.step, wall_time(), n, c_tags, c_values))
end

function Writer:close()
  if self.handle == nil then return true end
  return core.try(close_handle(self))
end

return tensorboard
