-- wick.nn.modules: Torch7-style modules composed of C ops, with explicit forward and backward.
--
-- A module holds parameters (self.weight ...) and their gradients (self.grad_weight ...), and
-- reuses its activation buffers from step to step (reallocated only when the batch shape
-- changes). Activations and their gradients are stored in the policy's dtype (wick.precision):
-- f32, or bf16/f16, which the ops read, compute with in f32, and write back rounded: every value a
-- buffer holds is rounded, the residual sum x1 inside a block and the attention probabilities too,
-- and a gradient that several ops add into is rounded after each of them. Conventions:
--   module:forward(input) -> output
--   module:backward(input, grad_output, grad_input)  ACCUMULATES into grad_input (the caller zeroes
--     it), and into the parameter gradients; residual branches therefore need no extra adds.
--   block:backward(input, grad)  a transformer block (nn.Block) instead turns grad, the gradient of
--     its output, into that of its input in place: the residual stream's gradient, one buffer that
--     each norm's backward adds its branch into (llm.c's dresidual).
--   module:step(...)  generation's forward (wick.nn.generate): new positions against a key/value
--     cache, into buffers of its own (step_*), so a training step's saved activations stay as they are.
--   module:parameters() -> list of { module, key, name, decay } in a fixed order; names follow
--     Hugging Face GPT-2 (transformer.h.0.attn.c_attn.weight), layouts too (Conv1D: [in, out]).
-- nn.gpt{} (wick.nn.gpt) keeps all parameters and gradients as views into two flat buffers (decayed tensors
-- first), so optimizers and gradient all-reduce see one contiguous range.
local core = require 'wick.core'
local T = require 'wick.tensor'
local precision = require 'wick.precision'

local C = core.C
local check = core.check
local LAYERNORM_EPS = 1e-5
local INIT_STD = 0.02

local nn = {}

-- ---- module base ---------------------------------------------------------------------------------

local Module = {}
Module.__index = Module
nn.Module = Module

local function class(parent)
  local cls = setmetatable({}, { __index = parent })
  cls.__index = cls
  return cls
end

local function new(cls, device, policy)
  return setmetatable({ device = device or 'cpu', policy = policy or precision.policy('fp32'), children = {} }, cls)
end

-- Set while a model whose parameters live in flat storage (nn.gpt, nn.llama) builds its modules:
-- a parameter is then only declared, and the model's flatten() gives it its place in the flat
-- buffers (memory of its own would only be copied there and freed).
local declaring = false

-- Runs build() with parameters declared without memory; returns what it returns.
function nn.declared(build)
  declaring = true
  local ok, result = pcall(build)
  declaring = false
  if not ok then error(result, 0) end
  return result
end

