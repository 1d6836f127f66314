-- Runs the busted suite inside `run`, so specs exercise the real host and the real libwick.
--   ./run tests/busted.lua [busted options] [spec files]
-- busted ends a failing run with error() (Lua 5.1 style); turn that into a plain exit status 1. A run
-- that leaves files in the checkout outside build/ fails too (tests/helpers/clean_tree.lua).
-- Every Python a spec starts (the oracles under tests/helpers, the venvs' scripts) inherits
-- PYTHONDONTWRITEBYTECODE=1 from here, so none writes __pycache__ into the checkout on a machine that
-- does not set it itself.
local ffi = require 'ffi'
pcall(ffi.cdef, 'int setenv(const char *name, const char *value, int overwrite);')
assert(ffi.C.setenv('PYTHONDONTWRITEBYTECODE', '1', 1) == 0, 'setenv PYTHONDONTWRITEBYTECODE')
local root = require('wick.host').home
local clean_tree = dofile(root .. '/tests/helpers/clean_tree.lua')
local before = clean_tree.untracked(root)

local ok, err = pcall(require 'busted.runner', { standalone = false })

local after = before and clean_tree.untracked(root)
local left = after and clean_tree.added(before, after) or {}
if #left > 0 then
  io.stderr:write(('the run left %d file(s) in the checkout outside build/ (write them under build/ or a '
    .. 'temporary directory):\n  %s\n'):format(#left, table.concat(left, '\n  ')))
  os.exit(1)
end
if not ok then
  if err ~= nil then io.stderr:write(tostring(err), '\n') end
  os.exit(1)
end
