-- demo.lua: the main job of `make demo`, on data every Debian machine has.
--   1. builds the default corpus: the Python standard library sources (when Python is installed)
--      and the license texts of /usr/share/common-licenses, one document per file;
--   2. converts it into a Wick dataset (zstd shards) under build/demo/;
--   3. streams it on 2 local ranks like a training job would (recipes/stream.lua): throughput,
--      data stall, decoded samples and the resume cursor.
-- Until the trainer lands this is the end-to-end path: converter -> shards -> loader threads.
local host = require 'wick.host'
local shard = require 'wick.shard'

local OUT = host.home .. '/build/demo'
local DATA = OUT .. '/data'
local RANKS = 2
local CORPUS_FIND = [[find /usr/lib/python3*/ -maxdepth 1 -name '*.py' -type f 2>/dev/null;
  find /usr/lib/python3*/*/ -maxdepth 1 -name '*.py' -type f -not -path '*-packages*' 2>/dev/null;
  find /usr/share/common-licenses -type f 2>/dev/null]]

local function sh(cmd)
  local ok = os.execute(cmd)
  if ok ~= 0 then error('demo: command failed: ' .. cmd, 0) end
end

local function corpus_files()
  local files = {}
  for path in io.popen('( ' .. CORPUS_FIND .. ' ) | LC_ALL=C sort'):lines() do files[#files + 1] = path end
  if #files == 0 then error('demo: found no corpus files (no Python sources, no /usr/share/common-licenses)', 0) end
  return files
end

local function exists(path)
  local f = io.open(path)
  if f then f:close() end
  return f ~= nil
end

if not exists(DATA .. '/index.json') then
  local files = corpus_files()
  print(('demo: converting %d files of the default corpus into %s'):format(#files, DATA))
  sh('mkdir -p ' .. OUT)
  local stats = shard.convert(files, { output = DATA, compression = 'zstd:3', ['shard-size'] = '1M',
    progress = host.isatty(2) })
  print(('demo: %d documents, %.1f M tokens in %d shards (%.1f MB -> %.1f MB) in %.2f s'):format(stats.documents,
    stats.tokens / 1e6, stats.shards, stats.input_bytes / 1e6, stats.output_bytes / 1e6, stats.seconds))
else
  print('demo: using the dataset in ' .. DATA .. ' (delete it to rebuild)')
end

print(('demo: streaming on %d ranks'):format(RANKS))
sh(("'%s' --nproc-per-node %d '%s/recipes/stream.lua' --data '%s' --steps 300"):format(host.exe, RANKS, host.home, DATA))
