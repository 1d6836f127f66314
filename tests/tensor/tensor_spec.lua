-- wick.tensor: shapes, dtypes, views, copies and casts, printing, ownership, the ABI of its structs.
local ffi = require 'ffi'
local wick = require 'wick'
local core = require 'wick.core'
local T = wick.tensor
local C = core.C

describe('tensor', function()
  it('has shape, dtype, device and row-major contiguous strides', function()
    local t = T.zeros({ 2, 3, 4 }, 'f32')
    assert.are.same({ 2, 3, 4 }, t.shape)
    assert.are.equal('f32', t.dtype)
    assert.are.equal('cpu', t.device)
    assert.are.equal(24, t:numel())
    assert.are.equal(4, t:size(-1))
    assert.are.equal(12, tonumber(C.wk_tensor_stride(t, 0)))
    assert.is_true(t:is_contiguous())
    t:free()
  end)

  it('builds from nested tables and reads elements back 1-based', function()
    local t = T.new({ { 1, 2, 3 }, { 4, 5, 6 } }, 'i32')
    assert.are.equal(6, t:get(2, 3))
    t:set(1, 2, -7)
    assert.are.same({ { 1, -7, 3 }, { 4, 5, 6 } }, t:totable())
    assert.has_error(function() t:get(3, 1) end, 'index 3 out of range 1..2 in dim 1')
    assert.has_error(function() T.new({ { 1, 2 }, { 3 } }) end)
  end)

  it('supports every dtype with its element size', function()
    local sizes = { f32 = 4, bf16 = 2, f16 = 2, i32 = 4, i64 = 8, u16 = 2, u8 = 1 }
    for name, size in pairs(sizes) do
      local t = T.full({ 3 }, 2, name)
      assert.are.equal(name, t.dtype)
      assert.are.equal(size, tonumber(C.wk_dtype_size(T.DTYPES[name])))
      assert.are.same({ 2, 2, 2 }, t:totable())
    end
    assert.has_error(function() T.empty({ 2 }, 'f64') end)
  end)

  it('rounds to nearest even when casting to bf16 and f16, with f16 overflow to inf', function()
    local t = T.new({ 1 / 3, 65504, 70000, -1e-8, 1 + 2 ^ -9 })
    local h = t:to('f16'):float():totable()
    assert.are.equal(0.333251953125, h[1])
    assert.are.equal(65504, h[2])
    assert.are.equal(math.huge, h[3])
    assert.are.equal(-0.0, h[4])
    local b = t:to('bf16'):float():totable()
    assert.are.equal(0.333984375, b[1])
    assert.are.equal(1, b[5])  -- a tie rounds to the even mantissa
    assert.are.equal(70144, b[3])
  end)

  it('keeps f16 subnormals and rounds f32 in place like a store would', function()
    local t = T.new({ 2 ^ -24, 3 * 2 ^ -25, 1e-3 })
    assert.are.same({ 2 ^ -24, 2 ^ -23, 0.0010004043579101562 }, t:to('f16'):float():totable())
    core.check(C.wk_op_round(t, T.DTYPES.bf16))
    assert.are.equal(0.00099945068359375, t:get(3))
  end)

  it('views share storage; narrow makes a strided view that contiguous() copies', function()
    local t = T.new({ { 1, 2, 3 }, { 4, 5, 6 } })
    local v = t:view({ 3, 2 })
    v:set(3, 2, 60)
    assert.are.equal(60, t:get(2, 3))
    local col = t:narrow(2, 2, 2)
    assert.is_false(col:is_contiguous())
    assert.are.same({ { 2, 3 }, { 5, 60 } }, col:contiguous():totable())
    assert.are.equal(1, C.wk_tensor_same_storage(t, col))
    t:free()  -- the views keep the storage alive
    assert.are.same({ { 2, 3 }, { 5, 60 } }, col:totable())
    assert.has_error(function() col:view({ 4 }) end, 'view needs a contiguous tensor (use :contiguous() first)')
    assert.has_error(function() col:narrow(2, 2, 2) end)
  end)

  it('expands dims of size 1 and new leading dims with stride 0, without a copy', function()
    local row = T.new({ { 1, 2, 3 } })
    local rows = row:expand({ 2, 2, 3 })
    assert.are.same({ 2, 2, 3 }, rows.shape)
    assert.are.equal(12, rows:numel())
    assert.are.same({ { { 1, 2, 3 }, { 1, 2, 3 } }, { { 1, 2, 3 }, { 1, 2, 3 } } }, rows:totable())
    assert.are.equal(0, tonumber(C.wk_tensor_stride(rows, 1)))
    row:set(1, 2, 20)
    assert.are.equal(20, rows:get(2, 1, 2))
    assert.has_error(function() row:expand({ 2, 4 }) end, 'expand: [1, 3] to [2, 4]: only dims of size 1 repeat')
    assert.has_error(function() row:expand({ 3 }) end, 'expand: [3] has fewer dims than the tensor')
    rows:free()
    row:free()
  end)

  it('refuses a view that reaches outside its storage', function()
    local t = T.zeros({ 4 })
    local shape, strides = ffi.new('int64_t[1]', 3), ffi.new('int64_t[1]', 2)
    assert.is_true(C.wk_tensor_view(t, 0, 1, shape, strides) == nil)
    assert.are.equal(C.WK_ERR_INVALID_ARG, C.wk_last_status())
    assert.matches('outside the storage', core.last_error())
  end)

  it('borrows foreign memory without copying or freeing it', function()
    local buffer = ffi.new('int32_t[6]', { 1, 2, 3, 4, 5, 6 })
    local t = T.borrow(buffer, { 2, 3 }, 'i32', buffer)
    assert.are.equal(6, t:get(2, 3))
    buffer[0] = 10
    assert.are.equal(10, t:get(1, 1))
    t:set(2, 1, 40)
    assert.are.equal(40, buffer[3])
    t:free()
    assert.are.equal(40, buffer[3])  -- still ours (ASan would flag a free of ffi memory)
    assert.has_error(function() T.borrow(nil, { 2 }, 'i32') end, 'borrow: data is NULL')
  end)

  it('prints shape, dtype, device and elides long dims', function()
    local t = T.new({ { 1, 2, 3, 4, 5, 6, 7, 8 } })
    assert.are.equal('tensor([1, 8] f32 cpu)\n[[1, 2, 3, ..., 6, 7, 8]]', tostring(t))
    assert.are.equal('tensor([2] i64 cpu)\n[0, 0]', tostring(T.zeros({ 2 }, 'i64')))
  end)

  it('frees idempotently and refuses use after free', function()
    local t = T.zeros({ 2 })
    t:free()
    t:free()
    assert.are.equal('tensor(freed)', tostring(t))
    assert.has_error(function() return t.shape end, 'tensor used after free()')
  end)

  it('copies convert dtypes and check element counts', function()
    local a = T.new({ 1.5, -2.5, 3 })
    local i = T.empty({ 3 }, 'i64'):copy(a)
    assert.are.same({ 1, -2, 3 }, i:totable())
    assert.has_error(function() T.empty({ 2 }):copy(a) end)
  end)

  it('wraps integers modulo 2^bits like numpy and truncates floats toward zero', function()
    local function to(values, src, dst) return T.new(values, src):to(dst):totable() end
    assert.are.same({ 5, -1, 0, -2147483648 }, to({ 2 ^ 32 + 5, 2 ^ 32 - 1, 2 ^ 33, 2 ^ 31 }, 'i64', 'i32'))
    assert.are.same({ 65535, 255, 1 }, to({ -1, 255, 65537 }, 'i32', 'u16'))
    assert.are.same({ 255, 0, 44 }, to({ -1, 256, 300 }, 'i64', 'u8'))
    -- float -> integer: NaN and values out of int32 give INT32_MIN, whose low bits are 0 for u16/u8
    assert.are.same({ 1, -1, -2147483648, -2147483648, 2147483520 }, to({ 1.9, -1.9, 0 / 0, 3e9, 2147483520 }, 'f32', 'i32'))
    assert.are.same({ 65535, 0, 0 }, to({ -1.5, 65536.5, 1e10 }, 'f32', 'u16'))
  end)

  it('sets elements with the same truncation as a copy from float', function()
    local t = T.empty({ 4 }, 'i32')
    for i, v in ipairs({ -7.9, 1e10, 0 / 0, 16777217 }) do t:set(i, v) end
    assert.are.same({ -7, -2147483648, -2147483648, 16777217 }, t:totable())
    local u = T.empty({ 3 }, 'u8')
    for i, v in ipairs({ -1, 300, -1e12 }) do u:set(i, v) end
    assert.are.same({ 255, 44, 0 }, u:totable())
    local l = T.empty({ 2 }, 'i64')
    l:set(1, -2 ^ 70)
    l:set(2, 2 ^ 62)
    assert.are.same({ -2 ^ 63, 2 ^ 62 }, l:totable())
  end)

  it('widens bf16 to f32 exactly, signalling NaNs included', function()
    local b = T.empty({ 2 }, 'bf16')
    local p = ffi.cast('uint16_t *', b:data())
    p[0], p[1] = 0x7f81, 0xffc1  -- a signalling and a quiet NaN
    local f = b:float()
    local bits = ffi.cast('uint32_t *', f:data())
    assert.are.equal(0x7f810000, bits[0])
    assert.are.equal(0xffc10000, bits[1])
  end)

  it('copies empty and zero-dimensional tensors', function()
    assert.are.same({}, T.empty({ 0, 3 }, 'i32'):to('f16'):totable())
    local scalar = T.empty({}, 'f32')
    scalar:fill(-2.5)
    local i = T.empty({}, 'i64'):copy(scalar)
    assert.are.equal(-2, i:get())
  end)

  it('counts host allocations', function()
    -- earlier tests' garbage must not be finalised in the middle of the count
    collectgarbage()
    collectgarbage('stop')
    finally(function() collectgarbage('restart') end)
    local stats = ffi.new('WkAllocatorStats')
    C.wk_allocator_stats(C.WK_DEVICE_CPU, 0, stats)
    local before_bytes, before_allocs = stats.bytes_in_use, stats.device_allocs
    local t = T.empty({ 1000 })
    C.wk_allocator_stats(C.WK_DEVICE_CPU, 0, stats)
    assert.are.equal(before_allocs + 1, stats.device_allocs)
    assert.are.equal(before_bytes + 4000, stats.bytes_in_use)
    t:free()
    C.wk_allocator_stats(C.WK_DEVICE_CPU, 0, stats)
    assert.are.equal(before_bytes, stats.bytes_in_use)
  end)

  it('keeps the peak of host bytes in use, from the last reset', function()
    collectgarbage()
    collectgarbage('stop')
    finally(function() collectgarbage('restart') end)
    local stats = ffi.new('WkAllocatorStats')
    C.wk_allocator_reset_peak(C.WK_DEVICE_CPU, 0)
    C.wk_allocator_stats(C.WK_DEVICE_CPU, 0, stats)
    local base = stats.bytes_in_use
    assert.are.equal(base, stats.bytes_peak)
    local a, b = T.empty({ 1000 }), T.empty({ 500 })
    a:free()
    local c = T.empty({ 100 })
    C.wk_allocator_stats(C.WK_DEVICE_CPU, 0, stats)
    assert.are.equal(base + 6000, stats.bytes_peak)
    assert.are.equal(base + 2400, stats.bytes_in_use)
    C.wk_allocator_reset_peak(C.WK_DEVICE_CPU, 0)
    C.wk_allocator_stats(C.WK_DEVICE_CPU, 0, stats)
    assert.are.equal(base + 2400, stats.bytes_peak)
    b:free()
    c:free()
  end)

  it('has a WkAllocatorStats layout that matches the C compiler', function()
    local struct = 'WkAllocatorStats'
    assert.are.equal(ffi.sizeof(struct), tonumber(C.wk_abi_layout(struct, nil)))
    for _, field in ipairs({ 'bytes_in_use', 'bytes_cached', 'device_allocs', 'cache_hits', 'bytes_peak' }) do
      assert.are.equal(ffi.offsetof(struct, field), tonumber(C.wk_abi_layout(struct, field)))
    end
  end)

  it('treats CPU streams and events as completed work; pinned memory works without CUDA', function()
    local stream, event = T.stream('cpu'), T.event('cpu')
    event:record(stream)
    stream:wait(event)
    stream:synchronize()
    local src, dst = T.new({ 1, 2 }), T.pinned({ 2 })
    dst:copy_async(src, stream)
    event:synchronize()
    assert.are.same({ 1, 2 }, dst:totable())
    stream:use()
    T.default_stream()
    event:free()
    stream:free()
    stream:free()
    assert.has_error(function() stream:synchronize() end, 'stream used after free()')
  end)

  it('says how to get CUDA when it is missing', function()
    if wick.build_info().has_cuda then return end
    assert.has_error(function() T.empty({ 2 }, 'f32', 'cuda:0') end,
      'cuda:0 tensor: this libwick was built without CUDA (rebuild with nvcc on PATH)')
  end)

  -- A rank's 'cuda' is its own GPU (dist.init sets cuda:LOCAL_RANK); 'cuda:N' is N whatever the rank.
  it("resolves 'cuda' to the process's default device and keeps an explicit index", function()
    assert.are.same({ C.WK_DEVICE_CUDA, 0 }, { T.parse_device('cuda', 1) })
    assert.are.equal(C.WK_OK, C.wk_cuda_set_default_device(3))
    local ok, err = pcall(function()
      assert.are.same({ C.WK_DEVICE_CUDA, 3 }, { T.parse_device('cuda', 1) })
      assert.are.same({ C.WK_DEVICE_CUDA, 1 }, { T.parse_device('cuda:1', 1) })
    end)
    assert.are.equal(C.WK_OK, C.wk_cuda_set_default_device(0))
    assert(ok, err)
    assert.are.equal(C.WK_ERR_INVALID_ARG, C.wk_cuda_set_default_device(-1))
    assert.are.equal(C.WK_ERR_INVALID_ARG, C.wk_cuda_set_default_device(16))
  end)
end)

