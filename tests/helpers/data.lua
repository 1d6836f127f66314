-- Builds small real datasets for the data tests with the real converter (`run -m wick.data.convert`).
local helper = require 'helper'
local q = helper.shell_quote

local data_helper = {}

local POINTER_TYPES = { i32 = 'int32_t *', i64 = 'int64_t *', u8 = 'uint8_t *' }

-- The elements of a contiguous CPU tensor (a loader batch's tokens, mask, ...) as a 0-based C array
-- of its dtype, read in place.
function data_helper.values(t)
  assert(t:is_contiguous() and t.device == 'cpu', 'data_helper.values: a contiguous CPU tensor')
  return require('ffi').cast(POINTER_TYPES[t.dtype], t:data())
end

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
  local r = helper.run(('-m wick.data.convert %s -o %s --shard-size %s --block-size %s --compression %s -q'):format(
    q(input), q(dir), tostring(opts.shard_size or 2048), tostring(opts.block_size or 65536), opts.compression or 'none'))
  assert(r.rc == 0, 'converter failed: ' .. r.out .. r.err)
  return dir
end

-- Records with columns (format version 2): record i of `tag` is the text "<tag><i> " and 1..5 words
-- (at most 41 bytes; bytes tokenizer: one token a byte), a mask over its tokens (0 on the "<tag><i> "
-- prompt, 1 after; all 0 for every 5th record), a label 7 * i and a blob of 4..70 bytes naming it.
function data_helper.records(count, tag, seed)
  local docs = data_helper.documents(count, 1, seed)
  local records = {}
  for i = 1, count do
    local prompt = tag .. i .. ' '
    local words = {}
    for word in docs[i]:gmatch('%S+') do words[#words + 1] = word end
    local text = prompt .. table.concat(words, ' ', 2, 2 + i % 5)
    local mask = {}
    for t = 1, #text do mask[t] = (t > #prompt and i % 5 ~= 0) and 1 or 0 end
    records[i] = { text = text, prompt = prompt, mask = mask, label = 7 * i,
      blob = ('blob %s%d '):format(tag, i) .. ('x'):rep((i * 13) % 60) }
  end
  return records
end

-- Writes records (data_helper.records) as a dataset with the columns loss_mask (token_u8), label (i64, or
-- opts.label_kind f32) and image (bytes), opts.per_shard records a shard, through the shard writer
-- (tests/c/test_loader_columns.c's write mode, built by make test).
function data_helper.make_records_dataset(dir, records, opts)
  opts = opts or {}
  local lines = {}
  for i, r in ipairs(records) do
    lines[i] = table.concat({ r.text, table.concat(r.mask), tostring(r.label), r.blob }, '\t')
  end
  local input = helper.write_file(dir .. '.tsv', table.concat(lines, '\n') .. '\n')
  local writer = helper.ROOT .. '/build/tests/test_loader_columns'
  local r = helper.sh(('mkdir -p %s && %s write %s %d %s < %s'):format(q(dir), q(writer), q(dir), opts.per_shard or 24,
    opts.label_kind or 'i64', q(input)))
  assert(r.rc == 0, 'writing the records failed (make build/tests/test_loader_columns): ' .. r.out .. r.err)
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

-- The node caches (/dev/shm names) that ranks run with WICK_LOG=debug say they use in their output,
-- and their sizes by name; and those of them still in /dev/shm.
function data_helper.node_caches(output)
  local names, bytes = {}, {}
  for name, size in output:gmatch('node cache (/dev/shm/[%w%-]+) %((%d+) bytes') do
    if not bytes[name] then names[#names + 1], bytes[name] = name, tonumber(size) end
  end
  return names, bytes
end

function data_helper.node_caches_left(names)
  local left = {}
  for _, name in ipairs(names) do
    local f = io.open(name, 'rb')
    if f then f:close() left[#left + 1] = name end
  end
  return left
end

-- Anonymous resident memory of this process in bytes (file-backed mappings excluded: mmap'd
-- shards are page cache the kernel can drop, not memory the loader holds).
function data_helper.anon_rss()
  local status = helper.read_file('/proc/self/status')
  return tonumber(status:match('RssAnon:%s*(%d+) kB')) * 1024
end

-- Reads `steps` global steps from a loader; returns one table per step: list of sample ids in
-- rank slice order (source:shard:offset:epoch), their token hashes and the step's fingerprint.
function data_helper.read_steps(l, steps)
  local out = {}
  while steps > 0 do
    local batch = l:next()
    if not batch then break end
    local ids = out[#out] and out[#out].step == batch.step and out[#out].ids or nil
    if not ids then
      ids = {}
      out[#out + 1] = { step = batch.step, ids = ids, fingerprint = batch.fingerprint, hashes = {} }
    end
    for row = 0, batch.rows - 1 do
      local s = l:sample(row)
      ids[#ids + 1] = ('%d:%d:%d:%d'):format(s.source, s.shard, s.offset, s.epoch)
      out[#out].hashes[#ids] = s.hash
    end
    if batch.micro_step == batch.micro_steps - 1 and #out == steps then break end
  end
  return out
end

-- The global batches of `steps` steps assembled from every rank of world size W, each rank read by a
-- loader from make_loader(options); every rank must agree on each step's fingerprint.
function data_helper.global_steps(make_loader, W, steps, opts)
  local per_rank = {}
  for r = 0, W - 1 do
    local o = { world_size = W, rank = r }
    for k, v in pairs(opts or {}) do o[k] = v end
    local l = make_loader(o)
    per_rank[r] = data_helper.read_steps(l, steps)
    l:close()
  end
  local merged = {}
  for s = 1, steps do
    local ids = {}
    for r = 0, W - 1 do
      for _, id in ipairs(per_rank[r][s].ids) do ids[#ids + 1] = id end
      assert(per_rank[0][s].fingerprint == per_rank[r][s].fingerprint, 'ranks disagree on the fingerprint of step ' .. s)
    end
    merged[s] = { ids = ids, fingerprint = per_rank[0][s].fingerprint }
  end
  return merged
end

return data_helper
