-- wick.safetensors: Hugging Face's weights format, so weights move between Wick and PyTorch.
-- The format is read and written in C (runtime/tensor/safetensors.c): each tensor goes straight
-- between the file and its memory, never through a Lua string.
--   load(path) -> { name = tensor, ... }, metadata      (CPU tensors; nil, message on failure)
--   header(path) -> { name = { dtype =, shape = } }, metadata   (the header alone: no tensor read)
--   save(path, { name = tensor, ... }, metadata?)       (any device and layout; written in name order)
--   create(path, order, shapes, dtype, metadata?) -> { name = data offset }, then write_at(path,
--     offset, tensor): one file whose parts several processes write in parallel
--   open(path) -> reader (nil, message on failure): reader.entries = { name = { dtype =, shape = } },
--     reader.metadata, reader:view(name) -> a CPU tensor over the file's mapped bytes (no copy; free
--     it before reader:close()), reader:close()
local ffi = require 'ffi'
local core = require 'wick.core'
local T = require 'wick.tensor'

local C = core.C
local safetensors = {}

local entry = ffi.new('WkSafetensorsEntry')
local key, value = ffi.new('const char *[1]'), ffi.new('const char *[1]')

-- The dtype and shape of entry i of an open file, and its name.
local function describe(file, i)
  core.check(C.wk_safetensors_entry(file, i, entry))
  local shape = {}
  for d = 0, entry.ndim - 1 do shape[d + 1] = tonumber(entry.shape[d]) end
  return ffi.string(entry.name), { dtype = ffi.string(C.wk_dtype_name(entry.dtype)), shape = shape }
end

local function read_metadata(file)
  local metadata = {}
  for i = 0, C.wk_safetensors_metadata_count(file) - 1 do
    core.check(C.wk_safetensors_metadata(file, i, key, value))
    metadata[ffi.string(key[0])] = ffi.string(value[0])
  end
  return metadata
end

local function read_all(file)
  local tensors = {}
  for i = 0, C.wk_safetensors_count(file) - 1 do
    local name, info = describe(file, i)
    local t = T.empty(info.shape, info.dtype)
    local ok, err = core.try(C.wk_safetensors_read(file, i, t))
    if not ok then
      t:free()
      error(err, 0)
    end
    tensors[name] = t
  end
  return tensors, read_metadata(file)
end

local function read_header(file)
  local infos = {}
  for i = 0, C.wk_safetensors_count(file) - 1 do
    local name, info = describe(file, i)
    infos[name] = info
  end
  return infos, read_metadata(file)
end

-- reader(file) on the open file at path: its two results, or nil and a message naming the file.
local function with_file(path, reader)
  local file = C.wk_safetensors_open(path)
  if file == nil then return nil, core.last_error() end
  local ok, first, second = pcall(reader, file)
  C.wk_safetensors_close(file)
  if not ok then return nil, first end
  return first, second
end

-- Returns tensors by name and the metadata table, or nil and a message naming the file.
function safetensors.load(path) return with_file(path, read_all) end

-- Each tensor's dtype and shape by name and the metadata, read from the header only (a check before
-- reading gigabytes), or nil and a message naming the file.
function safetensors.header(path) return with_file(path, read_header) end

local Reader = {}
Reader.__index = Reader
-- A view keeps its reader, and so the mapping it points into, from being collected before it.
local reader_of_view = setmetatable({}, { __mode = 'k' })

function safetensors.open(path)
  local file = C.wk_safetensors_open(path)
  if file == nil then return nil, core.last_error() end
  local reader = setmetatable({ path = path, handle = ffi.gc(file, C.wk_safetensors_close), index = {} }, Reader)
  local ok, err = pcall(function()
    reader.entries, reader.metadata = read_header(file)
    for i = 0, C.wk_safetensors_count(file) - 1 do reader.index[(describe(file, i))] = i end
  end)
  if not ok then
    reader:close()
    return nil, err
  end
  return reader
end

