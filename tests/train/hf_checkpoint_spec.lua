-- A checkpoint directory is complete for Hugging Face tools, checked with transformers (the
-- build/test/hf-venv of tests/nn/llama_spec.lua): AutoTokenizer.from_pretrained(step_dir) encodes as
-- the run's tokenizer did (the built-in 'bytes', written out; a tokenizer.json, copied with its
-- tokenizer_config.json and chat template), AutoModelForCausalLM loads a bf16 run's weights as bf16
-- (config.json's torch_dtype bfloat16, the f32 masters in the optimizer file), and the state records
-- which tokenizer the run trained with.
local helper = require 'helper'
local data_helper = require 'helpers.data'
local q = helper.shell_quote

local PYTHON = helper.HF_PYTHON

-- What transformers makes of a step directory, as JSON: the model's class and dtype, config.json's
-- torch_dtype, AutoTokenizer's ids of each text and its chat template (the venv has no jinja2 to
-- apply it).
local CHECK = [[
import json, sys
from transformers import AutoModelForCausalLM, AutoTokenizer
step, texts = sys.argv[1], json.load(open(sys.argv[2]))
model = AutoModelForCausalLM.from_pretrained(step, torch_dtype='auto')
tok = AutoTokenizer.from_pretrained(step)
print(json.dumps({'class': type(model).__name__, 'dtype': str(model.dtype), 'torch_dtype': str(model.config.torch_dtype),
                  'ids': [tok.encode(t) for t in texts], 'decoded': [tok.decode(tok.encode(t)) for t in texts],
                  'chat': tok.chat_template}))
]]

-- A small byte-level BPE trained by Hugging Face tokenizers, saved as tokenizer.json.
local TRAIN = [[
import sys
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=['<|end|>'],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train_from_iterator(['the quick brown fox jumps over the lazy dog %d times' % i for i in range(200)], trainer)
tok.save(sys.argv[1])
]]

local TEXTS = { 'the quick brown fox', 'Héllo, wörld!\n\t<|end|> 日本 ', '  two  spaces . and a dot' }

