-- lib/corpus.lua: datasets made from text every Debian machine has (wick.data.corpus: the Python
-- standard library sources and /usr/share/common-licenses), converted once into build/demo/ and
-- reused; shared by recipes/tiny.lua and recipes/mix.lua.
--   local corpus = wick.recipe.include 'lib/corpus.lua'
--   corpus.all()            the whole corpus (what `make demo` converts)
--   corpus.part('licenses') one part: 'modules' (top-level .py), 'packages' (.py of the packages), 'licenses'
--   corpus.once(dir, build)  dir, made by build() (returning dir and the converter's stats) unless it exists
-- On several local ranks only local rank 0 converts; the others wait for its index.json.
local ffi = require 'ffi'
local host = require 'wick.host'
local corpus = require 'wick.data.corpus'
local shard = require 'wick.data.convert'

local lib = {}

local ROOT = host.home .. '/build/demo'
local WAIT_SECONDS = 600
local POLL_US = 100000
local OPTIONS = { compression = 'zstd:3', shard_size = 2 ^ 20 }
local PARTS = {
  modules = function(path) return path:match('^/usr/lib/python3[^/]*/[^/]+%.py$') ~= nil end,
  packages = function(path) return path:match('^/usr/lib/python3[^/]*/[^/]+/.+%.py$') ~= nil end,
  licenses = function(path) return path:match('^/usr/share/common%-licenses/') ~= nil end,
}
pcall(ffi.cdef, 'int usleep(unsigned int usec);')

local function exists(path) return host.file_kind(path) ~= nil end

-- dir, built by build() on local rank 0 (or alone); other local ranks wait for it.
local function once(dir, build)
  if exists(dir .. '/index.json') then return dir end
  if require('wick.dist').world().local_rank == 0 then
    local _, stats = build()
    if stats then
      print(('corpus: converted %d documents, %.1f M tokens into %s in %.2f s'):format(stats.documents,
        stats.tokens / 1e6, dir, stats.seconds))
    end
    return dir
  end
  for _ = 1, WAIT_SECONDS * 1e6 / POLL_US do
    if exists(dir .. '/index.json') then return dir end
    ffi.C.usleep(POLL_US)
  end
  error(('corpus: %s did not appear within %d s (is local rank 0 converting it?)'):format(dir, WAIT_SECONDS), 2)
end

function lib.all()
  local dir = ROOT .. '/data'
  return once(dir, function() return corpus.dataset(dir, OPTIONS) end)
end

function lib.part(name)
  local keep = PARTS[name]
  if not keep then error('corpus.part: no part ' .. tostring(name) .. ' (modules, packages, licenses)', 2) end
  local dir = ROOT .. '/' .. name
  return once(dir, function()
    local files = {}
    for _, path in ipairs(corpus.files()) do if keep(path) then files[#files + 1] = path end end
    if #files == 0 then error('corpus.part: no file of part ' .. name .. ' on this machine', 3) end
    local opts = { output = dir }
    for k, v in pairs(OPTIONS) do opts[k] = v end
    return dir, shard.convert(files, opts)
  end)
end

lib.once = once

return lib
