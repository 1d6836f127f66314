-- wick.generate: the continuation of a prompt by a model directory, printed on standard output.
--   ./run -m wick.generate --model DIR --tokenizer FILE --prompt TEXT [--max-new-tokens N]
--         [--temperature T] [--top-k K] [--top-p P] [--seed S]
-- The sampling flags are model:generate's own options (wick.nn.generate), declared there once.
-- Generation stops early at the EOS token(s) of DIR's generation_config.json; the stop token itself is
-- not printed. Only Llama-family models (which have a key/value cache) generate here.
local cli = require 'wick.cli'
local T = require 'wick.tensor'
local nn = require 'wick.nn'
local llama = require 'wick.nn.llama'
local pretrained = require 'wick.nn.pretrained'
local TOKENIZER = require 'wick.data.tokenizer'

local NAME = 'wick.generate'
local SAMPLING = llama.GENERATE_OPTIONS

local SPEC = cli.spec {
  name = NAME,
  usage = '--model DIR --tokenizer FILE --prompt TEXT [options]',
  description = 'Prints the text a model directory (Hugging Face layout) generates after a prompt.',
  options = {
    { 'model', 'path', value = 'DIR', required = true, help = 'a model directory (config.json and safetensors)' },
    { 'tokenizer', 'path', value = 'FILE', required = true, help = "a tokenizer.json, a .tiktoken rank file, or 'bytes'" },
    { 'prompt', 'string', value = 'TEXT', required = true, help = 'the text to continue' },
    cli.from(SAMPLING, 'max_new_tokens'),
    cli.from(SAMPLING, 'temperature'),
    cli.from(SAMPLING, 'top_k'),
    cli.from(SAMPLING, 'top_p'),
    cli.from(SAMPLING, 'seed'),
  },
}

local M = { SPEC = SPEC }

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
  local tok, err = TOKENIZER.open(opts.tokenizer)
  if not tok then cli.fail(NAME .. ': ' .. err) end
  local model = nn.from_pretrained(opts.model)
  if not model.generate then
    model:free()
    tok:close()
    cli.fail(('%s: %s is a %s, and only Llama-family models generate'):format(NAME, opts.model, model.hf.architecture))
  end
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
