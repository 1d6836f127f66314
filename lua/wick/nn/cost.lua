-- wick.nn.cost: what one training step of a GPT-2 asks of the hardware, computed from its shape:
-- parameters, FLOPs, the FLOPs and bytes of each kernel, and MFU. The one place these formulas live:
-- the log's MFU (wick.train), `make bench`'s design figures (tests/bench/gpu_design.lua),
-- `make gpu-check`'s MFU and docs/gpu.md's tables all read them.
--
-- A shape m is { layers =, heads =, dim =, vocab =, seq_len = } (wick.nn.gpt's fields); B is the
-- micro batch in rows. Figures are design figures: what the formulas give, never a timing.
local cost = {}

local F32 = 4  -- bytes of an f32 value: master weights, their gradients, AdamW's moments

-- Parameters of one block of a GPT-2 of this shape: attention and MLP, their LayerNorms.
function cost.block_parameter_count(m)
  local C = m.dim
  return 12 * C * C + 13 * C
end

-- Parameters of a GPT-2 of this shape: embeddings, blocks, the final LayerNorm; the output
-- projection is tied.
function cost.parameter_count(m)
  local C = m.dim
  return m.vocab * C + m.seq_len * C + m.layers * cost.block_parameter_count(m) + 2 * C
end

-- Attention's FLOPs per trained token, forward + backward, on causal rows of T tokens: query t scores
-- and weighs the t keys up to it, 2 C FLOPs a key for QK^T and as many for PV forward, twice that
-- backward, so a row's mean is 12 L C (T + 1) / 2 (PaLM's appendix B counts the full T x T square,
-- 12 L C T, which the kernels compute but half of which the mask throws away). T is the sequence
-- length trained (data.seq_len), not the positions the model has room for.
function cost.attention_flops_per_token(m, T)
  return 6 * m.layers * m.dim * (T + 1)
end

-- FLOPs per trained token on rows of T tokens, forward + backward: 6 per parameter (2 forward, 4
-- backward) plus attention's. `parameters` (default: a GPT-2's of this shape) lets another decoder
-- (wick.nn.llama) count its own.
function cost.flops_per_token(m, T, parameters)
  assert(type(T) == 'number' and T >= 1, 'cost.flops_per_token: T, the trained sequence length, is needed')
  return 6 * (parameters or cost.parameter_count(m)) + cost.attention_flops_per_token(m, T)
end

-- Model FLOPs utilization: the share of `peak_flops` (FLOP/s, all devices together) that
-- tokens_per_s trained tokens a second, in rows of T, use.
function cost.mfu(m, T, tokens_per_s, peak_flops, parameters)
  return cost.flops_per_token(m, T, parameters) * tokens_per_s / peak_flops
end

-- The bytes of one [N, 4C] activation of the MLP (its pre-activation, or the GELU of it).
local function hidden_bytes(m, B, S) return S * B * m.seq_len * 4 * m.dim end

