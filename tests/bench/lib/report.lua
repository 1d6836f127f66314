-- Shared by the bench files: timing and the one row format every bench prints.
local ffi = require 'ffi'
pcall(ffi.cdef, [[
  typedef struct { long tv_sec; long tv_nsec; } wick_bench_timespec;
  int clock_gettime(int clock_id, wick_bench_timespec *ts);
]])
local CLOCK_MONOTONIC = 1

local report = {}
local ts = ffi.new('wick_bench_timespec')

function report.now()
  ffi.C.clock_gettime(CLOCK_MONOTONIC, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

-- Best of `repeats` timings of fn() (seconds); the minimum is the least noisy estimate here.
function report.best(repeats, fn)
  local best = math.huge
  for _ = 1, repeats do
    local t0 = report.now()
    fn()
    best = math.min(best, report.now() - t0)
  end
  return best
end

-- One row: what, our value, the baseline's value, and ratio = ours / baseline in the unit's sense.
-- goal (optional): the least ratio the issue asks for, printed with whether this run meets it.
function report.row(what, value, unit, baseline_name, baseline, higher_is_better, goal)
  local ratio = higher_is_better and value / baseline or baseline / value
  local verdict = goal and ('  goal x%.2f: %s'):format(goal, ratio >= goal and 'met' or 'MISSED') or ''
  print(('%-44s %12.3f %-8s | %-28s %12.3f | x%.2f %s%s'):format(what, value, unit, baseline_name, baseline,
    ratio, higher_is_better and '(higher is better)' or '(lower is better)', verdict))
end

-- A row that cannot be measured here, and why (a counter or option the code under test lacks).
function report.na(what, why)
  print(('%-44s %12s          | %s'):format(what, 'n/a', why))
end

return report
