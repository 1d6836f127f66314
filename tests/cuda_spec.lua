-- CUDA against the CPU reference, op by op and for a whole GPT step (tag: gpu). Runs with
-- `make test-gpu`; on a machine without a GPU each test is skipped with the reason, unless
-- WICK_REQUIRE_GPU=1 demands one. Inputs come from the counter-based generator, which gives the
-- same values on both devices; outputs must agree within 1e-4 relative (atomics and cuBLAS sum in
-- another order than the CPU).
local ffi = require 'ffi'
local wick = require 'wick'
local core = require 'wick.core'
local T = wick.tensor
local C = core.C
local check = core.check

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

local function relative_error(a, b)
  local ha, hb = a:to('cpu', 'f32'), b:to('cpu', 'f32')
  local pa, pb = ffi.cast('float *', ha:data()), ffi.cast('float *', hb:data())
  local diff, scale = 0, 0
  for i = 0, ha:numel() - 1 do
    diff = math.max(diff, math.abs(pa[i] - pb[i]))
    scale = math.max(scale, math.abs(pb[i]))
  end
  return scale == 0 and diff or diff / scale
end

-- run(device) builds inputs on device, runs the op(s) and returns the tensors to compare.
local function agree(name, run)
  local cpu, gpu = run('cpu'), run(DEVICE)
  for k = 1, #cpu do
    local err = relative_error(gpu[k], cpu[k])
    assert.is_true(err < REL_TOL, ('%s output %d: relative error %.3g'):format(name, k, err))
  end
end

