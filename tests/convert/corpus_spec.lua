-- Bringing a corpus: the converter (`run -m wick.data.convert`) on Parquet written by pyarrow, WebDataset
-- tar shards written by Python's tarfile, and texts encoded with a tokenizer.json or .tiktoken file,
-- each checked against an independent reference: the same texts as JSONL (decoded documents equal),
-- and the Hugging Face tokenizers / tiktoken oracles (ids equal). The writers and oracles run in the
-- venv of third_party/test-python.txt (build/test/venv, tests/helpers/corpus_oracle.py);
-- without it those tests are pending. The index's tokenizer identity and the loader's refusal to mix
-- tokenizers need no venv.
local helper = require 'helper'
local corpus = require 'helpers.corpus'
local dataset = require 'wick.data.dataset'
local q = helper.shell_quote

local PYTHON = helper.TEST_PYTHON
local WRITER = helper.ROOT .. '/tests/helpers/corpus_oracle.py'
local ORACLE = helper.ROOT .. '/tests/helpers/tokenizer_oracle.py'
local TRAINING = '/usr/lib/python3.11/email /usr/lib/python3.11/json /usr/share/common-licenses'

local venv_error
local root -- texts.jsonl, rows.json, llama3/tokenizer.json, gpt2.tiktoken, and the reference datasets

local function python(script, args)
  local r = helper.sh(('%s %s %s'):format(q(PYTHON), q(script), args))
  assert(r.rc == 0, script .. ' ' .. args .. ' failed:\n' .. r.out .. r.err)
  return r
end

local function convert(args)
  return corpus.convert(args .. ' -q')
end

local function documents(dir)
  local ds = assert(dataset.open(dir))
  local docs = corpus.documents(ds)
  ds:close()
  return docs
end

setup(function()
  local made, why = helper.test_python()
  if not made then
    venv_error = why
    return
  end
  root = helper.tmpdir()
  python(WRITER, 'texts ' .. q(root))
  local files = helper.sh(('find %s -type f -size -100k | LC_ALL=C sort'):format(TRAINING)).out:gsub('\n', ' ')
  python(WRITER, ('tokenizer %s %s'):format(q(root), files))
  local j = convert(q(root .. '/texts.jsonl') .. ' -o ' .. q(root .. '/jsonl'))
  assert(j.rc == 0, j.err)
end)

teardown(function()
  if root then helper.rmtree(root) end
end)

local function need_venv()
  if venv_error then
    pending('skipped: ' .. venv_error)
    return false
  end
  return true
end

