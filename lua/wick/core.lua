-- wick.core: loads libwick through the FFI and turns its status codes into Lua errors.
--
-- The declarations come from runtime/wick.h through a build step (build/lua/wick/cdef.lua), never
-- from a hand copy. Inside `run`, libwick is already linked and reachable as ffi.C; under a plain
-- luajit it is loaded from WICK_LIB or the checkout's build/ folder.
local ffi = require 'ffi'

local EXPECTED_MAJOR = 0  -- must match WK_VERSION_MAJOR; a different major means a different ABI

local function this_dir()
  local source = debug.getinfo(1, 'S').source
  return source:sub(1, 1) == '@' and source:match('^@(.*)/[^/]*$') or '.'
end

local function load_cdef()
  local ok, cdef = pcall(require, 'wick.cdef')
  if not ok then
    -- Not on package.path (plain luajit): look in the checkout's build tree.
    local path = this_dir() .. '/../../build/lua/wick/cdef.lua'
    local chunk = loadfile(path)
    if not chunk then
      error('wick: build/lua/wick/cdef.lua not found; run `make` first (' .. tostring(cdef) .. ')', 0)
    end
    cdef = chunk()
  end
  ffi.cdef(cdef)
end

local function load_library()
  if pcall(function() return ffi.C.wk_version end) then return ffi.C end
  local path = os.getenv('WICK_LIB') or (this_dir() .. '/../../build/libwick.so')
  local ok, lib = pcall(ffi.load, path)
  if not ok then error('wick: cannot load libwick from ' .. path .. ': ' .. tostring(lib), 0) end
  return lib
end

load_cdef()
local C = load_library()

local version_number = C.wk_version()
local major, minor, patch = math.floor(version_number / 10000), math.floor(version_number / 100) % 100,
    version_number % 100
if major ~= EXPECTED_MAJOR then
  error(string.format('wick: libwick %d.%d.%d does not match these Lua bindings (expect %d.x); rebuild with make',
    major, minor, patch, EXPECTED_MAJOR), 0)
end

local core = {
  C = C,
  ffi = ffi,
  version = string.format('%d.%d.%d', major, minor, patch),
}

-- The current failure of this thread as a string: "message" (+ " [site]" at debug log level).
function core.last_error()
  local message = ffi.string(C.wk_last_error())
  if C.wk_log_level() >= C.WK_LOG_DEBUG then
    message = message .. ' [' .. ffi.string(C.wk_last_error_site()) .. ']'
  end
  return message
end

-- Raises the library's message when status is not WK_OK, blaming the caller `level` frames up.
function core.check(status, level)
  if status ~= 0 then error(core.last_error(), (level or 1) + 1) end
end

-- For failures a caller may recover from: returns true, or nil plus the message and status name.
function core.try(status)
  if status == 0 then return true end
  return nil, core.last_error(), ffi.string(C.wk_status_name(status))
end

-- The bounds a C setter accepts for param, asked of its query (query(param, &min, &max):
-- wk_loader_param_bounds, wk_converter_param_bounds, ...; zstd's getBounds pattern), as Lua numbers
-- clipped to the exactly representable integers: C holds each bound, Lua never writes one again.
local EXACT_INTEGER = 2 ^ 53
function core.bounds(query, param)
  local lo, hi = ffi.new('int64_t[1]'), ffi.new('int64_t[1]')
  core.check(query(param, lo, hi), 2)
  return math.max(tonumber(lo[0]), -EXACT_INTEGER), math.min(tonumber(hi[0]), EXACT_INTEGER)
end

-- The default C gives param when it is not set, asked of its query (query(param, &value):
-- wk_loader_param_default, wk_converter_param_default).
function core.default(query, param)
  local value = ffi.new('int64_t[1]')
  core.check(query(param, value), 2)
  return tonumber(value[0])
end

local BINARY_UNITS = { { 'GiB', 2 ^ 30 }, { 'MiB', 2 ^ 20 }, { 'KiB', 2 ^ 10 } } -- largest first

-- Bytes in the largest binary unit they fill: '1.50 MiB', '512 bytes'.
function core.format_bytes(bytes)
  for _, unit in ipairs(BINARY_UNITS) do
    if bytes >= unit[2] then return ('%.2f %s'):format(bytes / unit[2], unit[1]) end
  end
  return ('%d bytes'):format(bytes)
end

-- A public name that changed keeps its old spelling for one release: renamed(where, old, new) returns
-- the new name and warns (once per process and name) that the old one goes.
local warned = {}
function core.renamed(where, old, new)
  if not warned[where .. '\0' .. old] then
    warned[where .. '\0' .. old] = true
    C.wk_log_message(C.WK_LOG_WARN, ("%s: '%s' is now '%s'; the old name goes in the next release"):format(where, old,
      new))
  end
  return new
end

-- A handle-returning call gave NULL: raise with the library's message.
function core.check_handle(handle, level)
  if handle == nil then error(core.last_error(), (level or 1) + 1) end
  return handle
end

-- The two halves of a Lua object owning a C handle in its `handle` field, freed by `free`:
--   own(ptr)               ptr, freed by the collector if the object is never closed
--   close(object, ...)     frees it now, once: object.handle is nil after, a second close does
--                          nothing; returns what free(ptr, ...) returned
-- so an object's constructor and its close() name the free function once, in one place.
function core.handle(free)
  local function own(ptr) return ffi.gc(ptr, free) end
  local function close(object, ...)
    local ptr = object.handle
    if ptr == nil then return end
    object.handle = nil
    return free(ffi.gc(ptr, nil), ...)
  end
  return own, close
end

local NOT_A_FILE = { directory = 'a directory', other = 'a FIFO, socket or device' } -- wick.host.file_kind's

-- The whole of a regular file: its bytes, or nil and a message naming it. Inside `run` a FIFO or a
-- device is refused at once (wick.host.file_kind) instead of blocking the read.
function core.read_file(path)
  local in_run, host = pcall(require, 'wick.host')
  if in_run then
    local kind = host.file_kind(path) -- nil when missing: io.open says why
    if kind and kind ~= 'file' then return nil, ("'%s': not a regular file (%s)"):format(path, NOT_A_FILE[kind]) end
  end
  local f, err = io.open(path, 'rb')
  if not f then return nil, err end
  local text = f:read('*a')
  f:close()
  return text
end

-- Writes text as the whole of the file at path: true, or nil and a message naming the file (a full
-- disk is found at the write or the close).
function core.write_file(path, text)
  local f, err = io.open(path, 'wb')
  if not f then return nil, err end
  local ok, werr = f:write(text)
  local closed, cerr = f:close()
  if not ok or not closed then return nil, ('%s: %s'):format(path, tostring(werr or cerr)) end
  return true
end

-- Monotonic time in seconds (for timing steps and throughput).
function core.now()
  return tonumber(C.wk_now_ns()) * 1e-9
end

function core.build_info()
  local info = ffi.new('WkBuildInfo')
  C.wk_build_info(info)
  return {
    version = core.version,
    has_cuda = info.has_cuda == 1,
    compiler = ffi.string(info.compiler),
    build_flags = ffi.string(info.build_flags),
    cuda_devices = C.wk_cuda_device_count(),
  }
end

return core
