-- wick.train.plan: the dry run of a recipe (`run --dry-run recipe.lua`, `--nproc-per-node N` or
-- WORLD_SIZE naming the world to plan for). In seconds on a CPU, before anyone waits for a
-- cluster: every source opened and its index read, the vocabulary against the model, every
-- divisibility of the batch (global by world x micro, for each accumulation of batch.schedule),
-- the devices this machine's ranks would take (wick.device, as the run chooses them), the parameter
-- count and a memory estimate per rank (against the machine's memory when on the CPU). It starts no
-- rank, reads no shard and allocates no model.
local core = require 'wick.core'
local recipe = require 'wick.recipe'
local train = require 'wick.train.arithmetic' -- the job's arithmetic, without loading the trainer
local model = require 'wick.train.model'
local device = require 'wick.device'

local plan = {}

local F32 = 4
local ADAM_STATES = 2            -- m and v, f32
-- The bytes of an activation element, and of the weights' compute copy beside the f32 masters,
-- under each policy (wick.precision: bf16 and fp16 store both in 2 bytes).
local STORED_BYTES = { fp32 = F32, bf16 = 2, fp16 = 2 }
local COMPUTE_COPY_BYTES = { fp32 = 0, bf16 = 2, fp16 = 2 }
-- The buffers wick.nn.modules, wick.nn.gpt and wick.nn.llama hold per token, in the stored dtype
-- (f32 where named), as multiples of the model's widths: dim, kv (kv_heads x head size), ffn
-- (ffn_dim) and vocab. A block's forward keeps `forward`, and the attention probabilities (heads x T
-- a token); one dim of it is the block's output, the next block's input, kept by every block, the
-- rest by one block only under recompute = 'blocks' (nn.share_buffers). The activation gradients of
-- backward (`gradients`) are one block's, shared by all. `model` is what the model holds itself.
-- GPT-2: forward ln_1 1, qkv 3, attention 1, projection 1, x1 1, ln_2 1, fc 4 and its gelu 4,
-- projection 1, output 1, f32 the mean and rstd of both layernorms; gradients attention 1, qkv 3, fc 4
-- (the GELU's output has none: the MLP's fused backward writes fc's through it), the layernorm 1;
-- the model the embedding, ln_f and the gradients of ln_f's output and of the residual stream (one
-- buffer, which each block's backward updates in place) 4, the logits 1 vocab (their gradient
-- replaces them), f32 ln_f's mean and rstd, the per-token losses and the loss mask as f32 that data
-- parallelism counts its targets with.
-- Llama: forward the two norms' outputs 2, x1 and the output 2, q, its rotation, y and the projection
-- 4, qkv 3, the feed-forward's projection 1; k, v and k's rotation; gate, up and their product; f32
-- each RMSNorm's rstd; gradients y 1, qkv 3, q and its rotation 2, a norm 1; k, v, k's rotation;
-- gate, up, the product; the model as a GPT's, with one f32 rstd for its final norm.
local BUFFERS = {
  gpt2 = { forward = { dim = 18, f32 = 4 }, gradients = { dim = 9 }, model = { dim = 4, vocab = 1, f32 = 4 } },
  llama = { forward = { dim = 12, kv = 3, ffn = 3, f32 = 2 }, gradients = { dim = 7, kv = 3, ffn = 3 },
    model = { dim = 4, vocab = 1, f32 = 3 } },
}

local format_bytes = core.format_bytes

-- The memory of this machine, which a CPU rank's estimate must fit: MemTotal of /proc/meminfo, or
-- the cgroup's limit where lower (v2's memory.max, v1's memory.limit_in_bytes); nil when unknown.
local MEMORY_LIMIT_FILES = { '/sys/fs/cgroup/memory.max', '/sys/fs/cgroup/memory/memory.limit_in_bytes' }
local KIB = 1024

function plan.machine_memory()
  local meminfo = core.read_file('/proc/meminfo')
  local total = meminfo and tonumber(meminfo:match('MemTotal:%s*(%d+) kB'))
  total = total and total * KIB
  for _, path in ipairs(MEMORY_LIMIT_FILES) do
    local limit = tonumber((core.read_file(path) or ''):match('^(%d+)')) -- 'max': no limit
    if limit and (not total or limit < total) then total = limit end
  end
  return total
end

