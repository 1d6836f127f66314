-- wick.nn.llama: the Llama architecture (and its relatives Qwen 2 and Mistral): token embedding, no
-- learned positions but rotary ones (RoPE) on q and k, pre-RMSNorm blocks, grouped-query attention,
-- a SwiGLU feed-forward, a final RMSNorm and an output head, tied to the embedding or its own. Modules
-- are named like Hugging Face's LlamaForCausalLM (model.layers.0.self_attn.q_proj.weight, ...) and
-- projections keep torch nn.Linear's [out, in] layout, so weights move to and from HF files by name.
--
--   local model = wick.nn.llama { vocab = 32000, dim = 512, layers = 8, heads = 8, kv_heads = 2,
--                                 ffn_dim = 1536, rope = { theta = 500000, type = 'llama3', factor = 8,
--                                 low_freq_factor = 1, high_freq_factor = 4,
--                                 original_max_position_embeddings = 8192 } }
--   local loss = model:forward(idx, targets, mask, count); model:backward(); model:grads()
-- forward, backward, forward_tokens, grads, flat_parameters and free behave as in wick.nn.gpt, whose
-- flat parameter storage this model shares (so wick.optim and data parallelism work unchanged).
local core = require 'wick.core'
local T = require 'wick.tensor'
local nn = require 'wick.nn.modules'
local gpt = require 'wick.nn.gpt'
local precision = require 'wick.precision'
local schema = require 'wick.schema'

local C = core.C
local check = core.check
local INIT_STD = nn.init.STD

local llama = {}

local ROPE_KINDS = { default = C.WK_ROPE_DEFAULT, linear = C.WK_ROPE_LINEAR, llama3 = C.WK_ROPE_LLAMA3 }
llama.ROPE_KINDS = ROPE_KINDS

local ROPE = schema.define('nn.llama rope option', {
  { 'theta', 'number', min = 1e-6, max = 1e12, default = 10000, help = 'base of the rotary frequencies' },
  { 'type', 'enum', values = { 'default', 'linear', 'llama3' }, default = 'default', help = 'frequency scaling' },
  { 'factor', 'number', min = 1e-6, max = 1e6, help = 'linear and llama3: how much longer the context gets' },
  { 'low_freq_factor', 'number', min = 1e-6, max = 1e6, help = 'llama3: wavelengths above context / this are slowed' },
  { 'high_freq_factor', 'number', min = 1e-6, max = 1e6, help = 'llama3: wavelengths below context / this are kept' },
  { 'original_max_position_embeddings', 'integer', min = 1, max = 2 ^ 31 - 1, help = 'llama3: the original context' },
})
llama.ROPE = ROPE

local function check_rope(value)
  local ok, err = pcall(ROPE.check, ROPE, value, 0)
  if not ok then return false, err end
  local needed = { linear = { 'factor' }, llama3 = { 'factor', 'low_freq_factor', 'high_freq_factor',
    'original_max_position_embeddings' } }
  for _, key in ipairs(needed[value.type or 'default'] or {}) do
    if value[key] == nil then return false, ("rope type '%s' needs %s"):format(value.type, key) end
  end
  return true
end

local OPTIONS = schema.define('nn.llama option', {
  { 'vocab', 'integer', min = 1, max = 2 ^ 31 - 1, required = true, help = 'token ids are below this (int32)' },
  { 'dim', 'integer', min = 1, max = 2 ^ 20, required = true, help = 'model width' },
  { 'layers', 'integer', min = 1, max = 4096, required = true, help = 'decoder layers' },
  { 'heads', 'integer', min = 1, max = 4096, required = true, help = 'query heads; divide dim' },
  { 'kv_heads', 'integer', min = 1, max = 4096, help = 'key/value heads (grouped-query attention); divide heads (default heads)' },
  { 'ffn_dim', 'integer', min = 1, max = 2 ^ 24, required = true, help = 'width of the SwiGLU feed-forward' },
  { 'rms_eps', 'number', min = 1e-12, max = 1, default = 1e-5, help = 'RMSNorm epsilon' },
  { 'rope', 'rope', check = check_rope, help = '{ theta =, type = default|linear|llama3, factor =, ... }' },
  { 'max_positions', 'integer', min = 1, max = 2 ^ 31 - 1, default = 2048, help = 'longest sequence' },
  { 'tie_embeddings', 'boolean', default = false, help = 'the output head is the token embedding' },
  { 'qkv_bias', 'boolean', default = false, help = 'q/k/v projections have biases (Qwen 2)' },
  { 'precision', 'precision', check = precision.check,
    help = "'fp32', 'bf16', 'fp16' or { 'fp16', scale = S, growth_interval = N }" },
  { 'device', 'string', help = "'cpu' or 'cuda:N' (default cpu)" },
  { 'seed', 'integer', min = 0, max = 2 ^ 32 - 1, default = 0, help = 'initialisation seed' },
  schema.from(gpt.OPTIONS, 'recompute'),
})
llama.OPTIONS = OPTIONS

