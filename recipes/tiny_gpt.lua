-- tiny_gpt.lua: trains a small GPT-2 on CPU, fed by the streaming loader, on any number of ranks.
--   ./run recipes/tiny_gpt.lua --data build/demo/data --steps 60
--   ./run --nproc-per-node 2 recipes/tiny_gpt.lua --data build/demo/data --steps 60
-- Each step takes the global batch: on W ranks, each accumulates global_batch / (W * micro_batch)
-- micro-batches, and the loss is normalized by the step's global count of target tokens, so the
-- result does not depend on W or on the accumulation split (wick.nn.data_parallel). The model reads
-- each batch where the loader's reader threads wrote it (no copy). At the end rank 0 saves the
-- weights with Hugging Face GPT-2 names and the loader's cursor next to them (it resumes on any
-- world size).
local cli = require 'wick.cli'
local core = require 'wick.core'
local wick = require 'wick'

local LOADER = wick.data.LOADER_OPTIONS
local GPT = require('wick.nn.gpt').OPTIONS
local spec = { name = 'recipes/tiny_gpt.lua', options = {
  { 'data', 'path', value = 'DIR', required = true, help = 'dataset directory (bytes tokenizer)' },
  { 'steps', 'integer', min = 1, max = 2 ^ 53, default = 60, help = 'optimizer steps' },
  cli.from(LOADER, 'seq_len', { default = 64, help = 'context length' }),
  cli.from(LOADER, 'global_batch', { default = 16, help = 'samples per step' }),
  cli.from(LOADER, 'micro_batch', { default = 8, help = 'samples per forward/backward' }),
  cli.from(GPT, 'layers', { default = 2, required = false }),
  cli.from(GPT, 'heads', { default = 4, required = false }),
  cli.from(GPT, 'dim', { default = 64, required = false }),
  { 'lr', 'number', min = 0, default = 3e-3, help = 'peak learning rate (linear warmup, cosine decay)' },
  { 'precision', 'enum', values = { 'fp32', 'bf16', 'fp16' }, default = 'fp32', help = 'fp16 uses loss scaling' },
  { 'out', 'path', value = 'DIR', help = 'write model.safetensors and cursor.txt here' },
} }
local opts = cli.parse(spec, { ... })
if opts.dim % opts.heads ~= 0 then
  cli.usage_error(spec, ('--dim %d is not divisible by --heads %d'):format(opts.dim, opts.heads))
end

local WARMUP = math.max(1, math.floor(opts.steps / 10))
local REPORTS = 10

local dist = wick.dist.init { timeout = 120 }
local loader = wick.data.loader { data = opts.data, seq_len = opts.seq_len, global_batch = opts.global_batch,
  micro_batch = opts.micro_batch, world_size = dist.world_size, rank = dist.rank, seed = 0 }
local model = wick.nn.gpt { vocab = loader:vocab_size(), seq_len = opts.seq_len, layers = opts.layers, heads = opts.heads,
  dim = opts.dim, precision = opts.precision, seed = 0 }
local function lr_at(step)
  if step <= WARMUP then return opts.lr * step / WARMUP end
  return opts.lr * 0.5 * (1 + math.cos(math.pi * (step - WARMUP) / math.max(1, opts.steps - WARMUP)))
end
local opt = wick.optim.adamw { lr = lr_at, betas = { 0.9, 0.95 }, weight_decay = 0.1, clip = 1.0 }
local dp = wick.nn.data_parallel(model, dist)

local start, waited, tokens = core.now(), 0, 0
local report_every = math.max(1, math.floor(opts.steps / REPORTS))
for step = 1, opts.steps do
  local r = assert(dp:step(loader, opt), 'the stream ended')
  waited, tokens = waited + r.ranks[dist.rank + 1].data, tokens + r.tokens
  if dist.rank == 0 and (step % report_every == 0 or step == 1 or step == opts.steps) then
    local elapsed = core.now() - start
    print(('step %4d/%d  loss %.4f  grad norm %6.3f  lr %.2e  %6.0f tokens/s  data stall %4.1f%%%s'):format(step,
      opts.steps, r.loss, r.grad_norm or 0, lr_at(step), tokens / elapsed, 100 * waited / elapsed,
      r.applied and '' or '  (step skipped: overflow)'))
    if dist.world_size > 1 then print('           ' .. dp:timing(r)) end
  end
end

if opts.out and dist.rank == 0 then
  os.execute(("mkdir -p '%s'"):format(opts.out))
  model:save(opts.out .. '/model.safetensors')
  local f, why = io.open(opts.out .. '/cursor.txt', 'wb')
  if not f then cli.fail(spec.name .. ': cannot save the cursor: ' .. why, cli.EXIT_DATA) end
  f:write(loader:state(), '\n')
  f:close()
  print('saved ' .. opts.out .. '/model.safetensors and cursor.txt')
end
loader:close()
dp:free()
model:free()
opt:free()
dist:close()
