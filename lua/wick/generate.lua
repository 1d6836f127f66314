-- wick.generate: the continuation of a prompt by a model directory, printed on standard output.
--   ./run -m wick.generate --model DIR [--tokenizer FILE] --prompt TEXT [--max-new-tokens N]
--         [--temperature T] [--top-k K] [--top-p P] [--seed S]
-- DIR is a Hugging Face directory, a training checkpoint's step directory, or a checkpoint.dir (its
-- newest complete step), of any model Wick trains (GPT-2 or the Llama family). Without --tokenizer,
-- the one the run trained with: the built-in 'bytes' when its checkpoint records that (state.safetensors'
-- metadata key `tokenizer`, wick.train.checkpoint's), else DIR's tokenizer.json. The sampling flags are model:generate's own options
-- (wick.nn.generate), declared there once. Generation stops early at the EOS token(s) of DIR's
-- generation_config.json; the stop token itself is not printed.
local cli = require 'wick.cli'
local T = require 'wick.tensor'
local nn = require 'wick.nn'
local gpt = require 'wick.nn.gpt'
local pretrained = require 'wick.nn.pretrained'
local safetensors = require 'wick.safetensors'
local TOKENIZER = require 'wick.data.tokenizer'

local NAME = 'wick.generate'
local SAMPLING = gpt.GENERATE_OPTIONS

local SPEC = cli.spec {
  name = NAME,
  usage = '--model DIR [--tokenizer FILE] --prompt TEXT [options]',
  description = 'Prints the text a model directory (Hugging Face layout) generates after a prompt.',
  options = {
    { 'model', 'path', value = 'DIR', required = true,
      help = "a model directory (config.json and safetensors), or a checkpoint.dir: its newest step" },
    { 'tokenizer', 'path', value = 'FILE',
      help = "a tokenizer.json, a .tiktoken rank file, or 'bytes' (default: DIR's, or its checkpoint's record)" },
    { 'prompt', 'string', value = 'TEXT', required = true, help = 'the text to continue' },
    cli.from(SAMPLING, 'max_new_tokens'),
    cli.from(SAMPLING, 'temperature'),
    cli.from(SAMPLING, 'top_k'),
    cli.from(SAMPLING, 'top_p'),
    cli.from(SAMPLING, 'seed'),
  },
}

local M = { SPEC = SPEC }

-- The key of a checkpoint's state.safetensors metadata that names the tokenizer its run trained with
-- (wick.train.checkpoint writes it: 'bytes', 'gpt2' or the name of the file the data was converted with).
M.TOKENIZER_KEY = 'tokenizer'

local function exists(path) return require('wick.host').file_kind(path) ~= nil end

-- The model directory --model names: dir itself when it holds a model, else the newest complete
-- checkpoint of a checkpoint.dir (as --resume takes it).
function M.model_dir(dir)
  if exists(dir .. '/config.json') then return dir end
  local latest = require('wick.train.checkpoint').latest(dir)
  return latest and latest.path or dir
end

-- The tokenizer a checkpoint's run recorded (nil for a directory that is no checkpoint of Wick's).
local function recorded_tokenizer(dir)
  local state = dir .. '/state.safetensors'
  if not exists(state) then return nil end
  local header, metadata = safetensors.header(state)
  if not header then cli.fail(NAME .. ': ' .. metadata) end
  return metadata[M.TOKENIZER_KEY]
end

-- The tokenizer of model directory dir, as wick.tokenizer.open takes it: 'bytes' when the run trained
-- on bytes (the built-in one, which decodes EOS as nothing, where the tokenizer.json written for
-- Hugging Face names it), else dir/tokenizer.json; raises in one line saying what is missing.
function M.tokenizer_of(dir)
  local recorded = recorded_tokenizer(dir)
  if recorded == 'bytes' then return 'bytes' end
  if exists(dir .. '/tokenizer.json') then return dir .. '/tokenizer.json' end
  if recorded then
    cli.fail(("%s: %s was trained with the tokenizer '%s', of which it holds no tokenizer.json: give --tokenizer FILE")
      :format(NAME, dir, recorded))
  end
  cli.fail(("%s: no tokenizer for %s: no %s/tokenizer.json, and no checkpoint record of one: give --tokenizer FILE")
    :format(NAME, dir, dir))
end

-- The prompt's token ids, checked: at least one, each below the model's vocabulary.
local function prompt_ids(tok, text, vocab)
  local ids = tok:ids(text)
  if #ids == 0 then cli.usage_error(SPEC, '--prompt encodes to no tokens') end
  for i, id in ipairs(ids) do
    if id >= vocab then
      cli.fail(('%s: prompt token %d is id %d, not below the model vocab %d (is --tokenizer the model\'s?)')
        :format(NAME, i, id, vocab))
    end
  end
  return ids
end

-- The continuation of opts.prompt (options keyed by Lua name, checked) as text.
function M.generate(opts)
  opts = cli.check(SPEC, opts, 2)
  opts.model = M.model_dir(opts.model)
  pretrained.config(opts.model) -- a directory that holds no model says so before its tokenizer is sought
  local tok, err = TOKENIZER.open(opts.tokenizer or M.tokenizer_of(opts.model))
  if not tok then cli.fail(NAME .. ': ' .. err) end
  local model = nn.from_pretrained(opts.model)
  local ids = prompt_ids(tok, opts.prompt, model.config.vocab)
  local prompt = T.new({ ids }, 'i32')
  local stop = pretrained.stop_ids(opts.model, model.config.vocab)
  local done, out, lengths = pcall(model.generate, model, prompt, {
    max_new_tokens = opts.max_new_tokens, temperature = opts.temperature, top_k = opts.top_k,
    top_p = opts.top_p, seed = opts.seed, stop = stop })
  prompt:free()
  model:free()
  if not done then
    tok:close()
    cli.fail(NAME .. ': ' .. tostring(out))
  end
  local generated, last = out:totable()[1], lengths[1]
  for _, id in ipairs(stop) do
    if last > #ids and generated[last] == id then last = last - 1 end  -- the stop token is not printed
  end
  local new = {}
  for i = #ids + 1, last do new[#new + 1] = generated[i] end
  out:free()
  local text = tok:decode(new)
  tok:close()
  return text
end

function M.main(args)
  local opts = cli.parse(SPEC, args)
  local done, text = pcall(M.generate, opts)
  if not done then
    if cli.is_user_error(text) then error(text, 0) end
    io.stderr:write(NAME, ': ', tostring(text), '\n')
    return 1
  end
  io.stdout:write(text, '\n')
  return 0
end

return M