-- The loader of the run (every source, rank 0 of `world`) checked as its start would check it:
-- the bytes of its ring, or nil and what the run would refuse.
local function check_loader(config, world, micro)
  local ok, loader = pcall(function()
    local o = train.loader_options(config, world, 0, micro, config.steps) -- the mix's weights checked here
    o.audit, o.device = nil, nil
    return require('wick.data').loader(o)
  end)
  if not ok then return nil, tostring(loader):gsub('^.-:%d+: ', '') end
  local checked, bytes = pcall(loader.check, loader)
  loader:close()
  if not checked then return nil, tostring(bytes):gsub('^.-:%d+: ', '') end
  return bytes
end

-- Elements per token of these widths.
local function per_token(m, widths)
  local kv = (m.kv_heads or m.heads) * (m.dim / m.heads)
  return (widths.dim or 0) * m.dim + (widths.kv or 0) * kv + (widths.ffn or 0) * (m.ffn_dim or 0)
    + (widths.vocab or 0) * m.vocab
end

-- The elements a training step keeps: per token (stored dtype, and f32), per position (both), and
-- once (f32). Per position, not per token, a Llama has the zero position rows its embedding adds
-- (stored) and their unused gradient (f32); once, the f32 inverse frequencies, head size / 2.
local function elements(m, seq_len)
  local b = BUFFERS[m.arch or 'gpt2']
  local block = per_token(m, b.forward) + m.heads * seq_len
  local holding = m.recompute == 'blocks' and 1 or m.layers  -- blocks whose forward buffers a step holds
  local e = { stored = m.layers * m.dim + holding * (block - m.dim) + per_token(m, b.gradients) + per_token(m, b.model),
    f32 = holding * b.forward.f32 + b.model.f32, position_stored = 0, position_f32 = 0, once_f32 = 0 }
  if m.arch == 'llama' then
    e.position_stored, e.position_f32, e.once_f32 = m.dim, m.dim, m.dim / m.heads / 2
  end
  return e
end

