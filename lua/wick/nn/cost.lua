-- wick.nn.cost: what one training step of a GPT-2 costs, computed from its shape: parameters, FLOPs,
-- the bytes each kernel family moves, and MFU. The log's MFU (wick.train), `make bench`'s design
-- figures (tests/bench/gpu_design.lua) and `make gpu-check`'s MFU all read these formulas.
--
-- A shape m is { layers =, heads =, dim =, vocab =, seq_len = } (wick.nn.gpt's fields); B is the
-- micro batch in rows. Figures are design figures: what the formulas give, never a timing.
local cost = {}

local F32 = 4  -- bytes of an activation, gradient or optimizer value: the CUDA backend computes in f32

-- Parameters of a GPT-2 of this shape: embeddings, blocks (attention and MLP, their LayerNorms),
-- the final LayerNorm; the output projection is tied.
function cost.parameter_count(m)
  local C, L = m.dim, m.layers
  local per_block = 12 * C * C + 13 * C
  return m.vocab * C + m.seq_len * C + L * per_block + 2 * C
end

-- FLOPs per trained token, forward + backward: 6 per parameter (2 forward, 4 backward) plus
-- attention's scores and weighted sum, 12 L C T (PaLM's appendix B; llm.c counts the same way).
function cost.flops_per_token(m)
  return 6 * cost.parameter_count(m) + 12 * m.layers * m.dim * m.seq_len
end

-- Model FLOPs utilization: the share of `peak_flops` (FLOP/s, all devices together) that
-- tokens_per_s trained tokens a second use.
function cost.mfu(m, tokens_per_s, peak_flops)
  return cost.flops_per_token(m) * tokens_per_s / peak_flops
end

-- The bytes a matmul of (N x C) by (C x OC) moves: forward reads the input and the weight and
-- writes the output; backward reads the output's gradient, the input and the weight, writes the
-- input's gradient and accumulates the weight's (read and written).
local function matmul_bytes(N, C, OC)
  local forward = N * C + C * OC + N * OC
  local backward = N * OC + N * C + C * OC + N * C + 2 * C * OC
  return F32 * (forward + backward)
end

-- Bytes moved by one training step of micro batch B, by kernel family: the compulsory traffic of
-- each kernel (every operand and saved activation read or written once, as a kernel that keeps
-- its tiles on chip would), forward + backward, f32. A list of { family =, bytes = } in the order
-- a step runs them, and their total.
function cost.bytes_per_step(m, B)
  local C, L, T, V, NH = m.dim, m.layers, m.seq_len, m.vocab, m.heads
  local N = B * T
  local NC, scores = N * C, B * NH * T * T
  local P = cost.parameter_count(m)
  local families = {
    -- wte and wpe rows read, the sum written; backward reads dout and accumulates both tables' rows
    { family = 'embedding', bytes = F32 * (3 * NC + 5 * NC) },
    -- 2 per block + the final one: forward reads and writes a row; backward reads dout and the
    -- input, accumulates dinp (read and written)
    { family = 'layernorm', bytes = F32 * (2 * L + 1) * (2 * NC + 4 * NC) },
    -- qkv, attention projection, MLP up and down per block, and the tied classifier
    { family = 'matmul', bytes = L * (matmul_bytes(N, C, 3 * C) + matmul_bytes(N, C, C) + matmul_bytes(N, C, 4 * C)
        + matmul_bytes(N, 4 * C, C)) + matmul_bytes(N, C, V) },
    -- forward reads qkv, writes the (B, NH, T, T) weights it keeps for backward and the output;
    -- backward reads dout, qkv and the weights, writes dqkv
    { family = 'attention', bytes = F32 * L * ((3 * NC + scores + NC) + (NC + 3 * NC + scores + 3 * NC)) },
    -- on the (N, 4C) MLP activation: forward reads and writes it; backward reads dout and the input, writes dinp
    { family = 'gelu', bytes = F32 * L * (2 * 4 * NC + 3 * 4 * NC) },
    -- the two residual sums per block: two rows read, one written
    { family = 'residual', bytes = F32 * L * 2 * 3 * NC },
    -- forward reads the logits (writes a loss per row); backward reads them again, writes dlogits
    { family = 'cross_entropy', bytes = F32 * (N * V + N + 2 * N * V) },
    -- reads parameter, gradient and both moments, writes parameter and moments
    { family = 'adamw', bytes = F32 * 7 * P },
  }
  local total = 0
  for _, f in ipairs(families) do total = total + f.bytes end
  return families, total
end

return cost
