-- wick.nn: the GPT-2 model end to end on the CPU: gradients against finite differences, overfitting
-- a fixed batch, loss normalisation and accumulation, checkpoints by HF names, precision policies.
local helper = require 'helper'
local gradcheck = require 'helpers.gradcheck'
local wick = require 'wick'
local T = wick.tensor

local CONFIG = { vocab = 17, seq_len = 6, layers = 2, heads = 2, dim = 8, seed = 3 }

local function config(extra)
  local out = {}
  for k, v in pairs(CONFIG) do out[k] = v end
  for k, v in pairs(extra or {}) do out[k] = v end
  return out
end

local function batch()
  local idx = T.new({ { 1, 5, 9, 2, 0, 16 }, { 3, 3, 8, 11, 4, 7 } }, 'i32')
  local targets = T.new({ { 5, 9, 2, 0, 16, 1 }, { 3, 8, 11, 4, 7, 12 } }, 'i32')
  local mask = T.new({ { 1, 1, 0, 1, 1, 1 }, { 0, 1, 1, 1, 1, 1 } }, 'u8')
  return idx, targets, mask
end

local function max_abs_diff(a, b)
  local pa, pb, worst = gradcheck.floats(a), gradcheck.floats(b), 0
  for i = 0, a:numel() - 1 do worst = math.max(worst, math.abs(pa[i] - pb[i])) end
  return worst
end