-- The kernels of one step of micro batch B whose activations are stored in `storage` bytes (4 for
-- f32, 2 for bf16): a list of { name =, flops =, bytes =, calls = }, flops and bytes per call, calls
-- per step (forward and backward kernels listed apart; a GEMM's backward is two GEMMs of its size,
-- counted in its calls' FLOPs by the step's 3x). Bytes are each kernel's compulsory traffic: every
-- operand read or written once, as a kernel that keeps its tiles on chip would. The attention GEMMs
-- count the full T x T square, as they compute it. The GELU runs in the MLP's GEMMs (their
-- epilogues), and is listed as what it adds to them: the up-projection writes the pre-activation
-- beside its GELU, the down-projection's input gradient reads it back.
function cost.kernels(m, B, storage)
  local V, T, L, NH, C = m.vocab, m.seq_len, m.layers, m.heads, m.dim
  local S = storage or F32
  local N, hs = B * T, C / NH
  local hidden = hidden_bytes(m, B, S)
  local att = B * NH * T * T  -- the probabilities of one layer, stored like the activations
  local function gemm(name, M, K, Nn, calls)
    return { name = name, flops = 2 * M * K * Nn, bytes = S * (M * K + K * Nn + M * Nn), calls = calls }
  end
  return {
    gemm('qkv', N, C, 3 * C, L),
    { name = 'attention QK^T', flops = 2 * att * hs, bytes = S * (2 * N * C + att), calls = L },
    { name = 'attention PV', flops = 2 * att * hs, bytes = S * (att + 2 * N * C), calls = L },
    gemm('attention projection', N, C, C, L),
    gemm('mlp up', N, C, 4 * C, L),
    gemm('mlp down', N, 4 * C, C, L),
    gemm('classifier', N, C, V, 1),
    { name = 'causal softmax', flops = 0, bytes = 2 * S * att, calls = L },
    { name = 'softmax backward', flops = 0, bytes = 3 * S * att, calls = L },
    -- ln_1 and ln_f alone; ln_2 with the residual add before it (x1 = x + attn: x and attn read, x1
    -- and the norm written), a block's second residual add on its own. The backward of the adds is
    -- the norms' accumulation into their input's gradient, the residual stream's.
    { name = 'layernorm', flops = 0, bytes = 2 * S * N * C, calls = L + 1 },
    { name = 'residual add + layernorm', flops = 0, bytes = 4 * S * N * C, calls = L },
    { name = 'residual add', flops = 0, bytes = 3 * S * N * C, calls = L },
    { name = 'layernorm backward', flops = 0, bytes = 4 * S * N * C, calls = 2 * L + 1 },
    { name = 'gelu (mlp up epilogue)', flops = 0, bytes = hidden, calls = L },
    { name = 'gelu backward (mlp down epilogue)', flops = 0, bytes = hidden, calls = L },
    { name = 'cross-entropy', flops = 0, bytes = S * N * V, calls = 1 },
    { name = 'cross-entropy backward', flops = 0, bytes = 3 * S * N * V, calls = 1 },
    -- reads parameter, gradient and both moments, writes parameter and moments: all f32
    { name = 'adamw', flops = 0, bytes = 7 * F32 * cost.parameter_count(m), calls = 1 },
  }
end

-- The bytes a step's fused residual adds save, forward and backward, next to separate ops: forward,
-- ln_2 reads x1 once less (the add writes it); backward, the residual stream's gradient updated in
-- place needs no copy into x1's gradient (a read, a write), no add into the input's (two reads, a
-- write) and no zero fill of that (a write). Per layer, in passes over [N, C].
function cost.residual_fusion_saving(m, B, storage)
  local pass = (storage or F32) * B * m.seq_len * m.dim
  return m.layers * pass, m.layers * 6 * pass
end

-- GELU passes of their own (llm.c's unfused kernels, and Wick's before the epilogues) moved 6 [N, 4C]
-- activations a layer: forward read the pre-activation and wrote its GELU, backward read the GELU
-- output's gradient, the pre-activation and the gradient it added to, and wrote that. The epilogues
-- move 2 (cost.kernels). The bytes a step of micro batch B saves, of those the kernels list counts
-- (not the zero fills of the two [N, 4C] gradients the separate passes added into, also gone).
function cost.gelu_epilogue_saving(m, B, storage)
  local SEPARATE_PASSES, EPILOGUES = 2 + 4, 2
  return (SEPARATE_PASSES - EPILOGUES) * hidden_bytes(m, B, storage or F32) * m.layers
end

-- The FLOPs of one forward: the kernels' FLOPs times their calls (a step is about 3 of these).
function cost.forward_flops(m, B)
  local flops = 0
  for _, k in ipairs(cost.kernels(m, B)) do flops = flops + k.flops * k.calls end
  return flops
end

-- Bytes a step moves, kernel by kernel ({ name =, bytes = } for all its calls), and their total.
function cost.bytes_per_step(m, B, storage)
  local list, total = {}, 0
  for _, k in ipairs(cost.kernels(m, B, storage)) do
    list[#list + 1] = { name = k.name, bytes = k.bytes * k.calls }
    total = total + k.bytes * k.calls
  end
  return list, total
end

return cost
