-- gpt2_124m.lua: GPT-2 small (124M parameters: 12 layers, 12 heads, width 768, context 1024) as
-- llm.c and nanoGPT train it: a global batch of 512 x 1024 = 524288 tokens (about 0.5M), AdamW
-- 6e-4 with 700 warmup steps and cosine decay to 6e-5, bf16, gradient clipping at 1.0, 19073 steps
-- (10B tokens). For GPUs: every rank on its own (the default device 'auto': cuda:LOCAL_RANK), batches
-- copied there by the loader.
--   ./run --nproc-per-node 8 recipes/gpt2_124m.lua
--   ./run --dry-run --nproc-per-node 8 recipes/gpt2_124m.lua   # checks and plans it for this machine's devices
-- The data is a GPT-2-tokenized sharded dataset at WICK_GPT2_DATA (a URL of its index.json, or a
-- local directory). The log's MFU is against log.peak_flops (H100 SXM dense bf16; set yours).
local wick = require 'wick'

local DATA = os.getenv('WICK_GPT2_DATA') or 'https://data.wick.example/fineweb-edu-10B-gpt2/index.json'
local H100_BF16_FLOPS = 989e12

return {
  model = { layers = 12, heads = 12, dim = 768, vocab = 50304, seq_len = 1024 },
  data = { sources = { DATA }, seq_len = 1024 },
  batch = { global = 512, micro = 16 },
  precision = 'bf16',
  optim = { lr = 6e-4, betas = { 0.9, 0.95 }, weight_decay = 0.1, clip = 1.0, schedule = 'cosine', warmup = 700,
            min_lr = 6e-5 },
  steps = 19073,
  seed = 1337,
  checkpoint = { every = 1000, dir = wick.recipe.build_dir .. '/gpt2_124m/checkpoints', keep = 3 },
  log = { every = 10, peak_flops = H100_BF16_FLOPS },
}
