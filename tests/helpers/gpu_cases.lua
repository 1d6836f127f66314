-- What the GPU specs (tests/ops/cuda_spec.lua at toy and GPT-2 widths, tests/gpu/shapes_spec.lua at GPT-2
-- 124M's shapes) share: seeded normal draws, the comparison of a run on the CPU with the same run on
-- a GPU, and the f32 op cases each spec runs at its own shapes. A case is a function of the device
-- that builds its inputs there from seeds, runs the op forward and backward, and returns the outputs
-- to compare; the spec chooses the measure of the error (largest relative, or relative L2) and its bound.
local wick = require 'wick'
local core = require 'wick.core'
local T = wick.tensor
local assert = require 'luassert'
local C = core.C
local check = core.check

local cases = {}

function cases.randn(shape, seed, device) return T.randn(shape, { seed = seed, device = device }) end
local randn = cases.randn

-- run('cpu') against run(device), output by output: measure(gpu, cpu) must stay below tol.
function cases.agree(name, run, device, measure, tol, what)
  local cpu, gpu = run('cpu'), run(device)
  for k = 1, #cpu do
    local err = measure(gpu[k], cpu[k])
    assert.is_true(err < tol, ('%s output %d: %s %.3g'):format(name, k, what, err))
  end
end

-- Token ids from idx(device) [B, T] into tables [V, C] and [T, C] (seeds seed, seed + 1), and back
-- from a gradient drawn with seed + 2.
function cases.embedding(idx, B, TT, CH, V, seed)
  return function(device)
    local ids = idx(device)
    local wte, wpe, out = randn({ V, CH }, seed, device), randn({ TT, CH }, seed + 1, device), T.empty({ B, TT, CH }, 'f32', device)
    check(C.wk_op_embedding(out, ids, wte, wpe, nil))
    local dwte, dwpe = T.zeros({ V, CH }, 'f32', device), T.zeros({ TT, CH }, 'f32', device)
    check(C.wk_op_embedding_backward(dwte, dwpe, randn({ B, TT, CH }, seed + 2, device), ids))
    return { out, dwte, dwpe }
  end
end

-- rows x width, seeds seed .. seed + 3.
function cases.layernorm(rows, width, seed)
  return function(device)
    local inp, w, b = randn({ rows, width }, seed, device), randn({ width }, seed + 1, device), randn({ width }, seed + 2, device)
    local out, mean, rstd = T.empty({ rows, width }, 'f32', device), T.empty({ rows }, 'f32', device), T.empty({ rows }, 'f32', device)
    check(C.wk_op_layernorm(out, mean, rstd, inp, w, b, 1e-5))
    local dinp, dw, db = T.zeros({ rows, width }, 'f32', device), T.zeros({ width }, 'f32', device), T.zeros({ width }, 'f32', device)
    check(C.wk_op_layernorm_backward(dinp, dw, db, randn({ rows, width }, seed + 3, device), inp, w, mean, rstd))
    return { out, mean, rstd, dinp, dw, db }
  end
end

-- [rows, IN] x w -> [rows, OC], w transposed ([OC, IN]) when transpose is 1, with a bias (and its
-- gradient) when biased; seeds seed .. seed + 3.
function cases.matmul(rows, IN, OC, transpose, biased, seed)
  return function(device)
    local inp, bias = randn({ rows, IN }, seed, device), biased and randn({ OC }, seed + 1, device) or nil
    local w = randn(transpose == 1 and { OC, IN } or { IN, OC }, seed + 2, device)
    local out = T.empty({ rows, OC }, 'f32', device)
    check(C.wk_op_matmul(out, inp, w, bias, transpose))
    local dinp, dw = T.zeros({ rows, IN }, 'f32', device), T.zeros(w.shape, 'f32', device)
    local db = biased and T.zeros({ OC }, 'f32', device) or nil
    check(C.wk_op_matmul_backward(dinp, dw, db, randn({ rows, OC }, seed + 3, device), inp, w, transpose))
    return { out, dinp, dw, db }
  end
end

-- The MLP's products with GELU in their epilogue, stored in dtype (default f32): forward, x [rows,
-- width] through w [width, hidden] (transposed when transpose is 1) and a bias into pre and out
-- [rows, hidden]; backward, the down-projection w2 [hidden, width] from dout [rows, width], its input
-- h and pre [rows, hidden] drawn (not the forward's, so both devices read the same bits) and dpre
-- filled with NaN first (it is written); seeds seed .. seed + 7. A hidden width that is no multiple
-- of 8 takes the CUDA op's way without the epilogue (cuBLASLt's aux ld rule).
function cases.matmul_gelu(rows, width, hidden, transpose, seed, dtype)
  dtype = dtype or 'f32'
  local function act(shape, s, device)
    local x = randn(shape, s, device)
    return dtype == 'f32' and x or x:to(dtype)
  end
  return function(device)
    local x, bias = act({ rows, width }, seed, device), act({ hidden }, seed + 1, device)
    local w = act(transpose == 1 and { hidden, width } or { width, hidden }, seed + 2, device)
    local pre, out = T.empty({ rows, hidden }, dtype, device), T.empty({ rows, hidden }, dtype, device)
    check(C.wk_op_matmul_gelu(out, pre, x, w, bias, transpose))
    local h, back_pre, dout = act({ rows, hidden }, seed + 3, device), act({ rows, hidden }, seed + 4, device),
      act({ rows, width }, seed + 5, device)
    local w2 = act(transpose == 1 and { width, hidden } or { hidden, width }, seed + 6, device)
    local dpre = T.full({ rows, hidden }, 0 / 0, dtype, device)
    local dw, db = T.zeros(w2.shape, 'f32', device), randn({ width }, seed + 7, device)
    check(C.wk_op_matmul_backward_gelu(dpre, dw, db, dout, h, w2, back_pre, transpose))
    return { pre, out, dpre, dw, db }
  end
end

-- Causal attention over qkv [batch, seq, 3 width] (seed), backward from seed + 1.
function cases.attention(batch, seq, width, heads, seed)
  return function(device)
    local qkv = randn({ batch, seq, 3 * width }, seed, device)
    local out, att = T.empty({ batch, seq, width }, 'f32', device), T.empty({ batch, heads, seq, seq }, 'f32', device)
    check(C.wk_op_attention(out, att, qkv, heads))
    local dqkv = T.zeros(qkv.shape, 'f32', device)
    check(C.wk_op_attention_backward(dqkv, randn({ batch, seq, width }, seed + 1, device), qkv, att, heads))
    return { out, att, dqkv }
  end
end

return cases
