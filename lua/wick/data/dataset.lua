-- wick.data.dataset (wick.dataset in a recipe): a thin handle over a converted dataset (runtime/dataset, format in runtime/format/FORMAT.md).
--   local ds = require('wick.data.dataset').open('data/shakespeare')   -- or https://..., s3://bucket/prefix
--   require('wick.data.dataset').open('https://host/ds', { cache_dir = '/scratch/cache' })
--   ds.shards, ds.tokens, ds.vocab_size, ds.eos, ds.tokenizer, ds.tokenizer_fingerprint
--   ds.template: the ids the converter put around each document's text (the tokenizer's post_processor),
--     { applied = true, prefix = { 128000 }, suffix = {} }; applied = false: it was told not to; nil: none
--   ds.bos: the id every document starts with (template.prefix[1] when applied), or nil
--   ds:shard(0) -> { name=, tokens=, documents=, bytes= }
--   ds:read(shard, offset, count) -> uint32_t[count] cdata (or pass `out` to reuse one)
--   ds:document(shard, doc) -> start, length  (EOS excluded)
--   ds:text(tokens, count) -> string (the 'bytes' tokenizer only)
--   ds.columns: { {name='tokens', kind='tokens', dtype='u16'}, {name='label', kind='i64', dtype='i64'},
--     {name='emb', kind='tensor', dtype='f32', shape={4, 8}}, ... } (format version 2; version 1: tokens alone)
--   ds:column(name) -> that entry (with .index, its number from 0), or nil, message listing the columns
--   ds:read_column(name, shard, first, count) -> cdata of count rows (uint8_t, int64_t, float, or the tensor's
--     dtype, count x its elements): stream positions of a token_u8 column, records otherwise
--   ds:blob(name, shard, record) -> Lua string (a bytes column)
--   ds:set('block_cache_bytes', n) / ds:set('max_open_shards', n); ds:stats() (.remote: fetches); ds:close()
-- Sampling, packing and loading live above this, in wick.data.
local core = require 'wick.core'
local schema = require 'wick.schema'
local ffi, C = core.ffi, core.C

local Dataset = {}
Dataset.__index = Dataset
local own_handle, close_handle = core.handle(C.wk_dataset_close)

-- The settings of ds:set/ds:get, with the bounds C checks them against (wk_dataset_param_bounds).
local function setting(name, param, old_name)
  local min, max = core.bounds(C.wk_dataset_param_bounds, param)
  return { name, 'integer', min = min, max = max, param = param, alias = old_name }
end
local SETTINGS = schema.define('wick.dataset setting', {
  -- the block cache was `cache_bytes`, which data.loader{} used for its node cache
  setting('block_cache_bytes', C.WK_DATASET_BLOCK_CACHE_BYTES, 'cache_bytes'),
  setting('max_open_shards', C.WK_DATASET_MAX_OPEN_SHARDS),
})

local M = {}

-- The options of a remote dataset (wick.data.REMOTE_OPTIONS: cache_dir, cache_disk_bytes, ...) as C's struct.
local function remote_options(opts)
  local data = require 'wick.data'
  local checked = data.REMOTE_OPTIONS:check(opts, 3)
  return data.remote_options(checked), checked.cache_dir -- a Lua string: alive for the open call below
end

-- The C element type of a column's dtype, for read_column's cdata.
local CTYPES = { f32 = 'float', i32 = 'int32_t', i64 = 'int64_t', u8 = 'uint8_t', u16 = 'uint16_t' }

-- ds.columns: what the index says of each column, as Lua tables.
local function columns_of(handle)
  local list, info = {}, ffi.new('WkColumnInfo')
  for c = 0, C.wk_dataset_column_count(handle) - 1 do
    core.check(C.wk_dataset_column_info(handle, c, info), 3)
    local column = { name = ffi.string(info.name), kind = ffi.string(C.wk_column_kind_name(info.kind)),
                     dtype = ffi.string(C.wk_dtype_name(info.dtype)), index = c,
                     element_bytes = tonumber(info.element_bytes) }
    if info.ndim > 0 then
      column.shape, column.elements = {}, 1
      for d = 0, info.ndim - 1 do
        column.shape[d + 1] = tonumber(info.shape[d])
        column.elements = column.elements * column.shape[d + 1]
      end
    end
    list[c + 1], list[column.name] = column, column
  end
  return list
end

local ids_box, prefix_box, suffix_box = ffi.new('const uint32_t *[1]'), ffi.new('uint32_t[1]'), ffi.new('uint32_t[1]')

-- The index's template: { applied =, prefix = {...}, suffix = {...} }, or nil when it records none.
local function template_of(handle)
  local state = C.wk_dataset_template(handle, ids_box, prefix_box, suffix_box)
  if state < 0 then return nil end
  return require('wick.data.tokenizer').template_table(ids_box[0], tonumber(prefix_box[0]), tonumber(suffix_box[0]),
                                                        { applied = state == 1 })
end

