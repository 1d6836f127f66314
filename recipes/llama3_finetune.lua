-- llama3_finetune.lua: fine-tunes a Llama-family Hugging Face model directory (Llama 3, Qwen 2,
-- Mistral: its config.json, weights and tokenizer.json) given by WICK_MODEL_DIR, on the text given by
-- WICK_DATA: files or a directory the converter reads (.jsonl, .parquet, plain text, ...; see
-- `./run -m wick.data.convert --help`), converted once with the model's own tokenizer into
-- build/llama3_finetune/, or a dataset already converted with it (a directory holding index.json).
-- The dry run checks the data's vocabulary and data.seq_len against the model's config.json. Every
-- checkpoint is again a Hugging Face model directory (config.json beside model.safetensors).
--   WICK_MODEL_DIR=~/models/Llama-3.2-1B WICK_DATA=~/corpus ./run --dry-run recipes/llama3_finetune.lua
--   WICK_MODEL_DIR=~/models/Llama-3.2-1B WICK_DATA=~/corpus ./run --nproc-per-node 2 recipes/llama3_finetune.lua
local wick = require 'wick'
local cli = require 'wick.cli'
local corpus = wick.recipe.include 'lib/corpus.lua'
local convert = require 'wick.data.convert'
local provenance = require 'wick.recipe.provenance'

local function setting(name, what)
  local value = os.getenv(name)
  if not value or value == '' then cli.fail(('llama3_finetune.lua: set %s to %s'):format(name, what), cli.EXIT_USAGE) end
  return value
end

local MODEL = setting('WICK_MODEL_DIR', 'a Hugging Face model directory (config.json, weights, tokenizer.json)')
local DATA = setting('WICK_DATA', 'the text to fine-tune on (files or a directory), or a dataset converted for the model')

-- The converted text, one directory per (model, text) pair: another model's tokenizer gets its own.
local function dataset()
  local f = io.open(DATA .. '/index.json', 'rb')
  if f then
    f:close()
    return DATA
  end
  local dir = ('%s/llama3_finetune/data-%s'):format(wick.recipe.build_dir, provenance.hash(MODEL .. '\n' .. DATA))
  return corpus.once(dir, function()
    return dir, convert.convert({ DATA }, { output = dir, tokenizer = MODEL .. '/tokenizer.json', shard_size = 2 ^ 22 })
  end)
end

return {
  model = { from_pretrained = MODEL },
  data = { sources = { dataset() }, seq_len = 512 },
  batch = { global = 16, micro = 1 },
  precision = 'bf16',
  optim = { lr = 2e-5, betas = { 0.9, 0.95 }, weight_decay = 0.0, clip = 1.0, schedule = 'cosine', warmup = 20,
            min_lr = 2e-6 },
  steps = 500,
  seed = 1,
  checkpoint = { every = 100, dir = wick.recipe.build_dir .. '/llama3_finetune/checkpoints', keep = 2 },
  log = { every = 10 },
}
