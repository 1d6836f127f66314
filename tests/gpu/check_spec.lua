-- make gpu-check (tests/gpu/check.lua) on a machine without a GPU: it must fail at once, exit 1,
-- with one line saying so, and build or write nothing. (With a GPU it runs for minutes: the lent
-- machine runs it, not the suite.)
local helper = require 'helper'
local core = require 'wick.core'
local q = helper.shell_quote

local MAX_SECONDS = 5

local function timed(command)
  local t0 = tonumber(core.C.wk_now_ns())
  local r = helper.sh(command)
  r.seconds = (tonumber(core.C.wk_now_ns()) - t0) * 1e-9
  return r
end

local function no_gpu_or_skip()
  if core.C.wk_cuda_device_count() == 0 then return true end
  pending('skipped: this machine has a GPU, where make gpu-check runs for minutes')
end

describe('make gpu-check without a GPU', function()
  local NO_GPU = '^gpu%-check: no GPU found: [^\n]+; nothing was run\n$'

  it('fails at once with one line: the script', function()
    if not no_gpu_or_skip() then return end
    local dir = helper.tmpdir()
    local r = timed(('cd %s && WICK_GPU_CHECK_DIR=%s/out %s tests/gpu/check.lua 2>&1'):format(q(helper.ROOT), q(dir),
      q(helper.RUN)))
    assert.are.equal(1, r.rc)
    assert.matches(NO_GPU, r.out)
    assert.is_true(r.seconds < MAX_SECONDS, r.seconds .. ' s')
    assert.is_nil(io.open(dir .. '/out'), 'it wrote its report directory')
    helper.rmtree(dir)
  end)

  it('fails at once with the same line through make, building nothing', function()
    if not no_gpu_or_skip() then return end
    local r = timed(('cd %s && make --no-print-directory gpu-check'):format(q(helper.ROOT)))
    assert.are_not.equal(0, r.rc)
    assert.matches(NO_GPU, r.out)  -- stdout: the script's line alone (make's own "Error 1" is on stderr)
    assert.is_true(r.seconds < MAX_SECONDS, r.seconds .. ' s')
  end)
end)
