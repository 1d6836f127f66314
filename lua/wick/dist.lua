-- wick.dist: process groups and collectives (runtime/dist).
--
--   local dist = wick.dist.init { timeout = 30 }   -- seconds; the world comes from torchrun's or
--                                                  -- SLURM's variables; alone: a world of 1
--   dist.rank, dist.world_size, dist.local_rank, dist.local_world_size
--   dist:all_reduce(t, 'sum' | 'avg' | 'max' | 'min')   -- in place; f32, bf16, f16, i32, i64, u8
--   dist:broadcast(t, root)
--   dist:all_gather(out, t)          -- out holds world_size * t:numel() elements, rank order
--   dist:reduce_scatter(out, t, op)  -- t holds world_size * out:numel(); out gets this rank's block
--   dist:barrier()
--   local work = dist:all_reduce_start(t, op); ...; work:wait()   -- runs on the group's worker
--   local work = dist:reduce_scatter_start(out, t, op); ...; work:wait()
--   local work = dist:all_gather_start(out, t); ...; work:wait()
--   dist.store:set(key, value), :get(key, timeout), :wait(keys, timeout), :add(key, n), :compare_set(...)
--   dist:close()
--
-- Every collective is bounded by the timeout. When a rank dies or falls behind, the others raise
-- the hang report: the collective (name, sequence number, size), the recipe line that called it,
-- and the missing ranks with where they were. CPU tensors go through Gloo, CUDA tensors through
-- NCCL (when libwick was built with it). The store can also be used alone:
--   local server = wick.dist.serve_store { host = '127.0.0.1', port = 0, world_size = 2 }  -- :port(), :stop()
--   local store = wick.dist.connect_store { host = '127.0.0.1', port = p, rank = 0, world_size = 2, timeout = 5 }
-- Both prove the job's secret (WICK_STORE_SECRET or WICK_STORE_SECRET_FILE) to each other.
local core = require 'wick.core'

local ffi, C = core.ffi, core.C
local check = core.check
local schema = require 'wick.schema'

local dist = {}

local DEFAULT_TIMEOUT = 300      -- seconds
local MAX_TIMEOUT = C.WK_DIST_MAX_TIMEOUT_S
local MAX_WORLD = C.WK_DIST_MAX_WORLD
-- For the recipe's and the checkpoint's fields of the same meaning.
dist.DEFAULT_TIMEOUT, dist.MAX_TIMEOUT, dist.MAX_WORLD = DEFAULT_TIMEOUT, MAX_TIMEOUT, MAX_WORLD
local GET_BUFFER_BYTES = 65536   -- a get's first try; longer values are fetched again in full
local REDUCE = { sum = C.WK_REDUCE_SUM, avg = C.WK_REDUCE_AVG, max = C.WK_REDUCE_MAX, min = C.WK_REDUCE_MIN }
local SOURCES = { [C.WK_WORLD_SINGLE] = 'single', [C.WK_WORLD_TORCHRUN] = 'torchrun', [C.WK_WORLD_SLURM] = 'slurm' }

