-- Shared by the bench files: timing, the one row format every bench prints, and running commands.
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
-- setup(), when given, runs before each timing, untimed.
function report.best(repeats, fn, setup)
  local best = math.huge
  for _ = 1, repeats do
    if setup then setup() end
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

-- ---- commands and files ---------------------------------------------------------------------------

function report.exists(path)
  local f = io.open(path)
  if f then f:close() end
  return f ~= nil
end

local STATUS_MARK = '\nWICK_BENCH_EXIT=' -- LuaJIT's pipe:close() does not give the exit status: the shell prints it

-- Runs a shell command; its output (stdout and stderr) and whether it exited 0.
function report.capture(cmd)
  local pipe = io.popen('( ' .. cmd .. ' ) 2>&1; echo "' .. STATUS_MARK .. '$?"')
  local out = pipe:read('*a')
  pipe:close()
  local body, status = out:match('^(.-)' .. STATUS_MARK .. '(%d+)\n$')
  return body or out, tonumber(status) == 0
end

-- The pinned test venv (third_party/test-venv.sh), made when missing or stale: its python; or, when it
-- cannot be made (no PyPI), nil after printing `row` as n/a with `why` it is needed.
function report.test_python(row, why)
  local home = require('wick.host').home
  local out, ok = report.capture(("sh '%s/third_party/test-venv.sh' '%s/build/test/venv'"):format(home, home))
  io.write(out)
  if ok then return home .. '/build/test/venv/bin/python' end
  report.na(row, 'no test venv (is PyPI reachable?): ' .. why)
end

-- Runs a shell command that must succeed, printed first unless `quiet`; raises naming `who` if it fails.
function report.sh(who, cmd, quiet)
  if not quiet then print('  $ ' .. cmd) end
  local ok = os.execute(cmd)
  if ok ~= 0 and ok ~= true then error(who .. ': command failed: ' .. cmd, 0) end
end

-- A result line's key=value numbers (`tokens_per_s=1.5e8 cpu_s=0.3 ...`) as a table.
function report.fields(line)
  local fields = {}
  for k, v in line:gmatch('([%w_]+)=([%d%.]+)') do fields[k] = tonumber(v) end
  return fields
end

return report
