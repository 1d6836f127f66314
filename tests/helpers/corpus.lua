-- Test data made on the spot (tests never depend on files a fresh clone lacks).
local helper = require 'helper'

local corpus = {}

local WORDS = { 'the', 'quick', 'brown', 'fox', 'jumps', 'over', 'lazy', 'dog', 'wick', 'shard', 'token',
                'block', 'über', 'naïve', 'café', '日本', 'λόγος', 'end.', '\n', 'and', 'of', 'to' }

-- Deterministic pseudo-random text of n words (xorshift-ish LCG, seedable).
function corpus.text(seed, n)
  local state = seed * 2654435761 % 4294967296
  local out = {}
  for i = 1, n do
    state = (state * 1103515245 + 12345) % 2147483648
    out[i] = WORDS[state % #WORDS + 1]
  end
  return table.concat(out, ' ')
end

-- Writes files { [relative path] = content } under dir, creating folders.
function corpus.tree(dir, files)
  for name, content in pairs(files) do
    local path = dir .. '/' .. name
    local parent = path:match('^(.*)/[^/]*$')
    os.execute('mkdir -p ' .. helper.shell_quote(parent))
    helper.write_file(path, content)
  end
end

-- JSON string literal for s (escapes quotes, backslashes, control characters).
function corpus.json_string(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    if c == '"' then return '\\"' end
    if c == '\\' then return '\\\\' end
    if c == '\n' then return '\\n' end
    return string.format('\\u%04x', c:byte())
  end) .. '"'
end

local function le(n, bytes)
  local t = {}
  for i = 1, bytes do
    t[i] = string.char(n % 256)
    n = math.floor(n / 256)
  end
  return table.concat(t)
end
corpus.le = le

-- An llm.c token file (GPT-2, version 1): 256 int32 header, then uint16 tokens.
function corpus.llmc_bin(tokens)
  local parts = { le(20240520, 4), le(1, 4), le(#tokens, 4), string.rep('\0', 253 * 4) }
  for _, t in ipairs(tokens) do parts[#parts + 1] = le(t, 2) end
  return table.concat(parts)
end

-- A headerless nanoGPT token file.
function corpus.nanogpt_bin(tokens)
  local parts = {}
  for _, t in ipairs(tokens) do parts[#parts + 1] = le(t, 2) end
  return table.concat(parts)
end

-- Runs the converter; returns the helper.sh result.
function corpus.convert(args)
  return helper.run('-m wick.data.convert ' .. args)
end

-- Starts a loader over a mix of the dataset paths (with extra loader options) and closes it: true, or
-- false and the error start raised.
function corpus.start_loader(paths, extra)
  local data = require 'wick.data'
  local sources = {}
  for i, p in ipairs(paths) do sources[i] = { p } end
  local opts = { data = data.mix(sources), seq_len = 8, global_batch = 2, shuffle = false }
  for k, v in pairs(extra or {}) do opts[k] = v end
  local loader = data.loader(opts)
  local ok, err = pcall(loader.start, loader)
  loader:close()
  return ok, err
end

-- All files of a directory as { name = bytes }.
function corpus.files(dir)
  local out = {}
  local listing = helper.sh('ls -1 ' .. helper.shell_quote(dir))
  for name in listing.out:gmatch('[^\n]+') do out[name] = helper.read_file(dir .. '/' .. name) end
  return out
end

-- The documents of a dataset, in stream order, as strings (bytes tokenizer) or token lists.
function corpus.documents(ds)
  local docs = {}
  for s = 0, ds.shards - 1 do
    local info = ds:shard(s)
    local tokens = ds:read(s, 0, info.tokens)
    for d = 0, info.documents - 1 do
      local start, length = ds:document(s, d)
      assert(tokens[start + length] == ds.eos, 'document not followed by EOS')
      if ds.tokenizer == 'bytes' then
        docs[#docs + 1] = ds:text(tokens + start, length)
      else
        local list = {}
        for k = 0, length - 1 do list[k + 1] = tokens[start + k] end
        docs[#docs + 1] = list
      end
    end
  end
  return docs
end

return corpus
