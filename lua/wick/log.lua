-- wick.log: leveled logging shared with the C runtime (one level, set by WICK_LOG or wick.log.set).
--   wick.log.info('step %d loss %.3f', step, loss)
local core = require 'wick.core'
local ffi = core.ffi
local C = core.C

local log = {}

local levels = { error = C.WK_LOG_ERROR, warn = C.WK_LOG_WARN, info = C.WK_LOG_INFO, debug = C.WK_LOG_DEBUG }

function log.set(name)
  local level = ffi.new('WkLogLevel[1]')
  core.check(C.wk_parse_log_level(tostring(name), level), 2)
  C.wk_set_log_level(level[0])
end

function log.level()
  for name, value in pairs(levels) do
    if value == C.wk_log_level() then return name end
  end
end

for name, value in pairs(levels) do
  log[name] = function(fmt, ...)
    if C.wk_log_level() < value then return end
    C.wk_log_message(value, select('#', ...) > 0 and string.format(fmt, ...) or tostring(fmt))
  end
end

return log
