-- Runs the busted suite inside `run`, so specs exercise the real host and the real libwick.
--   ./run tests/busted.lua [busted options] [spec files]
-- busted ends a failing run with error() (Lua 5.1 style); turn that into a plain exit status 1.
local ok, err = pcall(require 'busted.runner', { standalone = false })
if not ok then
  if err ~= nil then io.stderr:write(tostring(err), '\n') end
  os.exit(1)
end
