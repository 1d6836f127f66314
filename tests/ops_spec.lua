-- CPU ops: forward values against direct definitions, backward against finite differences.
local ffi = require 'ffi'
local wick = require 'wick'
local core = require 'wick.core'
local gradcheck = require 'gradcheck'
local T = wick.tensor
local C = core.C
local check = core.check
local weighted_sum = gradcheck.weighted_sum

local seed = 0
local function randn(shape, std)
  seed = seed + 1
  return T.randn(shape, { seed = seed, std = std or 1 })
end

local function assert_gradients(spec)
  local failure = gradcheck.check(spec)
  assert(failure == nil, failure)
end

describe('ops', function()
  it('fill, scale, add, axpy and sumsq', function()
    local a, b, out = T.new({ 1, 2, 3 }), T.new({ 10, 20, 30 }), T.empty({ 3 })
    check(C.wk_op_add(out, a, b))
    assert.are.same({ 11, 22, 33 }, out:totable())
    check(C.wk_op_axpy(out, -2, a))
    check(C.wk_op_scale(out, 0.5))
    assert.are.same({ 4.5, 9, 13.5 }, out:totable())
    local sum = ffi.new('double[1]')
    check(C.wk_op_sumsq(a, sum))
    assert.are.equal(14, sum[0])
    a:set(2, math.huge)
    check(C.wk_op_sumsq(a, sum))
    assert.are.equal(math.huge, sum[0])
    assert.has_error(function() check(C.wk_op_add(out, a, T.empty({ 4 }))) end,
      'add: b is [4] f32 cpu, expected [3 elements of any shape] f32, contiguous')
  end)

  it('normal init is deterministic per seed with the requested moments', function()
    local a, b = T.randn({ 4096 }, { seed = 7, std = 2 }), T.randn({ 4096 }, { seed = 7, std = 2 })
    local pa, pb, sum, sumsq, same = gradcheck.floats(a), gradcheck.floats(b), 0, 0, true
    for i = 0, 4095 do
      sum, sumsq, same = sum + pa[i], sumsq + pa[i] ^ 2, same and pa[i] == pb[i]
    end
    assert.is_true(same)
    assert.is_true(math.abs(sum / 4096) < 0.1)
    assert.is_true(math.abs(math.sqrt(sumsq / 4096) - 2) < 0.1)
  end)

  it('embedding adds token and position rows, and checks indices', function()
    local B, TT, C_, V = 2, 3, 4, 5
    local idx = T.new({ { 0, 4, 2 }, { 1, 1, 3 } }, 'i32')
    local wte, wpe, out = randn({ V, C_ }), randn({ TT + 1, C_ }), T.empty({ B, TT, C_ })
    check(C.wk_op_embedding(out, idx, wte, wpe))
    assert.is_true(math.abs(wte:get(5, 2) + wpe:get(2, 2) - out:get(1, 2, 2)) < 1e-6)
    local dwte, dwpe, weights = T.empty({ V, C_ }), T.empty({ TT + 1, C_ }), randn({ B, TT, C_ })
    assert_gradients {
      inputs = { { wte, dwte }, { wpe, dwpe } },
      loss = function()
        check(C.wk_op_embedding(out, idx, wte, wpe))
        return weighted_sum(out, weights)
      end,
      backward = function() check(C.wk_op_embedding_backward(dwte, dwpe, weights, idx)) end,
    }
    idx:set(2, 1, V)
    assert.has_error(function() check(C.wk_op_embedding(out, idx, wte, wpe)) end,
      'embedding: idx[3] = 5 is outside [0, 5) (tokenizer and model vocab disagree?)')
  end)

  it('layernorm normalises rows and has matching gradients', function()
    local N, C_ = 6, 8
    local inp, w, b = randn({ N, C_ }), randn({ C_ }), randn({ C_ })
    local out, mean, rstd = T.empty({ N, C_ }), T.empty({ N }), T.empty({ N })
    local ones, zeros = T.full({ C_ }, 1), T.zeros({ C_ })
    check(C.wk_op_layernorm(out, mean, rstd, inp, ones, zeros, 1e-5))
    local row_sum, row_sq = 0, 0
    for c = 1, C_ do row_sum, row_sq = row_sum + out:get(1, c), row_sq + out:get(1, c) ^ 2 end
    assert.is_true(math.abs(row_sum) < 1e-5 and math.abs(row_sq / C_ - 1) < 1e-3)
    local dinp, dw, db, weights = T.empty({ N, C_ }), T.empty({ C_ }), T.empty({ C_ }), randn({ N, C_ })
    assert_gradients {
      inputs = { { inp, dinp }, { w, dw }, { b, db } },
      loss = function()
        check(C.wk_op_layernorm(out, mean, rstd, inp, w, b, 1e-5))
        return weighted_sum(out, weights)
      end,
      backward = function() check(C.wk_op_layernorm_backward(dinp, dw, db, weights, inp, w, mean, rstd)) end,
    }
  end)

  for _, transpose in ipairs({ 0, 1 }) do
    it('matmul with bias (transpose_w = ' .. transpose .. ') matches a direct product and its gradients', function()
      local N, C_, OC = 5, 4, 3
      local inp, bias = randn({ N, C_ }), randn({ OC })
      local w = transpose == 1 and randn({ OC, C_ }) or randn({ C_, OC })
      local out = T.empty({ N, OC })
      check(C.wk_op_matmul(out, inp, w, bias, transpose))
      local expected = bias:get(2)
      for c = 1, C_ do expected = expected + inp:get(3, c) * (transpose == 1 and w:get(2, c) or w:get(c, 2)) end
      assert.is_true(math.abs(out:get(3, 2) - expected) < 1e-5)
      local dinp, dw, dbias, weights = T.empty(inp.shape), T.empty(w.shape), T.empty({ OC }), randn({ N, OC })
      assert_gradients {
        inputs = { { inp, dinp }, { w, dw }, { bias, dbias } },
        loss = function()
          check(C.wk_op_matmul(out, inp, w, bias, transpose))
          return weighted_sum(out, weights)
        end,
        backward = function() check(C.wk_op_matmul_backward(dinp, dw, dbias, weights, inp, w, transpose)) end,
      }
    end)
  end

  it('gelu is the tanh approximation with matching gradients', function()
    local inp, out = randn({ 40 }, 2), T.empty({ 40 })
    check(C.wk_op_gelu(out, inp))
    local x = inp:get(3)
    local expected = 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ^ 3)))
    assert.is_true(math.abs(out:get(3) - expected) < 1e-6)
    local dinp, weights = T.empty({ 40 }), randn({ 40 })
    assert_gradients {
      inputs = { { inp, dinp } },
      samples = 40,
      loss = function()
        check(C.wk_op_gelu(out, inp))
        return weighted_sum(out, weights)
      end,
      backward = function() check(C.wk_op_gelu_backward(dinp, weights, inp)) end,
    }
  end)

  it('causal attention: rows of probabilities sum to one, the future is masked, gradients match', function()
    local B, TT, C_, NH = 2, 4, 6, 2
    local qkv, out, att = randn({ B, TT, 3 * C_ }), T.empty({ B, TT, C_ }), T.empty({ B, NH, TT, TT })
    check(C.wk_op_attention(out, att, qkv, NH))
    local row = 0
    for t2 = 1, TT do row = row + att:get(2, 2, 3, t2) end
    assert.is_true(math.abs(row - 1) < 1e-6)
    assert.are.equal(0, att:get(1, 1, 2, 3))
    assert.are.equal(1, att:get(1, 2, 1, 1))
    local dqkv, weights = T.empty(qkv.shape), randn({ B, TT, C_ })
    assert_gradients {
      inputs = { { qkv, dqkv } },
      samples = 40,
      loss = function()
        check(C.wk_op_attention(out, att, qkv, NH))
        return weighted_sum(out, weights)
      end,
      backward = function() check(C.wk_op_attention_backward(dqkv, weights, qkv, att, NH)) end,
    }
    assert.has_error(function() check(C.wk_op_attention(out, att, qkv, 4)) end)
  end)

  it('cross-entropy over a mask, normalised by a given count, with matching gradients', function()
    local N, V = 6, 5
    local logits, targets = randn({ N, V }), T.new({ 0, 4, 2, 1, 3, 3 }, 'i32')
    local mask, losses, sum = T.new({ 1, 1, 0, 1, 0, 1 }, 'u8'), T.empty({ N }), ffi.new('double[1]')
    local count = 8  -- e.g. the global number of targets across ranks
    check(C.wk_op_cross_entropy(losses, logits, targets, mask, count, sum))
    local lse = 0
    for v = 1, V do lse = lse + math.exp(logits:get(2, v)) end
    assert.is_true(math.abs(losses:get(2) - (math.log(lse) - logits:get(2, 5)) / count) < 1e-6)
    assert.are.equal(0, losses:get(3))
    local dlogits = T.empty({ N, V })
    assert_gradients {
      inputs = { { logits, dlogits } },
      samples = 30,
      loss = function()
        check(C.wk_op_cross_entropy(losses, logits, targets, mask, count, sum))
        return sum[0]
      end,
      backward = function() check(C.wk_op_cross_entropy_backward(dlogits, logits, targets, mask, count, 1)) end,
    }
    assert.are.equal(0, dlogits:get(3, 1))
    targets:set(3, -1)  -- masked out: ignored
    check(C.wk_op_cross_entropy(losses, logits, targets, mask, count, sum))
    targets:set(2, -1)
    assert.has_error(function() check(C.wk_op_cross_entropy(losses, logits, targets, mask, count, sum)) end,
      'cross_entropy: targets[1] = -1 is outside [0, 5) (tokenizer and model vocab disagree?)')
    assert.has_error(function() check(C.wk_op_cross_entropy(losses, logits, targets, nil, 0, sum)) end)
  end)

  -- A loader batch's tokens [B, T + 1] give inputs tokens[:, :-1] and targets tokens[:, 1:]: strided views
  -- that the embedding and the loss read where they are.
  it('embedding and cross-entropy read strided index views in place, as their contiguous copies', function()
    local B, TT, C_, V = 3, 4, 5, 7
    local rows = {}
    for b = 1, B do
      rows[b] = {}
      for t = 1, TT + 1 do rows[b][t] = (b * 5 + t * 3) % V end
    end
    local tokens = T.new(rows, 'i32')
    local inputs, targets = tokens:narrow(2, 1, TT), tokens:narrow(2, 2, TT)
    assert.is_false(inputs:is_contiguous())
    local wte, wpe, weights = randn({ V, C_ }), randn({ TT, C_ }), randn({ B, TT, C_ })
    local logits, mask = randn({ B, TT, V }), T.new({ { 1, 0, 1, 1 }, { 1, 1, 1, 0 }, { 0, 1, 1, 1 } }, 'u8')
    local sum = ffi.new('double[1]')
    local function run(idx, tgt)
      local out, dwte, dwpe = T.empty({ B, TT, C_ }), T.zeros({ V, C_ }), T.zeros({ TT, C_ })
      local losses, dlogits = T.empty({ B, TT }), T.zeros({ B, TT, V })
      check(C.wk_op_embedding(out, idx, wte, wpe))
      check(C.wk_op_embedding_backward(dwte, dwpe, weights, idx))
      check(C.wk_op_cross_entropy(losses, logits, tgt, mask, 9, sum))
      check(C.wk_op_cross_entropy_backward(dlogits, logits, tgt, mask, 9, 1))
      local result = { out:totable(), dwte:totable(), dwpe:totable(), losses:totable(), sum[0], dlogits:totable() }
      for _, t in ipairs({ out, dwte, dwpe, losses, dlogits }) do t:free() end
      return result
    end
    local idx, tgt = inputs:contiguous(), targets:contiguous()
    assert.are.same(run(idx, tgt), run(inputs, targets))
    -- A transposed view (column-major) is walked as well.
    local by_column = T.empty({ TT, B }, 'i32')
    for b = 1, B do for t = 1, TT do by_column:set(t, b, idx:get(b, t)) end end
    local rows_of_columns = C.wk_tensor_view(by_column, 0, 2, ffi.new('int64_t[2]', B, TT), ffi.new('int64_t[2]', 1, B))
    assert.are.same(run(idx, tgt), run(ffi.gc(rows_of_columns, C.wk_tensor_free), tgt))
    -- A bad token is named by its place in the view and its value.
    tokens:set(2, 3, V)
    local out = T.empty({ B, TT, C_ })
    assert.has_error(function() check(C.wk_op_embedding(out, inputs, wte, wpe)) end,
      'embedding: idx[6] = 7 is outside [0, 7) (tokenizer and model vocab disagree?)')
    assert.has_error(function() check(C.wk_op_cross_entropy(T.empty({ B, TT }), logits, targets, mask, 9, sum)) end,
      'cross_entropy: targets[5] = 7 is outside [0, 7) (tokenizer and model vocab disagree?)')
    -- Three strided dims cannot be walked as rows.
    local cube = T.zeros({ 2, 3, 4 }, 'i32')
    local sliced = cube:narrow(3, 1, 2)
    local ok, err = pcall(check, C.wk_op_cross_entropy(T.empty({ 12 }), randn({ 12, V }), sliced, nil, 1, sum))
    assert.is_false(ok)
    assert.matches('cross_entropy: targets: [2, 3, 2] i32 cpu (strided) cannot be read in place as rows', err, 1, true)
    for _, t in ipairs({ tokens, inputs, targets, idx, tgt, by_column, out, cube, sliced, wte, wpe, weights, logits, mask }) do
      t:free()
    end
  end)

  it('adamw follows the decoupled-weight-decay update', function()
    local p, g = T.new({ 1, -2 }), T.new({ 0.5, 4 })
    local m, v = T.zeros({ 2 }), T.zeros({ 2 })
    local lr, b1, b2, eps, wd = 0.1, 0.9, 0.99, 1e-8, 0.01
    for step = 1, 2 do check(C.wk_op_adamw(p, g, m, v, lr, b1, b2, eps, wd, step, 0.5)) end
    -- reference in double: the gradient is scaled by 0.5 first
    local x, mm, vv = 1, 0, 0
    for step = 1, 2 do
      local gg = 0.25
      mm, vv = b1 * mm + (1 - b1) * gg, b2 * vv + (1 - b2) * gg * gg
      local update = (mm / (1 - b1 ^ step)) / (math.sqrt(vv / (1 - b2 ^ step)) + eps)
      x = x - lr * (update + wd * x)
    end
    assert.is_true(math.abs(p:get(1) - x) < 1e-6)
    assert.has_error(function() check(C.wk_op_adamw(p, g, m, v, lr, b1, b2, eps, wd, 0, 1)) end)
  end)