-- Every dtype pair, against a reference computed here element by element: each storage element's
-- expected value comes from Lua arithmetic on its bits, and a view's expected output is looked up
-- through the view's own shape, strides and offset.
describe('tensor dtype conversion on the CPU', function()
  local NAMES = { 'f32', 'bf16', 'f16', 'i32', 'i64', 'u16', 'u8' }
  -- What the storage of each dtype is read as: floats by their bits.
  local STORAGE = { f32 = 'uint32_t', bf16 = 'uint16_t', f16 = 'uint16_t', i32 = 'int32_t', i64 = 'int64_t',
                    u16 = 'uint16_t', u8 = 'uint8_t' }
  local FLOAT = { f32 = true, bf16 = true, f16 = true }
  local floor, frexp = math.floor, math.frexp
  local union = ffi.new('union { float f; uint32_t u; }')

  local function f32_bits(x) union.f = x return union.u end  -- a double rounded to f32 (nearest even)
  local function f32_value(bits) union.u = bits return union.f end

  local function nearest_even(q)
    local f = floor(q)
    local d = q - f
    if d > 0.5 or (d == 0.5 and f % 2 == 1) then return f + 1 end
    return f
  end

  local function bf16_from_bits(b)
    local high = floor(b / 65536)
    if b % 2 ^ 31 > 0x7f800000 then return bit.bor(high, 0x40) end  -- NaN, made quiet
    return floor((b + 0x7fff + high % 2) / 65536) % 65536
  end

  local function f16_from_bits(b)
    local sign = b >= 2 ^ 31 and 0x8000 or 0
    local magnitude = b % 2 ^ 31
    if magnitude > 0x7f800000 then return sign + 0x7e00 end
    local v = f32_value(magnitude)
    if v >= 65520 then return sign + 0x7c00 end
    if v < 2 ^ -14 then return sign + nearest_even(v * 2 ^ 24) end  -- subnormal (or the smallest normal)
    local _, e = frexp(v)
    local exponent = e - 1  -- v in [2^exponent, 2^(exponent+1))
    local r = nearest_even(v * 2 ^ (10 - exponent))
    if r == 2048 then r, exponent = 1024, exponent + 1 end
    return sign + (exponent + 15) * 1024 + (r - 1024)
  end

  local function f16_to_bits(h)
    local sign = h >= 0x8000 and 2 ^ 31 or 0
    local e, m = floor(h / 1024) % 32, h % 1024
    if e == 31 then return sign + (m ~= 0 and 0x7fc00000 or 0x7f800000) end
    local v = e == 0 and m * 2 ^ -24 or (m + 1024) * 2 ^ (e - 25)
    return sign + f32_bits(v)
  end

  local INT64_MIN = -0x7fffffffffffffffLL - 1
  local function truncate(v, bits)
    local limit = 2 ^ (bits - 1)
    if v ~= v or v < -limit or v >= limit then return nil end
    return v >= 0 and floor(v) or -floor(-v)
  end

  local function wrap(v, bits, signed)  -- v: a Lua number or an int64
    if type(v) ~= 'number' then
      local m = 2LL ^ bits
      v = tonumber(((v % m) + m) % m)
    else
      v = v % 2 ^ bits
    end
    if signed and v >= 2 ^ (bits - 1) then v = v - 2 ^ bits end
    return v
  end

  -- The expected destination storage value for a float source of f32 bits b.
  local function from_real(b, dst)
    if dst == 'f32' then return b end
    if dst == 'bf16' then return bf16_from_bits(b) end
    if dst == 'f16' then return f16_from_bits(b) end
    local v = f32_value(b)
    if dst == 'i64' then
      local t = truncate(v, 64)
      return t and ffi.new('int64_t', t) or INT64_MIN
    end
    local t = truncate(v, 32) or -2 ^ 31
    if dst == 'i32' then return t end
    return t % (dst == 'u16' and 65536 or 256)
  end

  -- ... for an integer source value v (a Lua number, or an int64 for i64).
  local function from_integer(v, dst)
    if FLOAT[dst] then return from_real(f32_bits(tonumber(v)), dst) end  -- nearest double, then f32
    if dst == 'i64' then return ffi.new('int64_t', v) end
    if dst == 'i32' then return wrap(v, 32, true) end
    return wrap(v, dst == 'u16' and 16 or 8, false)
  end

  local function expected_value(src, raw, dst)
    if src == dst then return raw end
    if src == 'f32' then return from_real(raw, dst) end
    if src == 'bf16' then return from_real(raw * 65536, dst) end
    if src == 'f16' then return from_real(f16_to_bits(raw), dst) end
    return from_integer(raw, dst)
  end

  -- The source values, by raw storage value: every pattern of the 16- and 8-bit dtypes, edges and
  -- a deterministic spread of bit patterns for the others. Returned with a 2-D shape for the views.
  local seed = 1
  local function random32()
    seed = (seed * 1103515245 + 12345) % 2 ^ 31
    local high = seed
    seed = (seed * 1103515245 + 12345) % 2 ^ 31
    return (high * 2 + seed % 2) % 2 ^ 32
  end
  local F32_EDGES = { 0, -0.0, 0.5, 1.5, -1.5, 2.5, -2.5, 0.49999997, 255.9, 256, -1, -129.7, 65535.5, 65536, 70000,
    65504, 65519.99, 65520, -32769, 2147483520, 2 ^ 31, -2 ^ 31, -2147483904, 3e9, -3e9, 2 ^ 32, 9.2233715e18, 2 ^ 63,
    -2 ^ 63, 1e20, -1e20, math.huge, -math.huge, 0 / 0, 1e-8, 3.4e38, 6e-5, 2 ^ -24, 2 ^ -25, 3 * 2 ^ -25, 1e-40, 1 / 3,
    1 + 2 ^ -8, 1 + 3 * 2 ^ -8, 1 + 2 ^ -11, -0.7, 127.5, 128.5, -128.5, 32767.5, 16777217 }
  local I64_EDGES = { 0LL, 1LL, -1LL, 255LL, 256LL, -129LL, 65535LL, 65536LL, 2147483647LL, 2147483648LL,
    -2147483648LL, -2147483649LL, 4294967295LL, 4294967296LL, 4294967301LL, 9007199254740993LL,
    -9007199254740993LL, 0x7fffffffffffffffLL, INT64_MIN, 4611686293305294849LL, 16777217LL, -16777217LL }
  local function source_values(name)
    local values, rows = {}, nil
    if name == 'bf16' or name == 'f16' or name == 'u16' then
      for v = 0, 65535 do values[#values + 1] = v end
      rows = 256
    elseif name == 'u8' then
      for v = 0, 255 do values[#values + 1] = v end
      rows = 16
    elseif name == 'f32' then
      for _, x in ipairs(F32_EDGES) do values[#values + 1] = f32_bits(x) end
      for _ = 1, 3 do values[#values + 1] = 0x7f800001 + random32() % 0x7fffff end  -- signalling NaNs
      while #values < 64 * 64 do values[#values + 1] = random32() end
      rows = 64
    elseif name == 'i32' then
      for _, x in ipairs({ 0, 1, -1, 127, 128, 255, 256, -129, 65535, 65536, -32769, 2147483647, -2147483648,
        16777217, -16777217, 16777219, 2147483520, 2147483584 }) do values[#values + 1] = x end
      while #values < 64 * 64 do values[#values + 1] = random32() - 2 ^ 31 end
      rows = 64
    else
      for _, x in ipairs(I64_EDGES) do values[#values + 1] = x end
      while #values < 32 * 32 do
        values[#values + 1] = ffi.new('int64_t', random32()) * 2 ^ 32 + random32() - 2LL ^ 63 * (random32() % 2)
      end
      rows = 32
    end
    return values, rows, #values / rows
  end

  local function view(t, offset, shape, strides)
    local n = #shape
    local v = C.wk_tensor_view(t, offset, n, ffi.new('int64_t[?]', n, shape), ffi.new('int64_t[?]', n, strides))
    return ffi.gc(core.check_handle(v), C.wk_tensor_free)
  end

  -- Layouts over a [rows, cols] storage: (offset, shape, strides) of each view.
  local function layouts(rows, cols)
    return {
      contiguous = { 0, { rows, cols }, { cols, 1 } },
      transposed = { 0, { cols, rows }, { 1, cols } },
      sliced = { 1, { rows, cols - 2 }, { cols, 1 } },
      ['reversed rows, every other column'] = { (rows - 1) * cols + 1, { rows, cols / 2 }, { -cols, 2 } },
      ['size-1 dims, mergeable'] = { 0, { 1, rows / 2, 2, 1, cols }, { 5, 2 * cols, cols, 3, 1 } },
      ['rows interleaved, every other column'] = { 0, { 2, rows / 2, cols / 2 }, { cols, 2 * cols, 2 } },
      ['three dims permuted'] = { 0, { cols / 2, rows, 2 }, { 2, cols, 1 } },
    }
  end

  for _, src in ipairs(NAMES) do
    it('converts ' .. src .. ' to every dtype, contiguous and strided, like the element-by-element reference', function()
      local values, rows, cols = source_values(src)
      local n = #values
      local base = T.empty({ n }, src)
      local raw = ffi.cast(STORAGE[src] .. ' *', base:data())
      for k = 1, n do raw[k - 1] = values[k] end
      for _, dst in ipairs(NAMES) do
        local expected = {}
        for k = 1, n do expected[k] = expected_value(src, raw[k - 1], dst) end
        for layout, l in pairs(layouts(rows, cols)) do
          local offset, shape, strides = l[1], l[2], l[3]
          local v = view(base, offset, shape, strides)
          local numel = tonumber(C.wk_tensor_numel(v))
          local out = T.empty({ numel }, dst)
          core.check(C.wk_tensor_copy(out, v))
          local got = ffi.cast(STORAGE[dst] .. ' *', out:data())
          local index = {}
          for d = 1, #shape do index[d] = 0 end
          local at = offset
          for i = 0, numel - 1 do
            local want = expected[at + 1]
            if got[i] ~= want then
              local source = src == 'i64' and tostring(raw[at]) or ('0x%x'):format(tonumber(raw[at]))
              error(('%s -> %s, %s: element %d (storage %d, source %s) is %s, expected %s'):format(src, dst, layout, i,
                at, source, tostring(got[i]), tostring(want)))
            end
            for d = #shape, 1, -1 do  -- the next logical element (row-major)
              index[d] = index[d] + 1
              at = at + strides[d]
              if index[d] < shape[d] then break end
              at = at - strides[d] * shape[d]
              index[d] = 0
            end
          end
          out:free()
        end
      end
      base:free()
    end)
  end
end)

-- The layering the next subsystems rely on: tensors (with the CUDA module's table and its device half)
-- below ops, and the module's entry points declared in one list.
describe('the tensor layer', function()
  local helper = require 'helper'

  local function files_under(dir, pattern)
    local found = helper.sh(('find %s -type f -name %s | sort'):format(helper.shell_quote(dir), helper.shell_quote(pattern)))
    return helper.lines(found.out)
  end

  local normalize = dofile(helper.ROOT .. '/tests/helpers/layers.lua').normalize -- a/b/../c -> a/c

  it('includes nothing from runtime/ops', function()
    local root = helper.ROOT .. '/runtime/tensor'
    local files, offenders = files_under(root, '*.*'), {}
    assert.is_true(#files >= 8, 'runtime/tensor lists ' .. #files .. ' files')
    for _, path in ipairs(files) do
      local dir = path:match('^(.*)/[^/]+$')
      for included in helper.read_file(path):gmatch('#include "([^"]+)"') do
        local target = normalize(dir .. '/' .. included)
        if target:find('/runtime/ops/', 1, true) then offenders[#offenders + 1] = path:sub(#root + 2) .. ' -> ' .. included end
      end
    end
    assert.are.same({}, offenders)
  end)

  it('calls nothing defined in runtime/ops (the objects of this build, by their symbols)', function()
    local mode = helper.sh('ls ' .. helper.shell_quote(helper.ROOT .. '/build') .. ' | grep "^mode-"').out:match('mode%-(%S+)')
    assert.is_string(mode, 'no build/mode-* stamp: build first')
    local obj = helper.ROOT .. '/build/obj/' .. mode .. '/runtime'
    -- Objects of sources that still exist (a build directory keeps those of deleted files).
    local function symbols(dir, flag)
      local objects = {}
      for _, object in ipairs(files_under(dir, '*.o')) do
        local source = helper.ROOT .. '/runtime' .. object:sub(#obj + 1):gsub('%.cu%.o$', '.cu'):gsub('%.o$', '.c')
        if io.open(source) then objects[#objects + 1] = helper.shell_quote(object) end
      end
      local out = helper.sh(('nm %s --format=posix %s'):format(flag, table.concat(objects, ' '))).out
      local set = {}
      for line in out:gmatch('[^\n]+') do
        local name = line:match('^(%S+) ')
        if name and not line:match(':$') then set[name] = true end
      end
      return set
    end
    local ops_defines, used = symbols(obj .. '/ops', '--defined-only'), symbols(obj .. '/tensor', '--undefined-only')
    assert.is_true(next(ops_defines) ~= nil and next(used) ~= nil, 'no objects under ' .. obj)
    local offenders = {}
    for name in pairs(used) do if ops_defines[name] then offenders[#offenders + 1] = name end end
    table.sort(offenders)
    assert.are.same({}, offenders)
  end)

  it('declares the CUDA module entry points once: no other header names a cuda_ function', function()
    local offenders = {}
    for _, path in ipairs(files_under(helper.ROOT .. '/runtime', '*.h')) do
      if not path:find('/runtime/tensor/cuda_module.h', 1, true) then
        for line in helper.read_file(path):gmatch('[^\n]+') do
          if line:match('[%w_%*]+%s+%*?cuda_[%w_]+%s*%(') then offenders[#offenders + 1] = path .. ': ' .. line end
        end
      end
    end
    assert.are.same({}, offenders)
  end)
end)
