-- The local launcher: `run --nproc-per-node N ...` starts real rank processes and supervises them.
local helper = require 'helper'
local q = helper.shell_quote

-- Lua source for a rank that reports its pid (ranks are real processes; tests check they are gone).
local PID = [[local ffi = require 'ffi'; pcall(ffi.cdef, 'int getpid(void);'); ]]
  .. [[print('pid=' .. ffi.C.getpid()); io.stdout:flush(); ]]

local function pids_in(text)
  local pids = {}
  for pid in text:gmatch('pid=(%d+)') do pids[#pids + 1] = pid end
  return pids
end

-- A process counts as alive unless it is gone or a zombie (an orphan waiting for init to reap it);
-- a SIGKILL takes a moment to land, so look a few times before saying it is still alive.
local function alive(pid)
  for _ = 1, 20 do
    local state = helper.sh('ps -o stat= -p ' .. pid).out
    if state == '' or state:match('^Z') then return false end
    helper.sh('sleep 0.05')
  end
  return true
end

local function sorted_lines(text)
  local lines = helper.lines(text)
  table.sort(lines)
  return lines
end

describe('run --nproc-per-node', function()
  it('starts N ranks with the torchrun environment, each line prefixed by its rank', function()
    local r = helper.run([[--nproc-per-node 3 -e 'print(os.getenv("RANK").."/"..os.getenv("WORLD_SIZE"))']])
    assert.are.equal(0, r.rc, r.err)
    assert.are.same({ '[rank0] 0/3', '[rank1] 1/3', '[rank2] 2/3' }, sorted_lines(r.out))
  end)

  it('gives every rank the same rendezvous address and its local rank', function()
    local code = [[print(table.concat({os.getenv("LOCAL_RANK"), os.getenv("LOCAL_WORLD_SIZE"),
      os.getenv("MASTER_ADDR"), os.getenv("MASTER_PORT")}, " "))]]
    local r = helper.run('--nproc-per-node 2 -e ' .. q(code))
    assert.are.equal(0, r.rc, r.err)
    local lines = sorted_lines(r.out)
    local port0 = lines[1]:match('^%[rank0%] 0 2 127%.0%.0%.1 (%d+)$')
    local port1 = lines[2]:match('^%[rank1%] 1 2 127%.0%.0%.1 (%d+)$')
    assert.is_not_nil(port0, r.out)
    assert.are.equal(port0, port1)
  end)

  it('follows torchrun for --nnodes, --node-rank, --master-addr and --master-port', function()
    local code = [[print(os.getenv("RANK"), os.getenv("WORLD_SIZE"), os.getenv("LOCAL_RANK"),
      os.getenv("GROUP_RANK"), os.getenv("MASTER_ADDR"), os.getenv("MASTER_PORT"))]]
    local r = helper.run('--nnodes 2 --node-rank 1 --nproc-per-node 2 --master-addr node0 --master-port 4242 -e '
      .. q(code))
    assert.are.equal(0, r.rc, r.err)
    assert.are.same({ '[rank2] 2\t4\t0\t1\tnode0\t4242', '[rank3] 3\t4\t1\t1\tnode0\t4242' }, sorted_lines(r.out))
    local default_port = helper.run('--nnodes 2 --node-rank 0 --nproc-per-node 1 -e ' .. q(code))
    assert.matches('\t29500\n$', default_port.out)
  end)

  it('gives the ranks of one launch a secret of their own; passes on a given one; makes none for --nnodes', function()
    local code = [[print(os.getenv("WICK_STORE_SECRET") or "none")]]
    local secrets = {}
    for launch = 1, 2 do
      local r = helper.sh('env -u WICK_STORE_SECRET -u WICK_STORE_SECRET_FILE ' .. q(helper.RUN)
        .. ' --nproc-per-node 2 -e ' .. q(code))
      assert.are.equal(0, r.rc, r.err)
      local lines = sorted_lines(r.out)
      secrets[launch] = lines[1]:match('^%[rank0%] (%x+)$')
      assert.are.equal(64, #(secrets[launch] or ''), r.out)
      assert.are.equal('[rank1] ' .. secrets[launch], lines[2])
    end
    assert.are_not.equal(secrets[1], secrets[2])
    local given = helper.sh('env WICK_STORE_SECRET=given-secret-of-the-job ' .. q(helper.RUN) .. ' --nproc-per-node 1 -e '
      .. q(code))
    assert.are.equal('[rank0] given-secret-of-the-job\n', given.out)
    local multi = helper.sh('env -u WICK_STORE_SECRET -u WICK_STORE_SECRET_FILE ' .. q(helper.RUN)
      .. ' --nnodes 2 --node-rank 1 --nproc-per-node 1 --master-addr node0 -e ' .. q(code))
    assert.are.equal('[rank1] none\n', multi.out)
  end)

  it('rejects a node rank outside the job', function()
    local r = helper.run('--nnodes 2 --node-rank 2 --nproc-per-node 1 -e "print(1)"')
    assert.are.equal(2, r.rc)
  end)

  it('passes the script and its arguments, and forwards stderr with the prefix', function()
    local dir = helper.tmpdir()
    local script = helper.write_file(dir .. '/r.lua', 'io.stderr:write("warn ", arg[1], "\\n")')
    local r = helper.run('--nproc-per-node 2 ' .. q(script) .. ' --flag')
    helper.rmtree(dir)
    assert.are.equal(0, r.rc, r.err)
    assert.are.same({ '[rank0] warn --flag', '[rank1] warn --flag' }, sorted_lines(r.err))
  end)

  it('keeps long lines of concurrent ranks whole', function()
    local code = [[local s = string.rep(os.getenv("RANK"), 10000) for i = 1, 20 do print(s) end]]
    local r = helper.run('--nproc-per-node 2 -e ' .. q(code))
    assert.are.equal(0, r.rc, r.err)
    local lines = helper.lines(r.out)
    assert.are.equal(40, #lines)
    for _, line in ipairs(lines) do
      local rank, body = line:match('^%[rank(%d)%] (%d+)$')
      assert.are.equal(string.rep(rank, 10000), body)
    end
  end)

  it('stops all ranks when one fails, names it, and leaves no process behind', function()
    local code = PID .. [[if os.getenv("RANK") == "1" then os.execute("sleep 0.3") os.exit(3) end
      while true do end]]
    local r = helper.sh('timeout 30 ' .. q(helper.RUN) .. ' --nproc-per-node 3 -e ' .. q(code))
    assert.are.equal(3, r.rc, r.err)
    assert.matches('rank 1 %(pid %d+%) exited with status 3', r.err)
    local pids = pids_in(r.out)
    assert.are.equal(3, #pids)
    for _, pid in ipairs(pids) do assert.is_false(alive(pid), 'rank pid ' .. pid .. ' still alive') end
  end)

  it('also stops what a failed rank started in the background', function()
    local dir = helper.tmpdir()
    local code = string.format([[os.execute("sleep 300 & echo $! > %s/child") os.exit(1)]], dir)
    local r = helper.sh('timeout 30 ' .. q(helper.RUN) .. ' --nproc-per-node 1 -e ' .. q(code))
    local child = helper.read_file(dir .. '/child'):match('%d+')
    helper.rmtree(dir)
    assert.are.equal(1, r.rc)
    assert.is_not_nil(child)
    assert.is_false(alive(child), 'background child ' .. child .. ' of the rank still alive')
  end)

  it('names the signal of a rank that was killed', function()
    local code = PID .. [[if os.getenv("RANK") == "0" then os.execute("kill -9 $PPID") end while true do end]]
    local r = helper.sh('timeout 30 ' .. q(helper.RUN) .. ' --nproc-per-node 2 -e ' .. q(code))
    assert.are.equal(128 + 9, r.rc)
    assert.matches('rank 0 %(pid %d+%) was killed by signal 9', r.err)
  end)

  it('forwards Ctrl-C (SIGINT) to every rank and exits 130', function()
    local dir = helper.tmpdir()
    local out = dir .. '/out'
    local code = PID .. 'while true do end'
    local script = string.format([[
      %s --nproc-per-node 2 -e %s > %s 2>&1 &
      launcher=$!
      for i in $(seq 100); do [ "$(grep -c pid= %s)" = 2 ] && break; sleep 0.1; done
      kill -INT $launcher
      wait $launcher
      echo "exit=$?" >> %s]], q(helper.RUN), q(code), q(out), q(out), q(out))
    helper.sh('timeout 30 bash -c ' .. q(script))
    local text = helper.read_file(out)
    helper.rmtree(dir)
    assert.matches('exit=130', text, 1, true)
    local pids = pids_in(text)
    assert.are.equal(2, #pids, text)
    for _, pid in ipairs(pids) do assert.is_false(alive(pid)) end
  end)

  it('takes the ranks down with it when the launcher itself is killed', function()
    local dir = helper.tmpdir()
    local out = dir .. '/out'
    local script = string.format([[
      %s --nproc-per-node 2 -e %s > %s 2>&1 &
      launcher=$!
      for i in $(seq 100); do [ "$(grep -c pid= %s)" = 2 ] && break; sleep 0.1; done
      kill -9 $launcher]], q(helper.RUN), q(PID .. 'while true do end'), q(out), q(out))
    helper.sh('timeout 30 bash -c ' .. q(script))
    local pids = pids_in(helper.read_file(out))
    helper.rmtree(dir)
    assert.are.equal(2, #pids)
    for _, pid in ipairs(pids) do assert.is_false(alive(pid), 'rank ' .. pid .. ' outlived its launcher') end
  end)
end)
