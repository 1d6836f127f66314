-- Foundation costs: a call through the FFI into libwick, and launching ranks.
package.path = require('wick.host').home .. '/tests/bench/lib/?.lua;' .. package.path
local report = require 'report'
local host = require 'wick.host'
local C = require('wick.core').C

local CALLS = 2e7
local LAUNCH_REPEATS = 5
local RANKS = 4

-- A Lua function that the JIT cannot inline away: the baseline cost of any call from a recipe.
local sink = 0
local lua_fn = function(x) sink = sink + x return sink end

local ffi_time = report.best(3, function()
  local wk_version = C.wk_version
  local acc = 0
  for _ = 1, CALLS do acc = acc + wk_version() end
  sink = sink + acc
end)
local lua_time = report.best(3, function()
  for i = 1, CALLS do lua_fn(i) end
end)
report.row('FFI call into libwick (wk_version)', ffi_time / CALLS * 1e9, 'ns/call',
  'Lua function call', lua_time / CALLS * 1e9, false)

local function time_command(cmd)
  return report.best(LAUNCH_REPEATS, function() assert(os.execute(cmd .. ' > /dev/null') == 0) end)
end
local single = time_command(("'%s' -e ''"):format(host.exe))
local launched = time_command(("'%s' --nproc-per-node %d -e ''"):format(host.exe, RANKS))
report.row(('launch %d ranks (run --nproc-per-node %d)'):format(RANKS, RANKS), launched * 1e3, 'ms',
  'one `run -e ""`', single * 1e3, false)
