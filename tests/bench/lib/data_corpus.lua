-- The data benchmark's corpus, built once under build/bench/data/ and reused by later runs (each
-- piece is rebuilt only when it is missing; a missing corpus.jsonl rebuilds everything made from it).
-- Every step prints the command that makes it.
--
--   corpus.jsonl     CORPUS_TOKENS tokens of the text this machine has (tests/bench/lib/corpus.py):
--                    the documents, as the Hugging Face baseline streams them
--   raw/, zstd/      corpus.jsonl through the real converter (run -m wick.data.convert), raw and zstd:3,
--                    SHARD_TOKENS tokens a shard (tens of shards)
--   tokens.u16       the token stream of raw/ as one u16 file (documents + EOS), for torch
--   payload.zst      the zstd frames of zstd/'s blocks as stored, concatenated (one zstd stream that
--                    `zstd -d` decodes: the single-core limit)
--   small-raw/, small-zstd/   SMALL_TOKENS tokens (~20 MB as u16): the first documents of the corpus
--   big-raw/, big-zstd/       BIG_TOKENS tokens (~2 GB as u16): copies of the corpus, each in another
--                    document order with its own first line (corpus.py --from), so no block repeats
local host = require 'wick.host'
local wick_dataset = require 'wick.data.dataset'
local ffi = require 'ffi'
local report = require 'report'
local exists = report.exists
local function sh(cmd) report.sh('data corpus', cmd) end

local M = {}

M.DIR = host.home .. '/build/bench/data'
M.CORPUS_TOKENS = 160e6       -- >= 4x the default 64 MiB decoded-block cache (320 MB as u16)
M.SMALL_TOKENS = 10e6         -- ~20 MB as u16
M.BIG_TOKENS = 1e9            -- ~2 GB as u16
M.SHARD_TOKENS = '9M'         -- the converter's --shard-size: 9 Mi tokens, 17 shards of the corpus
local PYTHON = '/usr/bin/python3'
local RUN = "'" .. host.exe .. "'"
local CORPUS_PY = host.home .. '/tests/bench/lib/corpus.py'

local HEADER_BYTES, TABLE_ENTRY_BYTES, CODEC_ZSTD = 128, 24, 1



local function convert(jsonl, dir, compression)
  if exists(dir .. '/index.json') then return end
  sh(('%s -m wick.data.convert %s -o %s --compression %s --shard-size %s --no-progress'):format(RUN, jsonl, dir,
    compression, M.SHARD_TOKENS))
end

-- The shard files of a dataset directory, in stream order.
function M.shard_paths(dir)
  local ds = assert(wick_dataset.open(dir))
  local paths = {}
  for s = 0, ds.shards - 1 do paths[#paths + 1] = dir .. '/' .. ds:shard(s).name end
  ds:close()
  return paths
end

-- Writes the u16 token stream of a (bytes tokenizer, so u16) dataset to path; returns the count.
local function dump_tokens(dir, path)
  local ds = assert(wick_dataset.open(dir))
  local tmp = path .. '.tmp'
  local out = assert(io.open(tmp, 'wb'))
  local capacity, wide, narrow = 0, nil, nil
  for s = 0, ds.shards - 1 do
    local n = ds:shard(s).tokens
    if n > capacity then
      capacity = n
      wide, narrow = ffi.new('uint32_t[?]', n), ffi.new('uint16_t[?]', n)
    end
    ds:read(s, 0, n, wide)
    for i = 0, n - 1 do narrow[i] = wide[i] end
    assert(out:write(ffi.string(narrow, 2 * n)))
  end
  assert(out:close())
  ds:close()
  assert(os.rename(tmp, path))
end

local function u32(bytes, at) return ffi.cast('const uint32_t *', ffi.cast('const char *', bytes) + at)[0] end
local function u64(bytes, at) return tonumber(ffi.cast('const uint64_t *', ffi.cast('const char *', bytes) + at)[0]) end

-- Concatenates the zstd frames of every block of dir (format: runtime/format/FORMAT.md) into path when
-- path is missing; returns the tokens those frames decode to (blocks stored raw are left out).
local function zstd_payload(dir, path)
  local write = not exists(path)
  local tmp = path .. '.tmp'
  local out = write and assert(io.open(tmp, 'wb'))
  local tokens = 0
  for _, shard in ipairs(M.shard_paths(dir)) do
    local f = assert(io.open(shard, 'rb'))
    local header = f:read(HEADER_BYTES)
    local block_tokens, stream_tokens = u32(header, 28), u64(header, 32)
    local blocks, table_offset = u32(header, 56), u64(header, 80)
    f:seek('set', table_offset)
    local entries = f:read(TABLE_ENTRY_BYTES * blocks)
    for b = 0, blocks - 1 do
      local at = b * TABLE_ENTRY_BYTES
      if u32(entries, at + 12) == CODEC_ZSTD then
        tokens = tokens + math.min(block_tokens, stream_tokens - b * block_tokens)
        if write then
          f:seek('set', u64(entries, at))
          assert(out:write(f:read(u32(entries, at + 8))))
        end
      end
    end
    f:close()
  end
  if write then
    assert(out:close())
    assert(os.rename(tmp, path))
  end
  return tokens
end

local function documents(jsonl, tokens, from)
  if exists(jsonl) then return end
  sh(('%s %s %s --tokens %.0f%s'):format(PYTHON, CORPUS_PY, jsonl, tokens, from and (' --from ' .. from) or ''))
end

-- Builds what is missing; returns the paths and sizes the benchmark reads.
function M.build()
  local d = M.DIR
  local c = {
    jsonl = d .. '/corpus.jsonl', raw = d .. '/raw', zstd = d .. '/zstd', tokens_file = d .. '/tokens.u16',
    payload = d .. '/payload.zst', small_raw = d .. '/small-raw', small_zstd = d .. '/small-zstd',
    big_raw = d .. '/big-raw', big_zstd = d .. '/big-zstd',
  }
  if not exists(c.jsonl) then
    print('data corpus: building ' .. d .. ' (once; later runs reuse it; delete it to rebuild)')
    sh(('rm -rf %s && mkdir -p %s'):format(d, d))
    documents(c.jsonl, M.CORPUS_TOKENS)
  end
  convert(c.jsonl, c.raw, 'none')
  convert(c.jsonl, c.zstd, 'zstd:3')
  if not exists(c.tokens_file) then dump_tokens(c.raw, c.tokens_file) end
  c.payload_tokens = zstd_payload(c.zstd, c.payload)
  for _, size in ipairs { 'small', 'big' } do
    local raw, zstd = c[size .. '_raw'], c[size .. '_zstd']
    if not (exists(raw .. '/index.json') and exists(zstd .. '/index.json')) then
      local jsonl = ('%s/%s.jsonl'):format(d, size)
      documents(jsonl, size == 'small' and M.SMALL_TOKENS or M.BIG_TOKENS, c.jsonl)
      convert(jsonl, raw, 'none')
      convert(jsonl, zstd, 'zstd:3')
      sh('rm -f ' .. jsonl)
    end
  end
  for _, name in ipairs { 'raw', 'zstd', 'small_raw', 'small_zstd', 'big_raw', 'big_zstd' } do
    local ds = assert(wick_dataset.open(c[name]))
    local bytes = 0
    for s = 0, ds.shards - 1 do bytes = bytes + ds:shard(s).bytes end
    c[name .. '_info'] = { tokens = ds.tokens, documents = ds.documents, shards = ds.shards, bytes = bytes }
    ds:close()
  end
  c.tokens = c.raw_info.tokens
  return c
end

return M
