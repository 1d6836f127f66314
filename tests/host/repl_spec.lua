-- The REPL of `run -i`: piped input, and a typing user on a real terminal (tmux).
local helper = require 'helper'
local q = helper.shell_quote

describe('run -i with piped input', function()
  it('runs statements and prints expression values', function()
    local r = helper.run('-i', { stdin = 'x=21\nprint(x*2)\nx\n"s"\n{1, 2, a = 3}\n1, nil, true\n' })
    assert.are.equal(0, r.rc, r.err)
    assert.are.equal('42\n21\n"s"\n{1, 2, a = 3}\n1\tnil\ttrue\n', r.out)
  end)

  it('continues an unfinished statement on the next lines', function()
    local r = helper.run('-i', { stdin = 'for i = 1, 3 do\n  io.write(i)\nend\nprint()\nfunction f(a,\nb) return a + b end\nf(1, 2)\n' })
    assert.are.equal(0, r.rc, r.err)
    assert.are.equal('123\n3\n', r.out)
  end)

  it('reports an error, keeps going, and exits 1 at the end of piped input', function()
    local r = helper.run('-i', { stdin = 'error("oops")\nprint("after")\n' })
    assert.are.equal(1, r.rc)
    assert.matches('oops', r.err, 1, true)
    assert.are.equal('after\n', r.out)
  end)

  it('continues an input that ends early as an expression, such as 1 +', function()
    local r = helper.run('-i', { stdin = '1 +\n2\nx = {\n}\n"a" ..\n"b"\n' })
    assert.are.equal(0, r.rc, r.err)
    assert.are.equal('3\n"ab"\n', r.out)
  end)

  it("reports an error at stdin:LINE, with the typed code's frames only", function()
    local stdin = table.concat({
      'function check(n) if n < 0 then error("negative", 2) end return n end',
      'check(1)',
      'check(-1)',                             -- line 3: blamed by level 2, through the expression form
      'local t = check(-2)',                   -- line 4: the statement form
      'function outer() local v = inner() return v end',
      'function inner() local x = nil; return x.y end',
      'print("before")',
      'outer()',                               -- line 8
      'for i = 1,',
      '  2 do nosuch() end',                   -- line 10: line numbers count the session's input
    }, '\n') .. '\n'
    local r = helper.run('-i', { stdin = stdin })
    assert.are.equal(1, r.rc)
    assert.are.equal('1\nbefore\n', r.out)
    assert.matches('stdin:3: negative\nstack traceback:\n\t[C]: in function \'error\'\n\tstdin:1: in function \'check\'\n' ..
      '\tstdin:3: in main chunk\n', r.err, 1, true)
    assert.matches('stdin:4: negative\n', r.err, 1, true)
    assert.matches("stdin:6: attempt to index local 'x' (a nil value)\nstack traceback:\n\tstdin:6: in function " ..
      "'inner'\n\tstdin:5: in function 'outer'\n\tstdin:8: in main chunk\n", r.err, 1, true)
    assert.matches("stdin:10: attempt to call global 'nosuch' (a nil value)\nstack traceback:\n\tstdin:10: in main " ..
      'chunk\n', r.err, 1, true)
    assert.is_nil(r.err:find('repl.lua', 1, true), r.err)
    assert.is_nil(r.err:find('xpcall', 1, true), r.err)
    assert.is_nil(r.err:find('interruptible', 1, true), r.err)
  end)

  it('keeps the whole traceback at WICK_LOG=debug', function()
    local r = helper.sh('WICK_LOG=debug ' .. q(helper.RUN) .. ' -i', { stdin = 'error("oops")\n' })
    assert.are.equal(1, r.rc)
    assert.matches('stdin:1: oops', r.err, 1, true)
    assert.matches('repl.lua', r.err, 1, true)
  end)

  it('runs a script first and keeps its globals and return value', function()
    local dir = helper.tmpdir()
    local script = helper.write_file(dir .. '/recipe.lua', 'steps = 7\nreturn { lr = 0.5 }\n')
    local r = helper.run('-i ' .. q(script), { stdin = 'steps * 2\nrecipe.lr\n' })
    helper.rmtree(dir)
    assert.are.equal(0, r.rc, r.err)
    assert.are.equal('14\n0.5\n', r.out)
  end)

  it('reports input that ends inside a statement', function()
    local r = helper.run('-i', { stdin = 'for i = 1, 2 do\n' })
    assert.are.equal(1, r.rc)
    assert.matches('unfinished', r.err, 1, true)
  end)
end)

describe('run -i on a terminal', function()
  -- One session per test, named after its temporary home: unique even when other suites run this
  -- one at the same second on the same tmux server (math.random is unseeded, so the same everywhere).
  local session, home

  local function tmux(args) return helper.sh('tmux ' .. args) end
  local function keys(...) return tmux('send-keys -t ' .. session .. ' ' .. table.concat({ ... }, ' ')) end
  local function screen() return tmux('capture-pane -p -t ' .. session).out end
  local function wait_until(done)
    for _ = 1, 100 do
      if done() then return true end
      helper.sh('sleep 0.05')
    end
    return false
  end
  local function wait_for(text)
    return wait_until(function() return screen():find(text, 1, true) end) or error('not on screen: ' .. text
      .. '\n' .. screen())
  end
  -- libedit writes history with spaces escaped as \040.
  local function history() return (helper.read_file(home .. '/.wick_history'):gsub('\\040', ' ')) end

  before_each(function()
    home = helper.tmpdir()
    session = 'wick_repl_' .. home:match('[^/]+$'):gsub('[^%w]', '_')
    local cmd = string.format('env HOME=%s %s -i', q(home), q(helper.RUN))
    local r = tmux('new-session -d -x 100 -y 20 -s ' .. session .. ' ' .. q(cmd))
    assert.are.equal(0, r.rc, 'tmux could not start: ' .. r.err)
  end)

  after_each(function()
    tmux('kill-session -t ' .. session)
    helper.rmtree(home)
  end)

  it('evaluates typed lines, recalls history with the up arrow, saves it on exit', function()
    wait_for('Ctrl-D exits.')
    keys(q('x = 6 * 7'), 'Enter')
    keys('x', 'Enter')
    wait_for('\n42')
    keys('Up', q(' + 1'), 'Enter') -- the up arrow brings back `x`; typing edits it into `x + 1`
    wait_for('\n43')
    keys('C-d')
    wait_until(function() return history():find('x + 1', 1, true) end)
    assert.matches('x = 6 * 7', history(), 1, true)
    assert.matches('x + 1', history(), 1, true)
  end)

  it('interrupts running code with Ctrl-C and keeps the session', function()
    wait_for('Ctrl-D exits.')
    keys(q('kept = 5'), 'Enter')
    keys(q('jit.off() while true do end'), 'Enter') -- interpreted, so the interrupt hook runs
    helper.sh('sleep 0.3')
    keys('C-c')
    wait_for('interrupted (Ctrl-C)')
    keys(q('kept * 2'), 'Enter')
    wait_for('\n10')
    keys('C-c') -- at the prompt: ignored, the session goes on
    keys(q('kept + 1'), 'Enter')
    wait_for('\n6')
  end)
end)
