-- wick.recipe.provenance: what identifies a run's recipe: the hash of its text (and of each
-- dataset's index.json), a checked recipe's values as text (the flattened `path = value` lines of
-- wick.recipe.flatten, which a checkpoint keeps), and what a resume may change of them.
local ffi = require 'ffi'

local provenance = {}

local FNV_OFFSET, FNV_PRIME = 0xcbf29ce484222325ULL, 0x100000001b3ULL

-- FNV-1a 64 of a string, as 16 hex digits: the identity of a recipe's text or an index.json.
function provenance.hash(text)
  local h = ffi.new('uint64_t', FNV_OFFSET)
  for i = 1, #text do h = bit.bxor(h, text:byte(i)) * FNV_PRIME end
  return bit.tohex(h, 16)
end

-- A value as the flattened recipe writes it: strings quoted, numbers as JSON writes them, tables
-- with sorted keys, a wick.schedule as its points; the text a resume compares.
local function render(value)
  local kind = type(value)
  if kind == 'string' then return ('%q'):format(value) end
  if kind == 'number' then return require('wick.json').number(value) end
  if kind == 'table' and value.kind == 'points' then -- a wick.schedule
    local parts = {}
    for i = 1, #value.steps do parts[i] = ('%s:%s'):format(render(value.steps[i]), render(value.values[i])) end
    return 'schedule{' .. table.concat(parts, ' ') .. '}'
  end
  if kind == 'table' then
    local keys = {}
    for k in pairs(value) do keys[#keys + 1] = k end
    table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
    local parts = {}
    for _, k in ipairs(keys) do
      parts[#parts + 1] = (type(k) == 'number' and '' or (tostring(k) .. '=')) .. render(value[k])
    end
    return '{' .. table.concat(parts, ', ') .. '}'
  end
  if kind == 'function' then return 'function' end
  return tostring(value)
end
provenance.render = render

-- What changed between two flattened recipes: { changes = { lines }, refused = { lines } }.
-- A mix weight may change (only future draws change); batch.global may not (it defines the order
-- and the cursor's steps); anything else is reported.
local FIXED = {
  ['batch.global'] = 'the data order and the cursor count steps of this global batch; keep it, or start a new run in another checkpoint.dir',
  ['seed'] = 'the data order and the initial weights follow from the seed',
  ['data.seq_len'] = 'the cursor counts samples of this length',
}
for _, k in ipairs({ 'model.arch', 'model.from_pretrained', 'model.layers', 'model.heads', 'model.kv_heads', 'model.dim',
  'model.ffn_dim', 'model.rope_theta', 'model.tie_embeddings', 'model.vocab', 'model.seq_len' }) do
  FIXED[k] = 'the saved weights have the old shape'
end
local QUIET = { ['checkpoint.every'] = true, ['checkpoint.keep'] = true, ['checkpoint.final'] = true,
  ['checkpoint.overwrite'] = true, ['log.every'] = true, ['log.file'] = true,
  ['log.tensorboard'] = true }

function provenance.diff(old, new)
  local keys, seen = {}, {}
  for k in pairs(old) do keys[#keys + 1], seen[k] = k, true end
  for k in pairs(new) do if not seen[k] then keys[#keys + 1] = k end end
  table.sort(keys)
  local changes, refused = {}, {}
  for _, k in ipairs(keys) do
    if old[k] ~= new[k] and not QUIET[k] then
      local line = ('%s: %s -> %s'):format(k, old[k] or '(unset)', new[k] or '(unset)')
      if FIXED[k] then
        refused[#refused + 1] = line .. ': refused: ' .. FIXED[k]
      elseif k:match('^data%.mix%.') then
        changes[#changes + 1] = line .. ' (allowed: only future draws change)'
      else
        changes[#changes + 1] = line
      end
    end
  end
  return { changes = changes, refused = refused }
end

return provenance
