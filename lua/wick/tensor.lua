-- wick.tensor: the Lua face of runtime/tensor. A tensor is a WkTensor* cdata with methods:
--   t.shape (table), t.dtype ('f32', ...), t.device ('cpu', 'cuda:0'), t:size(d), t:numel(),
--   t:to(device_or_dtype), t:float(), t:view(shape), t:narrow(dim, first, length), t:copy(src),
--   t:fill(v), t:get(i, j, ...), t:set(i, j, ..., value), t:totable(), t:free(); print(t) shows it.
-- Constructors: empty, zeros, full, new (from tables), randn, pinned, borrow (foreign memory), share
-- (a handle on a tensor owned by C, such as a loader batch's).
-- Streams and events: tensor.stream(device), tensor.event(device), t:copy_async(src, stream).
-- Memory: tensor.memory(device) (bytes in use, the peak, ...), tensor.reset_peak(device).
-- Tensors own their memory: t:free() releases it now (idempotent); the GC is only a backstop, since
-- it cannot see device memory. Element access is for debugging; math belongs in C ops.
local ffi = require 'ffi'
local core = require 'wick.core'

local C = core.C
local check = core.check
local C_free = C.wk_tensor_free

local tensor = {}

local DTYPES = { f32 = 0, bf16 = 1, f16 = 2, i32 = 3, i64 = 4, u16 = 5, u8 = 6 }
local DTYPE_NAMES = {}
for name, code in pairs(DTYPES) do
  assert(ffi.string(C.wk_dtype_name(code)) == name, 'wick.tensor: dtype codes disagree with libwick')
  DTYPE_NAMES[code] = name
end
tensor.DTYPES = DTYPES

-- `run` starts itself on the OpenBLAS kernels the CPU runs best (runtime/host/run.c); a plain luajit
-- cannot (OpenBLAS chose when it loaded), so it says what to set.
local better_kernels = C.wk_blas_better_kernels()
if better_kernels ~= nil then
  C.wk_log_message(C.WK_LOG_WARN, ("OpenBLAS runs its %s kernels on a CPU that runs %s's: start with "
    .. 'OPENBLAS_CORETYPE=%s (run does so itself)'):format(ffi.string(C.wk_blas_kernels()), ffi.string(better_kernels),
    ffi.string(better_kernels)))
end

local MAX_DIMS = C.WK_MAX_DIMS
local PRINT_EDGE = 3  -- elements shown at each end of a long dim

-- A metatype is bound to the ctype once per process, but this module may be loaded again (busted
-- insulates spec files; a REPL may reload): the state the metatype sees lives in the registry.
local REGISTRY_KEY = 'wick.tensor'
local state = debug.getregistry()[REGISTRY_KEY]
local first_load = state == nil
if first_load then
  state = { live = setmetatable({}, { __mode = 'k' }) }  -- live: tensors not yet freed
  debug.getregistry()[REGISTRY_KEY] = state
end
local live = state.live

local shape_buf = ffi.new('int64_t[?]', MAX_DIMS)
local stride_buf = ffi.new('int64_t[?]', MAX_DIMS)
local get_buf = ffi.new('double[1]')

local function dtype_code(dtype, level)
  local code = DTYPES[dtype or 'f32']
  if not code then error("unknown dtype '" .. tostring(dtype) .. "' (f32, bf16, f16, i32, i64, u16, u8)", level + 1) end
  return code
end

-- 'cpu' | 'cuda' | 'cuda:N' -> device type, index. 'cuda' is the process's GPU (a rank's
-- cuda:LOCAL_RANK, set by wick.dist.init); 'cuda:N' names one.
local function parse_device(device, level)
  device = device or 'cpu'
  if device == 'cpu' then return C.WK_DEVICE_CPU, 0 end
  local index = device == 'cuda' and tostring(C.wk_cuda_default_device()) or device:match('^cuda:(%d+)$')
  if not index then error("unknown device '" .. tostring(device) .. "' (cpu, cuda or cuda:N)", level + 1) end
  return C.WK_DEVICE_CUDA, tonumber(index)
end
tensor.parse_device = parse_device

