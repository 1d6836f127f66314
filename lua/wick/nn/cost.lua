-- wick.nn.cost: what one training step of wick.nn.gpt asks of the hardware, kernel by kernel: the
-- FLOPs of the GEMMs and the bytes the memory-bound kernels move, from the shapes alone. The one
-- place these formulas live; docs/gpu.md explains the kernels behind them, and make bench prints
-- them next to the measured times.
--
--   local c = cost.gpt({ vocab = 50257, seq_len = 1024, layers = 12, heads = 12, dim = 768 },
--                      { batch = 16, bytes = 4 })   -- bytes: 4 for f32 storage, 2 for bf16
--   c.params, c.forward_flops, c.step_flops, c.kernels[i] = { name =, flops =, bytes =, calls = }
-- A kernel's flops and bytes are per call; calls is how many times a step runs it (forward and
-- backward are separate kernels). The attention GEMMs count the full T x T square, as they compute it.
local cost = {}

function cost.gpt(cfg, run)
  local V, T, L, NH, C = cfg.vocab, cfg.seq_len, cfg.layers, cfg.heads, cfg.dim
  local B, S = run.batch, run.bytes or 4
  local N, hs = B * T, C / NH
  local params = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
  local att = B * NH * T * T  -- the probabilities of one layer
  local function gemm(name, M, K, Nn, calls)
    return { name = name, flops = 2 * M * K * Nn, bytes = S * (M * K + K * Nn + M * Nn), calls = calls }
  end
  local kernels = {
    gemm('qkv', N, C, 3 * C, L),
    { name = 'attention QK^T', flops = 2 * att * hs, bytes = S * (2 * N * C) + 4 * att, calls = L },
    { name = 'attention PV', flops = 2 * att * hs, bytes = 4 * att + S * (2 * N * C), calls = L },
    gemm('attention projection', N, C, C, L),
    gemm('mlp up', N, C, 4 * C, L),
    gemm('mlp down', N, 4 * C, C, L),
    gemm('classifier', N, C, V, 1),
    { name = 'causal softmax', flops = 0, bytes = 2 * 4 * att, calls = L },
    { name = 'softmax backward', flops = 0, bytes = 3 * 4 * att, calls = L },
    { name = 'layernorm', flops = 0, bytes = 2 * S * N * C, calls = 2 * L + 1 },
    { name = 'layernorm backward', flops = 0, bytes = 4 * S * N * C, calls = 2 * L + 1 },
    { name = 'gelu', flops = 0, bytes = 2 * S * N * 4 * C, calls = L },
    { name = 'gelu backward', flops = 0, bytes = 4 * S * N * 4 * C, calls = L },
    { name = 'cross-entropy', flops = 0, bytes = S * N * V, calls = 1 },
    { name = 'cross-entropy backward', flops = 0, bytes = 3 * S * N * V, calls = 1 },
    { name = 'adamw', flops = 0, bytes = 7 * 4 * params, calls = 1 },
  }
  local forward = 0
  for _, k in ipairs(kernels) do forward = forward + k.flops * k.calls end
  return { params = params, kernels = kernels, forward_flops = forward, step_flops = 3 * forward }
end

return cost