describe('a checkpoint directory', function()
  local root, venv_error
  setup(function()
    local made
    made, venv_error = helper.hf_python()
    if not made then return end
    root = helper.tmpdir()
    helper.write_file(root .. '/check.py', CHECK)
    helper.write_file(root .. '/texts.json', require('wick.json').encode(TEXTS))
  end)
  teardown(function() if root then helper.rmtree(root) end end)

  -- Trains `model` (Lua source of a model section) on dataset for 2 steps under precision, from a
  -- working directory (work, default a new one) where the default checkpoint.dir goes. Returns the
  -- step directory and the run's output.
  local function train(name, dataset, model, precision, work)
    local recipe = helper.write_file(('%s/%s.lua'):format(root, name), ([[
return { model = %s, data = { sources = { %q }, seq_len = 16 }, batch = { global = 4, micro = 2 },
  precision = %q, steps = 2, seed = 1 }
]]):format(model, dataset, precision))
    work = work or root .. '/' .. name .. '-cwd'
    local r = helper.sh(('mkdir -p %s && cd %s && %s %s'):format(q(work), q(work), q(helper.RUN), q(recipe)))
    assert.are.equal(0, r.rc, r.err)
    return ('%s/checkpoints/%s/step-00000002'):format(work, name), r.out
  end

  local function transformers_view(step)
    local r = helper.sh(('%s %s %s %s'):format(q(PYTHON), q(root .. '/check.py'), q(step), q(root .. '/texts.json')))
    assert.are.equal(0, r.rc, r.err)
    return require('wick.json').decode(r.out:match('[^\n]*\n?$'))
  end

  -- Wick's ids of each text, by the tokenizer the dataset was converted with (options: its open's).
  local function wick_ids(tokenizer, options)
    local tok = assert(require('wick.data.tokenizer').open(tokenizer, options))
    local out = {}
    for i, text in ipairs(TEXTS) do out[i] = tok:ids(text) end
    tok:close()
    return out
  end

  local function state_of(step)
    local _, metadata = require('wick.safetensors').header(step .. '/state.safetensors')
    return metadata
  end

  it("of a bf16 Llama on 'bytes' data loads in transformers as bf16, with a tokenizer that encodes as the run's",
    function()
    if venv_error then pending(venv_error) return end
    local dataset = data_helper.make_dataset(root .. '/bytes-data', data_helper.documents(60, 40, 5))
    local step = train('bytes-llama', dataset,
      "{ arch = 'llama', layers = 1, heads = 4, kv_heads = 2, dim = 16, ffn_dim = 24 }", 'bf16')
    local header = require('wick.safetensors').header(step .. '/model.safetensors')
    for name, info in pairs(header) do assert.are.equal('bf16', info.dtype, name) end
    assert.is_not_nil(require('wick.safetensors').header(step .. '/optimizer.safetensors').master)
    local seen = transformers_view(step)
    assert.are.same({ 'LlamaForCausalLM', 'torch.bfloat16', 'torch.bfloat16' }, { seen.class, seen.dtype, seen.torch_dtype })
    assert.are.same(wick_ids('bytes'), seen.ids)
    assert.are.same(TEXTS, seen.decoded)
    local state = state_of(step)
    assert.are.same({ 'bytes', '0000006279746573' }, { state.tokenizer, state.tokenizer_fingerprint })
  end)

  it('of a GPT-2 on data of a tokenizer.json carries it, its tokenizer_config.json and chat template', function()
    if venv_error then pending(venv_error) return end
    local dir = root .. '/hf-tokenizer'
    assert(os.execute('mkdir -p ' .. q(dir)) == 0)
    helper.write_file(root .. '/train.py', TRAIN)
    local r = helper.sh(('%s %s %s'):format(q(PYTHON), q(root .. '/train.py'), q(dir .. '/tokenizer.json')))
    assert.are.equal(0, r.rc, r.err)
    local template = '{% for m in messages %}<{{ m.role }}>{{ m.content }}<|end|>{% endfor %}'
    local config = '{"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|end|>", ' ..
      '"clean_up_tokenization_spaces": false, "chat_template": "' .. template .. '"}\n'
    helper.write_file(dir .. '/tokenizer_config.json', config)
    local input = data_helper.write_jsonl(root .. '/hf-docs.jsonl', data_helper.documents(60, 40, 7))
    local dataset = root .. '/hf-data'
    r = helper.run(('-m wick.data.convert %s -o %s --tokenizer %s -q'):format(q(input), q(dataset),
      q(dir .. '/tokenizer.json')))
    assert.are.equal(0, r.rc, r.err)
    -- the dataset carries the tokenizer's files: a run from anywhere saves them
    for _, name in ipairs { 'tokenizer.json', 'tokenizer_config.json' } do
      assert.are.equal(helper.read_file(dir .. '/' .. name), helper.read_file(dataset .. '/' .. name))
    end
    local carried = train('hf-carried', dataset, '{ layers = 1, heads = 2, dim = 16 }', 'fp32')
    assert.are.equal(helper.read_file(dir .. '/tokenizer.json'), helper.read_file(carried .. '/tokenizer.json'))
    assert.are.equal(config, helper.read_file(carried .. '/tokenizer_config.json'))
    -- without that copy the index names the file hf-tokenizer/tokenizer.json: a run elsewhere has none
    os.remove(dataset .. '/tokenizer.json')
    local _, elsewhere = train('hf-elsewhere', dataset, '{ layers = 1, heads = 2, dim = 16 }', 'fp32')
    assert.matches("checkpoint: no tokenizer files beside the model: the data's tokenizer hf%-tokenizer/tokenizer%.json " ..
      "%(fingerprint %x+%) is neither in its dataset's directory, nor model%.from_pretrained's tokenizer%.json, nor " ..
      "that path from here", elsewhere)
    local step = train('hf-gpt', dataset, '{ layers = 1, heads = 2, dim = 16 }', 'fp32', root)
    -- a name an index gives is only looked for below the working directory
    local index = helper.read_file(dataset .. '/index.json')
    local climbing, n = index:gsub('"hf%-tokenizer/tokenizer%.json"', '"../hf-tokenizer/tokenizer.json"')
    assert.are.equal(1, n)
    helper.write_file(dataset .. '/index.json', climbing)
    local _, below = train('hf-climb', dataset, '{ layers = 1, heads = 2, dim = 16 }', 'fp32', root .. '/sub')
    assert.matches("no tokenizer files beside the model: the data's tokenizer %.%./hf%-tokenizer/tokenizer%.json", below)
    helper.write_file(dataset .. '/index.json', index)
    assert.are.equal(helper.read_file(dir .. '/tokenizer.json'), helper.read_file(step .. '/tokenizer.json'))
    assert.are.equal(config, helper.read_file(step .. '/tokenizer_config.json'))
    local seen = transformers_view(step)
    assert.are.same({ 'GPT2LMHeadModel', 'torch.float32', 'torch.float32' }, { seen.class, seen.dtype, seen.torch_dtype })
    -- the file's own tokenizer_config.json: <|end|> in text is the special token, as Wick's special = true
    assert.are.same(wick_ids(dir .. '/tokenizer.json', { special = true }), seen.ids)
    assert.are.equal(template, seen.chat)
    local tok = assert(require('wick.data.tokenizer').open(dir .. '/tokenizer.json'))
    local state = state_of(step)
    assert.are.same({ 'hf-tokenizer/tokenizer.json', tok.fingerprint }, { state.tokenizer, state.tokenizer_fingerprint })
    tok:close()
    -- a fine-tune from the step directory reads the record: data of another tokenizer is refused
    local bytes = data_helper.make_dataset(root .. '/tune-bytes', data_helper.documents(20, 40, 3))
    local tune = helper.write_file(root .. '/tune.lua', ([[
return { model = { from_pretrained = %q }, data = { sources = { %q }, seq_len = 16 }, batch = { global = 4 }, steps = 1 }
]]):format(step, bytes))
    local refused = helper.run('--dry-run ' .. q(tune))
    assert.are.equal(2, refused.rc, refused.out .. refused.err)
    assert.matches(("source %s was tokenized by bytes, not by hf-tokenizer/tokenizer.json, which " ..
      "model.from_pretrained's checkpoint trained with (its state.safetensors)"):format(bytes), refused.err, 1, true)
  end)
end)