describe('nn.gpt', function()
  it('names parameters like Hugging Face GPT-2, with Conv1D [in, out] layouts', function()
    local model = wick.nn.gpt(config())
    local named = model:named_parameters()
    assert.are.same({ 8, 24 }, named['transformer.h.0.attn.c_attn.weight'].shape)
    assert.are.same({ 32, 8 }, named['transformer.h.1.mlp.c_proj.weight'].shape)
    assert.are.same({ 17, 8 }, named['transformer.wte.weight'].shape)
    assert.are.same({ 6, 8 }, named['transformer.wpe.weight'].shape)
    assert.are.same({ 8 }, named['transformer.ln_f.bias'].shape)
    local count = 0
    for name in pairs(named) do count = count + 1 end
    assert.are.equal(2 + 2 + 12 * 2, count)
    assert.are.equal(17 * 8 + 6 * 8 + 2 * (12 * 8 * 8 + 13 * 8) + 2 * 8, model:parameter_count())
    assert.has_error(function() wick.nn.gpt(config({ heads = 3 })) end, 'nn.gpt: dim 8 is not divisible by heads 3')
  end)

  it('keeps parameters and gradients as views of two flat buffers, decayed tensors first', function()
    local model = wick.nn.gpt(config())
    local flat = model:flat_parameters()
    local core = require 'wick.core'
    for name, p in pairs(model:named_parameters()) do
      assert.are.equal(1, core.C.wk_tensor_same_storage(p, flat.params), name)
      assert.are.equal(1, core.C.wk_tensor_same_storage(model:grads()[name], flat.grads), name)
    end
    local wte = model:named_parameters()['transformer.wte.weight']
    assert.is_true(tonumber(core.C.wk_tensor_offset(wte)) < flat.decay_numel)
    local bias = model:named_parameters()['transformer.ln_f.bias']
    assert.is_true(tonumber(core.C.wk_tensor_offset(bias)) >= flat.decay_numel)
  end)

  it('has gradients that match finite differences for every parameter tensor', function()
    local model = wick.nn.gpt(config({ seed = 5 }))
    local idx, targets, mask = batch()
    local inputs = {}
    for _, name in ipairs(model.order) do
      local p = model:named_parameters()[name]
      -- larger weights than the 0.02 init, so every path carries a measurable gradient
      T.randn(p.shape, { seed = #inputs + 1, std = 0.3 }):copy(p)
      inputs[#inputs + 1] = { p, model:grads()[name] }
    end
    local failure = gradcheck.check {
      inputs = inputs,
      samples = 4,
      step = 1e-3,  -- the loss curves sharply at these weights; f32 noise stays far below tolerance
      loss = function() return model:forward(idx, targets, mask) end,
      backward = function() model:backward() end,
    }
    assert(failure == nil, failure)
  end)

  it('overfits a fixed batch to a loss near zero', function()
    local model = wick.nn.gpt(config())
    local idx, targets = batch()
    local opt = wick.optim.adamw { lr = 1e-2, weight_decay = 0 }
    local first, loss
    for step = 1, 250 do
      model:zero_grad()
      loss = model:forward(idx, targets)
      first = first or loss
      model:backward()
      opt:step(model)
    end
    assert.is_true(first > 2.5, 'starts near log(vocab): ' .. first)
    assert.is_true(loss < 0.02, 'final loss ' .. loss)
  end)

  it('averages over masked-in targets, or over a given global count', function()
    local model = wick.nn.gpt(config())
    local idx, targets, mask = batch()
    local masked = model:forward(idx, targets, mask)
    local per_token = model.losses:totable()
    local sum = 0
    for b = 1, 2 do for t = 1, 6 do sum = sum + per_token[b][t] end end
    assert.is_true(math.abs(sum - masked) < 1e-6)
    assert.are.equal(0, per_token[1][3])
    local global = model:forward(idx, targets, mask, 20)
    assert.is_true(math.abs(global - masked * 10 / 20) < 1e-6)
    local none = T.zeros({ 2, 6 }, 'u8')
    assert.has_error(function() model:forward(idx, targets, none) end)
  end)

  it('accumulates micro-batch gradients into exactly the full-batch gradient', function()
    local model = wick.nn.gpt(config())
    local idx, targets, mask = batch()
    model:zero_grad()
    model:forward(idx, targets, mask)
    model:backward()
    local full = model:flat_parameters().grads:clone()
    model:zero_grad()
    for row = 1, 2 do
      local i, t, m = idx:narrow(1, row, 1), targets:narrow(1, row, 1), mask:narrow(1, row, 1)
      model:forward(i, t, m, 10)  -- 10 targets are selected in the whole batch
      model:backward()
    end
    assert.is_true(max_abs_diff(full, model:flat_parameters().grads) < 1e-6)
  end)

  it("writes the classifier's gradient over the logits, and refuses a second backward of one forward", function()
    local model = wick.nn.gpt(config())
    local idx, targets, mask = batch()
    model:forward(idx, targets, mask)
    local logits = model.logits
    local expected, core = T.zeros(logits.shape), require 'wick.core'
    core.check(core.C.wk_op_cross_entropy_backward(expected, logits, model.given.targets, model.given.mask, model.count, 1))
    model:backward()
    assert.are.equal(logits, model.logits)
    assert.are.same(expected:totable(), model.logits:totable())
    assert.is_nil(model.grad_logits)
    assert.has_error(function() model:backward() end,
      "gpt:backward: the last backward already used this forward's logits: run forward again first")
    model:forward(idx, targets, mask)
    model:backward()
  end)

  it('takes a loader batch of tokens [B, T+1] like idx and targets', function()
    local model = wick.nn.gpt(config())
    local tokens = T.new({ { 1, 5, 9, 2, 0, 16, 1 }, { 3, 3, 8, 11, 4, 7, 12 } }, 'i32')
    local idx, targets = batch()
    assert.are.equal(model:forward(idx, targets), model:forward_tokens(tokens))
  end)

  it('saves and loads checkpoints by HF names; refuses ones that do not fit', function()
    local dir = helper.tmpdir()
    local model = wick.nn.gpt(config({ seed = 7 }))
    local idx, targets = batch()
    local loss = model:forward(idx, targets)
    model:save(dir .. '/m.safetensors')
    local other = wick.nn.gpt(config({ seed = 8 }))
    assert.are_not.equal(loss, other:forward(idx, targets))
    other:load(dir .. '/m.safetensors')
    assert.are.equal(loss, other:forward(idx, targets))
    -- HF's own files omit the "transformer." prefix and carry attention-mask buffers
    local stripped = {}
    for name, p in pairs(model:named_parameters()) do stripped[name:sub(13)] = p end
    stripped['h.0.attn.bias'] = T.zeros({ 1, 1, 6, 6 })
    wick.safetensors.save(dir .. '/hf.safetensors', stripped)
    assert.are.equal(loss, wick.nn.gpt(config()):load(dir .. '/hf.safetensors'):forward(idx, targets))
    local small = wick.nn.gpt(config({ dim = 4 }))
    assert.has_error(function() small:load(dir .. '/m.safetensors') end)
    helper.rmtree(dir)
  end)

  it('stores activations, their gradients and the compute weights in bf16, keeping f32 masters and gradients', function()
    local idx, targets = batch()
    local fp32 = wick.nn.gpt(config())
    local bf16 = wick.nn.gpt(config({ precision = 'bf16' }))
    local l32, l16 = fp32:forward(idx, targets), bf16:forward(idx, targets)
    assert.are_not.equal(l32, l16)
    assert.is_true(math.abs(l32 - l16) / l32 < 2e-2)
    bf16:backward()
    local block = bf16.blocks[1]
    for _, t in ipairs({ bf16.logits, block.attn.att, block.attn.grad_qkv, block.mlp.hidden, block.mlp.grad_fc,
      block.x1, bf16.transformer.wte.weight }) do
      assert.are.equal('bf16', t.dtype)
    end
    for _, t in ipairs({ block.ln_1.mean, bf16.losses, bf16:flat_parameters().params, bf16:flat_parameters().grads }) do
      assert.are.equal('f32', t.dtype)
    end
    local w = bf16.transformer.wte.weight:get(3, 4)
    local master = bf16:named_parameters()['transformer.wte.weight']:get(3, 4)
    assert.are.equal(T.new({ master }):to('bf16'):float():get(1), w)
    assert.are.equal(fp32:named_parameters()['transformer.wte.weight']:get(3, 4), master)
  end)

  -- Bytes the CPU allocator holds at its peak over a model's construction and one training step.
  local function step_peak(cfg, B, TT, build)
    local ffi = require 'ffi'
    local C = require('wick.core').C
    local stats = ffi.new('WkAllocatorStats')
    local idx, targets = T.zeros({ B, TT }, 'i32'), T.zeros({ B, TT }, 'i32')
    for i = 0, B * TT - 1 do
      C.wk_tensor_set(idx, i, i * 7 % cfg.vocab)
      C.wk_tensor_set(targets, i, (i * 7 + 3) % cfg.vocab)
    end
    C.wk_allocator_stats(C.WK_DEVICE_CPU, 0, stats)
    local before = stats.bytes_in_use
    C.wk_allocator_reset_peak(C.WK_DEVICE_CPU, 0)
    local model, opt = (build or wick.nn.gpt)(cfg), wick.optim.adamw {}
    model:forward(idx, targets)
    model:backward()
    opt:step(model)
    C.wk_allocator_stats(C.WK_DEVICE_CPU, 0, stats)
    local peak = tonumber(stats.bytes_peak - before)
    opt:free()
    model:free()
    idx:free()
    targets:free()
    return peak
  end

  it('takes at most 65% of fp32\'s memory under bf16 when activations dominate, as plan.memory says', function()
    collectgarbage()
    collectgarbage('stop')  -- no finaliser may free an earlier test's tensors in the middle of a count
    finally(function() collectgarbage('restart') end)
    local plan = require 'wick.train.plan'
    local shape = { vocab = 64, seq_len = 32, layers = 2, heads = 4, dim = 32, seed = 1 }
    local B, peaks = 10, {}  -- activations over twice the rest under bf16 (the premise checked below)
    for _, policy in ipairs({ 'fp32', 'bf16', 'fp16' }) do
      local cfg = { precision = policy }
      for k, v in pairs(shape) do cfg[k] = v end
      peaks[policy] = step_peak(cfg, B, shape.seq_len)
      local estimate = plan.memory(shape, B, policy)
      -- the estimate counts the f32 loss mask that data parallelism keeps: 4 bytes a token
      assert.are.equal(estimate.total - 4 * B * shape.seq_len, peaks[policy], policy)
      assert.is_true(estimate.activations > 2 * (estimate.total - estimate.activations), policy)
    end
    assert.is_true(peaks.bf16 <= 0.65 * peaks.fp32, ('bf16 %d bytes, fp32 %d'):format(peaks.bf16, peaks.fp32))
    assert.are.equal(peaks.bf16, peaks.fp16)
  end)

  -- recompute = 'blocks': the blocks share their activations and backward recomputes each block's
  -- from its input. The same ops on the same inputs give the same gradients, to the bit; a step holds
  -- one block's activations and every block's output, as plan.memory counts. And the residual adds
  -- fused into the norms give what separate ops gave.
  describe('blocks of a GPT-2 and a Llama', function()
    local ffi = require 'ffi'
    local core = require 'wick.core'
    local C, check = core.C, core.check
    local function bytes(t) return ffi.string(t:data(), t:nbytes()) end
    local GPT = { vocab = 64, seq_len = 32, layers = 4, heads = 4, dim = 32, seed = 1 }
    local LLAMA = { vocab = 64, max_positions = 32, layers = 4, heads = 4, kv_heads = 2, dim = 32, ffn_dim = 48, seed = 1 }
    local function with(cfg, extra)
      local out = {}
      for k, v in pairs(cfg) do out[k] = v end
      for k, v in pairs(extra) do out[k] = v end
      return out
    end
    local ARCHS = {
      { name = 'gpt2', build = wick.nn.gpt, cfg = GPT, shape = GPT },
      { name = 'llama', build = wick.nn.llama, cfg = LLAMA,
        shape = with(LLAMA, { arch = 'llama', seq_len = 32 }) },
    }

    -- Loss and gradients of two steps on batches of two shapes (the shared buffers are reallocated
    -- between them); the gradients accumulate over both. A fifth of the targets is masked out, so
    -- rows of the activation gradients are zeros.
    local function two_steps(arch, extra)
      local model = arch.build(with(arch.cfg, extra))
      local losses = {}
      for step, shape in ipairs({ { 4, 32 }, { 3, 17 } }) do
        local idx, targets, mask = T.zeros(shape, 'i32'), T.zeros(shape, 'i32'), T.zeros(shape, 'u8')
        for i = 0, idx:numel() - 1 do
          C.wk_tensor_set(idx, i, (i * 7 + step) % 64)
          C.wk_tensor_set(targets, i, (i * 13 + 5) % 64)
          C.wk_tensor_set(mask, i, i % 5 == 2 and 0 or 1)
        end
        losses[step] = model:forward(idx, targets, mask)
        model:backward()
        idx:free()
        targets:free()
        mask:free()
      end
      local grads = model:flat_parameters().grads:clone()
      model:free()
      return losses, grads
    end

    -- Runs run() with nn.Block's forward and backward and the models' backward_blocks as they were
    -- before the fusion, and returns what it returns.
    local function with_separate_residual_ops(run)
      local Block, Model = require('wick.nn.modules').Block, require('wick.nn.gpt').GPT
      local saved = { forward = Block.forward, backward = Block.backward, backward_blocks = Model.backward_blocks }
      function Block:forward(input)
        local x1 = self:activation('x1', input.shape)
        check(C.wk_op_add(x1, input, self.attn:forward(self.ln_1:forward(input))))
        local out = self:kept('output', input.shape)
        check(C.wk_op_add(out, x1, self.mlp:forward(self.ln_2:forward(x1))))
        return out
      end
      function Block:backward(input, grad_output, grad_input)
        local dx1 = self:gradient('grad_x1', input.shape):copy(grad_output)
        local dln = self:zeroed('grad_ln', input.shape)
        self.mlp:backward(self.ln_2.output, grad_output, dln)
        self.ln_2:backward(self.x1, dln, dx1)
        check(C.wk_op_axpy(grad_input, 1, dx1))
        check(C.wk_op_fill(dln, 0))
        self.attn:backward(self.ln_1.output, dx1, dln)
        self.ln_1:backward(input, dln, grad_input)
      end
      function Model:backward_blocks(dx)
        local given, dprev = dx, self:gradient('grad_b', dx.shape)
        for l = #self.blocks, 1, -1 do
          if self.config.recompute == 'blocks' and l < #self.blocks then self.blocks[l]:forward(self.block_inputs[l]) end
          check(C.wk_op_fill(dprev, 0))
          self.blocks[l]:backward(self.block_inputs[l], dx, dprev)
          dx, dprev = dprev, dx
        end
        if dx ~= given then given:copy(dx) end  -- the caller reads the result where it passed dx
      end
      local ok, losses, grads = pcall(run)
      Block.forward, Block.backward, Model.backward_blocks = saved.forward, saved.backward, saved.backward_blocks
      if not ok then error(losses, 0) end
      return losses, grads
    end

    for _, arch in ipairs(ARCHS) do
      for _, policy in ipairs({ 'fp32', 'bf16' }) do
        it(("with recompute = 'blocks' give the gradients of a %s without it, under %s"):format(arch.name, policy), function()
          local kept_losses, kept = two_steps(arch, { precision = policy, recompute = 'none' })
          local losses, recomputed = two_steps(arch, { precision = policy, recompute = 'blocks' })
          assert.are.same(kept_losses, losses)
          local largest, pk = 0, gradcheck.floats(kept)
          for i = 0, kept:numel() - 1 do largest = math.max(largest, math.abs(pk[i])) end
          assert.is_true(largest > 0)
          assert.are.equal(bytes(kept), bytes(recomputed))
          kept:free()
          recomputed:free()
        end)
      end

      -- A block once ran its first residual add and the norm after it as two ops, and its backward
      -- copied the output's gradient, added it into the input's with an axpy and passed gradients
      -- between two buffers; that composition, restored here for one run, gives the same bits as
      -- the fused residual norms (wk_op_add_layernorm, wk_op_add_rmsnorm) and the residual stream's
      -- gradient updated in place.
      for _, policy in ipairs({ 'fp32', 'bf16', 'fp16' }) do
        it(('with fused residual norms give a %s the losses and gradients of separate ops, bit for bit, under %s'):format(
          arch.name, policy), function()
          local fused_losses, fused = two_steps(arch, { precision = policy })
          local losses, unfused = with_separate_residual_ops(function() return two_steps(arch, { precision = policy }) end)
          assert.are.same(losses, fused_losses)
          assert.are.equal(bytes(unfused), bytes(fused))
          fused:free()
          unfused:free()
        end)
      end

      it(("with recompute = 'blocks' hold less memory at the peak of a %s step, what plan.memory estimates"):format(arch.name), function()
        collectgarbage()
        collectgarbage('stop')
        finally(function() collectgarbage('restart') end)
        local plan = require 'wick.train.plan'
        local B, peaks = 4, {}
        for _, recompute in ipairs({ 'none', 'blocks' }) do
          peaks[recompute] = step_peak(with(arch.cfg, { recompute = recompute }), B, 32, arch.build)
          local estimate = plan.memory(with(arch.shape, { recompute = recompute }), B, 'fp32')
          assert.are.equal(estimate.total - 4 * B * 32, peaks[recompute], recompute)  -- less the loss mask, as above
        end
        assert.is_true(peaks.blocks < 0.75 * peaks.none, ('%d bytes, without %d'):format(peaks.blocks, peaks.none))
      end)
    end
  end)

  -- forward reads idx and targets of the right dtype in place; they stay the caller's to free.
  it("leaves the caller's idx and targets alive when the model is freed", function()
    local cfg = { vocab = 64, seq_len = 8, layers = 1, heads = 2, dim = 16, seed = 1 }
    for _, build in ipairs({ wick.nn.gpt, function(c)
      return wick.nn.llama { vocab = c.vocab, max_positions = c.seq_len, layers = 1, heads = 2, kv_heads = 1, dim = 16,
        ffn_dim = 24 }
    end }) do
      local model = build(cfg)
      local idx, targets = T.full({ 2, 8 }, 3, 'i32'), T.full({ 2, 8 }, 5, 'i32')
      model:forward(idx, targets)
      model:backward()
      model:free()
      assert.are.equal(3, idx:get(2, 8))
      assert.are.equal(5, targets:get(1, 1))
      idx:free()
      targets:free()
    end
  end)

  -- A model's modules declare their parameters without memory, and flatten() gives each its view of
  -- the flat storage: building a model allocates its weights once, nothing more; the gradients come
  -- with the first backward (a model that only generates never holds them).
  it('builds a model holding its weights once, and its gradients from the first backward on', function()
    collectgarbage()
    collectgarbage('stop')
    finally(function() collectgarbage('restart') end)
    local before = T.memory('cpu').in_use
    T.reset_peak('cpu')
    local model = wick.nn.gpt({ vocab = 64, seq_len = 32, layers = 2, heads = 4, dim = 32, seed = 1 })
    local weights = model:parameter_count() * 4
    local built = T.memory('cpu')
    assert.are.equal(weights, built.in_use - before)
    assert.are.equal(weights, built.peak - before)
    local idx = T.full({ 1, 4 }, 3, 'i32')
    model:forward(idx)  -- the logits: no gradients yet
    assert.is_nil(model.flat.grads)
    model:forward(idx, idx)
    model:backward()
    assert.are.equal(model:parameter_count(), model.flat.grads:numel())
    assert.is_true(max_abs_diff(model:grads()['transformer.wte.weight'], T.zeros({ 64, 32 })) > 0)
    model:free()
    idx:free()
  end)

  it('fp16 loss scaling skips an overflowing step, lowers the scale, and raises it after good steps', function()
    local model = wick.nn.gpt(config({ precision = { 'fp16', scale = 2 ^ 40, growth_interval = 2 } }))
    local idx, targets = batch()
    local opt = wick.optim.adamw { lr = 1e-2 }
    local before = model:flat_parameters().params:clone()
    model:zero_grad()
    model:forward(idx, targets)
    model:backward()
    local applied = opt:step(model)
    assert.is_false(applied)
    assert.are.equal(2 ^ 39, model.policy.scaler.scale)
    assert.are.equal(0, max_abs_diff(before, model:flat_parameters().params))
    model.policy.scaler.scale = 1024
    for _ = 1, 2 do
      model:zero_grad()
      model:forward(idx, targets)
      model:backward()
      assert.is_true(opt:step(model))
    end
    assert.are.equal(2048, model.policy.scaler.scale)
    assert.is_true(max_abs_diff(before, model:flat_parameters().params) > 0)
  end)

  it('runs its training step in compiled traces, with no NYI aborts once warm', function()
    local model = wick.nn.gpt(config())
    local idx, targets = batch()
    local opt = wick.optim.adamw {}
    local function step()
      model:zero_grad()
      model:forward(idx, targets)
      model:backward()
      opt:step(model)
    end
    for _ = 1, 50 do step() end  -- buffers allocated, traces recorded
    local log = os.tmpname()
    local jit_v = require 'jit.v'
    jit_v.on(log)
    for _ = 1, 200 do step() end
    jit_v.off()
    local text = helper.read_file(log)
    os.remove(log)
    assert.is_nil(text:match('[^\n]*NYI[^\n]*'))
  end)

  it('frees all of its memory at once with free()', function()
    local ffi = require 'ffi'
    local C = require('wick.core').C
    collectgarbage()  -- earlier tests' garbage must not be finalised in the middle of the count
    collectgarbage('stop')
    finally(function() collectgarbage('restart') end)
    local stats = ffi.new('WkAllocatorStats')
    C.wk_allocator_stats(C.WK_DEVICE_CPU, 0, stats)
    local before = stats.bytes_in_use
    local model = wick.nn.gpt(config({ precision = 'bf16' }))
    local opt = wick.optim.adamw {}
    local idx, targets, mask = batch()
    model:forward(idx, targets, mask)
    model:backward()
    opt:step(model)
    idx:free(); targets:free(); mask:free()
    C.wk_allocator_stats(C.WK_DEVICE_CPU, 0, stats)
    assert.is_true(stats.bytes_in_use > before)
    opt:free()
    model:free()
    model:free()
    C.wk_allocator_stats(C.WK_DEVICE_CPU, 0, stats)
    assert.are.equal(before, stats.bytes_in_use)
  end)

  it('clips the global gradient norm and decays only matrices and embeddings', function()
    local model = wick.nn.gpt(config())
    local idx, targets = batch()
    local opt = wick.optim.adamw { lr = 0.1, weight_decay = 0.5, clip = 1e-3 }
    model:zero_grad()
    model:forward(idx, targets)
    model:backward()
    local flat = model:flat_parameters()
    local bias_before = model:named_parameters()['transformer.ln_f.bias']:get(1)
    local check_grads = flat.grads:clone()
    local applied, norm = opt:step(model)
    assert.is_true(applied and norm > 1e-3)
    -- the clipped gradient is what Adam saw: m = (1 - beta1) * g * clip / norm
    local m1, g1 = opt.m:get(1), check_grads:get(1)
    assert.is_true(math.abs(m1 - 0.1 * g1 * 1e-3 / norm) < 1e-9 + 1e-4 * math.abs(m1))
    model:zero_grad()
    opt:step(model)  -- zero gradients: only weight decay and momentum move parameters
    assert.are_not.equal(bias_before, model:named_parameters()['transformer.ln_f.bias']:get(1))
  end)
end)
