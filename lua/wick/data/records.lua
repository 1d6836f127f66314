-- wick.data.records: a dataset's records as stored (format version 2: runtime/format/FORMAT.md), for
-- `run -m wick.data.inspect DATASET --records N`: each record's tokens (its EOS left out) and every other
-- column's value, read by one C call per column (wick.data.dataset), formatted here as a JSON line or as
-- text. A blob is shown by its size, and by its image format, width and height when its first bytes are
-- a PNG, JPEG, GIF or WebP header that says them.
local ffi = require('wick.core').ffi

local M = {}

-- ---- image headers --------------------------------------------------------------------------------------

local function u16be(s, i) return s:byte(i) * 256 + s:byte(i + 1) end
local function u16le(s, i) return s:byte(i) + s:byte(i + 1) * 256 end
local function u24le(s, i) return s:byte(i) + s:byte(i + 1) * 256 + s:byte(i + 2) * 65536 end
local function u32be(s, i) return u16be(s, i) * 65536 + u16be(s, i + 2) end

-- JPEG: the segments after SOI up to the first start-of-frame (SOF0..15 but DHT C4, JPG C8, DAC CC).
local function jpeg_size(s)
  local i = 3
  while i + 8 <= #s do
    if s:byte(i) ~= 0xff then return nil end
    local marker = s:byte(i + 1)
    if marker == 0xff then
      i = i + 1 -- fill byte
    elseif marker == 0x01 or (marker >= 0xd0 and marker <= 0xd8) then
      i = i + 2 -- no length
    elseif marker == 0xda or marker == 0xd9 then
      return nil -- scan data or the end before any frame
    elseif marker >= 0xc0 and marker <= 0xcf and marker ~= 0xc4 and marker ~= 0xc8 and marker ~= 0xcc then
      return u16be(s, i + 7), u16be(s, i + 5)
    else
      i = i + 2 + u16be(s, i + 2)
    end
  end
end

-- format, width, height of an image blob, or nil when its header is none of these or is cut short.
local function image_of(s)
  if #s >= 24 and s:sub(1, 8) == '\137PNG\r\n\26\n' and s:sub(13, 16) == 'IHDR' then
    return 'png', u32be(s, 17), u32be(s, 21)
  elseif #s >= 10 and (s:sub(1, 6) == 'GIF87a' or s:sub(1, 6) == 'GIF89a') then
    return 'gif', u16le(s, 7), u16le(s, 9)
  elseif #s >= 4 and s:byte(1) == 0xff and s:byte(2) == 0xd8 and s:byte(3) == 0xff then
    local w, h = jpeg_size(s)
    if w then return 'jpeg', w, h end
  elseif #s >= 30 and s:sub(1, 4) == 'RIFF' and s:sub(9, 12) == 'WEBP' then
    local chunk = s:sub(13, 16)
    if chunk == 'VP8X' then return 'webp', u24le(s, 25) + 1, u24le(s, 28) + 1 end
    if chunk == 'VP8 ' and s:sub(24, 26) == '\157\1\42' then
      return 'webp', u16le(s, 27) % 16384, u16le(s, 29) % 16384
    end
    if chunk == 'VP8L' and s:byte(21) == 0x2f then
      local bits = s:byte(22) + s:byte(23) * 256 + s:byte(24) * 65536 + s:byte(25) * 16777216
      return 'webp', bits % 16384 + 1, math.floor(bits / 16384) % 16384 + 1
    end
  end
end

-- ---- values ----------------------------------------------------------------------------------------------

local float = ffi.typeof('float[1]')
local scratch = float()

-- The shortest decimal that reads back as the same f32; null for NaN and infinities (JSON has neither).
local function f32_text(x)
  x = tonumber(x)
  if x ~= x or x == math.huge or x == -math.huge then return 'null' end
  for digits = 6, 9 do
    local text = ('%.' .. digits .. 'g'):format(x)
    scratch[0] = tonumber(text)
    if scratch[0] == x then return text end
  end
  return ('%.9g'):format(x)
end