local function randn(shape, seed, device) return T.randn(shape, { seed = seed, device = device }) end

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

  local function bytes(t)
    local host = t.device == 'cpu' and t or t:to('cpu')
    return ffi.string(host:data(), host:nbytes())
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
    agree('embedding', function(device)
      local idx = T.new({ { 0, 4, 10, 2, 2 }, { 1, 1, 3, 9, 7 } }, 'i32', device)
      local wte, wpe, out = randn({ V, CH }, 3, device), randn({ TT, CH }, 4, device), T.empty({ B, TT, CH }, 'f32', device)
      check(C.wk_op_embedding(out, idx, wte, wpe))
      local dwte, dwpe = T.zeros({ V, CH }, 'f32', device), T.zeros({ TT, CH }, 'f32', device)
      check(C.wk_op_embedding_backward(dwte, dwpe, randn({ B, TT, CH }, 5, device), idx))
      return { out, dwte, dwpe }
    end)
    local bad = T.new({ { 0, 11, 0, 0, 0 }, { 0, 0, 0, 0, 0 } }, 'i32', DEVICE)
    assert.has_error(function()
      check(C.wk_op_embedding(T.empty({ B, TT, CH }, 'f32', DEVICE), bad, randn({ V, CH }, 3, DEVICE), randn({ TT, CH }, 4, DEVICE)))
    end)
  end)

  it('layernorm forward and backward', function()
    if not gpu_or_skip() then return end
    agree('layernorm', function(device)
      local inp, w, b = randn({ N, CH }, 6, device), randn({ CH }, 7, device), randn({ CH }, 8, device)
      local out, mean, rstd = T.empty({ N, CH }, 'f32', device), T.empty({ N }, 'f32', device), T.empty({ N }, 'f32', device)
      check(C.wk_op_layernorm(out, mean, rstd, inp, w, b, 1e-5))
      local dinp, dw, db = T.zeros({ N, CH }, 'f32', device), T.zeros({ CH }, 'f32', device), T.zeros({ CH }, 'f32', device)
      check(C.wk_op_layernorm_backward(dinp, dw, db, randn({ N, CH }, 9, device), inp, w, mean, rstd))
      return { out, mean, rstd, dinp, dw, db }
    end)
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

  for _, transpose in ipairs({ 0, 1 }) do
    it('matmul forward and backward, transpose_w = ' .. transpose, function()
      if not gpu_or_skip() then return end
      agree('matmul', function(device)
        local OC = 7
        local inp, bias = randn({ N, CH }, 10, device), randn({ OC }, 11, device)
        local w = randn(transpose == 1 and { OC, CH } or { CH, OC }, 12, device)
        local out = T.empty({ N, OC }, 'f32', device)
        check(C.wk_op_matmul(out, inp, w, bias, transpose))
        local dinp, dw, db = T.zeros({ N, CH }, 'f32', device), T.zeros(w.shape, 'f32', device), T.zeros({ OC }, 'f32', device)
        check(C.wk_op_matmul_backward(dinp, dw, db, randn({ N, OC }, 13, device), inp, w, transpose))
        return { out, dinp, dw, db }
      end)
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

  it('attention forward and backward', function()
    if not gpu_or_skip() then return end
    agree('attention', function(device)
      local qkv = randn({ B, TT, 3 * CH }, 16, device)
      local out, att = T.empty({ B, TT, CH }, 'f32', device), T.empty({ B, NH, TT, TT }, 'f32', device)
      check(C.wk_op_attention(out, att, qkv, NH))
      local dqkv = T.zeros(qkv.shape, 'f32', device)
      check(C.wk_op_attention_backward(dqkv, randn({ B, TT, CH }, 17, device), qkv, att, NH))
      return { out, att, dqkv }
    end)
  end)

  -- Realistic shapes: GPT-2's widths, rows and sequences not multiples of a warp or a block, so the
  -- tails of every tiling (cuBLAS, a warp per row, a block per row, row chunks) are exercised.
  it('matmul, layernorm and attention at GPT-2 widths', function()
    if not gpu_or_skip() then return end
    local rows, width, seq, heads = 2 * 257, 768, 257, 12
    for _, transpose in ipairs({ 0, 1 }) do
      agree('matmul 768 -> 2304, transpose_w = ' .. transpose, function(device)
        local inp, bias = randn({ rows, width }, 30, device), randn({ 3 * width }, 31, device)
        local w = randn(transpose == 1 and { 3 * width, width } or { width, 3 * width }, 32, device)
        local out = T.empty({ rows, 3 * width }, 'f32', device)
        check(C.wk_op_matmul(out, inp, w, bias, transpose))
        local dinp, dw, db = T.zeros({ rows, width }, 'f32', device), T.zeros(w.shape, 'f32', device), T.zeros({ 3 * width }, 'f32', device)
        check(C.wk_op_matmul_backward(dinp, dw, db, randn({ rows, 3 * width }, 33, device), inp, w, transpose))
        return { out, dinp, dw, db }
      end)
    end
    agree('layernorm 768', function(device)
      local inp, w, b = randn({ rows, width }, 34, device), randn({ width }, 35, device), randn({ width }, 36, device)
      local out, mean, rstd = T.empty({ rows, width }, 'f32', device), T.empty({ rows }, 'f32', device), T.empty({ rows }, 'f32', device)
      check(C.wk_op_layernorm(out, mean, rstd, inp, w, b, 1e-5))
      local dinp, dw, db = T.zeros({ rows, width }, 'f32', device), T.zeros({ width }, 'f32', device), T.zeros({ width }, 'f32', device)
      check(C.wk_op_layernorm_backward(dinp, dw, db, randn({ rows, width }, 37, device), inp, w, mean, rstd))
      return { out, mean, rstd, dinp, dw, db }
    end)
    agree('attention T = 257, 12 heads', function(device)
      local qkv = randn({ 2, seq, 3 * width }, 38, device)
      local out, att = T.empty({ 2, seq, width }, 'f32', device), T.empty({ 2, heads, seq, seq }, 'f32', device)
      check(C.wk_op_attention(out, att, qkv, heads))
      local dqkv = T.zeros(qkv.shape, 'f32', device)
      check(C.wk_op_attention_backward(dqkv, randn({ 2, seq, width }, 39, device), qkv, att, heads))
      return { out, att, dqkv }
    end)
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
      check(C.wk_op_cross_entropy(losses, logits, targets, nil, rows, sum))
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
      check(C.wk_op_cross_entropy(losses, logits, targets, mask, 8, sum))
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
      check(C.wk_op_embedding(out, inputs, wte, wpe))
      local dwte, dwpe = T.zeros({ V, CH }, 'f32', device), T.zeros({ TT, CH }, 'f32', device)
      check(C.wk_op_embedding_backward(dwte, dwpe, randn({ B, TT, CH }, 5, device), inputs))
      local logits, losses, sum = randn({ B, TT, V }, 18, device), T.empty({ B, TT }, 'f32', device), ffi.new('double[1]')
      check(C.wk_op_cross_entropy(losses, logits, targets, nil, N, sum))
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

describe('a loader on the GPU #gpu', function()
  local helper = require 'helper'
  local data_helper = require 'data_helper'
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
      assert.are.equal(batch.inputs:data(), model.idx:data())
      local want = cpu_model:forward(expected.inputs, expected.targets, expected.loss_mask)
      assert.is_true(math.abs(loss - want) / want < REL_TOL, ('loss %g vs %g'):format(loss, want))
    end
    model:free()
    cpu_model:free()
    l:close()
    reference:close()
  end)
end)
