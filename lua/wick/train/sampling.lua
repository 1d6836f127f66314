-- wick.train.sampling: text from the model being trained: n tokens sampled after the EOS token
-- (temperature 0.8, a generator seeded by the recipe's seed, so a run samples the same text each
-- time), and token ids read back as text by the tokenizer the data was converted with. They are the
-- trainer's methods (trainer:sample(n), :decode(ids), :printable(ids)). The model samples with
-- model:generate (its key/value cache: one position per token), a GPT-2 as a Llama.
local recipe = require 'wick.recipe'
local T = require 'wick.tensor'
require 'wick.nn.generate'  -- model:generate of nn.gpt and nn.llama models

local sampling = {}

local SAMPLE_TEMPERATURE = 0.8

-- The tokenizer the first source was converted with (its index names it), opened once to decode;
-- false when that file is not here.
local function tokenizer_of(self)
  if self.tokenizer == nil then
    local ds = require('wick.data.dataset').open(recipe.source_path(self.config.data.sources[1]))
    local name = ds and ds.tokenizer
    if ds then ds:close() end
    self.tokenizer = name and require('wick.data.tokenizer').open(name) or false
  end
  return self.tokenizer
end

-- Text of token ids (a Lua table), by the data's tokenizer; the ids themselves when it is not here.
function sampling.decode(self, ids)
  local tok = tokenizer_of(self)
  if not tok then return table.concat(ids, ' ') end
  local known = {}
  for i, id in ipairs(ids) do known[i] = id < tok.vocab_size and id or tok.eos end
  return tok:decode(known)
end

-- The same for a terminal: bytes that are not printable ASCII (a model early in training makes
-- stray UTF-8 pieces, and a tokenizer's EOS reads as itself) become '?'; newlines stay.
function sampling.printable(self, ids)
  return (sampling.decode(self, ids):gsub('[^\n\32-\126]', '?'))
end

-- n token ids sampled from the model (temperature 0.8, a fixed seed) after the EOS token, by
-- model:generate in windows of seq_len positions: each after the first continues from the last half
-- window of tokens, with the next seed.
function sampling.sample(self, n)
  local seq, ids, out = self.model_config.seq_len, { self.loader:eos() }, {}
  local window = 0
  while #out < n do
    local context = {}
    for i = math.max(1, #ids - math.floor(seq / 2) + 1), #ids do context[#context + 1] = ids[i] end
    local prompt = T.new({ context }, 'i32')
    local new = math.min(n - #out, seq - #context)
    local tokens = self.model:generate(prompt, { max_new_tokens = new, temperature = SAMPLE_TEMPERATURE,
      seed = self.config.seed + window })
    local row = tokens:totable()[1]
    tokens:free()
    prompt:free()
    for i = #context + 1, #row do
      ids[#ids + 1], out[#out + 1] = row[i], row[i]
    end
    window = window + 1
  end
  return out
end

return sampling
