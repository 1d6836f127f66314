-- make gpu-check: everything a lent GPU machine should be asked, in one run of under 10 minutes,
-- written to one JSON report (build/gpu-check/report.json, or $WICK_GPU_CHECK_DIR/report.json):
--   test_gpu           the gpu-tagged tests at their toy shapes (those of make test-gpu)
--   test_gpu_realistic tests/gpu/shapes_spec.lua at GPT-2 124M's shapes and past 2^23 rows
--   memcheck, racecheck  compute-sanitizer over the op tests (tests/ops/cuda_spec.lua)
--   tiny_cpu_vs_gpu    20 steps of recipes/tiny.lua on the CPU, the GPU in fp32 (losses equal to
--                      1e-4 relative) and the GPU in bf16 (within 2% of the CPU's fp32)
--   gpt2_124m          30 steps of recipes/gpt2_124m.lua on synthetic GPT-2 tokens: tokens/s, MFU,
--                      data stall %, peak GPU memory
--   nccl               NCCL on one GPU (tests/fixtures/dist/nccl_smoke.lua), tiny.lua with
--                      parallel.shard = 'parameters' on it (the gathered blocks' views on the GPU)
--                      equal to the plain run; with 2+ GPUs, data-parallel tiny.lua equal to one
--                      GPU (within 2% with bf16 gradients), and each sharding level equal to it
--                      with its peak memory per rank
-- Each step runs under its own timeout (TIMEOUTS below: 8 minutes in all) and its failure is
-- recorded, then the next runs: one run gives the whole picture. Exit 0 when every step passed (or
-- was skipped, saying why), 1 otherwise; without a GPU, 1 at once with one line.
--   ./run tests/gpu/check.lua            (make gpu-check builds first)
-- A Lua script run by ./run, like make bench's runner: it reads the trainers' JSONL logs and writes
-- the report with wick.json, and computes MFU with wick.nn.cost, the formulas the log uses.
local ffi = require 'ffi'
local core = require 'wick.core'
local host = require 'wick.host'
local json = require 'wick.json'
local cost = require 'wick.nn.cost'

local C = core.C
local ROOT = host.home
local RUN = "'" .. host.exe .. "'"
local OUT = os.getenv('WICK_GPU_CHECK_DIR') or (ROOT .. '/build/gpu-check')

-- Seconds each step may take: 490 in all, so that with make's build (about 2 minutes from
-- scratch on 16 cores) the whole fits a lent machine's 10 minutes.
local TIMEOUTS = { test_gpu = 45, test_gpu_realistic = 120, memcheck = 60, racecheck = 60, tiny_cpu_vs_gpu = 60,
  gpt2_124m = 100, nccl = 45 }
local FP32_REL_TOL, BF16_REL_TOL = 1e-4, 0.02
local TINY_STEPS, GPT2_STEPS, GPT2_WARMUP_STEPS = 20, 30, 5
-- 32 samples a step (2 micro-batches of 16 x 1024 tokens): 30 steps within the step's timeout even
-- at a tenth of llm.c's speed; the recipe's 512 would take 16 times as long for the same per-token
-- figures.
local GPT2_GLOBAL_BATCH = 32
local LOG_TAIL_BYTES = 2000  -- of a failed step's log, kept in the report (the whole log is next to it)
local GPT2_VOCAB, GPT2_EOS, SYNTHETIC_TOKENS, SYNTHETIC_DOC = 50257, 50256, 4 * 2 ^ 20, 4096

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

if C.wk_cuda_device_count() == 0 then
  local why = core.build_info().has_cuda and 'no CUDA device is usable here (WICK_LOG=info says why)'
      or 'libwick was built without CUDA (nvcc not found)'
  print('gpu-check: no GPU found: ' .. why .. '; nothing was run')
  os.exit(1)
end

local function read(path)
  local f = io.open(path, 'rb')
  if not f then return nil end
  local text = f:read('*a')
  f:close()
  return text
end

local function now() return tonumber(C.wk_now_ns()) * 1e-9 end

-- Runs a shell command from the checkout under the step's remaining time, output appended to the
-- step's log; returns its exit status (124: timed out) and the log.
local function sh(step, command)
  local left = math.max(1, math.floor(step.deadline - now()))
  local log = ('%s/%s.log'):format(OUT, step.name)
  step.commands[#step.commands + 1] = command
  step.log = log
  local f = assert(io.open(log, 'ab'))
  f:write('$ ', command, '\n')
  f:close()
  local pipe = io.popen(('cd %s && timeout -k 10 %d bash -c %s >> %s 2>&1 < /dev/null; echo $?'):format(q(ROOT), left,
    q(command), q(log)))
  local rc = tonumber(pipe:read('*a'):match('(%d+)%s*$'))
  pipe:close()
  if rc == 124 or rc == 137 then step.reasons[#step.reasons + 1] = ('`%s` timed out'):format(command) end
  return rc, read(log) or ''
end

local function fail(step, fmt, ...) step.reasons[#step.reasons + 1] = fmt:format(...) end

-- The counts of the suite's summary line, "N passed, N failed, N skipped" (the last one: the
-- sanitizer prints its own summary after it).
local function busted_counts(step, output)
  local passed, failed, skipped
  for p, f, s in output:gmatch('(%d+) passed, (%d+) failed, (%d+) skipped') do passed, failed, skipped = p, f, s end
  if not passed then return fail(step, 'no summary line from the suite') end
  step.numbers.passed, step.numbers.failed, step.numbers.skipped = tonumber(passed), tonumber(failed), tonumber(skipped)
  if step.numbers.failed > 0 then fail(step, '%s specs failed', failed) end
end

local function busted(step, env, args)
  local rc, output = sh(step, env .. ' ' .. RUN .. ' tests/busted.lua ' .. args)
  busted_counts(step, output)
  if rc ~= 0 then fail(step, 'the suite exited %d', rc) end
end

-- compute-sanitizer from the CUDA toolkit, or on PATH.
local function sanitizer()
  local path = (os.getenv('CUDA_HOME') or '/usr/local/cuda') .. '/bin/compute-sanitizer'
  if io.open(path) then return path end
  local which = io.popen('command -v compute-sanitizer 2>/dev/null'):read('*l')
  return which ~= '' and which or nil
end

local function sanitize(step, tool)
  local path = sanitizer()
  if not path then
    return fail(step, 'compute-sanitizer not found (on PATH or in $CUDA_HOME/bin): install the CUDA toolkit\'s sanitizer')
  end
  local rc, output = sh(step, ('WICK_REQUIRE_GPU=1 %s --tool %s --error-exitcode 99 --print-limit 20 %s tests/busted.lua '
    .. '--tags=gpu --exclude-tags=none tests/ops/cuda_spec.lua'):format(q(path), tool, RUN))
  local errors = output:match('ERROR SUMMARY: (%d+) error')
  step.numbers.errors = tonumber(errors)
  busted_counts(step, output)
  if rc == 99 or (errors and tonumber(errors) > 0) then fail(step, '%s reported %s errors', tool, errors or 'some') end
  if rc ~= 0 and rc ~= 99 then fail(step, 'exited %d', rc) end
end

-- The JSONL records of a trainer's log, in step order.
local function records(path)
  local list = {}
  for line in (read(path) or ''):gmatch('[^\n]+') do list[#list + 1] = json.decode(line) end
  return list
end

-- 20 steps of tiny.lua on this rank's GPU (or where args put it); returns its losses (nil when the run failed).
local function tiny(step, label, runner, args)
  local log = ('%s/tiny-%s.jsonl'):format(OUT, label)
  os.remove(log)
  -- --checkpoint.final=false: the runs compare losses, and save nothing into the checkout's checkpoints/
  local rc = sh(step, ('%s %s --steps=%d --log.sample=0 --log.file=%s --checkpoint.final=false %s'):format(runner,
    'tests/gpu/tiny_gpu.lua', TINY_STEPS, q(log), args or ''))
  local losses = {}
  for _, r in ipairs(records(log)) do losses[#losses + 1] = r.loss end
  if rc ~= 0 or #losses ~= TINY_STEPS then
    fail(step, '%s: exited %d after %d of %d steps', label, rc, #losses, TINY_STEPS)
    return nil
  end
  return losses
end

-- The largest |a - b| / |b| over the steps.
local function worst_relative(a, b)
  local worst = 0
  for i = 1, #b do worst = math.max(worst, math.abs(a[i] - b[i]) / math.abs(b[i])) end
  return worst
end

local function compare(step, what, losses, reference, tolerance)
  if not (losses and reference) then return end
  local err = worst_relative(losses, reference)
  step.numbers[what .. '_max_relative_error'] = err
  if not (err <= tolerance) then fail(step, '%s losses differ from the CPU by %.3g relative (tolerance %g)', what, err, tolerance) end
end

local tiny_gpu_fp32  -- the 1-GPU losses, which the data-parallel run is held to

local function run_tiny(step)
  local cpu = tiny(step, 'cpu', RUN, '--model.device=cpu --data.device=cpu')
  tiny_gpu_fp32 = tiny(step, 'gpu-fp32', RUN)
  local bf16 = tiny(step, 'gpu-bf16', RUN, '--precision=bf16')
  step.numbers.cpu_losses, step.numbers.gpu_fp32_losses, step.numbers.gpu_bf16_losses = cpu, tiny_gpu_fp32, bf16
  compare(step, 'fp32', tiny_gpu_fp32, cpu, FP32_REL_TOL)
  compare(step, 'bf16', bf16, cpu, BF16_REL_TOL)
end

-- An llm.c token file (256 int32 header: magic, version 1, token count; then uint16 tokens) of
-- SYNTHETIC_TOKENS tokens uniform over GPT-2's vocabulary from a fixed LCG, documents of
-- SYNTHETIC_DOC tokens each ended by EOS.
local function write_synthetic(path)
  local header = ffi.new('int32_t[256]')
  header[0], header[1], header[2] = 20240520, 1, SYNTHETIC_TOKENS
  local tokens = ffi.new('uint16_t[?]', SYNTHETIC_TOKENS)
  local x = 1337
  for i = 0, SYNTHETIC_TOKENS - 1 do
    x = (x * 1103515245 + 12345) % 2147483648
    tokens[i] = (i + 1) % SYNTHETIC_DOC == 0 and GPT2_EOS or math.floor(x / 65536) % (GPT2_VOCAB - 1)
  end
  local f = assert(io.open(path, 'wb'))
  f:write(ffi.string(header, 1024), ffi.string(tokens, 2 * SYNTHETIC_TOKENS))
  f:close()
end

local function run_gpt2(step)
  local data, bin, log, memory = OUT .. '/gpt2-synthetic', OUT .. '/gpt2-synthetic.bin', OUT .. '/gpt2.jsonl', OUT .. '/gpt2-memory.csv'
  write_synthetic(bin)
  os.execute('rm -rf ' .. q(data))
  if sh(step, ('%s -m wick.data.convert %s -o %s --tokenizer gpt2 --compression none -q'):format(RUN, q(bin), q(data))) ~= 0 then
    return fail(step, 'the synthetic dataset could not be converted')
  end
  os.remove(log)
  -- nvidia-smi samples the device's memory in use every 100 ms while the recipe trains
  local rc = sh(step, ('nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 -lms 100 > %s & smi=$!; '
    .. 'WICK_GPT2_DATA=%s %s recipes/gpt2_124m.lua --steps=%d --batch.global=%d --checkpoint.every=0 '
    .. '--checkpoint.final=false --log.every=1 --log.file=%s; rc=$?; kill $smi; exit $rc'):format(q(memory), q(data), RUN, GPT2_STEPS, GPT2_GLOBAL_BATCH, q(log)))
  local list = records(log)
  if rc ~= 0 or #list ~= GPT2_STEPS then fail(step, 'exited %d after %d of %d steps', rc, #list, GPT2_STEPS) end
  local tokens, seconds, waited = 0, 0, 0
  for i = GPT2_WARMUP_STEPS + 1, #list do
    local r = list[i]
    tokens, seconds, waited = tokens + r.tokens, seconds + r.tokens / r.tokens_per_s, waited + r.data_wait
    if not (r.loss == r.loss and math.abs(r.loss) < math.huge) then fail(step, 'step %d: loss %s', r.step, tostring(r.loss)) end
  end
  local peak_mib = 0
  for line in (read(memory) or ''):gmatch('[^\n]+') do peak_mib = math.max(peak_mib, tonumber(line) or 0) end
  if peak_mib == 0 then fail(step, 'nvidia-smi gave no memory samples') end
  local recipe = dofile(ROOT .. '/recipes/gpt2_124m.lua')
  local n = step.numbers
  n.global_batch, n.steps_measured = GPT2_GLOBAL_BATCH, math.max(0, #list - GPT2_WARMUP_STEPS)
  if seconds > 0 then
    n.tokens_per_s = tokens / seconds
    n.mfu = cost.mfu(recipe.model, recipe.data.seq_len, n.tokens_per_s, recipe.log.peak_flops)
    n.mfu_formula = ('tokens/s x (6 x %d parameters + 6 x layers x dim x (seq_len + 1), causal attention) / %g FLOP/s '
      .. '(the recipe\'s log.peak_flops: H100 SXM dense bf16)'):format(cost.parameter_count(recipe.model), recipe.log.peak_flops)
    n.data_stall_percent = 100 * waited / seconds
  end
  n.peak_gpu_memory_gib = peak_mib / 1024
  n.peak_gpu_memory_source = 'nvidia-smi memory.used of device 0, sampled every 100 ms'
end

local function device_count() return tonumber(C.wk_cuda_device_count()) end

-- The most tensor memory a rank of the run logged to label's log held (its last record's).
local function peak_bytes(label)
  local last = records(('%s/tiny-%s.jsonl'):format(OUT, label))
  last = last[#last]
  local most = 0
  for _, r in ipairs(last and last.ranks or {}) do most = math.max(most, r.peak_bytes) end
  return most
end

local function run_nccl(step)
  local rc, output = sh(step, RUN .. ' tests/fixtures/dist/nccl_smoke.lua')
  if rc ~= 0 or not output:find('nccl smoke ok', 1, true) then fail(step, 'nccl_smoke.lua exited %d', rc) end
  local gpus = device_count()
  step.numbers.gpus = gpus
  local reference = tiny_gpu_fp32 or tiny(step, 'gpu-fp32', RUN)
  -- sharded weights gathered into GPU buffers block by block: one rank, the plain run's losses
  compare(step, 'shard_parameters_1_gpu', tiny(step, 'gpu-shard-parameters', RUN, '--parallel.shard=parameters'),
    reference, FP32_REL_TOL)
  if gpus < 2 then
    step.numbers.data_parallel = 'skipped: 1 GPU (data-parallel training needs 2 or more)'
    return
  end
  local ranks = RUN .. ' --nproc-per-node ' .. gpus
  compare(step, 'data_parallel_' .. gpus .. '_gpus', tiny(step, 'gpu-' .. gpus .. '-ranks', ranks), reference, FP32_REL_TOL)
  -- the gradients all-reduced in bf16 over NCCL: within bf16's reach of the fp32 run
  compare(step, 'data_parallel_bf16_grads_' .. gpus .. '_gpus',
    tiny(step, 'gpu-' .. gpus .. '-ranks-bf16-grads', ranks, '--parallel.grad_dtype=bf16'), reference, BF16_REL_TOL)
  -- each sharding level over NCCL, as make bench's CPU rows: the same losses, and a rank's peak
  step.numbers.peak_bytes = { none = peak_bytes('gpu-' .. gpus .. '-ranks') }
  for _, level in ipairs({ 'optimizer', 'gradients', 'parameters' }) do
    local label = ('gpu-%d-ranks-shard-%s'):format(gpus, level)
    compare(step, ('shard_%s_%d_gpus'):format(level, gpus), tiny(step, label, ranks, '--parallel.shard=' .. level),
      reference, FP32_REL_TOL)
    step.numbers.peak_bytes[level] = peak_bytes(label)
  end
end

-- The specs that hold gpu-tagged tests: the tests make test-gpu runs, without loading every other
-- spec of the suite (minutes of their setup).
local function gpu_specs()
  local files = {}
  for path in io.popen(('cd %s && grep -rl "#gpu" tests --include="*_spec.lua" | sort'):format(q(ROOT))):lines() do
    files[#files + 1] = path
  end
  return table.concat(files, ' ')
end

local STEPS = {
  { 'test_gpu', function(step) busted(step, 'WICK_REQUIRE_GPU=1', '--tags=gpu --exclude-tags=none ' .. gpu_specs()) end },
  { 'test_gpu_realistic', function(step)
    busted(step, 'WICK_REQUIRE_GPU=1 WICK_GPU_SHAPES=realistic', '--tags=gpu --exclude-tags=none tests/gpu/shapes_spec.lua')
  end },
  { 'memcheck', function(step) sanitize(step, 'memcheck') end },
  { 'racecheck', function(step) sanitize(step, 'racecheck') end },
  { 'tiny_cpu_vs_gpu', run_tiny },
  { 'gpt2_124m', run_gpt2 },
  { 'nccl', run_nccl },
}

os.execute('mkdir -p ' .. q(OUT))
local gpu_name = io.popen('nvidia-smi --query-gpu=name --format=csv,noheader -i 0 2>/dev/null'):read('*l')
local report = { gpu = gpu_name or '?', gpus = device_count(), build = core.build_info().build_flags, steps = {} }
local started, failed = now(), 0
for _, entry in ipairs(STEPS) do
  local name = entry[1]
  local step = { name = name, commands = {}, numbers = {}, reasons = {}, timeout_s = TIMEOUTS[name] }
  os.remove(('%s/%s.log'):format(OUT, name))
  local t0 = now()
  step.deadline = t0 + step.timeout_s
  local ok, err = pcall(entry[2], step)
  if not ok then fail(step, 'the check itself failed: %s', tostring(err)) end
  step.deadline = nil
  step.seconds = now() - t0
  step.status = #step.reasons == 0 and 'pass' or 'fail'
  if step.status == 'fail' then
    failed = failed + 1
    step.log_tail = step.log and (read(step.log) or ''):sub(-LOG_TAIL_BYTES) or nil
  end
  print(('gpu-check: %-20s %s (%.0f s)%s'):format(name, step.status, step.seconds,
    #step.reasons > 0 and ': ' .. table.concat(step.reasons, '; ') or ''))
  io.stdout:flush()
  report.steps[#report.steps + 1] = step
end
report.seconds = now() - started
report.passed = failed == 0
local path = OUT .. '/report.json'
local f = assert(io.open(path, 'wb'))
f:write(json.encode(report), '\n')
f:close()
print(('gpu-check: %d of %d steps passed; report: %s'):format(#STEPS - failed, #STEPS, path))
os.exit(failed == 0 and 0 or 1)