local function integer_text(x)
  return (tostring(x):gsub('U?LL$', ''))
end

local function element_text(dtype, x) return dtype == 'f32' and f32_text(x) or integer_text(x) end

-- Elements [at, at + count) of a cdata array as "[a,b,...]" (sep between them).
local function list_text(values, at, count, dtype, sep)
  local parts = {}
  for i = 0, count - 1 do parts[i + 1] = element_text(dtype, values[at + i]) end
  return '[' .. table.concat(parts, sep) .. ']'
end

-- A tensor's elements nested by its shape, row-major.
local function tensor_text(values, dtype, shape, dim, at, sep)
  if dim == #shape then return list_text(values, at, shape[dim], dtype, sep) end
  local stride = 1
  for d = dim + 1, #shape do stride = stride * shape[d] end
  local parts = {}
  for i = 0, shape[dim] - 1 do parts[i + 1] = tensor_text(values, dtype, shape, dim + 1, at + i * stride, sep) end
  return '[' .. table.concat(parts, sep) .. ']'
end

-- ---- records ---------------------------------------------------------------------------------------------

-- One record: { shard =, record =, fields = { {name, value text for JSON, value text for people}, ... } }.
local function read_record(ds, shard, record)
  local start, length = ds:document(shard, record)
  local tokens = ds:read(shard, start, length)
  local fields = { { 'tokens', list_text(tokens, 0, length, 'u32', ','), list_text(tokens, 0, length, 'u32', ' ') } }
  for c = 2, #ds.columns do
    local column = ds.columns[c]
    local json, text
    if column.kind == 'token_u8' then
      local values = ds:read_column(column.name, shard, start, length)
      json, text = list_text(values, 0, length, 'u8', ','), list_text(values, 0, length, 'u8', ' ')
    elseif column.kind == 'bytes' then
      local blob = ds:blob(column.name, shard, record)
      local format, width, height = image_of(blob)
      json = format and ('{"bytes":%d,"format":"%s","width":%d,"height":%d}'):format(#blob, format, width, height)
        or ('{"bytes":%d}'):format(#blob)
      text = format and ('%s %dx%d (%d bytes)'):format(format, width, height, #blob) or ('%d bytes'):format(#blob)
    elseif column.kind == 'tensor' then
      local values = ds:read_column(column.name, shard, record, 1)
      json = tensor_text(values, column.dtype, column.shape, 1, 0, ',')
      text = tensor_text(values, column.dtype, column.shape, 1, 0, ' ')
    else -- i64, f32
      json = element_text(column.dtype, ds:read_column(column.name, shard, record, 1)[0])
      text = json
    end
    fields[#fields + 1] = { column.name, json, text }
  end
  return { shard = shard, record = record, fields = fields }
end

-- Calls fn(record) for `count` records from the dataset's record `from` (counted over all shards in
-- order); returns how many there were.
function M.each(ds, from, count, fn)
  local seen, shown = 0, 0
  for shard = 0, ds.shards - 1 do
    local documents = ds:shard(shard).documents
    if from < seen + documents then
      for record = math.max(from - seen, 0), documents - 1 do
        if shown == count then return shown end
        fn(read_record(ds, shard, record))
        shown = shown + 1
      end
    end
    seen = seen + documents
  end
  return shown
end

-- {"shard":0,"record":2,"tokens":[...],"label":3,...}: the columns in the dataset's order.
function M.json(r)
  local parts = { ('"shard":%d,"record":%d'):format(r.shard, r.record) }
  for _, field in ipairs(r.fields) do parts[#parts + 1] = ('"%s":%s'):format(field[1], field[2]) end
  return '{' .. table.concat(parts, ',') .. '}'
end

-- "shard 0 record 2: tokens=[1 2 3] label=3 image=png 64x48 (1234 bytes)"
function M.text(r)
  local parts = {}
  for _, field in ipairs(r.fields) do parts[#parts + 1] = field[1] .. '=' .. field[3] end
  return ('shard %d record %d: %s'):format(r.shard, r.record, table.concat(parts, ' '))
end

M.image_of = image_of
return M
