-- wick.nn.generate's stop tokens and the `run -m wick.generate` tool on a small Llama saved by Wick
-- with the example tokenizer (a Llama's greedy generation against transformers is in
-- tests/nn/llama_spec.lua); a GPT-2's against transformers' GPT2LMHeadModel, and the tool on a
-- checkpoint of the demo's model (recipes/lib/small_gpt.lua), its tokenizer found from the checkpoint.
local wick = require 'wick'
local helper = require 'helper'
local T = wick.tensor
local q = helper.shell_quote

local example = require 'helpers.example'
local HF_PYTHON = helper.ROOT .. '/build/test/hf-venv/bin/python'
local ORACLE = helper.ROOT .. '/tests/helpers/llama_oracle.py'

-- The model with its matrices drawn at std 0.5, so that greedy decoding picks varied tokens.
local function randomized(model)
  for _, p in pairs(model:named_parameters()) do
    if p:dim() == 2 then p:copy(T.randn(p.shape, { seed = p:numel(), std = 0.5 })) end
  end
  return model
end

local function random_llama(cfg) return randomized(wick.nn.llama(cfg)) end

describe('generate', function()
  it('stops a row at its first stop token, keeping it, and ends when every row has stopped', function()
    local model = random_llama({ vocab = 11, dim = 8, layers = 2, heads = 4, kv_heads = 2, ffn_dim = 12,
      max_positions = 16, seed = 9 })
    local prompt = T.new({ { 1, 5, 2 }, { 7, 3, 3 } }, 'i32')
    local full, full_lengths = model:generate(prompt, { max_new_tokens = 8 })
    assert.are.same({ 11, 11 }, full_lengths)
    local rows = full:totable()
    -- Stop at the first new token of row 1: row 1 ends there, row 2 runs until its own stop or the end.
    local stop = rows[1][4]
    local function first_stop(row)
      for t = 4, 11 do if row[t] == stop then return t end end
    end
    local ends = { first_stop(rows[1]), first_stop(rows[2]) or 11 }
    local ids, lengths = model:generate(prompt, { max_new_tokens = 8, stop = { stop } })
    assert.are.same(ends, lengths)
    local width = math.max(ends[1], ends[2])
    assert.are.same({ 2, width }, ids.shape)
    local got = ids:totable()
    for b = 1, 2 do
      for t = 1, width do
        assert.are.equal(t <= ends[b] and rows[b][t] or stop, got[b][t])
      end
    end
    -- Every row stopping at its first new token: one new token each.
    local both, both_lengths = model:generate(prompt, { max_new_tokens = 8, stop = { rows[1][4], rows[2][4] } })
    assert.are.same({ 2, 4 }, both.shape)
    assert.are.same({ 4, 4 }, both_lengths)
    assert.has_error(function() model:generate(prompt, { max_new_tokens = 2, stop = { 11 } }) end, 'generate: stop[1] = 11 is not below vocab 11')
    assert.has_error(function() model:generate(prompt, { max_new_tokens = 2, stop = { 1.5 } }) end)
    assert.has_error(function() model:generate(prompt, { max_new_tokens = 2, stop = 3 }) end)
    model:free()
  end)

  it("is the trainer's end-of-run sample of a Llama, in windows of seq_len past the model's positions", function()
    local sampling = require 'wick.train.sampling'
    local model = random_llama({ vocab = 11, dim = 8, layers = 2, heads = 4, kv_heads = 2, ffn_dim = 12,
      max_positions = 8, seed = 4 })
    local eos = 10
    local trainer = { model = model, model_config = { seq_len = 8, vocab = 11 }, config = { seed = 3 },
      loader = { eos = function() return eos end } }
    local first = model:generate(T.new({ { eos } }, 'i32'), { max_new_tokens = 7, temperature = 0.8, seed = 3 })
    local ids = first:totable()[1]
    -- The second window continues from the last 4 tokens with the next seed.
    local second = model:generate(T.new({ { unpack(ids, 5, 8) } }, 'i32'), { max_new_tokens = 3, temperature = 0.8,
      seed = 4 }):totable()[1]
    local expected = { unpack(ids, 2, 8) }
    for i = 5, 7 do expected[#expected + 1] = second[i] end
    assert.are.same(expected, sampling.sample(trainer, 10))
    assert.are.same({ unpack(expected, 1, 5) }, sampling.sample(trainer, 5))
    model:free()
  end)

  it("reads the stop ids from generation_config.json's eos_token_id: an id, a list, or none", function()
    local pretrained = require 'wick.nn.pretrained'
    local root = helper.tmpdir()
    local path = root .. '/generation_config.json'
    assert.are.same({}, pretrained.stop_ids(root, 11))
    helper.write_file(path, '{"bos_token_id": 1}')
    assert.are.same({}, pretrained.stop_ids(root, 11))
    helper.write_file(path, '{"eos_token_id": 7}')
    assert.are.same({ 7 }, pretrained.stop_ids(root, 11))
    helper.write_file(path, '{"eos_token_id": [7, 9]}')
    assert.are.same({ 7, 9 }, pretrained.stop_ids(root, 11))
    helper.write_file(path, '{"eos_token_id": "</s>"}')
    assert.has_error(function() pretrained.stop_ids(root, 11) end,
      path .. ': eos_token_id must be a token id or a list of them, got "</s>"')
    helper.write_file(path, '{"eos_token_id": [7, -1]}')
    assert.has_error(function() pretrained.stop_ids(root, 11) end,
      path .. ': eos_token_id must be a token id or a list of them, got [7,-1]')
    helper.write_file(path, '{"eos_token_id": [7, 11]}')
    assert.has_error(function() pretrained.stop_ids(root, 11) end, path .. ': eos_token_id 11 is not below the model vocab 11')
    helper.rmtree(root)
  end)

  it("gives a GPT-2's greedy tokens, through its key/value cache, as transformers' GPT2LMHeadModel", function()
    local venv = helper.sh('sh ' .. q(helper.ROOT .. '/third_party/hf-venv.sh'))
    if venv.rc ~= 0 then
      pending('skipped: the Hugging Face venv could not be made: ' .. venv.err .. venv.out)
      return
    end
    local root = helper.tmpdir()
    local model = randomized(wick.nn.gpt { vocab = 37, seq_len = 24, layers = 2, heads = 4, dim = 16, seed = 5 })
    model:save_pretrained(root .. '/gpt2')
    local prompt = T.new({ { 1, 5, 2, 30 }, { 7, 3, 3, 0 } }, 'i32')
    wick.safetensors.save(root .. '/batch.safetensors', { inputs = prompt })
    local r = helper.sh(('%s %s generate %s %s 12 %s'):format(q(HF_PYTHON), q(ORACLE), q(root .. '/gpt2'),
      q(root .. '/batch.safetensors'), q(root .. '/ids.safetensors')))
    assert(r.rc == 0, r.out .. r.err)
    local theirs = assert(wick.safetensors.load(root .. '/ids.safetensors')).ids:totable()
    local ours, lengths = model:generate(prompt, { max_new_tokens = 12 })
    assert.are.same(theirs, ours:totable())
    assert.are.same({ 16, 16 }, lengths)
    local distinct = {}
    for _, id in ipairs(theirs[1]) do distinct[id] = true end
    assert.is_true(#theirs[1] == 16 and next(distinct, next(distinct)) ~= nil, 'a row of one token proves little')
    assert.has_error(function() model:generate(prompt, { max_new_tokens = 21 }) end,
      'generate: 4 prompt + 21 new tokens exceed seq_len 24')
    model:free()
    helper.rmtree(root)
  end)

  describe("run -m wick.generate on a checkpoint of the demo's model", function()
    local root, step
    setup(function()
      root = helper.tmpdir()
      local data_helper = require 'helpers.data'
      local dataset = data_helper.make_dataset(root .. '/data', data_helper.documents(200, 40, 6), { shard_size = 4096 })
      local recipe = helper.write_file(root .. '/demo.lua', ([[
local shape = require('wick').recipe.include(%q)
return { model = shape.model, optim = shape.optim, data = { sources = { %q }, seq_len = 64 },
  batch = { global = 4, micro = 4 }, steps = 3, checkpoint = { every = 3, dir = %q }, log = { sample = 0 } }
]]):format(helper.ROOT .. '/recipes/lib/small_gpt.lua', dataset, root .. '/ck'))
      local r = helper.run(q(recipe))
      assert(r.rc == 0, r.out .. r.err)
      step = root .. '/ck/step-00000003'
    end)
    teardown(function() helper.rmtree(root) end)

    local function generate(dir, flags)
      return helper.run(('-m wick.generate --model %s --prompt %s --max-new-tokens 12 %s'):format(q(dir), q('def f('),
        flags or ''))
    end

    it('generates the text of the model loaded in process, with --tokenizer bytes', function()
      local model = wick.nn.from_pretrained(step)
      local prompt = { 100, 101, 102, 32, 102, 40 } -- 'def f(' in bytes
      local ids = model:generate(T.new({ prompt }, 'i32'), { max_new_tokens = 12 }):totable()[1]
      model:free()
      local tok = assert(wick.tokenizer.open('bytes'))
      local expected = tok:decode({ unpack(ids, #prompt + 1) }) .. '\n'
      tok:close()
      local r = generate(step, '--tokenizer bytes')
      assert.are.equal(0, r.rc, r.err)
      assert.are.equal(expected, r.out)
      assert.are.equal(13, #r.out)
    end)

    it("takes the tokenizer the run trained with, and a checkpoint.dir's newest step", function()
      local bytes = generate(step, '--tokenizer bytes')
      assert.are.equal(0, bytes.rc, bytes.err)
      for _, dir in ipairs({ step, root .. '/ck' }) do  -- the record says 'bytes'; the checkpoint.dir: its step
        local found = generate(dir)
        assert.are.equal(0, found.rc, found.err)
        assert.are.equal(bytes.out, found.out)
      end
      local copy = root .. '/recorded'
      assert.are.equal(0, helper.sh(('cp -r %s %s && rm %s/tokenizer.json'):format(q(step), q(copy), q(copy))).rc)
      local function record(name)
        local _, metadata = wick.safetensors.header(copy .. '/state.safetensors')
        metadata[require('wick.generate').TOKENIZER_KEY] = name
        wick.safetensors.save(copy .. '/state.safetensors', {}, metadata)
      end
      record('llama3/tokenizer.json')
      local uncopied = generate(copy)
      assert.are.equal(1, uncopied.rc)
      assert.matches(("wick.generate: %s was trained with the tokenizer 'llama3/tokenizer.json', of which it holds " ..
        "no tokenizer.json: give --tokenizer FILE\n"):format(copy), uncopied.err, 1, true)
      record(nil)
      local none = generate(copy)
      assert.are.equal(1, none.rc)
      assert.matches(("wick.generate: no tokenizer for %s: no %s/tokenizer.json, and no checkpoint record of one: " ..
        "give --tokenizer FILE\n"):format(copy, copy), none.err, 1, true)
      local nothing = generate(root .. '/none')  -- no model there: that is what it says
      assert.are.equal(1, nothing.rc)
      assert.matches(root .. '/none/config.json: cannot be read', nothing.err, 1, true)
      helper.write_file(copy .. '/tokenizer.json', '{}')
      assert.are.equal(copy .. '/tokenizer.json', require('wick.generate').tokenizer_of(copy))
    end)
  end)

  describe('run -m wick.generate', function()
    local root, dir
    setup(function()
      root = helper.tmpdir()
      dir = root .. '/llama'
    end)
    teardown(function() helper.rmtree(root) end)

    it('prints the continuation of a prompt, the same for a seed, and stops at generation_config eos', function()
      local files, why = example.dir()
      if not files then
        pending('skipped: no example tokenizer (it needs the test venv): ' .. why)
        return
      end
      local tokenizer = files .. '/llama3/tokenizer.json'
      local model = random_llama({ vocab = 3002, dim = 32, layers = 2, heads = 4, kv_heads = 2, ffn_dim = 64,
        max_positions = 64, seed = 3 })
      model:save_pretrained(dir)
      local tok = assert(wick.tokenizer.open(tokenizer))
      local prompt = 'The quick brown fox'
      local ids = tok:ids(prompt)
      local expected = model:generate(T.new({ ids }, 'i32'), { max_new_tokens = 6 }):totable()[1]
      model:free()
      local function generate(flags)
        return helper.run(('-m wick.generate --model %s --tokenizer %s --prompt %s %s'):format(q(dir), q(tokenizer),
          q(prompt), flags))
      end
      local greedy = generate('--max-new-tokens 6')
      assert.are.equal(0, greedy.rc, greedy.err)
      assert.are.equal(tok:decode({ unpack(expected, #ids + 1) }) .. '\n', greedy.out)
      local a = generate('--max-new-tokens 6 --temperature 1 --top-k 50 --top-p 0.9 --seed 7')
      assert.are.equal(0, a.rc, a.err)
      assert.are.equal(a.out, generate('--max-new-tokens 6 --temperature 1 --top-k 50 --top-p 0.9 --seed 7').out)
      assert.are_not.equal(a.out, generate('--max-new-tokens 6 --temperature 1 --seed 8').out)
      -- generation_config.json's eos_token_id ends the text before the stop token.
      local stop_at = #ids + 3
      helper.write_file(dir .. '/generation_config.json', ('{"eos_token_id": [2999, %d]}'):format(expected[stop_at]))
      local last = stop_at - 1
      for t = #ids + 1, stop_at - 1 do
        if expected[t] == expected[stop_at] then last = t - 1; break end
      end
      local stopped = generate('--max-new-tokens 6')
      assert.are.equal(0, stopped.rc, stopped.err)
      assert.are.equal(tok:decode({ unpack(expected, #ids + 1, last) }) .. '\n', stopped.out)
      tok:close()
      -- Every value is checked; unknown flags are errors.
      local bad = generate('--top-p 0')
      assert.are.equal(2, bad.rc)
      assert.matches('top', bad.err)
      assert.are.equal(2, generate('--max-new-tokens 2.5').rc)
      assert.are.equal(2, generate('--beams 2').rc)
      local long = generate('--max-new-tokens 100')
      assert.are.equal(1, long.rc)
      assert.matches('exceed max_positions 64', long.err, 1, true)
      local missing = helper.run('-m wick.generate --model ' .. q(root .. '/none') .. ' --tokenizer ' .. q(tokenizer) ..
        ' --prompt hi')
      assert.are.equal(1, missing.rc)
      assert.matches(root .. '/none/config.json', missing.err, 1, true)
    end)
  end)
end)
