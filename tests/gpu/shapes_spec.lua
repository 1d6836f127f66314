-- The CUDA ops against the CPU at GPT-2 124M's shapes (tag: gpu): C=768, T=1024, V=50304, NH=12,
-- micro batch 16, and the row kernels past 2^23 rows, where index arithmetic of 32 bits, grid
-- caps and per-row launches break that toy shapes never reach. Slow on the CPU side (a few
-- minutes), so it runs only when asked: WICK_GPU_SHAPES=realistic (make gpu-check does); otherwise
-- each test is skipped with the reason.
--
-- Outputs are compared by relative L2 error, ||gpu - cpu|| / ||cpu||, computed by the ops themselves
-- (a Lua loop over 800M logits would take longer than the kernels): below 1e-3 (sums of 768 to
-- 50304 terms in another order, and cuBLAS may use TF32 for f32 GEMMs).
local ffi = require 'ffi'
local wick = require 'wick'
local core = require 'wick.core'
local T = wick.tensor
local C = core.C
local check = core.check
local cases = require 'helpers.gpu_cases'

local REL_TOL = 1e-3
local DEVICE = 'cuda:0'
local B, TT, CH, V, NH = 16, 1024, 768, 50304, 12
local N = B * TT
local ROWS_T = 4099                 -- rows of a sequence in the many-rows tests (odd: no block divides it)
local MANY_ROWS = 2047 * ROWS_T      -- 8,390,653: past 2^23 = 8,388,608 rows

local function realistic_or_skip()
  if os.getenv('WICK_GPU_SHAPES') ~= 'realistic' then
    pending('skipped: realistic shapes run with WICK_GPU_SHAPES=realistic (make gpu-check sets it)')
    return false
  end
  if C.wk_cuda_device_count() > 0 then return true end
  error('WICK_GPU_SHAPES=realistic but no CUDA device is usable here')
end

local scalar = ffi.new('double[1]')
local function sumsq(t)
  check(C.wk_op_sumsq(t, scalar))
  return scalar[0]
end

-- ||gpu - cpu|| / ||cpu|| (the absolute norm when cpu is all zeros).
local function relative_l2(gpu, cpu)
  local diff = gpu:to('cpu', 'f32')
  check(C.wk_op_axpy(diff, -1, cpu))
  local scale = sumsq(cpu)
  local err = math.sqrt(sumsq(diff) / (scale > 0 and scale or 1))
  diff:free()  -- gigabytes at these shapes: not left to the garbage collector
  return err
end

local function agree(name, run)
  cases.agree(name, run, DEVICE, relative_l2, REL_TOL, 'relative L2 error')
  collectgarbage()
end

local randn = cases.randn

-- Integers in [0, limit) from a fixed LCG, as an i32 tensor of shape on device.
local function indices(shape, limit, seed, device)
  local t = T.empty(shape, 'i32')
  local p, x = ffi.cast('int32_t *', t:data()), seed
  for i = 0, t:numel() - 1 do
    x = (x * 1103515245 + 12345) % 2147483648
    p[i] = x % limit
  end
  return device == 'cpu' and t or t:to(device)
end

