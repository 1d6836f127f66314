-- GPT-2 training throughput: Wick on the CPU next to PyTorch CPU (same model, batch and optimizer,
-- measured in this run), bf16 storage next to fp32 (speed, and the allocator's peak over a step),
-- per-op timings at the model's shapes, and on a GPU tokens/s and MFU.
--   ./run tests/bench/gpt.lua            (WICK_BENCH_STEPS=n to change the number of timed steps)
package.path = require('wick.host').home .. '/tests/bench/lib/?.lua;' .. package.path
local ffi = require 'ffi'
local report = require 'report'
local host = require 'wick.host'
local wick = require 'wick'
local core = require 'wick.core'
local T = wick.tensor
local C = core.C
local check = core.check

local CONFIG = { vocab = 4096, seq_len = 128, layers = 4, heads = 4, dim = 256 }
local BATCH = 8
local STEPS = tonumber(os.getenv('WICK_BENCH_STEPS')) or 6
local THREADS = tonumber(io.popen('nproc'):read('*l')) or 1
local OP_REPEATS = 5
-- Dense fp32 peak of the GPU, for MFU (H100/H200 SXM: ~67 TFLOPS without tensor cores).
local PEAK_TFLOPS = tonumber(os.getenv('WICK_PEAK_TFLOPS')) or 67

local tokens_per_step = BATCH * CONFIG.seq_len

local function batch(device)
  local shape = { BATCH, CONFIG.seq_len }
  local idx, targets = T.empty(shape, 'i32'), T.empty(shape, 'i32')
  local pi, pt = ffi.cast('int32_t *', idx:data()), ffi.cast('int32_t *', targets:data())
  for i = 0, tokens_per_step - 1 do
    pi[i], pt[i] = (i * 7919) % CONFIG.vocab, (i * 104729 + 1) % CONFIG.vocab
  end
  return idx:to(device), targets:to(device)
end

local function cpu_bytes(field)
  local stats = ffi.new('WkAllocatorStats')
  C.wk_allocator_stats(C.WK_DEVICE_CPU, 0, stats)
  return tonumber(stats[field])
end

-- Best seconds per training step (zero_grad, forward, backward, clipped AdamW), the model, and the
-- CPU allocator's peak bytes over building it and its first step.
local function wick_step_time(device, precision)
  local cfg = { device = device, precision = precision }
  for k, v in pairs(CONFIG) do cfg[k] = v end
  local before = cpu_bytes('bytes_in_use')
  C.wk_allocator_reset_peak(C.WK_DEVICE_CPU, 0)
  local model = wick.nn.gpt(cfg)
  local opt = wick.optim.adamw { lr = 1e-4, weight_decay = 0.1, clip = 1.0 }
  local idx, targets = batch(device)
  local function step()
    model:zero_grad()
    model:forward(idx, targets)
    model:backward()
    opt:step(model)
  end
  step()  -- warm-up: buffers and optimizer state are allocated here
  local peak = cpu_bytes('bytes_peak') - before
  return report.best(STEPS, step), model, peak
end

local function torch_tokens_per_s()
  local cfg = { batch = BATCH, steps = STEPS, threads = THREADS }
  for k, v in pairs(CONFIG) do cfg[k] = v end
  local parts = {}
  for k, v in pairs(cfg) do parts[#parts + 1] = ('"%s": %d'):format(k, v) end
  local command = ("/usr/bin/python3 '%s/tests/bench/gpt_torch.py' '{%s}' 2>&1"):format(host.home, table.concat(parts, ', '))
  local pipe = io.popen(command)
  local out = pipe:read('*a')
  pipe:close()
  return tonumber(out:match('tokens_per_s ([%d.]+)')), out
end

-- ---- training throughput -----------------------------------------------------------------------------

local cpu_time, model, fp32_peak = wick_step_time('cpu')
local wick_rate = tokens_per_step / cpu_time
print(('model: %d layers, dim %d, %d heads, vocab %d, T %d, batch %d (%.2fM parameters), %d threads'):format(
  CONFIG.layers, CONFIG.dim, CONFIG.heads, CONFIG.vocab, CONFIG.seq_len, BATCH, model:parameter_count() / 1e6, THREADS))
local torch_rate, torch_output = torch_tokens_per_s()
if torch_rate then
  report.row('CPU training, fp32 (wick.nn.gpt + AdamW)', wick_rate, 'tok/s', 'PyTorch CPU, same model', torch_rate, true)
else
  print(('CPU training, fp32: %.1f tok/s (PyTorch baseline skipped: %s)'):format(wick_rate, torch_output:gsub('\n', ' '):sub(1, 200)))
end
local bf16_time, bf16_model, bf16_peak = wick_step_time('cpu', 'bf16')
bf16_model:free()
report.row('CPU training, bf16 storage', tokens_per_step / bf16_time, 'tok/s', 'fp32, same model', wick_rate, true)
-- Activations halve, weights grow by their 2-byte compute copy (18 bytes a parameter with AdamW, not
-- 16): the ratio nears 1/2 as activations dominate (nn_spec asserts 65% on such a model); here the
-- weights, gradients and optimizer are over a quarter of fp32's peak.
report.row('CPU step peak memory, bf16 storage', bf16_peak / 2 ^ 20, 'MiB', 'fp32, same model', fp32_peak / 2 ^ 20, false)

-- ---- per-op timings at the model's shapes --------------------------------------------------------------

local N, CH, V, NH = tokens_per_step, CONFIG.dim, CONFIG.vocab, CONFIG.heads
local function rand(shape, seed) return T.randn(shape, { seed = seed }) end
local x, w_fc, b_fc = rand({ N, CH }, 1), rand({ CH, 4 * CH }, 2), rand({ 4 * CH }, 3)
local fc_out, dx, dw, db = T.empty({ N, 4 * CH }), T.zeros({ N, CH }), T.zeros({ CH, 4 * CH }), T.zeros({ 4 * CH })
local qkv, att_out = rand({ BATCH, CONFIG.seq_len, 3 * CH }, 4), T.empty({ BATCH, CONFIG.seq_len, CH })
local att, dqkv = T.empty({ BATCH, NH, CONFIG.seq_len, CONFIG.seq_len }), T.zeros({ BATCH, CONFIG.seq_len, 3 * CH })
local ln_out, mean, rstd, ones, zeros = T.empty({ N, CH }), T.empty({ N }), T.empty({ N }), T.full({ CH }, 1), T.zeros({ CH })
local residual, branch = T.empty({ N, CH }), rand({ N, CH }, 6)
local wte, logits, targets = rand({ V, CH }, 5), T.empty({ N, V }), select(2, batch('cpu'))
local losses, dlogits, sum = T.empty({ N }), T.zeros({ N, V }), ffi.new('double[1]')
local hidden, dpre = T.empty({ N, 4 * CH }), T.empty({ N, 4 * CH })  -- the MLP's GELU output, its pre-activation's gradient
local w_proj, dw_proj, db_proj = rand({ 4 * CH, CH }, 6), T.zeros({ 4 * CH, CH }), T.zeros({ CH })
local flat = model:flat_parameters()
local m, v = T.zeros({ flat.params:numel() }), T.zeros({ flat.params:numel() })

local ops = {
  { 'matmul fwd [N,C]x[C,4C] +bias', function() check(C.wk_op_matmul(fc_out, x, w_fc, b_fc, 0)) end },
  { 'matmul bwd', function() check(C.wk_op_matmul_backward(dx, dw, db, fc_out, x, w_fc, 0)) end },
  { 'lm head fwd [N,C]x[V,C]^T', function() check(C.wk_op_matmul(logits, x, wte, nil, 1)) end },
  { 'attention fwd', function() check(C.wk_op_attention(att_out, att, qkv, NH)) end },
  { 'attention bwd', function() check(C.wk_op_attention_backward(dqkv, att_out, qkv, att, NH)) end },
  { 'layernorm fwd', function() check(C.wk_op_layernorm(ln_out, mean, rstd, x, ones, zeros, 1e-5)) end },
  { 'residual add, then layernorm fwd', function()
    check(C.wk_op_add(residual, x, branch))
    check(C.wk_op_layernorm(ln_out, mean, rstd, residual, ones, zeros, 1e-5))
  end },
  { 'residual add + layernorm fwd, fused', function()
    check(C.wk_op_add_layernorm(residual, ln_out, mean, rstd, x, branch, ones, zeros, 1e-5))
  end },
  { 'layernorm bwd', function() check(C.wk_op_layernorm_backward(dx, ones, zeros, ln_out, x, ones, mean, rstd)) end },
  { 'gelu fwd [N,4C]', function() check(C.wk_op_gelu(fc_out, fc_out)) end },
  { 'matmul fwd +bias, GELU in the epilogue', function() check(C.wk_op_matmul_gelu(hidden, fc_out, x, w_fc, b_fc, 0)) end },
  { 'matmul bwd [N,4C]x[4C,C] through GELU', function()
    check(C.wk_op_matmul_backward_gelu(dpre, dw_proj, db_proj, x, hidden, w_proj, fc_out, 0)) end },
  { 'cross-entropy fwd [N,V]', function() check(C.wk_op_cross_entropy(losses, logits, targets:view({ N }), nil, N, sum, nil)) end },
  { 'cross-entropy bwd', function() check(C.wk_op_cross_entropy_backward(dlogits, logits, targets:view({ N }), nil, N, 1)) end },
  { 'adamw over all parameters', function() check(C.wk_op_adamw(flat.params, flat.grads, m, v, 1e-4, 0.9, 0.95, 1e-8, 0.1, 1, 1)) end },
}
print(('per-op CPU timings (best of %d; one training step = %.1f ms):'):format(OP_REPEATS, cpu_time * 1e3))
for _, op in ipairs(ops) do
  local seconds = report.best(OP_REPEATS, op[2])
  print(('  %-36s %9.3f ms  %5.1f%% of a step'):format(op[1], seconds * 1e3, 100 * seconds / cpu_time))
end

-- ---- GPU -------------------------------------------------------------------------------------------------

if C.wk_cuda_device_count() == 0 then
  print('GPU training: skipped (' .. (wick.build_info().has_cuda and 'no CUDA device' or 'built without CUDA') .. ')')
else
  local gpu_step = wick_step_time('cuda:0')
  local gpu_rate = tokens_per_step / gpu_step
  report.row('GPU training, fp32 (cuda:0)', gpu_rate, 'tok/s', 'Wick CPU, same model', wick_rate, true)
  -- the log's MFU (wick.nn.cost): 6 FLOPs per parameter per token, plus causal attention's
  local mfu = require('wick.nn.cost').mfu(CONFIG, CONFIG.seq_len, gpu_rate, PEAK_TFLOPS * 1e12, model:parameter_count())
  print(('  MFU %.2f%% of %g TFLOPS (WICK_PEAK_TFLOPS)'):format(100 * mfu, PEAK_TFLOPS))
end