-- (Re)initialises every parameter; parameter k of the tree draws from stream (seed, k), so the
-- same seed gives the same model on any device. tensor_of(p) is the f32 tensor that holds parameter
-- p (default: the module's own, p.module[p.key]; a model with compute copies names its masters).
function Module:reset(seed, tensor_of)
  if declaring then return self end -- nothing to fill yet: the model resets once flattened
  for k, p in ipairs(self:parameters()) do
    p.init(tensor_of and tensor_of(p) or p.module[p.key], (seed or 0) * 1000003 + k)
  end
  return self
end

function Module:add(name, child)
  self.children[#self.children + 1] = name
  self[name] = child
  return child
end

-- Declares parameter self[key] (and its gradient self['grad_' .. key]); init(tensor, seed) fills
-- it on reset(). decay: whether weight decay applies (matrices and embeddings, not biases/norms).
function Module:param(key, shape, decay, init)
  self.params = self.params or {}
  self.params[#self.params + 1] = { key = key, shape = shape, decay = decay, init = init }
  if declaring then return end
  self[key] = T.empty(shape, 'f32', self.device)
  self['grad_' .. key] = T.zeros(shape, 'f32', self.device)
end

function Module:parameters(prefix, out)
  out = out or {}
  prefix = prefix and prefix ~= '' and prefix .. '.' or (prefix or '')
  for _, p in ipairs(self.params or {}) do
    out[#out + 1] = { module = self, key = p.key, name = prefix .. p.key, shape = p.shape, decay = p.decay,
      init = p.init }
  end
  for _, name in ipairs(self.children) do self[name]:parameters(prefix .. name, out) end
  return out
end

-- Releases now every tensor this module and the modules below it hold (parameters, gradients,
-- buffers), rather than whenever the GC runs: device memory is invisible to the GC. Idempotent.
function Module:free()
  for _, value in pairs(self) do
    if T.is_tensor(value) then
      value:free()
    elseif type(value) == 'table' and getmetatable(value) and value.children and value ~= self then
      value:free()
    end
  end
end

-- A reusable buffer of the given shape and dtype, kept in `store` and reachable as self[key],
-- reallocated only when those change.
local function stored(self, store, key, shape, dtype)
  local signature = dtype .. ':' .. table.concat(shape, 'x')
  local t = store[key]
  if not (t and store[key .. '_shape'] == signature) then
    if t then t:free() end
    t = T.empty(shape, dtype, self.device)
    store[key], store[key .. '_shape'] = t, signature
  end
  self[key] = t
  return t
end

-- What a module computes in forward and keeps for backward, self[key], of dtype (default f32). It
-- lives in the module's own fields, or in self.shared_activations when the model gave the module
-- that table (nn.share_buffers: the same module of every block shares it).
function Module:buffer(key, shape, dtype)
  return stored(self, self.shared_activations or self, key, shape, dtype or 'f32')
end

-- An activation: a buffer in the policy's storage dtype.
function Module:activation(key, shape)
  return self:buffer(key, shape, self.policy.dtype)
end

-- An activation that is the module's alone whatever it shares (a block's output: the next block's
-- input, which backward reads after every later block has run).
function Module:kept(key, shape)
  return stored(self, self, key, shape, self.policy.dtype)
end

-- An activation's gradient, used within one backward of the module: in self.shared_gradients when
-- the model gave the module that table.
function Module:gradient(key, shape)
  return stored(self, self.shared_gradients or self, key, shape, self.policy.dtype)
end

-- An activation gradient, zeroed: backward accumulates into it.
function Module:zeroed(key, shape)
  local t = self:gradient(key, shape)
  check(C.wk_op_fill(t, 0), 2)
  return t
end

-- Gives the same module of every block (the modules at one path below them) one table of buffers:
-- activation gradients always, since a block's backward is done with them before the block below
-- starts; with recompute the forward activations too, which the model's backward then recomputes
-- block by block from each block's input (its kept output). A step then holds one block's buffers,
-- not one per block.
function nn.share_buffers(blocks, recompute)
  local stores = {}
  local function share(module, path)
    local s = stores[path] or { activations = {}, gradients = {} }
    stores[path] = s
    module.shared_gradients = s.gradients
    module.shared_activations = recompute and s.activations or nil
    for _, name in ipairs(module.children) do share(module[name], path .. '.' .. name) end
  end
  for _, block in ipairs(blocks) do share(block, '') end
end

-- A shape with its last dimension changed to n.
local function with_last(shape, n)
  local out = { unpack(shape) }
  out[#out] = n
  return out
end
nn.with_last = with_last

nn.new = new
nn.class = class

local function constant(value) return function(t) check(C.wk_op_fill(t, value)) end end
local function normal(std) return function(t, seed) check(C.wk_op_normal(t, seed, 0, std)) end end
nn.init = { constant = constant, normal = normal, STD = INIT_STD }

-- ---- layers --------------------------------------------------------------------------------------

local Linear = class(Module)
nn.Linear = Linear

-- Linear(in, out, opts): weight [in, out] (HF Conv1D layout), bias [out].
function nn.linear(n_in, n_out, opts)
  opts = opts or {}
  local self = new(Linear, opts.device, opts.policy)
  self:param('weight', { n_in, n_out }, true, normal(opts.std or INIT_STD))
  self:param('bias', { n_out }, false, constant(0))
  return self:reset(opts.seed)
end

-- transpose_w = 1: a weight stored [out, in] (torch nn.Linear's layout, which Llama-family files keep).
Linear.transpose_w = 0

-- The output width: the weight's in -> out dimension, by its layout.
function Linear:out_features() return self.weight:size(2 - self.transpose_w) end

-- The product of input into the activation named key: training's ('output') or generation's.
local function linear_run(self, key, input)
  local out = self:activation(key, with_last(input.shape, self:out_features()))
  check(C.wk_op_matmul(out, input, self.weight, self.bias, self.transpose_w))
  return out
end

function Linear:forward(input) return linear_run(self, 'output', input) end
function Linear:step(input) return linear_run(self, 'step_output', input) end

function Linear:backward(input, grad_output, grad_input)
  check(C.wk_op_matmul_backward(grad_input, self.grad_weight, self.grad_bias, grad_output, input, self.weight,
    self.transpose_w))
end

local LayerNorm = class(Module)
nn.LayerNorm = LayerNorm

function nn.layernorm(n, opts)
  opts = opts or {}
  local self = new(LayerNorm, opts.device, opts.policy)
  self.eps = opts.eps or LAYERNORM_EPS
  self:param('weight', { n }, false, constant(1))
  self:param('bias', { n }, false, constant(0))
  return self:reset()
end

-- The norm of a, or with b the norm of the residual sum a + b, written to sum in the same pass, into
-- the output and f32 row statistics named prefix .. 'output', 'mean', 'rstd': training's, or
-- generation's ('step_').
local function layernorm_run(self, prefix, a, b, sum)
  local x = sum or a
  local rows = x:numel() / x.shape[#x.shape]
  local out = self:activation(prefix .. 'output', x.shape)
  local mean, rstd = self:buffer(prefix .. 'mean', { rows }), self:buffer(prefix .. 'rstd', { rows })
  if b then
    check(C.wk_op_add_layernorm(sum, out, mean, rstd, a, b, self.weight, self.bias, self.eps))
  else
    check(C.wk_op_layernorm(out, mean, rstd, a, self.weight, self.bias, self.eps))
  end
  return out
end

function LayerNorm:forward(input) return layernorm_run(self, '', input) end

-- The norm of the residual sum a + b, which it writes to sum (a buffer of the caller's) in the same
-- pass: what wk_op_add(sum, a, b) then forward(sum) give, to the bit, with sum read once less. The
-- buffers are forward's, so backward(sum, ...) follows either.
function LayerNorm:forward_sum(sum, a, b) return layernorm_run(self, '', a, b, sum) end

function LayerNorm:step(input) return layernorm_run(self, 'step_', input) end
function LayerNorm:step_sum(sum, a, b) return layernorm_run(self, 'step_', a, b, sum) end

function LayerNorm:backward(input, grad_output, grad_input)
  check(C.wk_op_layernorm_backward(grad_input, self.grad_weight, self.grad_bias, grad_output, input, self.weight, self.mean, self.rstd))
end

-- ---- GPT-2 blocks --------------------------------------------------------------------------------

local Attention = class(Module)
nn.CausalSelfAttention = Attention

-- opts: dim, heads, layers (scales the residual projection's init), device, policy
function nn.attention(opts)
  local self = new(Attention, opts.device, opts.policy)
  self.heads = opts.heads
  local sub = { device = opts.device, policy = opts.policy }
  self:add('c_attn', nn.linear(opts.dim, 3 * opts.dim, sub))
  sub.std = INIT_STD / math.sqrt(2 * (opts.layers or 1))
  self:add('c_proj', nn.linear(opts.dim, opts.dim, sub))
  return self
end

function Attention:forward(input)
  local B, TT, dim = input:size(1), input:size(2), input:size(3)
  local qkv = self.c_attn:forward(input)
  local y = self:activation('y', { B, TT, dim })
  check(C.wk_op_attention(y, self:activation('att', { B, self.heads, TT, TT }), qkv, self.heads))
  return self.c_proj:forward(y)
end

-- Positions start..start+Tq-1 against the cache ({ k =, v = } [B, Tmax, dim]): q, k and v are the
-- thirds of c_attn's output, each copied out whole for wk_op_attention_cached.
function Attention:step(input, cache, start)
  local qkv = self.c_attn:step(input)
  local dim = qkv:size(3) / 3
  local parts = {}
  for i, key in ipairs({ 'step_q', 'step_k', 'step_v' }) do
    local third = qkv:narrow(3, (i - 1) * dim + 1, dim)
    parts[i] = self:activation(key, third.shape):copy(third)
    third:free()
  end
  local y = self:activation('step_y', parts[1].shape)
  check(C.wk_op_attention_cached(y, parts[1], parts[2], parts[3], cache.k, cache.v, self.heads, self.heads, start))
  return self.c_proj:step(y)
end

function Attention:backward(input, grad_output, grad_input)
  local dy = self:zeroed('grad_y', self.y.shape)
  self.c_proj:backward(self.y, grad_output, dy)
  local qkv = self.c_attn.output
  local dqkv = self:zeroed('grad_qkv', qkv.shape)
  check(C.wk_op_attention_backward(dqkv, dy, qkv, self.att, self.heads))
  self.c_attn:backward(input, dqkv, grad_input)
end

local MLP = class(Module)
nn.MLP = MLP

-- c_proj(gelu(c_fc(x))), the GELU in the two products' epilogues as llm.c runs it (cuBLASLt's on a
-- GPU): c_fc's output is the pre-activation, self.hidden its GELU, which c_proj reads. Backward goes
-- from c_proj's output gradient to the pre-activation's in one op, which writes it: the GELU output's
-- gradient is never stored, and the pre-activation's needs no zero fill.
function nn.mlp(opts)
  local self = new(MLP, opts.device, opts.policy)
  local sub = { device = opts.device, policy = opts.policy }
  self:add('c_fc', nn.linear(opts.dim, 4 * opts.dim, sub))
  sub.std = INIT_STD / math.sqrt(2 * (opts.layers or 1))
  self:add('c_proj', nn.linear(4 * opts.dim, opts.dim, sub))
  return self
end

-- c_fc's pre-activation into its activation prefix .. 'output', its GELU into ours prefix ..
-- 'hidden': training's buffers, or generation's ('step_').
local function mlp_hidden(self, prefix, input)
  local fc = self.c_fc
  local pre = fc:activation(prefix .. 'output', with_last(input.shape, fc:out_features()))
  local hidden = self:activation(prefix .. 'hidden', pre.shape)
  check(C.wk_op_matmul_gelu(hidden, pre, input, fc.weight, fc.bias, fc.transpose_w))
  return hidden
end

function MLP:forward(input) return self.c_proj:forward(mlp_hidden(self, '', input)) end
function MLP:step(input) return self.c_proj:step(mlp_hidden(self, 'step_', input)) end

function MLP:backward(input, grad_output, grad_input)
  local fc, proj = self.c_fc, self.c_proj
  local dpre = self:gradient('grad_fc', fc.output.shape)
  check(C.wk_op_matmul_backward_gelu(dpre, proj.grad_weight, proj.grad_bias, grad_output, self.hidden, proj.weight,
    fc.output, proj.transpose_w))
  fc:backward(input, dpre, grad_input)
end

local Block = class(Module)
nn.Block = Block

-- Pre-LayerNorm transformer block: x1 = x + attn(ln_1(x)); out = x1 + mlp(ln_2(x1)). The first
-- residual add is fused into ln_2 (forward_sum).
function nn.block(opts)
  local self = new(Block, opts.device, opts.policy)
  local sub = { device = opts.device, policy = opts.policy }
  self:add('ln_1', nn.layernorm(opts.dim, sub))
  self:add('attn', nn.attention(opts))
  self:add('ln_2', nn.layernorm(opts.dim, sub))
  self:add('mlp', nn.mlp(opts))
  return self
end

function Block:forward(input)
  local x1 = self:activation('x1', input.shape)
  local normed = self.ln_2:forward_sum(x1, input, self.attn:forward(self.ln_1:forward(input)))
  local out = self:kept('output', input.shape)
  check(C.wk_op_add(out, x1, self.mlp:forward(normed)))
  return out
end

-- As forward, for positions start.. against the layer's key/value cache, in generation's buffers.
function Block:step(input, cache, start)
  local x1 = self:activation('step_x1', input.shape)
  local normed = self.ln_2:step_sum(x1, input, self.attn:step(self.ln_1:step(input), cache, start))
  local out = self:kept('step_output', input.shape)
  check(C.wk_op_add(out, x1, self.mlp:step(normed)))
  return out
end

-- grad, the gradient of the block's output, becomes that of its input in place. The gradient of a
-- residual sum is the sum's own plus its branch's, and each norm's backward adds its branch into
-- grad (it accumulates into its input's gradient): grad is x1's gradient once ln_2's backward is
-- done, the input's once ln_1's is. Each of those sums is rounded once, as when x1's gradient was a
-- copy of grad and the input's a zeroed buffer it was added into (0 + g is g, but for the sign of a
-- zero, which the f32 parameter gradients, accumulated from +0, never show): the same bits, with
-- neither buffer nor their copy, add and zero fill. The MLP and attention backwards accumulate into
-- dln, hence its two zero fills.
function Block:backward(input, grad)
  local dln = self:zeroed('grad_ln', input.shape)
  self.mlp:backward(self.ln_2.output, grad, dln)
  self.ln_2:backward(self.x1, dln, grad)
  check(C.wk_op_fill(dln, 0))
  self.attn:backward(self.ln_1.output, grad, dln)
  self.ln_1:backward(input, dln, grad)
end

return nn
