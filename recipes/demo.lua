-- demo.lua: the main job of `make demo`, on data every Debian machine has.
--   1. converts the default corpus (wick.data.corpus: Python standard library sources and license
--      texts, one document per file) into a Wick dataset of zstd shards under build/demo/;
--   2. streams it on 2 local ranks as a training job would (recipes/stream.lua): throughput, data
--      stall, decoded samples and the resume cursor;
--   3. trains a small GPT-2 on it on CPU, fed by the loader (recipes/tiny_gpt.lua).
local host = require 'wick.host'
local corpus = require 'wick.data.corpus'

local DATA = host.home .. '/build/demo/data'
local RANKS = 2
local STEPS = 300
local TRAIN_STEPS = 200

local _, stats = corpus.dataset(DATA, { compression = 'zstd:3', shard_size = 2 ^ 20, progress = host.isatty(2) })
if stats then
  print(('demo: converted %d documents, %.1f M tokens into %d shards (%.1f MB -> %.1f MB) in %.2f s'):format(
    stats.documents, stats.tokens / 1e6, stats.shards, stats.input_bytes / 1e6, stats.output_bytes / 1e6,
    stats.seconds))
else
  print('demo: using the dataset in ' .. DATA .. ' (delete it to rebuild)')
end

print(('demo: streaming on %d ranks'):format(RANKS))
local command = ("'%s' --nproc-per-node %d '%s/recipes/stream.lua' --data '%s' --steps %d"):format(host.exe, RANKS,
  host.home, DATA, STEPS)
if os.execute(command) ~= 0 then os.exit(1) end

print(('demo: training a small GPT-2 on CPU for %d steps'):format(TRAIN_STEPS))
command = ("'%s' '%s/recipes/tiny_gpt.lua' --data '%s' --steps %d --out '%s/build/demo/tiny_gpt'"):format(host.exe,
  host.home, DATA, TRAIN_STEPS, host.home)
if os.execute(command) ~= 0 then os.exit(1) end
