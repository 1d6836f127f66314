-- wick.json: writes JSON (the trainer's JSONL metrics and checkpoint provenance). Encoding only:
-- what Wick reads back lives in safetensors metadata. Numbers get the fewest digits that read back
-- as the same double; nan and infinities, which JSON lacks, become null. A table
-- with a [1] is an array, any other table an object with its keys sorted (the same bytes every run).
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

local function table_of(t, depth)
  if depth > 32 then error('json.encode: tables nested deeper than 32 (a cycle?)', depth + 2) end
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

return json
