-- A user's mistake is one line: exit 2 for usage, exit 1 for data, no Lua traceback; and the dry
-- run refuses what the run itself would refuse at its start. Every case is a real `run` process on
-- a real converted dataset.
local helper = require 'helper'
local data_helper = require 'helpers.data'
local q = helper.shell_quote

-- One line on stderr naming `text`, nothing of Lua's internals, exit `rc`.
local function assert_one_line(r, rc, text)
  assert.are.equal(rc, r.rc, r.out .. r.err)
  assert.are.equal(1, #helper.lines(r.err), r.err)
  assert.matches(text, r.err, 1, true)
  assert.is_nil(r.err:find('traceback', 1, true), r.err)
  assert.is_nil(r.err:find('%.lua:%d+'), r.err)
end

-- The REPL's errors: each `text` on a line of its own, no traceback, no frame of wick's own files.
local function assert_repl_lines(r, texts)
  for _, text in ipairs(texts) do assert.matches('\n' .. text .. '\n', '\n' .. r.err, 1, true) end
  assert.are.equal(#texts, #helper.lines(r.err), r.err)
  assert.is_nil(r.err:find('traceback', 1, true), r.err)
  assert.is_nil(r.err:find('wick/', 1, true), r.err)
end

describe('user errors', function()
  local root, dataset, recipe
  setup(function()
    root = helper.tmpdir()
    dataset = data_helper.make_dataset(root .. '/data', data_helper.documents(200, 40, 5), { shard_size = 4096 })
    -- on the CPU, so the memory checks below judge this machine's memory wherever the spec runs
    recipe = helper.write_file(root .. '/recipe.lua', ([[
return {
  model = { layers = 1, heads = 2, dim = 16, device = 'cpu' },
  data = { sources = { %q }, seq_len = 32 },
  batch = { global = 8, micro = 2 },
  steps = 4, seed = 3, timeout = 30,
}
]]):format(dataset))
  end)
  teardown(function() helper.rmtree(root) end)

  it('a diverged loss (--optim.lr=1e30) is one line naming the step and the lr, on every rank (exit 1)', function()
    local r = helper.run(q(recipe) .. ' --optim.lr=1e30')
    assert_one_line(r, 1, 'optim.adamw: gradient norm is nan at step 2, lr ')
    local two = helper.run('--nproc-per-node 2 ' .. q(recipe) .. ' --optim.lr=1e30')
    assert.are.equal(1, two.rc, two.err)
    assert.matches('[rank1] optim.adamw: gradient norm is nan at step 2', two.out .. two.err, 1, true)
    assert.is_nil((two.out .. two.err):find('traceback', 1, true), two.err)
  end)

  it("the REPL's helpers refuse bad arguments in one line at the typed line: stats(nil), set_lr, set_mix", function()
    local built = helper.run('-i ' .. q(recipe), { stdin = 'stats(nil)\nx = stats(3)\ndecode(nil)\nstep("x")\n' ..
      'peek(0)\nprint("still here", decode({ 104, 105 }))\n' })
    assert.are.equal(1, built.rc)
    assert.matches('still here\thi', built.out, 1, true)
    assert_repl_lines(built, { 'stdin:1: stats(t): t must be a tensor, got nil',
      'stdin:2: stats(t): t must be a tensor, got number',
      'stdin:3: decode(ids): ids must be a tensor or a list of token ids, got nil',
      'stdin:4: step(n): n must be a whole number from 1 to 2^31, got x',
      'stdin:5: peek(n): n must be a whole number from 1 to 2^31, got 0' })
    local paused = helper.run(q(recipe) .. ' --steps=2 --repl-at=1', { stdin =
      'set_lr(-1)\nset_mix(3)\nset_mix{ nosuch = 1 }\nset_mix{ data = 1 / 0 }\nstop(3)\ncontinue()\n' })
    assert.are.equal(0, paused.rc, paused.err)
    assert.matches('step 2/2', paused.out, 1, true)
    assert_repl_lines(paused, { 'stdin:1: set_lr(scale): scale must be a finite number >= 0, got -1',
      'stdin:2: set_mix{ name = weight, ... } takes a table, got number',
      'stdin:3: set_mix: no source is named nosuch (the sources: data)',
      'stdin:4: set_mix: data must be a finite number >= 0, got inf',
      'stdin:5: stop([why]): why must be one line of at most 4096 bytes, got number' })
  end)
  it('print() and the REPL show proportions() and stats() in one readable line, not a table address', function()
    local r = helper.run('-i ' .. q(recipe), { stdin = 'step(1)\nprint(loader:proportions())\n' ..
      'print(stats(require("wick").tensor.new({ 1, 2, 3, 0 / 0 })))\nstats(require("wick").tensor.new({ 4 }))\n' })
    assert.are.equal(0, r.rc, r.err)
    assert.matches('\n' .. dataset .. ' 100.0%% %(8 draws%)\t{8}\n', r.out)
    assert.matches('\n[4] f32: 4 values, mean 2, std 0.816497, min 1, max 3, 1 non-finite\n', r.out, 1, true)
    assert.matches('\n[1] f32: 1 values, mean 4, std 0, min 4, max 4, 0 non-finite\n', r.out, 1, true)
  end)

  describe('the device', function()
    local count = require('wick.device').count()

    it("a CUDA device the machine lacks is one line of the run and a problem of the dry run, on every rank", function()
      local missing = ('cuda:%d'):format(count) -- one past the last: none on a CPU machine
      local says = ("recipe.lua: model.device '%s': this machine has "):format(missing)
      assert_one_line(helper.run(q(recipe) .. ' --model.device=' .. missing), 2, says)
      local plan = helper.run('--dry-run ' .. q(recipe) .. ' --model.device=' .. missing)
      assert.are.equal(2, plan.rc, plan.out .. plan.err)
      assert.are.equal(1, #helper.lines(plan.err), plan.err)
      assert.matches(says, plan.err, 1, true)
      assert.matches('dry run: 1 problem', plan.out, 1, true)
      -- data.device alone moves the model too, and its error names it
      assert_one_line(helper.run(q(recipe) .. ' --model.device=auto --data.device=' .. missing .. ' --steps=1'), 2,
        "data.device '" .. missing .. "': this machine has ")
      local two = helper.run('--nproc-per-node 2 ' .. q(recipe) .. ' --model.device=' .. missing)
      assert.are.equal(2, two.rc, two.err)
      assert.matches('[rank1] ' .. recipe .. ": model.device '" .. missing .. "': this machine has ", two.err, 1, true)
      assert.is_nil(two.err:find('traceback', 1, true), two.err)
      if count == 0 then
        assert_one_line(helper.run(q(recipe) .. ' --model.device=cuda'), 2,
          "model.device 'cuda': this machine has no usable CUDA device (no GPU, no driver, WICK_CUDA=0")
      end
    end)

    it("'auto' takes each rank's GPU, else the CPU, and rank 0 says which once", function()
      local r = helper.run('--nproc-per-node 2 ' .. q(recipe) .. ' --model.device=auto --steps=1')
      assert.are.equal(0, r.rc, r.err)
      local chosen = count == 0 and 'cpu (auto: no CUDA device)' or 'cuda:0 to cuda:1, one a rank'
      local _, said = r.out:gsub('M parameters, fp32, on ' .. chosen:gsub('%p', '%%%0') .. '\n', '')
      assert.are.equal(1, said, r.out)
      local plan = helper.run('--dry-run --nproc-per-node 2 ' .. q(recipe) .. ' --model.device=auto')
      assert.are.equal(0, plan.rc, plan.out .. plan.err)
      assert.matches('\ndevice: ' .. chosen .. '\n', plan.out, 1, true)
    end)
  end)

  describe("the run's mistakes in one line", function()
    it('sources of different tokenizers, or of the same data, in a recipe counted in epochs (exit 2)', function()
      local tokens = {}
      for i = 1, 3000 do tokens[i] = i % 50000 end
      local bin = helper.write_file(root .. '/t.bin', require('helpers.corpus').nanogpt_bin(tokens))
      local gpt2 = root .. '/gpt2-data'
      local made = helper.run(('-m wick.data.convert %s -o %s --tokenizer gpt2 --headerless-bin -q'):format(q(bin), q(gpt2)))
      assert.are.equal(0, made.rc, made.err)
      local copy = data_helper.make_dataset(root .. '/copy', data_helper.documents(200, 40, 5), { shard_size = 4096 })
      local function epochs_of(name, sources)
        return helper.write_file(root .. '/' .. name, ('local r = dofile(%q)\nr.steps, r.epochs = nil, 1\n' ..
          'r.data.sources = { %q, %q }\nreturn r\n'):format(recipe, sources[1], sources[2]))
      end
      local mixed = epochs_of('mixed.lua', { dataset, gpt2 })
      assert_one_line(helper.run(q(mixed)), 2, "mixed.lua: sources '" .. dataset .. "' (tokenizer bytes")
      assert_one_line(helper.run(q(mixed)), 2, 'were made by different tokenizers')
      local twice = epochs_of('twice.lua', { dataset, copy })
      assert_one_line(helper.run(q(twice)), 2, ("twice.lua: sources '%s' and '%s' hold the same data"):format(dataset, copy))
      local plan = helper.run('--dry-run ' .. q(twice))
      assert.are.equal(2, plan.rc, plan.out .. plan.err)
      assert.matches('hold the same data', plan.err, 1, true)
    end)

    it('a mix whose weights are all 0 (exit 2)', function()
      assert_one_line(helper.run(q(recipe) .. ' --data.mix.data=0'), 2,
        'recipe.lua: data.mix: every weight is 0: no source would be drawn')
      assert_one_line(helper.run('--dry-run ' .. q(recipe) .. ' --data.mix.data=0'), 2, 'every weight is 0')
    end)

    it("--steps and --epochs replace each other's field; both, or an empty value, are refused (exit 2)", function()
      local by_epochs = helper.run(q(recipe) .. ' --epochs=0.01')
      assert.are.equal(0, by_epochs.rc, by_epochs.err)
      assert.matches('recipe.lua: 1 rank, %d+ steps of 8 samples', by_epochs.out)
      local epochs = helper.write_file(root .. '/epochs.lua', ('local r = dofile(%q)\nr.steps, r.epochs = nil, 1\nreturn r\n')
        :format(recipe))
      local by_steps = helper.run(q(epochs) .. ' --steps=2')
      assert.are.equal(0, by_steps.rc, by_steps.err)
      assert.matches('epochs.lua: 1 rank, 2 steps of 8 samples', by_steps.out, 1, true)
      assert_one_line(helper.run(q(recipe) .. ' --steps=2 --epochs=1'), 2, 'recipe.lua: give steps or epochs (not both)')
      assert_one_line(helper.run(q(recipe) .. ' --steps='), 2, "recipe.lua: --steps: cannot read '' as integer")
      assert_one_line(helper.run(q(recipe) .. ' --epochs'), 2, 'recipe.lua: --epochs needs a value')
    end)

    it("run's launcher flags after the recipe (torchrun's habit) say they go before it (exit 2)", function()
      assert_one_line(helper.run(q(recipe) .. ' --nproc-per-node 2'), 2, ('recipe.lua: --nproc-per-node is a flag of the ' ..
        'launcher: launcher flags go before the recipe (run --nproc-per-node 2 %s ...)'):format(recipe))
      assert_one_line(helper.run(q(recipe) .. ' --steps=1 --nnodes=2'), 2, '--nnodes is a flag of the launcher')
      assert_one_line(helper.run(q(recipe) .. ' --master-port'), 2, '--master-port is a flag of the launcher')
    end)
  end)

  it('a cyclic recipe table is refused naming the keys of the cycle, not a stack overflow (exit 2)', function()
    local cyclic = helper.write_file(root .. '/cyclic.lua', ('local r = dofile(%q)\nr.data.back = r.data\nreturn r\n')
      :format(recipe))
    assert_one_line(helper.run(q(cyclic)), 2, 'cyclic.lua: data.back refers back to data (a recipe is a tree of tables')
    assert_one_line(helper.run('--dry-run ' .. q(cyclic)), 2, 'data.back refers back to data')
  end)

  it('an infinite mix weight in --mix is one line naming the source and the weight (exit 2)', function()
    local r = helper.run(('-m wick.data.inspect --seq-len 16 --mix %s'):format(
      q(("data.mix{ { %q, weight = math.huge } }"):format(dataset))))
    assert_one_line(r, 2, 'wick.data.inspect: --mix: data.mix source 1 (' .. dataset .. '): weight inf at step 0 must be')
    assert_one_line(helper.run('-m wick.data.inspect --mix "nil + 1"'), 2, '--mix: attempt to perform arithmetic')
    -- A recipe's weight function that is infinite at some step: the run and the dry run say so.
    local infinite = helper.write_file(root .. '/infinite.lua', ('local r = dofile(%q)\n' ..
      'r.data.mix = { data = function(step) return step > 2 and math.huge or 1 end }\nreturn r\n'):format(recipe))
    local says = 'infinite.lua: data.mix source 1 (' .. dataset .. '): weight inf at step 3 must be a finite number >= 0'
    assert_one_line(helper.run(q(infinite)), 2, says)
    local plan = helper.run('--dry-run ' .. q(infinite))
    assert.are.equal(2, plan.rc, plan.out .. plan.err)
    assert.matches(says, plan.err, 1, true)
  end)

  it('a recipe that returns nothing or a non-table is refused (exit 2); a module returning a table is not', function()
    local none = helper.write_file(root .. '/none.lua', 'local unused = 1\n')
    local number = helper.write_file(root .. '/number.lua', 'return 5\n')
    local module = helper.write_file(root .. '/module.lua', 'return { answer = 42 }\n')
    assert_one_line(helper.run('--dry-run ' .. q(none)), 2, 'none.lua: --dry-run plans a recipe, and the script returned nothing')
    assert_one_line(helper.run('--dry-run ' .. q(module)), 2, 'module.lua: --dry-run plans a recipe, and the script returned a table')
    assert_one_line(helper.run(q(number)), 2, 'number.lua: the script returned a number, not a recipe')
    assert.are.equal(0, helper.run(q(none)).rc)
    assert.are.equal(0, helper.run(q(module)).rc)
  end)

  it('--repl-at beyond the last step is a usage error of the run and a problem of the dry run', function()
    assert_one_line(helper.run(q(recipe) .. ' --repl-at=5', { stdin = '' }), 2,
      '--repl-at=5 is not a step of this run (it trains steps 1 to 4)')
    local plan = helper.run('--dry-run ' .. q(recipe) .. ' --repl-at=5')
    assert.are.equal(2, plan.rc, plan.out .. plan.err)
    assert.matches('--repl-at=5 is beyond the last step 4', plan.err, 1, true)
    assert.are.equal(0, helper.run(q(recipe) .. ' --repl-at=4', { stdin = 'continue()\n' }).rc)
  end)
  describe('the dry run refuses what the run would refuse at its start', function()
    local function dry(args)
      local r = helper.run('--dry-run ' .. q(recipe) .. ' ' .. args)
      assert.are.equal(2, r.rc, r.out .. r.err)
      assert.is_nil(r.out:find('dry run: ok', 1, true), r.out)
      return r
    end

    it('a data.seq_len no sample of the source is long enough for, and its memory beyond the machine', function()
      local r = dry('--data.seq_len=16777216')
      assert.matches("source '" .. dataset .. "' is too small for one epoch: it needs at least one sample of 16777217",
        r.err, 1, true)
      assert.matches('the memory estimate, [%d.]+ GiB per rank x 1 rank on this machine, is above its', r.err)
      assert.matches('(device cpu)', r.err, 1, true)
      assert_one_line(helper.run(q(recipe) .. ' --data.seq_len=16777216'), 2, 'is too small for one epoch')
    end)

    it('a data.node_cache_bytes too small for the ring of micro-batches', function()
      local r = dry('--data.node_cache_bytes=65536')
      assert.matches("source '" .. dataset .. "': node_cache_bytes 65536 holds 0 shuffle pools", r.err, 1, true)
      assert_one_line(helper.run(q(recipe) .. ' --data.node_cache_bytes=65536'), 2, 'node_cache_bytes 65536 holds 0 shuffle pools')
    end)

    it("a model whose memory estimate is above this machine's memory", function()
      local r = dry('--model.dim=65536 --model.heads=2')
      assert.matches('the memory estimate, [%d.]+ GiB per rank x 1 rank on this machine, is above its [%d.]+ GiB', r.err)
      local ok = helper.run('--dry-run ' .. q(recipe))
      assert.are.equal(0, ok.rc, ok.out .. ok.err)
      assert.matches(', data ring [%d.]+ KiB: total ', ok.out)
    end)

    it("the ranks of this machine together: a model that fits one rank's memory but not N ranks'", function()
      local model = ' --model.dim=2048 --model.heads=2 --batch.micro=1'
      local one = helper.run('--dry-run ' .. q(recipe) .. model)
      assert.are.equal(0, one.rc, one.out .. one.err)
      local value, unit = one.out:match('total ([%d.]+) (%a+)')
      local per_rank = tonumber(value) * ({ KiB = 2 ^ 10, MiB = 2 ^ 20, GiB = 2 ^ 30 })[unit]
      local ranks = math.ceil(1.5 * require('wick.train.plan').machine_memory() / per_rank) -- each fits; together not
      local r = helper.run(('--dry-run --nproc-per-node %d %s --batch.global=%d%s'):format(ranks, q(recipe), ranks, model))
      assert.are.equal(2, r.rc, r.out .. r.err)
      assert.matches((' per rank x %d ranks on this machine, is above its'):format(ranks), r.err, 1, true)
    end)
  end)
end)