-- Opens a dataset directory (or its index.json): a path, file://, http(s):// or s3://bucket/prefix.
-- opts (remote datasets): wick.data.REMOTE_OPTIONS. Returns the handle, or nil, message on failure.
function M.open(path, opts)
  if type(path) ~= 'string' then error('wick.dataset.open: path must be a string', 2) end
  local c_opts, cache_dir = nil, nil
  if opts ~= nil then c_opts, cache_dir = remote_options(opts) end
  local handle = C.wk_dataset_open_with(path, c_opts)
  if handle == nil then return nil, core.last_error(), cache_dir end -- cache_dir: the string C read, kept alive
  handle = own_handle(handle)
  local fingerprint = C.wk_dataset_tokenizer_fingerprint(handle)
  local template = template_of(handle)
  return setmetatable({
    handle = handle,
    path = path,
    cache_dir = cache_dir,
    shards = C.wk_dataset_shard_count(handle),
    tokens = tonumber(C.wk_dataset_token_count(handle)),
    documents = tonumber(C.wk_dataset_document_count(handle)),
    vocab_size = C.wk_dataset_vocab_size(handle),
    eos = C.wk_dataset_eos(handle),
    token_bytes = C.wk_dataset_token_bytes(handle),
    tokenizer = ffi.string(C.wk_dataset_tokenizer(handle)),
    -- 16 hex digits, as wick.tokenizer's tok.fingerprint; nil when the index does not say
    tokenizer_fingerprint = fingerprint ~= 0 and ('%016x'):format(fingerprint) or nil,
    template = template,
    bos = template and template.applied and template.prefix[1] or nil,
    columns = columns_of(handle),
  }, Dataset)
end

local function live(self)
  if not self.handle then error('wick.dataset: the dataset is closed', 3) end
  return self.handle
end

function Dataset:close() close_handle(self) end

function Dataset:shard(index)
  local info = ffi.new('WkShardInfo')
  core.check(C.wk_dataset_shard_info(live(self), index, info), 2)
  return { name = ffi.string(info.name), tokens = tonumber(info.tokens), documents = tonumber(info.documents),
           bytes = tonumber(info.bytes) }
end

-- Returns the tokens as uint32_t[count]; on bad data raises the reader's message.
function Dataset:read(shard, offset, count, out)
  out = out or ffi.new('uint32_t[?]', math.max(count, 1))
  core.check(C.wk_dataset_read(live(self), shard, offset, count, out), 2)
  return out
end

-- Like read, but returns nil, message, status name instead of raising (corruption tests, tools).
function Dataset:try_read(shard, offset, count)
  local out = ffi.new('uint32_t[?]', math.max(count, 1))
  local ok, message, status = core.try(C.wk_dataset_read(live(self), shard, offset, count, out))
  if not ok then return nil, message, status end
  return out
end

-- The column of that name (an entry of ds.columns), or nil, the reader's message naming the columns.
function Dataset:column(name)
  local column = self.columns[name]
  if column then return column end
  local box = ffi.new('uint32_t[1]')
  local _, message = core.try(C.wk_dataset_column_find(live(self), tostring(name), box))
  return nil, message
end

local function column_named(self, name)
  local column, message = self:column(name)
  if not column then error(message, 3) end
  return column
end

-- Rows [first, first + count) of a fixed-width column of a shard, as a cdata array (count x elements).
function Dataset:read_column(name, shard, first, count)
  local column = column_named(self, name)
  local out = ffi.new(CTYPES[column.dtype] .. '[?]', math.max(count * (column.elements or 1), 1))
  core.check(C.wk_dataset_read_column(live(self), column.index, shard, first, count, out), 2)
  return out
end

local size_box = ffi.new('uint64_t[1]')

-- Record `record`'s blob of a bytes column, as a Lua string.
function Dataset:blob(name, shard, record)
  local index = column_named(self, name).index
  core.check(C.wk_dataset_read_blob(live(self), index, shard, record, nil, 0, size_box), 2)
  local size = tonumber(size_box[0])
  local out = ffi.new('uint8_t[?]', math.max(size, 1))
  core.check(C.wk_dataset_read_blob(live(self), index, shard, record, out, size, size_box), 2)
  return ffi.string(out, size)
end

function Dataset:document(shard, doc)
  local start, length = ffi.new('uint64_t[1]'), ffi.new('uint64_t[1]')
  core.check(C.wk_dataset_document(live(self), shard, doc, start, length), 2)
  return tonumber(start[0]), tonumber(length[0])
end

function Dataset:check(shard)
  return core.try(C.wk_dataset_check_shard(live(self), shard))
end

-- Text of tokens[0..count) for the 'bytes' tokenizer (EOS shown as '\n<|eos|>\n' unless eos_text given).
function Dataset:text(tokens, count, eos_text)
  if self.tokenizer ~= 'bytes' then error("wick.dataset: text() needs the 'bytes' tokenizer", 2) end
  local parts, run = {}, ffi.new('uint8_t[?]', math.max(count, 1))
  local n = 0
  for i = 0, count - 1 do
    local t = tokens[i]
    if t < 256 then
      run[n] = t
      n = n + 1
    else
      parts[#parts + 1] = ffi.string(run, n)
      parts[#parts + 1] = eos_text or '\n<|eos|>\n'
      n = 0
    end
  end
  parts[#parts + 1] = ffi.string(run, n)
  return table.concat(parts)
end

function Dataset:set(name, value)
  local option = SETTINGS:named(name, 2)
  core.check(C.wk_dataset_set(live(self), option.param, SETTINGS:check_value(option[1], value, 2)), 2)
end

function Dataset:get(name) return tonumber(C.wk_dataset_get(live(self), SETTINGS:named(name, 2).param)) end

function Dataset:stats()
  local s = ffi.new('WkDatasetStats')
  C.wk_dataset_stats(live(self), s)
  local out = {}
  for _, field in ipairs { 'cache_bytes', 'cache_peak_bytes', 'cache_budget', 'cache_hits', 'cache_misses',
                            'blocks_decoded', 'blocks_verified', 'open_shards' } do
    out[field] = tonumber(s[field])
  end
  local r = ffi.new('WkRemoteStats')
  C.wk_dataset_remote_stats(live(self), r)
  out.remote = {}
  for _, field in ipairs(require('wick.data').REMOTE_STAT_FIELDS) do out.remote[field] = tonumber(r[field]) end
  return out
end

return M