end)

-- Under a bf16/fp16 policy the ops take 2-byte activations: each must compute what the f32 op does
-- on the same (rounded) values, its 2-byte results rounded once. Ops that are a few loads, f32
-- arithmetic and a store are bit for bit the same; the products (matmul, attention) go through
-- tiles of 256 (runtime/ops/cpu/gemm.c), whose f32 sums may be ordered differently than one sgemm,
-- so their results may sit one rounding step away.
describe('ops on 2-byte activations', function()
  local HALF_ULP = { bf16 = 2 ^ -8, f16 = 2 ^ -11 }

  -- case.inputs: f32 tensors by argument name (also the outputs' first values: backward accumulates);
  -- case.f32: the arguments that stay f32 under any policy; case.outputs: what to compare.
  local function compare(case, dtype)
    local low, ref = {}, {}
    for name, x in pairs(case.inputs) do
      if case.f32[name] or x.dtype ~= 'f32' then
        low[name], ref[name] = x:clone(), x:clone()
      else
        low[name] = x:to(dtype)
        ref[name] = low[name]:float()
      end
    end
    case.run(low)
    case.run(ref)
    for _, name in ipairs(case.outputs) do
      local got = low[name]:float()
      local want = case.f32[name] and ref[name]:clone() or ref[name]:to(dtype):float()
      local g, w = gradcheck.floats(got), gradcheck.floats(want)
      for i = 0, got:numel() - 1 do
        local tolerance = case.exact and 0 or 2 * HALF_ULP[dtype] * math.abs(w[i]) + 1e-5
        if not (math.abs(g[i] - w[i]) <= tolerance) then
          error(('%s on %s: %s[%d] is %.9g, the f32 op gives %.9g'):format(case.name, dtype, name, i, g[i], w[i]))
        end
      end
      got:free()
      want:free()
    end
  end

  local function cases()
    local N, C_, V, B, TT, NH = 6, 8, 5, 2, 3, 2
    local idx = T.new({ { 0, 4, 2 }, { 1, 1, 3 } }, 'i32')
    local targets = T.new({ 0, 4, 2, 1, 3, 3 }, 'i32')
    local Nm, Cm, OCm = 300, 260, 270  -- more than one tile of 256 in every dim
    local list = {
      { name = 'add', inputs = { out = T.empty({ N }), a = randn({ N }), b = randn({ N }) }, outputs = { 'out' },
        run = function(t) check(C.wk_op_add(t.out, t.a, t.b)) end },
      { name = 'axpy', inputs = { y = randn({ N }), x = randn({ N }) }, outputs = { 'y' },
        run = function(t) check(C.wk_op_axpy(t.y, 0.5, t.x)) end },
      { name = 'gelu', inputs = { out = T.empty({ 40 }), inp = randn({ 40 }, 2) }, outputs = { 'out' },
        run = function(t) check(C.wk_op_gelu(t.out, t.inp)) end },
      { name = 'gelu_backward', inputs = { dinp = randn({ 40 }), dout = randn({ 40 }), inp = randn({ 40 }, 2) },
        outputs = { 'dinp' }, run = function(t) check(C.wk_op_gelu_backward(t.dinp, t.dout, t.inp)) end },
      { name = 'embedding', inputs = { out = T.empty({ B, TT, C_ }), idx = idx, wte = randn({ V, C_ }), wpe = randn({ TT, C_ }) },
        outputs = { 'out' }, run = function(t) check(C.wk_op_embedding(t.out, t.idx, t.wte, t.wpe)) end },
      { name = 'embedding_backward', f32 = { dwte = true, dwpe = true },
        inputs = { dwte = randn({ V, C_ }), dwpe = randn({ TT, C_ }), dout = randn({ B, TT, C_ }), idx = idx },
        outputs = { 'dwte', 'dwpe' }, run = function(t) check(C.wk_op_embedding_backward(t.dwte, t.dwpe, t.dout, t.idx)) end },
      { name = 'layernorm', f32 = { mean = true, rstd = true },
        inputs = { out = T.empty({ N, C_ }), mean = T.empty({ N }), rstd = T.empty({ N }), inp = randn({ N, C_ }),
          w = randn({ C_ }), b = randn({ C_ }) },
        outputs = { 'out', 'mean', 'rstd' }, run = function(t) check(C.wk_op_layernorm(t.out, t.mean, t.rstd, t.inp, t.w, t.b, 1e-5)) end },
      { name = 'layernorm_backward', f32 = { dw = true, db = true, mean = true, rstd = true },
        inputs = { dinp = randn({ N, C_ }), dw = randn({ C_ }), db = randn({ C_ }), dout = randn({ N, C_ }), inp = randn({ N, C_ }),
          w = randn({ C_ }), mean = randn({ N }, 0.1), rstd = T.full({ N }, 0.9) },
        outputs = { 'dinp', 'dw', 'db' },
        run = function(t) check(C.wk_op_layernorm_backward(t.dinp, t.dw, t.db, t.dout, t.inp, t.w, t.mean, t.rstd)) end },
      { name = 'cross_entropy', f32 = { losses = true },
        inputs = { losses = T.empty({ N }), logits = randn({ N, V }), targets = targets }, outputs = { 'losses' },
        run = function(t) check(C.wk_op_cross_entropy(t.losses, t.logits, t.targets, nil, 8, ffi.new('double[1]'))) end },
      { name = 'cross_entropy_backward', inputs = { dlogits = randn({ N, V }), logits = randn({ N, V }), targets = targets },
        outputs = { 'dlogits' }, run = function(t) check(C.wk_op_cross_entropy_backward(t.dlogits, t.logits, t.targets, nil, 8, 1)) end },
      { name = 'attention', product = true, inputs = { out = T.empty({ B, TT, C_ }), att = T.empty({ B, NH, TT, TT }), qkv = randn({ B, TT, 3 * C_ }) },
        outputs = { 'out', 'att' }, run = function(t) check(C.wk_op_attention(t.out, t.att, t.qkv, NH)) end },
    }
    local probabilities = T.empty({ B, NH, TT, TT })
    check(C.wk_op_attention(T.empty({ B, TT, C_ }), probabilities, randn({ B, TT, 3 * C_ }), NH))
    list[#list + 1] = { name = 'attention_backward', product = true,
      inputs = { dqkv = randn({ B, TT, 3 * C_ }), dout = randn({ B, TT, C_ }), qkv = randn({ B, TT, 3 * C_ }), att = probabilities },
      outputs = { 'dqkv' }, run = function(t) check(C.wk_op_attention_backward(t.dqkv, t.dout, t.qkv, t.att, NH)) end }
    for _, transpose in ipairs({ 0, 1 }) do
      local w_shape = transpose == 1 and { OCm, Cm } or { Cm, OCm }
      list[#list + 1] = { name = 'matmul ' .. transpose, product = true,
        inputs = { out = T.empty({ Nm, OCm }), inp = randn({ Nm, Cm }), w = randn(w_shape, 0.1), bias = randn({ OCm }) },
        outputs = { 'out' }, run = function(t) check(C.wk_op_matmul(t.out, t.inp, t.w, t.bias, transpose)) end }
      list[#list + 1] = { name = 'matmul_backward ' .. transpose, product = true, f32 = { dw = true, dbias = true },
        inputs = { dinp = randn({ Nm, Cm }), dw = randn(w_shape), dbias = randn({ OCm }), dout = randn({ Nm, OCm }, 0.1),
          inp = randn({ Nm, Cm }, 0.1), w = randn(w_shape, 0.1) },
        outputs = { 'dinp', 'dw', 'dbias' },
        run = function(t) check(C.wk_op_matmul_backward(t.dinp, t.dw, t.dbias, t.dout, t.inp, t.w, transpose)) end }
    end
    for _, case in ipairs(list) do
      case.f32, case.exact = case.f32 or {}, not case.product
    end
    return list
  end

  for _, dtype in ipairs({ 'bf16', 'f16' }) do
    it('compute in ' .. dtype .. ' what the f32 ops compute on the same values, rounded once', function()
      for _, case in ipairs(cases()) do compare(case, dtype) end
    end)
  end

  it('refuse a dtype that does not match the activations, naming the op, the argument and both dtypes', function()
    local inp, w, b = randn({ 4, 8 }):to('bf16'), randn({ 8 }), randn({ 8 }):to('bf16')
    local out, mean, rstd = T.empty({ 4, 8 }, 'bf16'), T.empty({ 4 }), T.empty({ 4 })
    assert.has_error(function() check(C.wk_op_layernorm(out, mean, rstd, inp, w, b, 1e-5)) end,
      'layernorm: weight is [8] f32 cpu, expected [8] bf16, contiguous')
    assert.has_error(function() check(C.wk_op_layernorm(out, T.empty({ 4 }, 'bf16'), rstd, inp, w:to('bf16'), b, 1e-5)) end,
      'layernorm: mean is [4] bf16 cpu, expected [4] f32, contiguous')
    local x = randn({ 3, 8 }):to('f16')
    assert.has_error(function() check(C.wk_op_matmul_backward(T.empty({ 3, 8 }, 'f16'), T.empty({ 8, 8 }, 'f16'), nil,
      T.empty({ 3, 8 }, 'f16'), x, randn({ 8, 8 }):to('f16'), 0)) end, 'matmul_backward: dw is [8, 8] f16 cpu, expected [8, 8] f32, contiguous')
    assert.has_error(function() check(C.wk_op_add(T.empty({ 3 }, 'i32'), T.empty({ 3 }, 'i32'), T.empty({ 3 }, 'i32'))) end,
      'add: out is [3] i32 cpu, expected f32, bf16 or f16')
    assert.has_error(function() check(C.wk_op_add(T.empty({ 3 }, 'bf16'), T.empty({ 3 }, 'f16'), T.empty({ 3 }, 'bf16'))) end,
      'add: a is [3] f16 cpu, expected [3 elements of any shape] bf16, contiguous')
    local p = T.zeros({ 2 }, 'bf16')
    assert.has_error(function() check(C.wk_op_adamw(p, T.zeros({ 2 }), T.zeros({ 2 }), T.zeros({ 2 }), 0.1, 0.9, 0.99, 1e-8, 0, 1, 1)) end,
      'adamw: param is [2] bf16 cpu, expected [2 elements of any shape] f32, contiguous')
  end)

  it('store an f16 overflow as inf, which the loss scaler sees in the gradients', function()
    local out = T.empty({ 2 }, 'f16')
    check(C.wk_op_add(out, T.new({ 60000, 1 }):to('f16'), T.new({ 60000, 1 }):to('f16')))
    assert.are.same({ math.huge, 2 }, out:float():totable())
  end)
end)
