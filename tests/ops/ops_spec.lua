-- CPU ops: forward values against direct definitions, backward against finite differences.
local ffi = require 'ffi'
local wick = require 'wick'
local core = require 'wick.core'
local gradcheck = require 'helpers.gradcheck'
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
    check(C.wk_op_embedding(out, idx, wte, wpe, nil))
    assert.is_true(math.abs(wte:get(5, 2) + wpe:get(2, 2) - out:get(1, 2, 2)) < 1e-6)
    local dwte, dwpe, weights = T.empty({ V, C_ }), T.empty({ TT + 1, C_ }), randn({ B, TT, C_ })
    assert_gradients {
      inputs = { { wte, dwte }, { wpe, dwpe } },
      loss = function()
        check(C.wk_op_embedding(out, idx, wte, wpe, nil))
        return weighted_sum(out, weights)
      end,
      backward = function() check(C.wk_op_embedding_backward(dwte, dwpe, weights, idx)) end,
    }
    idx:set(2, 1, V)
    assert.has_error(function() check(C.wk_op_embedding(out, idx, wte, wpe, nil)) end,
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

  -- The MLP's products with GELU in their epilogue against the matmul and GELU ops apart, on each
  -- storage dtype, over more than one 256-tile in every dim (2-byte products run in tiles): pre is
  -- the matmul's very bits and the parameter gradients matmul_backward's. f32: out and dpre are the
  -- separate ops' values too. 2-byte: the separate ops round the product before the GELU, the fused ones
  -- do not, so they may differ by a rounding step of each of the two values (pre, or the matmul's
  -- gradient, and the result). dpre is written: the NaNs it held must not reach it.
  describe('matmul with GELU in its epilogue', function()
    local HALF_ULP = { bf16 = 2 ^ -8, f16 = 2 ^ -11 }
    local N, K, OC = 300, 260, 270

    local function bytes(t) return ffi.string(t:data(), t:nbytes()) end

    -- got against want, elementwise: equal on f32 (up to the sign of a zero: 0 + -0 is +0 in the
    -- separate gelu_backward), else within 2 half-ulps of |want| + |rounded| (the value the separate
    -- ops round first).
    local function agree(what, dtype, got, want, rounded)
      local widened = { got:float(), want:float(), rounded:float() }  -- alive while read through g, w, r
      local g, w, r = gradcheck.floats(widened[1]), gradcheck.floats(widened[2]), gradcheck.floats(widened[3])
      for i = 0, got:numel() - 1 do
        local tolerance = dtype == 'f32' and 0 or 2 * HALF_ULP[dtype] * (math.abs(w[i]) + math.abs(r[i])) + 1e-6
        assert(math.abs(g[i] - w[i]) <= tolerance, ('%s on %s: [%d] is %.9g, the separate ops give %.9g'):format(what, dtype, i, g[i], w[i]))
      end
    end

    for _, dtype in ipairs({ 'f32', 'bf16', 'f16' }) do
      for _, transpose in ipairs({ 0, 1 }) do
        local function act(shape, std) return randn(shape, std):to(dtype) end
        local function weight(rows, cols) return act(transpose == 1 and { cols, rows } or { rows, cols }, 0.1) end

        it(('forward on %s (transpose_w = %d): pre = matmul, out = gelu of it'):format(dtype, transpose), function()
          local inp, w, bias = act({ N, K }), weight(K, OC), act({ OC })
          for _, b in ipairs({ bias, false }) do
            local out, pre = T.empty({ N, OC }, dtype), T.empty({ N, OC }, dtype)
            check(C.wk_op_matmul_gelu(out, pre, inp, w, b or nil, transpose))
            local want_pre, want_out = T.empty({ N, OC }, dtype), T.empty({ N, OC }, dtype)
            check(C.wk_op_matmul(want_pre, inp, w, b or nil, transpose))
            check(C.wk_op_gelu(want_out, want_pre))
            assert(bytes(want_pre) == bytes(pre), 'pre on ' .. dtype .. ': not the matmul\'s bits')
            agree('out', dtype, out, want_out, want_pre)
          end
        end)

        it(('backward on %s (transpose_w = %d): dpre written, = gelu_backward of matmul_backward'):format(dtype, transpose), function()
          local pre, w, dout = act({ N, K }, 2), weight(K, OC), act({ N, OC })
          local inp = T.empty({ N, K }, dtype)
          check(C.wk_op_gelu(inp, pre))
          local dw, dbias = randn(w.shape), randn({ OC })
          local want_dw, want_dbias = dw:clone(), dbias:clone()
          local dpre = T.full({ N, K }, 0 / 0, dtype)
          check(C.wk_op_matmul_backward_gelu(dpre, dw, dbias, dout, inp, w, pre, transpose))
          local dhidden, want = T.zeros({ N, K }, dtype), T.zeros({ N, K }, dtype)
          check(C.wk_op_matmul_backward(dhidden, want_dw, want_dbias, dout, inp, w, transpose))
          check(C.wk_op_gelu_backward(want, dhidden, pre))
          assert(bytes(want_dw) == bytes(dw) and bytes(want_dbias) == bytes(dbias), 'dw or dbias: not matmul_backward\'s bits')
          agree('dpre', dtype, dpre, want, dhidden)
        end)
      end
    end

    it('refuses a pre or dpre of the wrong dtype or shape, or sharing memory, naming it', function()
      local inp, w, bias = randn({ 3, 4 }):to('bf16'), randn({ 4, 8 }):to('bf16'), randn({ 8 }):to('bf16')
      local out = T.empty({ 3, 8 }, 'bf16')
      assert.has_error(function() check(C.wk_op_matmul_gelu(out, T.empty({ 3, 8 }, 'f16'), inp, w, bias, 0)) end,
        'matmul_gelu: pre is [3, 8] f16 cpu, expected [24 elements of any shape] bf16, contiguous')
      assert.has_error(function() check(C.wk_op_matmul_gelu(out, T.empty({ 3, 7 }, 'bf16'), inp, w, bias, 0)) end,
        'matmul_gelu: pre is [3, 7] bf16 cpu, expected [24 elements of any shape] bf16, contiguous')
      assert.has_error(function() check(C.wk_op_matmul_gelu(out, T.empty({ 8, 3 }, 'bf16'), inp, w, bias, 0)) end,
        "matmul_gelu: pre's last dim must be 8")
      assert.has_error(function() check(C.wk_op_matmul_gelu(T.empty({ 3, 8 }), T.empty({ 3, 8 }, 'bf16'), inp, w, bias, 0)) end,
        'matmul_gelu: out is [3, 8] f32 cpu, expected [24 elements of any shape] bf16, contiguous')
      assert.has_error(function() check(C.wk_op_matmul_gelu(out, out, inp, w, bias, 0)) end,
        'matmul_gelu: out and pre share memory')
      local x, pre, dout = randn({ 3, 8 }):to('bf16'), randn({ 3, 8 }):to('bf16'), randn({ 3, 4 }):to('bf16')
      local w2, dw = randn({ 8, 4 }):to('bf16'), T.zeros({ 8, 4 })
      assert.has_error(function() check(C.wk_op_matmul_backward_gelu(T.empty({ 3, 8 }, 'bf16'), dw, nil, dout, x, w2, T.empty({ 3, 8 }), 0)) end,
        'matmul_backward_gelu: pre is [3, 8] f32 cpu, expected [24 elements of any shape] bf16, contiguous')
      assert.has_error(function() check(C.wk_op_matmul_backward_gelu(T.empty({ 2, 8 }, 'bf16'), dw, nil, dout, x, w2, pre, 0)) end,
        'matmul_backward_gelu: dpre is [2, 8] bf16 cpu, expected [24 elements of any shape] bf16, contiguous')
      assert.has_error(function() check(C.wk_op_matmul_backward_gelu(pre, dw, nil, dout, x, w2, pre, 0)) end,
        'matmul_backward_gelu: dpre and pre share memory')
      assert.has_error(function() check(C.wk_op_matmul_backward_gelu(x, dw, nil, dout, x, w2, pre, 0)) end,
        'matmul_backward_gelu: dpre and inp share memory')
    end)
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
    check(C.wk_op_cross_entropy(losses, logits, targets, mask, count, sum, nil))
    local lse = 0
    for v = 1, V do lse = lse + math.exp(logits:get(2, v)) end
    assert.is_true(math.abs(losses:get(2) - (math.log(lse) - logits:get(2, 5)) / count) < 1e-6)
    assert.are.equal(0, losses:get(3))
    local dlogits = T.empty({ N, V })
    assert_gradients {
      inputs = { { logits, dlogits } },
      samples = 30,
      loss = function()
        check(C.wk_op_cross_entropy(losses, logits, targets, mask, count, sum, nil))
        return sum[0]
      end,
      backward = function() check(C.wk_op_cross_entropy_backward(dlogits, logits, targets, mask, count, 1)) end,
    }
    assert.are.equal(0, dlogits:get(3, 1))
    -- Written, not added to, so the gradient may replace the logits in place (the models' classifier).
    dlogits:fill(7)
    check(C.wk_op_cross_entropy_backward(dlogits, logits, targets, mask, count, 1))
    local in_place = logits:clone()
    check(C.wk_op_cross_entropy_backward(in_place, in_place, targets, mask, count, 1))
    assert.are.same(dlogits:totable(), in_place:totable())
    assert.are.equal(0, in_place:get(3, 1))
    local flat = randn({ (N + 1) * V })  -- two [N, V] views a row apart overlap, without being one tensor
    local lower, upper = flat:narrow(1, 1, N * V):view({ N, V }), flat:narrow(1, V + 1, N * V):view({ N, V })
    assert.has_error(function() check(C.wk_op_cross_entropy_backward(upper, lower, targets, mask, count, 1)) end,
      'cross_entropy_backward: dlogits overlaps logits without being it (in place means the same tensor)')
    targets:set(3, -1)  -- masked out: ignored
    check(C.wk_op_cross_entropy(losses, logits, targets, mask, count, sum, nil))
    targets:set(2, -1)
    assert.has_error(function() check(C.wk_op_cross_entropy(losses, logits, targets, mask, count, sum, nil)) end,
      'cross_entropy: targets[1] = -1 is outside [0, 5) (tokenizer and model vocab disagree?)')
    assert.has_error(function() check(C.wk_op_cross_entropy(losses, logits, targets, nil, 0, sum, nil)) end)
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
      check(C.wk_op_embedding(out, idx, wte, wpe, nil))
      check(C.wk_op_embedding_backward(dwte, dwpe, weights, idx))
      check(C.wk_op_cross_entropy(losses, logits, tgt, mask, 9, sum, nil))
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
    assert.has_error(function() check(C.wk_op_embedding(out, inputs, wte, wpe, nil)) end,
      'embedding: idx[6] = 7 is outside [0, 7) (tokenizer and model vocab disagree?)')
    assert.has_error(function() check(C.wk_op_cross_entropy(T.empty({ B, TT }), logits, targets, mask, 9, sum, nil)) end,
      'cross_entropy: targets[5] = 7 is outside [0, 7) (tokenizer and model vocab disagree?)')
    -- Three strided dims cannot be walked as rows.
    local cube = T.zeros({ 2, 3, 4 }, 'i32')
    local sliced = cube:narrow(3, 1, 2)
    local ok, err = pcall(check, C.wk_op_cross_entropy(T.empty({ 12 }), randn({ 12, V }), sliced, nil, 1, sum, nil))
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
    -- the kernel reads four separate arrays (and vectorizes so): a shared one is refused
    assert.has_error(function() check(C.wk_op_adamw(p, p, m, v, lr, b1, b2, eps, wd, 3, 1)) end,
      'adamw: param and grad share memory')
    local state = T.zeros({ 3 })
    assert.has_error(function()
      check(C.wk_op_adamw(p, g, state:narrow(1, 1, 2), state:narrow(1, 2, 2), lr, b1, b2, eps, wd, 3, 1))
    end, 'adamw: m and v share memory')
  end)

  -- What a GPU step needs to run without a host sync: the checks and the loss sum kept in a status
  -- that is read once, giving what the ops give at once.
  it("keep a step's loss sum and its first bad index in a status, read once, as the ops report them at once", function()
    local B, TT, V, C_ = 2, 3, 5, 4
    local wte, wpe = randn({ V, C_ }), randn({ TT, C_ })
    local status = T.zeros({ ffi.sizeof('WkStepStatus') }, 'u8')
    local sum, total = ffi.new('double[1]'), 0
    local losses, logits = T.empty({ B * TT }), randn({ B * TT, V })
    for _, targets in ipairs({ T.new({ 0, 4, 2, 1, 3, 3 }, 'i32'), T.new({ 1, 1, 0, 2, 4, 0 }, 'i32') }) do
      check(C.wk_op_cross_entropy(losses, logits, targets, nil, 6, sum, nil))
      total = total + sum[0]
      check(C.wk_op_cross_entropy(losses, logits, targets, nil, 6, nil, status))
    end
    sum[0] = 0
    check(C.wk_op_step_status(status, sum))
    assert.are.equal(total, sum[0])  -- the same additions in the same order
    assert.has_error(function() check(C.wk_op_cross_entropy(losses, logits, T.zeros({ 6 }, 'i32'), nil, 6, sum, status)) end,
      'cross_entropy: give loss_sum or a step\'s status (one of the two)')

    -- Bad ids: the op goes on (zeros for the row) and the first one is what the read reports.
    local idx, out = T.new({ { 0, 7, 2 }, { 9, 1, 3 } }, 'i32'), T.full({ B, TT, C_ }, 5)
    check(C.wk_op_embedding(out, idx, wte, wpe, status))
    for c = 1, C_ do assert.are.equal(0, out:get(1, 2, c)) end
    assert.is_true(math.abs(wte:get(3, 1) + wpe:get(3, 1) - out:get(1, 3, 1)) < 1e-6)
    local message = 'embedding: idx[1] = 7 is outside [0, 5) (tokenizer and model vocab disagree?)'
    assert.has_error(function() check(C.wk_op_embedding(out, idx, wte, wpe, nil)) end, message)
    assert.has_error(function() check(C.wk_op_step_status(status, sum)) end, message)
    -- Its backward skips the bad ids: the gradient of the good rows only.
    local dwte, dwpe, dout = T.zeros({ V, C_ }), T.zeros({ TT, C_ }), randn({ B, TT, C_ })
    check(C.wk_op_embedding_backward(dwte, dwpe, dout, idx))
    assert.is_true(math.abs(dwte:get(1, 2) - dout:get(1, 1, 2)) < 1e-6)
    assert.is_true(math.abs(dwpe:get(1, 2) - dout:get(1, 1, 2) - dout:get(2, 1, 2)) < 1e-6)

    -- Bad targets are marked the same way, counted ones only; the lowest element index wins across calls.
    check(C.wk_op_fill(status, 0))
    local mask = T.new({ 1, 0, 1, 1, 1, 1 }, 'u8')
    check(C.wk_op_cross_entropy(losses, logits, T.new({ 0, -1, 1, 2, 8, 6 }, 'i32'), mask, 6, nil, status))
    assert.are.equal(0, losses:get(5))
    check(C.wk_op_cross_entropy(losses, logits, T.new({ 5, 0, 0, 0, 0, 0 }, 'i32'), nil, 6, nil, status))
    assert.has_error(function() check(C.wk_op_step_status(status, sum)) end,
      'cross_entropy: targets[0] = 5 is outside [0, 5) (tokenizer and model vocab disagree?)')
    assert.has_error(function() check(C.wk_op_step_status(T.zeros({ 8 }, 'u8'), sum)) end,
      'step_status: status is [8] u8 cpu, expected [' .. ffi.sizeof('WkStepStatus') .. ' elements of any shape] u8, contiguous')
  end)
end)

-- Under a bf16/fp16 policy the ops take 2-byte activations: each must compute what the f32 op does
-- on the same (rounded) values, its 2-byte results rounded once. Ops that are a few loads, f32
-- arithmetic and a store are bit for bit the same; the products (matmul, attention) go through
-- tiles of 256 (runtime/ops/cpu/gemm.c), whose f32 sums may be ordered differently than one sgemm,
-- so their results may sit one rounding step away. Attention also rounds P and dS to the dtype before
-- they are multiplied (case.reference computes that).
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
    if case.reference then case.reference(ref, low, dtype) else case.run(ref) end
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

  -- Attention on 2-byte storage multiplies P and dS as stored, rounded to the dtype (llm.c's design:
  -- the GPU's six products all read 2-byte operands): its reference is the f32 op's arithmetic with
  -- those two roundings, in double here. heads(t, B, TT, NH, C_) indexes a [B, TT, 3C] qkv (or a
  -- [B, TT, C] out when width is 1) and a [B, NH, TT, TT] square by (b, h, t, j or d), from 0.
  local function heads(B, TT, NH, C_)
    local hs = C_ / NH
    return {
      hs = hs,
      row = function(width, b, t, h, part) return (b * TT + t) * width * C_ + part * C_ + h * hs end,
      square = function(b, h, t, j) return ((b * NH + h) * TT + t) * TT + j end,
    }
  end

  -- forward: out = P V, with P as the 2-byte op stored it (low.att); att as the f32 op computes it.
  local function attention_reference(B, TT, NH, C_)
    local at = heads(B, TT, NH, C_)
    return function(ref, low)
      check(C.wk_op_attention(ref.out, ref.att, ref.qkv, NH))
      local P32 = low.att:float()
      local P, v, out = gradcheck.floats(P32), gradcheck.floats(ref.qkv), gradcheck.floats(ref.out)
      for b = 0, B - 1 do
        for h = 0, NH - 1 do
          for t = 0, TT - 1 do
            for d = 0, at.hs - 1 do
              local sum = 0
              for j = 0, t do sum = sum + P[at.square(b, h, t, j)] * v[at.row(3, b, j, h, 2) + d] end
              out[at.row(1, b, t, h, 0) + d] = sum
            end
          end
        end
      end
      P32:free()
    end
  end

  -- backward: dP = dO V^T, dV += P^T dO, dS = round(P * (dP - rowsum(P * dP)) * scale),
  -- dQ += dS K, dK += dS^T Q, every sum in double.
  local function attention_backward_reference(B, TT, NH, C_)
    local at = heads(B, TT, NH, C_)
    local hs, scale = at.hs, 1 / math.sqrt(C_ / NH)
    return function(ref, _, dtype)
      local dS_rounded = T.zeros({ B, NH, TT, TT })
      local P, dO, qkv, dqkv = gradcheck.floats(ref.att), gradcheck.floats(ref.dout), gradcheck.floats(ref.qkv), gradcheck.floats(ref.dqkv)
      local dS = gradcheck.floats(dS_rounded)
      local function dot(a, b) local sum = 0 for d = 0, hs - 1 do sum = sum + dO[a + d] * qkv[b + d] end return sum end
      for b = 0, B - 1 do
        for h = 0, NH - 1 do
          for t = 0, TT - 1 do
            local dP, weighted = {}, 0
            for j = 0, t do
              dP[j] = dot(at.row(1, b, t, h, 0), at.row(3, b, j, h, 2))
              weighted = weighted + P[at.square(b, h, t, j)] * dP[j]
            end
            for j = 0, t do dS[at.square(b, h, t, j)] = P[at.square(b, h, t, j)] * (dP[j] - weighted) * scale end
          end
        end
      end
      check(C.wk_op_round(dS_rounded, T.DTYPES[dtype]))
      local new = {}
      for b = 0, B - 1 do
        for h = 0, NH - 1 do
          for x = 0, TT - 1 do
            for d = 0, hs - 1 do
              local dq, dk, dv = 0, 0, 0
              for y = 0, TT - 1 do
                dv = dv + P[at.square(b, h, y, x)] * dO[at.row(1, b, y, h, 0) + d]
                dq = dq + dS[at.square(b, h, x, y)] * qkv[at.row(3, b, y, h, 1) + d]
                dk = dk + dS[at.square(b, h, y, x)] * qkv[at.row(3, b, y, h, 0) + d]
              end
              for part, sum in pairs({ [0] = dq, [1] = dk, [2] = dv }) do
                local i = at.row(3, b, x, h, part) + d
                new[i] = dqkv[i] + sum
              end
            end
          end
        end
      end
      for i, value in pairs(new) do dqkv[i] = value end
      dS_rounded:free()
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
        outputs = { 'out' }, run = function(t) check(C.wk_op_embedding(t.out, t.idx, t.wte, t.wpe, nil)) end },
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
        run = function(t) check(C.wk_op_cross_entropy(t.losses, t.logits, t.targets, nil, 8, ffi.new('double[1]'), nil)) end },
      { name = 'cross_entropy_backward', inputs = { dlogits = randn({ N, V }), logits = randn({ N, V }), targets = targets },
        outputs = { 'dlogits' }, run = function(t) check(C.wk_op_cross_entropy_backward(t.dlogits, t.logits, t.targets, nil, 8, 1)) end },
      { name = 'attention', product = true, inputs = { out = T.empty({ B, TT, C_ }), att = T.empty({ B, NH, TT, TT }), qkv = randn({ B, TT, 3 * C_ }) },
        outputs = { 'out', 'att' }, run = function(t) check(C.wk_op_attention(t.out, t.att, t.qkv, NH)) end,
        reference = attention_reference(B, TT, NH, C_) },
    }
    local probabilities = T.empty({ B, NH, TT, TT })
    check(C.wk_op_attention(T.empty({ B, TT, C_ }), probabilities, randn({ B, TT, 3 * C_ }), NH))
    list[#list + 1] = { name = 'attention_backward', product = true,
      inputs = { dqkv = randn({ B, TT, 3 * C_ }), dout = randn({ B, TT, C_ }), qkv = randn({ B, TT, 3 * C_ }), att = probabilities },
      outputs = { 'dqkv' }, run = function(t) check(C.wk_op_attention_backward(t.dqkv, t.dout, t.qkv, t.att, NH)) end,
      reference = attention_backward_reference(B, TT, NH, C_) }
    -- The Llama-family ops: rstd, the weight gradient and the RoPE inverse frequencies stay f32.
    local H, KVH, hs = 4, 2, 4
    local inv_freq = T.empty({ hs / 2 })
    check(C.wk_op_rope_frequencies(inv_freq, C.WK_ROPE_DEFAULT, 100, 0, 0, 0, 0))
    local q_shape, kv_shape, packed = { B, TT, H * hs }, { B, TT, KVH * hs }, { B, TT, 3 * H * hs }
    local llama_cases = {
      { name = 'rmsnorm', f32 = { rstd = true },
        inputs = { out = T.empty({ N, C_ }), rstd = T.empty({ N }), inp = randn({ N, C_ }), w = randn({ C_ }) },
        outputs = { 'out', 'rstd' }, run = function(t) check(C.wk_op_rmsnorm(t.out, t.rstd, t.inp, t.w, 1e-5)) end },
      { name = 'rmsnorm_backward', f32 = { dw = true, rstd = true },
        inputs = { dinp = randn({ N, C_ }), dw = randn({ C_ }), dout = randn({ N, C_ }), inp = randn({ N, C_ }), w = randn({ C_ }),
          rstd = T.full({ N }, 0.9) },
        outputs = { 'dinp', 'dw' }, run = function(t) check(C.wk_op_rmsnorm_backward(t.dinp, t.dw, t.dout, t.inp, t.w, t.rstd)) end },
      { name = 'rope', f32 = { inv_freq = true }, inputs = { out = T.empty(q_shape), inp = randn(q_shape), inv_freq = inv_freq },
        outputs = { 'out' }, run = function(t) check(C.wk_op_rope(t.out, t.inp, t.inv_freq, H, 2)) end },
      { name = 'rope_backward', f32 = { inv_freq = true }, inputs = { dinp = randn(q_shape), dout = randn(q_shape), inv_freq = inv_freq },
        outputs = { 'dinp' }, run = function(t) check(C.wk_op_rope_backward(t.dinp, t.dout, t.inv_freq, H, 2)) end },
      { name = 'swiglu', inputs = { out = T.empty({ 40 }), gate = randn({ 40 }, 2), up = randn({ 40 }) }, outputs = { 'out' },
        run = function(t) check(C.wk_op_swiglu(t.out, t.gate, t.up)) end },
      { name = 'swiglu_backward',
        inputs = { dgate = randn({ 40 }), dup = randn({ 40 }), dout = randn({ 40 }), gate = randn({ 40 }, 2), up = randn({ 40 }) },
        outputs = { 'dgate', 'dup' }, run = function(t) check(C.wk_op_swiglu_backward(t.dgate, t.dup, t.dout, t.gate, t.up)) end },
      { name = 'qkv_pack', inputs = { qkv = T.empty(packed), q = randn(q_shape), k = randn(kv_shape), v = randn(kv_shape) },
        outputs = { 'qkv' }, run = function(t) check(C.wk_op_qkv_pack(t.qkv, t.q, t.k, t.v, H, KVH)) end },
      { name = 'qkv_pack_backward', inputs = { dq = randn(q_shape), dk = randn(kv_shape), dv = randn(kv_shape), dqkv = randn(packed) },
        outputs = { 'dq', 'dk', 'dv' }, run = function(t) check(C.wk_op_qkv_pack_backward(t.dq, t.dk, t.dv, t.dqkv, H, KVH)) end },
      { name = 'attention_cached',
        inputs = { out = T.empty({ B, 2, H * hs }), q = randn({ B, 2, H * hs }), k = randn({ B, 2, KVH * hs }), v = randn({ B, 2, KVH * hs }),
          k_cache = randn({ B, 5, KVH * hs }), v_cache = randn({ B, 5, KVH * hs }) },
        outputs = { 'out', 'k_cache', 'v_cache' },
        run = function(t) check(C.wk_op_attention_cached(t.out, t.q, t.k, t.v, t.k_cache, t.v_cache, H, KVH, 2)) end },
    }
    for _, case in ipairs(llama_cases) do list[#list + 1] = case end
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
      -- the GELU of the unrounded product: rounding it first would move out and dpre by more than a step
      list[#list + 1] = { name = 'matmul_gelu ' .. transpose, product = true,
        inputs = { out = T.empty({ Nm, OCm }), pre = T.empty({ Nm, OCm }), inp = randn({ Nm, Cm }), w = randn(w_shape, 0.1),
          bias = randn({ OCm }) },
        outputs = { 'out', 'pre' }, run = function(t) check(C.wk_op_matmul_gelu(t.out, t.pre, t.inp, t.w, t.bias, transpose)) end }
      list[#list + 1] = { name = 'matmul_backward_gelu ' .. transpose, product = true, f32 = { dw = true, dbias = true },
        inputs = { dpre = T.full({ Nm, Cm }, 0 / 0), dw = randn(w_shape), dbias = randn({ OCm }), dout = randn({ Nm, OCm }),
          inp = randn({ Nm, Cm }, 0.1), w = randn(w_shape, 0.1), pre = randn({ Nm, Cm }, 2) },
        outputs = { 'dpre', 'dw', 'dbias' },
        run = function(t) check(C.wk_op_matmul_backward_gelu(t.dpre, t.dw, t.dbias, t.dout, t.inp, t.w, t.pre, transpose)) end }
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

-- The residual add fused into the norm after it (a block's x1 = x + attn and ln_2 of x1): the sum
-- rounded once, as add rounds it, then the norm of that rounded sum, so the fused op is the unfused
-- pair to the bit on every activation dtype. Rows of an odd width, 15 of them in a [3, 5, C] shape.
describe('fused residual norms', function()
  local N1, N2, C_ = 3, 5, 37
  local function bytes(t) return ffi.string(t:data(), t:nbytes()) end

  local function inputs(dtype)
    local function act(shape, std) return randn(shape, std):to(dtype) end
    return { a = act({ N1, N2, C_ }, 3), b = act({ N1, N2, C_ }), weight = act({ C_ }), bias = act({ C_ }) }
  end

  local function outputs(dtype)
    return { sum = T.empty({ N1, N2, C_ }, dtype), out = T.empty({ N1, N2, C_ }, dtype), mean = T.empty({ N1 * N2 }),
      rstd = T.empty({ N1 * N2 }) }
  end

  local function same_bits(what, keys, fused, unfused)
    for _, key in ipairs(keys) do assert.are.equal(bytes(unfused[key]), bytes(fused[key]), what .. ': ' .. key) end
  end

  for _, dtype in ipairs({ 'f32', 'bf16', 'f16' }) do
    it('add_layernorm is add then layernorm, bit for bit, on ' .. dtype, function()
      local x, fused, unfused = inputs(dtype), outputs(dtype), outputs(dtype)
      check(C.wk_op_add_layernorm(fused.sum, fused.out, fused.mean, fused.rstd, x.a, x.b, x.weight, x.bias, 1e-5))
      check(C.wk_op_add(unfused.sum, x.a, x.b))
      check(C.wk_op_layernorm(unfused.out, unfused.mean, unfused.rstd, unfused.sum, x.weight, x.bias, 1e-5))
      same_bits('add_layernorm on ' .. dtype, { 'sum', 'out', 'mean', 'rstd' }, fused, unfused)
    end)

    it('add_rmsnorm is add then rmsnorm, bit for bit, on ' .. dtype, function()
      local x, fused, unfused = inputs(dtype), outputs(dtype), outputs(dtype)
      check(C.wk_op_add_rmsnorm(fused.sum, fused.out, fused.rstd, x.a, x.b, x.weight, 1e-5))
      check(C.wk_op_add(unfused.sum, x.a, x.b))
      check(C.wk_op_rmsnorm(unfused.out, unfused.rstd, unfused.sum, x.weight, 1e-5))
      same_bits('add_rmsnorm on ' .. dtype, { 'sum', 'out', 'rstd' }, fused, unfused)
    end)
  end

  it("refuse what add or the norm refuses, naming the fused op and the argument", function()
    local a, b, w, bias = randn({ 4, 6 }), randn({ 4, 6 }), randn({ 6 }), randn({ 6 })
    local sum, out, mean, rstd = T.empty({ 4, 6 }), T.empty({ 4, 6 }), T.empty({ 4 }), T.empty({ 4 })
    local function layernorm(s, o, m, r, x, y, ww, bb, eps)
      return function() check(C.wk_op_add_layernorm(s, o, m, r, x, y, ww, bb, eps or 1e-5)) end
    end
    local function rmsnorm(s, o, r, x, y, ww, eps)
      return function() check(C.wk_op_add_rmsnorm(s, o, r, x, y, ww, eps or 1e-5)) end
    end
    assert.has_error(layernorm(sum, out, mean, rstd, a, T.empty({ 5 }), w, bias),
      'add_layernorm: b is [5] f32 cpu, expected [24 elements of any shape] f32, contiguous')
    assert.has_error(layernorm(T.empty({ 4, 6 }, 'i32'), out, mean, rstd, a, b, w, bias),
      'add_layernorm: sum is [4, 6] i32 cpu, expected f32, bf16 or f16')
    assert.has_error(layernorm(T.empty({ 4, 6 }, 'bf16'), out, mean, rstd, a, b, w, bias),
      'add_layernorm: a is [4, 6] f32 cpu, expected [24 elements of any shape] bf16, contiguous')
    assert.has_error(layernorm(T.empty({ 4, 12 }):narrow(2, 1, 6), out, mean, rstd, a, b, w, bias),
      'add_layernorm: sum is [4, 6] f32 cpu (strided), expected [24 elements of any shape] f32, contiguous')
    assert.has_error(layernorm(sum, out, T.empty({ 3 }), rstd, a, b, w, bias),
      'add_layernorm: mean is [3] f32 cpu, expected [4] f32, contiguous')
    assert.has_error(layernorm(sum, out, mean, rstd, a, b, w, T.empty({ 5 })),
      'add_layernorm: bias is [5] f32 cpu, expected [6] f32, contiguous')
    assert.has_error(layernorm(sum, out, mean, rstd, a, b, w, bias, math.huge),
      'add_layernorm: eps must be positive and finite, got inf')
    assert.has_error(function() check(C.wk_op_layernorm(out, mean, rstd, a, w, bias, -1e-5)) end,
      'layernorm: eps must be positive and finite, got -1e-05')
    assert.has_error(rmsnorm(sum, T.empty({ 4, 6 }, 'bf16'), rstd, a, b, w),
      'add_rmsnorm: out is [4, 6] bf16 cpu, expected [24 elements of any shape] f32, contiguous')
    assert.has_error(rmsnorm(sum, out, rstd, a, b, T.empty({ 4 })),
      'add_rmsnorm: weight is [4] f32 cpu, expected [6] f32, contiguous')
    assert.has_error(rmsnorm(sum, out, rstd, a, b, w, 0), 'add_rmsnorm: eps must be positive and finite, got 0')
  end)
end)

describe('Llama-family ops', function()
  it('rmsnorm divides rows by their rms and has matching gradients', function()
    local N, C_ = 5, 8
    local inp, w = randn({ N, C_ }), randn({ C_ })
    local out, rstd = T.empty({ N, C_ }), T.empty({ N })
    check(C.wk_op_rmsnorm(out, rstd, inp, w, 1e-5))
    local sumsq = 0
    for c = 1, C_ do sumsq = sumsq + inp:get(2, c) ^ 2 end
    local s = 1 / math.sqrt(sumsq / C_ + 1e-5)
    assert.is_true(math.abs(rstd:get(2) - s) < 1e-5 * s)
    assert.is_true(math.abs(out:get(2, 3) - inp:get(2, 3) * s * w:get(3)) < 1e-5)
    local dinp, dw, weights = T.empty({ N, C_ }), T.empty({ C_ }), randn({ N, C_ })
    assert_gradients {
      inputs = { { inp, dinp }, { w, dw } },
      samples = 20,
      loss = function()
        check(C.wk_op_rmsnorm(out, rstd, inp, w, 1e-5))
        return weighted_sum(out, weights)
      end,
      backward = function() check(C.wk_op_rmsnorm_backward(dinp, dw, weights, inp, w, rstd)) end,
    }
    assert.has_error(function() check(C.wk_op_rmsnorm(out, rstd, inp, w, 0)) end,
      'rmsnorm: eps must be positive and finite, got 0')
    assert.has_error(function() check(C.wk_op_rmsnorm(out, rstd, inp, T.empty({ 4 }), 1e-5)) end,
      'rmsnorm: weight is [4] f32 cpu, expected [8] f32, contiguous')
  end)

  -- Llama 3.1's published scaling: factor 8, low 1, high 4, original context 8192.
  local function frequencies(half, kind, theta, factor, low, high, context)
    local f = T.empty({ half })
    check(C.wk_op_rope_frequencies(f, kind, theta, factor or 0, low or 0, high or 0, context or 0))
    return f:totable()
  end

  it('rope frequencies: plain, linear and llama3 scaling', function()
    local plain = frequencies(8, C.WK_ROPE_DEFAULT, 10000)
    for i = 1, 8 do
      local expected = 1 / 10000 ^ ((2 * (i - 1)) / 16)
      assert.is_true(math.abs(plain[i] - expected) <= 1e-7 * expected)
    end
    local linear = frequencies(8, C.WK_ROPE_LINEAR, 10000, 4)
    for i = 1, 8 do assert.is_true(math.abs(linear[i] - plain[i] / 4) <= 1e-7 * plain[i]) end
    -- With a short original context every band appears: kept, interpolated and slowed by factor.
    local scaled = frequencies(8, C.WK_ROPE_LLAMA3, 10000, 8, 1, 4, 64)
    local kept, smoothed, slowed = 0, 0, 0
    for i = 1, 8 do
      local wavelen = 2 * math.pi / plain[i]
      if wavelen < 64 / 4 then
        assert.are.equal(plain[i], scaled[i])
        kept = kept + 1
      elseif wavelen > 64 then
        assert.is_true(math.abs(scaled[i] - plain[i] / 8) <= 1e-6 * plain[i])
        slowed = slowed + 1
      else
        local smooth = (64 / wavelen - 1) / (4 - 1)
        local expected = (1 - smooth) * plain[i] / 8 + smooth * plain[i]
        assert.is_true(math.abs(scaled[i] - expected) <= 1e-6 * expected)
        smoothed = smoothed + 1
      end
    end
    assert.is_true(kept > 0 and smoothed > 0 and slowed > 0)
    assert.has_error(function() frequencies(8, C.WK_ROPE_LLAMA3, 10000, 8, 4, 1, 64) end,
      'rope_frequencies: need 0 < low_freq_factor < high_freq_factor, got 4 and 1')
    assert.has_error(function() frequencies(8, C.WK_ROPE_DEFAULT, -1) end,
      'rope_frequencies: theta must be positive and finite, got -1')
    assert.has_error(function() frequencies(8, C.WK_ROPE_LINEAR, 10000, 0) end,
      'rope_frequencies: factor must be positive and finite, got 0')
  end)

  it('rope rotates the halves of each head by position, resumes at a start position, gradients match', function()
    local B, TT, H, hs = 2, 5, 3, 4
    local inv_freq = T.empty({ hs / 2 })
    check(C.wk_op_rope_frequencies(inv_freq, C.WK_ROPE_DEFAULT, 100, 0, 0, 0, 0))
    local inp, out = randn({ B, TT, H * hs }), T.empty({ B, TT, H * hs })
    check(C.wk_op_rope(out, inp, inv_freq, H, 0))
    -- b = 2, t = 4 (position 3), head 2, pair i = 2: elements 2 and 4 of the head
    local a = 3 * inv_freq:get(2)
    local x1, x2 = inp:get(2, 4, hs + 2), inp:get(2, 4, hs + 4)
    assert.is_true(math.abs(out:get(2, 4, hs + 2) - (x1 * math.cos(a) - x2 * math.sin(a))) < 1e-5)
    assert.is_true(math.abs(out:get(2, 4, hs + 4) - (x2 * math.cos(a) + x1 * math.sin(a))) < 1e-5)
    assert.is_true(math.abs(out:get(1, 1, 3) - inp:get(1, 1, 3)) < 1e-7)  -- position 0 is the identity
    -- The last two positions alone, started at 3, are the same rows as in the full sequence.
    local tail, rotated = inp:narrow(2, 4, 2):contiguous(), T.empty({ B, 2, H * hs })
    check(C.wk_op_rope(rotated, tail, inv_freq, H, 3))
    assert.is_true(math.abs(rotated:get(2, 1, hs + 2) - out:get(2, 4, hs + 2)) < 1e-6)
    local dinp, weights = T.empty(inp.shape), randn({ B, TT, H * hs })
    assert_gradients {
      inputs = { { inp, dinp } },
      samples = 30,
      loss = function()
        check(C.wk_op_rope(out, inp, inv_freq, H, 0))
        return weighted_sum(out, weights)
      end,
      backward = function() check(C.wk_op_rope_backward(dinp, weights, inv_freq, H, 0)) end,
    }
    assert.has_error(function() check(C.wk_op_rope(out, inp, inv_freq, 4, 0)) end,
      'rope: last dim 12 must be heads = 4 times an even head size')
    assert.has_error(function() check(C.wk_op_rope(out, inp, inv_freq, H, -1)) end,
      'rope: start position must be >= 0, got -1')
  end)

  it('swiglu is silu(gate) * up with matching gradients', function()
    local gate, up, out = randn({ 30 }, 2), randn({ 30 }), T.empty({ 30 })
    check(C.wk_op_swiglu(out, gate, up))
    local g = gate:get(4)
    assert.is_true(math.abs(out:get(4) - g / (1 + math.exp(-g)) * up:get(4)) < 1e-5)
    local dgate, dup, weights = T.empty({ 30 }), T.empty({ 30 }), randn({ 30 })
    assert_gradients {
      inputs = { { gate, dgate }, { up, dup } },
      samples = 30,
      loss = function()
        check(C.wk_op_swiglu(out, gate, up))
        return weighted_sum(out, weights)
      end,
      backward = function() check(C.wk_op_swiglu_backward(dgate, dup, weights, gate, up)) end,
    }
  end)

  it('qkv_pack repeats each kv head for its group of query heads; the backward sums the group', function()
    local B, TT, H, KVH, hs = 2, 3, 4, 2, 3
    local q, k, v = randn({ B, TT, H * hs }), randn({ B, TT, KVH * hs }), randn({ B, TT, KVH * hs })
    local qkv = T.empty({ B, TT, 3 * H * hs })
    check(C.wk_op_qkv_pack(qkv, q, k, v, H, KVH))
    local Cq = H * hs
    assert.are.equal(q:get(2, 3, 7), qkv:get(2, 3, 7))
    -- query heads 3 and 4 (1-based) share kv head 2
    assert.are.equal(k:get(2, 1, hs + 2), qkv:get(2, 1, Cq + 2 * hs + 2))
    assert.are.equal(k:get(2, 1, hs + 2), qkv:get(2, 1, Cq + 3 * hs + 2))
    assert.are.equal(v:get(1, 2, 1), qkv:get(1, 2, 2 * Cq + hs + 1))
    local dq, dk, dv, weights = T.empty(q.shape), T.empty(k.shape), T.empty(v.shape), randn(qkv.shape)
    assert_gradients {
      inputs = { { q, dq }, { k, dk }, { v, dv } },
      samples = 18,
      loss = function()
        check(C.wk_op_qkv_pack(qkv, q, k, v, H, KVH))
        return weighted_sum(qkv, weights)
      end,
      backward = function() check(C.wk_op_qkv_pack_backward(dq, dk, dv, weights, H, KVH)) end,
    }
    assert.has_error(function() check(C.wk_op_qkv_pack(qkv, q, k, v, H, 3)) end,
      'qkv_pack: heads = 4 must be a multiple of kv_heads = 3 and divide q\'s last dim 12')
  end)
end)

describe('cached attention (generation)', function()
  it('gives the causal grouped-query attention of the full sequence, whole or one position at a time', function()
    local B, TT, H, KVH, hs = 2, 5, 4, 2, 3
    local q, k, v = randn({ B, TT, H * hs }), randn({ B, TT, KVH * hs }), randn({ B, TT, KVH * hs })
    local qkv, full = T.empty({ B, TT, 3 * H * hs }), T.empty({ B, TT, H * hs })
    check(C.wk_op_qkv_pack(qkv, q, k, v, H, KVH))
    check(C.wk_op_attention(full, T.empty({ B, H, TT, TT }), qkv, H))
    local k_cache, v_cache = T.zeros({ B, 8, KVH * hs }), T.zeros({ B, 8, KVH * hs })
    local whole = T.empty({ B, TT, H * hs })
    check(C.wk_op_attention_cached(whole, q, k, v, k_cache, v_cache, H, KVH, 0))
    local function close(a, b) return math.abs(a - b) < 1e-5 end
    for b = 1, B do for t = 1, TT do for c = 1, H * hs do
      assert(close(whole:get(b, t, c), full:get(b, t, c)), ('at %d %d %d'):format(b, t, c))
    end end end
    assert.are.equal(k:get(2, 4, 5), k_cache:get(2, 4, 5))
    -- The first four positions, then the last one alone against the cache they left.
    local function rows(x, first, n) return x:narrow(2, first, n):contiguous() end
    local k_cache2, v_cache2 = T.zeros({ B, 8, KVH * hs }), T.zeros({ B, 8, KVH * hs })
    check(C.wk_op_attention_cached(T.empty({ B, TT - 1, H * hs }), rows(q, 1, TT - 1), rows(k, 1, TT - 1),
      rows(v, 1, TT - 1), k_cache2, v_cache2, H, KVH, 0))
    local last, one = rows(q, TT, 1), T.empty({ B, 1, H * hs })
    check(C.wk_op_attention_cached(one, last, rows(k, TT, 1), rows(v, TT, 1), k_cache2, v_cache2, H, KVH, TT - 1))
    for b = 1, B do for c = 1, H * hs do assert(close(one:get(b, 1, c), full:get(b, TT, c))) end end
    assert.has_error(function()
      check(C.wk_op_attention_cached(one, last, rows(k, TT, 1), rows(v, TT, 1), k_cache2, v_cache2, H, KVH, 8))
    end,
      'attention_cached: positions 8..8 do not fit a cache of 8')
  end)
end)

describe('Llama-family ops on CUDA tensors', function()
  it('run the training ops and generation\'s cached attention', function()
    if C.wk_cuda_device_count() == 0 then
      pending('skipped: no CUDA device on this machine')
      return
    end
    local x, w = T.zeros({ 2, 4 }, 'f32', 'cuda:0'), T.zeros({ 4 }, 'f32', 'cuda:0')
    local out, rstd = T.empty({ 2, 4 }, 'f32', 'cuda:0'), T.empty({ 2 }, 'f32', 'cuda:0')
    check(C.wk_op_rmsnorm(out, rstd, x, w, 1e-5))
    check(C.wk_op_swiglu(out, x, x))
    local inv_freq = T.empty({ 1 }, 'f32', 'cuda:0')
    check(C.wk_op_rope_frequencies(inv_freq, C.WK_ROPE_DEFAULT, 10000, 0, 0, 0, 0))  -- computed on the host
    assert.are.equal(1, inv_freq:get(1))
    local qkv = T.empty({ 1, 2, 12 }, 'f32', 'cuda:0')
    local q = T.zeros({ 1, 2, 4 }, 'f32', 'cuda:0')
    check(C.wk_op_rope(T.empty({ 1, 2, 4 }, 'f32', 'cuda:0'), q, inv_freq, 2, 0))
    check(C.wk_op_qkv_pack(qkv, q, q, q, 2, 2))
    local k_cache, v_cache = T.zeros({ 1, 4, 4 }, 'f32', 'cuda:0'), T.zeros({ 1, 4, 4 }, 'f32', 'cuda:0')
    local ones, out = T.full({ 1, 2, 4 }, 1, 'f32', 'cuda:0'), T.empty({ 1, 2, 4 }, 'f32', 'cuda:0')
    check(C.wk_op_attention_cached(out, q, q, ones, k_cache, v_cache, 2, 2, 1))
    -- q and k are 0, so each query averages the values of positions 0..its own: position 0 of the
    -- cache (still 0), then the 1s written at positions 1 and 2
    assert.is_true(math.abs(out:get(1, 1, 1) - 1 / 2) < 1e-6)
    assert.is_true(math.abs(out:get(1, 2, 4) - 2 / 3) < 1e-6)
    assert.are.equal(1, v_cache:get(1, 3, 1))
    assert.are.equal(0, v_cache:get(1, 4, 1))
  end)
end)

describe('the sampler (generation)', function()
  local out = ffi.new('int32_t[1]')
  local order, weights = ffi.new('int32_t[8]'), ffi.new('double[8]')
  local function pick(logits, temperature, top_k, top_p, u)
    local row = ffi.new('float[?]', #logits, logits)
    check(C.wk_sample_token(row, #logits, temperature, top_k, top_p, u, order, weights, out))
    return out[0]
  end

  it('takes the first most likely id at temperature 0', function()
    assert.are.equal(1, pick({ 1, 3, 3, 2 }, 0, 0, 1, 0))
  end)

  it('draws by softmax weight, cut by top_k and top_p: probabilities 3/4 and 1/4', function()
    local logits = { 0, math.log(3) }  -- softmax: 1/4, 3/4; sorted: id 1, then id 0
    assert.are.equal(1, pick(logits, 1, 0, 1, 0.74))
    assert.are.equal(0, pick(logits, 1, 0, 1, 0.76))
    assert.are.equal(1, pick(logits, 1, 1, 1, 0.99))   -- top_k = 1 keeps the most likely only
    assert.are.equal(1, pick(logits, 1, 0, 0.5, 0.99)) -- its 3/4 alone reaches top_p = 0.5
    assert.are.equal(0, pick(logits, 1, 0, 0.9, 0.99)) -- 0.9 needs both
  end)

  it('refuses what is out of range, naming it', function()
    local row = ffi.new('float[2]')
    for _, case in ipairs({ { 2, -1, 0, 1, 0 }, { 2, 1, 0, 0, 0 }, { 2, 1, 0, 1, 1 }, { 0, 1, 0, 1, 0 } }) do
      local ok, message = core.try(C.wk_sample_token(row, case[1], case[2], case[3], case[4], case[5], order, weights,
        out))
      assert.is_nil(ok)
      assert.matches('sample_token: vocab %d+, temperature', message)
    end
    local ok, message = core.try(C.wk_sample_token(row, 2, 1, 0, 1, 0, nil, nil, out)) -- a draw needs its scratch
    assert.is_nil(ok)
    assert.matches('scratch missing: out of range', message, 1, true)
  end)
end)
