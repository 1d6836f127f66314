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
  local r = helper.run(('-m wick.shard %s -o %s --shard-size %s --block-size %s --compression %s -q'):format(
    q(input), q(dir), tostring(opts.shard_size or 2048), tostring(opts.block_size or 65536), opts.compression or 'none'))
  assert(r.rc == 0, 'converter failed: ' .. r.out .. r.err)
  return dir
end

-- Flips one byte of a shard's payload, `offset` bytes after the payload start (header field at 72).
function data_helper.corrupt_payload(shard_path, offset)
  local bytes = helper.read_file(shard_path)
  local payload = 0
  for i = 8, 1, -1 do payload = payload * 256 + bytes:byte(72 + i) end
  local at = payload + offset + 1
  local flipped = string.char(bit.bxor(bytes:byte(at), 0xff))
  helper.write_file(shard_path, bytes:sub(1, at - 1) .. flipped .. bytes:sub(at + 1))
end

-- Anonymous resident memory of this process in bytes (file-backed mappings excluded: mmap'd
-- shards are page cache the kernel can drop, not memory the loader holds).
function data_helper.anon_rss()
  local status = helper.read_file('/proc/self/status')
  return tonumber(status:match('RssAnon:%s*(%d+) kB')) * 1024
end

return data_helper
