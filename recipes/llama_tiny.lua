-- llama_tiny.lua: a small Llama (RMSNorm, RoPE, grouped-query attention, SwiGLU) trained from scratch
-- (on this machine's GPUs, else its CPU) on the embedded corpus (converted once into build/demo/data), as tiny.lua trains a GPT-2:
-- the same data, batch and optimizer, a model of about the same size. Every checkpoint is a Hugging
-- Face model directory (config.json beside model.safetensors) that wick.nn.from_pretrained and
-- transformers load.
--   ./run --nproc-per-node 2 recipes/llama_tiny.lua
--   ./run recipes/llama_tiny.lua --steps=20 --checkpoint.every=10
--   ./run --dry-run recipes/llama_tiny.lua                         # parameters and memory
local wick = require 'wick'

-- tiny.lua's job (data, batch, optimizer, steps) with a Llama in place of its GPT-2.
local job = wick.recipe.copy(wick.recipe.include 'tiny.lua')
job.model = { arch = 'llama', layers = 2, heads = 4, kv_heads = 2, dim = 64, ffn_dim = 176, rope_theta = 10000 }
job.checkpoint.dir = wick.recipe.build_dir .. '/llama_tiny/checkpoints'
return job
