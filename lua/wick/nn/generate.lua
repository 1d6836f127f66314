-- wick.nn.generate: text generation for every model Wick trains (wick.nn.gpt's GPT-2 and the
-- wick.nn.llama models built on it), with a key/value cache: the one loop over the models' new_cache
-- and step.
--   local ids = model:generate(prompt, { max_new_tokens = 32, temperature = 0.8, top_k = 50, top_p = 0.95,
--                                        seed = 1 })
-- prompt: int32 [B, T0] token ids (rows of the same length); returns a new int32 [B, T0 + max_new_tokens]
-- tensor, the prompt followed by the generated tokens, and a table of each row's length. The prompt runs through the model once, filling
-- the cache; each new token then costs one position. temperature = 0 (the default) is greedy decoding:
-- the most likely token, the first one on ties, as transformers' greedy generate picks. Otherwise tokens
-- are sampled from softmax(logits / temperature) restricted to the top_k most likely (0: all) and to the
-- smallest set whose probability reaches top_p, from a generator seeded by seed: the same seed gives the
-- same tokens. stop = { id, ... } ends a row at the first of those tokens it generates, the stop token
-- included (as transformers does); generation ends when every row has stopped or has max_new_tokens
-- new tokens, and the tensor is as wide as its longest row: a row that stopped earlier repeats its
-- stop token after it (its length, the second result, says where it ended).
local ffi = require 'ffi'
local bit = require 'bit'
local core = require 'wick.core'
local T = require 'wick.tensor'
local gpt = require 'wick.nn.gpt'
local schema = require 'wick.schema'

local OPTIONS = schema.define('generate option', {
  { 'max_new_tokens', 'integer', min = 1, max = 2 ^ 31 - 1, default = 16, help = 'tokens to add to each row' },
  { 'temperature', 'number', min = 0, max = 1e6, default = 0, help = '0: greedy; else the softmax temperature' },
  { 'top_k', 'integer', min = 0, max = 2 ^ 31 - 1, default = 0, help = 'sample among the k most likely (0: all)' },
  { 'top_p', 'number', min = 1e-9, max = 1, default = 1, help = 'sample within this much probability mass' },
  { 'seed', 'integer', min = 0, max = 2 ^ 53, default = 0, help = 'seeds the sampler' },
  { 'stop', 'token id list', check = function(v)
    if type(v) ~= 'table' then return false, 'must be a list of token ids' end
    for i, id in pairs(v) do
      if type(i) ~= 'number' or i < 1 or i > #v or i % 1 ~= 0 then return false, 'must be a list (keys 1..n)' end
      if type(id) ~= 'number' or id % 1 ~= 0 or id < 0 or id > 2 ^ 31 - 1 then
        return false, ('stop[%d] must be an integer token id >= 0, got %s'):format(i, tostring(id))
      end
    end
    return true
  end, default = {}, help = 'token ids that end a row (the stop token is kept)' },
})

local C, check = core.C, core.check
local picked = ffi.new('int32_t[1]') -- the sampler's answer (runtime/ops/cpu/sample.c)

gpt.GENERATE_OPTIONS = OPTIONS  -- the command line (wick.generate) declares its flags from these

-- The stop ids as a set, each checked against the model's vocabulary.
local function stop_set(stop, V)
  local set = {}
  for i, id in ipairs(stop) do
    if id >= V then error(('generate: stop[%d] = %d is not below vocab %d'):format(i, id, V), 3) end
    set[id] = true
  end
  return set
end

-- splitmix64: uniform doubles in [0, 1), a pure function of the seed and the draw's number.
local function uniform(seed)
  local state = ffi.new('uint64_t', seed)
  return function()
    state = state + 0x9E3779B97F4A7C15ULL
    local z = state
    z = bit.bxor(z, bit.rshift(z, 30)) * 0xBF58476D1CE4E5B9ULL
    z = bit.bxor(z, bit.rshift(z, 27)) * 0x94D049BB133111EBULL
    z = bit.bxor(z, bit.rshift(z, 31))
    return tonumber(bit.rshift(z, 11)) / 2 ^ 53
  end
end

-- The logits the sampler reads, f32 in host memory, and their positions per row: an f32 CPU
-- model's in place, else the last position's copied into `host` [B, 1, V] (from the device, and a
-- bf16/fp16 model's widened exactly).
local function host_logits(logits, host)
  local positions = logits:size(2)
  if logits.dtype == 'f32' and logits.device == 'cpu' then return logits, positions end
  local last = logits:narrow(2, positions, 1)
  host:copy(last)
  last:free()
  return host, 1
end

function gpt.GPT:generate(prompt, opts)
  if not T.is_tensor(prompt) or prompt:dim() ~= 2 or prompt.dtype ~= 'i32' then
    error('generate: prompt must be an int32 tensor [B, T]', 2)
  end
  opts = OPTIONS:check(opts or {}, 2)
  local B, T0, V = prompt:size(1), prompt:size(2), self.config.vocab
  local total = T0 + opts.max_new_tokens
  local limit, name = self:positions()
  if total > limit then
    error(('generate: %d prompt + %d new tokens exceed %s %d'):format(T0, opts.max_new_tokens, name, limit), 2)
  end
  local stops = stop_set(opts.stop, V)
  local packed = prompt:contiguous()
  local out = T.empty({ B, total }, 'i32')
  local ids, given = ffi.cast('int32_t *', out:data()), ffi.cast('const int32_t *', packed:data())
  for b = 0, B - 1 do ffi.copy(ids + b * total, given + b * T0, T0 * ffi.sizeof('int32_t')) end
  local caches = self:new_cache(B, total)
  local draw = uniform(opts.seed)
  -- the sampler's scratch, once for the whole generation (greedy decoding needs none)
  local order = opts.temperature > 0 and ffi.new('int32_t[?]', V) or nil
  local weights = opts.temperature > 0 and ffi.new('double[?]', V) or nil
  local next_ids, host = T.empty({ B, 1 }, 'i32'), T.empty({ B, 1, V }, 'f32')
  local step_ids = ffi.cast('int32_t *', next_ids:data())
  local lengths, running = {}, B
  local logits = self:step(packed, caches, 0)
  local width = total
  for t = T0, total - 1 do
    local sampled, positions = host_logits(logits, host)
    local rows = ffi.cast('float *', sampled:data())
    for b = 1, B do
      local id
      if lengths[b] then
        id = ids[(b - 1) * total + lengths[b] - 1]  -- a stopped row repeats its stop token
      else
        local row = rows + ((b - 1) * positions + positions - 1) * V
        local u = opts.temperature == 0 and 0 or draw() -- greedy decoding draws nothing
        check(C.wk_sample_token(row, V, opts.temperature, opts.top_k, opts.top_p, u, order, weights, picked), 2)
        id = picked[0]
        if stops[id] then lengths[b], running = t + 1, running - 1 end
      end
      ids[(b - 1) * total + t], step_ids[b - 1] = id, id
    end
    if running == 0 then
      width = t + 1
      break
    end
    if t + 1 < total then logits = self:step(next_ids, caches, t) end
  end
  for b = 1, B do lengths[b] = lengths[b] or total end
  for _, cache in ipairs(caches) do
    cache.k:free()
    cache.v:free()
  end
  next_ids:free()
  host:free()
  packed:free()
  if width == total then return out, lengths end
  local view = out:narrow(2, 1, width)
  local kept = view:contiguous()
  view:free()
  out:free()
  return kept, lengths
end

return gpt
