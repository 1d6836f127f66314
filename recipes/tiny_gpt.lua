-- tiny_gpt.lua: trains a small GPT-2 on CPU, fed by the streaming loader (one rank).
--   ./run recipes/tiny_gpt.lua --data build/demo/data --steps 60
-- Each step accumulates `global_batch / micro_batch` micro-batches; the loss is normalized by the
-- step's global count of target tokens, so the gradient does not depend on the accumulation split.
-- Batches are borrowed as tensors straight from the loader's ring (no copy). At the end the weights
-- are saved with Hugging Face GPT-2 names and the loader's cursor next to them.
local cli = require 'wick.cli'
local core = require 'wick.core'
local wick = require 'wick'
local T = wick.tensor

local opts = cli.parse({ name = 'recipes/tiny_gpt.lua', options = {
  { 'data', 'dir', required = true, help = 'dataset directory (bytes tokenizer)' },
  { 'steps', 'number', default = 60, help = 'optimizer steps' },
  { 'seq_len', 'number', default = 64, help = 'context length' },
  { 'global_batch', 'number', default = 16, help = 'samples per step' },
  { 'micro_batch', 'number', default = 8, help = 'samples per forward/backward' },
  { 'layers', 'number', default = 2 }, { 'heads', 'number', default = 4 }, { 'dim', 'number', default = 64 },
  { 'lr', 'number', default = 3e-3, help = 'peak learning rate (linear warmup, cosine decay)' },
  { 'precision', 'string', default = 'fp32', help = 'fp32, bf16 or fp16 (loss scaling)' },
  { 'out', 'dir', help = 'write model.safetensors and cursor.txt here' },
} }, { ... })

local WARMUP = math.max(1, math.floor(opts.steps / 10))
local REPORTS = 10

local vocab = assert(wick.dataset.open(opts.data)).vocab_size
local loader = wick.data.loader { data = opts.data, seq_len = opts.seq_len, global_batch = opts.global_batch,
  micro_batch = opts.micro_batch, world_size = 1, rank = 0, seed = 0 }
local model = wick.nn.gpt { vocab = vocab, seq_len = opts.seq_len, layers = opts.layers, heads = opts.heads,
  dim = opts.dim, precision = opts.precision, seed = 0 }
local function lr_at(step)
  if step <= WARMUP then return opts.lr * step / WARMUP end
  return opts.lr * 0.5 * (1 + math.cos(math.pi * (step - WARMUP) / math.max(1, opts.steps - WARMUP)))
end
local opt = wick.optim.adamw { lr = lr_at, betas = { 0.9, 0.95 }, weight_decay = 0.1, clip = 1.0 }

-- Packed rows: every target counts, so the step's global token count is known up front.
local step_tokens = opts.global_batch * opts.seq_len
local start, waited_ns = core.now(), 0
local report_every = math.max(1, math.floor(opts.steps / REPORTS))
for step = 1, opts.steps do
  model:zero_grad()
  local loss, batch = 0, nil
  repeat
    batch = assert(loader:next(), 'the stream ended')
    waited_ns = waited_ns + batch.wait_ns
    local tokens = T.borrow(batch.tokens, { batch.rows, opts.seq_len + 1 }, 'i32', batch)
    local mask = T.borrow(batch.loss_mask, { batch.rows, opts.seq_len }, 'u8', batch)
    loss = loss + model:forward_tokens(tokens, mask, step_tokens)
    model:backward()
    tokens:free()
    mask:free()
  until batch.micro_step == batch.micro_steps - 1
  local applied, norm = opt:step(model)
  if step % report_every == 0 or step == 1 or step == opts.steps then
    local elapsed = core.now() - start
    print(('step %4d/%d  loss %.4f  grad norm %6.3f  lr %.2e  %6.0f tokens/s  data stall %4.1f%%%s'):format(step,
      opts.steps, loss, norm, lr_at(step), step * step_tokens / elapsed, 100 * waited_ns * 1e-9 / elapsed,
      applied and '' or '  (step skipped: overflow)'))
  end
end

if opts.out then
  os.execute(("mkdir -p '%s'"):format(opts.out))
  model:save(opts.out .. '/model.safetensors')
  local f = assert(io.open(opts.out .. '/cursor.txt', 'wb'))
  f:write(loader:state(), '\n')
  f:close()
  print('saved ' .. opts.out .. '/model.safetensors and cursor.txt')
end
loader:close()
model:free()
opt:free()
