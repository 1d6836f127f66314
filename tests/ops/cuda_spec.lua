-- CUDA against the CPU reference, op by op and for a whole GPT step (tag: gpu). Runs with
-- `make test-gpu`; on a machine without a GPU each test is skipped with the reason, unless
-- WICK_REQUIRE_GPU=1 demands one. Inputs come from the counter-based generator, which gives the
-- same values on both devices; outputs must agree within 1e-4 relative (atomics and cuBLAS sum in
-- another order than the CPU). On bf16 and f16 storage the CPU op on the same 2-byte inputs is the
-- reference too, with the tolerances said at agree_stored.
local ffi = require 'ffi'
local wick = require 'wick'
local core = require 'wick.core'
local T = wick.tensor
local C = core.C
local check = core.check
local cases = require 'helpers.gpu_cases'

local REL_TOL = 1e-4
local DEVICE = 'cuda:0'

local function gpu_or_skip()
  if C.wk_cuda_device_count() > 0 then return true end
  local reason = wick.build_info().has_cuda and 'no CUDA device on this machine'
      or 'libwick was built without CUDA (nvcc not found)'
  if os.getenv('WICK_REQUIRE_GPU') == '1' then error('WICK_REQUIRE_GPU=1 but ' .. reason) end
  pending('skipped: ' .. reason)
  return false
end

-- The largest difference over b's largest magnitude; a NaN on one side only (math.max would skip
-- it) is an infinite error.
local function relative_error(a, b)
  local ha, hb = a:to('cpu', 'f32'), b:to('cpu', 'f32')
  local pa, pb = ffi.cast('float *', ha:data()), ffi.cast('float *', hb:data())
  local diff, scale = 0, 0
  for i = 0, ha:numel() - 1 do
    if (pa[i] ~= pa[i]) ~= (pb[i] ~= pb[i]) then return math.huge end
    diff = math.max(diff, math.abs(pa[i] - pb[i]))
    scale = math.max(scale, math.abs(pb[i]))
  end
  return scale == 0 and diff or diff / scale
end

-- run(device) builds inputs on device, runs the op(s) and returns the tensors to compare.
local function agree(name, run) cases.agree(name, run, DEVICE, relative_error, REL_TOL, 'relative error') end

local randn = cases.randn

local function bytes(t)
  local host = t.device == 'cpu' and t or t:to('cpu')
  return ffi.string(host:data(), host:nbytes())
end

-- One rounding step of each dtype, relative to the reference's largest magnitude: a 2-byte output
-- whose f32 value (summed in another order than on the CPU, or through an fma) lands on the other
-- side of a rounding boundary differs by one spacing of its dtype, at most 2^-7 (bf16: 8 significant
-- bits) or 2^-10 (f16: 11) of its magnitude. An f32 output keeps REL_TOL.
local STEP = { f32 = REL_TOL, bf16 = 2 ^ -7, f16 = 2 ^ -10 }

-- As agree, for ops on 2-byte storage: run(device) returns the outputs; those whose indices are
-- keys of `exact` must be the CPU's very bits (their f32 value is one IEEE operation on the same
-- inputs, rounded to nearest even on both devices), the others within one rounding step of their
-- dtype (`steps` of them, default 1, where the GPU rounds twice on its way).
local function agree_stored(name, exact, run, steps)
  local cpu, gpu = run('cpu'), run(DEVICE)
  for k = 1, #cpu do
    local what = ('%s output %d (%s)'):format(name, k, cpu[k].dtype)
    assert.are.equal(cpu[k].dtype, gpu[k].dtype, what)
    if exact[k] then
      assert.are.equal(bytes(cpu[k]), bytes(gpu[k]), what .. ': not the CPU\'s bits')
    else
      local err, step = relative_error(gpu[k], cpu[k]), STEP[cpu[k].dtype] * (cpu[k].dtype == 'f32' and 1 or steps or 1)
      assert.is_true(err <= step, ('%s: relative error %.3g, over %d rounding step(s) (%.3g)'):format(what, err, steps or 1, step))
    end
  end
end

-- Inputs of dtype: f32 draws cast on the device, which gives the CPU's bits (the casts test below).
local function randn_as(dtype, shape, seed, device)
  local x = randn(shape, seed, device)
  return dtype == 'f32' and x or x:to(dtype)
end

-- The fused residual norms (add_layernorm, add_rmsnorm) of rows x width inputs of dtype (seeds seed ..
-- seed + 3): a function of the device giving the fused op's outputs and the unfused pair's (add, then
-- the norm) on the same inputs there.
local function fused_norm(norm, dtype, rows, width, seed)
  return function(device)
    local function act(shape, k) return randn_as(dtype, shape, seed + k, device) end
    local a, b, w, bias = act({ rows, width }, 0), act({ rows, width }, 1), act({ width }, 2), act({ width }, 3)
    local function run(fused)
      local sum, out = T.empty({ rows, width }, dtype, device), T.empty({ rows, width }, dtype, device)
      local mean, rstd = T.empty({ rows }, 'f32', device), T.empty({ rows }, 'f32', device)
      if not fused then check(C.wk_op_add(sum, a, b)) end
      if norm == 'rmsnorm' then
        if fused then check(C.wk_op_add_rmsnorm(sum, out, rstd, a, b, w, 1e-5))
        else check(C.wk_op_rmsnorm(out, rstd, sum, w, 1e-5)) end
        return { sum, out, rstd }
      end
      if fused then check(C.wk_op_add_layernorm(sum, out, mean, rstd, a, b, w, bias, 1e-5))
      else check(C.wk_op_layernorm(out, mean, rstd, sum, w, bias, 1e-5)) end
      return { sum, out, mean, rstd }
    end
    return run(true), run(false)
  end
end

-- A run(device) for agree: the fused outputs of case, once they are the unfused pair's very bits on
-- that device (the GPU's fused kernel against the GPU's add and norm, the CPU's against the CPU's).
local function fused_as_pair(name, case)
  return function(device)
    local fused, unfused = case(device)
    for k = 1, #fused do
      assert.are.equal(bytes(unfused[k]), bytes(fused[k]), ("%s on %s: output %d is not the unfused pair's"):format(name, device, k))
    end
    return fused
  end
end

