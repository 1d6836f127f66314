-- Runs each C test program (tests/c/test_*.c, built by `make test` into build/tests/).
local helper = require 'helper'

describe('C tests', function()
  local listing = helper.sh('ls ' .. helper.ROOT .. '/tests/c/test_*.c')
  for source in listing.out:gmatch('[^\n]+') do
    local name = source:match('(test_[%w_]+)%.c$')
    it(name, function()
      local binary = helper.ROOT .. '/build/tests/' .. name
      local result = helper.sh(helper.shell_quote(binary))
      assert.are.equal(0, result.rc, name .. ' failed:\n' .. result.out .. result.err)
    end)
  end
end)