describe('converting Parquet', function()
  local VARIANTS = {
    'compression=snappy',
    'compression=zstd page_version=2.0',
    'compression=gzip dictionary=0',
    'compression=none dictionary=0 page_version=2.0',
    'compression=zstd dictionary=1 page_version=1.0 row_group=37 page=512',
    'compression=snappy required=1',
  }
  for _, options in ipairs(VARIANTS) do
    it('gives the documents of the same texts as JSONL: ' .. options, function()
      if not need_venv() then return end
      local dir = helper.tmpdir()
      local file = dir .. '/rows.parquet'
      python(WRITER, ('parquet %s %s %s'):format(q(root .. '/rows.json'), q(file), options))
      local groups = #helper.lines(python(WRITER, 'offsets ' .. q(file)).out)
      assert.is_true(groups >= 5, groups .. ' row groups')
      local r = corpus.convert(q(file) .. ' -o ' .. q(dir .. '/out') .. ' --field text')
      assert.are.equal(0, r.rc, r.err)
      local nulls = options:find('required') and 0 or 86
      if nulls > 0 then assert.matches(', ' .. nulls .. ' null skipped', r.out, 1, true) end
      assert.are.same(documents(root .. '/jsonl'), documents(dir .. '/out'))
      helper.rmtree(dir)
    end)
  end

  it('reads a directory of Parquet files in sorted order', function()
    if not need_venv() then return end
    local dir = helper.tmpdir()
    python(WRITER, ('parquet %s %s compression=zstd'):format(q(root .. '/rows.json'), q(dir .. '/in/b.parquet')))
    python(WRITER, ('parquet %s %s compression=snappy'):format(q(root .. '/rows.json'), q(dir .. '/in/a.parquet')))
    assert.are.equal(0, convert(q(dir .. '/in') .. ' -o ' .. q(dir .. '/out')).rc)
    local once = documents(root .. '/jsonl')
    local twice = {}
    for k = 1, 2 do for _, d in ipairs(once) do twice[#twice + 1] = d end end
    assert.are.same(twice, documents(dir .. '/out'))
    helper.rmtree(dir)
  end)

  it('names the file, the column and the offset of what it cannot read', function()
    if not need_venv() then return end
    local dir = helper.tmpdir()
    local file = dir .. '/rows.parquet'
    python(WRITER, ('parquet %s %s compression=snappy'):format(q(root .. '/rows.json'), q(file)))
    local bytes = helper.read_file(file)
    -- A column that is not there, or not strings.
    local r = convert(q(file) .. ' -o ' .. q(dir .. '/o') .. ' --field body')
    assert.are.equal(1, r.rc)
    assert.matches("has no top-level column 'body' (it has: id, meta, text)", r.err, 1, true)
    r = convert(q(file) .. ' -o ' .. q(dir .. '/o') .. ' --field id')
    assert.matches("column 'id': values of Parquet type 2, not BYTE_ARRAY", r.err, 1, true)
    r = convert(q(file) .. ' -o ' .. q(dir .. '/o') .. ' --field meta')
    assert.matches("column 'meta' is a group", r.err, 1, true)
    -- What it does not read: named, with the file, the column and where.
    for _, case in ipairs {
      { 'compression=lz4', "column 'text', page at byte %d+: compression LZ4_RAW %(7%) is not supported" },
      { 'dictionary=0 encoding=DELTA_BYTE_ARRAY', "column 'text', page at byte %d+: values encoded DELTA_BYTE_ARRAY are not supported" },
    } do
      python(WRITER, ('parquet %s %s %s'):format(q(root .. '/rows.json'), q(dir .. '/other.parquet'), case[1]))
      r = convert(q(dir .. '/other.parquet') .. ' -o ' .. q(dir .. '/o'))
      assert.are.equal(1, r.rc, case[1])
      assert.matches("^wick.data.convert: '" .. dir:gsub('%p', '%%%0') .. "/other.parquet' " .. case[2], r.err)
    end
    -- Truncated: the footer is gone.
    helper.write_file(dir .. '/cut.parquet', bytes:sub(1, #bytes - 100))
    r = convert(q(dir .. '/cut.parquet') .. ' -o ' .. q(dir .. '/o'))
    assert.are.equal(1, r.rc)
    assert.matches(dir .. "/cut.parquet': no PAR1 magic at its end", r.err, 1, true)
    -- A page header overwritten: its offset is in the message.
    local offset = tonumber(helper.lines(python(WRITER, 'offsets ' .. q(file)).out)[3]:match('^(%d+)'))
    local broken = bytes:sub(1, offset) .. '\255\255\255\255' .. bytes:sub(offset + 5)
    helper.write_file(dir .. '/broken.parquet', broken)
    r = convert(q(dir .. '/broken.parquet') .. ' -o ' .. q(dir .. '/o'))
    assert.are.equal(1, r.rc)
    local at = tonumber(r.err:match("broken%.parquet': page header at byte (%d+)"))
    assert.is_truthy(at, r.err)
    assert.is_true(at >= offset and at <= offset + 8, r.err)
    -- A page whose data is cut short inside the file: a footer claiming more than the file has.
    local footer = bytes:sub(#bytes - 7)
    helper.write_file(dir .. '/short.parquet', bytes:sub(1, 4) .. footer)
    r = convert(q(dir .. '/short.parquet') .. ' -o ' .. q(dir .. '/o'))
    assert.are.equal(1, r.rc)
    assert.matches("short.parquet': footer of %d+ bytes claimed at byte %d+ does not fit the file", r.err)
    helper.rmtree(dir)
  end)
end)

describe('converting WebDataset tar shards', function()
  for _, variant in ipairs { { 'tar', '' }, { 'tar.gz', 'gz' } } do
    it('gives the documents of the same texts as JSONL (.' .. variant[1] .. ', --field txt and json)', function()
      if not need_venv() then return end
      local dir = helper.tmpdir()
      local file = dir .. '/shard.' .. variant[1]
      python(WRITER, ('tar %s %s %s'):format(q(root .. '/rows.json'), q(file), variant[2]))
      local r = convert(q(file) .. ' -o ' .. q(dir .. '/txt') .. ' --field txt')
      assert.are.equal(0, r.rc, r.err)
      -- Samples without a .txt member are bad rows naming their key and sample number.
      assert.matches(file .. ":4: sample 'part0/sample00003' has no .txt member", r.err, 1, true)
      assert.are.same(documents(root .. '/jsonl'), documents(dir .. '/txt'))
      r = convert(q(file) .. ' -o ' .. q(dir .. '/json') .. ' --field json --json-field caption')
      assert.are.equal(0, r.rc, r.err)
      assert.are.same(documents(root .. '/jsonl'), documents(dir .. '/json'))
      helper.rmtree(dir)
    end)
  end

  it('names the file and the offset of a truncated shard', function()
    if not need_venv() then return end
    local dir = helper.tmpdir()
    python(WRITER, ('tar %s %s'):format(q(root .. '/rows.json'), q(dir .. '/shard.tar')))
    local bytes = helper.read_file(dir .. '/shard.tar')
    helper.write_file(dir .. '/cut.tar', bytes:sub(1, 20000))
    local r = convert(q(dir .. '/cut.tar') .. ' -o ' .. q(dir .. '/o') .. ' --field txt')
    assert.are.equal(1, r.rc)
    assert.matches("cut.tar': tar: .* at byte 20000", r.err)
    helper.rmtree(dir)
  end)
end)

describe('converting with a tokenizer file', function()
  -- The ids of every non-empty text, one compact JSON array per line (the oracle's form).
  local function id_lines(dir)
    local out = {}
    for i, ids in ipairs(documents(dir)) do out[i] = '[' .. table.concat(ids, ',') .. ']' end
    return out
  end

  local function oracle_lines(kind, file)
    local target = root .. '/' .. kind:gsub(':', '-') .. '.ids'
    python(ORACLE, ('encode %s %s %s %s'):format(kind, q(file), q(root .. '/texts.jsonl'), q(target)))
    local out = {}
    for _, line in ipairs(helper.lines(helper.read_file(target))) do
      if line ~= '[]' then out[#out + 1] = line end -- empty texts are no documents
    end
    return out
  end

  for _, case in ipairs {
    { 'a Llama 3 style tokenizer.json, against Hugging Face tokenizers', 'llama3/tokenizer.json', 'hf' },
    { "GPT-2's .tiktoken ranks, against tiktoken", 'gpt2.tiktoken', 'tiktoken:r50k' },
  } do
    it('stores the ids of ' .. case[1] .. ', and the tokenizer in the index', function()
      if not need_venv() then return end
      local file = root .. '/' .. case[2]
      local out = root .. '/tok-' .. case[3]:gsub(':', '-')
      local r = convert(q(root .. '/texts.jsonl') .. ' -o ' .. q(out) .. ' --tokenizer ' .. q(file))
      assert.are.equal(0, r.rc, r.err)
      local ours, theirs = id_lines(out), oracle_lines(case[3], file)
      assert.are.equal(#theirs, #ours)
      for i = 1, #theirs do assert.are.equal(theirs[i], ours[i], 'document ' .. i) end
      local tok = assert(require('wick.data.tokenizer').open(file))
      local ds = assert(dataset.open(out))
      assert.are.equal(tok.fingerprint, ds.tokenizer_fingerprint)
      assert.are.equal(tok.vocab_size, ds.vocab_size)
      assert.are.equal(tok.eos, ds.eos)
      ds:close()
      tok:close()
    end)
  end

  it('writes the same bytes on 1 thread and on 3, from JSONL and from Parquet', function()
    if not need_venv() then return end
    local dir = helper.tmpdir()
    local tokenizer = ' --tokenizer ' .. q(root .. '/llama3/tokenizer.json')
    python(WRITER, ('parquet %s %s compression=zstd'):format(q(root .. '/rows.json'), q(dir .. '/rows.parquet')))
    local outputs = {}
    for _, run in ipairs { { 'j1', 'texts.jsonl', 1 }, { 'j3', 'texts.jsonl', 3 }, { 'p3', 'parquet', 3 } } do
      local input = run[2] == 'parquet' and dir .. '/rows.parquet' or root .. '/' .. run[2]
      local r = convert(q(input) .. ' -o ' .. q(dir .. '/' .. run[1]) .. tokenizer .. ' --threads ' .. run[3] ..
        ' --shard-size 20K --block-size 4K')
      assert.are.equal(0, r.rc, r.err)
      outputs[run[1]] = corpus.files(dir .. '/' .. run[1])
    end
    assert.is_not_nil(outputs.j1['shard-00002.wks'])
    assert.are.same(outputs.j1, outputs.j3)
    for name, bytes in pairs(outputs.j1) do
      if name ~= 'index.json' then assert.are.equal(bytes, outputs.p3[name], name) end
    end
    helper.rmtree(dir)
  end)

  it('takes the EOS by text, and refuses a missing file or an option without a file', function()
    if not need_venv() then return end
    local out = root .. '/eos'
    local r = convert(q(root .. '/texts.jsonl') .. ' -o ' .. q(out) .. ' --tokenizer ' ..
      q(root .. '/llama3/tokenizer.json') .. " --eos '<|eot_id|>'")
    assert.are.equal(0, r.rc, r.err)
    local tok = assert(require('wick.data.tokenizer').open(root .. '/llama3/tokenizer.json'))
    local ds = assert(dataset.open(out))
    assert.are.equal(tok:token_id('<|eot_id|>'), ds.eos)
    ds:close()
    tok:close()
    r = convert(q(root .. '/texts.jsonl') .. ' -o ' .. q(out) .. ' --tokenizer ' .. q(root .. '/nope.json'))
    assert.are.equal(2, r.rc)
    assert.matches('nope.json', r.err, 1, true)
    r = convert(q(root .. '/texts.jsonl') .. ' -o ' .. q(out) .. ' --special')
    assert.are.equal(2, r.rc)
    assert.matches('need a tokenizer file', r.err, 1, true)
  end)
end)

describe('tokenizer identity', function()
  local dir
  before_each(function() dir = helper.tmpdir() end)
  after_each(function() helper.rmtree(dir) end)

  local function make(name, args, content)
    helper.write_file(dir .. '/' .. name, content)
    local r = convert(q(dir .. '/' .. name) .. ' -o ' .. q(dir .. '/' .. name .. '.ds') .. ' ' .. args)
    assert.are.equal(0, r.rc, r.err)
    return dir .. '/' .. name .. '.ds'
  end

  it('is recorded in the index, and an index written before it is read as its built-in', function()
    local text = make('a.txt', '', corpus.text(1, 400))
    local ds = assert(dataset.open(text))
    assert.are.equal('0000006279746573', ds.tokenizer_fingerprint) -- 'bytes'
    ds:close()
    local index = helper.read_file(text .. '/index.json')
    local old = index:gsub('\n  "tokenizer_fingerprint": "%x+",', '')
    assert.are_not.equal(index, old)
    helper.write_file(text .. '/index.json', old)
    ds = assert(dataset.open(text))
    assert.are.equal('0000006279746573', ds.tokenizer_fingerprint)
    ds:close()
    assert.is_true((corpus.start_loader { text, make('b.txt', '', corpus.text(2, 400)) }))
  end)

  it('keeps the loader from mixing sources of different tokenizers unless told', function()
    local text = make('a.txt', '', corpus.text(1, 400))
    local tokens = {}
    for i = 1, 300 do tokens[i] = i % 50000 end
    local bin = make('t.bin', '--tokenizer gpt2 --headerless-bin', corpus.nanogpt_bin(tokens))
    local ok, err = corpus.start_loader { text, bin }
    assert.is_false(ok)
    assert.matches('made by different tokenizers', tostring(err), 1, true)
    assert.matches('(tokenizer bytes, fingerprint 0000006279746573, vocabulary 257, EOS 256)', tostring(err), 1, true)
    assert.matches('mixed_tokenizers = true', tostring(err), 1, true)
    assert.is_true((corpus.start_loader({ text, bin }, { mixed_tokenizers = true })))
  end)
end)
