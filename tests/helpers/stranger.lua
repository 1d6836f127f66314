-- A stranger to a job's store: raw frames that bash sends through /dev/tcp, from a process of
-- another user (a throwaway account) or of another network namespace, so tests can check that
-- none of it changes what a rank does (tests/dist/dist_spec.lua, tests/dist/multinode_spec.lua).
local helper = require 'helper'
local q = helper.shell_quote

local stranger = {}

stranger.KEY, stranger.VALUE = 'wick/pause/1', 'lr_scale=0' -- what it tries to set
local PATIENCE = 15 -- seconds it waits for the store to close each connection

local function u32(n)
  return string.char(n % 256, math.floor(n / 2 ^ 8) % 256, math.floor(n / 2 ^ 16) % 256, math.floor(n / 2 ^ 24) % 256)
end
local function i64(n) return u32(n) .. u32(0) end -- small non-negative integers
local function bytes(s) return u32(#s) .. s end
local function frame(body) return u32(#body) .. body end

-- Each attempt goes on a connection of its own: the pause's key set before any hello, then hellos
-- as rank 1 with no proof and with a made-up one, each followed by the same set.
local function attempts(world_size)
  local set = frame('\2\0' .. bytes(stranger.KEY) .. bytes(stranger.VALUE))
  local function hello(proof)
    return frame('\1\0' .. i64(1) .. i64(world_size) .. bytes(string.rep('n', 32)) .. bytes(proof))
  end
  return { set, hello('') .. set, hello(string.rep('p', 32)) .. set }
end
stranger.ATTEMPTS = #attempts(1)

-- A shell command line making every attempt at host:port; each waits until the store closes it.
function stranger.command(host, port, world_size)
  local parts = {}
  for _, bytes_sent in ipairs(attempts(world_size)) do
    local escaped = bytes_sent:gsub('.', function(c) return ('\\x%02x'):format(c:byte()) end)
    parts[#parts + 1] = ('exec 3<>/dev/tcp/%s/%d && printf %s >&3 && timeout %d cat <&3 > /dev/null; exec 3<&-')
      :format(host, port, q(escaped), PATIENCE)
  end
  return 'bash -c ' .. q(table.concat(parts, '; '))
end

-- Starts the job of tests/fixtures/dist/stranger.lua in the background: launchers[i](args) is the
-- shell command of one launcher (`run --nproc-per-node N ... stranger.lua ` .. args). Returns
-- ready(), which waits for rank 0 and gives its MASTER_ADDR, MASTER_PORT and pid, and finish(),
-- which lets the ranks go on and gives each launcher's { rc, out, err }.
function stranger.start_job(launchers)
  local dir = helper.tmpdir()
  local args = ('%s %s %s'):format(q(dir .. '/ready'), q(dir .. '/done'), q(stranger.KEY))
  for i, launcher in ipairs(launchers) do
    local files = { out = ('%s/out%d'):format(dir, i), err = ('%s/err%d'):format(dir, i), rc = ('%s/rc%d'):format(dir, i) }
    os.execute(('(cd %s && %s > %s 2> %s; echo $? > %s) &'):format(q(helper.ROOT), launcher(args), q(files.out),
      q(files.err), q(files.rc)))
  end
  local function wait_file(path, polls)
    for _ = 1, polls do
      if helper.read_file(path) ~= '' then return helper.read_file(path) end
      helper.sh('sleep 0.1')
    end
  end
  local function ready()
    local text = wait_file(dir .. '/ready', 600)
    if not text then error('the job never got ready: ' .. helper.read_file(dir .. '/err1')) end
    return text:match('^(%S+) (%d+) (%d+)$')
  end
  local function finish()
    helper.write_file(dir .. '/done', '')
    local results = {}
    for i = 1, #launchers do
      wait_file(('%s/rc%d'):format(dir, i), 1200)
      results[i] = { rc = tonumber(helper.read_file(('%s/rc%d'):format(dir, i))),
        out = helper.read_file(('%s/out%d'):format(dir, i)), err = helper.read_file(('%s/err%d'):format(dir, i)) }
    end
    helper.rmtree(dir)
    return results
  end
  return ready, finish
end

-- The local addresses a job's ranks printed ("sockets on ..."), and how many were listeners.
function stranger.addresses(out)
  local all, listeners = {}, 0
  for line in out:gmatch('sockets on ([^\n]*)') do
    for address in line:gmatch('%S+') do
      if address:match('^listen:') then listeners = listeners + 1 end
      all[#all + 1] = address:gsub('^listen:', '')
    end
  end
  return all, listeners
end

-- Runs command as a throwaway user made for it (removed after): the result of helper.sh, or nil
-- and why no user could be made (that needs root).
function stranger.as_other_user(command)
  local pid = tonumber(helper.read_file('/proc/self/stat'):match('^(%d+)'))
  local name = 'wkstranger' .. pid % 100000
  local made = helper.sh('useradd --system --no-create-home --shell /usr/sbin/nologin ' .. name)
  if made.rc ~= 0 then return nil, 'cannot make a second user (useradd needs root): ' .. made.err end
  local r = helper.sh(('setpriv --reuid=%s --regid=%s --clear-groups %s'):format(name, name, command))
  helper.sh('userdel ' .. name)
  return r
end

return stranger
