-- Corpus conversion benchmark (issue 11): Parquet to shards in MB of text per second, next to pyarrow
-- reading the same column in the same run, and the converter's tokenization with a BPE tokenizer
-- (GPT-2's ranks) on every core against one.
--   ./run tests/bench/corpus.lua     (make bench runs it; about a minute, plus the venv the first time)
--
-- The corpus is build/bench/corpus/corpus.jsonl: CORPUS_MB of this machine's Python sources, one
-- document per file (tests/helpers/tokenizer_oracle.py corpus), and the same texts as corpus.parquet,
-- written by pyarrow as FineWeb's files are (snappy, dictionary tried then plain, row groups of 10000
-- rows). What it measures: conversion from files in the page cache (each is read once before timing)
-- to shards on the local disk, i.e. the reader, the workers and the writer, not the storage; data
-- larger than the page cache cannot be had on this machine.
--   Parquet row:  wick.data.convert corpus.parquet --compression none (the bytes tokenizer: no BPE cost) on one
--                 worker thread, the converter's own wall time (wick.data.convert.convert in this process:
--                 reading, decoding, packing, writing shards and index); pyarrow: pq.read_table(columns=["text"],
--                 use_threads=False), text already off disk. Both in MB of text per second.
--   Tokenization: wick.data.convert corpus.jsonl --tokenizer gpt2.tiktoken on every core and on one, wall MB/s
--                 (on a shared machine other processes take their share of the cores).
-- Runs are interleaved, best of REPEATS each.
local host = require 'wick.host'
package.path = host.home .. '/tests/bench/lib/?.lua;' .. package.path
local report = require 'report'
local capture = report.capture

local RUN = "'" .. host.exe .. "'"
local WRITER = host.home .. '/tests/helpers/corpus_oracle.py'
local ORACLE = host.home .. '/tests/helpers/tokenizer_oracle.py'
local DIR = host.home .. '/build/bench/corpus'
local CORPUS_MB = 16
local REPEATS = 3
local PYARROW_SECONDS = 2
local SCALING_GOAL_PER_CORE = 0.9

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end


local function must(cmd, what)
  local out, ok = capture(cmd)
  if not ok then error(what .. ' failed:\n' .. out, 0) end
  return out
end

local PYTHON = report.test_python('Parquet to shards', 'pyarrow writes the corpus and is the baseline')
if not PYTHON then os.exit(0) end

-- The corpus, its Parquet twin and GPT-2's ranks, made once (delete build/bench/corpus to remake them).
if not io.open(DIR .. '/bytes.txt') then
  local files = capture('find /usr/lib/python3.11 -type f -name "*.py" -size -400k | LC_ALL=C sort | head -4000')
  files = files:gsub('\n', ' ')
  must(('mkdir -p %s && %s %s corpus %s %d %s'):format(q(DIR), q(PYTHON), q(ORACLE), q(DIR .. '/corpus.jsonl'), CORPUS_MB,
    files), 'tokenizer_oracle.py corpus')
  local bytes = must(('%s %s parquet_of %s %s'):format(q(PYTHON), q(WRITER), q(DIR .. '/corpus.jsonl'),
    q(DIR .. '/corpus.parquet')), 'corpus_oracle.py parquet_of')
  must(('%s %s tokenizer %s'):format(q(PYTHON), q(WRITER), q(DIR)), 'corpus_oracle.py tokenizer')
  local f = assert(io.open(DIR .. '/bytes.txt', 'w'))
  f:write(bytes:match('%d+'))
  f:close()
end
local TEXT_MB = tonumber(io.open(DIR .. '/bytes.txt'):read('*a')) / 1e6
capture(('cat %s %s > /dev/null'):format(q(DIR .. '/corpus.parquet'), q(DIR .. '/corpus.jsonl'))) -- into the page cache
local cores = tonumber(capture('nproc'):match('%d+')) or 1
print(('corpus: %.1f MB of text in %s and corpus.parquet (%d cores, load %s)'):format(TEXT_MB, DIR .. '/corpus.jsonl',
  cores, capture('cut -d" " -f1-3 /proc/loadavg'):gsub('%s+$', '')))

-- MB of text per second of one conversion, as the converter times itself (no process start-up).
local shard = require 'wick.data.convert'
local function convert(input, opts)
  opts.output, opts.compression, opts.quiet = DIR .. '/out', 'none', true
  local stats = shard.convert({ DIR .. '/' .. input }, opts)
  return TEXT_MB / stats.seconds
end

local function pyarrow()
  local out = must(('%s %s read %s %d'):format(q(PYTHON), q(WRITER), q(DIR .. '/corpus.parquet'), PYARROW_SECONDS),
    'pyarrow read')
  return tonumber(out:match('([%d.]+) MB/s'))
end

local parquet, arrow, one, all = 0, 0, 0, 0
local TOKENIZER = DIR .. '/gpt2.tiktoken'
for round = 1, REPEATS do
  parquet = math.max(parquet, convert('corpus.parquet', { threads = 1 }))
  arrow = math.max(arrow, pyarrow())
  one = math.max(one, convert('corpus.jsonl', { threads = 1, tokenizer = TOKENIZER }))
  all = math.max(all, convert('corpus.jsonl', { threads = cores, tokenizer = TOKENIZER }))
  io.write(('  round %d of %d done\n'):format(round, REPEATS))
end
report.row('Parquet -> shards (bytes), 1 thread: MB/s', parquet, 'MB/s', 'pyarrow read_table, 1 thread', arrow, true)
report.row(('BPE (GPT-2) conversion, %d cores: MB/s'):format(cores), all, 'MB/s', 'the same, 1 thread', one, true,
  cores * SCALING_GOAL_PER_CORE)