-- Lua files of wick itself: a hang report names the first line outside them (the recipe's).
local WICK_SOURCE = debug.getinfo(1, 'S').source:match('^@(.*/)wick/[^/]*$')

-- "recipe.lua:31": the innermost caller outside lua/wick, for the hang report.
local function call_site()
  for level = 3, 30 do
    local info = debug.getinfo(level, 'Sl')
    if not info then break end
    local source = info.source
    if source:sub(1, 1) == '@' and not (WICK_SOURCE and source:sub(2, #WICK_SOURCE + 1) == WICK_SOURCE) then
      return info.short_src .. ':' .. info.currentline
    end
  end
  return nil
end
dist.call_site = call_site

-- ---- options (wick.schema: each checked where it enters, unknown keys refused) ------------------

local function is_seconds(value)
  return type(value) == 'number' and value > 0 and value <= MAX_TIMEOUT, -- false for NaN
    ('must be a number of seconds in (0, %d]'):format(MAX_TIMEOUT)
end

local function is_host(value)
  return type(value) == 'string' and value ~= '', 'must be a host name or address'
end

local TIMEOUT = { 'timeout', 'seconds', check = is_seconds, parse = 'number', help = 'seconds each call may wait' }
local HOST = { 'host', 'host', check = is_host, parse = 'string', default = '127.0.0.1' }
local WORLD_SIZE = { 'world_size', 'integer', min = 1, max = MAX_WORLD }

local INIT = schema.define('dist.init option', { schema.copy(TIMEOUT, { default = DEFAULT_TIMEOUT }) })
local CONNECT = schema.define('dist.connect_store option', {
  HOST,
  { 'port', 'integer', min = 1, max = 65535, required = true },
  { 'rank', 'integer', min = 0, max = MAX_WORLD - 1, help = 'with world_size: this rank of the job' },
  WORLD_SIZE,
  schema.copy(TIMEOUT, { default = DEFAULT_TIMEOUT }),
})
local SERVE = schema.define('dist.serve_store option', {
  HOST,
  { 'port', 'integer', min = 0, max = 65535, default = 0, help = '0: any free port' },
  schema.copy(WORLD_SIZE, { default = 1 }),
})
-- The positional arguments of the store's and the group's calls.
local ARGUMENT = schema.define('argument', {
  TIMEOUT,
  { 'delta', 'integer', min = -2 ^ 53, max = 2 ^ 53 },
  { 'root', 'integer', min = 0, max = MAX_WORLD - 1 },
})

-- Checked seconds as the milliseconds C takes (at least 1).
local function milliseconds(seconds, level)
  return math.max(1, math.floor(ARGUMENT:check_value('timeout', seconds, level + 1) * 1000 + 0.5))
end

-- What the runtime refuses in the job's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
-- WICK_STORE_SECRET...: WK_ERR_INVALID_ARG) is the user's mistake: one line and exit 2.
local function check_environment(ok, level)
  if ok then return end
  if C.wk_last_status() == C.WK_ERR_INVALID_ARG then require('wick.cli').fail(core.last_error(), 2) end
  error(core.last_error(), level + 1)
end

-- ---- the world ---------------------------------------------------------------------------------

-- { rank, world_size, local_rank, local_world_size, master_addr, master_port, source } from the env.
function dist.world()
  local w = ffi.new('WkWorld')
  check_environment(C.wk_world_from_env(w) == C.WK_OK, 2)
  return {
    rank = w.rank, world_size = w.world_size, local_rank = w.local_rank, local_world_size = w.local_world_size,
    master_addr = ffi.string(w.master_addr), master_port = w.master_port, source = SOURCES[w.source],
  }, w
end

-- ---- the store ----------------------------------------------------------------------------------

local Store = {}
Store.__index = Store
local own_store, close_store = core.handle(C.wk_store_close)

local function store_handle(self)
  if self.handle == nil then error('store used after close()', 3) end
  return self.handle
end

local function wrap_store(handle, owned)
  local self = setmetatable({
    handle = owned and own_store(handle) or handle,
    owned = owned,
    buffer = ffi.new('uint8_t[?]', GET_BUFFER_BYTES),
    capacity = GET_BUFFER_BYTES,
    length = ffi.new('size_t[1]'),
    number = ffi.new('int64_t[1]'),
    swapped = ffi.new('int[1]'),
  }, Store)
  return self
end

-- rank and world_size name a rank of the job (the server checks both); without them: anonymous.
function dist.connect_store(opts)
  opts = CONNECT:check(opts, 2)
  if (opts.rank == nil) ~= (opts.world_size == nil) then
    error('dist.connect_store: rank and world_size name a rank of the job: give both or neither', 2)
  elseif opts.rank and opts.rank >= opts.world_size then
    error(('dist.connect_store: rank %d is not below world_size %d'):format(opts.rank, opts.world_size), 2)
  end
  local handle = C.wk_store_connect(opts.host, opts.port, opts.rank or -1, opts.world_size or 0,
    milliseconds(opts.timeout, 2))
  return wrap_store(core.check_handle(handle, 2), true)
end

function Store:set(key, value)
  value = tostring(value)
  check(C.wk_store_set(store_handle(self), key, value, #value), 2)
end

-- Calls fn(buffer, capacity) until the value fits; returns it as a string.
local function fetch(self, fn)
  local st = fn(self.buffer, self.capacity)
  if st == C.WK_ERR_INVALID_ARG and self.length[0] > self.capacity then
    self.capacity = tonumber(self.length[0])
    self.buffer = ffi.new('uint8_t[?]', self.capacity)
    st = fn(self.buffer, self.capacity)
  end
  return st
end

-- The value of key, waiting up to timeout seconds (default: the store's); nil, message on timeout.
function Store:get(key, timeout)
  local handle = store_handle(self)
  local ms = timeout == 0 and 0 or milliseconds(timeout or self.timeout or DEFAULT_TIMEOUT, 2)
  local st = fetch(self, function(buffer, capacity) return C.wk_store_get(handle, key, ms, buffer, capacity, self.length) end)
  if st == C.WK_ERR_TIMEOUT then return nil, core.last_error() end
  check(st, 2)
  return ffi.string(self.buffer, self.length[0])
end

function Store:wait(keys, timeout)
  local handle = store_handle(self)
  if type(keys) == 'string' then keys = { keys } end
  local names = ffi.new('const char *[?]', #keys, keys)
  local st = C.wk_store_wait(handle, names, #keys, milliseconds(timeout or self.timeout or DEFAULT_TIMEOUT, 2))
  if st == C.WK_ERR_TIMEOUT then return nil, core.last_error() end
  check(st, 2)
  return true
end

function Store:add(key, delta)
  check(C.wk_store_add(store_handle(self), key, ARGUMENT:check_value('delta', delta or 1, 2), self.number), 2)
  return tonumber(self.number[0])
end

-- Sets desired when the value is expected (or the key is absent and expected is ''); returns the
-- value after the call and whether it was swapped.
function Store:compare_set(key, expected, desired)
  local handle = store_handle(self)
  expected, desired = tostring(expected), tostring(desired)
  check(fetch(self, function(buffer, capacity)
    return C.wk_store_compare_set(handle, key, expected, #expected, desired, #desired, buffer, capacity, self.length,
      self.swapped)
  end), 2)
  return ffi.string(self.buffer, self.length[0]), self.swapped[0] == 1
end

function Store:close()
  if self.owned then close_store(self) end
  self.handle = nil -- a group's store is the group's to close
end

local Server = {}
Server.__index = Server
local own_server, stop_server = core.handle(function(h, ms) C.wk_store_server_stop(h, ms or 0) end)

-- Listens on host (default loopback): the address its clients reach it at.
function dist.serve_store(opts)
  opts = SERVE:check(opts, 2)
  local handle = C.wk_store_server_start(opts.host, opts.port, opts.world_size)
  return setmetatable({ handle = own_server(core.check_handle(handle, 2)) }, Server)
end

function Server:port() return C.wk_store_server_port(self.handle) end

-- Stops serving once every rank that said hello has said bye or dropped, or after timeout seconds.
function Server:stop(timeout) stop_server(self, (timeout and timeout ~= 0) and milliseconds(timeout, 2) or 0) end

-- ---- process groups -------------------------------------------------------------------------------

local Group = {}
Group.__index = Group
dist.Group = Group
local own_group, close_group = core.handle(C.wk_dist_close)

local function group_handle(self)
  if self.handle == nil then error('dist: process group used after close()', 3) end
  return self.handle
end

local function reduce_op(op, level)
  local code = REDUCE[op or 'sum']
  if not code then error(("unknown reduction '%s' (sum, avg, max, min)"):format(tostring(op)), level + 1) end
  return code
end

-- dist.init { timeout = seconds }: joins the job the environment describes (rank 0 serves the
-- store); a process with no such environment is a world of 1 and opens no socket.
function dist.init(opts)
  local timeout = INIT:check(opts or {}, 2).timeout
  local ms = milliseconds(timeout, 2)
  local world, w = dist.world()
  -- Rank r works on cuda:LOCAL_RANK: set before anything touches CUDA, pinned memory included.
  if C.wk_cuda_device_count() > world.local_rank then check(C.wk_cuda_set_default_device(world.local_rank), 2) end
  local handle = C.wk_dist_init(w, ms) -- its arguments are checked above: what it refuses is the environment's
  check_environment(handle ~= nil, 2)
  local self = setmetatable(world, Group)
  self.handle = own_group(handle)
  self.timeout = timeout
  self.c_stats = ffi.new('WkDistStats')
  local store = C.wk_dist_store(handle)
  if store ~= nil then
    self.store = wrap_store(store, false)
    self.store.timeout = timeout
  end
  return self
end

-- Each collective takes an optional last argument `site`, the recipe line its hang report quotes;
-- without it the line is found with debug.getinfo, which the JIT does not compile: a hot loop
-- (wick.nn.data_parallel) finds its line once and passes it.
function Group:all_reduce(t, op, site)
  check(C.wk_dist_all_reduce(group_handle(self), t, reduce_op(op, 2), site or call_site()), 2)
  return t
end

local function root_rank(self, root, level)
  root = ARGUMENT:check_value('root', root or 0, level + 1)
  if root >= self.world_size then
    error(('root %d is not a rank of this world of %d'):format(root, self.world_size), level + 1)
  end
  return root
end

function Group:broadcast(t, root, site)
  check(C.wk_dist_broadcast(group_handle(self), t, root_rank(self, root, 2),
    site or call_site()), 2)
  return t
end

function Group:all_gather(out, t, site)
  check(C.wk_dist_all_gather(group_handle(self), out, t, site or call_site()), 2)
  return out
end

function Group:reduce_scatter(out, t, op, site)
  check(C.wk_dist_reduce_scatter(group_handle(self), out, t, reduce_op(op, 2), site or call_site()), 2)
  return out
end

function Group:barrier(site)
  check(C.wk_dist_barrier(group_handle(self), site or call_site()), 2)
end

local Work = {}
Work.__index = Work

-- Starts an all-reduce and returns at once; t must stay untouched until work:wait().
function Group:all_reduce_start(t, op, site)
  local handle = core.check_handle(C.wk_dist_all_reduce_start(group_handle(self), t, reduce_op(op, 2),
    site or call_site()), 2)
  return setmetatable({ handle = handle, tensor = t }, Work)
end

-- Starts an all-gather (out and t as all_gather's) and returns at once; both must stay untouched
-- until work:wait().
function Group:all_gather_start(out, t, site)
  local handle = core.check_handle(C.wk_dist_all_gather_start(group_handle(self), out, t, site or call_site()), 2)
  return setmetatable({ handle = handle, tensor = t, out = out }, Work)
end

-- Starts a reduce-scatter (out and t as reduce_scatter's) and returns at once; both must stay
-- untouched until work:wait().
function Group:reduce_scatter_start(out, t, op, site)
  local handle = core.check_handle(C.wk_dist_reduce_scatter_start(group_handle(self), out, t, reduce_op(op, 2),
    site or call_site()), 2)
  return setmetatable({ handle = handle, tensor = t, out = out }, Work)
end

function Work:wait()
  if self.handle == nil then error('work:wait() called twice', 2) end
  local handle = self.handle
  self.handle, self.tensor, self.out = nil, nil, nil
  check(C.wk_work_wait(handle), 2)
end

-- { collectives, bytes, wait_s }: what this group did so far, and how long callers blocked in it.
function Group:stats()
  C.wk_dist_stats(group_handle(self), self.c_stats)
  local s = self.c_stats
  return { collectives = tonumber(s.collectives), bytes = tonumber(s.bytes), wait_s = tonumber(s.wait_ns) * 1e-9 }
end

function Group:close()
  if self.handle ~= nil and self.store then self.store.handle = nil end -- the group frees its store
  close_group(self)
end

return dist