function Reader:view(name)
  if not self.handle then error('safetensors reader of ' .. self.path .. ' used after close()', 2) end
  local i = self.index[name]
  if not i then error(("%s: no tensor '%s'"):format(self.path, tostring(name)), 2) end
  local view = T.adopt(C.wk_safetensors_view(self.handle, i))
  reader_of_view[view] = self
  return view
end

function Reader:close()
  if self.handle then
    C.wk_safetensors_close(ffi.gc(self.handle, nil))
    self.handle = nil
  end
end

-- The C arrays of names (in the given order) with their tensors, and of the metadata's keys (sorted)
-- and values; `keep` holds the Lua strings C reads from.
local function c_arrays(names, tensors, metadata, keep)
  local meta_keys = {}
  for k in pairs(metadata or {}) do meta_keys[#meta_keys + 1] = k end
  table.sort(meta_keys)
  local c_names = ffi.new('const char *[?]', #names + 1)
  local c_tensors = ffi.new('WkTensor *[?]', #names + 1)
  for i, name in ipairs(names) do c_names[i - 1], c_tensors[i - 1] = name, tensors[name] end
  local c_keys = ffi.new('const char *[?]', #meta_keys + 1)
  local c_values = ffi.new('const char *[?]', #meta_keys + 1)
  for i, k in ipairs(meta_keys) do
    keep[i] = tostring(metadata[k])
    c_keys[i - 1], c_values[i - 1] = k, keep[i]
  end
  return c_names, c_tensors, #meta_keys, c_keys, c_values
end

local function checked_names(tensors, what)
  if type(tensors) ~= 'table' then error(what .. ': tensors must be a table', 3) end
  local names = {}
  for name, t in pairs(tensors) do
    if not T.is_tensor(t) then error(what .. ": '" .. tostring(name) .. "' is not a tensor", 3) end
    names[#names + 1] = name
  end
  return names
end

function safetensors.save(path, tensors, metadata)
  local names = checked_names(tensors, 'safetensors.save(path, tensors)')
  table.sort(names)
  local keep = {}
  local c_names, c_tensors, n_meta, c_keys, c_values = c_arrays(names, tensors, metadata, keep)
  core.check(C.wk_safetensors_save(path, #names, c_names, c_tensors, n_meta, c_keys, c_values), 2)
end

-- A file of `dtype` tensors named `order` (a list: their order in the file), shaped as in `shapes`
-- (name -> list of sizes), to be filled by write_at: whoever holds a tensor, or a part of one, writes
-- it where it lies, in parallel with the others. Returns each name's byte offset in the data section.
-- No tensor need exist: the header is written from views of one element expanded to each shape.
function safetensors.create(path, order, shapes, dtype, metadata)
  if type(order) ~= 'table' or type(shapes) ~= 'table' then
    error('safetensors.create(path, order, shapes, dtype): order and shapes must be tables', 2)
  end
  local code = T.DTYPES[dtype]
  if not code then error(("safetensors.create: unknown dtype '%s'"):format(tostring(dtype)), 2) end
  local one, views = T.zeros({ 1 }, dtype), {}
  for _, name in ipairs(order) do
    local shape = shapes[name]
    if type(shape) ~= 'table' then
      one:free()
      error(("safetensors.create: '%s' has no shape"):format(tostring(name)), 2)
    end
    views[name] = one:expand(shape)
  end
  local keep, offsets, at = {}, {}, 0
  local c_names, c_tensors, n_meta, c_keys, c_values = c_arrays(order, views, metadata, keep)
  local status = C.wk_safetensors_create(path, #order, c_names, c_tensors, code, n_meta, c_keys, c_values)
  local size = tonumber(C.wk_dtype_size(code))
  for _, name in ipairs(order) do
    offsets[name] = at
    at = at + views[name]:numel() * size
    views[name]:free()
  end
  one:free()
  core.check(status, 2)
  return offsets
end

-- Writes t's bytes (of the file's dtype) at `offset` bytes into the data section of a created file.
function safetensors.write_at(path, offset, t)
  core.check(C.wk_safetensors_write_at(path, offset, t), 2)
end

return safetensors
