-- Data parallelism is exact: the same global batch trained as 1 rank x 4 micro-steps, 2 ranks x 2
-- and 4 ranks x 1 (real processes, Gloo) sees the same samples (per the loader's audit), the same
-- per-step losses and target counts, and ends with the same weights within fp32 tolerance, also
-- in pad mode where every micro-batch has its own number of target tokens. Gradients all-reduced in
-- bf16 (parallel.grad_dtype) give the fp32 run's within bf16's precision, for half the bytes. Sharded
-- (parallel.shard = optimizer | gradients | parameters), the same ranks give the unsharded run's
-- losses and weights.
-- A Llama recipe trains to the same samples, losses and gradient norms on 1, 2 and 4 ranks.
local helper = require 'helper'
local data_helper = require 'helpers.data'
local wick = require 'wick'
local json = require 'wick.json'
local q = helper.shell_quote

local STEPS = 10
local LOSS_TOLERANCE = 1e-6     -- relative: summation order is all that differs
local WEIGHT_TOLERANCE = 1e-5   -- relative L2 per tensor, after 10 AdamW steps at lr 1e-2: AdamW divides
                                -- by sqrt(v), so for small gradients (biases) it turns summation-order
                                -- noise into updates (3e-6 seen on the block-buffer order); a wrong
                                -- gradient is off by O(1)
local KEY_BIAS_NOISE = 1e-4     -- what rounding noise makes of a parameter with a zero gradient
local BF16_NORM_TOLERANCE = 2 ^ -8  -- relative: bf16 keeps 8 significant bits of each summed gradient
local BF16_LOSS_TOLERANCE = 0.01    -- relative, over 10 steps of AdamW on those gradients
local SMALL_BUCKETS = 4096      -- bytes: several buckets, so that some start during the backward
local SHARD_DIM, SHARD_PARAMETERS = 15, 9915
-- Relative L2 per tensor, sharded against unsharded on the same ranks, after 10 AdamW steps: the
-- per-step losses and gradient norms agree to 1e-6, but a reduce-scatter sums in another order than
-- an all-reduce, and AdamW's m / sqrt(v) turns that order's noise on the smallest gradients into
-- updates of their own (as WEIGHT_TOLERANCE says). Measured here on 4 ranks: 6.5e-7 with OpenBLAS's
-- SSE3 kernels, 9.6e-5 with its AVX-512 ones (other roundings, amplified the same way); a wrong
-- gradient is off by O(1).
local SHARD_WEIGHT_TOLERANCE = 5e-4
local LAYOUTS = { { world = 1, micro = 4 }, { world = 2, micro = 2 }, { world = 4, micro = 1 } }

-- Documents of 1..23 bytes: padded rows of 16 + 1 tokens keep a varying number of targets.
local function short_documents(count)
  local docs = {}
  for i = 1, count do
    local chars = {}
    for k = 1, (i * 7) % 23 + 1 do chars[k] = string.char(97 + (i * k) % 26) end
    docs[i] = table.concat(chars)
  end
  return docs
end

local function train(dataset, mode, world, dir, bucket_bytes, grad_dtype, shard, dim)
  grad_dtype, shard, dim = grad_dtype or 'fp32', shard or 'none', dim or 16
  local name = ('%s/%s-%d-%s-%s-%d'):format(dir, mode, world, grad_dtype, shard, dim)
  local out, audit = name .. '.safetensors', name .. '.audit'
  local r = helper.sh(('cd %s && timeout 120 %s --nproc-per-node %d tests/fixtures/dist/train.lua %s %s %d %s %s %d %s %s %d')
    :format(q(helper.ROOT), q(helper.RUN), world, q(dataset), mode, STEPS, q(out), q(audit), bucket_bytes, grad_dtype,
    shard, dim))
  assert(r.rc == 0, r.out .. r.err)
  local steps = {}
  for line in r.out:gmatch('%[rank0%] (step [^\n]+)') do
    local s, loss, tokens, micro, collectives, buckets, overlapped, norm, bytes = line:match('^step (%d+) loss (%S+) '
      .. 'tokens (%d+) micro (%d+) collectives (%d+) buckets (%d+) overlapped (%d+) grad_norm (%S+) bytes (%d+)$')
    steps[#steps + 1] = { loss = tonumber(loss), tokens = tonumber(tokens), micro = tonumber(micro),
      collectives = tonumber(collectives), buckets = tonumber(buckets), overlapped = tonumber(overlapped),
      grad_norm = tonumber(norm), bytes = tonumber(bytes) }
  end
  assert(#steps == STEPS, r.out)
  return { steps = steps, weights = out, audit = helper.read_file(audit), out = r.out,
    grads = tonumber(r.out:match('%[rank0%] grads (%d+)')) }
end

-- step -> sorted "id hash" of every sample the ranks received for it.
local function samples_by_step(audit)
  local by_step = {}
  for step, id, hash in audit:gmatch('step=(%d+) [^\n]- id=(%S+) [^\n]-hash=(%x+)') do
    by_step[step] = by_step[step] or {}
    table.insert(by_step[step], id .. ' ' .. hash)
  end
  for _, list in pairs(by_step) do table.sort(list) end
  return by_step
end

-- Compares two checkpoints: every tensor within WEIGHT_TOLERANCE (relative L2), except the key
-- third of each attention bias, whose gradient is zero in exact arithmetic (softmax ignores a
-- constant added to all scores of a query): Adam turns its rounding noise into updates, so there
-- both runs must only stay at noise level. Returns the worst relative difference and a message.
local function compare_weights(a_path, b_path)
  local ffi = require 'ffi'
  local a, b = wick.safetensors.load(a_path), wick.safetensors.load(b_path)
  local worst = 0
  for name, t in pairs(a) do
    local x, y = ffi.cast('float *', t:data()), ffi.cast('float *', b[name]:data())
    local n = t:numel()
    local key_bias = name:match('attn%.c_attn%.bias$') and { n / 3, 2 * n / 3 }
    local norm, diff = 0, 0
    for i = 0, n - 1 do
      if key_bias and i >= key_bias[1] and i < key_bias[2] then
        if math.abs(x[i]) > KEY_BIAS_NOISE or math.abs(y[i]) > KEY_BIAS_NOISE then
          return math.huge, ('%s[%d] = %g and %g: not noise'):format(name, i, x[i], y[i])
        end
      else
        norm, diff = norm + x[i] * x[i], diff + (x[i] - y[i]) ^ 2
      end
    end
    local relative = math.sqrt(diff / math.max(norm, 1e-30))
    if relative > worst then worst = relative end
    if relative > WEIGHT_TOLERANCE then return relative, name .. ' differs by ' .. relative end
  end
  return worst, 'ok'
end

describe('data parallelism', function()
  local root, dataset
  setup(function()
    root = helper.tmpdir()
    dataset = data_helper.make_dataset(root .. '/short', short_documents(80))
  end)
  teardown(function() helper.rmtree(root) end)

  for _, mode in ipairs({ 'packed', 'pad' }) do
    it(('gives the same losses, samples and weights on 1x4, 2x2 and 4x1 (%s mode)'):format(mode), function()
      local runs = {}
      for i, layout in ipairs(LAYOUTS) do runs[i] = train(dataset, mode, layout.world, root, SMALL_BUCKETS) end
      local reference = runs[1]
      local varied = {}
      for i, run in ipairs(runs) do
        local layout = LAYOUTS[i]
        for s, step in ipairs(run.steps) do
          local want = reference.steps[s]
          assert.are.equal(layout.micro, step.micro)
          assert.are.equal(want.tokens, step.tokens, 'tokens of step ' .. s)
          assert.is_true(math.abs(step.loss - want.loss) <= LOSS_TOLERANCE * want.loss,
            ('step %d: loss %.9g on %d ranks, %.9g on 1'):format(s, step.loss, layout.world, want.loss))
          -- Only the last micro-step communicates: the count, the buckets and the timing gather.
          assert.are.equal(layout.world == 1 and 0 or step.buckets + 2, step.collectives)
          varied[step.tokens] = true
        end
        assert.are.same(samples_by_step(reference.audit), samples_by_step(run.audit))
        if i > 1 then
          local worst, why = compare_weights(reference.weights, run.weights)
          assert.is_true(worst <= WEIGHT_TOLERANCE, ('on %d ranks: %s'):format(layout.world, why))
        end
      end
      local counts = 0
      for _ in pairs(varied) do counts = counts + 1 end
      if mode == 'pad' then assert.is_true(counts > 3, 'pad mode should vary the target count per step') end
      assert.is_true(reference.steps[STEPS].loss < reference.steps[1].loss, 'it learns')
    end)
  end

  -- Sharding moves the optimizer state, the reduced gradients and the weights, not the training: each
  -- level gives the unsharded run's losses and weights on the same ranks (only the order of sums may
  -- differ). dim 15 makes 9915 parameters: on 2 and 4 ranks the head of the flat storage (N mod W
  -- elements) is a replicated bucket, next to several sharded ones; under 'parameters' the head of
  -- every run of a unit (wick.nn.gathered) is one.
  for _, mode in ipairs({ 'packed', 'pad' }) do
    it(('gives the unsharded losses and weights with shard = optimizer, gradients and parameters, on 1x4, 2x2, 4x1'
      .. ' (%s mode)'):format(mode), function()
      for _, layout in ipairs(LAYOUTS) do
        local plain = train(dataset, mode, layout.world, root, SMALL_BUCKETS, 'fp32', 'none', SHARD_DIM)
        assert.are.equal(SHARD_PARAMETERS, plain.grads)
        for _, level in ipairs({ 'optimizer', 'gradients', 'parameters' }) do
          local run = train(dataset, mode, layout.world, root, SMALL_BUCKETS, 'fp32', level, SHARD_DIM)
          local replicated = tonumber(run.out:match('%[rank0%] grads %d+ replicated (%d+)'))
          for s, step in ipairs(run.steps) do
            local want = plain.steps[s]
            assert.are.equal(layout.micro, step.micro)
            assert.are.equal(want.tokens, step.tokens)
            assert.is_true(math.abs(step.loss - want.loss) <= LOSS_TOLERANCE * want.loss,
              ('%s on %d ranks, step %d: loss %.9g, unsharded %.9g'):format(level, layout.world, s, step.loss, want.loss))
            assert.is_true(math.abs(step.grad_norm - want.grad_norm) <= LOSS_TOLERANCE * want.grad_norm)
            -- and one sum of squares, and one all-gather a sharded bucket (not a replicated one):
            -- under 'parameters' too, since both blocks of the fixture's model stay gathered from the
            -- first micro-step's forward to the step's end, but there every micro-step reduces its
            -- gradients; alone, the reduce-scatters (and gathers) remain, as copies into the slice
            -- (and out of it)
            local sharded = step.buckets - replicated
            local reduced = level == 'parameters' and step.micro * step.buckets or step.buckets
            local alone = ({ optimizer = 0, gradients = step.buckets, parameters = reduced + step.buckets })[level]
            assert.are.equal(layout.world == 1 and alone or reduced + 2 + 1 + sharded, step.collectives)
          end
          assert.are.same(samples_by_step(plain.audit), samples_by_step(run.audit))
          local worst, why = compare_weights(plain.weights, run.weights)
          assert.is_true(worst <= SHARD_WEIGHT_TOLERANCE, ('%s on %d ranks: %s'):format(level, layout.world, why))
        end
      end
    end)
  end

  it('runs its step in compiled traces, with no NYI aborts once warm, sharded too (a world of 1, in process)', function()
    for _, level in ipairs({ 'none', 'gradients', 'parameters' }) do
      local dist = wick.dist.init { timeout = 10 }
      local loader = wick.data.loader { data = dataset, seq_len = 16, global_batch = 4, micro_batch = 2, seed = 1 }
      local vocab = loader:vocab_size()
      local model = wick.nn.gpt { vocab = vocab, seq_len = 16, layers = 1, heads = 2, dim = 16, seed = 1 }
      local opt = wick.optim.adamw { lr = 1e-3, clip = 1.0 }
      local dp = wick.nn.data_parallel(model, dist, { bucket_bytes = SMALL_BUCKETS, shard = level })
      for _ = 1, 30 do dp:step(loader, opt) end  -- buffers allocated, traces recorded
      local log = os.tmpname()
      local jit_v = require 'jit.v'
      jit_v.on(log)
      for _ = 1, 100 do assert(dp:step(loader, opt).micro_steps == 2) end
      jit_v.off()
      local text = helper.read_file(log)
      os.remove(log)
      assert.is_nil(text:match('[^\n]*NYI[^\n]*'), level)
      loader:close()
      dp:free()
      model:free()
      opt:free()
      dist:close()
    end
  end)

  -- The step reads its status once (no host sync per micro-batch on a GPU): a token the model's
  -- vocabulary lacks still fails the step, before its update, naming the step and the index.
  it('fails a step whose batch holds a token outside the vocabulary, before updating, in one line', function()
    local cli = require 'wick.cli'
    local dist = wick.dist.init { timeout = 10 }
    local loader = wick.data.loader { data = dataset, seq_len = 16, global_batch = 4, micro_batch = 2, seed = 1 }
    local model = wick.nn.gpt { vocab = 100, seq_len = 16, layers = 1, heads = 2, dim = 16, seed = 1 }  -- bytes reach 122
    local opt = wick.optim.adamw { lr = 1e-3 }
    local dp = wick.nn.data_parallel(model, dist, {})
    local before = model:flat_parameters().params:clone()
    local ok, e = pcall(dp.step, dp, loader, opt)
    assert.is_false(ok)
    assert.is_true(cli.is_user_error(e), tostring(e))
    assert.matches('^step 1, rank 0: embedding: idx%[%d+%] = 1%d%d is outside %[0, 100%) %(tokenizer and model vocab '
      .. 'disagree%?%)$', e.message)
    assert.are.same(before:totable(), model:flat_parameters().params:totable())
    assert.are.equal(0, opt.step_count)
    before:free()
    loader:close()
    dp:free()
    model:free()
    opt:free()
    dist:close()
  end)

  it('starts gradient all-reduces while the backward pass is still running, and times every rank', function()
    local run = train(dataset, 'packed', 2, root, SMALL_BUCKETS)
    local last = run.steps[STEPS]
    assert.is_true(last.buckets > 2 and last.overlapped > 0 and last.overlapped < last.buckets,
      ('%d of %d buckets overlapped'):format(last.overlapped, last.buckets))
    assert.matches('timing rank 0: %d+ ms %(data %d+ ms, compute %d+ ms, comm %d+ ms%); slowest rank [01]: %d+ ms', run.out)
    local one = train(dataset, 'packed', 2, root, 2 ^ 30)  -- a single bucket: the same training
    assert.are.equal(1, one.steps[1].buckets)
    for s = 1, STEPS do
      assert.is_true(math.abs(one.steps[s].loss - run.steps[s].loss) <= LOSS_TOLERANCE * run.steps[s].loss)
    end
  end)

  it('all-reduces gradients in bf16 with grad_dtype = bf16: the fp32 run within bf16 precision, half the bytes', function()
    local fp32 = train(dataset, 'packed', 2, root, SMALL_BUCKETS, 'fp32')
    local bf16 = train(dataset, 'packed', 2, root, SMALL_BUCKETS, 'bf16')
    local first_a, first_b = fp32.steps[1], bf16.steps[1]
    -- step 1: the same weights and batch, so the gradients differ only by the bf16 all-reduce
    assert.are.equal(first_a.loss, first_b.loss)
    local norm_error = math.abs(first_b.grad_norm - first_a.grad_norm) / first_a.grad_norm
    assert.is_true(norm_error > 0 and norm_error <= BF16_NORM_TOLERANCE, 'step 1 gradient norm off by ' .. norm_error)
    for s = 2, STEPS do
      local a, b = fp32.steps[s].loss, bf16.steps[s].loss
      assert.is_true(math.abs(a - b) <= BF16_LOSS_TOLERANCE * a, ('step %d: loss %.9g in bf16, %.9g in fp32'):format(s, b, a))
    end
    -- on the wire: 2 bytes a gradient element instead of 4 (the count and the timing gather alike)
    assert.are.equal(fp32.grads, bf16.grads)
    for s = 1, STEPS do
      assert.are.equal(2 * fp32.grads, fp32.steps[s].bytes - bf16.steps[s].bytes)
    end
    assert.is_true(fp32.steps[1].bytes >= 4 * fp32.grads)
  end)

  it("takes grad_dtype and bucket_bytes from a recipe's parallel section", function()
    local dir = helper.tmpdir()
    local recipe = helper.write_file(dir .. '/bf16_grads.lua', ([[
      local wick = require 'wick'
      local job = wick.recipe.copy(wick.recipe.include(%q))
      job.steps, job.log.sample = 2, 0
      job.callbacks = { on_train_end = function(trainer)
        local b = trainer.dp.buckets[1]
        print(('all-reduced in %%s, %%d buckets'):format((b.wire or b.view).dtype, #trainer.dp.buckets))
      end }
      return job
    ]]):format(helper.ROOT .. '/recipes/tiny.lua'))
    -- tiny.lua's 120640 parameters: one bucket of 25 MiB, or 59 of 2048 f32 values
    for _, case in ipairs({ { '', 'f32, 1 buckets' }, { '--parallel.grad_dtype=bf16', 'bf16, 1 buckets' },
      { '--parallel.bucket_bytes=8192', 'f32, 59 buckets' } }) do
      local r = helper.run(('--nproc-per-node 2 %s %s'):format(q(recipe), case[1]))
      assert.are.equal(0, r.rc, r.out .. r.err)
      assert.matches('[rank0] all-reduced in ' .. case[2] .. '\n', r.out, 1, true)
    end
    for _, flag in ipairs({ '--parallel.grad_dtype=f16', '--parallel.bucket_bytes=2' }) do
      local bad = helper.run(('%s %s'):format(q(recipe), flag))
      assert.are_not.equal(0, bad.rc)
      assert.matches(flag:match('^%-%-([%w._]+)'), bad.err, 1, true)
    end
    helper.rmtree(dir)
  end)

  -- The paths the fixture's fp32 runs do not take: a compute copy refreshed from all-gathered f32
  -- masters (bf16, fp16 with its loss scaler), bf16 reduce-scatters, and under 'parameters' blocks
  -- that take turns in the two gather slots (3 layers: the forward and the backward each gather
  -- and prefetch), are gathered again for recompute = 'blocks', and two ahead in three slots.
  it("keeps the unsharded losses under bf16 and fp16, with bf16 gradients and with recompute, from a recipe's parallel.shard",
    function()
    local dir = helper.tmpdir()
    local function losses(args)
      local log = dir .. '/log.jsonl'
      os.remove(log)
      local r = helper.run(('--nproc-per-node 2 %s --steps=3 --model.layers=3 --log.sample=0 --log=%s %s'):format(
        q(helper.ROOT .. '/recipes/tiny.lua'), q(log), args))
      assert.are.equal(0, r.rc, r.out .. r.err)
      local out = {}
      for loss in helper.read_file(log):gmatch('"loss":([^,}]+)') do out[#out + 1] = tonumber(loss) end
      assert.are.equal(3, #out)
      return out
    end
    for _, case in ipairs({ '--precision=bf16', '--precision=fp16', '--parallel.grad_dtype=bf16', '--model.recompute=blocks',
      '--model.layers=6 --parallel.prefetch=2' }) do
      local want = losses(case)
      for _, level in ipairs({ 'optimizer', 'gradients', 'parameters' }) do
        local got = losses(case .. ' --parallel.shard=' .. level)
        for s = 1, 3 do
          assert.is_true(math.abs(got[s] - want[s]) <= LOSS_TOLERANCE * want[s],
            ('%s, shard %s, step %d: %.9g, unsharded %.9g'):format(case, level, s, got[s], want[s]))
        end
      end
    end
    local bad = helper.run(('%s --parallel.shard=weights'):format(q(helper.ROOT .. '/recipes/tiny.lua')))
    assert.are_not.equal(0, bad.rc)
    assert.matches('parallel.shard', bad.err, 1, true)
    helper.rmtree(dir)
  end)

  -- The fixture trains a GPT-2; the Llama's own ops (RMSNorm, RoPE, SwiGLU, grouped-query attention)
  -- reduce their parameter gradients over the same buckets, through a recipe as teams run it; and
  -- gather their weights block by block under 'parameters'.
  it('trains a Llama recipe to the same samples, losses and gradient norms on 1x4, 2x2 and 4x1, sharded too', function()
    local dir = helper.tmpdir()
    local function steps(world, args)
      local log = ('%s/llama-%d%s.jsonl'):format(dir, world, args and args:gsub('%W', '') or '')
      local r = helper.run(('--nproc-per-node %d %s --steps=3 --batch.micro=4 --log.sample=0 --log=%s %s'):format(world,
        q(helper.ROOT .. '/recipes/llama_tiny.lua'), q(log), args or ''))
      assert.are.equal(0, r.rc, r.out .. r.err)
      local out = {}
      for line in helper.read_file(log):gmatch('[^\n]+') do
        local step = json.decode(line)
        if step.loss then out[#out + 1] = step end
      end
      assert.are.equal(3, #out)
      return out
    end
    local want = steps(1)
    for _, case in ipairs({ { 2 }, { 4 }, { 4, '--parallel.shard=parameters' } }) do
      local world = case[1]
      for s, got in ipairs(steps(world, case[2])) do
        local where = ('%d ranks %s, step %d'):format(world, case[2] or '', s)
        assert.are.equal(want[s].fingerprint, got.fingerprint, where)
        assert.are.equal(want[s].tokens, got.tokens, where)
        for _, key in ipairs({ 'loss', 'grad_norm' }) do
          assert.is_true(math.abs(got[key] - want[s][key]) <= LOSS_TOLERANCE * want[s][key],
            ('%s: %s %.12g, 1 rank %.12g'):format(where, key, got[key], want[s][key]))
        end
      end
    end
    helper.rmtree(dir)
  end)

  -- Under 'parameters' a block's weights arrive by all-gathers on the group's worker: a rank killed
  -- before it joins one is reported as in any other collective, by the rank waiting in it, within
  -- the timeout, and the launcher names the killed rank.
  it("reports a rank killed while the others gather a block's weights, naming it", function()
    local dir = helper.tmpdir()
    local recipe = helper.write_file(dir .. '/dies.lua', ([[
      local wick = require 'wick'
      local job = wick.recipe.copy(wick.recipe.include(%q))
      job.steps, job.log.sample, job.timeout = 4, 0, 10
      job.callbacks = { on_step_end = function(trainer, m)
        if m.step ~= 2 or trainer.rank ~= 1 then return end
        trainer.model.gathered.fetch = function()  -- step 3's first block: die instead of gathering it
          local ffi = require 'ffi'
          pcall(ffi.cdef, 'int kill(int pid, int sig); int getpid(void);')
          ffi.C.kill(ffi.C.getpid(), 9)
        end
      end }
      return job
    ]]):format(helper.ROOT .. '/recipes/tiny.lua'))
    local r = helper.run(('--nproc-per-node 2 %s --model.layers=3 --parallel.shard=parameters'):format(q(recipe)))
    assert.are_not.equal(0, r.rc)
    assert.matches("rank 0: all_gather #%d+ %(%d+ f32%) at [^\n]*dies%.lua %(wick%.train's step%)[^\n]* waiting for 1 "
      .. 'rank: rank 1 left without dist:close%(%)', r.err)
    assert.matches('run: rank 1 %(pid %d+%) was killed by signal 9', r.err)
    assert.is_nil(r.err:match('called twice'), r.err)
    helper.rmtree(dir)
  end)

  it('refuses a grad_dtype it cannot all-reduce in, naming it', function()
    local dist = wick.dist.init { timeout = 10 }
    local model = wick.nn.gpt { vocab = 11, seq_len = 4, layers = 1, heads = 1, dim = 4, seed = 1 }
    local ok, err = pcall(wick.nn.data_parallel, model, dist, { grad_dtype = 'f16' })
    assert.is_false(ok)
    assert.matches('grad_dtype = "f16" must be one of fp32, bf16', err, 1, true)
    model:free()
    dist:close()
  end)
end)
