-- wick.json: writes JSON (the trainer's JSONL metrics and checkpoint provenance) and reads it back
-- (wick.plot reads those logs). Numbers get the fewest digits that read back as the same double;
-- nan and infinities, which JSON lacks, become null. A table with a [1] is an array (json.empty_array
-- too), any other table an object with its keys sorted (the same bytes every run). json.decode(text)
-- returns the value, or nil and why with the column; null becomes nil (a member that is null is
-- absent).
local json = {}

local ESCAPES = { ['"'] = '\\"', ['\\'] = '\\\\', ['\b'] = '\\b', ['\f'] = '\\f', ['\n'] = '\\n', ['\r'] = '\\r',
  ['\t'] = '\\t' }

local function string_of(s)
  return '"' .. s:gsub('[%c"\\]', function(c) return ESCAPES[c] or ('\\u%04x'):format(c:byte()) end) .. '"'
end

local encode

-- The fewest digits that read back as the same double (at most 17).
local function number_of(x)
  if x ~= x or x == math.huge or x == -math.huge then return 'null' end
  if x == math.floor(x) and math.abs(x) < 2 ^ 53 then return ('%d'):format(x) end
  for digits = 15, 16 do -- the shortest that reads back as x
    local text = ('%.' .. digits .. 'g'):format(x)
    if tonumber(text) == x then return text end
  end
  return ('%.17g'):format(x)
end

-- An empty table is an object; json.empty_array is the empty array (a list that may be empty, as
-- a tokenizer.json's merges).
json.empty_array = setmetatable({}, { __newindex = function() error('json.empty_array is read-only', 2) end })

local function table_of(t, depth)
  if depth > 32 then error('json.encode: tables nested deeper than 32 (a cycle?)', depth + 2) end
  if t == json.empty_array then return '[]' end
  local parts = {}
  if t[1] ~= nil then
    for i = 1, #t do parts[i] = encode(t[i], depth + 1) end
    return '[' .. table.concat(parts, ',') .. ']'
  end
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = tostring(k) end
  table.sort(keys)
  for i, k in ipairs(keys) do
    local v = t[k]
    if v == nil then v = t[tonumber(k)] end
    parts[i] = string_of(k) .. ':' .. encode(v, depth + 1)
  end
  return '{' .. table.concat(parts, ',') .. '}'
end

encode = function(value, depth)
  local kind = type(value)
  if kind == 'nil' then return 'null' end
  if kind == 'boolean' then return tostring(value) end
  if kind == 'number' then return number_of(value) end
  if kind == 'string' then return string_of(value) end
  if kind == 'table' then return table_of(value, depth) end
  if kind == 'cdata' then return string_of(tostring(value):gsub('U?LL$', '')) end
  error('json.encode: cannot encode a ' .. kind, depth + 2)
end

function json.encode(value) return encode(value, 0) end
json.number = number_of

-- ---- decoding ------------------------------------------------------------------------------------

local MAX_DEPTH = 32
local UNESCAPES = { ['"'] = '"', ['\\'] = '\\', ['/'] = '/', b = '\b', f = '\f', n = '\n', r = '\r', t = '\t' }
local LITERALS = { ['true'] = true, ['false'] = false }

local function utf8_of(code)
  if code < 0x80 then return string.char(code) end
  if code < 0x800 then return string.char(0xc0 + math.floor(code / 64), 0x80 + code % 64) end
  if code < 0x10000 then
    return string.char(0xe0 + math.floor(code / 4096), 0x80 + math.floor(code / 64) % 64, 0x80 + code % 64)
  end
  return string.char(0xf0 + math.floor(code / 262144), 0x80 + math.floor(code / 4096) % 64,
    0x80 + math.floor(code / 64) % 64, 0x80 + code % 64)
end

local Decoder = {}
Decoder.__index = Decoder

function Decoder:fail(why) error({ json = ('column %d: %s'):format(self.at, why) }, 0) end

function Decoder:space() self.at = self.text:find('[^ \t\r\n]', self.at) or #self.text + 1 end

function Decoder:string()
  local text, parts = self.text, {}
  local at = self.at + 1
  while true do
    local stop = text:find('["\\%c]', at)
    if not stop then self.at = #text + 1; self:fail('unterminated string') end
    parts[#parts + 1] = text:sub(at, stop - 1)
    local c = text:sub(stop, stop)
    if c == '"' then self.at = stop + 1; return table.concat(parts) end
    self.at = stop
    if c ~= '\\' then self:fail('control character in a string') end
    local e = text:sub(stop + 1, stop + 1)
    if UNESCAPES[e] then
      parts[#parts + 1], at = UNESCAPES[e], stop + 2
    elseif e == 'u' then
      local code = tonumber(text:match('^%x%x%x%x', stop + 2) or '', 16)
      if not code then self:fail('bad \\u escape') end
      at = stop + 6
      local low = code >= 0xd800 and code < 0xdc00 and tonumber(text:match('^\\u(%x%x%x%x)', at) or '', 16)
      if low and low >= 0xdc00 and low < 0xe000 then
        code, at = 0x10000 + (code - 0xd800) * 1024 + (low - 0xdc00), at + 6
      end
      parts[#parts + 1] = utf8_of(code)
    else
      self:fail('bad escape \\' .. e)
    end
  end
end

function Decoder:items(close, item)
  self.at = self.at + 1
  self:space()
  if self.text:sub(self.at, self.at) == close then self.at = self.at + 1; return end
  while true do
    item()
    self:space()
    local c = self.text:sub(self.at, self.at)
    self.at = self.at + 1
    if c == close then return end
    if c ~= ',' then self.at = self.at - 1; self:fail(("expected ',' or '%s'"):format(close)) end
    self:space()
  end
end

function Decoder:value(depth)
  if depth > MAX_DEPTH then self:fail('nested deeper than ' .. MAX_DEPTH) end
  self:space()
  local text, at = self.text, self.at
  local c = text:sub(at, at)
  if c == '{' then
    local object = {}
    self:items('}', function()
      if text:sub(self.at, self.at) ~= '"' then self:fail('expected a member name') end
      local key = self:string()
      self:space()
      if text:sub(self.at, self.at) ~= ':' then self:fail("expected ':'") end
      self.at = self.at + 1
      object[key] = self:value(depth + 1)
    end)
    return object
  elseif c == '[' then
    local array, n = {}, 0
    self:items(']', function() n = n + 1; array[n] = self:value(depth + 1) end)
    return array
  elseif c == '"' then
    return self:string()
  end
  local number = text:match('^-?%d+%.?%d*[eE]?[-+]?%d*', at)
  if number and number:match('^-?0%d') then self:fail('leading zero in a number') end
  if number and tonumber(number) then self.at = at + #number; return tonumber(number) end
  for word, v in pairs(LITERALS) do
    if text:sub(at, at + #word - 1) == word then self.at = at + #word; return v end
  end
  if text:sub(at, at + 3) == 'null' then self.at = at + 4; return nil end
  self:fail(at > #text and 'unexpected end' or ('unexpected %q'):format(text:sub(at, at + 9)))
end

function json.decode(text)
  local d = setmetatable({ text = text, at = 1 }, Decoder)
  local ok, value = pcall(function()
    local v = d:value(0)
    d:space()
    if d.at <= #text then d:fail('text after the value') end
    return v
  end)
  if ok then return value end
  if type(value) == 'table' and value.json then return nil, value.json end
  error(value, 0)
end

return json
