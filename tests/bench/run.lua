-- make bench: runs every tests/bench/*.lua (except this file) in a fresh `run` process, in name order.
-- Each bench prints its own rows: measured value, the baseline measured in the same run, the ratio.
local host = require 'wick.host'
local dir = host.home .. '/tests/bench'

local files = {}
for name in io.popen('ls ' .. dir):lines() do
  if name:match('%.lua$') and name ~= 'run.lua' then files[#files + 1] = name end
end
table.sort(files)

local failed = {}
for _, name in ipairs(files) do
  print(('== %s (reproduce: ./run tests/bench/%s)'):format(name, name))
  local ok = os.execute(("'%s' '%s/%s'"):format(host.exe, dir, name)) == 0
  if not ok then failed[#failed + 1] = name end
end
if #failed > 0 then
  io.stderr:write('bench: failed: ', table.concat(failed, ', '), '\n')
  os.exit(1)
end
