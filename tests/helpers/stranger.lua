-- A stranger to a job's store: raw frames that bash sends through /dev/tcp, from a process of
-- another user (a throwaway account) or of another network namespace, so tests can check that
-- none of it changes what a rank does (tests/dist_spec.lua, tests/multinode_spec.lua).
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