-- Raises at the caller of llama.new (check_config <- build <- new).
local function check_config(cfg)
  if type(cfg) ~= 'table' then error('nn.llama expects a table of options', 4) end
  cfg = OPTIONS:check(cfg, 4)
  cfg.kv_heads = cfg.kv_heads or cfg.heads
  cfg.rope = ROPE:check(cfg.rope or {}, 4)
  local head_size = cfg.dim / cfg.heads
  if cfg.dim % cfg.heads ~= 0 or head_size % 2 ~= 0 then
    error(('nn.llama: dim %d must be heads %d times an even head size'):format(cfg.dim, cfg.heads), 4)
  end
  if cfg.heads % cfg.kv_heads ~= 0 then
    error(('nn.llama: heads %d is not a multiple of kv_heads %d'):format(cfg.heads, cfg.kv_heads), 4)
  end
  return cfg
end

-- ---- modules --------------------------------------------------------------------------------------

-- A projection: nn.Linear with its weight stored [out, in] (the files' layout), bias optional.
local Projection = nn.class(nn.Linear)
Projection.transpose_w = 1

local function projection(n_in, n_out, bias, opts)
  local self = nn.new(Projection, opts.device, opts.policy)
  self:param('weight', { n_out, n_in }, true, nn.init.normal(INIT_STD))
  if bias then self:param('bias', { n_out }, false, nn.init.constant(0)) end
  return self
end

local RMSNorm = nn.class(nn.Module)

local function rmsnorm(n, eps, opts)
  local self = nn.new(RMSNorm, opts.device, opts.policy)
  self.eps = eps
  self:param('weight', { n }, false, nn.init.constant(1))
  return self
end

-- The norm of a, or with b the norm of the residual sum a + b, written to sum in the same pass
-- (wk_op_add_rmsnorm: the bits of wk_op_add then wk_op_rmsnorm), into the output and rstd buffers
-- named prefix .. 'output' and prefix .. 'rstd': training's, or generation's ('step_').
local function normalise(self, prefix, a, b, sum)
  local x = sum or a
  local out, rstd = self:activation(prefix .. 'output', x.shape), self:buffer(prefix .. 'rstd', { x:numel() / x:size(-1) })
  if b then
    check(C.wk_op_add_rmsnorm(sum, out, rstd, a, b, self.weight, self.eps))
  else
    check(C.wk_op_rmsnorm(out, rstd, a, self.weight, self.eps))
  end
  return out
end

function RMSNorm:forward(input) return normalise(self, '', input) end

-- As nn.LayerNorm's forward_sum: the norm of a + b, the sum written to sum.
function RMSNorm:forward_sum(sum, a, b) return normalise(self, '', a, b, sum) end

function RMSNorm:backward(input, grad_output, grad_input)
  check(C.wk_op_rmsnorm_backward(grad_input, self.grad_weight, grad_output, input, self.weight, self.rstd))
end

-- Grouped-query self-attention: q/k/v projections, RoPE on q and k, the kv heads repeated into the
-- fused qkv of wk_op_attention (causal, softmax scaled by 1/sqrt(head size)), the output projection.
local Attention = nn.class(nn.Module)

local function attention(cfg, inv_freq, opts)
  local self = nn.new(Attention, opts.device, opts.policy)
  local hs = cfg.dim / cfg.heads
  self.heads, self.kv_heads, self.inv_freq = cfg.heads, cfg.kv_heads, inv_freq
  self:add('q_proj', projection(cfg.dim, cfg.heads * hs, cfg.qkv_bias, opts))
  self:add('k_proj', projection(cfg.dim, cfg.kv_heads * hs, cfg.qkv_bias, opts))
  self:add('v_proj', projection(cfg.dim, cfg.kv_heads * hs, cfg.qkv_bias, opts))
  self:add('o_proj', projection(cfg.heads * hs, cfg.dim, false, opts))
  return self
end

function Attention:forward(input)
  local B, TT = input:size(1), input:size(2)
  local q, k = self.q_proj:forward(input), self.k_proj:forward(input)
  local v = self.v_proj:forward(input)
  local q_rot, k_rot = self:activation('q_rot', q.shape), self:activation('k_rot', k.shape)
  check(C.wk_op_rope(q_rot, q, self.inv_freq, self.heads, 0))
  check(C.wk_op_rope(k_rot, k, self.inv_freq, self.kv_heads, 0))
  local width = q:size(3)
  local qkv = self:activation('qkv', { B, TT, 3 * width })
  check(C.wk_op_qkv_pack(qkv, q_rot, k_rot, v, self.heads, self.kv_heads))
  local y = self:activation('y', { B, TT, width })
  check(C.wk_op_attention(y, self:activation('att', { B, self.heads, TT, TT }), qkv, self.heads))
  return self.o_proj:forward(y)
end

function Attention:backward(input, grad_output, grad_input)
  local dy = self:zeroed('grad_y', self.y.shape)
  self.o_proj:backward(self.y, grad_output, dy)
  local dqkv = self:zeroed('grad_qkv', self.qkv.shape)
  check(C.wk_op_attention_backward(dqkv, dy, self.qkv, self.att, self.heads))
  local dq_rot, dk_rot = self:zeroed('grad_q_rot', self.q_rot.shape), self:zeroed('grad_k_rot', self.k_rot.shape)
  local dv = self:zeroed('grad_v', self.v_proj.output.shape)
  check(C.wk_op_qkv_pack_backward(dq_rot, dk_rot, dv, dqkv, self.heads, self.kv_heads))
  local dq, dk = self:zeroed('grad_q', dq_rot.shape), self:zeroed('grad_k', dk_rot.shape)
  check(C.wk_op_rope_backward(dq, dq_rot, self.inv_freq, self.heads, 0))
  check(C.wk_op_rope_backward(dk, dk_rot, self.inv_freq, self.kv_heads, 0))
  self.q_proj:backward(input, dq, grad_input)
  self.k_proj:backward(input, dk, grad_input)
  self.v_proj:backward(input, dv, grad_input)
end

-- SwiGLU feed-forward: down(silu(gate(x)) * up(x)).
local MLP = nn.class(nn.Module)

local function mlp(cfg, opts)
  local self = nn.new(MLP, opts.device, opts.policy)
  self:add('gate_proj', projection(cfg.dim, cfg.ffn_dim, false, opts))
  self:add('up_proj', projection(cfg.dim, cfg.ffn_dim, false, opts))
  self:add('down_proj', projection(cfg.ffn_dim, cfg.dim, false, opts))
  return self
end

function MLP:forward(input)
  local gate, up = self.gate_proj:forward(input), self.up_proj:forward(input)
  local hidden = self:activation('hidden', gate.shape)
  check(C.wk_op_swiglu(hidden, gate, up))
  return self.down_proj:forward(hidden)
end

function MLP:backward(input, grad_output, grad_input)
  local gate, up = self.gate_proj.output, self.up_proj.output
  local dhidden = self:zeroed('grad_hidden', gate.shape)
  self.down_proj:backward(self.hidden, grad_output, dhidden)
  local dgate, dup = self:zeroed('grad_gate', gate.shape), self:zeroed('grad_up', up.shape)
  check(C.wk_op_swiglu_backward(dgate, dup, dhidden, gate, up))
  self.gate_proj:backward(input, dgate, grad_input)
  self.up_proj:backward(input, dup, grad_input)
end

-- A decoder layer: x1 = x + attn(norm(x)); out = x1 + mlp(norm(x1)), GPT-2's pre-norm block with
-- RMSNorms: nn.Block's forward and backward run it, through the names they use (ln_1, attn, ln_2),
-- the first residual add fused into the second norm as there.
local Layer = nn.class(nn.Block)

local function layer(cfg, inv_freq, opts)
  local self = nn.new(Layer, opts.device, opts.policy)
  self.ln_1 = self:add('input_layernorm', rmsnorm(cfg.dim, cfg.rms_eps, opts))
  self.attn = self:add('self_attn', attention(cfg, inv_freq, opts))
  self.ln_2 = self:add('post_attention_layernorm', rmsnorm(cfg.dim, cfg.rms_eps, opts))
  self:add('mlp', mlp(cfg, opts))
  return self
end

-- ---- the model ------------------------------------------------------------------------------------

local Llama = nn.class(gpt.GPT)
llama.Llama = Llama

-- The inverse frequencies [head size / 2], once per model: every layer reads this one tensor.
local function rope_frequencies(cfg, device)
  local r = cfg.rope
  local inv_freq = T.empty({ cfg.dim / cfg.heads / 2 }, 'f32', device)
  check(C.wk_op_rope_frequencies(inv_freq, ROPE_KINDS[r.type], r.theta, r.factor or 0, r.low_freq_factor or 0,
    r.high_freq_factor or 0, r.original_max_position_embeddings or 0), 4)
  return inv_freq
end

-- The model with its weights as allocated (not initialised), for a caller that fills every one.
local function build(cfg)
  cfg = check_config(cfg)
  local policy = precision.policy(cfg.precision or 'fp32')
  local self = nn.new(Llama, cfg.device, policy)
  self.given = {} -- as nn.gpt's: the caller's tensors read in place, never freed with the model
  self.config = cfg
  self.inv_freq = rope_frequencies(cfg, self.device)
  local opts = { device = self.device, policy = policy }
  nn.declared(function()
    local body = self:add('model', nn.new(nn.Module, self.device, policy))
    local embed = body:add('embed_tokens', nn.new(nn.Module, self.device, policy))
    embed:param('weight', { cfg.vocab, cfg.dim }, true, nn.init.normal(INIT_STD))
    self.blocks = {}
    for l = 1, cfg.layers do self.blocks[l] = body:add('layers.' .. (l - 1), layer(cfg, self.inv_freq, opts)) end
    body:add('norm', rmsnorm(cfg.dim, cfg.rms_eps, opts))
    if not cfg.tie_embeddings then
      local head = self:add('lm_head', nn.new(nn.Module, self.device, policy))
      head:param('weight', { cfg.vocab, cfg.dim }, true, nn.init.normal(INIT_STD))
    end
  end)
  nn.share_buffers(self.blocks, cfg.recompute == 'blocks')
  self:flatten()
  return self
end

-- The parameters of one layer of a Llama of this shape (its options: dim, heads, kv_heads, ffn_dim,
-- qkv_bias): attention, MLP and two RMSNorm weights.
function llama.block_parameter_count(cfg)
  local dim, kv = cfg.dim, (cfg.kv_heads or cfg.heads) * (cfg.dim / cfg.heads)
  local attention = 2 * dim * dim + 2 * dim * kv + (cfg.qkv_bias and dim + 2 * kv or 0)
  return attention + 3 * dim * cfg.ffn_dim + 2 * dim
end

-- The parameters of a Llama of this shape (its options: vocab, dim, layers, heads, kv_heads, ffn_dim,
-- tie_embeddings, qkv_bias), without building it: the dry run plans with this.
function llama.parameter_count(cfg)
  return cfg.vocab * cfg.dim * (cfg.tie_embeddings and 1 or 2) + cfg.layers * llama.block_parameter_count(cfg) + cfg.dim
end

function llama.new(cfg)
  local model = build(cfg)
  return model:reset(model.config.seed)
end

-- As llama.new, without the initialisation (seconds for a large model): from_pretrained then copies
-- every weight from its files.
function llama.new_uninitialised(cfg)
  local model = build(cfg)
  return model
end

-- The output head's weight and gradient [V, dim]: the embedding's when tied.
function Llama:head()
  return self.lm_head or self.model.embed_tokens
end

-- wk_op_embedding adds a position row; Llama has none, so it adds zeros (a [T, dim] buffer, and a
-- scratch for their unused gradient): the embedding op stays one implementation.
local function no_positions(self, TT)
  local key = 'zero_positions'
  local fresh = self[key] == nil or self[key]:size(1) ~= TT
  local rows = self:activation(key, { TT, self.config.dim })
  if fresh then check(C.wk_op_fill(rows, 0)) end
  return rows
end

-- As gpt:forward: the mean cross-entropy over the selected targets, or the logits [B, T, V] without
-- targets.
function Llama:forward(idx, targets, mask, count, status)
  local cfg = self.config
  if not T.is_tensor(idx) or idx:dim() ~= 2 then error('llama:forward: idx must be an int32 tensor [B, T]', 2) end
  local B, TT = idx:size(1), idx:size(2)
  if TT > cfg.max_positions then
    error(('llama:forward: T = %d exceeds max_positions %d'):format(TT, cfg.max_positions), 2)
  end
  gpt.refresh_compute_weights(self)
  idx = gpt.staged(self, 'idx', idx, 'i32', true)
  self.given.idx = idx
  local x = self:activation('embedded', { B, TT, cfg.dim })
  check(C.wk_op_embedding(x, idx, self.model.embed_tokens.weight, no_positions(self, TT), status))
  self.block_inputs = self.block_inputs or {}
  for l, block in ipairs(self.blocks) do
    self.block_inputs[l] = x
    self:fetch_block(l, 1)
    x = block:forward(x)
  end
  self.final = x
  local normed = self.model.norm:forward(x)
  local logits = self:activation('logits', { B, TT, cfg.vocab })
  check(C.wk_op_matmul(logits, normed, self:head().weight, nil, 1))
  if targets == nil then
    self.given.targets = nil
    return logits
  end
  return gpt.scored(self, logits, targets, mask, count, status, 'llama')
end

-- The groups backward() completes, in order: the head and final norm, the layers from last to first,
-- then the embedding (last: a tied head's gradient is only final then).
function Llama:gradient_groups()
  local groups = { { self.model.norm, self.lm_head } }
  for l = #self.blocks, 1, -1 do groups[#groups + 1] = { self.blocks[l] } end
  groups[#groups + 1] = { self.model.embed_tokens }
  return groups
end

function Llama:backward(on_ready)
  local dlogits = gpt.logits_gradient(self, 'llama:backward')
  self:gradient_storage()
  local cfg = self.config
  local B, TT = self.given.idx:size(1), self.given.idx:size(2)
  local dnormed = self:zeroed('grad_normed', { B, TT, cfg.dim })
  local head = self:head()
  check(C.wk_op_matmul_backward(dnormed, head.grad_weight, nil, dlogits, self.model.norm.output, head.weight, 1))
  local dx = self:zeroed('grad_residual', { B, TT, cfg.dim })
  self.model.norm:backward(self.final, dnormed, dx)
  if on_ready then on_ready(1) end
  self:backward_blocks(dx, on_ready)
  local unused = self:buffer('grad_zero_positions', { TT, cfg.dim })  -- f32, as a parameter gradient is
  check(C.wk_op_fill(unused, 0))
  check(C.wk_op_embedding_backward(self.model.embed_tokens.grad_weight, unused, dx, self.given.idx))
  if on_ready then on_ready(#self.blocks + 2) end
end

-- ---- generation: gpt.GPT's step, with RoPE in the attention and no learned positions ---------------

function RMSNorm:step(input) return normalise(self, 'step_', input) end
function RMSNorm:step_sum(sum, a, b) return normalise(self, 'step_', a, b, sum) end

function Attention:step(input, cache, start)
  local q, k, v = self.q_proj:step(input), self.k_proj:step(input), self.v_proj:step(input)
  local q_rot, k_rot = self:activation('step_q_rot', q.shape), self:activation('step_k_rot', k.shape)
  check(C.wk_op_rope(q_rot, q, self.inv_freq, self.heads, start))
  check(C.wk_op_rope(k_rot, k, self.inv_freq, self.kv_heads, start))
  local y = self:activation('step_y', q.shape)
  check(C.wk_op_attention_cached(y, q_rot, k_rot, v, cache.k, cache.v, self.heads, self.kv_heads, start))
  return self.o_proj:step(y)
end

function MLP:step(input)
  local gate, up = self.gate_proj:step(input), self.up_proj:step(input)
  local hidden = self:activation('step_hidden', gate.shape)
  check(C.wk_op_swiglu(hidden, gate, up))
  return self.down_proj:step(hidden)
end

function Llama:positions() return self.config.max_positions, 'max_positions' end

function Llama:embed_step(x, idx)
  check(C.wk_op_embedding(x, idx, self.model.embed_tokens.weight, no_positions(self, idx:size(2)), nil))
end

function Llama:final_norm() return self.model.norm end

return llama
