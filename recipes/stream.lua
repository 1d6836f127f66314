-- stream.lua: streams a dataset the way training would, and reports throughput and data stall.
--   ./run --nproc-per-node 2 recipes/stream.lua --data build/demo/data --steps 200
-- Every rank reads its own slice of each global batch; rank 0 prints progress lines, a few decoded
-- samples (bytes tokenizer) and the cursor that would resume the stream.
local cli = require 'wick.cli'
local core = require 'wick.core'
local data = require 'wick.data'

local LOADER = data.LOADER_OPTIONS
local MAX_SLEEP_MS = 4294967 -- usleep takes unsigned 32-bit microseconds
local EXACT_INTEGER = 2 ^ 53

local spec = {
  name = 'recipes/stream.lua',
  options = {
    { 'data', 'path', value = 'DIR', required = true, help = 'dataset directory' },
    cli.from(LOADER, 'seq_len', { default = 256, help = 'tokens per sample minus one' }),
    cli.from(LOADER, 'global_batch', { default = 64, help = 'samples per step over all ranks' }),
    cli.from(LOADER, 'micro_batch', { default = 8, help = 'rows per micro-batch' }),
    { 'steps', 'integer', min = 1, max = EXACT_INTEGER, default = 200, help = 'global steps to stream' },
    cli.from(LOADER, 'threads', { default = 2, help = 'reader threads per rank' }),
    cli.from(LOADER, 'seed', { default = 0, help = 'shuffle seed' }),
    { 'samples', 'integer', min = 0, max = EXACT_INTEGER, default = 2, help = 'decoded samples to print at the end' },
    { 'compute_ms', 'number', min = 0, max = MAX_SLEEP_MS, default = 2,
      help = 'simulated compute per micro-step (stands in for the GPU)' },
    { 'resume', 'path', value = 'FILE', help = 'start from the cursor saved in this file' },
    { 'save_cursor', 'path', value = 'FILE', help = 'rank 0 writes the cursor to this file at the end' },
    { 'audit', 'path', value = 'FILE', help = 'append one line per sample to this file (all ranks)' },
  },
}
local opts = cli.parse(spec, { ... })
local ffi = require 'ffi'
pcall(ffi.cdef, 'int usleep(unsigned int usec);')
local rank = tonumber(os.getenv('RANK') or 0)
local REPORTS = 10        -- progress lines over the run
local SHOWN_CHARS = 160   -- of each decoded sample

local function read_cursor(path)
  local f, err = io.open(path, 'rb')
  if not f then cli.fail(('%s: cannot read the cursor: %s'):format(spec.name, err), cli.EXIT_DATA) end
  local cursor = f:read('*a'):gsub('%s+$', '')
  f:close()
  return cursor
end

local loader = data.loader {
  data = opts.data, seq_len = opts.seq_len, global_batch = opts.global_batch, micro_batch = opts.micro_batch,
  threads = opts.threads, seed = opts.seed, audit = opts.audit, cursor = opts.resume and read_cursor(opts.resume),
}

local function decode(batch, row)
  local width = batch.seq_len + 1
  local tokens = ffi.cast('int32_t *', batch.tokens:data())  -- a CPU loader's i32 tokens, read in place
  local chars = {}
  for t = 0, math.min(width, SHOWN_CHARS) - 1 do
    local token = tokens[row * width + t]
    chars[#chars + 1] = token < 256 and string.char(token) or '<eos>'
  end
  -- one line per sample: newlines and tabs shown as escapes
  return (table.concat(chars):gsub('\n', '\\n'):gsub('\t', '\\t'))
end

local start = core.now()
local tokens, waited_ns, batch = 0, 0, nil
local report_every = math.max(1, math.floor(opts.steps / REPORTS))
for step = 1, opts.steps do
  repeat
    batch = assert(loader:next(), 'the stream ended early')
    tokens = tokens + batch.rows * (batch.seq_len + 1)
    waited_ns = waited_ns + batch.wait_ns
    ffi.C.usleep(opts.compute_ms * 1000) -- the model's step: the loader works ahead meanwhile
  until batch.micro_step == batch.micro_steps - 1
  if rank == 0 and (step % report_every == 0 or step == opts.steps) then
    local elapsed = core.now() - start
    print(('step %4d/%d  %7.2f M tokens/s per rank  stall %5.1f%%  order %s'):format(step, opts.steps,
      tokens / elapsed / 1e6, 100 * waited_ns * 1e-9 / elapsed, batch.fingerprint))
  end
end

if rank == 0 then
  for row = 0, math.min(opts.samples, batch.rows) - 1 do
    local s = loader:sample(row)
    print(('sample shard=%d offset=%d epoch=%d: "%s"'):format(s.shard, s.offset, s.epoch, decode(batch, row)))
  end
  print('cursor: ' .. loader:state())
  if opts.save_cursor then
    local f, err = io.open(opts.save_cursor, 'wb')
    if not f then cli.fail(('%s: cannot save the cursor: %s'):format(spec.name, err), cli.EXIT_DATA) end
    f:write(loader:state(), '\n')
    f:close()
  end
end
loader:close()