-- Memory per rank: the tensors a training step holds at its peak, by what they are: weights (f32
-- masters and the compute copy), gradients (f32), optimizer state, the slice buffers of sharded
-- data parallelism (parallel.shard: the all-gathers' source, and with 'gradients' or 'parameters'
-- the reduced gradients), activations at the micro batch of rows of seq_len tokens (default: the
-- model's), for a shape of wick.train.model (a GPT-2 when it names no arch; recompute = 'blocks'
-- holds one block's activations). Sharded over `world` ranks, AdamW's moments cover one slice: P
-- div world + P mod world elements (wick.nn.shard: a block of each bucket and the replicated head;
-- under 'parameters' each run of a unit has a head of its own, at most world - 1 elements more a
-- run), and so do the f32 masters under bf16/fp16. The compute weights stay whole, and so does the
-- full-size gradient buffer, which backward accumulates into, but under 'parameters'
-- (wick.nn.gathered: the root and prefetch + 1 blocks in turn, weights and gradients, and a landing
-- for the reduced part). What it leaves out: the data ring (plan.report adds it), a few scalars of
-- the trainer, the transient scratch of the CPU ops (at most three 256 x 256 f32 tiles a product
-- and two [T, T] f32 matrices a thread in attention, runtime/ops/cpu). A checkpoint adds nothing: each rank
-- writes the moments and the masters it holds (wick.train.checkpoint).
function plan.memory(m, micro, policy_name, seq_len, shard, world, prefetch)
  local P = model.parameter_count(m)
  seq_len = seq_len or m.seq_len
  local tokens, S = micro * seq_len, STORED_BYTES[policy_name]
  local e = elements(m, seq_len)
  local activations = tokens * (e.stored * S + e.f32 * F32) + seq_len * (e.position_stored * S + e.position_f32 * F32)
    + e.once_f32 * F32
  local copy = COMPUTE_COPY_BYTES[policy_name]
  local sharded = shard and shard ~= 'none'
  local slice = sharded and (P - P % world) / world + P % world or P
  local grads, optimizer = P * F32, slice * F32 * ADAM_STATES
  local reduced = (shard == 'gradients' or shard == 'parameters') and slice * F32 or 0  -- the reduced gradients' slice
  local weights, gather
  if shard == 'parameters' then
    -- the f32 masters' slice; the root and prefetch + 1 blocks gathered in the compute dtype, their
    -- f32 gradients, and where this rank's part of those lands, 1/world of them
    local block = model.block_parameter_count(m)
    local units = P - m.layers * block + math.min((prefetch or 1) + 1, m.layers) * block
    weights, grads = slice * F32 + units * S, units * F32
    gather = slice * copy + reduced + math.floor(units / world) * F32
  elseif sharded and copy > 0 then
    -- the compute copy whole, the f32 masters of this rank's slice, gathered from a 2-byte slice
    weights, gather = P * copy + slice * F32, slice * copy + reduced
  else
    weights, gather = P * (F32 + copy), sharded and slice * F32 or 0
  end
  return { weights = weights, grads = grads, optimizer = optimizer, gather = gather, activations = activations,
    total = weights + grads + optimizer + gather + activations }
end

-- A loader over one source, opened (its index read) but not started: nil and the message when not.
local function probe(config, path, world, micro)
  local one = require('wick.recipe.args').copy(config.data)
  one.sources, one.mix = { path }, {}
  local o = train.loader_options({ data = one, batch = config.batch, seed = config.seed }, world, 0, micro, config.steps)
  o.audit, o.device = nil, nil -- a plan reads indexes only: the device is the ranks' to check
  local ok, loader = pcall(require('wick.data').loader, o)
  if not ok then return nil, tostring(loader):gsub('^.-:%d+: ', '') end
  local vocab, eos = loader:vocab_size(), loader:eos()
  loader:close()
  local ds, why = require('wick.data.dataset').open(path)
  if not ds then return nil, why end
  local info = { vocab = vocab, eos = eos, tokenizer = ds.tokenizer, fingerprint = ds.tokenizer_fingerprint,
    tokens = ds.tokens, shards = ds.shards }
  ds:close()
  return info
end

-- What a run would find wrong with its checkpoint directory (wick.checkpoint.problems): one that
-- cannot be written, another run's lock, checkpoints a fresh run would mix with its own, a bad state
-- to resume from, or one at the last step already.
local function checkpoint_problems(job)
  local c, resume = job.config, job.flags.resume
  if not (c.checkpoint.final or c.checkpoint.every > 0 or resume) then return {} end
  if resume and c.checkpoint.overwrite then
    return { '--resume continues from the checkpoints of checkpoint.dir, checkpoint.overwrite removes them: drop one' }
  end
  local checkpoint = require 'wick.train.checkpoint'
  local problems = checkpoint.problems(c.checkpoint.dir, job.hash, resume, c.checkpoint.overwrite)
  local latest = resume and c.steps and checkpoint.latest(c.checkpoint.dir)
  if latest and latest.step >= c.steps then
    problems[#problems + 1] = ('--resume: %s is step %d and this run ends at step %d: nothing left to train')
      :format(latest.path, latest.step, c.steps)
  end
  return problems
end

-- Where and when the run saves, for the plan; nil when it saves nothing.
local function saving(c)
  local k = c.checkpoint
  local when = k.every > 0 and ('every %d steps%s'):format(k.every, k.final and ' and at the end' or '') or
    (k.final and 'at the end' or nil)
  return when and ('checkpoints: %s into %s, keeping %d%s'):format(when, k.dir, k.keep,
    k.overwrite and ' (its checkpoints removed first)' or '')
end

-- Checks and prints the plan; returns whether the recipe can run on `world` ranks, `local_ranks`
-- of them on this machine (default 1).
function plan.report(job, world, local_ranks)
  local_ranks = local_ranks or 1
  local c = job.config
  local problems, lines = {}, {}
  local function add(fmt, ...) lines[#lines + 1] = fmt:format(...) end
  add('%s: dry run for %d rank%s (recipe %s)', job.name, world, world == 1 and '' or 's', job.hash)
  local micro_at, why = train.micro_schedule(c.batch, world)
  if not micro_at then problems[#problems + 1] = why end
  local micro = micro_at and micro_at(1) or 1
  local on, no_device = model.devices(c, 0, local_ranks, device.count()) -- as each rank of this machine chooses
  if on then add('device: %s', on.text) else problems[#problems + 1] = no_device end
  if micro_at then
    add('batch: %d samples a step = %d ranks x %d micro-steps x %d rows (%d tokens a step)', c.batch.global, world,
      c.batch.global / (world * micro), micro, c.batch.global * c.data.seq_len)
    for _, point in ipairs(c.batch.schedule or {}) do
      add('  from step %d: %d micro-steps of %d rows', point[1], point[2], micro_at(point[1]))
    end
  end
  local vocab, tokenizers = 0, {}
  for _, path in ipairs(recipe.dataset_paths(c)) do
    local info, err = probe(c, path, world, micro)
    if info then
      add('source %s: index read, %d shards, %.3gM tokens, tokenizer %s, vocabulary %d, eos %d', path, info.shards,
        info.tokens / 1e6, info.tokenizer, info.vocab, info.eos)
      vocab = math.max(vocab, info.vocab)
      tokenizers[#tokenizers + 1] = { path, info.tokenizer }
      problems[#problems + 1] = model.tokenizer_problem(c, path, info)
    else
      problems[#problems + 1] = ('source %s: %s'):format(path, err)
    end
  end
  for i = 2, #tokenizers do
    if tokenizers[i][2] ~= tokenizers[1][2] then
      problems[#problems + 1] = ('sources tokenized differently: %s by %s, %s by %s (one model reads one vocabulary)')
        :format(tokenizers[1][1], tokenizers[1][2], tokenizers[i][1], tokenizers[i][2])
    end
  end
  local m, model_problems = model.shape(c, vocab)
  for _, p in ipairs(model_problems) do problems[#problems + 1] = p end
  local ring_bytes = 0
  if #problems == 0 then
    local bytes, why = check_loader(c, world, micro)
    if bytes then ring_bytes = bytes else problems[#problems + 1] = why end
  end
  if m and m.vocab > 0 then
    local policy = type(c.precision) == 'table' and 'fp16' or c.precision
    local mem = plan.memory(m, micro, policy, c.data.seq_len, c.parallel.shard, world, c.parallel.prefetch)
    local P = model.parameter_count(m)
    add('model: %s%s, %d layers, %d heads%s, dim %d%s, vocab %d, seq_len %d: %d parameters (%.2fM), %.3g GFLOP a token ' ..
      'at data.seq_len %d',
      m.arch, c.model.from_pretrained and (' from ' .. c.model.from_pretrained) or '', m.layers, m.heads,
      m.kv_heads and (' (' .. m.kv_heads .. ' kv)') or '', m.dim, m.ffn_dim and (', ffn_dim ' .. m.ffn_dim) or '', m.vocab,
      m.seq_len, P, P / 1e6, model.flops_per_token(m, c.data.seq_len) / 1e9, c.data.seq_len)
    local total = mem.total + ring_bytes
    local sharded = c.parallel.shard ~= 'none'
    add('memory per rank (%s, micro batch %d%s%s): weights %s, grads %s, optimizer %s, %sactivations %s, data ring %s: ' ..
      'total %s', policy, micro, sharded and ', shard ' .. c.parallel.shard or '',
      m.recompute == 'blocks' and ', recompute blocks' or '', format_bytes(mem.weights),
      format_bytes(mem.grads), format_bytes(mem.optimizer), sharded and 'gather ' .. format_bytes(mem.gather) .. ', ' or '',
      format_bytes(mem.activations), format_bytes(ring_bytes), format_bytes(total))
    local machine = on and on.model == 'cpu' and plan.machine_memory()
    if machine and total * local_ranks > machine then
      problems[#problems + 1] = ('the memory estimate, %s per rank x %d rank%s on this machine, is above its %s ' ..
        '(device cpu): lower batch.micro, data.seq_len or the model'):format(format_bytes(total), local_ranks,
        local_ranks == 1 and '' or 's', format_bytes(machine))
    end
  end
  if c.steps then add('steps: %d (%.3g billion tokens)', c.steps, c.steps * c.batch.global * c.data.seq_len / 1e9) end
  if c.steps and job.flags.repl_at and job.flags.repl_at > c.steps then
    problems[#problems + 1] = ('--repl-at=%d is beyond the last step %d'):format(job.flags.repl_at, c.steps)
  end
  if saving(c) then add('%s', saving(c)) end
  for _, p in ipairs(checkpoint_problems(job)) do problems[#problems + 1] = p end
  for _, line in ipairs(lines) do print(line) end
  for _, p in ipairs(problems) do io.stderr:write(job.name .. ': ' .. p .. '\n') end
  print(#problems == 0 and 'dry run: ok' or ('dry run: %d problem%s'):format(#problems, #problems == 1 and '' or 's'))
  return #problems == 0
end

return plan