local function fill_shape(shape, level)
  if type(shape) ~= 'table' or #shape > MAX_DIMS then
    error('shape must be a table of at most ' .. MAX_DIMS .. ' sizes', level + 1)
  end
  for d = 1, #shape do
    local n = shape[d]
    if type(n) ~= 'number' or n < 0 or n % 1 ~= 0 then
      error('shape[' .. d .. '] must be a non-negative integer, got ' .. tostring(n), level + 1)
    end
    shape_buf[d - 1] = n
  end
  return #shape
end

local function own(handle, level)
  handle = core.check_handle(handle, level + 1)
  live[handle] = true
  return ffi.gc(handle, C_free)
end

local function alive(t)
  if not live[t] then error('tensor used after free()', 3) end
  return t
end

-- ---- construction ------------------------------------------------------------------------------

function tensor.empty(shape, dtype, device)
  local ndim = fill_shape(shape, 2)
  local device_type, index = parse_device(device, 2)
  return own(C.wk_tensor_empty(dtype_code(dtype, 2), ndim, shape_buf, device_type, index), 2)
end

-- Page-locked host memory when CUDA is usable (fast async copies), plain memory otherwise.
function tensor.pinned(shape, dtype)
  local ndim = fill_shape(shape, 2)
  return own(C.wk_tensor_empty_pinned(dtype_code(dtype, 2), ndim, shape_buf), 2)
end

function tensor.full(shape, value, dtype, device)
  local t = tensor.empty(shape, dtype, device)
  check(C.wk_op_fill(t, value), 2)
  return t
end

function tensor.zeros(shape, dtype, device) return tensor.full(shape, 0, dtype, device) end

-- A tensor over memory owned by someone else (a buffer from another library): no copy.
-- `owner` (any Lua value) is kept reachable as long as the tensor, so the memory outlives it.
local borrowed_owners = setmetatable({}, { __mode = 'k' })
function tensor.borrow(pointer, shape, dtype, owner)
  local ndim = fill_shape(shape, 2)
  local t = own(C.wk_tensor_borrow(pointer, dtype_code(dtype, 2), ndim, shape_buf), 2)
  borrowed_owners[t] = owner
  return t
end