describe('CUDA agrees with the CPU at GPT-2 124M shapes #gpu', function()
  it('embedding forward and backward (B 16, T 1024, V 50304, C 768)', function()
    if not realistic_or_skip() then return end
    agree('embedding', cases.embedding(function(device) return indices({ B, TT }, V, 1, device) end, B, TT, CH, V, 3))
  end)

  it('layernorm forward and backward (16384 rows of 768)', function()
    if not realistic_or_skip() then return end
    agree('layernorm', cases.layernorm(N, CH, 6))
  end)

  -- A block's four GEMMs and the tied classifier (wte is V x C: transposed).
  for _, case in ipairs({ { 'qkv', CH, 3 * CH, 0 }, { 'attention projection', CH, CH, 0 }, { 'MLP up', CH, 4 * CH, 0 },
    { 'MLP down', 4 * CH, CH, 0 }, { 'classifier', CH, V, 1 } }) do
    local what, IN, OC, transpose = case[1], case[2], case[3], case[4]
    it(('matmul forward and backward: %s (%d x %d -> %d)'):format(what, N, IN, OC), function()
      if not realistic_or_skip() then return end
      agree('matmul ' .. what, cases.matmul(N, IN, OC, transpose, transpose == 0, 10))  -- the classifier has no bias
    end)
  end

  it(('MLP up and down with GELU in their epilogues (%d x %d -> %d -> %d)'):format(N, CH, 4 * CH, CH), function()
    if not realistic_or_skip() then return end
    agree('matmul_gelu', cases.matmul_gelu(N, CH, 4 * CH, 0, 30))
  end)

  -- The CPU reference's loops over (B, NH, T, T) are the slow part: 2 rows of the micro batch keep
  -- every other dimension at GPT-2's size.
  it('attention forward and backward (T 1024, 12 heads, C 768)', function()
    if not realistic_or_skip() then return end
    local AB = 2
    agree('attention', cases.attention(AB, TT, CH, NH, 16))
  end)

  it('cross-entropy forward and backward (16384 rows of 50304 logits)', function()
    if not realistic_or_skip() then return end
    agree('cross_entropy', function(device)
      local logits, targets = randn({ N, V }, 18, device), indices({ N }, V, 2, device)
      local losses = T.empty({ N }, 'f32', device)
      check(C.wk_op_cross_entropy(losses, logits, targets, nil, N, scalar, nil))
      local sum = scalar[0]
      local dlogits = T.zeros({ N, V }, 'f32', device)
      check(C.wk_op_cross_entropy_backward(dlogits, logits, targets, nil, N, 1))
      return { losses, dlogits, T.new({ sum }) }
    end)
  end)

  it('cross-entropy and its gradient on every one of 8,390,653 rows', function()
    if not realistic_or_skip() then return end
    local WIDTH = 5
    agree('cross_entropy (many rows)', function(device)
      local logits, targets = randn({ MANY_ROWS, WIDTH }, 19, device), indices({ MANY_ROWS }, WIDTH, 3, device)
      local losses = T.zeros({ MANY_ROWS }, 'f32', device)
      check(C.wk_op_cross_entropy(losses, logits, targets, nil, MANY_ROWS, scalar, nil))
      local dlogits = T.zeros({ MANY_ROWS, WIDTH }, 'f32', device)
      check(C.wk_op_cross_entropy_backward(dlogits, logits, targets, nil, MANY_ROWS, 1))
      -- the last sequence's rows alone too: a kernel that stops at a grid cap leaves them zero
      return { losses, dlogits, losses:narrow(1, MANY_ROWS - ROWS_T + 1, ROWS_T):contiguous() }
    end)
  end)

  it('embedding, layernorm and its backward on every one of 8,390,653 rows', function()
    if not realistic_or_skip() then return end
    local WIDTH = 4
    agree('embedding + layernorm (many rows)', function(device)
      local idx = indices({ MANY_ROWS / ROWS_T, ROWS_T }, 11, 4, device)
      local wte, wpe = randn({ 11, WIDTH }, 20, device), randn({ ROWS_T, WIDTH }, 21, device)
      local out = T.empty({ MANY_ROWS / ROWS_T, ROWS_T, WIDTH }, 'f32', device)
      check(C.wk_op_embedding(out, idx, wte, wpe, nil))
      local flat = out:view({ MANY_ROWS, WIDTH })
      local w, b = randn({ WIDTH }, 22, device), randn({ WIDTH }, 23, device)
      local ln, mean, rstd = T.empty({ MANY_ROWS, WIDTH }, 'f32', device), T.zeros({ MANY_ROWS }, 'f32', device),
        T.zeros({ MANY_ROWS }, 'f32', device)
      check(C.wk_op_layernorm(ln, mean, rstd, flat, w, b, 1e-5))
      local dinp, dw, db = T.zeros({ MANY_ROWS, WIDTH }, 'f32', device), T.zeros({ WIDTH }, 'f32', device),
        T.zeros({ WIDTH }, 'f32', device)
      check(C.wk_op_layernorm_backward(dinp, dw, db, randn({ MANY_ROWS, WIDTH }, 24, device), flat, w, mean, rstd))
      return { out, ln, dinp, dw, db, dinp:narrow(1, MANY_ROWS - ROWS_T + 1, ROWS_T):contiguous() }
    end)
  end)

  it('adamw over 124M parameters', function()
    if not realistic_or_skip() then return end
    local P = require('wick.nn.cost').parameter_count({ layers = 12, heads = NH, dim = CH, vocab = V, seq_len = TT })
    agree('adamw', function(device)
      local p, g = randn({ P }, 25, device), randn({ P }, 26, device)
      local m, v = T.zeros({ P }, 'f32', device), T.zeros({ P }, 'f32', device)
      for step = 1, 2 do check(C.wk_op_adamw(p, g, m, v, 6e-4, 0.9, 0.95, 1e-8, 0.1, step, 1)) end
      return { p, m, v }
    end)
  end)
end)
