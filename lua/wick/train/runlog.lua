-- wick.train.runlog: what the trainer's rank 0 writes as a run goes: the JSONL log (log.file, one record
-- per step), TensorBoard event files (log.tensorboard, wick.train.tensorboard) and the live progress line.
--
--   local log = runlog.open(config.log, start, resumed, name)  -- start: the step the run starts after
--   log:write(metrics)                                          -- both logs, flushed
--   log:close()
--   local live = runlog.live_mode(rank)     -- 'terminal', 'launcher' or nil
--   runlog.draw(live, text, final)          -- the progress line; final: it stays as a plain line
--
-- A run resumed from step K logs steps K+1.. again, so both logs are cut after step K first: the
-- JSONL file after its last record of a step <= K, the event files before their first event of a
-- later step (and a record a killed writer left half written). Every step is then logged once.
local ffi = require 'ffi'
local cli = require 'wick.cli'
local json = require 'wick.json'
local tensorboard = require 'wick.train.tensorboard'

pcall(ffi.cdef, 'int truncate(const char *path, int64_t length); char *strerror(int errnum);')

local runlog = {}
local Log = {}
Log.__index = Log

local LIVE_VARIABLE = 'WICK_LIVE_LINE' -- set to 1 by `run --nproc-per-node` on a terminal (launch.c)

local function fail(name, message) cli.fail(name .. ': ' .. message, cli.EXIT_DATA) end

-- The byte length of the JSONL log's records of steps <= start and how many follow them; a line that
-- is no record of a step is an error naming file and line, except a last one cut short by a kill.
local function kept_length(path, start, name)
  local kind = require('wick.host').file_kind(path)
  if kind ~= 'file' then return nil end -- no log yet, or a pipe to a reader of its own: nothing to cut
  local f, why = io.open(path, 'rb')
  if not f then fail(name, 'cannot read the log to resume it: ' .. why) end
  local size = f:seek('end')
  f:seek('set')
  local kept, dropped, offset, number = 0, 0, 0, 0
  for line in f:lines() do -- a line at a time: a long run's log is never read whole
    number, offset = number + 1, offset + #line + 1
    if offset > size then break end -- a last line without its newline: cut short by a kill
    local step = tonumber(line:match('"step":(%d+)[,}]'))
    if not step then
      f:close()
      fail(name, ("%s:%d: not a record of a step (is this a log of wick's?)"):format(path, number))
    end
    if step <= start and dropped == 0 then kept = offset else dropped = dropped + 1 end
  end
  f:close()
  return kept, dropped
end

local function cut_jsonl(path, start, name)
  local kept, dropped = kept_length(path, start, name)
  if not kept then return 0 end
  if ffi.C.truncate(path, kept) ~= 0 then
    fail(name, ('cannot cut the log %s after step %d: %s'):format(path, start, ffi.string(ffi.C.strerror(ffi.errno()))))
  end
  return dropped
end

-- The logs of a run that starts after step `start`; `resumed`: it continues a checkpoint's run (the
-- JSONL log is then cut and appended to, else written anew). say(fmt, ...) prints rank 0's lines.
function runlog.open(options, start, resumed, name, say)
  local self = setmetatable({}, Log)
  if options.file then
    local dropped = resumed and cut_jsonl(options.file, start, name) or 0
    if dropped > 0 then
      say('resume: %s: %d records after step %d dropped (this run logs them again)', options.file, dropped, start)
    end
    local f, why = io.open(options.file, resumed and 'ab' or 'wb')
    if not f then fail(name, 'cannot open the log: ' .. why) end
    self.jsonl = f
  end
  if options.tensorboard then
    local w, removed_or_why = tensorboard.open(options.tensorboard, start)
    if not w then fail(name, 'log.tensorboard: ' .. removed_or_why) end
    local removed = removed_or_why
    if removed > 0 then
      say('resume: %s: %d events after step %d dropped (this run logs them again)', options.tensorboard, removed, start)
    end
    self.events = w
  end
  return self
end

-- The JSONL record of a step's metrics (wick.train's).
local function record_of(m)
  local ranks = {}
  for i, t in ipairs(m.ranks) do
    ranks[i] = { data = t.data, compute = t.compute, comm = t.comm, total = t.total, peak_bytes = t.peak_bytes }
  end
  return { step = m.step, loss = m.loss, lr = m.lr, tokens = m.tokens, tokens_per_s = m.tokens_per_s,
    data_wait = m.data_wait, grad_norm = m.grad_norm, loss_scale = m.loss_scale, fingerprint = m.fingerprint,
    micro_batch = m.micro_batch, applied = m.applied, eval_loss = m.eval_loss, mfu = m.mfu, ranks = ranks }
end

function Log:write(m)
  local r = record_of(m)
  if self.jsonl then
    self.jsonl:write(json.encode(r), '\n')
    self.jsonl:flush()
  end
  if self.events then
    local ok, why = self.events:write(r)
    if not ok then cli.fail('log.tensorboard: ' .. why, cli.EXIT_DATA) end
  end
end

function Log:close()
  if self.jsonl then self.jsonl:close() end
  if self.events then self.events:close() end
  self.jsonl, self.events = nil, nil
end

-- How rank 0 draws its progress line: on its own terminal, through the launcher (which keeps it as
-- its terminal's bottom line), or not at all (piped output: plain lines only).
function runlog.live_mode(rank)
  if rank ~= 0 then return nil end
  local host = require 'wick.host'
  if host.isatty(1) then return 'terminal' end
  local value = os.getenv(LIVE_VARIABLE)
  if value == nil or value == '' or value == '0' then return nil end
  if value ~= '1' then cli.fail(('%s=%s: must be 0 or 1'):format(LIVE_VARIABLE, value), cli.EXIT_USAGE) end
  return 'launcher'
end

-- A terminal redraws its last line after \r, so a line drawn in place is cut to the terminal's width
-- (a wrapped one left its first rows behind at each redraw), as the launcher cuts its own; a final
-- one stays whole. The launcher takes a line ended by \r for the live line and one ended by \n for a
-- plain one.
function runlog.draw(live, text, final)
  if live == 'terminal' then
    io.stdout:write('\r\27[K', final and text or require('wick.host').fit_line(text), final and '\n' or '')
  else
    io.stdout:write(text, final and '\n' or '\r')
  end
  io.stdout:flush()
end

return runlog
