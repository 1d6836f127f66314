-- wick.data.inspect: prints the samples one rank would receive, without starting other ranks.
--   run -m wick.data.inspect --data DIR --seq-len 256 --global-batch 32 --micro-batch 4 --world 4 --rank 1 --steps 2
-- One line per sample: `step=S rank=R id=SOURCE:SHARD:OFFSET hash=H micro=M row=I epoch=E len=N status=ok`;
-- with --stats, then the loader's counters (a remote source's fetches: bytes, cache hits and misses,
-- retries by cause, download rate, time waited on the network).
-- With --quality (a dataset directory only): how well the order mixes over one epoch (wick.data.quality),
-- next to Wick 0.1's shard-window order of the same data.
-- --data is a dataset directory, a .lua file returning a data.mix{}, or a Lua expression such as
-- "data.mix{ {'a', weight = 3}, {'b'} }".
local cli = require 'wick.cli'
local data = require 'wick.data'

local spec = {
  name = 'wick.data.inspect',
  usage = '--data SPEC [options]',
  description = 'Prints one line per sample the given rank would receive: step=S rank=R id=ID hash=H ...',
  options = {
    { 'data', 'spec', required = true, help = 'dataset directory, mix .lua file, or mix expression' },
    { 'seq_len', 'number', default = 1024, help = 'tokens per sample minus one' },
    { 'global_batch', 'number', default = 8, help = 'samples per step over all ranks' },
    { 'micro_batch', 'number', help = 'rows per micro-batch (default: global batch / world)' },
    { 'world', 'number', default = 1, help = 'world size' },
    { 'rank', 'number', default = 0, help = 'the rank to show' },
    { 'seed', 'number', default = 0, help = 'shuffle seed' },
    { 'steps', 'number', default = 1, help = 'global steps to print' },
    { 'mode', 'string', default = 'packed', help = 'packed or pad' },
    { 'window_tokens', 'number', default = 2 ^ 29, help = 'tokens of the shards whose units are permuted together' },
    { 'buffer_tokens', 'number', default = 2 ^ 22, help = 'tokens of the units whose samples are shuffled together' },
    { 'no_shuffle', 'flag', help = 'stored order instead of the shuffle' },
    { 'partitions', 'number', default = 1, help = 'canonical partitions' },
    { 'chunk', 'number', default = 1, help = 'draws per partition turn' },
    { 'on_corrupt', 'string', default = 'error', help = 'error or skip' },
    { 'threads', 'number', default = 2, help = 'reader threads' },
    { 'from', 'file', help = 'start from the cursor saved in this file' },
    { 'save_cursor', 'file', help = 'write the cursor after the printed steps to this file' },
    { 'fingerprint', 'flag', help = 'also print one line per step with its order fingerprint' },
    { 'quality', 'flag', help = "print the order's mixing figures over one epoch, next to Wick 0.1's order" },
    { 'reference_window', 'number', default = 8, help = "Wick 0.1's shuffle window (shards) for --quality" },
    { 'stats', 'flag', help = "after the samples, the loader's counters: decode, and a remote source's fetches" },
  },
}
-- A remote source's options (cache_dir, cache_disk_bytes, ...), from the loader's own table.
for _, option in ipairs(data.REMOTE_OPTIONS.options) do
  spec.options[#spec.options + 1] = { option[1], option[2] == 'string' and 'string' or 'number', help = option.help }
end

local function read_file(path)
  local f, err = io.open(path, 'rb')
  if not f then error('cannot read ' .. path .. ': ' .. tostring(err), 0) end
  local text = f:read('*a')
  f:close()
  return text
end

-- A directory, a .lua file returning a mix, or an expression evaluated with `data` and `wick` in scope.
local function resolve_data(text)
  if text:match('%.lua$') then return dofile(text) end
  if text:match('^%s*[%w_%.]+%s*[%({]') then
    local env = setmetatable({ data = data, wick = require 'wick' }, { __index = _G })
    local chunk, err = loadstring('return ' .. text, '=--data')
    if not chunk then error('--data: ' .. err, 0) end
    return setfenv(chunk, env)()
  end
  return text
end

local function print_quality(opts)
  local quality = require 'wick.data.quality'
  local ds, err = require('wick.dataset').open(opts.data)
  if not ds then error('--quality needs a dataset directory: ' .. err, 0) end
  local this = quality.loader_order {
    data = opts.data, seq_len = opts.seq_len, global_batch = opts.global_batch, seed = opts.seed, mode = opts.mode,
    shuffle = not opts.no_shuffle and { window_tokens = opts.window_tokens, buffer_tokens = opts.buffer_tokens },
    partitions = opts.partitions, chunk = opts.chunk, threads = opts.threads,
  }
  local reference = quality.reference_order(ds, { seq_len = opts.seq_len, seed = opts.seed, mode = opts.mode,
                                                  window = opts.reference_window })
  local a, b = quality.measure(this, opts.global_batch, ds), quality.measure(reference, opts.global_batch, ds)
  print(('quality over one epoch of %s: %d samples, global batch %d'):format(opts.data, a.samples, opts.global_batch))
  print(('%-34s %12s %12s'):format('', 'this order', ('Wick 0.1 (%d)'):format(opts.reference_window)))
  for _, row in ipairs {
    { 'distinct shards per batch (mean)', 'shards_per_batch', '%12.2f' },
    { 'distinct shards per batch (min)', 'shards_per_batch_min', '%12d' },
    { 'distinct documents per batch', 'docs_per_batch', '%12.2f' },
    { 'position correlation', 'correlation', '%12.3f' },
    { 'neighbour distance (random ~0.33)', 'neighbour_distance', '%12.3f' },
  } do
    print(('%-34s ' .. row[3] .. ' ' .. row[3]):format(row[1], a[row[2]], b[row[2]]))
  end
  ds:close()
end

-- Counters as one line each: "stats: name=value ..." and "stats remote: name=value ...".
local function print_stats(loader)
  local s = loader:stats()
  local fields = { 'batches', 'wait_ns', 'skipped', 'decoded_bytes', 'delivered_bytes', 'node_decoded_bytes',
                   'node_delivered_bytes' }
  local parts = {}
  for _, field in ipairs(fields) do parts[#parts + 1] = ('%s=%d'):format(field, s[field]) end
  print('stats: ' .. table.concat(parts, ' '))
  parts = {}
  for _, field in ipairs(data.REMOTE_STAT_FIELDS) do parts[#parts + 1] = ('%s=%d'):format(field, s.remote[field]) end
  print('stats remote: ' .. table.concat(parts, ' '))
end

local function main(args)
  local opts = cli.parse(spec, args)
  if opts.quality then
    print_quality(opts)
    return 0
  end
  local options = {
    data = resolve_data(opts.data),
    seq_len = opts.seq_len, global_batch = opts.global_batch, micro_batch = opts.micro_batch,
    world_size = opts.world, rank = opts.rank, seed = opts.seed, mode = opts.mode,
    shuffle = not opts.no_shuffle and { window_tokens = opts.window_tokens, buffer_tokens = opts.buffer_tokens },
    partitions = opts.partitions, chunk = opts.chunk,
    on_corrupt = opts.on_corrupt, threads = opts.threads,
    cursor = opts.from and read_file(opts.from):gsub('%s+$', ''),
  }
  for _, option in ipairs(data.REMOTE_OPTIONS.options) do options[option[1]] = opts[option[1]] end
  local loader = data.loader(options)
  local first_step
  while true do
    local batch = loader:next()
    if not batch then break end
    first_step = first_step or batch.step
    if batch.step >= first_step + opts.steps then break end
    if opts.fingerprint and batch.micro_step == 0 then
      print(('step=%d fingerprint=%s'):format(batch.step, batch.fingerprint))
    end
    for row = 0, batch.rows - 1 do
      local s = loader:sample(row)
      print(('step=%d rank=%d id=%d:%d:%d hash=%s micro=%d row=%d epoch=%d len=%d status=%s'):format(
        batch.step, opts.rank, s.source, s.shard, s.offset, s.hash, batch.micro_step, row, s.epoch, s.length,
        s.status))
    end
    if batch.step == first_step + opts.steps - 1 and batch.micro_step == batch.micro_steps - 1 then break end
  end
  if opts.stats then print_stats(loader) end
  if opts.save_cursor then
    local f = assert(io.open(opts.save_cursor, 'wb'))
    f:write(loader:state(), '\n')
    f:close()
  end
  loader:close()
  return 0
end

return { main = main, spec = spec }
