-- The GPU kernels' design figures for GPT-2 124M (recipes/gpt2_124m.lua: its shape, micro batch and
-- peak FLOP/s), computed by wick.nn.cost: FLOPs per step, bytes moved per step by each kernel, and
-- the MFU llm.c's published H100 rate would be. Printed next to the CPU measurements until a GPU is
-- measured (`make gpu-check` does that); every row says it is a design figure, not a timing.
local cost = require 'wick.nn.cost'
local host = require 'wick.host'

local LLMC_H100_TOKENS_PER_S = 468e3  -- llm.c's train_gpt2cu on one H100, GPT-2 124M, bf16
local H100_HBM_BYTES_PER_S = 3.35e12  -- H100 SXM HBM3

local recipe = dofile(host.home .. '/recipes/gpt2_124m.lua')
local m, B, peak = recipe.model, recipe.batch.micro, recipe.log.peak_flops
local tokens = B * m.seq_len

local function design(what, value, unit, note)
  print(('design figure (computed, not measured): %-34s %14.4g %-8s %s'):format(what, value, unit, note or ''))
end

print(('GPT-2 124M: %d layers, dim %d, %d heads, vocab %d, T %d, micro batch %d (%d tokens), %.2fM parameters'):format(
  m.layers, m.dim, m.heads, m.vocab, m.seq_len, B, tokens, cost.parameter_count(m) / 1e6))
local flops = cost.flops_per_token(m, m.seq_len) * tokens
design('FLOPs per step (fwd + bwd)', flops, 'FLOP', '6 x parameters + 6 L C (T + 1) per token (causal attention)')
local kernels, total = cost.bytes_per_step(m, B)
for _, k in ipairs(kernels) do
  design('bytes moved per step: ' .. k.name, k.bytes / 1e9, 'GB', ('%.1f%% of the step'):format(100 * k.bytes / total))
end
design('bytes moved per step: all kernels', total / 1e9, 'GB', "f32 storage, each kernel's compulsory traffic")
design('bytes saved per step: GELU in the GEMMs', cost.gelu_epilogue_saving(m, B) / 1e9, 'GB',
  'f32; the separate GELU passes less the epilogues\' traffic')
local _, total_bf16 = cost.bytes_per_step(m, B, 2)
design('bytes moved per step: all, bf16', total_bf16 / 1e9, 'GB', 'activations and P in 2 bytes; masters, moments in f32')
local forward, backward = cost.residual_fusion_saving(m, B)
design('bytes saved per step: fused residual', (forward + backward) / 1e9, 'GB',
  ('f32: %.2f forward (ln_2 reads x1 once less), %.2f backward (gradient in place)'):format(forward / 1e9, backward / 1e9))
design('step floor at peak FLOP/s', flops / peak * 1e3, 'ms', ('%g TFLOP/s (the recipe\'s log.peak_flops)'):format(peak / 1e12))
design('step floor at HBM bandwidth', total / H100_HBM_BYTES_PER_S * 1e3, 'ms', 'H100 SXM, 3.35 TB/s')
design("MFU at llm.c's H100 rate", 100 * cost.mfu(m, m.seq_len, LLMC_H100_TOKENS_PER_S, peak), '%',
  ('%.0fK tokens/s (llm.c, published)'):format(LLMC_H100_TOKENS_PER_S / 1e3))
