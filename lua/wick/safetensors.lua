-- wick.safetensors: read and write the safetensors format (Hugging Face), so weights move between
-- Wick and PyTorch. Layout: u64 little-endian header length, a JSON header
-- {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
-- then the raw little-endian data; offsets count from the end of the header.
--   load(path) -> { name = tensor, ... }, metadata      (CPU tensors; nil, err for I/O failures)
--   save(path, { name = tensor, ... }, metadata?)       (any device; written in name order)
local ffi = require 'ffi'
local T = require 'wick.tensor'

local safetensors = {}

local HEADER_LIMIT = 100 * 1024 * 1024  -- the format's own cap on the JSON header
local ALIGNMENT = 8                      -- the header is padded with spaces to this many bytes
local TO_WICK = { F32 = 'f32', BF16 = 'bf16', F16 = 'f16', I32 = 'i32', I64 = 'i64', U16 = 'u16', U8 = 'u8' }
local FROM_WICK = {}
for name, dtype in pairs(TO_WICK) do FROM_WICK[dtype] = name end

-- ---- a small JSON reader (objects, arrays, strings, numbers, literals) ---------------------------

local ESCAPES = { ['"'] = '"', ['\\'] = '\\', ['/'] = '/', b = '\b', f = '\f', n = '\n', r = '\r', t = '\t' }

local function utf8_char(code)
  if code < 0x80 then return string.char(code) end
  if code < 0x800 then return string.char(0xc0 + math.floor(code / 64), 0x80 + code % 64) end
  return string.char(0xe0 + math.floor(code / 4096), 0x80 + math.floor(code / 64) % 64, 0x80 + code % 64)
end

local function json_decode(text)
  local pos = 1
  local function fail(what) error(string.format('bad JSON header at byte %d: %s', pos, what), 0) end
  local function skip() pos = text:find('[^ \t\r\n]', pos) or #text + 1 end
  local value
  local function string_value()
    local parts = {}
    pos = pos + 1
    while true do
      local stop = text:find('["\\]', pos)
      if not stop then fail('unterminated string') end
      parts[#parts + 1] = text:sub(pos, stop - 1)
      if text:sub(stop, stop) == '"' then
        pos = stop + 1
        return table.concat(parts)
      end
      local kind = text:sub(stop + 1, stop + 1)
      if kind == 'u' then
        parts[#parts + 1] = utf8_char(tonumber(text:sub(stop + 2, stop + 5), 16) or fail('bad \\u escape'))
        pos = stop + 6
      else
        parts[#parts + 1] = ESCAPES[kind] or fail('bad escape')
        pos = stop + 2
      end
    end
  end
  local function container(close, read_item)
    local out = {}
    pos = pos + 1
    skip()
    if text:sub(pos, pos) == close then
      pos = pos + 1
      return out
    end
    while true do
      read_item(out)
      skip()
      local c = text:sub(pos, pos)
      pos = pos + 1
      if c == close then return out end
      if c ~= ',' then fail("expected ',' or '" .. close .. "'") end
      skip()
    end
  end
  function value()
    skip()
    local c = text:sub(pos, pos)
    if c == '{' then
      return container('}', function(out)
        if text:sub(pos, pos) ~= '"' then fail('expected a key') end
        local key = string_value()
        skip()
        if text:sub(pos, pos) ~= ':' then fail("expected ':'") end
        pos = pos + 1
        if out[key] ~= nil then fail("duplicate key '" .. key .. "'") end
        out[key] = value()
      end)
    elseif c == '[' then
      return container(']', function(out) out[#out + 1] = value() end)
    elseif c == '"' then
      return string_value()
    end
    local literal = text:match('^[-+.%deE]+', pos) or text:match('^%a+', pos)
    if not literal then fail('unexpected character') end
    pos = pos + #literal
    if literal == 'true' then return true elseif literal == 'false' then return false elseif literal == 'null' then return nil end
    return tonumber(literal) or fail("bad literal '" .. literal .. "'")
  end
  local result = value()
  skip()
  if pos <= #text then fail('trailing characters') end
  return result
end

local function json_string(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    return c == '"' and '\\"' or c == '\\' and '\\\\' or string.format('\\u%04x', c:byte())
  end) .. '"'
end

-- ---- load --------------------------------------------------------------------------------------

local function u64_le(bytes)
  local n = 0
  for i = 8, 1, -1 do n = n * 256 + bytes:byte(i) end
  return n
end

local function read_entry(f, path, name, entry, data_start, file_size)
  local dtype = TO_WICK[entry.dtype]
  if not dtype then
    error(string.format("%s: tensor '%s' has dtype %s (supported: F32 BF16 F16 I32 I64 U16 U8)", path, name, tostring(entry.dtype)), 0)
  end
  local shape, offsets = entry.shape or {}, entry.data_offsets or {}
  local t = T.empty(shape, dtype)
  local first, last = offsets[1], offsets[2]
  local bytes = t:nbytes()
  if not first or last - first ~= bytes or data_start + last > file_size then
    t:free()
    error(string.format("%s: tensor '%s' [%s] %s needs %d bytes but data_offsets are [%s, %s] (file truncated or corrupted)",
      path, name, table.concat(shape, ', '), entry.dtype, bytes, tostring(first), tostring(last)), 0)
  end
  f:seek('set', data_start + first)
  local data = f:read(bytes)
  if bytes > 0 then ffi.copy(t:data(), data, bytes) end
  return t
end

-- Returns tensors by name and the metadata table, or nil and a message naming the file.
function safetensors.load(path)
  local f, err = io.open(path, 'rb')
  if not f then return nil, 'safetensors: ' .. err end
  local file_size = f:seek('end')
  f:seek('set', 0)
  local ok, tensors, metadata = pcall(function()
    local prefix = f:read(8)
    local header_size = prefix and #prefix == 8 and u64_le(prefix)
    if not header_size or header_size > HEADER_LIMIT or 8 + header_size > file_size then
      error(path .. ': not a safetensors file (bad header length; truncated or another format)', 0)
    end
    local ok_json, header = pcall(json_decode, f:read(header_size))
    if not ok_json then error(path .. ': ' .. header, 0) end
    local out = {}
    for name, entry in pairs(header) do
      if name ~= '__metadata__' then out[name] = read_entry(f, path, name, entry, 8 + header_size, file_size) end
    end
    return out, header.__metadata__ or {}
  end)
  f:close()
  if not ok then return nil, tensors end
  return tensors, metadata
end

-- ---- save --------------------------------------------------------------------------------------

local function host_contiguous(t)
  if t.device == 'cpu' and t:is_contiguous() then return t, false end
  return t:to('cpu'):contiguous(), true
end

function safetensors.save(path, tensors, metadata)
  if type(tensors) ~= 'table' then error('safetensors.save(path, tensors): tensors must be a table', 2) end
  local names = {}
  for name, t in pairs(tensors) do
    if not T.is_tensor(t) then error("safetensors.save: '" .. tostring(name) .. "' is not a tensor", 2) end
    if not FROM_WICK[t.dtype] then error("safetensors.save: '" .. name .. "' has unsupported dtype " .. t.dtype, 2) end
    names[#names + 1] = name
  end
  table.sort(names)
  local entries, offset = {}, 0
  if metadata then
    local meta = {}
    for k, v in pairs(metadata) do meta[#meta + 1] = json_string(k) .. ':' .. json_string(tostring(v)) end
    table.sort(meta)
    entries[1] = '"__metadata__":{' .. table.concat(meta, ',') .. '}'
  end
  for _, name in ipairs(names) do
    local t = tensors[name]
    local bytes = t:nbytes()
    entries[#entries + 1] = string.format('%s:{"dtype":"%s","shape":[%s],"data_offsets":[%d,%d]}',
      json_string(name), FROM_WICK[t.dtype], table.concat(t.shape, ','), offset, offset + bytes)
    offset = offset + bytes
  end
  local header = '{' .. table.concat(entries, ',') .. '}'
  header = header .. string.rep(' ', (ALIGNMENT - #header % ALIGNMENT) % ALIGNMENT)
  local tmp = path .. '.tmp'
  local f, err = io.open(tmp, 'wb')
  if not f then error('safetensors.save: ' .. err, 2) end
  local size = #header
  local prefix = {}
  for i = 1, 8 do
    prefix[i] = string.char(size % 256)
    size = math.floor(size / 256)
  end
  f:write(table.concat(prefix), header)
  for _, name in ipairs(names) do
    local host, temporary = host_contiguous(tensors[name])
    f:write(ffi.string(host:data(), host:nbytes()))
    if temporary then host:free() end
  end
  local ok, write_err = f:close()
  if not ok then error('safetensors.save: ' .. tostring(write_err), 2) end
  assert(os.rename(tmp, path))  -- readers never see a half-written file
end

safetensors.json_decode = json_decode
return safetensors
