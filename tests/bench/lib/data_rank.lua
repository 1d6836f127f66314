-- One rank of the data benchmark (started by tests/bench/data.lua through the launcher; lib/ so
-- that make bench does not run it on its own): streams
-- --tokens tokens as fast as it can and prints key=value results on one line.
local cli = require 'wick.cli'
local core = require 'wick.core'
local data = require 'wick.data'
local ffi = require 'ffi'
pcall(ffi.cdef, [[
  typedef struct { long tv_sec; long tv_usec; } wick_bench_timeval;
  typedef struct { wick_bench_timeval utime, stime; long maxrss; long rest[13]; } wick_bench_rusage;
  int getrusage(int who, wick_bench_rusage *usage);
]])
local RUSAGE_SELF = 0

local opts = cli.parse({ name = 'tests/bench/lib/data_rank.lua', options = {
  { 'data', 'dir', required = true }, { 'tokens', 'number', default = 1e8 }, { 'seq_len', 'number', default = 1024 },
  { 'micro_batch', 'number', default = 16 }, { 'threads', 'number', default = 1 },
  { 'cache_bytes', 'number', default = 64 * 2 ^ 20 }, { 'window', 'number', default = 4 },
} }, { ... })

local function cpu_seconds()
  local usage = ffi.new('wick_bench_rusage')
  ffi.C.getrusage(RUSAGE_SELF, usage)
  return tonumber(usage.utime.tv_sec + usage.stime.tv_sec) + tonumber(usage.utime.tv_usec + usage.stime.tv_usec) * 1e-6,
    tonumber(usage.maxrss) * 1024
end

local world = tonumber(os.getenv('WORLD_SIZE') or 1)
local t0 = core.now()
local cpu0 = cpu_seconds()
local loader = data.loader {
  data = opts.data, seq_len = opts.seq_len, micro_batch = opts.micro_batch, global_batch = opts.micro_batch * world,
  threads = opts.threads, cache_bytes = opts.cache_bytes, shuffle = { window = opts.window },
}
local batch = loader:next()
local first_batch = core.now() - t0
local width = batch.seq_len + 1
local delivered = batch.rows * width
local start = core.now()
local cpu_start = cpu_seconds()
while delivered < opts.tokens do
  batch = loader:next()
  delivered = delivered + batch.rows * width
end
local elapsed = core.now() - start
local cpu_end, peak_rss = cpu_seconds()
local stats = loader:stats()
loader:close()
print(('tokens_per_s=%.0f first_batch_ms=%.3f cpu_ns_per_token=%.3f peak_rss=%d ring_bytes=%d cpu_total=%.3f'):format(
  delivered / elapsed, first_batch * 1e3, (cpu_end - cpu_start) * 1e9 / delivered, peak_rss,
  stats.buffers * stats.buffer_bytes, cpu_end - cpu0))
