-- wick.nn.gpt: the GPT-2 architecture (learned positions, pre-LayerNorm with eps 1e-5, tanh GELU,
-- output projection tied to the token embedding) as a wick.nn module tree named like Hugging Face's
-- GPT2LMHeadModel, so checkpoints load and save by name in HF's layouts.
--
--   local model = wick.nn.gpt { vocab = 50257, seq_len = 1024, layers = 12, heads = 12, dim = 768,
--                               precision = 'bf16', device = 'cpu', seed = 0 }
--   local loss = model:forward(idx, targets, mask, count)   -- idx/targets int32 [B, T]
--   model:backward(); model:grads()                         -- gradients by HF name
--   model:backward(on_ready)   -- on_ready(g) once the gradients of gradient_groups()[g] are final
--   model:forward_tokens(tokens, mask, count)                 -- tokens int32 [B, T+1] from a loader
--   model:generate(prompt, opts)    -- the continuation (wick.nn.generate), through new_cache and step
-- mask (optional, u8 [B, T]) selects the targets that count; count (default: the number selected
-- here) is the normaliser, so passing the global token count keeps gradients independent of
-- accumulation and world size (docs/loss.md).
local core = require 'wick.core'
local T = require 'wick.tensor'
local nn = require 'wick.nn.modules'
local precision = require 'wick.precision'
local safetensors = require 'wick.safetensors'
local schema = require 'wick.schema'

local C = core.C
local check = core.check

local gpt = {}

local GPT = nn.class(nn.Module)
gpt.GPT = GPT

-- Tensors of HF checkpoints that are not parameters: causal-mask buffers and the tied lm_head.
local IGNORED_CHECKPOINT_NAMES = { ['attn.bias'] = true, ['attn.masked_bias'] = true, ['lm_head.weight'] = true }
local HF_PREFIX = 'transformer.'
local scalar = core.ffi.new('double[1]')  -- reused out-parameter for C calls that return a sum

local function embedding(rows, dim, device)
  local holder = nn.new(nn.Module, device)
  holder:param('weight', { rows, dim }, true, nn.init.normal(nn.init.STD))
  return holder
end

-- Seeds scale by a prime per parameter (nn.Module.reset); below 2^32 every product stays exact.
local MAX_SEED = 2 ^ 32 - 1

local OPTIONS = schema.define('nn.gpt option', {
  { 'vocab', 'integer', min = 1, max = 2 ^ 31 - 1, required = true, help = 'token ids are below this (int32)' },
  { 'seq_len', 'integer', min = 1, max = 2 ^ 24, required = true, help = 'longest sequence (learned positions)' },
  { 'layers', 'integer', min = 1, max = 4096, required = true, help = 'transformer blocks' },
  { 'heads', 'integer', min = 1, max = 4096, required = true, help = 'attention heads per block; divide dim' },
  { 'dim', 'integer', min = 1, max = 2 ^ 20, required = true, help = 'model width' },
  { 'precision', 'precision', check = precision.check, parse = 'string',
    help = "'fp32', 'bf16', 'fp16' or { 'fp16', scale = S, growth_interval = N }" },
  { 'device', 'string', help = "'cpu' or 'cuda:N' (default cpu)" },
  { 'seed', 'integer', min = 0, max = MAX_SEED, default = 0, help = 'initialisation seed' },
  { 'recompute', 'enum', values = { 'none', 'blocks' }, default = 'none',
    help = "'blocks': backward recomputes each block's activations from its input instead of keeping them" },
})
gpt.OPTIONS = OPTIONS

local function check_config(cfg)
  if type(cfg) ~= 'table' then error('nn.gpt expects a table of options', 3) end
  cfg = OPTIONS:check(cfg, 3)
  if cfg.dim % cfg.heads ~= 0 then error(string.format('nn.gpt: dim %d is not divisible by heads %d', cfg.dim, cfg.heads), 3) end
  return cfg
end

