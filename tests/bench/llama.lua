-- Llama on the CPU next to transformers (issue 19), measured in this run on the same model: a
-- random LlamaForCausalLM (CONFIG: grouped-query attention, an untied head) that transformers makes
-- and saves in f32 shards (tests/bench/llama_hf.py, in build/test/hf-venv), which Wick then loads.
--   ./run tests/bench/llama.lua     (make bench runs it; about a minute, plus third_party/hf-venv.sh
--                                    the first time; without the venv the baselines are n/a)
-- Rows (goals from the issue):
--   training tok/s   wick.nn.from_pretrained + wick.optim.adamw, zero_grad/forward/backward/clipped
--                    step on a fixed batch, best of STEPS, next to transformers' LlamaForCausalLM with
--                    torch.optim.AdamW on the same batch and threads; goal x2
--   loading          wick.nn.from_pretrained of the sharded directory (its files in the page cache),
--                    next to reading the same files (cat > /dev/null); goal: at least their speed
--                    (x1.0), and a peak of tensor memory at most 1.1x the weights the model
--                    keeps (its gradients come with the first backward)
--   generation tok/s greedy, KV cache, PROMPT tokens then NEW, next to transformers' generate; goal x1
--   recompute        model.recompute = 'blocks' next to keeping every block's activations: the
--                    step's peak of tensor memory (goal: at most 0.8x) and its tokens/s (a forward of
--                    every block but the last again: goal at least 0.7x)
package.path = require('wick.host').home .. '/tests/bench/lib/?.lua;' .. package.path
local ffi = require 'ffi'
local report = require 'report'
local host = require 'wick.host'
local wick = require 'wick'
local T = wick.tensor

local CONFIG = { vocab_size = 4096, hidden_size = 256, intermediate_size = 688, num_hidden_layers = 4,
  num_attention_heads = 8, num_key_value_heads = 4, max_position_embeddings = 256, rms_norm_eps = 1e-5,
  rope_theta = 10000.0, tie_word_embeddings = false }
local BATCH, TIME, STEPS = 8, 128, 5
local PROMPT, NEW = 16, 64
local LOAD_REPEATS = 30 -- a load takes milliseconds, and so does starting cat: the best of many
local THREADS = tonumber(io.popen('nproc'):read('*l')) or 1
local DIR = host.home .. '/build/bench/llama'
local MODEL = DIR .. '/model'
local PYTHON = host.home .. '/build/test/hf-venv/bin/python'
local ORACLE = host.home .. '/tests/bench/llama_hf.py'

local venv_out, venv_ok = report.capture(("sh '%s/third_party/hf-venv.sh'"):format(host.home))
if not venv_ok then
  report.na('Llama on the CPU', 'no Hugging Face venv (transformers): ' .. venv_out:gsub('\n', ' '):sub(1, 160))
  return
end
if not report.exists(MODEL .. '/config.json') then
  report.sh('llama bench', ("mkdir -p '%s' && '%s' '%s' make '%s' '%s'"):format(DIR, PYTHON, ORACLE, MODEL,
    require('wick.json').encode(CONFIG)))
end

local function baseline(args)
  local out, ok = report.capture(("'%s' '%s' %s"):format(PYTHON, ORACLE, args))
  local rate = ok and tonumber(out:match('tokens_per_s ([%d.]+)'))
  if not rate then error('llama bench: transformers baseline failed:\n' .. out) end
  return rate
end

-- ---- loading ---------------------------------------------------------------------------------------

local files = ("'%s'/*.safetensors"):format(MODEL)
report.sh('llama bench', 'cat ' .. files .. ' > /dev/null', true) -- both read from the page cache
local read = report.best(LOAD_REPEATS, function() report.sh('llama bench', 'cat ' .. files .. ' > /dev/null', true) end)
local weights_bytes, resident, peak = 0, 0, 0
local load = report.best(LOAD_REPEATS, function()
  local before = T.memory('cpu').in_use
  T.reset_peak('cpu')
  local model = wick.nn.from_pretrained(MODEL)
  local after = T.memory('cpu')
  peak, resident = after.peak - before, after.in_use - before
  weights_bytes = model:parameter_count() * 4
  model:free()
end)
print(('model: %d layers, dim %d, %d heads (%d kv), ffn %d, vocab %d: %.2fM parameters, %d threads'):format(
  CONFIG.num_hidden_layers, CONFIG.hidden_size, CONFIG.num_attention_heads, CONFIG.num_key_value_heads,
  CONFIG.intermediate_size, CONFIG.vocab_size, weights_bytes / 4 / 1e6, THREADS))
report.row('load sharded f32 checkpoint (s)', load, 's', 'cat of its files', read, false, 1.0)
-- A loaded model holds its f32 weights; the load itself may add at most 10% of them on top.
report.row('load: peak tensor memory (MiB)', peak / 2 ^ 20, 'MiB', 'the f32 weights the model keeps',
  resident / 2 ^ 20, false, 1 / 1.1)

-- ---- training --------------------------------------------------------------------------------------

local function fixed(shape, seed, modulo)
  local t = T.empty(shape, 'i32')
  local p = ffi.cast('int32_t *', t:data())
  for i = 0, t:numel() - 1 do p[i] = (i * seed + 7) % modulo end
  return t
end

local inputs, targets = fixed({ BATCH, TIME }, 7919, CONFIG.vocab_size), fixed({ BATCH, TIME }, 104729, CONFIG.vocab_size)

-- A model loaded with `recompute`, its optimizer, and its training step.
local function trainer(recompute)
  local m = wick.nn.from_pretrained(MODEL, { recompute = recompute })
  local o = wick.optim.adamw { lr = 1e-4, weight_decay = 0.1, clip = 1.0 }
  return m, o, function()
    m:zero_grad()
    m:forward(inputs, targets)
    m:backward()
    o:step(m)
  end
end

-- The best step time of STEPS and the peak of tensor memory over the first step (buffers, gradients
-- and moments made), from before the model's load.
local function measured(recompute)
  local before = T.memory('cpu').in_use
  T.reset_peak('cpu')
  local m, o, step = trainer(recompute)
  step()
  local peak_bytes = T.memory('cpu').peak - before
  return m, o, step, report.best(STEPS, step), peak_bytes
end

local model, opt, _, train, kept_peak = measured('none')
report.row('Llama training on the CPU (tok/s)', BATCH * TIME / train, 'tok/s', 'transformers, same model',
  baseline(('train %q %d %d %d %d'):format(MODEL, BATCH, TIME, STEPS, THREADS)), true, 2.0)
do
  local m, o, _, seconds, recomputed_peak = measured('blocks')
  report.row('recompute=blocks: step peak memory (MiB)', recomputed_peak / 2 ^ 20, 'MiB', 'recompute=none',
    kept_peak / 2 ^ 20, false, 1 / 0.8)
  report.row('recompute=blocks: training (tok/s)', BATCH * TIME / seconds, 'tok/s', 'recompute=none',
    BATCH * TIME / train, true, 0.7)
  m:free()
  o:free()
end

-- ---- generation ------------------------------------------------------------------------------------

local prompt = fixed({ 1, PROMPT }, 31, CONFIG.vocab_size)
local function generate() model:generate(prompt, { max_new_tokens = NEW }):free() end
generate()
local seconds = report.best(3, generate)
report.row('greedy generation, KV cache (tok/s)', NEW / seconds, 'tok/s', "transformers' generate",
  baseline(('generate %q %d %d %d'):format(MODEL, PROMPT, NEW, THREADS)), true, 1.0)
model:free()
opt:free()
