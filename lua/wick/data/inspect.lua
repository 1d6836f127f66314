-- wick.data.inspect: prints the samples one rank would receive, without starting other ranks.
--   run -m wick.data.inspect --data DIR --seq-len 256 --global-batch 32 --micro-batch 4 --world 4 --rank 1 --steps 2
-- One line per sample: `step=S rank=R id=SOURCE:SHARD:OFFSET hash=H micro=M row=I epoch=E len=N status=ok`;
-- with --stats, then the loader's counters (a remote source's fetches: bytes, cache hits and misses,
-- retries by cause, download rate, time waited on the network).
-- With --quality (a dataset directory only): how well the order mixes over one epoch (wick.data.quality),
-- next to Wick 0.1's shard-window order of the same data.
-- With --info (a dataset only): one line of what its tokens are: tokenizer, vocabulary, EOS, and the
-- template the converter put around each document (BOS), instead of samples.
-- With --records N (a dataset only: `inspect DATASET --records N [--from K] [--json]`): N records as stored,
-- from the dataset's record K (counted over its shards), instead of samples: each record's tokens (its EOS
-- left out) and its columns (wick.data.records), one JSON object a line with --json.
-- --data is a path: a dataset (directory or index.json), or a regular .lua file returning a data.mix{}.
-- A mix written on the command line needs --mix, e.g. --mix "data.mix{ {'a', weight = 3}, {'b'} }": a
-- path is never evaluated as Lua, whatever its spelling.
local cli = require 'wick.cli'
local core = require 'wick.core'
local data = require 'wick.data'

local LOADER, SHUFFLE = data.LOADER_OPTIONS, data.SHUFFLE_OPTIONS

local EXACT_INTEGER = 2 ^ 53
local C = core.C
local function loader_default(param) return core.default(C.wk_loader_param_default, param) end -- the loader's own

