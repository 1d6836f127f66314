-- wick.checkpoint: the trainer's checkpoints on disk. One directory per step:
--
--   DIR/step-00000040/
--     model.safetensors      the weights, Hugging Face GPT-2 names (loadable by transformers)
--     optimizer.safetensors  AdamW's moments m and v; metadata: its step count, the loss scaler
--     state.safetensors      no tensors; metadata: step, the data cursor, the seed, the recipe's
--                            text and hash, every field of the checked recipe, the overrides, the
--                            runtime version, each source's index.json hash
--     recipe.lua             the recipe's text, and provenance.json (the same metadata, for people)
--     DONE                   written last
--
-- A checkpoint is written into DIR/.step-00000040.tmp-PID, DONE last, then renamed into place, so
-- a process killed while writing leaves a temporary directory (removed by the next save) and the
-- previous checkpoints untouched; only directories holding DONE count. After a save the oldest
-- complete ones beyond `keep` are removed. It does not fsync: it survives a killed process, not a
-- lost machine.
local ffi = require 'ffi'
local safetensors = require 'wick.safetensors'
local json = require 'wick.json'

local checkpoint = {}

local NAME = 'step-%08d'
local DONE = 'DONE'

pcall(ffi.cdef, 'int getpid(void);')

local function quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function sh(command, what)
  if os.execute(command) ~= 0 then error(('checkpoint: cannot %s (%s)'):format(what, command), 3) end
end

local function exists(path)
  local f = io.open(path, 'rb')
  if f then f:close() end
  return f ~= nil
end

local function write_file(path, text)
  local f, why = io.open(path, 'wb')
  if not f then error('checkpoint: cannot write ' .. why, 3) end
  local ok, werr = f:write(text)
  f:close()
  if not ok then error(('checkpoint: cannot write %s: %s'):format(path, werr), 3) end
end

local function entries(dir)
  local out = {}
  local listing = io.popen('ls -a ' .. quote(dir) .. ' 2>/dev/null')
  for name in listing:lines() do out[#out + 1] = name end
  listing:close()
  return out
end

-- The complete checkpoints of dir, oldest first: { step =, path = }.
function checkpoint.list(dir)
  local out = {}
  for _, name in ipairs(entries(dir)) do
    local step = name:match('^step%-(%d+)$')
    if step and exists(dir .. '/' .. name .. '/' .. DONE) then out[#out + 1] = { step = tonumber(step), path = dir .. '/' .. name } end
  end
  table.sort(out, function(a, b) return a.step < b.step end)
  return out
end

function checkpoint.latest(dir)
  local list = checkpoint.list(dir)
  return list[#list]
end

-- Writes a checkpoint of `step` into dir through a temporary directory. `parts(tmp)` writes the
-- files; metadata is the state's. Returns the checkpoint's path.
function checkpoint.save(dir, step, metadata, parts, keep)
  sh('mkdir -p ' .. quote(dir), 'create the checkpoint directory')
  for _, name in ipairs(entries(dir)) do -- what killed writers left
    if name:match('^%.step%-%d+%.tmp%-%d+$') then sh('rm -rf ' .. quote(dir .. '/' .. name), 'remove ' .. name) end
  end
  local final = dir .. '/' .. NAME:format(step)
  local tmp = ('%s/.%s.tmp-%d'):format(dir, NAME:format(step), ffi.C.getpid())
  sh('mkdir -p ' .. quote(tmp), 'create ' .. tmp)
  parts(tmp)
  safetensors.save(tmp .. '/state.safetensors', {}, metadata)
  write_file(tmp .. '/recipe.lua', metadata.recipe_text or '')
  local readable = {}
  for k, v in pairs(metadata) do if k ~= 'recipe_text' then readable[k] = v end end
  write_file(tmp .. '/provenance.json', json.encode(readable) .. '\n')
  write_file(tmp .. '/' .. DONE, ('%d\n'):format(step))
  if exists(final) then sh('rm -rf ' .. quote(final), 'replace ' .. final) end
  local ok, why = os.rename(tmp, final)
  if not ok then error(('checkpoint: cannot rename %s to %s: %s'):format(tmp, final, why), 2) end
  local list = checkpoint.list(dir)
  for i = 1, #list - keep do sh('rm -rf ' .. quote(list[i].path), 'remove an old checkpoint') end
  return final
end

-- The state's metadata of a checkpoint (a table of strings), or raises naming the file.
function checkpoint.state(path)
  local tensors, metadata = safetensors.load(path .. '/state.safetensors')
  if not tensors then error('checkpoint: ' .. metadata, 2) end
  return metadata
end

-- The optimizer's part: AdamW's moments and counters, and the loss scaler.
function checkpoint.save_optimizer(path, opt, model)
  if not opt.m then opt:build(model) end
  local scaler = model.policy.scaler
  safetensors.save(path, { m = opt.m, v = opt.v }, {
    step_count = opt.step_count,
    scale = scaler and ('%.17g'):format(scaler.scale) or nil,
    good_steps = scaler and scaler.good_steps or nil,
    skipped = scaler and scaler.skipped or nil,
  })
end

local function integer_field(meta, key, path)
  local v = tonumber(meta[key])
  if not v or v < 0 or v % 1 ~= 0 then error(('checkpoint: %s has no whole %s (got %s)'):format(path, key, tostring(meta[key])), 3) end
  return v
end

function checkpoint.load_optimizer(path, opt, model)
  local tensors, meta = safetensors.load(path)
  if not tensors then error('checkpoint: ' .. meta, 2) end
  opt:build(model)
  for _, key in ipairs({ 'm', 'v' }) do
    local t = tensors[key]
    if not t or t:numel() ~= opt[key]:numel() then
      error(('checkpoint: %s: %s does not fit this model (%s values, the model has %d)'):format(path, key,
        t and t:numel() or 'no', opt[key]:numel()), 2)
    end
    opt[key]:copy(t)
    t:free()
  end
  opt.step_count = integer_field(meta, 'step_count', path)
  local scaler = model.policy.scaler
  if scaler and meta.scale then
    scaler.scale = tonumber(meta.scale)
    scaler.good_steps = integer_field(meta, 'good_steps', path)
    scaler.skipped = integer_field(meta, 'skipped', path)
  end
end

return checkpoint
