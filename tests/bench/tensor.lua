-- Tensor dtype conversion on the CPU (wk_tensor_copy between dtypes) at a loader batch's shape, next
-- to numpy's astype of the same arrays (written to a file and read back by numpy), measured in this run.
-- Wick converts into a tensor allocated once, numpy's astype allocates its result: each as it is used.
--   ./run tests/bench/tensor.lua
package.path = require('wick.host').home .. '/tests/bench/lib/?.lua;' .. package.path
local ffi = require 'ffi'
local report = require 'report'
local wick = require 'wick'
local core = require 'wick.core'
local T = wick.tensor
local C = core.C
local check = core.check

local ROWS, COLS = 8, 1025      -- a batch of 8 samples of seq_len 1024 + 1 tokens
local CALLS = 2000               -- conversions per timing
local REPEATS = 7                -- timings; the best is reported
local VOCAB = 50257              -- token ids like GPT-2's
local PYTHON = '/usr/bin/python3'

-- The source arrays: token ids (i32) and activations (f32) with fractions and both signs.
local function sources()
  local tokens, values = T.empty({ ROWS, COLS }, 'i32'), T.empty({ ROWS, COLS }, 'f32')
  local pt, pv = ffi.cast('int32_t *', tokens:data()), ffi.cast('float *', values:data())
  for i = 0, ROWS * COLS - 1 do
    pt[i] = (i * 7919) % VOCAB
    pv[i] = math.sin(i) * 3.7
  end
  return tokens, values
end

-- Seconds per conversion of src (or of its transpose) into a tensor of dtype (best of REPEATS x CALLS).
local function wick_seconds(src, dtype, transposed)
  local shape = src.shape
  local view = src
  if transposed then
    local dims, strides = ffi.new('int64_t[2]', shape[2], shape[1]), ffi.new('int64_t[2]', 1, shape[2])
    view = ffi.gc(core.check_handle(C.wk_tensor_view(src, 0, 2, dims, strides)), C.wk_tensor_free)
    shape = { shape[2], shape[1] }
  end
  local dst = T.empty(shape, dtype)
  local copy = C.wk_tensor_copy
  check(copy(dst, view))
  return report.best(REPEATS, function()
    for _ = 1, CALLS do copy(dst, view) end
  end) / CALLS
end

-- Seconds per astype for each case (same order), or nil and why numpy could not be timed.
local NUMPY = [[
import sys, time
import numpy as np
rows, cols, calls, repeats = (int(x) for x in sys.argv[1:5])
arrays = {'i32': np.fromfile(sys.argv[5], dtype=np.int32).reshape(rows, cols),
          'f32': np.fromfile(sys.argv[6], dtype=np.float32).reshape(rows, cols)}
for case in sys.argv[7:]:
    src, dst, layout = case.split(':')
    a = arrays[src].T if layout == 't' else arrays[src]
    target = np.dtype({'i64': np.int64, 'f16': np.float16}[dst])
    best = float('inf')
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            a.astype(target, order='C')
        best = min(best, time.perf_counter() - t0)
    print('seconds', best / calls)
]]

local function numpy_seconds(tokens, values, cases)
  local files = {}
  for _, t in ipairs({ tokens, values }) do
    local name = os.tmpname()
    local f = assert(io.open(name, 'wb'))
    f:write(ffi.string(t:data(), t:nbytes()))
    f:close()
    files[#files + 1] = name
  end
  local script = os.tmpname()
  local f = assert(io.open(script, 'w'))
  f:write(NUMPY)
  f:close()
  local command = ("'%s' '%s' %d %d %d %d '%s' '%s' %s 2>&1"):format(PYTHON, script, ROWS, COLS, CALLS, REPEATS,
    files[1], files[2], table.concat(cases, ' '))
  local pipe = io.popen(command)
  local out = pipe:read('*a')
  pipe:close()
  for _, name in ipairs(files) do os.remove(name) end
  os.remove(script)
  local seconds = {}
  for s in out:gmatch('seconds ([%d.e%-]+)') do seconds[#seconds + 1] = tonumber(s) end
  if #seconds == #cases then return seconds end
  if out:find("No module named 'numpy'", 1, true) then
    return nil, PYTHON .. ' has no numpy (apt-get install python3-numpy; python3-torch pulls it in)'
  end
  return nil, out:gsub('\n', ' '):sub(1, 200)
end

local tokens, values = sources()
-- what, source, our dtype, numpy's dtype, transposed source
-- numpy has no bf16: its nearest cast, to f16, is the baseline for f32 -> bf16.
local CASES = {
  { ('i32 -> i64, %dx%d'):format(ROWS, COLS), tokens, 'i64', 'i32:i64:c', false },
  { ('i32 -> i64, %dx%d, transposed'):format(ROWS, COLS), tokens, 'i64', 'i32:i64:t', true },
  { ('f32 -> bf16, %dx%d (numpy: f16)'):format(ROWS, COLS), values, 'bf16', 'f32:f16:c', false },
  { ('f32 -> f16, %dx%d'):format(ROWS, COLS), values, 'f16', 'f32:f16:c', false },
}
local ours, numpy_cases = {}, {}
for i, case in ipairs(CASES) do
  ours[i] = wick_seconds(case[2], case[3], case[5])
  numpy_cases[i] = case[4]
end
local theirs, why = numpy_seconds(tokens, values, numpy_cases)
if not theirs then print('numpy baselines skipped: ' .. why) end
for i, case in ipairs(CASES) do
  if theirs then
    report.row('convert ' .. case[1], ours[i] * 1e6, 'us', 'numpy astype', theirs[i] * 1e6, false)
  else
    print(('convert %s: %.3f us'):format(case[1], ours[i] * 1e6))
  end
end