local spec = {
  name = 'wick.data.inspect',
  usage = '--data PATH | --mix EXPR [options]  |  DATASET --records N [--from K] [--json]',
  positional = 'DATASET',
  description = 'Prints one line per sample the given rank would receive: step=S rank=R id=ID hash=H ...',
  options = {
    { 'data', 'path', help = 'a dataset (directory or index.json), or a .lua file returning a data.mix{}' },
    { 'mix', 'string', value = 'EXPR', help = "a Lua expression of a mix, with `data` and `wick` in scope, e.g. \z
      \"data.mix{ {'a', weight = 3}, {'b'} }\"" },
    cli.from(LOADER, 'seq_len', { default = loader_default(C.WK_LOADER_SEQ_LEN), help = 'tokens per sample minus one' }),
    cli.from(LOADER, 'global_batch', { default = loader_default(C.WK_LOADER_GLOBAL_BATCH), help = 'samples per step over all ranks' }),
    cli.from(LOADER, 'micro_batch', { help = 'rows per micro-batch (default: global batch / world)' }),
    cli.from(LOADER, 'world_size', { 'world', default = 1, help = 'world size' }),
    cli.from(LOADER, 'rank', { default = 0, help = 'the rank to show' }),
    cli.from(LOADER, 'seed', { default = 0, help = 'shuffle seed' }),
    { 'steps', 'integer', min = 1, max = EXACT_INTEGER, default = 1, help = 'global steps to print' },
    cli.from(LOADER, 'mode', { default = 'packed', help = 'packed windows or one padded document per row' }),
    cli.from(SHUFFLE, 'window_tokens', { default = loader_default(C.WK_LOADER_WINDOW_TOKENS) }),
    cli.from(SHUFFLE, 'pool_tokens', { default = loader_default(C.WK_LOADER_POOL_TOKENS) }),
    { 'no_shuffle', 'flag', help = 'stored order instead of the shuffle' },
    cli.from(LOADER, 'partitions', { default = 1, help = 'canonical partitions' }),
    cli.from(LOADER, 'chunk', { default = 1, help = 'draws per partition turn' }),
    cli.from(LOADER, 'on_corrupt', { default = 'error', help = 'stop at corrupt data, or mask and count it' }),
    cli.from(LOADER, 'threads', { default = loader_default(C.WK_LOADER_THREADS), help = 'reader threads' }),
    { 'from', 'path', value = 'FILE', help = 'start from the cursor saved in this file; with --records, the first ' ..
      'record to print (K, counted over the dataset)' },
    { 'save_cursor', 'path', value = 'FILE', help = 'write the cursor after the printed steps to this file' },
    { 'fingerprint', 'flag', help = 'also print one line per step with its order fingerprint' },
    { 'quality', 'flag', help = "print the order's mixing figures over one epoch, next to Wick 0.1's order" },
    { 'info', 'flag', help = "print the dataset's tokenizer, vocabulary, EOS and what each document starts and " ..
      'ends with (the BOS the converter applied), instead of samples' },
    { 'reference_window', 'integer', min = 1, max = 2 ^ 31, default = 8,
      help = "Wick 0.1's shuffle window (shards) for --quality" },
    { 'stats', 'flag', help = "after the samples, the loader's counters: decode, and a remote source's fetches" },
    { 'records', 'integer', min = 1, max = EXACT_INTEGER, value = 'N',
      help = 'print N records of the dataset as stored (tokens and every column) instead of samples' },
    { 'json', 'flag', help = 'with --records: one JSON object a line' },
  },
}
-- A remote source's options (cache_dir, cache_disk_bytes, ...), from the loader's own declarations.
for _, option in ipairs(data.REMOTE_OPTIONS.options) do
  spec.options[#spec.options + 1] = cli.from(data.REMOTE_OPTIONS, option[1])
end
spec = cli.spec(spec)

local function read_file(path)
  local text, err = core.read_file(path)
  if not text then cli.fail(('%s: cannot read %s'):format(spec.name, err), cli.EXIT_DATA) end
  return text
end

local function write_file(path, text)
  local ok, err = core.write_file(path, text)
  if not ok then cli.fail(('%s: cannot write %s'):format(spec.name, err), cli.EXIT_DATA) end
end

local function check_mix(value, where)
  if type(value) ~= 'string' and not data.is_mix(value) then
    cli.usage_error(spec, ('%s must give a data.mix{} or a dataset path, not a %s'):format(where, type(value)))
  end
  return value
end

-- What --data or --mix names: a dataset path (given to the loader as it is: a missing or bad dataset
-- is the runtime's data error), the mix a regular .lua file returns, or the mix an expression makes.
local function resolve_data(opts)
  if opts.data and opts.mix then cli.usage_error(spec, '--data and --mix exclude each other') end
  if opts.mix then
    local chunk, err = loadstring('return ' .. opts.mix, '=--mix')
    if not chunk then cli.usage_error(spec, err) end
    setfenv(chunk, setmetatable({ data = data, wick = require 'wick' }, { __index = _G }))
    local ok, mix = pcall(chunk) -- what it raises is about the command line (a weight of inf, say)
    if not ok then cli.usage_error(spec, '--mix: ' .. tostring(mix):gsub('^[^\n]-:%d+: ', '')) end
    return check_mix(mix, '--mix')
  end
  if not opts.data then cli.usage_error(spec, '--data PATH or --mix EXPR is required') end
  local ok, host = pcall(require, 'wick.host')
  local kind = ok and host.file_kind(opts.data)
  if kind == 'file' and opts.data:match('%.lua$') then return check_mix(dofile(opts.data), opts.data) end
  return opts.data
end

local function print_quality(opts)
  local quality = require 'wick.data.quality'
  local ds, err = require('wick.data.dataset').open(opts.data)
  if not ds then cli.fail(('%s: %s'):format(spec.name, err), cli.EXIT_DATA) end
  local this = quality.loader_order {
    data = opts.data, seq_len = opts.seq_len, global_batch = opts.global_batch, seed = opts.seed, mode = opts.mode,
    shuffle = not opts.no_shuffle and { window_tokens = opts.window_tokens, pool_tokens = opts.pool_tokens },
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

-- "tokenizer=llama3/tokenizer.json vocab=128256 eos=128001 bos=128000 template=applied prefix=128000 suffix=-"
local function print_info(opts)
  local ds, err = require('wick.data.dataset').open(opts.data)
  if not ds then cli.fail(('%s: %s'):format(spec.name, err), cli.EXIT_DATA) end
  local t = ds.template
  local function ids(list) return #list > 0 and table.concat(list, ',') or '-' end
  print(('%s: tokenizer=%s vocab=%d eos=%d bos=%s template=%s%s'):format(opts.data, ds.tokenizer, ds.vocab_size,
    ds.eos, ds.bos or '-', not t and 'none' or t.applied and 'applied' or 'not-applied',
    t and (' prefix=%s suffix=%s'):format(ids(t.prefix), ids(t.suffix)) or ''))
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

-- --records N [--from K] [--json]: the dataset's records as stored.
local function print_records(opts, positional)
  if #positional > 1 or (positional[1] and opts.data) then
    cli.usage_error(spec, '--records reads one dataset: give DATASET or --data DIR')
  end
  local path = positional[1] or opts.data
  if not path then cli.usage_error(spec, '--records needs a DATASET') end
  local from = opts.from and tonumber(opts.from)
  if opts.from and not (from and from >= 0 and from % 1 == 0 and from < EXACT_INTEGER) then
    cli.usage_error(spec, ("--from with --records is a record number, not '%s'"):format(opts.from))
  end
  local ds, err = require('wick.data.dataset').open(path)
  if not ds then cli.fail(('%s: %s'):format(spec.name, err), cli.EXIT_DATA) end
  local records = require 'wick.data.records'
  local format = opts.json and records.json or records.text
  local ok, failure = pcall(records.each, ds, from or 0, opts.records, function(r) print(format(r)) end)
  ds:close()
  if not ok then cli.fail(('%s: %s'):format(spec.name, tostring(failure):gsub('^[^\n]-:%d+: ', '')), cli.EXIT_DATA) end
end

local function main(args)
  local opts, positional = cli.parse(spec, args)
  if opts.records then
    print_records(opts, positional)
    return 0
  end
  if #positional > 0 then cli.usage_error(spec, ("unexpected argument '%s' (a DATASET goes with --records)"):format(positional[1])) end
  if opts.json then cli.usage_error(spec, '--json goes with --records') end
  local source = resolve_data(opts)
  if opts.quality or opts.info then
    if type(source) ~= 'string' then cli.usage_error(spec, '--quality and --info read one dataset: give --data DIR') end
    if opts.info then print_info(opts) else print_quality(opts) end
    return 0
  end
  local options = {
    data = source,
    seq_len = opts.seq_len, global_batch = opts.global_batch, micro_batch = opts.micro_batch,
    world_size = opts.world, rank = opts.rank, seed = opts.seed, mode = opts.mode,
    shuffle = not opts.no_shuffle and { window_tokens = opts.window_tokens, pool_tokens = opts.pool_tokens },
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
  if opts.save_cursor then write_file(opts.save_cursor, loader:state() .. '\n') end
  loader:close()
  return 0
end

return { main = main, spec = spec }
