-- Builds small real datasets for the data tests with the real converter (`run -m wick.shard`).
local helper = require 'helper'
local q = helper.shell_quote

local data_helper = {}

local WORDS = { 'the', 'quick', 'brown', 'fox', 'jumps', 'over', 'lazy', 'dog', 'wick', 'keeps', 'gpus',
  'fed', 'stream', 'shard', 'token', 'epoch', 'rank', 'batch' }

-- Deterministic documents: doc i has a recognisable head ("doc<i>") and 8..(8+spread) words.
function data_helper.documents(count, spread, seed)
  local state = seed or 12345
  local function random(n)
    state = (state * 1103515245 + 12345) % 2147483648
    return state % n
  end
  local docs = {}
  for i = 1, count do
    local words = { 'doc' .. i }
    for _ = 1, 8 + random(spread or 40) do words[#words + 1] = WORDS[1 + random(#WORDS)] end
    docs[i] = table.concat(words, ' ')
  end
  return docs
end

function data_helper.write_jsonl(path, docs)
  local lines = {}
  for i, doc in ipairs(docs) do lines[i] = '{"text": "' .. doc .. '"}' end
  return helper.write_file(path, table.concat(lines, '\n') .. '\n')
end

-- Converts docs into a dataset directory; opts.shard_size (bytes), opts.compression.
function data_helper.make_dataset(dir, docs, opts)
  opts = opts or {}
  local input = data_helper.write_jsonl(dir .. '.jsonl', docs)
  local r = helper.run(('-m wick.shard %s -o %s --shard-size %s --compression %s'):format(q(input), q(dir),
    tostring(opts.shard_size or 2048), opts.compression or 'none'))
  assert(r.rc == 0, 'converter failed: ' .. r.out .. r.err)
  return dir
end

return data_helper