-- Rows x widths of the fused norms: a toy width, GPT-2's 768 and a Llama's 4096, rows not a multiple
-- of the 8 a block of the warp-per-row kernels takes.
local FUSED_SHAPES = { { 10, 8 }, { 2 * 257, 768 }, { 2 * 257, 4096 } }

local B, TT, CH, V, NH = 2, 5, 8, 11, 2
local N = B * TT

describe('CUDA agrees with the CPU #gpu', function()
  it('fill, scale, add, axpy, round, sumsq', function()
    if not gpu_or_skip() then return end
    agree('elementwise', function(device)
      local a, b, out = randn({ 50 }, 1, device), randn({ 50 }, 2, device), T.empty({ 50 }, 'f32', device)
      check(C.wk_op_add(out, a, b))
      check(C.wk_op_axpy(out, 0.5, a))
      check(C.wk_op_scale(out, 3))
      local bf, hf = out:clone(), out:clone()
      check(C.wk_op_round(bf, T.DTYPES.bf16))
      check(C.wk_op_round(hf, T.DTYPES.f16))
      local sum = ffi.new('double[1]')
      check(C.wk_op_sumsq(out, sum))
      return { out, bf, hf, T.new({ sum[0] }), T.full({ 3 }, 7, 'i64', device), T.full({ 3 }, 2.5, 'bf16', device) }
    end)
  end)

  it('copies and casts between devices, strided and pinned', function()
    if not gpu_or_skip() then return end
    local host = T.new({ { 1, 2, 3 }, { 4, 5, 6 } })
    local gpu = host:to(DEVICE)
    assert.are.same(host:totable(), gpu:to('cpu'):totable())
    assert.are.same({ { 2, 3 }, { 5, 6 } }, gpu:narrow(2, 2, 2):contiguous():to('cpu'):totable())
    assert.are.same({ 1, 2, 3, 4, 5, 6 }, gpu:to('bf16'):to('cpu', 'f32'):view({ 6 }):totable())
    local pinned, stream, event = T.pinned({ 2, 3 }), T.stream(DEVICE), T.event(DEVICE)
    pinned:copy_async(gpu, stream)
    event:record(stream)
    event:synchronize()
    assert.are.same(host:totable(), pinned:totable())
    local back = T.empty({ 2, 3 }, 'f32', DEVICE)
    stream:use()  -- ops and copies of this thread now queue on the stream
    back:copy_async(pinned, stream)
    stream:synchronize()
    T.default_stream()
    assert.are.same(host:totable(), back:to('cpu'):totable())
    stream:free()
    event:free()
  end)

  -- Edge values of every dtype, as raw bits (NaN payloads, subnormals, ties, the ends of each
  -- range, i64 past 2^53), cast on the device to every dtype: the very bits the CPU's cast gives
  -- (runtime/tensor/cast.h), contiguous and from a strided view.
  local EDGES = {
    f32 = { 'uint32_t', { 0x00000000, 0x80000000, 0x3fc00000, 0xbfc00000, 0x40200000, 0x477fe000, 0x477ff000,
      0x501502f9, 0xd01502f9, 0x4f000000, 0xcf000000, 0x5f000000, 0x7f800000, 0xff800000, 0x7fc00000,
      0x7f800001, 0xffa00001, 0x00000001, 0x33c00000, 0x3f808000, 0x3f818000, 0x7f7fffff, 0x437ff000,
      0xbf000000, 0x4b800001, 0x38800000, 0x387fc000 } },
    bf16 = { 'uint16_t', { 0x0000, 0x8000, 0x7f81, 0xffc1, 0x0001, 0x3fc0, 0xbfc0, 0x4f00, 0xdf00, 0x7f80, 0xff80,
      0x477f, 0x4780, 0xc2ff, 0x437f } },
    f16 = { 'uint16_t', { 0x0000, 0x8000, 0x7c01, 0xfe01, 0x0001, 0x03ff, 0x0400, 0x7bff, 0x7c00, 0xfc00, 0x3c01,
      0xbe00, 0x5bf8 } },
    i32 = { 'int32_t', { 0, -1, 2147483647, -2147483648, 16777217, 16777219, 65536, 65535, 256, -129, 2049 } },
    i64 = { 'int64_t', { 0LL, -1LL, 9007199254740993LL, -9007199254740993LL, 0x7fffffffffffffffLL,
      -0x7fffffffffffffffLL - 1, 0x100000005LL, 2147483648LL, -2147483649LL, 65537LL, 16777217LL } },
    u16 = { 'uint16_t', { 0, 65535, 32768, 2049, 255, 256 } },
    u8 = { 'uint8_t', { 0, 255, 128, 127, 1 } },
  }
  local NAMES = { 'f32', 'bf16', 'f16', 'i32', 'i64', 'u16', 'u8' }

  local function from_bits(dtype)
    local ctype, bits = EDGES[dtype][1], EDGES[dtype][2]
    local t = T.empty({ #bits }, dtype)
    local p = ffi.cast(ctype .. ' *', t:data())
    for i, b in ipairs(bits) do p[i - 1] = b end
    return t
  end

  it('casts every dtype pair on edge values to the bits the CPU gives', function()
    if not gpu_or_skip() then return end
    for _, from in ipairs(NAMES) do
      local host = from_bits(from)
      local gpu = host:to(DEVICE)
      local n = host:numel()
      local every_other = gpu:view({ n, 1 }):narrow(1, 1, n - n % 2):view({ (n - n % 2) / 2, 2 }):narrow(2, 1, 1)
      local host_strided = host:view({ n, 1 }):narrow(1, 1, n - n % 2):view({ (n - n % 2) / 2, 2 }):narrow(2, 1, 1)
      for _, to in ipairs(NAMES) do
        assert.are.equal(bytes(host:to(to)), bytes(gpu:to(to)), from .. ' -> ' .. to)
        assert.are.equal(bytes(host_strided:to(to)), bytes(every_other:to(to)), from .. ' -> ' .. to .. ' (strided)')
      end
    end
  end)

  it('embedding forward and backward', function()
    if not gpu_or_skip() then return end
    local function idx(device) return T.new({ { 0, 4, 10, 2, 2 }, { 1, 1, 3, 9, 7 } }, 'i32', device) end
    agree('embedding', cases.embedding(idx, B, TT, CH, V, 3))
    local bad = T.new({ { 0, 11, 0, 0, 0 }, { 0, 0, 0, 0, 0 } }, 'i32', DEVICE)
    assert.has_error(function()
      check(C.wk_op_embedding(T.empty({ B, TT, CH }, 'f32', DEVICE), bad, randn({ V, CH }, 3, DEVICE), randn({ TT, CH }, 4, DEVICE), nil))
    end, ('embedding: idx[1] = 11 is outside [0, %d) (tokenizer and model vocab disagree?)'):format(V))
  end)

  -- A step's status on the device (no host sync per op): the CPU's loss sum, bit for bit in its
  -- additions of the per-op sums, and the CPU's first bad index.
  it("keeps a step's status on the device: loss sums added there and the first bad index marked", function()
    if not gpu_or_skip() then return end
    local rows, width = 6, 7
    local function step(device)
      local status = T.zeros({ ffi.sizeof('WkStepStatus') }, 'u8', device)
      local logits, losses = randn({ rows, width }, 5, device), T.empty({ rows }, 'f32', device)
      for k = 1, 2 do
        local targets = T.new({ 0, k, 2, 6, 3, 1 }, 'i32', device)
        check(C.wk_op_cross_entropy(losses, logits, targets, nil, rows, nil, status))
      end
      local sum = ffi.new('double[1]')
      check(C.wk_op_step_status(status, sum))
      local idx = T.new({ { 0, 1, 2 }, { 3, 9, 8 } }, 'i32', device)
      check(C.wk_op_embedding(T.empty({ 2, 3, 4 }, 'f32', device), idx, randn({ width, 4 }, 6, device),
        randn({ 3, 4 }, 7, device), status))
      return sum[0], C.wk_op_step_status(status, sum) ~= 0 and core.last_error()
    end
    local cpu_sum, cpu_error = step('cpu')
    local gpu_sum, gpu_error = step(DEVICE)
    assert.is_true(math.abs(gpu_sum - cpu_sum) <= REL_TOL * math.abs(cpu_sum), gpu_sum .. ' vs ' .. cpu_sum)
    assert.are.equal('embedding: idx[4] = 9 is outside [0, 7) (tokenizer and model vocab disagree?)', cpu_error)
    assert.are.equal(cpu_error, gpu_error)
  end)

  it('layernorm forward and backward', function()
    if not gpu_or_skip() then return end
    agree('layernorm', cases.layernorm(N, CH, 6))
  end)

  -- A warp per row, grid-stride: past the launch cap of 1,048,560 blocks (8 rows each) the rows
  -- 8,388,480 on must be written too.
  it('layernorm writes rows past the grid cap of 8.4M', function()
    if not gpu_or_skip() then return end
    local ROWS, WIDTH = 8388480 + 1000, 2
    agree('layernorm (8.4M rows)', function(device)
      local inp = randn({ ROWS, WIDTH }, 10, device)
      local w, b = randn({ WIDTH }, 11, device), randn({ WIDTH }, 12, device)
      local out, mean, rstd = T.empty({ ROWS, WIDTH }, 'f32', device), T.zeros({ ROWS }, 'f32', device), T.zeros({ ROWS }, 'f32', device)
      check(C.wk_op_layernorm(out, mean, rstd, inp, w, b, 1e-5))
      return { out, mean, rstd }
    end)
  end)

  -- The residual add fused into the norm: on each device the very bits of add then the norm, and the
  -- GPU's within REL_TOL of the CPU's.
  for _, norm in ipairs({ 'layernorm', 'rmsnorm' }) do
    it(('add_%s at widths 8, 768 and 4096: the bits of add then %s, and the CPU\'s values'):format(norm, norm), function()
      if not gpu_or_skip() then return end
      for _, shape in ipairs(FUSED_SHAPES) do
        local name = ('add_%s [%d, %d]'):format(norm, shape[1], shape[2])
        agree(name, fused_as_pair(name, fused_norm(norm, 'f32', shape[1], shape[2], 80)))
      end
    end)
  end

  it('add_layernorm and add_rmsnorm write rows past the grid cap of 8.4M', function()
    if not gpu_or_skip() then return end
    for _, norm in ipairs({ 'layernorm', 'rmsnorm' }) do
      local name = ('add_%s (8.4M rows)'):format(norm)
      agree(name, fused_as_pair(name, fused_norm(norm, 'f32', 8388480 + 1000, 2, 90)))
    end
  end)

  for _, transpose in ipairs({ 0, 1 }) do
    it('matmul forward and backward, transpose_w = ' .. transpose, function()
      if not gpu_or_skip() then return end
      agree('matmul', cases.matmul(N, CH, 7, transpose, true, 10))
    end)
  end

  it('gelu forward and backward', function()
    if not gpu_or_skip() then return end
    agree('gelu', function(device)
      local inp, out, dinp = randn({ 64 }, 14, device), T.empty({ 64 }, 'f32', device), T.zeros({ 64 }, 'f32', device)
      check(C.wk_op_gelu(out, inp))
      check(C.wk_op_gelu_backward(dinp, randn({ 64 }, 15, device), inp))
      return { out, dinp }
    end)
  end)

  -- cuBLASLt's GELU_AUX_BIAS and DGELU epilogues, and (a hidden width of 13: an aux ld cuBLASLt
  -- refuses) the GEMM then elementwise.cu's GELU pass in their place.
  it('matmul with GELU in its epilogue, forward and backward, and its way without the epilogue', function()
    if not gpu_or_skip() then return end
    for _, transpose in ipairs({ 0, 1 }) do
      agree('matmul_gelu, transpose_w = ' .. transpose, cases.matmul_gelu(N, CH, 4 * CH, transpose, 20))
    end
    agree('matmul_gelu without the epilogue', cases.matmul_gelu(N, CH, 13, 0, 28))
  end)

  it('attention forward and backward', function()
    if not gpu_or_skip() then return end
    agree('attention', cases.attention(B, TT, CH, NH, 16))
  end)

  -- Realistic shapes: GPT-2's widths, rows and sequences not multiples of a warp or a block, so the
  -- tails of every tiling (cuBLAS, a warp per row, a block per row, row chunks) are exercised.
  it('matmul (GELU fused or not), layernorm and attention at GPT-2 widths', function()
    if not gpu_or_skip() then return end
    local rows, width, seq, heads = 2 * 257, 768, 257, 12
    for _, transpose in ipairs({ 0, 1 }) do
      agree('matmul 768 -> 2304, transpose_w = ' .. transpose, cases.matmul(rows, width, 3 * width, transpose, true, 30))
      agree('matmul_gelu 768 -> 3072, transpose_w = ' .. transpose, cases.matmul_gelu(rows, width, 4 * width, transpose, 50))
    end
    agree('matmul_gelu 768 -> 3070, without the epilogue', cases.matmul_gelu(rows, width, 3070, 0, 58))
    agree('layernorm 768', cases.layernorm(rows, width, 34))
    agree('attention T = 257, 12 heads', cases.attention(2, seq, width, heads, 38))
  end)

  it('cross-entropy over the GPT-2 vocabulary', function()
    if not gpu_or_skip() then return end
    local rows, vocab = 33, 50257
    agree('cross_entropy V = 50257', function(device)
      local logits = randn({ rows, vocab }, 40, device)
      local ids = {}
      for i = 1, rows do ids[i] = (i * 7919) % vocab end
      local targets = T.new(ids, 'i32', device)
      local losses, sum = T.empty({ rows }, 'f32', device), ffi.new('double[1]')
      check(C.wk_op_cross_entropy(losses, logits, targets, nil, rows, sum, nil))
      local dlogits = T.zeros({ rows, vocab }, 'f32', device)
      check(C.wk_op_cross_entropy_backward(dlogits, logits, targets, nil, rows, 1))
      return { losses, dlogits, T.new({ sum[0] }) }
    end)
  end)

  -- The reductions run in a fixed order (block partials, then one ordered sum), so a rerun gives the
  -- very bits: atomics would not.
  it('sums and gradient reductions are the same bits run after run', function()
    if not gpu_or_skip() then return end
    local rows, width = 4099, 768
    local inp, w, dout = randn({ rows, width }, 41, DEVICE), randn({ width }, 42, DEVICE), randn({ rows, width }, 43, DEVICE)
    local mean, rstd = T.empty({ rows }, 'f32', DEVICE), T.empty({ rows }, 'f32', DEVICE)
    check(C.wk_op_layernorm(T.empty({ rows, width }, 'f32', DEVICE), mean, rstd, inp, w, randn({ width }, 44, DEVICE), 1e-5))
    local function once()
      local sum = ffi.new('double[1]')
      check(C.wk_op_sumsq(inp, sum))
      local dinp, dw, db = T.zeros({ rows, width }, 'f32', DEVICE), T.zeros({ width }, 'f32', DEVICE), T.zeros({ width }, 'f32', DEVICE)
      check(C.wk_op_layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd))
      local dmm, dww, dbias = T.zeros({ rows, width }, 'f32', DEVICE), T.zeros({ width, 8 }, 'f32', DEVICE), T.zeros({ 8 }, 'f32', DEVICE)
      check(C.wk_op_matmul_backward(dmm, dww, dbias, dout:narrow(2, 1, 8):contiguous(), inp, randn({ width, 8 }, 45, DEVICE), 0))
      return { sum[0], bytes(dw), bytes(db), bytes(dbias) }
    end
    assert.are.same(once(), once())
  end)

  it('cross-entropy forward and backward with a mask', function()
    if not gpu_or_skip() then return end
    agree('cross_entropy', function(device)
      local logits = randn({ N, V }, 18, device)
      local targets = T.new({ 0, 1, 2, 3, 4, 5, 6, 7, 8, 10 }, 'i32', device)
      local mask = T.new({ 1, 1, 0, 1, 1, 1, 1, 0, 1, 1 }, 'u8', device)
      local losses, sum = T.empty({ N }, 'f32', device), ffi.new('double[1]')
      check(C.wk_op_cross_entropy(losses, logits, targets, mask, 8, sum, nil))
      local dlogits = T.zeros({ N, V }, 'f32', device)
      check(C.wk_op_cross_entropy_backward(dlogits, logits, targets, mask, 8, 1))
      return { losses, dlogits, T.new({ sum[0] }) }
    end)
  end)

  it('embedding and cross-entropy on strided views of a token batch', function()
    if not gpu_or_skip() then return end
    agree('strided indices', function(device)
      local tokens = T.new({ { 0, 4, 10, 2, 2, 6 }, { 1, 1, 3, 9, 7, 10 } }, 'i32', device)
      local inputs, targets = tokens:narrow(2, 1, TT), tokens:narrow(2, 2, TT)
      local wte, wpe, out = randn({ V, CH }, 3, device), randn({ TT, CH }, 4, device), T.empty({ B, TT, CH }, 'f32', device)
      check(C.wk_op_embedding(out, inputs, wte, wpe, nil))
      local dwte, dwpe = T.zeros({ V, CH }, 'f32', device), T.zeros({ TT, CH }, 'f32', device)
      check(C.wk_op_embedding_backward(dwte, dwpe, randn({ B, TT, CH }, 5, device), inputs))
      local logits, losses, sum = randn({ B, TT, V }, 18, device), T.empty({ B, TT }, 'f32', device), ffi.new('double[1]')
      check(C.wk_op_cross_entropy(losses, logits, targets, nil, N, sum, nil))
      local dlogits = T.zeros({ B, TT, V }, 'f32', device)
      check(C.wk_op_cross_entropy_backward(dlogits, logits, targets, nil, N, 1))
      return { out, dwte, dwpe, losses, dlogits, T.new({ sum[0] }) }
    end)
  end)

  it('adamw', function()
    if not gpu_or_skip() then return end
    agree('adamw', function(device)
      local p, g = randn({ 40 }, 19, device), randn({ 40 }, 20, device)
      local m, v = T.zeros({ 40 }, 'f32', device), T.zeros({ 40 }, 'f32', device)
      for step = 1, 3 do check(C.wk_op_adamw(p, g, m, v, 1e-2, 0.9, 0.95, 1e-8, 0.1, step, 0.5)) end
      return { p, m, v }
    end)
  end)

  it('a whole GPT step, with a caching allocator that stops calling cudaMalloc', function()
    if not gpu_or_skip() then return end
    local cfg = { vocab = 13, seq_len = 6, layers = 2, heads = 2, dim = 8, seed = 2 }
    local idx = T.new({ { 1, 5, 9, 2, 0, 12 }, { 3, 3, 8, 11, 4, 7 } }, 'i32')
    local targets = T.new({ { 5, 9, 2, 0, 12, 1 }, { 3, 8, 11, 4, 7, 12 } }, 'i32')
    local results = {}
    for _, device in ipairs({ 'cpu', DEVICE }) do
      cfg.device = device
      local model = wick.nn.gpt(cfg)
      local opt = wick.optim.adamw { lr = 1e-2 }
      local stats = ffi.new('WkAllocatorStats')
      local losses, allocs = {}, {}
      for step = 1, 3 do
        model:zero_grad()
        losses[step] = model:forward(idx, targets)
        model:backward()
        opt:step(model)
        C.wk_allocator_stats(device == 'cpu' and C.WK_DEVICE_CPU or C.WK_DEVICE_CUDA, 0, stats)
        allocs[step] = tonumber(stats.device_allocs)
      end
      results[device] = { losses = losses, allocs = allocs, params = model:flat_parameters().params }
    end
    for step = 1, 3 do
      local a, b = results[DEVICE].losses[step], results.cpu.losses[step]
      assert.is_true(math.abs(a - b) / b < REL_TOL, ('step %d loss %g vs %g'):format(step, a, b))
    end
    assert.is_true(relative_error(results[DEVICE].params, results.cpu.params) < 1e-3)
    assert.are.equal(results[DEVICE].allocs[2], results[DEVICE].allocs[3])
  end)
end)