-- A handle of our own on a tensor owned elsewhere (one of a loader batch's, from C): a view with its
-- shape, strides and offset that shares, and keeps alive, its storage. Free it like any tensor.
function tensor.share(handle)
  if handle == nil then error('tensor.share: the tensor is NULL', 2) end
  return own(C.wk_tensor_share(handle), 2)
end

-- Normal(mean, std) from a counter-based generator: the same seed gives the same values anywhere.
function tensor.randn(shape, opts)
  opts = opts or {}
  local t = tensor.empty(shape, 'f32', opts.device)
  check(C.wk_op_normal(t, opts.seed or 0, opts.mean or 0, opts.std or 1), 2)
  return t
end

local function nested_shape(data, shape)
  shape = shape or {}
  if type(data) == 'table' then
    shape[#shape + 1] = #data
    return nested_shape(data[1], shape)
  end
  return shape
end

-- tensor.new({{1, 2}, {3, 4}}, 'f32', 'cpu'): from nested Lua tables (a rectangular array).
function tensor.new(data, dtype, device)
  if type(data) ~= 'table' then error('tensor.new expects a (nested) table of numbers', 2) end
  local shape = nested_shape(data)
  local host = tensor.empty(shape, dtype)
  local index = 0
  local function put(values, depth)
    if #values ~= shape[depth] then error('tensor.new: ragged table at depth ' .. depth, 4) end
    for i = 1, #values do
      if depth < #shape then put(values[i], depth + 1) else
        check(C.wk_tensor_set(host, index, values[i]), 4)
        index = index + 1
      end
    end
  end
  put(data, 1)
  if (device or 'cpu') == 'cpu' then return host end
  local moved = host:to(device)
  host:free()
  return moved
end

function tensor.is_tensor(x) return type(x) == 'cdata' and ffi.istype('WkTensor *', x) end

-- ---- methods ------------------------------------------------------------------------------------

local methods = {}

function methods.free(t)
  if live[t] then
    live[t] = nil
    ffi.gc(t, nil)
    C_free(t)
  end
end

function methods.dim(t) return C.wk_tensor_ndim(alive(t)) end
function methods.numel(t) return tonumber(C.wk_tensor_numel(alive(t))) end
function methods.data(t) return C.wk_tensor_data(alive(t)) end
function methods.nbytes(t) return methods.numel(t) * tonumber(C.wk_dtype_size(C.wk_tensor_dtype(t))) end
function methods.is_contiguous(t) return C.wk_tensor_is_contiguous(alive(t)) == 1 end

-- Size of dim d (1-based, negative counts from the end).
function methods.size(t, d)
  local ndim = C.wk_tensor_ndim(alive(t))
  if d < 0 then d = ndim + 1 + d end
  return tonumber(C.wk_tensor_size(t, d - 1))
end

local function shape_of(t)
  local shape = {}
  for d = 0, C.wk_tensor_ndim(t) - 1 do shape[d + 1] = tonumber(C.wk_tensor_size(t, d)) end
  return shape
end

local function device_of(t)
  if C.wk_tensor_device(t) == C.WK_DEVICE_CPU then return 'cpu' end
  return 'cuda:' .. C.wk_tensor_device_index(t)
end

local properties = {
  shape = shape_of,
  dtype = function(t) return DTYPE_NAMES[tonumber(C.wk_tensor_dtype(t))] end,
  device = device_of,
}

-- A new contiguous tensor with t's values converted to dtype and/or moved to device.
local function convert(t, dtype, device)
  local out = tensor.empty(shape_of(t), dtype, device)
  check(C.wk_tensor_copy(out, t), 3)
  return out
end

-- t:to('cuda:0') / t:to('bf16') / t:to('cpu', 'f32'): always a new tensor.
function methods.to(t, a, b)
  alive(t)
  local dtype, device = t.dtype, t.device
  for _, x in ipairs({ a, b }) do
    if DTYPES[x] then dtype = x else device = x end
  end
  parse_device(device, 2)
  return convert(t, dtype, device)
end

function methods.float(t) return convert(alive(t), 'f32', t.device) end
function methods.clone(t) return convert(alive(t), t.dtype, t.device) end
function methods.contiguous(t) return convert(alive(t), t.dtype, t.device) end

function methods.copy(t, src)
  check(C.wk_tensor_copy(alive(t), alive(src)), 2)
  return t
end

-- Queues the copy on stream and returns at once when one side is pinned host memory and the other
-- a CUDA tensor; both must stay alive until the stream (or an event recorded after) is waited on.
function methods.copy_async(t, src, stream)
  check(C.wk_tensor_copy_async(alive(t), alive(src), stream and stream.handle), 2)
  return t
end

function methods.fill(t, value)
  check(C.wk_op_fill(alive(t), value), 2)
  return t
end

local function make_view(t, offset, shape, strides, level)
  local ndim = #shape
  for d = 1, ndim do
    shape_buf[d - 1] = shape[d]
    stride_buf[d - 1] = strides[d]
  end
  return own(C.wk_tensor_view(t, offset, ndim, shape_buf, stride_buf), level + 1)
end

-- A view with a new shape over a contiguous tensor; one size may be -1 (inferred).
function methods.view(t, shape)
  alive(t)
  if not t:is_contiguous() then error('view needs a contiguous tensor (use :contiguous() first)', 2) end
  local known, infer = 1, nil
  for d, n in ipairs(shape) do
    if n == -1 then infer = d else known = known * n end
  end
  shape = { unpack(shape) }
  if infer then shape[infer] = known > 0 and t:numel() / known or 0 end
  local strides, stride = {}, 1
  for d = #shape, 1, -1 do
    strides[d] = stride
    stride = stride * shape[d]
  end
  if stride ~= t:numel() then error('view: shape has ' .. stride .. ' elements, tensor has ' .. t:numel(), 2) end
  return make_view(t, C.wk_tensor_offset(t), shape, strides, 2)
end

-- A view of t as shape without a copy (torch's expand): t's dims align with shape's last ones, and a
-- dim of size 1 repeats with stride 0; leading new dims repeat all of t.
function methods.expand(t, shape)
  alive(t)
  local own_shape, offset = shape_of(t), #shape - C.wk_tensor_ndim(t)
  if offset < 0 then error(('expand: [%s] has fewer dims than the tensor'):format(table.concat(shape, ', ')), 2) end
  local strides = {}
  for d = 1, #shape do
    local size = own_shape[d - offset]
    if size == nil or (size == 1 and shape[d] ~= 1) then
      strides[d] = 0
    elseif size == shape[d] then
      strides[d] = tonumber(C.wk_tensor_stride(t, d - offset - 1))
    else
      error(('expand: [%s] to [%s]: only dims of size 1 repeat'):format(table.concat(own_shape, ', '),
        table.concat(shape, ', ')), 2)
    end
  end
  return make_view(t, C.wk_tensor_offset(t), shape, strides, 2)
end

-- Elements first .. first+length-1 (1-based) of dim d, sharing storage.
function methods.narrow(t, d, first, length)
  alive(t)
  local shape, strides = shape_of(t), {}
  for k = 1, #shape do strides[k] = tonumber(C.wk_tensor_stride(t, k - 1)) end
  if d < 1 or d > #shape or first < 1 or length < 0 or first + length - 1 > shape[d] then
    error(string.format('narrow(%d, %d, %d) out of range for shape [%s]', d, first, length, table.concat(shape, ', ')), 2)
  end
  local offset = C.wk_tensor_offset(t) + (first - 1) * strides[d]
  shape[d] = length
  return make_view(t, offset, shape, strides, 2)
end

-- 1-based indices -> flat logical index, checked.
local function flat_index(t, nargs, ...)
  local ndim = C.wk_tensor_ndim(t)
  if nargs ~= ndim then error('expected ' .. ndim .. ' indices, got ' .. nargs, 3) end
  local index = 0
  for d = 1, ndim do
    local i, n = select(d, ...), tonumber(C.wk_tensor_size(t, d - 1))
    if type(i) ~= 'number' or i < 1 or i > n then error('index ' .. tostring(i) .. ' out of range 1..' .. n .. ' in dim ' .. d, 3) end
    index = index * n + (i - 1)
  end
  return index
end

local function host_copy(t)
  if C.wk_tensor_device(t) == C.WK_DEVICE_CPU then return t, false end
  return convert(t, t.dtype, 'cpu'), true
end

-- Debug access: t:get(i, j) reads one element (1-based) as a Lua number.
function methods.get(t, ...)
  local index = flat_index(alive(t), select('#', ...), ...)
  local host, temporary = host_copy(t)
  check(C.wk_tensor_get(host, index, get_buf), 2)
  if temporary then host:free() end
  return get_buf[0]
end

-- t:set(i, j, value) writes one element of a CPU tensor.
function methods.set(t, ...)
  local nargs = select('#', ...)
  local value = select(nargs, ...)
  check(C.wk_tensor_set(alive(t), flat_index(t, nargs - 1, ...), value), 2)
  return t
end

-- Nested tables of Lua numbers.
function methods.totable(t)
  local host, temporary = host_copy(alive(t))
  local shape, index = shape_of(host), 0
  local function build(depth)
    local out = {}
    for i = 1, shape[depth] do
      if depth < #shape then out[i] = build(depth + 1) else
        check(C.wk_tensor_get(host, index, get_buf), 4)
        out[i] = get_buf[0]
        index = index + 1
      end
    end
    return out
  end
  local result
  if #shape == 0 then  -- a scalar tensor is a plain number
    check(C.wk_tensor_get(host, 0, get_buf), 2)
    result = get_buf[0]
  else
    result = build(1)
  end
  if temporary then host:free() end
  return result
end

-- ---- printing -----------------------------------------------------------------------------------

local function format_number(v, integer)
  if integer then return string.format('%d', v) end
  return string.format('%.4g', v)
end

local function render(host, shape, integer)
  local strides, total = {}, 1
  for d = #shape, 1, -1 do
    strides[d] = total
    total = total * shape[d]
  end
  local function value_at(flat)
    check(C.wk_tensor_get(host, flat, get_buf), 5)
    return format_number(get_buf[0], integer)
  end
  local function block(depth, base, indent)
    local n, parts = shape[depth], {}
    for i = 0, n - 1 do
      if n > 2 * PRINT_EDGE and i == PRINT_EDGE then
        parts[#parts + 1] = '...'
      end
      if n <= 2 * PRINT_EDGE or i < PRINT_EDGE or i >= n - PRINT_EDGE then
        local flat = base + i * strides[depth]
        parts[#parts + 1] = depth == #shape and value_at(flat) or block(depth + 1, flat, indent .. ' ')
      end
    end
    local sep = depth == #shape and ', ' or (',\n' .. indent .. ' ')
    return '[' .. table.concat(parts, sep) .. ']'
  end
  if #shape == 0 then return value_at(0) end
  return block(1, 0, '')
end

local function describe(t)
  return string.format('tensor([%s] %s %s)', table.concat(shape_of(t), ', '), t.dtype, device_of(t))
end

local function tostring_tensor(t)
  if not live[t] then return 'tensor(freed)' end
  local host, temporary = host_copy(t)
  local integer = DTYPES[t.dtype] >= DTYPES.i32
  local text = describe(t) .. '\n' .. render(host, shape_of(t), integer)
  if temporary then host:free() end
  return text
end

state.methods, state.properties, state.tostring = methods, properties, tostring_tensor
if first_load then
  ffi.metatype('struct WkTensor', {
    __index = function(t, key)
      local property = state.properties[key]
      if property then return property(alive(t)) end
      return state.methods[key]
    end,
    __tostring = function(t) return state.tostring(t) end,
  })
end

-- ---- streams and events ---------------------------------------------------------------------------
-- tensor.stream(device) and tensor.event(device) order work on a CUDA device (on the CPU they are
-- no-ops, so the same code runs there). stream:use() makes ops of this thread run on it.

local Stream, Event = {}, {}
Stream.__index, Event.__index = Stream, Event
local own_stream, free_stream = core.handle(C.wk_stream_free)
local own_event, free_event = core.handle(C.wk_event_free)

local function handle_of(object, what)
  if not object.handle then error(what .. ' used after free()', 3) end
  return object.handle
end

function tensor.stream(device)
  local device_type, index = parse_device(device, 2)
  local handle = core.check_handle(C.wk_stream_new(device_type, index), 2)
  return setmetatable({ handle = own_stream(handle) }, Stream)
end

function Stream:synchronize() check(C.wk_stream_synchronize(handle_of(self, 'stream')), 2) end
function Stream:wait(event) check(C.wk_stream_wait_event(handle_of(self, 'stream'), handle_of(event, 'event')), 2) end
function Stream:use() C.wk_stream_set_current(handle_of(self, 'stream')) end
function Stream:free() free_stream(self) end

function tensor.event(device)
  local device_type, index = parse_device(device, 2)
  local handle = core.check_handle(C.wk_event_new(device_type, index), 2)
  return setmetatable({ handle = own_event(handle) }, Event)
end

function Event:record(stream) check(C.wk_event_record(handle_of(self, 'event'), stream and handle_of(stream, 'stream')), 2) end
function Event:synchronize() check(C.wk_event_synchronize(handle_of(self, 'event')), 2) end
function Event:free() free_event(self) end

local allocator_stats = ffi.new('WkAllocatorStats')

-- The allocator's counters of a device: { in_use, peak, cached, allocs, hits } in bytes and calls;
-- peak is the most in use at once since the start or tensor.reset_peak(device).
function tensor.memory(device)
  local device_type, index = parse_device(device, 2)
  C.wk_allocator_stats(device_type, index, allocator_stats)
  local s = allocator_stats
  return { in_use = tonumber(s.bytes_in_use), peak = tonumber(s.bytes_peak), cached = tonumber(s.bytes_cached),
           allocs = tonumber(s.device_allocs), hits = tonumber(s.cache_hits) }
end

function tensor.reset_peak(device) C.wk_allocator_reset_peak(parse_device(device, 2)) end

-- Back to the thread's default stream for ops.
function tensor.default_stream() C.wk_stream_set_current(nil) end

-- A new tensor that a C function returned (NULL: raises its error): Lua owns and frees it.
function tensor.adopt(handle) return own(handle, 2) end

tensor.methods = methods
return tensor
