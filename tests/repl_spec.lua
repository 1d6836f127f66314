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
  local session = 'wick_repl_' .. tostring(os.time()) .. '_' .. tostring(math.random(1e6))
  local home

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