-- Every op that takes activations, on bf16 and f16 storage: the CUDA kernels take the CPU's dtypes
-- (activations, their gradients and the weights' compute copy 2-byte; parameter gradients, layernorm
-- statistics and losses f32) and round as it does. Exact: add, the embedding and the fused norms' sum
-- (one f32 addition, rounded once). One rounding step: everything that sums (matmul, with GELU fused
-- or not, layernorm, attention, the loss gradient), gelu (tanhf) and axpy (fused multiply-add on the
-- GPU); two for the matmul's GELU without the epilogue. f32 outputs: REL_TOL.
for _, dtype in ipairs({ 'bf16', 'f16' }) do
  local function zeros(shape, device) return T.zeros(shape, dtype, device) end
  local function empty(shape, device) return T.empty(shape, dtype, device) end

  describe('CUDA agrees with the CPU on ' .. dtype .. ' storage #gpu', function()
    it('add, axpy, gelu forward and backward', function()
      if not gpu_or_skip() then return end
      agree_stored('elementwise', { [1] = true }, function(device)
        local a, b = randn_as(dtype, { 50 }, 1, device), randn_as(dtype, { 50 }, 2, device)
        local sum, y = empty({ 50 }, device), randn_as(dtype, { 50 }, 3, device)
        check(C.wk_op_add(sum, a, b))
        check(C.wk_op_axpy(y, 0.3, a))
        local inp, out, dinp = randn_as(dtype, { 64 }, 14, device), empty({ 64 }, device), randn_as(dtype, { 64 }, 16, device)
        check(C.wk_op_gelu(out, inp))
        check(C.wk_op_gelu_backward(dinp, randn_as(dtype, { 64 }, 15, device), inp))
        return { sum, y, out, dinp }
      end)
    end)

    it('embedding forward and backward, tables in ' .. dtype .. ', gradients f32', function()
      if not gpu_or_skip() then return end
      agree_stored('embedding', { [1] = true }, function(device)
        local idx = T.new({ { 0, 4, 10, 2, 2 }, { 1, 1, 3, 9, 7 } }, 'i32', device)
        local wte, wpe = randn_as(dtype, { V, CH }, 3, device), randn_as(dtype, { TT, CH }, 4, device)
        local out = empty({ B, TT, CH }, device)
        check(C.wk_op_embedding(out, idx, wte, wpe, nil))
        local dwte, dwpe = T.zeros({ V, CH }, 'f32', device), T.zeros({ TT, CH }, 'f32', device)
        check(C.wk_op_embedding_backward(dwte, dwpe, randn_as(dtype, { B, TT, CH }, 5, device), idx))
        return { out, dwte, dwpe }
      end)
    end)

    local function layernorm(rows, width, seed)
      agree_stored(('layernorm [%d, %d]'):format(rows, width), {}, function(device)
        local inp = randn_as(dtype, { rows, width }, seed, device)
        local w, b = randn_as(dtype, { width }, seed + 1, device), randn_as(dtype, { width }, seed + 2, device)
        local out, mean, rstd = empty({ rows, width }, device), T.empty({ rows }, 'f32', device), T.empty({ rows }, 'f32', device)
        check(C.wk_op_layernorm(out, mean, rstd, inp, w, b, 1e-5))
        local dinp, dw, db = randn_as(dtype, { rows, width }, seed + 3, device), T.zeros({ width }, 'f32', device), T.zeros({ width }, 'f32', device)
        check(C.wk_op_layernorm_backward(dinp, dw, db, randn_as(dtype, { rows, width }, seed + 4, device), inp, w, mean, rstd))
        return { out, mean, rstd, dinp, dw, db }
      end)
    end

    local function matmul(rows, width, OC, transpose, seed)
      agree_stored(('matmul %d -> %d, transpose_w = %d'):format(width, OC, transpose), {}, function(device)
        local inp, bias = randn_as(dtype, { rows, width }, seed, device), randn_as(dtype, { OC }, seed + 1, device)
        local w = randn_as(dtype, transpose == 1 and { OC, width } or { width, OC }, seed + 2, device)
        local out = empty({ rows, OC }, device)
        check(C.wk_op_matmul(out, inp, w, bias, transpose))
        local unbiased = empty({ rows, OC }, device)
        check(C.wk_op_matmul(unbiased, inp, w, nil, transpose))
        local dinp = randn_as(dtype, { rows, width }, seed + 3, device)  -- accumulated into, as dw and db are
        local dw, db = randn(w.shape, seed + 4, device), randn({ OC }, seed + 5, device)
        check(C.wk_op_matmul_backward(dinp, dw, db, randn_as(dtype, { rows, OC }, seed + 6, device), inp, w, transpose))
        return { out, unbiased, dinp, dw, db }
      end)
    end

    -- The backward reads the CPU forward's probabilities on both devices, so that it is checked on
    -- the same inputs (a P one step apart would move dqkv by more than a step in places).
    local function attention(batch, seq, width, heads, seed)
      local name = ('attention [%d, %d, %d], %d heads'):format(batch, seq, width, heads)
      local qkv_cpu = randn_as(dtype, { batch, seq, 3 * width }, seed, 'cpu')
      local att_cpu = empty({ batch, heads, seq, seq }, 'cpu')
      check(C.wk_op_attention(empty({ batch, seq, width }, 'cpu'), att_cpu, qkv_cpu, heads))
      agree_stored(name, {}, function(device)
        local qkv = randn_as(dtype, { batch, seq, 3 * width }, seed, device)
        local out, att = empty({ batch, seq, width }, device), empty({ batch, heads, seq, seq }, device)
        check(C.wk_op_attention(out, att, qkv, heads))
        local dqkv = zeros(qkv.shape, device)
        local P = device == 'cpu' and att_cpu or att_cpu:to(device)
        check(C.wk_op_attention_backward(dqkv, randn_as(dtype, { batch, seq, width }, seed + 2, device), qkv, P, heads))
        return { out, att, dqkv }
      end)
    end

    local function cross_entropy(rows, vocab, masked, seed)
      agree_stored(('cross_entropy [%d, %d]%s'):format(rows, vocab, masked and ' with a mask' or ''), {}, function(device)
        local logits = randn_as(dtype, { rows, vocab }, seed, device)
        local ids, keep = {}, {}
        for i = 1, rows do
          ids[i], keep[i] = (i * 7919) % vocab, (masked and i % 4 == 3) and 0 or 1
        end
        local targets, mask = T.new(ids, 'i32', device), masked and T.new(keep, 'u8', device) or nil
        local losses, sum = T.empty({ rows }, 'f32', device), ffi.new('double[1]')
        check(C.wk_op_cross_entropy(losses, logits, targets, mask, rows, sum, nil))
        local dlogits = zeros({ rows, vocab }, device)  -- from zero: most entries are far below a step of 1
        check(C.wk_op_cross_entropy_backward(dlogits, logits, targets, mask, rows, 1))
        return { losses, T.new({ sum[0] }), dlogits }
      end)
    end

    -- pre, out and dpre a step from the CPU's with the epilogue (both take the GELU of the unrounded
    -- f32 product), two without it (the GELU pass reads the product rounded).
    local function matmul_gelu(rows, width, hidden, transpose, seed)
      local epilogue = hidden % 8 == 0
      agree_stored(('matmul_gelu %d -> %d, transpose_w = %d'):format(width, hidden, transpose), {},
        cases.matmul_gelu(rows, width, hidden, transpose, seed, dtype), epilogue and 1 or 2)
    end

    it('layernorm, matmul (GELU fused or not), attention and cross-entropy at toy shapes', function()
      if not gpu_or_skip() then return end
      layernorm(N, CH, 6)
      for _, transpose in ipairs({ 0, 1 }) do matmul(N, CH, 7, transpose, 10) end
      for _, transpose in ipairs({ 0, 1 }) do matmul_gelu(N, CH, 4 * CH, transpose, 20) end
      matmul_gelu(N, CH, 13, 0, 28)
      attention(B, TT, CH, NH, 16)
      cross_entropy(N, V, true, 18)
    end)

    it('layernorm, matmul (GELU fused or not), attention and cross-entropy at GPT-2 widths', function()
      if not gpu_or_skip() then return end
      local rows, width = 2 * 257, 768
      layernorm(rows, width, 34)
      for _, transpose in ipairs({ 0, 1 }) do matmul(rows, width, 3 * width, transpose, 30) end
      for _, transpose in ipairs({ 0, 1 }) do matmul_gelu(rows, width, 4 * width, transpose, 50) end
      matmul_gelu(rows, width, 3070, 0, 58)
      attention(2, 257, width, 12, 38)
      cross_entropy(33, 50257, false, 40)
    end)

    it('add_layernorm and add_rmsnorm at widths 8, 768 and 4096: the sum exact, the norm within a step', function()
      if not gpu_or_skip() then return end
      for _, norm in ipairs({ 'layernorm', 'rmsnorm' }) do
        for _, shape in ipairs(FUSED_SHAPES) do
          local name = ('add_%s [%d, %d]'):format(norm, shape[1], shape[2])
          agree_stored(name, { [1] = true }, fused_as_pair(name, fused_norm(norm, dtype, shape[1], shape[2], 84)))
        end
      end
    end)

    it('refuses a parameter gradient in ' .. dtype .. ' by name, as the CPU does', function()
      if not gpu_or_skip() then return end
      local inp, w = randn_as(dtype, { N, CH }, 6, DEVICE), randn_as(dtype, { CH, 7 }, 7, DEVICE)
      assert.has_error(function()
        check(C.wk_op_matmul_backward(zeros({ N, CH }, DEVICE), zeros({ CH, 7 }, DEVICE), nil, zeros({ N, 7 }, DEVICE), inp, w, 0))
      end, ('matmul_backward: dw is [8, 7] %s %s, expected [8, 7] f32, contiguous'):format(dtype, DEVICE))
    end)
  end)
