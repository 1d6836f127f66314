-- The live progress line of a launched job: on a terminal (tmux) rank 0's line stays the bottom line
-- while the other rank's lines are printed above it, prefixed and whole; piped, every line is plain.
-- A single process draws its own line in place, cut to the terminal's width as the launcher cuts it.
local ffi = require 'ffi'
local helper = require 'helper'
local data_helper = require 'helpers.data'
local q = helper.shell_quote

pcall(ffi.cdef, 'int usleep(unsigned int usec);')

local POLL_US = 20000
local WAIT_POLLS = 3000 -- 60 s
local STEPS = 40

local function tmux(args) return helper.sh('tmux ' .. args) end

-- Every line a screen may show: a rank's whole line (one prefix, at its start), the live line (rank 0's
-- progress, unprefixed) as the bottom line only, or the shell's closing echo.
local function check_screen(screen)
  local lines = {}
  for line in screen:gmatch('[^\n]*') do if line:match('%S') then lines[#lines + 1] = line end end
  local live
  for i, line in ipairs(lines) do
    local body = line:match('^%[rank[01]%] (.*)$')
    if line:match('^step %d+/' .. STEPS .. '  loss') then
      assert.are.equal(#lines, i, 'the live line is the bottom line:\n' .. screen)
      live = line
    elseif not line:match('^exit status %d+$') then
      assert.is_not_nil(body, 'not a whole line of a rank:\n' .. screen)
    end
    assert.is_nil((body or line):find('[rank', 1, true), 'two lines mixed:\n' .. screen)
  end
  return live
end

describe('the live line of run --nproc-per-node', function()
  local root, recipe
  setup(function()
    root = helper.tmpdir()
    local dataset = data_helper.make_dataset(root .. '/data', data_helper.documents(300, 40, 6), { shard_size = 4096 })
    recipe = helper.write_file(root .. '/r.lua', ([[
local ffi = require 'ffi'
pcall(ffi.cdef, 'int usleep(unsigned int usec);')
return {
  model = { layers = 1, heads = 2, dim = 16 },
  data = { sources = { %q }, seq_len = 32 },
  batch = { global = 4, micro = 2 },
  optim = { lr = 3e-3, warmup = 2 },
  steps = %d, seed = 3, log = { every = 20 },
  checkpoint = { final = false }, -- the runs are about their lines: none leaves a checkpoint
  callbacks = { on_step_end = function(t, m)
    if t.rank == 1 then print(('rank 1 done with step %%d'):format(m.step)) io.stdout:flush() end
    if t.rank == 0 then ffi.C.usleep(60000) end -- steps long enough for the line to be redrawn
  end },
}
]]):format(dataset, STEPS))
  end)
  teardown(function() helper.rmtree(root) end)

  -- Runs the shell command cmd in a detached tmux terminal of `columns`, passes live(screen) each
  -- screen (wrapped lines joined) until cmd's closing "exit status" shows, and returns the last
  -- screen and how many of them live counted true.
  local function on_terminal(name, columns, cmd, live)
    local session = name .. '_' .. root:match('[^/]+$'):gsub('[^%w]', '_')
    cmd = cmd .. '; echo "exit status $?"; sleep 30'
    assert.are.equal(0, tmux(('new-session -d -x %d -y 50 -s %s %s'):format(columns, session, q(cmd))).rc)
    local ok, screen, lives = pcall(function()
      local screen, lives = '', 0
      for _ = 1, WAIT_POLLS do
        screen = tmux('capture-pane -p -J -t ' .. session).out
        if live(screen) then lives = lives + 1 end
        if screen:find('exit status', 1, true) then break end
        ffi.C.usleep(POLL_US)
      end
      return screen, lives
    end)
    tmux('kill-session -t ' .. session)
    assert(ok, screen)
    assert.matches('exit status 0', screen, 1, true)
    assert.is_true(lives > 0, 'the live line was never on screen')
    return screen
  end

  it('keeps rank 0 live line at the bottom of a terminal (tmux), other lines whole above it', function()
    local screen = on_terminal('wick_live', 200, ('%s --nproc-per-node 2 %s'):format(q(helper.RUN), q(recipe)),
      check_screen)
    assert.is_nil(check_screen(screen), 'the live line is gone at the end:\n' .. screen)
    assert.matches('[rank1] rank 1 done with step ' .. STEPS, screen, 1, true)
    assert.matches('[rank0] step ' .. STEPS .. '/' .. STEPS, screen, 1, true)
  end)

  it("draws a single process's line in place within an 80-column terminal (tmux), leaving no trail", function()
    -- log.peak_flops adds mfu: the line is about 95 columns, wider than the terminal
    local screen = on_terminal('wick_live1', 80, ('%s %s --log.peak_flops=1e12'):format(q(helper.RUN), q(recipe)),
      function(screen)
        local drawn = {}  -- rows of steps drawn in place: not the plain lines of steps 1, 20 and 40
        for line in screen:gmatch('[^\n]+') do
          local step = tonumber(line:match('^step (%d+)/' .. STEPS .. ' '))
          if step and step ~= 1 and step % 20 ~= 0 then drawn[#drawn + 1] = line end
        end
        assert.is_true(#drawn <= 1, 'a trail of redrawn lines:\n' .. screen)
        assert.is_true(#(drawn[1] or '') <= 80, 'wider than the terminal: ' .. tostring(drawn[1]))
        return drawn[1] ~= nil
      end)
    assert.matches('\nstep ' .. STEPS .. '/' .. STEPS .. '  loss [^\n]+mfu', screen)
  end)

  it('fits a line to COLUMNS where stdout is no terminal, else to 80, never cutting a UTF-8 character', function()
    local script = helper.write_file(root .. '/fit.lua', [[
local fit = require('wick.host').fit_line
io.write(#fit(('x'):rep(200)), ' ', #fit(('x'):rep(38) .. '\u{e9}z'), ' ', fit('short'), '\n')]])
    assert.are.equal('39 38 short\n', helper.sh(('COLUMNS=40 %s %s | cat'):format(q(helper.RUN), q(script))).out)
    assert.are.equal('79 41 short\n', helper.sh(('COLUMNS=x %s %s | cat'):format(q(helper.RUN), q(script))).out)
  end)

  it('prints plain lines when piped, whatever WICK_LIVE_LINE the user has set', function()
    local r = helper.sh(('WICK_LIVE_LINE=1 %s --nproc-per-node 2 %s | cat'):format(q(helper.RUN), q(recipe)))
    assert.are.equal(0, r.rc, r.err)
    assert.is_nil(r.out:find('\r', 1, true), 'no live line in a pipe')
    for _, line in ipairs(helper.lines(r.out)) do assert.matches('^%[rank[01]%] ', line) end
    assert.matches('[rank0] step 20/' .. STEPS, r.out, 1, true)
  end)

  it('refuses a WICK_LIVE_LINE that is neither 0 nor 1, in one line', function()
    local r = helper.sh(('WICK_LIVE_LINE=yes %s %s --steps=1'):format(q(helper.RUN), q(recipe)))
    assert.are.equal(2, r.rc, r.err)
    assert.matches('^WICK_LIVE_LINE=yes: must be 0 or 1\n$', r.err)
  end)
end)