function gpt.new(cfg)
  cfg = check_config(cfg)
  local policy = precision.policy(cfg.precision or 'fp32')
  local self = nn.new(GPT, cfg.device, policy)
  -- forward's idx, targets and mask, for backward: the caller's own tensors when read in place, so
  -- kept in a plain table, which free() leaves alone (a copy into a buffer is the model's, freed)
  self.given = {}
  self.config = { vocab = cfg.vocab, seq_len = cfg.seq_len, layers = cfg.layers, heads = cfg.heads, dim = cfg.dim,
    recompute = cfg.recompute }
  local opts = { dim = cfg.dim, heads = cfg.heads, layers = cfg.layers, device = self.device, policy = policy }
  nn.declared(function()
    local body = self:add('transformer', nn.new(nn.Module, self.device, policy))
    body:add('wte', embedding(cfg.vocab, cfg.dim, self.device))
    body:add('wpe', embedding(cfg.seq_len, cfg.dim, self.device))
    self.blocks = {}
    for l = 1, cfg.layers do self.blocks[l] = body:add('h.' .. (l - 1), nn.block(opts)) end
    body:add('ln_f', nn.layernorm(cfg.dim, { device = self.device, policy = policy }))
  end)
  nn.share_buffers(self.blocks, cfg.recompute == 'blocks')
  self:flatten()
  self:reset(cfg.seed)
  return self
end

-- ---- flat parameter storage ------------------------------------------------------------------------

local function view_into(flat, offset, shape, numel)
  local slice = flat:narrow(1, offset + 1, numel)
  local view = slice:view(shape)
  slice:free()
  return view
end

-- Gives every parameter (declared under nn.declared: no memory of its own yet) its view of the flat
-- buffer of master weights: decayed tensors first, so an optimizer covers each group with one view.
-- Under bf16/fp16 the modules compute with a 2-byte copy of the f32 master weights
-- (self.flat.compute, in the policy's dtype), refreshed before each forward. The f32 gradients get
-- their flat buffer at their first use (gradient_storage): a model loaded to generate never holds one.
function GPT:flatten()
  local entries, total, decay_total = {}, 0, 0
  for _, p in ipairs(self:parameters()) do if p.decay then entries[#entries + 1] = p end end
  for _, p in ipairs(self:parameters()) do if not p.decay then entries[#entries + 1] = p end end
  for _, p in ipairs(entries) do
    p.offset, p.numel = total, 1
    for _, size in ipairs(p.shape) do p.numel = p.numel * size end
    total = total + p.numel
    if p.decay then decay_total = total end
  end
  local flat = { params = T.empty({ total }, 'f32', self.device), numel = total, decay_numel = decay_total }
  flat.compute = self.policy.lowp and T.empty({ total }, self.policy.dtype, self.device) or flat.params
  self.named, self.order, self.entries = {}, {}, entries
  for _, p in ipairs(entries) do
    local master = view_into(flat.params, p.offset, p.shape, p.numel)
    p.module[p.key] = flat.compute == flat.params and master or view_into(flat.compute, p.offset, p.shape, p.numel)
    self.named[p.name] = master
    self.order[#self.order + 1] = p.name
  end
  self.flat = flat
end

-- The flat f32 gradients (zeroed when made) and every parameter's view of them (module.grad_KEY and
-- the named gradients), made at the first call.
function GPT:gradient_storage()
  local flat = self.flat
  if flat.grads or self.gathered then return flat.grads end  -- gathered: its units' buffers hold them
  flat.grads = T.zeros({ flat.numel }, 'f32', self.device)
  self.named_grads = {}
  for _, p in ipairs(self.entries) do
    p.module['grad_' .. p.key] = view_into(flat.grads, p.offset, p.shape, p.numel)
    self.named_grads[p.name] = p.module['grad_' .. p.key]
  end
  return flat.grads
end

-- Hands the f32 master weights to their new owner (a sharded nn.data_parallel keeps this rank's
-- slice of them) and frees the full ones: a model with a 2-byte compute copy only. Its named
-- parameters are then the compute copy's views, and forward leaves the compute copy to that owner,
-- which refreshes it after each update.
function GPT:release_masters()
  local flat = self.flat
  assert(flat.compute ~= flat.params, 'gpt:release_masters: an f32 model computes with its masters')
  flat.compute:copy(flat.params)  -- the last refresh from the full masters
  for _, p in ipairs(self.entries) do
    self.named[p.name]:free()
    self.named[p.name] = p.module[p.key]
  end
  flat.params:free()
  flat.params = nil
end

-- Hands all the weights to a sharded nn.data_parallel that keeps only this rank's slice of them
-- (shard = 'parameters'): the flat weights are freed, and the data parallelism's model.gathered
-- (wick.nn.gathered) points every parameter into the buffers it gathers them into; forward and
-- backward fetch each block from it. The model then has no named parameters, nor a flat gradient:
-- their values live on all the ranks together.
function GPT:release_weights()
  local flat = self.flat
  for _, p in ipairs(self.entries) do
    p.module[p.key]:free()
    if self.named[p.name] ~= p.module[p.key] then self.named[p.name]:free() end
  end
  for _, key in ipairs({ 'compute', 'params' }) do
    if flat[key] then flat[key]:free() end
    flat[key] = nil
  end
  self.named = nil
end

-- The unit of every entry (wick.nn.gathered): l for the parameters of block l, 0 for the others.
function GPT:units()
  local block_of = {}
  for l, block in ipairs(self.blocks) do
    for _, p in ipairs(block:parameters()) do
      block_of[p.module] = l
    end
  end
  local unit_of = {}
  for _, p in ipairs(self.entries) do unit_of[p] = block_of[p.module] or 0 end
  return unit_of
end

-- Before block l runs forward (direction 1) or backward (-1): its weights, when gathered.
function GPT:fetch_block(l, direction)
  if self.gathered then self.gathered:fetch(l, direction) end
end

-- Initialises the master weights (compute copies follow at the next forward).
function GPT:reset(seed)
  return nn.Module.reset(self, seed, function(p) return self.named[p.name] end)
end

function GPT:free()
  nn.Module.free(self)
  if self.gathered then self.gathered:free() end
  for _, group in ipairs({ self.flat, self.named or {}, self.named_grads or {}, { self.tokens_inputs, self.tokens_targets } }) do
    for _, t in pairs(group) do
      if T.is_tensor(t) then t:free() end  -- views hold references to the flat storage too
    end
  end
end

-- The flat storage { params =, grads =, compute =, decay_numel = } an optimizer and data
-- parallelism work on: its gradients made if they were not yet.
function GPT:flat_parameters()
  self:gradient_storage()
  return self.flat
end
function GPT:named_parameters()
  if not self.named then
    error("gpt: the weights are sharded over the ranks (parallel.shard = 'parameters'): no rank holds them whole", 2)
  end
  return self.named
end
function GPT:grads()
  if self.gathered then
    error("gpt: the gradients are reduce-scattered over the ranks (parallel.shard = 'parameters'): no rank holds them whole",
      2)
  end
  self:gradient_storage()
  return self.named_grads
end
function GPT:zero_grad() check(C.wk_op_fill(self:gradient_storage(), 0)) end

function GPT:parameter_count() return self.flat.numel end

-- ---- forward and backward ------------------------------------------------------------------------

-- t itself when it is of dtype, on the model's device and laid out as the op reads it; else a copy
-- into a reused buffer. Index tensors (idx, targets) are read in place with the strides of a view of
-- at most two dims (a loader batch's tokens[:, :-1] and tokens[:, 1:]); the mask must be contiguous.
local function staged(self, key, t, dtype, strided)
  if t == nil then return nil end
  local readable = t:is_contiguous() or (strided and t:dim() <= 2)
  if t.device == self.device and t.dtype == dtype and readable then return t end
  return self:buffer(key, t.shape, dtype):copy(t)
end

local function count_selected(self, mask, B, TT)
  if not mask then return B * TT end
  local as_float = self:buffer('mask_f32', { B, TT })
  as_float:copy(mask)
  check(C.wk_op_sumsq(as_float, scalar))  -- the mask is 0/1, so its sum of squares is its count
  return scalar[0]
end

-- The mean cross-entropy of the logits over the selected targets, as forward returns it: a Lua
-- number, or nil with a step's status (wick.nn.data_parallel's: a tensor of sizeof(WkStepStatus)
-- bytes on the model's device), where the sum goes instead, read once a step with no host sync
-- per micro-batch. `who` names the model in errors.
local function scored(self, logits, targets, mask, count, status, who)
  local B, TT = logits:size(1), logits:size(2)
  self.given.targets = staged(self, 'targets', targets, 'i32', true)
  self.given.mask = staged(self, 'mask', mask, 'u8')
  self.count = count or count_selected(self, self.given.mask, B, TT)
  if self.count <= 0 then error(who .. ':forward: no target is selected by the mask (count = 0)', 3) end
  local sum = nil
  if status == nil then sum = scalar end
  check(C.wk_op_cross_entropy(self:buffer('losses', { B, TT }), logits, self.given.targets, self.given.mask, self.count,
    sum, status), 3)
  self.logits_consumed = false
  self.loss = sum and sum[0]
  return self.loss
end

-- The compute copy from the masters, rounded to nearest even by the copy's cast (unless the masters
-- were released: their owner refreshes it).
local function refresh_compute_weights(self)
  local flat = self.flat
  if flat.params and flat.compute ~= flat.params then flat.compute:copy(flat.params) end
end

-- Returns the mean cross-entropy over the selected targets (a Lua number; nil with a step's
-- status, which then holds it: see scored), or the logits [B, T, V] (a buffer the next forward
-- overwrites) when no targets are given. idx, targets and mask must stay alive until backward()
-- when they are already of the right dtype on the model's device, since the model then reads them
-- in place instead of copying (idx and targets may be strided views, see staged).
function GPT:forward(idx, targets, mask, count, status)
  local cfg = self.config
  if not T.is_tensor(idx) or idx:dim() ~= 2 then error('gpt:forward: idx must be an int32 tensor [B, T]', 2) end
  local B, TT = idx:size(1), idx:size(2)
  if TT > cfg.seq_len then error(string.format('gpt:forward: T = %d exceeds seq_len %d', TT, cfg.seq_len), 2) end
  refresh_compute_weights(self)
  idx = staged(self, 'idx', idx, 'i32', true)
  self.given.idx = idx
  local body = self.transformer
  local x = self:activation('embedded', { B, TT, cfg.dim })
  check(C.wk_op_embedding(x, idx, body.wte.weight, body.wpe.weight, status))
  self.block_inputs = self.block_inputs or {}
  for l, block in ipairs(self.blocks) do
    self.block_inputs[l] = x
    self:fetch_block(l, 1)
    x = block:forward(x)
  end
  self.final = x
  local normed = body.ln_f:forward(x)
  local logits = self:activation('logits', { B, TT, cfg.vocab })
  check(C.wk_op_matmul(logits, normed, body.wte.weight, nil, 1))
  if targets == nil then
    self.given.targets = nil
    return logits
  end
  return scored(self, logits, targets, mask, count, status, 'gpt')
end

-- tokens int32 [B, T+1] as a loader delivers them: inputs are tokens[:, :T], targets tokens[:, 1:],
-- views read in place (a loader batch also carries them ready made: batch.inputs, batch.targets).
-- The views live until the next call, since backward() reads them too.
function GPT:forward_tokens(tokens, mask, count)
  local width = tokens:size(2) - 1
  for _, key in ipairs({ 'tokens_inputs', 'tokens_targets' }) do
    if self[key] then self[key]:free() end
  end
  self.tokens_inputs, self.tokens_targets = tokens:narrow(2, 1, width), tokens:narrow(2, 2, width)
  return self:forward(self.tokens_inputs, self.tokens_targets, mask, count)
end

-- The modules whose parameter gradients backward() completes, in the order it completes them: the
-- final LayerNorm, the blocks from last to first, then the embeddings (the tied token embedding
-- collects its output-projection gradient first and its input gradient last). Data parallelism
-- starts each gradient bucket's all-reduce as soon as its group is done.
function GPT:gradient_groups()
  local body = self.transformer
  local groups = { { body.ln_f } }
  for l = #self.blocks, 1, -1 do groups[#groups + 1] = { self.blocks[l] } end
  groups[#groups + 1] = { body.wte, body.wpe }
  return groups
end

-- Accumulates d(loss * scale)/d(parameter) into the gradients (scale = the fp16 loss scale, else 1).
-- on_ready (optional) is called with g after the gradients of gradient_groups()[g] are final.
-- The gradient of the loss (times the loss scale) with respect to the logits, written over the
-- logits (the classifier's backward is their last reader, as in llm.c's fused classifier): a step
-- holds one [B, T, vocab] buffer, not two. A second backward of one forward would read gradients as
-- logits, so it is refused. who names the model's backward in errors.
local function logits_gradient(self, who)
  if not self.given.targets then error(who .. ': call forward(idx, targets) first', 3) end
  if self.logits_consumed then
    error(who .. ": the last backward already used this forward's logits: run forward again first", 3)
  end
  self.logits_consumed = true
  local scale = self.policy.scaler and self.policy.scaler.scale or 1
  check(C.wk_op_cross_entropy_backward(self.logits, self.logits, self.given.targets, self.given.mask, self.count,
    scale))
  return self.logits
end

function GPT:backward(on_ready)
  local dlogits = logits_gradient(self, 'gpt:backward')
  self:gradient_storage()
  local body, cfg = self.transformer, self.config
  local B, TT = self.given.idx:size(1), self.given.idx:size(2)
  local dnormed = self:zeroed('grad_normed', { B, TT, cfg.dim })
  check(C.wk_op_matmul_backward(dnormed, body.wte.grad_weight, nil, dlogits, body.ln_f.output, body.wte.weight, 1))
  local dx = self:zeroed('grad_residual', { B, TT, cfg.dim })
  body.ln_f:backward(self.final, dnormed, dx)
  if on_ready then on_ready(1) end
  self:backward_blocks(dx, on_ready)
  check(C.wk_op_embedding_backward(body.wte.grad_weight, body.wpe.grad_weight, dx, self.given.idx))
  if on_ready then on_ready(#self.blocks + 2) end
end

-- Runs the blocks' backward from the last to the first over dx, the residual stream's gradient: that
-- of the last block's output, then (in place, nn.Block's backward) that of each block's input in
-- turn, and last the first block's. Calls on_ready(g) for the groups 2..L+1. Under recompute =
-- 'blocks' the blocks share their activations, so each block's are recomputed from its input first
-- (the last block's are still those of forward).
function GPT:backward_blocks(dx, on_ready)
  local blocks = self.blocks
  for l = #blocks, 1, -1 do
    self:fetch_block(l, -1)
    if self.config.recompute == 'blocks' and l < #blocks then blocks[l]:forward(self.block_inputs[l]) end
    blocks[l]:backward(self.block_inputs[l], dx)
    if on_ready then on_ready(#blocks - l + 2) end
  end
end

-- ---- generation: new positions against a key/value cache --------------------------------------------
-- step(...) runs positions start..start+Tq-1 of a sequence whose earlier keys and values are in the
-- cache (each block's { k =, v = } [B, Tmax, key/value heads * head size]), in buffers of its own
-- (the modules' step), so generating does not disturb a training step's saved activations. Forward
-- only. A Llama (wick.nn.llama) runs the same, with its own embedding, positions and final norm.

-- The output head's weight [V, dim]: the token embedding, tied.
function GPT:head() return self.transformer.wte end

-- The positions the model holds, and the option that says so.
function GPT:positions() return self.config.seq_len, 'seq_len' end

-- Tokens idx [B, Tq] at positions start.. embedded into x: the token's row plus its position's.
function GPT:embed_step(x, idx, start)
  local body = self.transformer
  local rows = body.wpe.weight:narrow(1, start + 1, idx:size(2))
  check(C.wk_op_embedding(x, idx, body.wte.weight, rows, nil))
  rows:free()
end

function GPT:final_norm() return self.transformer.ln_f end

-- Empty caches for B sequences of up to Tmax positions: one { k, v } per block, in the policy's dtype.
function GPT:new_cache(B, Tmax)
  local cfg = self.config
  local limit, name = self:positions()
  if Tmax > limit then error(('%d positions exceed %s %d'):format(Tmax, name, limit), 2) end
  local width, dtype, caches = (cfg.kv_heads or cfg.heads) * (cfg.dim / cfg.heads), self.policy.dtype, {}
  for l = 1, cfg.layers do
    caches[l] = { k = T.zeros({ B, Tmax, width }, dtype, self.device), v = T.zeros({ B, Tmax, width }, dtype, self.device) }
  end
  return caches
end

-- The logits [B, Tq, V] (a buffer the next step overwrites) of tokens idx [B, Tq] (int32, on any
-- device: copied to the model's when elsewhere) at positions start.., their keys and values added to
-- the caches.
function GPT:step(idx, caches, start)
  local B, TT = idx:size(1), idx:size(2)
  refresh_compute_weights(self)
  idx = staged(self, 'step_idx', idx, 'i32', true)
  local x = self:activation('step_embedded', { B, TT, self.config.dim })
  self:embed_step(x, idx, start)
  for l, block in ipairs(self.blocks) do
    self:fetch_block(l, 1)
    x = block:step(x, caches[l], start)
  end
  local logits = self:activation('step_logits', { B, TT, self.config.vocab })
  check(C.wk_op_matmul(logits, self:final_norm():step(x), self:head().weight, nil, 1))
  return logits
end

-- ---- checkpoints ------------------------------------------------------------------------------------

-- Loads HF GPT-2 weights by name ("transformer." prefix optional, as in HF's own files); any dtype
-- is converted to f32. Every parameter must be present with its exact shape.
function GPT:load(path)
  local tensors, err = safetensors.load(path)
  if not tensors then error('gpt:load: ' .. err, 2) end
  local used, problems = {}, {}
  for _, name in ipairs(self.order) do
    local short = name:sub(#HF_PREFIX + 1)
    local source_name = tensors[name] and name or (tensors[short] and short)
    local source, target = tensors[source_name], self.named[name]
    if not source then
      problems[#problems + 1] = 'missing ' .. name
    elseif table.concat(source.shape, ',') ~= table.concat(target.shape, ',') then
      problems[#problems + 1] = string.format('%s is [%s], the model needs [%s]', name,
        table.concat(source.shape, ', '), table.concat(target.shape, ', '))
    else
      target:copy(source)
      used[source_name] = true
    end
  end
  for name, t in pairs(tensors) do
    if not used[name] and not IGNORED_CHECKPOINT_NAMES[name:match('attn%.[%w_]+$') or name] then
      problems[#problems + 1] = 'unexpected ' .. name
    end
    t:free()
  end
  if #problems > 0 then
    table.sort(problems)
    error(string.format("gpt:load: '%s' does not fit this model (%s)", path, table.concat(problems, '; ')), 2)
  end
  return self
end

function GPT:save(path)
  local cfg = self.config
  safetensors.save(path, self.named, { format = 'pt', vocab = cfg.vocab, seq_len = cfg.seq_len,
    layers = cfg.layers, heads = cfg.heads, dim = cfg.dim })
end

-- Shared with the other architectures built on GPT's flat storage (wick.nn.llama).
gpt.staged, gpt.count_selected, gpt.refresh_compute_weights = staged, count_selected, refresh_compute_weights
gpt.scored, gpt.logits_gradient = scored, logits_gradient
gpt.view_into = view_into  -- wick.nn.gathered places parameters in its buffers with it

return gpt
