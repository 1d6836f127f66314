-- The shipped recipes keep working: each runs for real on a small dataset.
local helper = require 'helper'
local data_helper = require 'helpers.data'
local q = helper.shell_quote

describe('recipes', function()
  local root, dataset
  setup(function()
    root = helper.tmpdir()
    dataset = data_helper.make_dataset(root .. '/data', data_helper.documents(400, 40, 6), { shard_size = 4096 })
  end)
  teardown(function() helper.rmtree(root) end)

  it('hello.lua reports every rank', function()
    local r = helper.run('--nproc-per-node 2 ' .. q(helper.ROOT .. '/recipes/hello.lua'))
    assert.are.equal(0, r.rc, r.err)
    assert.matches('%[rank1%] rank 1 of 2: Wick', r.out)
  end)

  it('stream.lua streams on 2 ranks and prints samples and the cursor', function()
    local r = helper.run(('--nproc-per-node 2 %s --data %s --seq-len 32 --global-batch 8 --micro-batch 2 --steps 20 ' ..
      '--compute-ms 0'):format(q(helper.ROOT .. '/recipes/stream.lua'), q(dataset)))
    assert.are.equal(0, r.rc, r.err)
    assert.matches('step   20/20', r.out, 1, true)
    assert.matches('sample shard=', r.out, 1, true)
    assert.matches('cursor: wick%-cursor/2 step=20 ', r.out)
  end)

  it('tiny.lua trains on 2 ranks: the loss falls, a checkpoint has the weights and the cursor', function()
    local out = root .. '/tiny'
    local r = helper.run(('--nproc-per-node 2 %s --data.sources %s --steps 30 --data.seq_len 32 --model.dim 32 ' ..
      '--checkpoint.every 30 --checkpoint.dir %s --log.sample 20'):format(q(helper.ROOT .. '/recipes/tiny.lua'), q(dataset),
      q(out)))
    assert.are.equal(0, r.rc, r.err)
    local losses = {}
    for loss in r.out:gmatch('loss (%d+%.%d+)') do losses[#losses + 1] = tonumber(loss) end
    assert.is_true(losses[#losses] < 0.8 * losses[1], r.out)
    assert.matches('[rank0] sample:\n[rank0] ', r.out, 1, true)
    assert.matches('"cursor":"wick-cursor/2 step=30 ', helper.read_file(out .. '/step-00000030/provenance.json'), 1, true)
    local weights = require('wick').safetensors.load(out .. '/step-00000030/model.safetensors')
    assert.is_not_nil(weights['transformer.wte.weight'])
  end)

  it('llama_tiny.lua trains a Llama on 2 ranks: the loss falls, its checkpoint is a Hugging Face directory', function()
    local out = root .. '/llama'
    local r = helper.run(('--nproc-per-node 2 %s --data.sources %s --steps 30 --data.seq_len 32 --checkpoint.every 30 ' ..
      '--checkpoint.dir %s --log.sample 20'):format(q(helper.ROOT .. '/recipes/llama_tiny.lua'), q(dataset), q(out)))
    assert.are.equal(0, r.rc, r.err)
    local losses = {}
    for loss in r.out:gmatch('loss (%d+%.%d+)') do losses[#losses + 1] = tonumber(loss) end
    assert.is_true(losses[#losses] < 0.8 * losses[1], r.out)
    assert.matches('[rank0] sample:\n[rank0] ', r.out, 1, true)
    local model = require('wick').nn.from_pretrained(out .. '/step-00000030')
    assert.are.same({ 2, 4, 2, 64, 176 }, { model.config.layers, model.config.heads, model.config.kv_heads, model.config.dim,
      model.config.ffn_dim })
    model:free()
  end)

  -- docs/finetune.md's command for your own model, on a small random Llama that Wick saves with the example Llama 3
  -- style tokenizer and the example documents (helpers.example: what make example makes).
  it('llama3_finetune.lua fine-tunes WICK_MODEL_DIR on WICK_DATA, converted with the model\'s tokenizer', function()
    local files, why = require('helpers.example').dir()
    if not files then
      pending('skipped: no example tokenizer (it needs the test venv): ' .. why)
      return
    end
    local tokenizer = files .. '/llama3/tokenizer.json'
    local dir = root .. '/hf-llama'
    local made = helper.run('-e ' .. q(("require('wick').nn.llama { vocab = 3002, dim = 32, layers = 2, heads = 4, kv_heads = 2, " ..
      "ffn_dim = 64, max_positions = 64 }:save_pretrained(%q)"):format(dir)))
    assert.are.equal(0, made.rc, made.err)
    os.execute(('cp %s %s/'):format(q(tokenizer), q(dir)))
    local docs = files .. '/docs.jsonl'
    local env = ('WICK_MODEL_DIR=%s WICK_DATA=%s '):format(q(dir), q(docs))
    local recipe = q(helper.ROOT .. '/recipes/llama3_finetune.lua')
    local planned = helper.sh(env .. q(helper.RUN) .. ' --dry-run ' .. recipe)
    assert.are.equal(2, planned.rc, planned.out .. planned.err)
    assert.matches('data.seq_len 512 is above the 64 positions of model.from_pretrained ' .. dir .. ': lower data.seq_len',
      planned.err, 1, true)
    local r = helper.sh(env .. q(helper.RUN) .. ' --nproc-per-node 2 ' .. recipe .. (' --data.seq_len=32 --steps=3 ' ..
      '--batch.global=4 --batch.micro=2 --checkpoint.every=3 --checkpoint.dir=%s'):format(q(root .. '/tuned')))
    assert.are.equal(0, r.rc, r.err)
    assert.matches('vocab 3002', helper.sh(env .. q(helper.RUN) .. ' --dry-run ' .. recipe .. ' --data.seq_len=32').out, 1, true)
    -- A dataset converted with another tokenizer is refused, though its ids would fit.
    local other = helper.sh(('WICK_MODEL_DIR=%s WICK_DATA=%s %s --dry-run %s --data.seq_len=32'):format(q(dir), q(dataset),
      q(helper.RUN), recipe))
    assert.are.equal(2, other.rc, other.out .. other.err)
    assert.matches(("source %s was tokenized by bytes, not by model.from_pretrained's %s/tokenizer.json: convert it with " ..
      'that tokenizer'):format(dataset, dir), other.err, 1, true)
    local tuned = require('wick').nn.from_pretrained(root .. '/tuned/step-00000003')
    assert.are.equal(3002, tuned.config.vocab)
    tuned:free()
    -- what the recipe converted, named by the pair it was converted for
    local converted = ('%s/build/llama3_finetune/data-%s'):format(helper.ROOT, require('wick.recipe.provenance').hash(dir .. '\n' .. docs))
    assert.is_not_nil(io.open(converted .. '/index.json'))
    helper.rmtree(converted)
  end)

  it('mix.lua trains on its three sources with their weight schedules; tiny.lua plans for 8 ranks', function()
    local r = helper.run(q(helper.ROOT .. '/recipes/mix.lua') .. ' --steps 5 --data.seq_len 16')
    assert.are.equal(0, r.rc, r.err)
    assert.matches('step 5/5', r.out, 1, true)
    local plan = helper.run('--dry-run --nproc-per-node 8 ' .. q(helper.ROOT .. '/recipes/mix.lua'))
    assert.are.equal(2, plan.rc, plan.out)
    assert.matches('batch.global 16 is not divisible by world size 8 x batch.micro 8', plan.err, 1, true)
    plan = helper.run('--dry-run --nproc-per-node 8 ' .. q(helper.ROOT .. '/recipes/tiny.lua') .. ' --batch.micro 2')
    assert.are.equal(0, plan.rc, plan.out .. plan.err)
    for _, part in ipairs({ 'modules', 'packages', 'licenses' }) do
      assert.matches('build/demo/' .. part .. ': index read', plan.out .. helper.run('--dry-run ' ..
        q(helper.ROOT .. '/recipes/mix.lua')).out, 1, true)
    end
  end)
end)
