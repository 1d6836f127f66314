-- wick.train.progress: what a run shows the person watching it, from rank 0: plain lines, and each
-- step's line (loss, grad norm, lr, tokens/s, data wait, eta) when due, or drawn live in place on a
-- terminal or a supervisor's status line (wick.train.runlog). The trainer's fields it reads: rank, total,
-- first_step, elapsed, waited, tokens_run, live, config.log.every; it keeps drawn and partial there.
local core = require 'wick.core'
local runlog = require 'wick.train.runlog'

local progress = {}

local now = core.now
local LOG_LINES = 10            -- plain lines in a run when log.every is 0
local PROGRESS_INTERVAL = 0.25  -- seconds between redraws of the terminal's progress line
local SECONDS_PER_MINUTE = 60

-- A line from rank 0 (the others keep quiet).
function progress.say(self, fmt, ...)
  if self.rank == 0 then print(select('#', ...) > 0 and fmt:format(...) or fmt) end
end

-- A duration as h:mm:ss.
local function clock(seconds)
  seconds = math.max(0, math.floor(seconds + 0.5))
  return ('%d:%02d:%02d'):format(seconds / 3600, (seconds % 3600) / SECONDS_PER_MINUTE, seconds % SECONDS_PER_MINUTE)
end

-- The step line: step, loss, grad norm, lr, rate, the share of time spent waiting for data, eta.
local function line_of(self, m)
  local stall = self.elapsed > 0 and 100 * self.waited / self.elapsed or 0
  local eta = (self.total - m.step) * self.elapsed / math.max(1, m.step - self.first_step)
  local parts = { ('step %d/%d'):format(m.step, self.total), ('loss %.4f'):format(m.loss), ('lr %.2e'):format(m.lr),
    ('%.0f tok/s'):format(self.tokens_run / math.max(self.elapsed, 1e-9)), ('data %.1f%%'):format(stall),
    'eta ' .. clock(eta) }
  if m.grad_norm then table.insert(parts, 3, ('grad %.3f'):format(m.grad_norm)) end
  if m.eval_loss then parts[#parts + 1] = ('eval %.4f'):format(m.eval_loss) end
  if m.mfu then parts[#parts + 1] = ('mfu %.1f%%'):format(100 * m.mfu) end
  if not m.applied then parts[#parts + 1] = '(skipped: fp16 overflow)' end
  return table.concat(parts, '  ')
end

-- A plain line from rank 0, after the terminal's progress line if one is drawn.
function progress.announce(self, fmt, ...)
  if self.partial then io.stdout:write('\n'); self.partial = false end
  progress.say(self, fmt, ...)
end

-- The run's last line of memory: the most tensor memory each rank held at once on its device (the
-- dry run's "memory per rank" estimates it), from the last step's gathered ranks; said once when the
-- ranks agree to the figure shown.
function progress.peak_memory(self, ranks)
  if #ranks == 1 then return progress.say(self, 'peak tensor memory: %s', core.format_bytes(ranks[1].peak_bytes)) end
  local most, least = 1, 1
  for r, t in ipairs(ranks) do
    if t.peak_bytes > ranks[most].peak_bytes then most = r end
    if t.peak_bytes < ranks[least].peak_bytes then least = r end
  end
  local high, low = core.format_bytes(ranks[most].peak_bytes), core.format_bytes(ranks[least].peak_bytes)
  if high == low then return progress.say(self, 'peak tensor memory per rank: %s on each of %d ranks', high, #ranks) end
  progress.say(self, 'peak tensor memory per rank: most %s (rank %d), least %s (rank %d)', high, most - 1, low, least - 1)
end

-- Shows step m's line when it is due (every log.every steps, else LOG_LINES a run, the first, the
-- last and an evaluated one), and redraws a live line between; returns whether it was due (the
-- trainer's on_log).
function progress.report(self, m)
  local every = self.config.log.every
  if every == 0 then every = math.max(1, math.floor(self.total / LOG_LINES)) end
  local due = m.step % every == 0 or m.step == self.first_step + 1 or m.step == self.total or m.eval_loss
  if self.live then
    if due or now() - (self.drawn or 0) > PROGRESS_INTERVAL then
      runlog.draw(self.live, line_of(self, m), due)
      self.drawn, self.partial = now(), not due and self.live == 'terminal'
    end
  elseif due then
    progress.say(self, '%s', line_of(self, m))
  end
  return due
end

return progress