end

-- A bf16 GPT on the GPU against the CPU's bf16: the loss, every weight gradient, and the loss after
-- an AdamW step (which refreshes the bf16 compute copy by a cast on the device). A step apart in one
-- op moves the ops after it by about a step, so the gradients get a few steps (4) of the largest.
describe('a bf16 GPT on CUDA agrees with the CPU\'s bf16 #gpu', function()
  it('forward, backward, an AdamW step and the next forward', function()
    if not gpu_or_skip() then return end
    local cfg = { vocab = 13, seq_len = 6, layers = 2, heads = 2, dim = 8, seed = 2, precision = 'bf16' }
    local idx = T.new({ { 1, 5, 9, 2, 0, 12 }, { 3, 3, 8, 11, 4, 7 } }, 'i32')
    local targets = T.new({ { 5, 9, 2, 0, 12, 1 }, { 3, 8, 11, 4, 7, 12 } }, 'i32')
    local results = {}
    for _, device in ipairs({ 'cpu', DEVICE }) do
      cfg.device = device
      local model, opt = wick.nn.gpt(cfg), wick.optim.adamw { lr = 1e-2 }
      model:zero_grad()
      local loss = model:forward(idx, targets)
      model:backward()
      assert.are.equal('bf16', model.logits.dtype)
      assert.are.equal(device, model.logits.device)
      local grads = model:flat_parameters().grads:to('cpu')
      opt:step(model)
      results[device] = { loss = loss, grads = grads, next_loss = model:forward(idx, targets) }
      local flat = model:flat_parameters()  -- the forward refreshed the compute copy: the masters cast on the device
      assert.are.equal(bytes(flat.params:to('cpu'):to('bf16')), bytes(flat.compute), 'the bf16 compute copy on ' .. device)
    end
    local gpu, cpu = results[DEVICE], results.cpu
    assert.is_true(math.abs(gpu.loss - cpu.loss) / cpu.loss <= STEP.bf16, ('loss %g vs %g'):format(gpu.loss, cpu.loss))
    local err = relative_error(gpu.grads, cpu.grads)
    assert.is_true(err <= 4 * STEP.bf16, ('weight gradients: relative error %.3g'):format(err))
    assert.is_true(math.abs(gpu.next_loss - cpu.next_loss) / cpu.next_loss <= STEP.bf16,
      ('loss after a step %g vs %g'):format(gpu.next_loss, cpu.next_loss))
  end)
end)

