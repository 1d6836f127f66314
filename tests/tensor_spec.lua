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

  it('has a WkAllocatorStats layout that matches the C compiler', function()
    local struct = 'WkAllocatorStats'
    assert.are.equal(ffi.sizeof(struct), tonumber(C.wk_abi_layout(struct, nil)))
    for _, field in ipairs({ 'bytes_in_use', 'bytes_cached', 'device_allocs', 'cache_hits' }) do
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
end)
