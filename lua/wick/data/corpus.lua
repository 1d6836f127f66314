-- wick.data.corpus: the embedded default corpus, built from text every Debian machine has: the
-- Python standard library sources (when Python is installed) and /usr/share/common-licenses.
-- One document per file, files in byte-wise sorted order, so a machine converts it reproducibly.
local corpus = {}

local FIND = [[find /usr/lib/python3*/ -maxdepth 1 -name '*.py' -type f 2>/dev/null;
  find /usr/lib/python3*/*/ -maxdepth 1 -name '*.py' -type f -not -path '*-packages*' 2>/dev/null;
  find /usr/share/common-licenses -type f 2>/dev/null]]

function corpus.files()
  local files = {}
  local listing = io.popen('( ' .. FIND .. ' ) | LC_ALL=C sort')
  for path in listing:lines() do files[#files + 1] = path end
  listing:close()
  if #files == 0 then error('no default corpus here: no Python sources and no /usr/share/common-licenses', 2) end
  return files
end

-- Without opening it where `run` can say what it is (opening a FIFO would wait for a writer).
local function exists(path)
  local ok, host = pcall(require, 'wick.host')
  if ok then return host.file_kind(path) ~= nil end
  local f = io.open(path)
  if f then f:close() end
  return f ~= nil
end

-- Converts the corpus into dir (once: an existing dataset is reused). Returns dir and the stats
-- of the conversion (nil when reused).
function corpus.dataset(dir, options)
  if exists(dir .. '/index.json') then return dir end
  local opts = { output = dir }
  for k, v in pairs(options or {}) do opts[k] = v end
  local stats = require('wick.data.convert').convert(corpus.files(), opts)
  return dir, stats
end

return corpus