-- Generation on the device: the caches, the cached attention and the steps' logits stay there; the
-- sampler reads the last position's logits copied to the host. Greedy decoding of an f32 model then
-- picks what the CPU picks: the logits agree to REL_TOL, and on the CPU each model's two likeliest
-- ids are never closer than 4e-3 of its largest logit (the GPT-2's 2.9e-2).
describe('a Llama and a GPT-2 on CUDA generate what they generate on the CPU #gpu', function()
  local MODELS = {
    llama = function(device)
      return wick.nn.llama { vocab = 32, dim = 16, layers = 2, heads = 4, kv_heads = 2, ffn_dim = 24, max_positions = 16,
        seed = 5, device = device }
    end,
    gpt2 = function(device)
      return wick.nn.gpt { vocab = 32, seq_len = 16, layers = 2, heads = 4, dim = 16, seed = 5, device = device }
    end,
  }
  for _, name in ipairs({ 'llama', 'gpt2' }) do
    it(name .. ': greedy, from a prompt of two rows', function()
      if not gpu_or_skip() then return end
      local prompt = T.new({ { 1, 5, 9, 2 }, { 3, 3, 8, 11 } }, 'i32')
      local generated = {}
      for _, device in ipairs({ 'cpu', DEVICE }) do
        local model = MODELS[name](device)
        local out = model:generate(prompt, { max_new_tokens = 8 })
        generated[device] = bytes(out)
        out:free()
        model:free()
      end
      assert.are.equal(generated.cpu, generated[DEVICE])
    end)
  end
end)

-- The Llama-family ops (runtime/ops/cuda/{rmsnorm,rope,swiglu,qkv_pack,attention_cached}.cu) against
-- the CPU, on f32 storage (REL_TOL) and on bf16 (one rounding step; the packing and the caches copy
-- bits, so qkv and the caches are exact).
-- The gradients are accumulated into inputs that are not zero, as the model's are. Shapes: 2 query
-- heads per kv head (grouped-query attention), an odd number of rows, and a RoPE start past 0.
local function llama_ops(dtype, device)
  local rows, width, heads, kv_heads, hs, ffn = 2 * 7, 24, 4, 2, 6, 20
  local function act(shape, seed) return randn_as(dtype, shape, seed, device) end
  local inp, w = act({ rows, width }, 50), act({ width }, 51)
  local norm, rstd = T.empty({ rows, width }, dtype, device), T.empty({ rows }, 'f32', device)
  check(C.wk_op_rmsnorm(norm, rstd, inp, w, 1e-5))
  local dnorm, dw = act({ rows, width }, 52), randn({ width }, 53, device)
  check(C.wk_op_rmsnorm_backward(dnorm, dw, act({ rows, width }, 54), inp, w, rstd))

  local inv_freq = T.empty({ hs / 2 }, 'f32', device)
  check(C.wk_op_rope_frequencies(inv_freq, C.WK_ROPE_DEFAULT, 10000, 0, 0, 0, 0))
  local x = act({ 2, 7, width }, 55)
  local rotated, drot = T.empty({ 2, 7, width }, dtype, device), act({ 2, 7, width }, 56)
  check(C.wk_op_rope(rotated, x, inv_freq, heads, 3))
  check(C.wk_op_rope_backward(drot, act({ 2, 7, width }, 57), inv_freq, heads, 3))

  local gate, up = act({ rows, ffn }, 58), act({ rows, ffn }, 59)
  local gated, dgate, dup = T.empty({ rows, ffn }, dtype, device), act({ rows, ffn }, 60), act({ rows, ffn }, 61)
  check(C.wk_op_swiglu(gated, gate, up))
  check(C.wk_op_swiglu_backward(dgate, dup, act({ rows, ffn }, 62), gate, up))

  local q, k, v = act({ 2, 7, heads * hs }, 63), act({ 2, 7, kv_heads * hs }, 64), act({ 2, 7, kv_heads * hs }, 65)
  local qkv = T.empty({ 2, 7, 3 * heads * hs }, dtype, device)
  check(C.wk_op_qkv_pack(qkv, q, k, v, heads, kv_heads))
  local dq, dk, dv = act(q.shape, 66), act(k.shape, 67), act(v.shape, 68)
  check(C.wk_op_qkv_pack_backward(dq, dk, dv, act(qkv.shape, 69), heads, kv_heads))

  -- generation: 5 positions into an empty cache of 9, then 2 more against what they left
  local k_cache, v_cache = T.zeros({ 2, 9, kv_heads * hs }, dtype, device), T.zeros({ 2, 9, kv_heads * hs }, dtype, device)
  local prefill, decoded = T.empty({ 2, 5, heads * hs }, dtype, device), T.empty({ 2, 2, heads * hs }, dtype, device)
  check(C.wk_op_attention_cached(prefill, act({ 2, 5, heads * hs }, 70), act({ 2, 5, kv_heads * hs }, 71),
    act({ 2, 5, kv_heads * hs }, 72), k_cache, v_cache, heads, kv_heads, 0))
  check(C.wk_op_attention_cached(decoded, act({ 2, 2, heads * hs }, 73), act({ 2, 2, kv_heads * hs }, 74),
    act({ 2, 2, kv_heads * hs }, 75), k_cache, v_cache, heads, kv_heads, 5))
  return { norm, rstd, dnorm, dw, rotated, drot, gated, dgate, dup, qkv, dq, dk, dv, k_cache, v_cache, prefill, decoded }
end

describe('the Llama-family ops on CUDA agree with the CPU #gpu', function()
  it('rmsnorm, rope, swiglu, qkv_pack and cached attention, forward and backward, on f32 storage', function()
    if not gpu_or_skip() then return end
    agree('Llama ops (f32)', function(device) return llama_ops('f32', device) end)
  end)

  it('rmsnorm, rope, swiglu, qkv_pack and cached attention, forward and backward, on bf16 storage', function()
    if not gpu_or_skip() then return end
    agree_stored('Llama ops (bf16)', { [10] = true, [14] = true, [15] = true },
      function(device) return llama_ops('bf16', device) end)
  end)

  it('rmsnorm backward sums dweight over more rows than blocks, the same bits run after run', function()
    if not gpu_or_skip() then return end
    local rows, width = 4099, 96
    local function run(device)
      local inp, w = randn({ rows, width }, 70, device), randn({ width }, 71, device)
      local out, rstd = T.empty({ rows, width }, 'f32', device), T.empty({ rows }, 'f32', device)
      check(C.wk_op_rmsnorm(out, rstd, inp, w, 1e-6))
      local dinp, dw = T.zeros({ rows, width }, 'f32', device), T.zeros({ width }, 'f32', device)
      check(C.wk_op_rmsnorm_backward(dinp, dw, randn({ rows, width }, 72, device), inp, w, rstd))
      return { out, rstd, dinp, dw }
    end
    agree('rmsnorm (4099 rows)', run)
    assert.are.equal(bytes(run(DEVICE)[4]), bytes(run(DEVICE)[4]), 'dweight differs between two runs')
  end)
end)

-- A Llama (grouped-query attention, RoPE, SwiGLU, RMSNorm) on CUDA against the CPU: the loss and every
-- weight gradient, in f32 and in bf16 (where a step apart in one op moves the later ones by about a
-- step, as for the bf16 GPT above).
for _, case in ipairs({ { precision = 'fp32', loss = REL_TOL, grads = 10 * REL_TOL }, { precision = 'bf16', loss = STEP.bf16, grads = 4 * STEP.bf16 } }) do
  describe('a ' .. case.precision .. ' Llama on CUDA agrees with the CPU #gpu', function()
    it('forward and backward', function()
      if not gpu_or_skip() then return end
      local cfg = { vocab = 13, dim = 16, layers = 2, heads = 4, kv_heads = 2, ffn_dim = 24, max_positions = 8, seed = 3,
                    precision = case.precision }
      local idx = T.new({ { 1, 5, 9, 2, 0, 12 }, { 3, 3, 8, 11, 4, 7 } }, 'i32')
      local targets = T.new({ { 5, 9, 2, 0, 12, 1 }, { 3, 8, 11, 4, 7, 12 } }, 'i32')
      local results = {}
      for _, device in ipairs({ 'cpu', DEVICE }) do
        cfg.device = device
        local model = wick.nn.llama(cfg)
        model:zero_grad()
        local loss = model:forward(idx, targets)
        model:backward()
        assert.are.equal(device, model.logits.device)
        results[device] = { loss = loss, grads = model:flat_parameters().grads:to('cpu') }
      end
      local gpu, cpu = results[DEVICE], results.cpu
      assert.is_true(math.abs(gpu.loss - cpu.loss) / cpu.loss <= case.loss, ('loss %g vs %g'):format(gpu.loss, cpu.loss))
      local err = relative_error(gpu.grads, cpu.grads)
      assert.is_true(err <= case.grads, ('weight gradients: relative error %.3g'):format(err))
    end)
  end)
end

describe('a loader on the GPU #gpu', function()
  local helper = require 'helper'
  local data_helper = require 'helpers.data'
  local SEQ = 16
  local root, corpus

  setup(function()
    root = helper.tmpdir()
    corpus = data_helper.make_dataset(root .. '/corpus', data_helper.documents(400, 40, 1), { shard_size = 1024 })
  end)
  teardown(function() helper.rmtree(root) end)

  local function loader(opts)
    local o = { data = corpus, seq_len = SEQ, global_batch = 8, micro_batch = 2, world_size = 1, rank = 0, seed = 7,
      document_ids = true }
    for k, v in pairs(opts or {}) do o[k] = v end
    return wick.data.loader(o)
  end

  it('hands out device tensors holding the very batches of a CPU loader', function()
    if not gpu_or_skip() then return end
    local cpu, gpu = loader(), loader { device = DEVICE }
    for _ = 1, 60 do
      local a, b = cpu:next(), gpu:next()
      for _, key in ipairs({ 'tokens', 'inputs', 'targets', 'loss_mask', 'doc_ids', 'positions' }) do
        assert.are.equal(DEVICE, b[key].device, key)
        local host = b[key]:to('cpu')
        assert.are.same(a[key]:totable(), host:totable(), key)
        host:free()
      end
      assert.are.equal(a.fingerprint, b.fingerprint)
    end
    assert.are.equal(cpu:state(), gpu:state())
    cpu:close()
    gpu:close()
  end)

  it('feeds a model on the device in place, with the copies ordered before the ops that read them', function()
    if not gpu_or_skip() then return end
    local l = loader { device = DEVICE }
    local model = wick.nn.gpt { vocab = 257, seq_len = SEQ, layers = 1, heads = 2, dim = 8, seed = 3, device = DEVICE }
    local reference = loader()
    local cpu_model = wick.nn.gpt { vocab = 257, seq_len = SEQ, layers = 1, heads = 2, dim = 8, seed = 3 }
    for _ = 1, 8 do
      local batch, expected = l:next(), reference:next()
      local loss = model:forward(batch.inputs, batch.targets, batch.loss_mask)
      assert.are.equal(batch.inputs:data(), model.given.idx:data())
      local want = cpu_model:forward(expected.inputs, expected.targets, expected.loss_mask)
      assert.is_true(math.abs(loss - want) / want < REL_TOL, ('loss %g vs %g'):format(loss, want))
    end
    model:free()
    cpu_model:free()
    l:close()
    reference:close()
  end)
end)
