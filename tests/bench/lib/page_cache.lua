-- The page cache of given files, for the data benchmark's cold runs (through LuaJIT's FFI):
--   page_cache.evict(paths)     writes back and drops each file's cached pages (fdatasync, then
--                               posix_fadvise(POSIX_FADV_DONTNEED)); only these files, never the
--                               whole system cache. Pages that a live process maps stay.
--   page_cache.resident(paths)  bytes of the files in the page cache, and their total size (mincore)
local ffi = require 'ffi'
pcall(ffi.cdef, [[
  int open(const char *path, int flags, ...);
  int close(int fd);
  int fdatasync(int fd);
  int posix_fadvise(int fd, int64_t offset, int64_t length, int advice);
  void *mmap(void *address, size_t length, int protection, int flags, int fd, int64_t offset);
  int munmap(void *address, size_t length);
  int mincore(void *address, size_t length, unsigned char *vector);
  long sysconf(int name);
  char *strerror(int errnum);
]])
local C = ffi.C
local O_RDONLY, POSIX_FADV_DONTNEED = 0, 4
local PROT_READ, MAP_SHARED = 1, 1
local SC_PAGESIZE = 30
local MAP_FAILED = ffi.cast('void *', -1)

local page_cache = {}

local function why() return ffi.string(C.strerror(ffi.errno())) end

local function open(path)
  local fd = C.open(path, O_RDONLY)
  if fd < 0 then error(("page_cache: cannot open '%s': %s"):format(path, why()), 3) end
  return fd
end

local function size_of(path)
  local f = assert(io.open(path, 'rb'))
  local size = f:seek('end')
  f:close()
  return size
end

function page_cache.evict(paths)
  for _, path in ipairs(paths) do
    local fd = open(path)
    -- Dirty pages (a dataset just written) are not dropped: write them back first.
    if C.fdatasync(fd) ~= 0 then
      local message = why()
      C.close(fd)
      error(("page_cache: fdatasync '%s': %s"):format(path, message), 2)
    end
    local status = C.posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)
    C.close(fd)
    if status ~= 0 then
      error(("page_cache: posix_fadvise(DONTNEED) '%s': %s"):format(path, ffi.string(C.strerror(status))), 2)
    end
  end
end

function page_cache.resident(paths)
  local page = tonumber(C.sysconf(SC_PAGESIZE))
  local resident, total = 0, 0
  for _, path in ipairs(paths) do
    local size = size_of(path)
    total = total + size
    if size > 0 then
      local fd = open(path)
      local map = C.mmap(nil, size, PROT_READ, MAP_SHARED, fd, 0)
      C.close(fd)
      if map == MAP_FAILED then error(("page_cache: mmap '%s': %s"):format(path, why()), 2) end
      local pages = math.ceil(size / page)
      local vector = ffi.new('unsigned char[?]', pages)
      local status = C.mincore(map, size, vector)
      local message = status ~= 0 and why()
      C.munmap(map, size)
      if message then error(("page_cache: mincore '%s': %s"):format(path, message), 2) end
      for i = 0, pages - 1 do
        if bit.band(vector[i], 1) ~= 0 then resident = resident + math.min(page, size - i * page) end
      end
    end
  end
  return resident, total
end

return page_cache
