-- Recipes and the trainer, end to end through `run`: the recipe schema and its overrides, the
-- trainer's loop, accumulation schedules, callbacks, checkpoints and exact resume after SIGKILL
-- (2 ranks, and onto 1 and 4), checkpoints as input (every field checked, one writer a directory,
-- fsync), the resume diff, the dry run and the REPL of a built recipe. Every run is a real `run`
-- process (ranks through the launcher) on a real converted dataset.
local ffi = require 'ffi'
local helper = require 'helper'
local data_helper = require 'helpers.data'
local core = require 'wick.core'
local q = helper.shell_quote

pcall(ffi.cdef, 'int usleep(unsigned int usec);')

local POLL_US = 20000
local WAIT_POLLS = 1500 -- 30 s
local DRY_RUN_SECONDS = 5

local GPT_MODEL = 'model = { layers = 1, heads = 2, dim = 16 },'
local LLAMA_MODEL = "model = { arch = 'llama', layers = 1, heads = 4, kv_heads = 2, dim = 16, ffn_dim = 24 },"

-- A recipe file of a tiny GPT (or of `model`, a model section's Lua source) on `dataset`, with
-- `extra` fields (Lua source) added to its table.
local function write_recipe(path, dataset, extra, model)
  return helper.write_file(path, ([[
local wick = require 'wick'
return {
  %s
  data = { sources = { %q }, seq_len = 32 },
  batch = { global = 8, micro = 2 },
  optim = { lr = 3e-3, warmup = 2, clip = 1.0 },
  steps = 8, seed = 3, timeout = 30,
  %s
}
]]):format(model or GPT_MODEL, dataset, extra or ''))
end

-- step -> the JSON text of its loss (the shortest text of the double: equal text, equal double),
-- the last record of a step winning (a resumed run appends to the killed run's log).
local function losses(path)
  local out = {}
  for line in helper.read_file(path):gmatch('[^\n]+') do
    out[tonumber(line:match('"step":(%d+)'))] = line:match('"loss":([^,}]+)')
  end
  return out
end

local function field(path, name)
  local out = {}
  for line in helper.read_file(path):gmatch('[^\n]+') do
    out[tonumber(line:match('"step":(%d+)'))] = line:match('"' .. name .. '":([^,}]+)')
  end
  return out
end

local function wait_for(path)
  for _ = 1, WAIT_POLLS do
    if io.open(path) then return true end
    ffi.C.usleep(POLL_US)
  end
  return false
end

describe('recipes', function()
  local root, dataset, held_out, recipe
  setup(function()
    root = helper.tmpdir()
    dataset = data_helper.make_dataset(root .. '/data', data_helper.documents(400, 40, 6), { shard_size = 4096 })
    held_out = data_helper.make_dataset(root .. '/held', data_helper.documents(60, 40, 9), { shard_size = 4096 })
    recipe = write_recipe(root .. '/recipe.lua', dataset)
  end)
  teardown(function() helper.rmtree(root) end)

  describe('the schema', function()
    it('refuses an unknown key with its path and the nearest name', function()
      local bad = write_recipe(root .. '/typo.lua', dataset, 'eval = { evrey = 2 },')
      local r = helper.run(q(bad))
      assert.are.equal(2, r.rc, r.err)
      assert.matches('typo.lua: eval.evrey: unknown key (did you mean eval.every?)', r.err, 1, true)
    end)

    it('refuses a model section that is not one model, naming the key and what to change', function()
      local cases = {
        { "model = { layers = 1, heads = 2, dim = 16, kv_heads = 1 },", "model.kv_heads is a Llama's: set model.arch = 'llama', or drop it" },
        { "model = { arch = 'llama', layers = 1, heads = 2, dim = 16 },", 'model.ffn_dim is required (or model.from_pretrained = a model directory)' },
        { "model = { arch = 'llama', layers = 1, heads = 4, kv_heads = 3, dim = 16, ffn_dim = 8 },", 'model.heads 4 is not a multiple of model.kv_heads 3' },
        { "model = { arch = 'llama', layers = 1, heads = 16, dim = 16, ffn_dim = 8 },", 'model.dim / model.heads = 1 must be even (RoPE rotates pairs)' },
        { "model = { from_pretrained = '/nowhere', arch = 'llama' },", "model.arch: model.from_pretrained's config.json gives the model's shape: drop model.arch" },
      }
      for i, case in ipairs(cases) do
        local r = helper.run(q(write_recipe(root .. '/model' .. i .. '.lua', dataset, nil, case[1])))
        assert.are.equal(2, r.rc, r.err)
        assert.matches(case[2], r.err, 1, true)
      end
      local missing = helper.run('--dry-run ' .. q(write_recipe(root .. '/missing-model.lua', dataset, nil,
        ("model = { from_pretrained = %q },"):format(root .. '/no-model'))))
      assert.are.equal(2, missing.rc)
      assert.matches('model.from_pretrained: ' .. root .. '/no-model/config.json: cannot be read', missing.err, 1, true)
    end)

    it('refuses a wrong type with its path', function()
      local bad = write_recipe(root .. '/type.lua', dataset, "checkpoint = { keep = 'two' },")
      local r = helper.run(q(bad))
      assert.are.equal(2, r.rc)
      assert.matches('checkpoint.keep = "two": must be a number', r.err, 1, true)
    end)

    it('types overrides by the schema and refuses unknown keys and bad values, naming the key', function()
      local cases = {
        ['--batch.mciro=4'] = '--batch.mciro: unknown key (did you mean batch.micro?)',
        ['--steps=ten'] = "--steps: cannot read 'ten' as integer",
        ['--steps=0'] = 'steps = 0: must be within [1, ',
        ['--checkpoint.every=-1'] = 'checkpoint.every = -1: must be within [0, ',
        ['--precision=fp8'] = 'precision = "fp8": is not a precision policy',
        ['--data.seq_len=2.5'] = 'data.seq_len = 2.5: must be a whole number',
        ['--batch=3'] = '--batch: is a table of options',
        ['--callbacks=x'] = '--callbacks: cannot be set from the command line',
        ['--resume=yes'] = '--resume takes no value',
      }
      for args, message in pairs(cases) do
        local r = helper.run(q(recipe) .. ' ' .. args)
        assert.are.equal(2, r.rc, args .. ': ' .. r.err)
        assert.matches(message, r.err, 1, true)
        assert.are.equal(1, #helper.lines(r.err), args .. ': one line: ' .. r.err)
      end
    end)

    it('lists every field, generated from the schema, for --help', function()
      local r = helper.run(q(recipe) .. ' --help')
      assert.are.equal(0, r.rc, r.err)
      for _, path in ipairs({ 'batch.global', 'batch.micro', 'batch.schedule', 'checkpoint.every', 'checkpoint.dir',
        'checkpoint.keep', 'data.seq_len', 'optim.scale_lr', 'precision', 'steps', 'seed', 'callbacks' }) do
        assert.matches('\n  ' .. path .. ' ', r.out, 1, true)
      end
    end)
  end)

  describe('the trainer', function()
    it('trains with overrides: the loss falls and the JSONL log has a record per step', function()
      local log = root .. '/train.jsonl'
      local r = helper.run(('%s --steps=40 --data.seq_len=16 --batch.micro=4 --optim.lr=0.01 --log=%s'):format(q(recipe),
        q(log)))
      assert.are.equal(0, r.rc, r.err)
      assert.matches('step 40/40', r.out, 1, true)
      local lines = helper.lines(helper.read_file(log))
      assert.are.equal(40, #lines)
      for _, key in ipairs({ 'step', 'loss', 'lr', 'tokens', 'tokens_per_s', 'data_wait', 'grad_norm', 'loss_scale',
        'fingerprint', 'ranks' }) do
        assert.matches('"' .. key .. '":', lines[1], 1, true)
      end
      assert.matches('"micro_batch":4', lines[1], 1, true)
      local l = losses(log)
      assert.is_true(tonumber(l[40]) < 0.8 * tonumber(l[1]), l[1] .. ' -> ' .. l[40])
    end)

    it("counts MFU on the trained data.seq_len, attention causal, not the model's positions", function()
      local log = root .. '/mfu.jsonl'
      local r = helper.run(('%s --steps=2 --model.seq_len=64 --data.seq_len=16 --log.peak_flops=1e9 --log=%s')
        :format(q(recipe), q(log)))
      assert.are.equal(0, r.rc, r.err)
      local mfu, rate = tonumber(field(log, 'mfu')[2]), tonumber(field(log, 'tokens_per_s')[2])
      -- 1 layer, dim 16, 257 tokens, 64 positions: 6 per parameter, and 6 L C (T + 1) at T = 16
      local P = 257 * 16 + 64 * 16 + (12 * 16 * 16 + 13 * 16) + 2 * 16
      local flops = 6 * P + 6 * 1 * 16 * 17
      assert.is_true(math.abs(mfu / (flops * rate / 1e9) - 1) < 1e-6, mfu .. ' vs ' .. flops * rate / 1e9)
    end)

    it('wick.train(table, args) trains from any script and returns the losses', function()
      local script = helper.write_file(root .. '/script.lua', ([[
local wick = require 'wick'
local losses = wick.train(dofile(%q), { '--steps=3', '--log.every=1' })
print('losses', #losses, losses[3] < losses[1] + 1)
]]):format(recipe))
      local r = helper.run(q(script))
      assert.are.equal(0, r.rc, r.err)
      assert.matches('step 3/3', r.out, 1, true)
      assert.matches('losses\t3\ttrue', r.out, 1, true)
    end)

    it('schedules the learning rate: warmup, constant, linear and cosine decay, scaled by batch or world', function()
      local train = require 'wick.train'
      local function close(a, b) return math.abs(a - b) <= 1e-12 * math.max(1, math.abs(b)) end
      local base = { lr = 1e-3, warmup = 10, min_lr = 1e-4, base_batch = 256, scale_lr = 'none' }
      local function with(t)
        local o = {}
        for k, v in pairs(base) do o[k] = v end
        for k, v in pairs(t) do o[k] = v end
        return o
      end
      local cosine = train.lr_schedule(with { schedule = 'cosine' }, 110, 256, 1)
      assert.is_true(close(cosine(5), 5e-4) and close(cosine(10), 1e-3))
      assert.is_true(close(cosine(60), 1e-4 + 0.5 * 9e-4) and close(cosine(110), 1e-4))
      local linear = train.lr_schedule(with { schedule = 'linear' }, 110, 256, 1)
      assert.is_true(close(linear(60), 1e-4 + 0.5 * 9e-4) and close(linear(110), 1e-4))
      assert.is_true(close(train.lr_schedule(with { schedule = 'constant' }, 110, 256, 1)(100), 1e-3))
      local function peak(scale, global, world)
        return train.lr_schedule(with { schedule = 'constant', scale_lr = scale }, 110, global, world)(50)
      end
      assert.is_true(close(peak('linear', 1024, 1), 4e-3) and close(peak('sqrt', 1024, 1), 2e-3))
      assert.is_true(close(peak('world', 1024, 8), 8e-3) and close(peak('none', 1024, 8), 1e-3))
    end)

    it('runs train_step in compiled traces, with no NYI aborts once warm (in process)', function()
      local job = require('wick.recipe').load(recipe, dofile(recipe), { '--steps=200' })
      local trainer = require('wick.train').new(job)
      for _ = 1, 30 do trainer:train_step() end -- buffers allocated, traces recorded
      local log = os.tmpname()
      local jit_v = require 'jit.v'
      jit_v.on(log)
      for _ = 1, 100 do assert(trainer:train_step().micro_steps == 4) end
      jit_v.off()
      local text = helper.read_file(log)
      os.remove(log)
      trainer:close()
      assert.is_nil(text:match('[^\n]*NYI[^\n]*'))
    end)

    it('evaluates on the held-out source every N steps', function()
      local log = root .. '/eval.jsonl'
      local r = helper.run(('%s --steps=4 --eval.source=%s --eval.every=2 --log=%s'):format(q(recipe), q(held_out), q(log)))
      assert.are.equal(0, r.rc, r.err)
      local evals = field(log, 'eval_loss')
      assert.is_nil(evals[1])
      assert.is_true(tonumber(evals[2]) > 0 and tonumber(evals[4]) > 0)
      assert.matches('eval %d+%.%d+', r.out)
    end)

    it('turns epochs into steps: passes over the sources, over the global batch', function()
      local path = helper.write_file(root .. '/epochs.lua', ('local r = dofile(%q); r.steps = nil; r.epochs = 0.1; return r')
        :format(recipe))
      local r = helper.run(q(path) .. ' --log=' .. q(root .. '/epochs.jsonl'))
      assert.are.equal(0, r.rc, r.err)
      local total = tonumber(r.out:match(', (%d+) steps of 8 samples'))
      local epoch = require('wick').data.loader { data = dataset, seq_len = 32, global_batch = 8, world_size = 1, rank = 0 }
      assert.are.equal(math.ceil(0.1 * epoch:epoch_length(1) / 8), total)
      epoch:close()
      assert.are.equal(total, #helper.lines(helper.read_file(root .. '/epochs.jsonl')))
    end)

    it('changes the accumulation at the step the schedule says, over the same samples', function()
      local plain = write_recipe(root .. '/plain.lua', dataset, ("data = { sources = { %q }, seq_len = 32, audit = %q },")
        :format(dataset, root .. '/plain.audit'))
      local scheduled = write_recipe(root .. '/scheduled.lua', dataset,
        ("data = { sources = { %q }, seq_len = 32, audit = %q }, batch = { global = 8, schedule = { {1, 4}, {4, 2} } },")
        :format(dataset, root .. '/scheduled.audit'))
      local a = helper.run(('%s --steps=6 --batch.micro=8 --log=%s'):format(q(plain), q(root .. '/plain.jsonl')))
      local b = helper.run(('%s --steps=6 --log=%s'):format(q(scheduled), q(root .. '/scheduled.jsonl')))
      assert.are.equal(0, a.rc, a.err)
      assert.are.equal(0, b.rc, b.err)
      local micro = field(root .. '/scheduled.jsonl', 'micro_batch')
      assert.are.same({ '2', '2', '2', '4', '4', '4' }, micro)
      local function samples(path)
        local out = {}
        for line in helper.read_file(path):gmatch('[^\n]+') do
          out[#out + 1] = line:match('step=(%d+)') .. ' ' .. line:match('id=(%S+)')
        end
        table.sort(out)
        return out
      end
      assert.are.same(samples(root .. '/plain.audit'), samples(root .. '/scheduled.audit'))
      local la, lb = losses(root .. '/plain.jsonl'), losses(root .. '/scheduled.jsonl')
      for step = 1, 6 do
        assert.is_true(math.abs(tonumber(la[step]) - tonumber(lb[step])) < 1e-5 * tonumber(la[step]), step .. '')
      end
    end)

    it('lets a callback stop training, on every rank at the same step', function()
      local stopping = write_recipe(root .. '/stop.lua', dataset, [[
callbacks = {
  { on_step_end = function(t, m) if t.rank == 1 and m.step == 3 then t:stop('rank 1 had enough') end end },
  { on_train_end = function(t, info) print(('rank %d ended after step %d'):format(t.rank, info.step)) end },
},]])
      local r = helper.run('--nproc-per-node 2 ' .. q(stopping) .. ' --log=' .. q(root .. '/stop.jsonl'))
      assert.are.equal(0, r.rc, r.err)
      assert.matches('[rank0] rank 0 ended after step 3', r.out, 1, true)
      assert.matches('[rank1] rank 1 ended after step 3', r.out, 1, true)
      assert.matches('stopped after step 3', r.out, 1, true)
      assert.are.equal(3, #helper.lines(helper.read_file(root .. '/stop.jsonl')))
    end)
  end)

  describe('checkpoints', function()
    local KILLABLE = [[
callbacks = { on_checkpoint = function(t, info)
  local mark = os.getenv('KILL_MARK')
  if mark and info.step == 4 and t.rank == 0 then
    local f = assert(io.open(mark, 'w')); f:write('checkpointed'); f:close()
    local ffi = require 'ffi'
    pcall(ffi.cdef, 'int usleep(unsigned int usec);')
    for _ = 1, 600 do ffi.C.usleep(100000) end -- until the test kills the job
  end
end },
checkpoint = { every = 2, keep = 2 },]]

    -- Runs `path` on 2 ranks straight into dir-straight, and again into dir, killed (kill -9) once it has
    -- checkpointed step 4; the logs are name-straight.jsonl and name-killed.jsonl.
    local function straight_and_killed(path, dir, name)
      local straight = helper.run(('--nproc-per-node 2 %s --checkpoint.dir=%s --log=%s'):format(q(path),
        q(dir .. '-straight'), q(root .. '/' .. name .. '-straight.jsonl')))
      assert.are.equal(0, straight.rc, straight.err)
      local mark = root .. '/' .. name .. '.mark'
      local pid = helper.sh(('KILL_MARK=%s setsid %s --nproc-per-node 2 %s --checkpoint.dir=%s --log=%s ' ..
        '>/dev/null 2>&1 & echo $!'):format(q(mark), q(helper.RUN), q(path), q(dir), q(root .. '/' .. name .. '-killed.jsonl'))).out
      assert.is_true(wait_for(mark), 'the job never reached its checkpoint at step 4')
      pid = assert(pid:match('%d+'), 'no pid')
      os.execute('kill -9 -' .. pid) -- the launcher's process group: the launcher and both ranks
      for _ = 1, WAIT_POLLS do
        if os.execute('kill -0 -' .. pid .. ' 2>/dev/null') ~= 0 then break end
        ffi.C.usleep(POLL_US)
      end
      assert.are_not.equal(0, os.execute('kill -0 -' .. pid .. ' 2>/dev/null'), 'the job is gone')
      assert.is_nil(losses(root .. '/' .. name .. '-killed.jsonl')[5], 'killed after step 4')
    end

    -- Resumes the killed run of straight_and_killed on 2 ranks: every loss equals the straight run's.
    local function resume_exactly(path, dir, name)
      local log = root .. '/' .. name .. '-killed.jsonl'
      local resumed = helper.run(('--nproc-per-node 2 %s --checkpoint.dir=%s --log=%s --resume'):format(q(path), q(dir), q(log)))
      assert.are.equal(0, resumed.rc, resumed.err)
      assert.matches('resume: from ' .. dir .. '/step-00000004 (step 4)', resumed.out, 1, true)
      assert.are.same(losses(root .. '/' .. name .. '-straight.jsonl'), losses(log))  -- all 8 steps, bit for bit
    end

    it('resumes exactly after kill -9 on 2 ranks, and onto 1 and 4 ranks at the same global batch', function()
      local path = write_recipe(root .. '/killable.lua', dataset, KILLABLE)
      local dir = root .. '/ck'
      straight_and_killed(path, dir, 'gpt')
      os.execute(('cp -r %s %s && cp -r %s %s'):format(q(dir), q(dir .. '1'), q(dir), q(dir .. '4')))
      resume_exactly(path, dir, 'gpt')
      local want = losses(root .. '/gpt-straight.jsonl')
      for _, ranks in ipairs({ 1, 4 }) do
        local log = ('%s/onto%d.jsonl'):format(root, ranks)
        local r = helper.run(('--nproc-per-node %d %s --checkpoint.dir=%s%d --log=%s --resume'):format(ranks, q(path), q(dir),
          ranks, q(log)))
        assert.are.equal(0, r.rc, r.err)
        local got = losses(log)
        for step = 5, 8 do
          local a, b = tonumber(want[step]), tonumber(got[step])
          assert.is_true(math.abs(a - b) < 1e-5 * a, ('%d ranks, step %d: %s vs %s'):format(ranks, step, want[step], got[step]))
        end
      end
    end)

    -- Each rank of a sharded run writes its slice of the moments; any world size and sharding reads
    -- the slices (or an unsharded run's one file) back: the resumed steps give the straight run's losses.
    -- Width 15 leaves replicated heads (numel mod W) in the flat order, under 'parameters' one in
    -- each run of a unit: a rank other than 0 stores its blocks around them.
    it('resumes 4 ranks sharded onto 2 unsharded, 2 onto 4, 4 onto 1, 2 unsharded onto 4 sharded, and across levels',
      function()
      local path = write_recipe(root .. '/sharded.lua', dataset, [[
callbacks = { on_step_end = function(t, m)
  if os.getenv('STOP_AT') == tostring(m.step) then t:stop('stopped for the test') end
end },
checkpoint = { every = 2, keep = 2 },]], 'model = { layers = 2, heads = 3, dim = 15 },')
      local straight = root .. '/shard-straight.jsonl'
      local r = helper.run(('--nproc-per-node 2 %s --checkpoint.dir=%s --log=%s'):format(q(path),
        q(root .. '/ck-shard-straight'), q(straight)))
      assert.are.equal(0, r.rc, r.err)
      local want = losses(straight)
      local cases = { { 4, 'optimizer', 2, 'none' }, { 2, 'gradients', 4, 'gradients' }, { 4, 'gradients', 1, 'none' },
        { 2, 'none', 4, 'optimizer' }, { 4, 'parameters', 2, 'optimizer' }, { 2, 'optimizer', 4, 'parameters' },
        { 2, 'parameters', 1, 'none' } }
      for i, case in ipairs(cases) do
        local dir, log = ('%s/ck-shard%d'):format(root, i), ('%s/shard%d.jsonl'):format(root, i)
        local first = helper.sh(('STOP_AT=4 %s --nproc-per-node %d %s --parallel.shard=%s --checkpoint.dir=%s --log=%s')
          :format(q(helper.RUN), case[1], q(path), case[2], q(dir), q(log)))
        assert.are.equal(0, first.rc, first.err)
        assert.is_nil(losses(log)[5], 'stopped after step 4')
        local files = {}
        for name in io.popen('ls ' .. q(dir .. '/step-00000004')):lines() do
          if name:match('^optimizer') then files[#files + 1] = name end
        end
        local written = { 'optimizer.safetensors' }
        if case[2] ~= 'none' then
          written = {}
          for r = 0, case[1] - 1 do written[r + 1] = ('optimizer-%05d-of-%05d.safetensors'):format(r, case[1]) end
        end
        assert.are.same(written, files)
        local resumed = helper.run(('--nproc-per-node %d %s --parallel.shard=%s --checkpoint.dir=%s --log=%s --resume')
          :format(case[3], q(path), case[4], q(dir), q(log)))
        assert.are.equal(0, resumed.rc, resumed.err)
        assert.matches('resume: from ' .. dir .. '/step-00000004 (step 4)', resumed.out, 1, true)
        local got = losses(log)
        for step = 1, 8 do
          local a, b = tonumber(want[step]), tonumber(got[step])
          assert.is_true(math.abs(a - b) < 1e-5 * a,
            ('%d ranks %s -> %d ranks %s, step %d: %s vs %s'):format(case[1], case[2], case[3], case[4], step, want[step],
            got[step]))
        end
      end
    end)

    -- Sharded under bf16, a rank holds the f32 masters of its slice only: each writes its pieces,
    -- rounded to bf16, into the checkpoint's one model.safetensors (config.json: torch_dtype
    -- bfloat16), in parallel, and the masters into its optimizer file, from which any sharding
    -- resumes. The file is the unsharded run's byte for byte ('optimizer' all-reduces as 'none'
    -- does); on one rank every sum is the straight run's, so the resumed losses are its bits; 2 ranks
    -- onto 1 as in the world-size test above. 'parameters' reduces the gradients of every micro-step
    -- (4 here) and sums them in its slice, where the others accumulate in the gradient buffer: other
    -- roundings of the same sums (masters 5e-9 apart), so its file holds the same tensors with
    -- weights within one bf16 rounding step of relative L2 per tensor, and its losses are held to the
    -- world-size tolerance.
    local WEIGHTS_CLOSE = 2 ^ -8  -- a bf16 weight rounded the other way; a wrong gradient is off by O(1)
    -- The largest relative L2 distance between the same tensors of two weight files (which must hold
    -- the same names and shapes).
    local function weights_apart(a_path, b_path)
      local ffi = require 'ffi'
      local a, b = require('wick').safetensors.load(a_path), require('wick').safetensors.load(b_path)
      local worst = 0
      for name, t in pairs(a) do
        assert.are.same(t.shape, b[name].shape, name)
        local tf, uf = t:float(), b[name]:float()
        local x, y, norm, diff = ffi.cast('float *', tf:data()), ffi.cast('float *', uf:data()), 0, 0
        for i = 0, t:numel() - 1 do norm, diff = norm + x[i] * x[i], diff + (x[i] - y[i]) ^ 2 end
        worst = math.max(worst, math.sqrt(diff / math.max(norm, 1e-30)))
        tf:free()
        uf:free()
      end
      for name in pairs(b) do assert.is_not_nil(a[name], name) end
      return worst
    end
    it('writes the weights its ranks hold into one bf16 model file and resumes a bf16 run from its masters onto another sharding',
      function()
      local path = write_recipe(root .. '/sharded-bf16.lua', dataset, [[
callbacks = { on_step_end = function(t, m)
  if os.getenv('STOP_AT') == tostring(m.step) then t:stop('stopped for the test') end
end },
precision = 'bf16',
checkpoint = { every = 2, keep = 2 },]])
      local straight = {}
      for ranks = 1, 2 do
        local dir, log = ('%s/ck-bf16-straight-%d'):format(root, ranks), ('%s/bf16-straight-%d.jsonl'):format(root, ranks)
        local r = helper.sh(('STOP_AT=4 %s --nproc-per-node %d %s --checkpoint.dir=%s --log=%s'):format(q(helper.RUN), ranks,
          q(path), q(dir), q(log)))
        assert.are.equal(0, r.rc, r.err)
        straight[ranks] = dir .. '/step-00000004/model.safetensors'
      end
      local r = helper.run(('%s --checkpoint.dir=%s --log=%s'):format(q(path), q(root .. '/ck-bf16-straight'),
        q(root .. '/bf16-straight.jsonl')))
      assert.are.equal(0, r.rc, r.err)
      local want = losses(root .. '/bf16-straight.jsonl')
      for i, case in ipairs({ { 1, 'optimizer', 1, 'none' }, { 1, 'none', 1, 'gradients' }, { 1, 'gradients', 1, 'optimizer' },
        { 2, 'optimizer', 1, 'none' }, { 1, 'parameters', 1, 'none' }, { 2, 'parameters', 1, 'gradients' },
        { 1, 'none', 1, 'parameters' } }) do
        local dir, log = ('%s/ck-bf16-%d'):format(root, i), ('%s/bf16-%d.jsonl'):format(root, i)
        local first = helper.sh(('STOP_AT=4 %s --nproc-per-node %d %s --parallel.shard=%s --checkpoint.dir=%s --log=%s')
          :format(q(helper.RUN), case[1], q(path), case[2], q(dir), q(log)))
        assert.are.equal(0, first.rc, first.err)
        local what = ('%d ranks %s -> %d ranks %s'):format(unpack(case))
        local file = dir .. '/step-00000004/model.safetensors'
        local header = require('wick').safetensors.header(file)
        assert.are.equal('bf16', header['transformer.wte.weight'].dtype, what)
        assert.matches('"torch_dtype":"bfloat16"', helper.read_file(dir .. '/step-00000004/config.json'), 1, true)
        local exact = case[2] ~= 'parameters' and case[4] ~= 'parameters'
        if case[2] == 'parameters' then
          local worst = weights_apart(file, straight[case[1]])
          assert.is_true(worst <= WEIGHTS_CLOSE, ('%s: weights %g apart'):format(what, worst))
        else
          assert.is_true(helper.read_file(file) == helper.read_file(straight[case[1]]), what)
        end
        local resumed = helper.run(('--nproc-per-node %d %s --parallel.shard=%s --checkpoint.dir=%s --log=%s --resume')
          :format(case[3], q(path), case[4], q(dir), q(log)))
        assert.are.equal(0, resumed.rc, resumed.err)
        local got = losses(log)
        for step = 1, 8 do
          if case[1] == 1 and exact then
            assert.are.equal(want[step], got[step], what .. ', step ' .. step)
          else
            local a, b = tonumber(want[step]), tonumber(got[step])
            assert.is_true(math.abs(a - b) < 1e-5 * a, ('%s, step %d: %s vs %s'):format(what, step, want[step], got[step]))
          end
        end
      end
    end)

    -- Rank 1 of a sharded run is killed with SIGKILL halfway through writing its slice of step 4's
    -- checkpoint (under 'parameters' after writing its pieces of the masters into model.safetensors):
    -- the job fails naming it, step 2's checkpoint stays the newest complete one, and the run resumes
    -- from it with the straight run's losses.
    it('keeps the previous checkpoint when a rank is killed in the middle of a sharded save', function()
      local path = write_recipe(root .. '/killed-in-save.lua', dataset, [[
callbacks = { on_step_end = function(t, m)
  if m.step ~= 3 or t.rank ~= 1 or not os.getenv('KILL_IN_SAVE') then return end
  local checkpoint = require 'wick.train.checkpoint'
  checkpoint.save_optimizer = function(dir)
    local f = assert(io.open(dir .. '/optimizer-00001-of-00002.safetensors', 'wb'))
    f:write(string.rep('x', 1000)); f:close()
    local ffi = require 'ffi'
    pcall(ffi.cdef, 'int kill(int pid, int sig); int getpid(void);')
    ffi.C.kill(ffi.C.getpid(), 9)
  end
end },
checkpoint = { every = 2, keep = 3 },]])
      for _, level in ipairs({ 'optimizer', 'parameters' }) do
        local dir, log = root .. '/ck-killed-in-save-' .. level, root .. '/killed-in-save-' .. level .. '.jsonl'
        local args = ('--nproc-per-node 2 %s --parallel.shard=%s'):format(q(path), level)
        local r = helper.sh(('KILL_IN_SAVE=1 %s %s --checkpoint.dir=%s --log=%s'):format(q(helper.RUN), args, q(dir), q(log)))
        assert.are_not.equal(0, r.rc)
        assert.matches('rank 1[^\n]*killed by signal 9', r.err)
        assert.are.equal(2, require('wick.train.checkpoint').latest(dir).step, r.out .. r.err)
        local resumed = helper.run(('%s --checkpoint.dir=%s --log=%s --resume'):format(args, q(dir), q(log)))
        assert.are.equal(0, resumed.rc, resumed.err)
        assert.matches('resume: from ' .. dir .. '/step-00000002 (step 2)', resumed.out, 1, true)
        local straight = root .. '/killed-straight-' .. level .. '.jsonl'
        assert.are.equal(0, helper.run(('%s --checkpoint.dir=%s --log=%s'):format(args, q(root .. '/ck-killed-straight-' ..
          level), q(straight))).rc)
        local want, got = losses(straight), losses(log)
        for step = 1, 8 do assert.are.equal(want[step], got[step], level .. ', step ' .. step) end
      end
    end)

    it('resumes a Llama exactly after kill -9; its checkpoints are Hugging Face directories a fine-tune starts from', function()
      local path = write_recipe(root .. '/llama-killable.lua', dataset, KILLABLE, LLAMA_MODEL)
      local dir = root .. '/ck-llama'
      straight_and_killed(path, dir, 'llama')
      resume_exactly(path, dir, 'llama')
      local last = dir .. '/step-00000008'
      local config = helper.read_file(last .. '/config.json')
      assert.matches('"architectures":["LlamaForCausalLM"]', config, 1, true)
      assert.matches('"num_key_value_heads":2', config, 1, true)
      local loaded = helper.run('-e ' .. q(("local m = require('wick').nn.from_pretrained(%q); print(m.config.ffn_dim, m:parameter_count())")
        :format(last)))
      assert.are.equal(0, loaded.rc, loaded.err)
      assert.matches('24\t10192', loaded.out)
      -- A fine-tune of that directory: its shapes come from config.json, the data is checked against them.
      local tune = helper.write_file(root .. '/tune.lua', ([[
return { model = { from_pretrained = %q }, data = { sources = { %q }, seq_len = 32 }, batch = { global = 8, micro = 2 },
  optim = { lr = 1e-3 }, steps = 2, seed = 3, timeout = 30 }
]]):format(last, dataset))
      local planned = helper.run('--dry-run ' .. q(tune))
      assert.are.equal(0, planned.rc, planned.err)
      assert.matches('model: llama from ' .. last .. ', 1 layers, 4 heads (2 kv), dim 16, ffn_dim 24, vocab 257', planned.out, 1, true)
      local long = helper.run('--dry-run ' .. q(tune) .. ' --data.seq_len=64')
      assert.are.equal(2, long.rc, long.out .. long.err)
      assert.matches('data.seq_len 64 is above the 32 positions of model.from_pretrained ' .. last .. ': lower data.seq_len',
        long.err, 1, true)
      local shaped = helper.run('--dry-run ' .. q(tune) .. ' --model.dim=32')
      assert.are.equal(2, shaped.rc)
      assert.matches("model.dim: model.from_pretrained's config.json gives the model's shape: drop model.dim", shaped.err, 1, true)
      local log = root .. '/tune.jsonl'
      local tuned = helper.run(q(tune) .. ' --log=' .. q(log))
      assert.are.equal(0, tuned.rc, tuned.err)
      local scratch, first = losses(root .. '/llama-straight.jsonl'), losses(log)
      assert.is_true(tonumber(first[1]) < tonumber(scratch[1]), ('fine-tune %s, from scratch %s'):format(first[1], scratch[1]))
    end)

    it('keeps the last K, ignores a checkpoint killed mid-write, and writes provenance', function()
      local path = write_recipe(root .. '/kept.lua', dataset, 'checkpoint = { every = 2, keep = 2 },')
      local dir = root .. '/kept'
      local r = helper.run(('%s --checkpoint.dir=%s --steps=6 --log=%s'):format(q(path), q(dir), q(root .. '/kept.jsonl')))
      assert.are.equal(0, r.rc, r.err)
      local listing = helper.sh('ls -a ' .. q(dir)).out
      assert.are.same({ '.', '..', 'LOCK', 'step-00000004', 'step-00000006' }, helper.lines(listing))
      local provenance = helper.read_file(dir .. '/step-00000006/provenance.json')
      for _, key in ipairs({ '"recipe_hash":', '"overrides":"checkpoint.dir=' .. dir .. '\\nsteps=6"', '"version":', '"cursor":"wick-cursor/', '"data":' }) do
        assert.matches(key, provenance, 1, true)
      end
      assert.are.equal(helper.read_file(path), helper.read_file(dir .. '/step-00000006/recipe.lua'))
      local weights = require('wick.safetensors').load(dir .. '/step-00000006/model.safetensors')
      assert.is_not_nil(weights['transformer.wte.weight'])
      -- What a writer killed mid-write leaves: its temporary directory, a partial file, no DONE;
      -- and a directory that never got its DONE.
      os.execute(('cp -r %s/step-00000006 %s/.step-00000008.tmp-999 && head -c 100 %s/step-00000006/model.safetensors > ' ..
        '%s/.step-00000008.tmp-999/model.safetensors && rm %s/.step-00000008.tmp-999/DONE && cp -r %s/step-00000006 ' ..
        '%s/step-00000010 && rm %s/step-00000010/DONE'):format(dir, dir, dir, dir, dir, dir, dir, dir))
      local resumed = helper.run(('%s --checkpoint.dir=%s --steps=8 --resume --log=%s'):format(q(path), q(dir),
        q(root .. '/kept.jsonl')))
      assert.are.equal(0, resumed.rc, resumed.err)
      assert.matches('resume: from ' .. dir .. '/step-00000006 (step 6)', resumed.out, 1, true)
      assert.is_nil(io.open(dir .. '/.step-00000008.tmp-999/DONE'), 'the stale temporary directory is cleared')
      assert.is_not_nil(io.open(dir .. '/step-00000008/DONE'))
    end)

    -- The first day: a recipe with no checkpoint section leaves its model in checkpoints/<its name>
    -- of the working directory; a second fresh run there is refused (a later --resume would take
    -- the newest step of either run), and so is a --resume with no step left to train.
    it('saves the final model by default under checkpoints/<recipe>, and refuses to mix two runs there', function()
      local path = write_recipe(root .. '/first-day.lua', dataset)
      local work = root .. '/first-day-cwd'
      assert(os.execute('mkdir -p ' .. q(work)) == 0)
      local function run(args) return helper.sh(('cd %s && %s %s %s'):format(q(work), q(helper.RUN), q(path), args)) end
      local dir = work .. '/checkpoints/first-day'
      local r = run('--steps=3')
      assert.are.equal(0, r.rc, r.err)
      assert.are.same({ 'LOCK', 'step-00000003' }, helper.lines(helper.sh('ls ' .. q(dir)).out))
      assert.is_not_nil(io.open(dir .. '/step-00000003/DONE'))
      local again = run('--steps=3')
      assert.are.equal(2, again.rc, again.out .. again.err)
      assert.matches(("checkpoint.dir 'checkpoints/first-day' holds this recipe's checkpoints (newest " ..
        "checkpoints/first-day/step-00000003): pass --resume to continue from them, --checkpoint.overwrite to remove " ..
        'them and start again, or set another checkpoint.dir'), again.err, 1, true)
      assert.is_nil(again.out:find('step 1/', 1, true), again.out)
      local planned = run('--steps=3 --dry-run')
      assert.are.equal(2, planned.rc, planned.out)
      assert.matches("holds this recipe's checkpoints", planned.err, 1, true)
      local done = run('--steps=3 --resume')
      assert.are.equal(2, done.rc, done.out .. done.err)
      assert.matches('--resume: checkpoints/first-day/step-00000003 is step 3 and this run ends at step 3: nothing left ' ..
        'to train', done.err, 1, true)
      assert.matches('nothing left to train', run('--steps=3 --resume --dry-run').err, 1, true)
      local both = run('--steps=3 --resume --checkpoint.overwrite')
      assert.are.equal(2, both.rc, both.out .. both.err)
      assert.matches('checkpoint.overwrite removes them: drop one', both.err, 1, true)
      -- a bare boolean override is true; the old run's steps go before the first step
      local over = run('--steps=2 --checkpoint.overwrite --log.every=1')
      assert.are.equal(0, over.rc, over.err)
      assert.are.same({ 'LOCK', 'step-00000002' }, helper.lines(helper.sh('ls ' .. q(dir)).out))
      local on = run('--steps=4 --resume --checkpoint.every=3')
      assert.are.equal(0, on.rc, on.err)
      assert.matches('resume: from checkpoints/first-day/step-00000002 (step 2)', on.out, 1, true)
      assert.are.same({ 'LOCK', 'step-00000002', 'step-00000003', 'step-00000004' }, helper.lines(helper.sh('ls ' .. q(dir)).out))
      -- every = 0 and final = false: nothing at all, and nothing refused
      local none = run('--steps=1 --checkpoint.final=false --checkpoint.dir=none')
      assert.are.equal(0, none.rc, none.err)
      assert.is_nil(io.open(work .. '/none'))
      assert.matches('checkpoints: at the end into checkpoints/first-day, keeping 3', run('--dry-run --checkpoint.overwrite').out,
        1, true)
    end)

    it('prints what changed since the checkpoint: a mix weight is allowed, batch.global refused', function()
      local two = write_recipe(root .. '/two.lua', dataset, ("data = { sources = { %q, { %q, name = 'held' } }, seq_len = 32 }," ..
        "checkpoint = { every = 2 },"):format(dataset, held_out))
      local dir = root .. '/diff'
      local r = helper.run(('%s --checkpoint.dir=%s --steps=2'):format(q(two), q(dir)))
      assert.are.equal(0, r.rc, r.err)
      local changed = helper.run(('%s --checkpoint.dir=%s --steps=4 --data.mix.held=0.25 --resume'):format(q(two), q(dir)))
      assert.are.equal(0, changed.rc, changed.err)
      assert.matches('changed since the checkpoint: data.mix.held: 1 -> 0.25 (allowed: only future draws change)',
        changed.out, 1, true)
      assert.matches('changed since the checkpoint: steps: 2 -> 4', changed.out, 1, true)
      local refused = helper.run(('%s --checkpoint.dir=%s --steps=6 --batch.global=16 --resume'):format(q(two), q(dir)))
      assert.are.equal(2, refused.rc)
      assert.matches('batch.global: 8 -> 16: refused: the data order and the cursor count steps of this global batch',
        refused.err, 1, true)
    end)
  end)

  describe('checkpoints are input', function()
    local safetensors = require 'wick.safetensors'
    local base, kept -- a run's checkpoints at steps 2 and 4, copied by each case (fp32, and fp16's)
    setup(function()
      kept = write_recipe(root .. '/input.lua', dataset, 'checkpoint = { every = 2, keep = 2 },')
      base = {}
      for _, precision in ipairs({ 'fp32', 'fp16' }) do
        base[precision] = root .. '/input-base-' .. precision
        local r = helper.run(('%s --checkpoint.dir=%s --steps=4 --precision=%s'):format(q(kept), q(base[precision]),
          precision))
        assert(r.rc == 0, r.err)
      end
    end)

    local case = 0
    -- A copy of base whose step-4/`file` went through edit(tensors, metadata); the resumed run.
    local function resume_edited(file, edit, precision)
      precision = precision or 'fp32'
      case = case + 1
      local dir = ('%s/input-%d'):format(root, case)
      assert(os.execute(('cp -r %s %s'):format(q(base[precision]), q(dir))) == 0)
      local path = dir .. '/step-00000004/' .. file
      local tensors, metadata = assert(safetensors.load(path))
      edit(tensors, metadata)
      safetensors.save(path, tensors, metadata)
      for _, t in pairs(tensors) do t:free() end
      return helper.run(('%s --checkpoint.dir=%s --steps=6 --resume --precision=%s'):format(q(kept), q(dir), precision)),
        path
    end

    local function literal(text) return (text:gsub('%p', '%%%0')) end -- a Lua pattern matching text

    -- One line on stderr naming the file, exit 1, no step trained.
    local function assert_refused(r, path, message)
      assert.are.equal(1, r.rc, r.out .. r.err)
      assert.are.equal('checkpoint: ' .. path .. ': ' .. message .. '\n', r.err)
      assert.is_nil(r.out:find('step 5/', 1, true), r.out)
    end

    it('refuses each bad field of state.safetensors in one line naming the file and the field, exit 1', function()
      local cases = {
        { 'step', 'abc', 'step = "abc": must be a number' },
        { 'step', '-3', 'step = -3: must be within [0, ' },
        { 'step', '1e300', 'step = 1e+300: must be within [0, ' },
        { 'step', '2', 'step 2 but its cursor is at step 4 (resuming would skip or repeat data)' },
        { 'step', '4.5', 'step = 4.5: must be a whole number' },
        { 'lr_scale', '-1', 'lr_scale = -1: must be within [0, inf]' },
        { 'lr_scale', 'inf', 'lr_scale = inf: must be finite' },
        { 'seed', '4', 'seed 4 but its recipe.seed is 3' },
        { 'seed', '-1', 'seed = -1: must be within [0, ' },
        { 'world_size', '0', 'world_size = 0: must be within [1, ' },
        { 'cursor', 'somewhere', 'cursor = "somewhere": must be a loader cursor' },
        { 'cursor', false, 'cursor: required' },
        { 'recipe_hash', 'x', 'recipe_hash = "x": must be 16 hex digits' },
        { 'stpe', '4', 'stpe: unknown key (did you mean step?)' },
      }
      for _, c in ipairs(cases) do
        local key, value, message = c[1], c[2], c[3]
        local r, path = resume_edited('state.safetensors', function(_, metadata) metadata[key] = value or nil end)
        assert.are.equal(1, r.rc, key .. '=' .. tostring(value) .. ': ' .. r.out .. r.err)
        assert.matches('^checkpoint: ' .. literal(path .. ': ' .. message) .. '[^\n]*\n$', r.err)
        assert.is_nil(r.out:find('step 5/', 1, true), r.out)
      end
      -- A cursor edited past its checksum: the loader's reason, naming the state's file.
      local r, path = resume_edited('state.safetensors', function(_, metadata)
        metadata.cursor = metadata.cursor:gsub('seq=32', 'seq=33')
      end)
      assert.are.equal(1, r.rc, r.err)
      assert.matches('checkpoint: ' .. path .. ': cursor: cursor checksum does not match', r.err, 1, true)
      -- The dry run of a resume checks the state it would resume from.
      _, path = resume_edited('state.safetensors', function(_, metadata) metadata.lr_scale = '-1' end)
      local planned = helper.run(('--dry-run %s --checkpoint.dir=%s --resume'):format(q(kept),
        q(path:match('^(.*)/step'))))
      assert.are.equal(2, planned.rc, planned.out .. planned.err)
      assert.matches('checkpoint: ' .. path .. ': lr_scale = -1: must be within [0, inf]', planned.err, 1, true)
    end)

    it('refuses an optimizer step count of -1 or above the step, moments of another shape or dtype, and a stray tensor',
      function()
      local r, path = resume_edited('optimizer.safetensors', function(_, metadata) metadata.step_count = '-1' end)
      assert.are.equal(1, r.rc, r.err)
      assert.matches('^checkpoint: ' .. literal(path .. ': step_count = -1: must be within [0, ') .. '[^\n]*\n$', r.err)
      r, path = resume_edited('optimizer.safetensors', function(_, metadata) metadata.step_count = '5' end)
      assert_refused(r, path, "step_count 5 is above the checkpoint's step 4")
      r, path = resume_edited('optimizer.safetensors', function(tensors)
        local m = tensors.m
        tensors.m = m:narrow(1, 1, m:numel() - 1):contiguous()
        m:free()
      end)
      assert.are.equal(1, r.rc, r.err)
      assert.matches('^checkpoint: ' .. literal(path) .. ": m is f32 %[%d+%], the model's is f32 %[%d+%]\n$", r.err)
      r, path = resume_edited('optimizer.safetensors', function(tensors)
        local v = tensors.v
        tensors.v = v:to('f16')
        v:free()
      end)
      assert.are.equal(1, r.rc, r.err)
      assert.matches(": v is f16 %[%d+%], the model's is f32 %[%d+%]\n$", r.err)
      r, path = resume_edited('optimizer.safetensors', function(tensors) tensors.extra = require('wick').tensor.zeros({ 2 }) end)
      assert_refused(r, path, 'has a tensor extra, which is not expected there')
    end)

    -- A rank of a sharded run writes its slice where the store says: only into a directory that
    -- checkpoint.start made for that step in checkpoint.dir.
    it("takes from the store only the save's own temporary directory", function()
      local checkpoint = require 'wick.train.checkpoint'
      local dir = root .. '/temporary'
      local tmp = checkpoint.start(dir, 4)
      assert.is_true(checkpoint.is_temporary(dir, 4, tmp))
      assert.is_false(checkpoint.is_temporary(dir, 5, tmp))               -- another step's name
      assert.is_false(checkpoint.is_temporary(root, 4, tmp))              -- outside checkpoint.dir
      assert.is_false(checkpoint.is_temporary(dir, 4, tmp .. '/../..'))  -- a way out of it
      assert.is_false(checkpoint.is_temporary(dir, 4, dir .. '/.step-00000004.tmp-1')) -- no such directory
      assert.is_false(checkpoint.is_temporary(dir, 4, 42))
      helper.rmtree(dir)
    end)

    it('refuses sharded optimizer files that do not tile the parameters: each one line naming the file', function()
      local sharded = root .. '/input-sharded'
      local r = helper.run(('--nproc-per-node 2 %s --checkpoint.dir=%s --steps=4 --parallel.shard=optimizer'):format(
        q(kept), q(sharded)))
      assert.are.equal(0, r.rc, r.err)
      local function resumed(edit)
        case = case + 1
        local dir = ('%s/input-%d'):format(root, case)
        assert(os.execute(('cp -r %s %s'):format(q(sharded), q(dir))) == 0)
        local step = dir .. '/step-00000004/'
        edit(step)
        return helper.run(('%s --checkpoint.dir=%s --steps=6 --resume'):format(q(kept), q(dir))), step
      end
      local function edited(key, value)
        return function(step)
          local path = step .. 'optimizer-00001-of-00002.safetensors'
          local tensors, metadata = assert(safetensors.load(path))
          metadata[key] = value(metadata[key])
          safetensors.save(path, tensors, metadata)
          for _, t in pairs(tensors) do t:free() end
        end
      end
      local slice = 'optimizer-00001-of-00002.safetensors'
      local got, step = resumed(edited('pieces', function() return 'nope' end))
      assert_refused(got, step .. slice, 'pieces must be a list of [offset, numel] pairs')
      got, step = resumed(edited('numel', function() return '5' end))
      assert.matches(literal(step .. slice .. ": numel 5, the model's flat parameters are ") .. '%d+\n$', got.err)
      got, step = resumed(edited('pieces', function(text) return (text:gsub('^%[%[(%d+)', '[[%1000000')) end))
      assert.matches(literal(step .. slice .. ': pieces[1] must be [offset, numel] within the ') .. '%d+ parameters\n$',
        got.err)
      got, step = resumed(edited('pieces', function(text)
        return (text:gsub('^%[%[(%d+)', function(offset) return '[[' .. (offset - 1) end))
      end))
      assert.matches(literal('checkpoint: ' .. step:sub(1, -2) .. ': the moments of parameter ') .. '%d+' ..
        literal(' are in two files (one is ' .. step .. slice .. ')\n') .. '$', got.err)
      got, step = resumed(function(dir) os.remove(dir .. slice) end)
      assert_refused(got, step:sub(1, -2), 'has no ' .. slice)
      got, step = resumed(function(dir)
        assert(os.execute(('cp %s %s'):format(q(dir .. slice), q(dir .. 'optimizer.safetensors'))) == 0)
      end)
      assert_refused(got, step:sub(1, -2), 'both optimizer.safetensors and optimizer-00000-of-00002.safetensors files')
    end)

    it("refuses a loss scale that is not finite and > 0, and a scaler's counts that do not fit the step", function()
      local cases = {
        { 'scale', '0', 'scale = 0: must be a finite number > 0' },
        { 'scale', '-65536', 'scale = -65536: must be a finite number > 0' },
        { 'scale', 'inf', 'scale = inf: must be a finite number > 0' },
        { 'skipped', '5', "skipped 5 is above the checkpoint's step 4" },
        { 'good_steps', '-1', 'good_steps = -1: must be within [0, ' },
        { 'good_steps', false, 'a loss scale needs good_steps and skipped' },
      }
      for _, c in ipairs(cases) do
        local key, value, message = c[1], c[2], c[3]
        local r, path = resume_edited('optimizer.safetensors', function(_, metadata) metadata[key] = value or nil end,
          'fp16')
        assert.are.equal(1, r.rc, key .. '=' .. tostring(value) .. ': ' .. r.out .. r.err)
        assert.matches('^checkpoint: ' .. literal(path .. ': ' .. message) .. '[^\n]*\n$', r.err)
      end
      local r = resume_edited('optimizer.safetensors', function() end, 'fp16')
      assert.are.equal(0, r.rc, r.err) -- the unedited copy resumes
    end)

    it('refuses a weight file of another dtype or shape, naming the tensor', function()
      local r, path = resume_edited('model.safetensors', function(tensors)
        local wte = tensors['transformer.wte.weight']
        tensors['transformer.wte.weight'] = wte:to('i32')
        wte:free()
      end)
      assert_refused(r, path, "transformer.wte.weight is i32 [257, 16], the model's is f32 [257, 16]")
      r, path = resume_edited('model.safetensors', function(tensors)
        local wpe = tensors['transformer.wpe.weight']
        tensors['transformer.wpe.weight'] = wpe:narrow(1, 1, 16):contiguous()
        wpe:free()
      end)
      assert_refused(r, path, "transformer.wpe.weight is f32 [16, 16], the model's is f32 [32, 16]")
    end)

    it('lets one run at a time write a directory: a second is refused at start naming the pid of the first', function()
      local path = write_recipe(root .. '/held.lua', dataset, [[
callbacks = { on_checkpoint = function(t, info) -- rank 0 (the writer) says its pid, then waits for the test
  if info.step ~= 2 or t.rank ~= 0 then return end
  local ffi = require 'ffi'
  pcall(ffi.cdef, 'int getpid(void); int usleep(unsigned int usec);')
  local f = assert(io.open(os.getenv('HELD_MARK'), 'w')); f:write(ffi.C.getpid()); f:close()
  for _ = 1, 600 do
    if io.open(os.getenv('HELD_RELEASE')) then return end
    ffi.C.usleep(100000)
  end
end },
checkpoint = { every = 2, keep = 2 },]])
      local dir = root .. '/held'
      local mark, release, status = dir .. '.mark', dir .. '.release', dir .. '.rc'
      helper.sh(('(HELD_MARK=%s HELD_RELEASE=%s %s --nproc-per-node 2 %s --checkpoint.dir=%s >/dev/null 2>&1; ' ..
        'echo $? > %s) >/dev/null 2>&1 &'):format(q(mark), q(release), q(helper.RUN), q(path), q(dir), q(status)))
      assert.is_true(wait_for(mark), 'the first run never reached its checkpoint at step 2')
      ffi.C.usleep(POLL_US) -- the mark's write is done when its pid is there
      local pid = helper.read_file(mark)
      local second = helper.run(('--nproc-per-node 2 %s --checkpoint.dir=%s'):format(q(path), q(dir)))
      local planned = helper.run(('--dry-run %s --checkpoint.dir=%s'):format(q(path), q(dir)))
      local inspected = helper.run(('-i %s --checkpoint.dir=%s'):format(q(path), q(dir)),
        { stdin = 'print(trainer.step)\n' })
      helper.write_file(release, '')
      assert.is_true(wait_for(status), 'the first run did not end')
      ffi.C.usleep(POLL_US)
      assert.are.equal(2, second.rc, second.out .. second.err)
      local refusal = ("checkpoint.dir '%s' is in use by another run (pid %s holds %s/LOCK): wait for it to end, " ..
        'or set another checkpoint.dir'):format(dir, pid, dir)
      assert.matches(refusal, second.err, 1, true)
      assert.is_nil(second.out:find('step 1/', 1, true), second.out)
      assert.are.equal(2, planned.rc, planned.out .. planned.err)
      assert.matches(refusal, planned.err, 1, true)
      assert.are.equal(0, inspected.rc, inspected.err) -- run -i builds the recipe without taking the directory
      assert.are.equal('0', inspected.out:match('^(%d+)\n'))
      assert.are.equal('0', helper.read_file(status):match('%d+'), 'the first run finished')
      assert.is_not_nil(io.open(dir .. '/step-00000008/DONE'))
    end)

    it("refuses a fresh run on another recipe's checkpoints, naming the directory and both remedies", function()
      local dir = root .. '/foreign'
      assert.are.equal(0, helper.run(('%s --checkpoint.dir=%s --steps=4'):format(q(kept), q(dir))).rc)
      local other = helper.write_file(root .. '/other-recipe.lua', helper.read_file(kept) .. '-- another recipe\n')
      local r = helper.run(('%s --checkpoint.dir=%s --steps=2'):format(q(other), q(dir)))
      assert.are.equal(2, r.rc, r.out .. r.err)
      assert.matches(("checkpoint.dir '%s' holds another recipe's checkpoints (%s/step-00000004: recipe "):format(dir, dir),
        r.err, 1, true)
      assert.matches('pass --resume to continue from them, --checkpoint.overwrite to remove them and start again, or ' ..
        'set another checkpoint.dir', r.err, 1, true)
      assert.is_nil(r.out:find('step 1/', 1, true), r.out)
      local planned = helper.run(('--dry-run %s --checkpoint.dir=%s'):format(q(other), q(dir)))
      assert.are.equal(2, planned.rc, planned.out)
      assert.matches("holds another recipe's checkpoints", planned.err, 1, true)
      local resumed = helper.run(('%s --checkpoint.dir=%s --steps=6 --resume'):format(q(other), q(dir)))
      assert.are.equal(0, resumed.rc, resumed.err)
      assert.matches('resume: from ' .. dir .. '/step-00000004 (step 4)', resumed.out, 1, true)
    end)

    it('finds a directory that cannot be created or written before the first step, and in the dry run', function()
      local file = helper.write_file(root .. '/not-a-dir', 'x')
      local r = helper.run(('%s --checkpoint.dir=%s/sub'):format(q(kept), q(file)))
      assert.are.equal(2, r.rc, r.out .. r.err)
      assert.matches(("checkpoint.dir: '%s' is not a directory"):format(file), r.err, 1, true)
      assert.is_nil(r.out:find('step 1/', 1, true), r.out)
      local planned = helper.run(('--dry-run %s --checkpoint.dir=%s/sub'):format(q(kept), q(file)))
      assert.are.equal(2, planned.rc, planned.out)
      assert.matches(("checkpoint.dir '%s/sub' cannot be created or written: '%s' is not a directory"):format(file, file),
        planned.err, 1, true)
      -- A read-only file system: a bind mount in a mount namespace of the run's own.
      local ro = root .. '/read-only'
      assert(os.execute('mkdir -p ' .. q(ro)) == 0)
      local function on_read_only(args)
        return helper.sh(('unshare -m sh -c %s'):format(q(('mount --bind -o ro %s %s && %s %s'):format(q(ro), q(ro),
          q(helper.RUN), args))))
      end
      if on_read_only('-e ""').rc ~= 0 then
        pending('no read-only bind mount here (unshare -m and mount need root)')
        return
      end
      r = on_read_only(('%s --checkpoint.dir=%s/ck'):format(q(kept), q(ro)))
      assert.are.equal(2, r.rc, r.out .. r.err)
      assert.matches(("cannot create '%s/ck': Read-only file system"):format(ro), r.err, 1, true)
      assert.is_nil(r.out:find('step 1/', 1, true), r.out)
      planned = on_read_only(('--dry-run %s --checkpoint.dir=%s/ck'):format(q(kept), q(ro)))
      assert.are.equal(2, planned.rc, planned.out)
      assert.matches(("checkpoint.dir '%s/ck' cannot be created or written: '%s': Read-only file system"):format(ro, ro),
        planned.err, 1, true)
    end)

    it('reports a disk that fills during a save in one line naming the file, exit 1', function()
      local full = root .. '/full'
      assert(os.execute('mkdir -p ' .. q(full)) == 0)
      -- 64 KiB of tmpfs in a mount namespace of the run's own: the lock fits, the moments (62 KiB) do not.
      local r = helper.sh(('unshare -m sh -c %s'):format(q(('mount -t tmpfs -o size=64k tmpfs %s && %s %s ' ..
        '--checkpoint.dir=%s/ck --steps=2'):format(q(full), q(helper.RUN), q(kept), q(full)))))
      if r.rc ~= 1 and not r.out:find('step 1/', 1, true) then
        pending('no tmpfs mount here (unshare -m and mount need root): ' .. r.err)
        return
      end
      assert.are.equal(1, r.rc, r.out .. r.err)
      assert.matches("^checkpoint: write '" .. literal(full .. '/ck/.step-00000002.tmp-') ..
        "%d+/[%w.]+': No space left on device\n$", r.err)
    end)

    it('fsyncs every file, then DONE, then the directory, before the rename, and the parent after it', function()
      if os.execute('strace -V >/dev/null 2>&1') ~= 0 then
        pending('strace is not installed')
        return
      end
      local dir, trace = root .. '/synced', root .. '/synced.trace'
      -- LeakSanitizer cannot run under ptrace: a sanitized build's leak check is off for this run
      local r = helper.sh(('ASAN_OPTIONS=detect_leaks=0 strace -f -y -qq -e trace=fsync,rename -o %s %s %s ' ..
        '--checkpoint.dir=%s --steps=2'):format(
        q(trace), q(helper.RUN), q(kept), q(dir)))
      assert.are.equal(0, r.rc, r.err)
      local calls, unfinished = {}, {}
      for line in helper.read_file(trace):gmatch('[^\n]+') do
        -- a call another thread interrupts is traced in two lines ("<unfinished ...>", then
        -- "<... fsync resumed>"): joined back into one, by pid
        local pid, head = line:match('^(%d+) +(.-) <unfinished %.%.%.>$')
        if pid then unfinished[pid] = head end
        local resumed_pid, tail = line:match('^(%d+) +<%.%.%. %w+ resumed>(.*)$')
        if resumed_pid and unfinished[resumed_pid] then
          line, unfinished[resumed_pid] = unfinished[resumed_pid] .. tail, nil
        end
        local path = line:match('fsync%(%d+<([^>]*)>%)%s*= 0') or
          (line:match('rename%("[^"]*", "([^"]*)"%)%s*= 0') == dir .. '/step-00000002' and 'rename')
        if path then calls[#calls + 1] = path end
      end
      local tmp = ('%s/.step-00000002.tmp-'):format(dir)
      local order = {}
      for i, call in ipairs(calls) do
        local name = call == 'rename' and 'rename' or call == dir and 'parent' or
          (call:sub(1, #tmp) == tmp and (call:match('^[^/]*/(.+)$', #tmp) or 'tmp'))
        if name then order[#order + 1] = name end
        assert(i < 100, 'a bounded trace')
      end
      assert.are.same({ 'config.json', 'generation_config.json', 'model.safetensors', 'optimizer.safetensors',
        'provenance.json', 'recipe.lua', 'state.safetensors', 'tokenizer.json', 'tokenizer_config.json', 'DONE', 'tmp',
        'rename', 'parent' }, order)
    end)
  end)

  describe('--dry-run', function()
    -- bytes: the trainer's scalars of one rank (132: 92, and the step's 40-byte status of
    -- wick.nn.data_parallel), and the printed rounding
    local TOLERANCE_SCALARS = 176
    local function timed(args, env)
      local start = core.now()
      local r = helper.sh(helper.in_checkout_copy((env or '') .. ' ' .. q(helper.RUN) .. ' ' .. args))
      r.seconds = core.now() - start
      return r
    end

    it('plans a recipe for another world: divisibility, parameters, memory per rank', function()
      local r = timed('--dry-run --nproc-per-node 4 ' .. q(recipe))
      assert.are.equal(0, r.rc, r.err)
      assert.matches('dry run for 4 ranks', r.out, 1, true)
      assert.matches('batch: 8 samples a step = 4 ranks x 1 micro-steps x 2 rows', r.out, 1, true)
      assert.matches('index read, 13 shards, 0.0535M tokens, tokenizer bytes, vocabulary 257, eos 256', r.out, 1, true)
      assert.matches('parameters', r.out, 1, true)
      assert.matches('memory per rank (fp32, micro batch 2): weights ', r.out, 1, true)
      assert.matches('dry run: ok', r.out, 1, true)
      local env = timed(q(recipe) .. ' --dry-run', 'WORLD_SIZE=2')
      assert.are.equal(0, env.rc, env.err)
      assert.matches('dry run for 2 ranks', env.out, 1, true)
    end)

    it('catches a batch that does not divide and an unreachable source in under 5 s', function()
      local r = timed('--dry-run --nproc-per-node 3 ' .. q(recipe) .. ' --data.sources=' .. q(root .. '/missing'))
      assert.are.equal(2, r.rc, r.out .. r.err)
      assert.matches('batch.global 8 is not divisible by world size 3', r.err, 1, true)
      assert.matches('source ' .. root .. '/missing: ', r.err, 1, true)
      assert.matches('dry run: 2 problems', r.out, 1, true)
      assert.is_true(r.seconds < DRY_RUN_SECONDS, r.seconds .. ' s')
    end)

    it('refuses sources converted with different tokenizers', function()
      local other = root .. '/other-tokenizer'
      os.execute(('cp -r %s %s'):format(q(dataset), q(other)))
      local index = helper.read_file(other .. '/index.json')
      helper.write_file(other .. '/index.json', (index:gsub('"tokenizer": "bytes"', '"tokenizer": "gpt2.tiktoken"')))
      local two = write_recipe(root .. '/two-tokenizers.lua', dataset, ('data = { sources = { %q, %q }, seq_len = 32 },')
        :format(dataset, other))
      local r = timed('--dry-run ' .. q(two))
      assert.are.equal(2, r.rc, r.out .. r.err)
      assert.matches(('sources tokenized differently: %s by bytes, %s by gpt2.tiktoken'):format(dataset, other), r.err, 1, true)
    end)

    -- The estimate is what the tensors of a step hold at the allocator's peak, under each policy: the
    -- weights, gradients, optimizer state, activations and the data ring. It leaves out the trainer's
    -- scalars (132 bytes on one rank: measured so) and is printed to 0.01 KiB (5 bytes either way).
    it('estimates the memory that a real step of the same recipe allocates at its peak, GPT-2 or Llama, under each policy, recomputed or not', function()
      local TOLERANCE = TOLERANCE_SCALARS
      local PEAK = [[
callbacks = { on_step_end = function(t, m)
  if m.step ~= 2 then return end
  local ffi, C = require 'ffi', require('wick.core').C
  local stats = ffi.new('WkAllocatorStats')
  C.wk_allocator_stats(C.WK_DEVICE_CPU, 0, stats)
  print(('peak %d bytes'):format(tonumber(stats.bytes_peak)))
end },]]
      local UNITS = { KiB = 2 ^ 10, MiB = 2 ^ 20, GiB = 2 ^ 30 }
      local function check(name, model)
        local peaked = write_recipe(root .. '/peak-' .. name .. '.lua', dataset, PEAK, model)
        local estimates = {}
        for _, policy in ipairs({ 'fp32', 'bf16', 'fp16' }) do
          local args = q(peaked) .. ' --steps=2 --precision=' .. policy
          local planned, ran = timed('--dry-run ' .. args), timed(args)
          assert.are.equal(0, planned.rc, planned.err)
          assert.are.equal(0, ran.rc, ran.err)
          local value, unit = planned.out:match('memory per rank %(' .. policy .. ', micro batch 2[%a ,]*%):.-: total ([%d.]+) (%a+)')
          local estimate, peak = tonumber(value) * UNITS[unit], tonumber(ran.out:match('peak (%d+) bytes'))
          assert.is_true(peak - estimate > -8 and peak - estimate < TOLERANCE,
            ('%s %s: peak %d, estimate %d'):format(name, policy, peak, estimate))
          estimates[policy] = estimate
        end
        assert.are.equal(estimates.bf16, estimates.fp16)
        -- recomputed, these tiny models' step is mostly weights and moments, which stay f32 under bf16
        local most = name:match('recompute') and 0.85 or 0.8
        assert.is_true(estimates.bf16 < most * estimates.fp32, name .. ': ' .. estimates.bf16 .. ' vs ' .. estimates.fp32)
      end
      check('gpt', GPT_MODEL)
      check('llama', LLAMA_MODEL)
      check('gpt-recompute', "model = { layers = 3, heads = 2, dim = 16, recompute = 'blocks' },")
      check('llama-recompute', "model = { arch = 'llama', layers = 3, heads = 4, kv_heads = 2, dim = 16, ffn_dim = 24, " ..
        "recompute = 'blocks' },")
    end)

    -- Sharded, each rank's estimate holds its slice of AdamW's moments and the slice buffer, and under
    -- 'parameters' its slice of the masters and the gathered root and blocks; the scalars left out
    -- grow with the world: the step's timing gather (48 bytes a rank) and, sharded, the norm's sum
    -- over the ranks (8 bytes a rank, and 8); under 'parameters' the estimate takes the slice of one
    -- run, where each of the model's 3 runs (wick.nn.gathered: embeddings, the block, ln_f) keeps
    -- a head of its own, up to world - 1 elements more of masters, moments, gradients and compute
    -- copy. The log records each rank's peak.
    it('estimates what each rank of a sharded run allocates at its peak, for each level on 2 and 4 ranks, and under bf16', function()
      local peaked = write_recipe(root .. '/peak-ranks.lua', dataset, [[
callbacks = { on_step_end = function(t, m)
  if m.step ~= 2 then return end
  local ffi, C = require 'ffi', require('wick.core').C
  local stats = ffi.new('WkAllocatorStats')
  C.wk_allocator_stats(C.WK_DEVICE_CPU, 0, stats)
  print(('peak %d bytes'):format(tonumber(stats.bytes_peak)))
end },]])
      local UNITS = { B = 1, KiB = 2 ^ 10, MiB = 2 ^ 20, GiB = 2 ^ 30 }
      local function bytes(text, name)
        local value, unit = text:match(name .. ' ([%d.]+) (%a+)')
        return tonumber(value) * UNITS[unit]
      end
      -- under bf16 a sharded rank also keeps only its slice of the f32 masters
      for _, case in ipairs({ { 2, 'fp32' }, { 4, 'fp32' }, { 2, 'bf16' } }) do
        local world, policy = case[1], case[2]
        local optimizer, weights = {}, {}
        for _, level in ipairs({ 'none', 'optimizer', 'gradients', 'parameters' }) do
          local args = ('--nproc-per-node %d %s --steps=2 --parallel.shard=%s --precision=%s'):format(world, q(peaked), level,
            policy)
          local log = ('%s/peak-%d-%s-%s.jsonl'):format(root, world, level, policy)
          os.remove(log)
          local planned, ran = timed('--dry-run ' .. args), timed(args .. ' --log=' .. q(log))
          assert.are.equal(0, planned.rc, planned.err)
          assert.are.equal(0, ran.rc, ran.err)
          local line = planned.out:match('memory per rank %(' .. policy .. ', micro batch 2[^)]*%):[^\n]*')
          local estimate = bytes(line, 'total')
          optimizer[level], weights[level] = bytes(line, 'optimizer'), bytes(line, 'weights')
          local scalars = 48 * world + (level == 'none' and 0 or 8 * world + 8)
          local heads = level == 'parameters' and (3 - 1) * (world - 1) * (4 + 8 + 4 + 2) or 0
          local last = require('wick.json').decode(helper.read_file(log):match('([^\n]+)\n$'))
          local peaks, most = 0, 0
          for rank, peak in ran.out:gmatch('%[rank(%d)%] peak (%d+) bytes') do
            peaks = peaks + 1
            local over = tonumber(peak) - estimate - scalars
            assert.is_true(over > -8 and over < TOLERANCE_SCALARS + heads,
              ('%s on %d ranks, rank %s: peak %d, estimate %d'):format(level, world, rank, peak, estimate))
            assert.are.equal(tonumber(peak), last.ranks[rank + 1].peak_bytes, 'the log: rank ' .. rank)
            most = math.max(most, tonumber(peak))
          end
          assert.are.equal(world, peaks)
          local shown = require('wick.core').format_bytes(most):gsub('%.', '%%.')
          assert.is_truthy(ran.out:match('peak tensor memory per rank: most ' .. shown .. ' %(rank %d%), least ')
            or ran.out:match('peak tensor memory per rank: ' .. shown .. ' on each of ' .. world .. ' ranks\n'), ran.out)
        end
        assert.are.equal(optimizer.optimizer, optimizer.gradients)
        assert.is_true(math.abs(optimizer.optimizer * world - optimizer.none) < 0.01 * optimizer.none)
        -- bf16: 4 bytes of masters and 2 of compute copy a parameter, the masters sliced W ways
        local kept = policy == 'bf16' and (2 + 4 / world) / 6 or 1
        assert.is_true(math.abs(weights.optimizer - kept * weights.none) < 0.01 * weights.none, policy)
        -- 'parameters': the masters' slice (half the moments' bytes), and the gathered compute weights of
        -- the root and the block, which for this one-block model are all of them (make bench shows a deep one)
        local gathered = weights.none * (policy == 'bf16' and 2 / 6 or 1)
        assert.is_true(math.abs(weights.parameters - gathered - optimizer.parameters / 2) < 0.01 * weights.none, policy)
      end
    end)

    it('says the peak tensor memory once when the ranks agree, and which rank holds most when not', function()
      local same = timed('--nproc-per-node 2 ' .. q(recipe) .. ' --steps=2')
      assert.are.equal(0, same.rc, same.err)
      assert.matches('%[rank0%] peak tensor memory per rank: [%d.]+ %a+ on each of 2 ranks\n', same.out)
      assert.is_nil(same.out:find('most', 1, true), same.out)
      local said, print_ = {}, print
      _G.print = function(line) said[#said + 1] = line end
      local progress = require 'wick.train.progress'
      progress.peak_memory({ rank = 0 }, { { peak_bytes = 3e6 }, { peak_bytes = 5e6 }, { peak_bytes = 4e6 } })
      progress.peak_memory({ rank = 0 }, { { peak_bytes = 5e6 }, { peak_bytes = 5e6 + 1 } })
      _G.print = print_
      assert.are.same({ 'peak tensor memory per rank: most 4.77 MiB (rank 1), least 2.86 MiB (rank 0)',
        'peak tensor memory per rank: 4.77 MiB on each of 2 ranks' }, said)
    end)

    -- Its device is model.device's default, 'auto': planned on this machine's GPUs, or its CPU without any.
    it('passes for the shipped GPU recipe, gpt2_124m.lua, planned for 8 ranks on as many GPUs', function()
      local r = timed('--dry-run --nproc-per-node 8 ' .. q(helper.ROOT .. '/recipes/gpt2_124m.lua'),
        'WICK_GPT2_DATA=' .. q(dataset))
      assert.matches('124.%d+M%)', r.out)
      local count = require('wick.device').count()
      if count >= 8 then
        assert.are.equal(0, r.rc, r.out .. r.err)
        assert.matches('\ndevice: cuda:0 to cuda:7, one a rank\n', r.out, 1, true)
        assert.matches('dry run: ok', r.out, 1, true)
      elseif count > 0 then
        assert.are.equal(2, r.rc, r.out .. r.err)
        assert.matches(("model.device 'auto' (the default): 8 ranks on this machine, %d CUDA device"):format(count), r.err,
          1, true)
      else -- the CPU's: its memory judged against this machine's
        assert.matches('\ndevice: cpu (auto: no CUDA device)\n', r.out, 1, true)
        for _, line in ipairs(helper.lines(r.err)) do
          assert.matches('the memory estimate, 13.49 GiB per rank x 8 ranks on this machine, is above its ', line, 1, true)
        end
        assert.are.equal(r.err == '' and 0 or 2, r.rc, r.out .. r.err)
      end
    end)
  end)

  describe('pausing at a step boundary', function()
    it('--repl-at pauses both ranks after the step; the REPL on rank 0 changes the lr for every rank', function()
      local log = root .. '/paused.jsonl'
      local r = helper.run(('--nproc-per-node 2 %s --steps=6 --repl-at=3 --log=%s'):format(q(recipe), q(log)), { stdin =
        'print("at", trainer.step, metrics.step, metrics.loss > 0)\nset_lr(0.5)\ncontinue()\nprint("not read")\n' })
      assert.are.equal(0, r.rc, r.err)
      assert.matches('[rank0] paused after step 3 on 2 ranks', r.out, 1, true)
      assert.matches('[rank1] paused after step 3: rank 0 has the REPL', r.out, 1, true)
      assert.matches('[rank0] at\t3\t3\ttrue', r.out, 1, true)
      assert.is_nil(r.out:find('not read', 1, true))
      local straight = root .. '/unpaused.jsonl'
      assert.are.equal(0, helper.run(('%s --steps=6 --log=%s'):format(q(recipe), q(straight))).rc)
      local lr, want = field(log, 'lr'), field(straight, 'lr')
      for step = 1, 6 do
        local expected = tonumber(want[step]) * (step > 3 and 0.5 or 1)
        assert.is_true(math.abs(tonumber(lr[step]) - expected) <= 1e-12 * expected, step .. ': ' .. lr[step])
      end
      -- sharded weights need every rank: the REPL's forward is refused, naming why, and the run goes on
      local sharded = helper.run(('--nproc-per-node 2 %s --steps=4 --repl-at=2 --parallel.shard=parameters'):format(q(recipe)),
        { stdin = "print(pcall(model.forward, model, require('wick.tensor').new({ { 1, 2 } }, 'i32')))\ncontinue()\n" })
      assert.are.equal(0, sharded.rc, sharded.err)
      assert.matches("[rank0] false\tmodel: its weights are gathered from every rank (parallel.shard = 'parameters')",
        sharded.out, 1, true)
      assert.matches('step 4/4', sharded.out, 1, true)
    end)

    it('a rank refuses, in one line, changes it cannot apply that it reads from the store', function()
      for _, bad in ipairs { 'lr_scale=nan', 'lr_scale=-1', 'mix.nowhere=1', 'speed=9' } do
        -- rank 0 sets the pause's key itself before the pause (its REPL then sleeps): rank 1 reads that
        local path = write_recipe(root .. '/bad-pause.lua', dataset, ([[
callbacks = { on_step_end = function(t, m)
  if t.rank == 0 and m.step == 2 then t.dist.store:set('wick/pause/3', %q) end
end },]]):format(bad))
        local r = helper.run(('--nproc-per-node 2 %s --repl-at=3'):format(q(path)),
          { stdin = 'os.execute("sleep 3")\ncontinue()\n' })
        assert.are.equal(1, r.rc, r.out .. r.err)
        local line = r.err:match('%[rank1%] ([^\n]*pause after step 3[^\n]*)')
        assert.is_not_nil(line, bad .. ':\n' .. r.err)
        assert.matches('rank 0 sent "' .. bad:gsub('%p', '%%%0') .. '"', line)
        assert.is_nil(r.err:find('[rank1] stack traceback', 1, true), r.err)
        assert.is_nil(r.out:find('[rank1] step 4', 1, true), r.out)
      end
    end)

    it('opens the REPL on the terminal of rank 0 of 2 launched ranks (tmux)', function()
      local session = 'wick_pause_' .. root:match('[^/]+$'):gsub('[^%w]', '_')
      local function tmux(args) return helper.sh('tmux ' .. args) end
      local function wait_screen(text)
        for _ = 1, WAIT_POLLS do
          local screen = tmux('capture-pane -p -t ' .. session).out
          if screen:find(text, 1, true) then return true end
          ffi.C.usleep(POLL_US)
        end
        error('not on screen: ' .. text .. '\n' .. tmux('capture-pane -p -t ' .. session).out)
      end
      local cmd = ('cd %s && env HOME=%s %s --nproc-per-node 2 %s --steps=5 --repl-at=3 --checkpoint.dir=%s; ' ..
        'echo "exit status $?"; sleep 30'):format(q(root), q(root), q(helper.RUN), q(recipe), q(root .. '/ck-tmux'))
      assert.are.equal(0, tmux('new-session -d -x 150 -y 30 -s ' .. session .. ' ' .. q(cmd)).rc)
      local ok, err = pcall(function()
        wait_screen('[rank1] paused after step 3: rank 0 has the REPL')
        tmux('send-keys -t ' .. session .. ' ' .. q('print(trainer.step * 10 .. "/" .. trainer.world_size)') .. ' Enter')
        wait_screen('[rank0] 30/2')
        tmux('send-keys -t ' .. session .. ' ' .. q('continue()') .. ' Enter')
        wait_screen('step 5/5')
        wait_screen('exit status 0')
      end)
      tmux('kill-session -t ' .. session)
      assert(ok, err)
    end)

    it('kill -USR1 of one rank pauses every rank after the same step; stop() there ends the run', function()
      local path = write_recipe(root .. '/usr1.lua', dataset, [[
callbacks = { on_step_end = function(t, m)
  if t.rank == 1 and m.step == 2 then
    local ffi = require 'ffi'
    pcall(ffi.cdef, 'int getpid(void);')
    os.execute('kill -USR1 ' .. ffi.C.getpid())
  end
end },]])
      local r = helper.run('--nproc-per-node 2 ' .. q(path) .. ' --log=' .. q(root .. '/usr1.jsonl'),
        { stdin = 'stop("enough")\ncontinue()\n' })
      assert.are.equal(0, r.rc, r.err)
      assert.matches('[rank0] paused after step 2 on 2 ranks', r.out, 1, true)
      assert.matches('[rank1] paused after step 2: rank 0 has the REPL', r.out, 1, true)
      assert.matches('stopped after step 2: enough', r.out, 1, true)
      assert.are.equal(2, #helper.lines(helper.read_file(root .. '/usr1.jsonl')))
    end)
  end)

  it('run -i builds a recipe without training and its helpers work on piped input', function()
    local r = helper.run('-i ' .. q(recipe) .. ' --steps=3', { stdin = table.concat({
      'print(recipe.steps, trainer.step, model:parameter_count() > 0)',
      'peek(1)',
      'print(decode({104, 105}))',
      'm = step()',
      'print(m.step, trainer.step)',
      's = stats(model:named_parameters()["transformer.wte.weight"])',
      'print(s.numel, s.nonfinite, s.std > 0)',
      'print(cursor():match("step=(%d+)"))',
    }, '\n') .. '\n' })
    assert.are.equal(0, r.rc, r.err)
    local lines = helper.lines(r.out)
    assert.are.equal('3\t0\ttrue', lines[1])
    assert.matches('^step 1 row 0: ".+"$', lines[2])
    assert.are.equal('hi', lines[3])
    assert.matches('^step 1 loss %d', lines[4])
    assert.are.equal('1\t1', lines[5])
    assert.are.equal(257 * 16 .. '\t0\ttrue', lines[6])
    assert.are.equal('1', lines[7])
  end)
end)
