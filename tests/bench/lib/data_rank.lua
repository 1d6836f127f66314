-- One rank of the data benchmark, started by tests/bench/data.lua through the launcher (lib/, so that
-- make bench does not run it on its own):
--   ./run --nproc-per-node 2 tests/bench/lib/data_rank.lua --data DIR --tokens N [LOADER OPTIONS]
-- Streams N tokens as fast as it can, timed from the first batch on, and prints one line of
-- key=value results.
--
-- LOADER OPTIONS go straight to wick.data.loader, so the harness names the loader's own options and
-- this file never changes with them: `--name value` sets opts.name (dashes become underscores),
-- `--name.field value` sets opts.name.field; a value is a number, true, false, a list `[a,b,...]` of
-- strings, or else a string.
-- Examples: --threads 2, --shuffle false, --shuffle.window 1, --dtype i64, --columns '[loss_mask,label]'.
--
-- Counters that the loader's stats() may lack are printed only when it has them. Options the loader
-- refuses, or one it ignores visibly (dtype: the width of the tokens handed out), are reported as
-- `unsupported=WHAT DETAIL` without measuring, so the harness prints that row as n/a.
local core = require 'wick.core'
local data = require 'wick.data'
local ffi = require 'ffi'
pcall(ffi.cdef, [[
  typedef struct { long tv_sec; long tv_usec; } wick_bench_timeval;
  typedef struct { wick_bench_timeval utime, stime; long maxrss; long rest[13]; } wick_bench_rusage;
  int getrusage(int who, wick_bench_rusage *usage);
]])
local RUSAGE_SELF = 0
local USAGE = 'usage: data_rank.lua --data DIR --tokens N [--loader-option VALUE ...]'
local TOKEN_BYTES = { i32 = 4, i64 = 8 }
-- loader:stats() fields printed when present (the new data core's decode counters).
local COUNTERS = { 'decoded_bytes', 'delivered_bytes', 'node_decoded_bytes', 'node_delivered_bytes',
  'node_private_decodes', 'node_steals', 'node_waits', 'node_edges_missing', 'node_edges_dropped' }

local function fail(message)
  io.stderr:write('data_rank.lua: ', message, '\n', USAGE, '\n')
  os.exit(2)
end

local function value_of(text)
  if text == 'true' then return true end
  if text == 'false' then return false end
  local items = text:match('^%[(.*)%]$')
  if items then
    local list = {}
    for item in items:gmatch('[^,]+') do list[#list + 1] = item end
    return list
  end
  return tonumber(text) or text
end

-- Returns the worker's own options and the loader's, from `--name value` pairs.
local function parse(args)
  local own, loader = {}, {}
  if #args % 2 ~= 0 then fail('options come in --name value pairs') end
  for i = 1, #args, 2 do
    local name, text = args[i]:match('^%-%-([%w%-%.]+)$'), args[i + 1]
    if not name then fail(("expected --name, got '%s'"):format(args[i])) end
    name = name:gsub('%-', '_')
    if name == 'data' then
      own.data = text
    elseif name == 'tokens' then
      own.tokens = tonumber(text) or fail('--tokens needs a number')
    else
      local table_name, field = name:match('^([%w_]+)%.([%w_]+)$')
      if table_name then
        if type(loader[table_name]) ~= 'table' then loader[table_name] = {} end
        loader[table_name][field] = value_of(text)
      else
        loader[name] = value_of(text)
      end
    end
  end
  if not own.data or not own.tokens then fail('--data and --tokens are required') end
  return own, loader
end

local function cpu_seconds()
  local usage = ffi.new('wick_bench_rusage')
  ffi.C.getrusage(RUSAGE_SELF, usage)
  return tonumber(usage.utime.tv_sec + usage.stime.tv_sec) + tonumber(usage.utime.tv_usec + usage.stime.tv_usec) * 1e-6,
    tonumber(usage.maxrss) * 1024
end

local own, options = parse({ ... })
options.data = own.data
local t0 = core.now()
local made, loader = pcall(data.loader, options)
if not made then
  -- An option this loader does not know (a row written for another version): the harness prints
  -- the row as n/a with this message, instead of failing the whole benchmark.
  print(('unsupported=options %s'):format(tostring(loader):gsub('\n', ' ')))
  return
end
local batch = loader:next()
local first_batch = core.now() - t0
local token_bytes = TOKEN_BYTES[batch.dtype] or error('data_rank.lua: tokens of an unknown dtype ' .. tostring(batch.dtype))
if options.dtype and TOKEN_BYTES[options.dtype] ~= token_bytes then
  print(('unsupported=dtype the loader hands out %d-byte tokens'):format(token_bytes))
  loader:close()
  return
end
local width = batch.seq_len + 1
local delivered = 0
local start = core.now()
local cpu_start = cpu_seconds()
while delivered < own.tokens do
  batch = loader:next()
  delivered = delivered + batch.rows * width
end
local elapsed = core.now() - start
local cpu_end, peak_rss = cpu_seconds()
local stats = loader:stats()
loader:close()
local counters = {}
for _, name in ipairs(COUNTERS) do
  if stats[name] then counters[#counters + 1] = ('%s=%d'):format(name, stats[name]) end
end
print(('tokens_per_s=%.0f delivered=%d seconds=%.6f first_batch_ms=%.3f cpu_s=%.6f cpu_ns_per_token=%.3f ' ..
  'peak_rss=%d ring_bytes=%d token_bytes=%d %s'):format(delivered / elapsed, delivered, elapsed, first_batch * 1e3,
  cpu_end - cpu_start, (cpu_end - cpu_start) * 1e9 / delivered, peak_rss, stats.buffers * stats.buffer_bytes,
  token_bytes, table.concat(counters, ' ')))
