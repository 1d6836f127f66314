-- What the converter puts in the token stream besides a text's own ids, and ids it is given: a
-- tokenizer.json's post_processor around every document (Llama 3's <|begin_of_text|>, as Hugging Face's
-- add_special_tokens), recorded in index.json; token files (.bin, .npy) whose vocabulary and EOS are
-- declared (--vocab-size, --eos), every id checked. Tokenizers and .npy files are made by Hugging Face's
-- tokenizers and NumPy in the test venv.
local helper = require 'helper'
local corpus = require 'helpers.corpus'
local dataset = require 'wick.data.dataset'
local tokenizer = require 'wick.data.tokenizer'
local q = helper.shell_quote

local root, venv_error

-- Runs Python in the test venv; returns its stdout, asserting success.
local function python(code)
  local r = helper.sh(('%s -c %s'):format(q(helper.TEST_PYTHON), q(code)))
  assert(r.rc == 0, r.out .. r.err)
  return r.out
end

setup(function()
  root = helper.tmpdir()
  local made, why = helper.test_python()
  if not made then venv_error = why end
end)
teardown(function() helper.rmtree(root) end)

local function need_venv()
  if venv_error then pending('skipped: ' .. venv_error) end
  return not venv_error
end

-- A byte-level BPE tokenizer.json without merges (every byte a token) with `specials` added and
-- `post` (Python, given tok and the ids of specials by name) as its post_processor; returns its path.
local function byte_tokenizer(name, specials, post)
  local dir = root .. '/' .. name
  helper.sh('mkdir -p ' .. q(dir))
  python(([[
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in %s])
ids = {t: tok.token_to_id(t) for t in %s}
tok.post_processor = %s
tok.save(%q)
]]):format(specials, specials, post, dir .. '/tokenizer.json'))
  return dir .. '/tokenizer.json'
end

local TEXTS = { 'hello world', '', 'a second document', 'x' }

local function jsonl(texts)
  local lines = {}
  for i, t in ipairs(texts) do lines[i] = '{"text": ' .. corpus.json_string(t) .. '}' end
  return helper.write_file(root .. '/docs.jsonl', table.concat(lines, '\n') .. '\n')
end

describe("the converter and a tokenizer's post_processor", function()
  local LLAMA = '["<|begin_of_text|>", "<|end_of_text|>"]'
  local LLAMA_POST = 'processors.Sequence([processors.ByteLevel(trim_offsets=False), processors.TemplateProcessing(' ..
    'single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1", ' ..
    'special_tokens=[("<|begin_of_text|>", ids["<|begin_of_text|>"])])])'

  it('starts every document with the BOS the model was trained with, and records it in the index', function()
    if not need_venv() then return end
    local file = byte_tokenizer('llama', LLAMA, LLAMA_POST)
    local tok = assert(tokenizer.open(file))
    local bos, eos = tok:token_id('<|begin_of_text|>'), tok:token_id('<|end_of_text|>')
    local r = corpus.convert(('%s -o %s --tokenizer %s'):format(q(jsonl(TEXTS)), q(root .. '/llama-ds'), q(file)))
    assert.are.equal(0, r.rc, r.err)
    assert.matches(("/llama-ds: each document is <|begin_of_text|> $A <|end_of_text|> (the tokenizer's post_processor " ..
      "around the text, then EOS; --no-special-tokens leaves the post_processor's out)\n"), r.out, 1, true)
    local ds = assert(dataset.open(root .. '/llama-ds'))
    assert.are.equal(eos, ds.eos)
    assert.are.same({ applied = true, prefix = { bos }, suffix = {} }, ds.template)
    assert.are.equal(bos, ds.bos)
    -- Each document is what Hugging Face's encode(text) gives (tok:ids, checked against it in
    -- tokenizer_spec), then EOS; the empty one is skipped, not made a lone BOS.
    assert.are.same({ tok:ids(TEXTS[1]), tok:ids(TEXTS[3]), tok:ids(TEXTS[4]) }, corpus.documents(ds))
    assert.are.equal(bos, corpus.documents(ds)[1][1])
    ds:close()
    assert.matches('"template": {"applied": true, "prefix": [' .. bos .. '], "suffix": []},',
      helper.read_file(root .. '/llama-ds/index.json'), 1, true)
    local info = helper.run('-m wick.data.inspect --info --data ' .. q(root .. '/llama-ds'))
    assert.are.equal(0, info.rc, info.err)
    assert.are.equal(('%s/llama-ds: tokenizer=llama/tokenizer.json vocab=%d eos=%d bos=%d template=applied prefix=%d ' ..
      'suffix=-\n'):format(root, tok.vocab_size, eos, bos, bos), info.out)
    -- Told not to: the text's ids only, and the index says what was left out.
    r = corpus.convert(('%s -o %s --tokenizer %s --no-special-tokens -q'):format(q(root .. '/docs.jsonl'),
      q(root .. '/bare-ds'), q(file)))
    assert.are.equal(0, r.rc, r.err)
    ds = assert(dataset.open(root .. '/bare-ds'))
    assert.are.same({ applied = false, prefix = { bos }, suffix = {} }, ds.template)
    assert.is_nil(ds.bos)
    info = helper.run('-m wick.data.inspect --info --data ' .. q(root .. '/bare-ds'))
    assert.matches(' bos=- template=not-applied prefix=' .. bos .. ' suffix=-\n', info.out, 1, true)
    local bare = assert(tokenizer.open(file, { add_special_tokens = false }))
    assert.are.same({ bare:ids(TEXTS[1]), bare:ids(TEXTS[3]), bare:ids(TEXTS[4]) }, corpus.documents(ds))
    ds:close()
    tok:close()
    bare:close()
    -- The loader does not mix the two unless told: the same ids, but documents of two shapes.
    local sources = { root .. '/llama-ds', root .. '/bare-ds' }
    local ok, err = corpus.start_loader(sources)
    assert.is_false(ok)
    assert.matches(("sources '%s/llama-ds' (documents: %d $A) and '%s/bare-ds' (documents: $A) have different tokens " ..
      'around their documents'):format(root, bos, root), tostring(err), 1, true)
    assert.is_true((corpus.start_loader(sources, { mixed_tokenizers = true })))
  end)

  it('ends a document with one EOS when the template ends with it, and wraps with BERT-style ones', function()
    if not need_venv() then return end
    local file = byte_tokenizer('s-eos', '["<s>", "</s>"]', 'processors.TemplateProcessing(single="<s> $A </s>", ' ..
      'special_tokens=[("<s>", ids["<s>"]), ("</s>", ids["</s>"])])')
    local tok = assert(tokenizer.open(file, { eos = '</s>' }))
    local s, eos = tok:token_id('<s>'), tok.eos
    assert.are.same({ prefix = { s }, suffix = { eos } }, tok.template)
    local r = corpus.convert(('%s -o %s --tokenizer %s --eos %s'):format(q(jsonl { 'ab' }), q(root .. '/s-ds'),
      q(file), q('</s>')))
    assert.are.equal(0, r.rc, r.err)
    assert.matches('/s-ds: each document is <s> $A </s> (', r.out, 1, true)
    local ds = assert(dataset.open(root .. '/s-ds'))
    assert.are.same({ applied = true, prefix = { s }, suffix = {} }, ds.template) -- the EOS is the document's own
    assert.are.same({ { s, tok:ids('ab')[2], tok:ids('ab')[3] } }, corpus.documents(ds))
    assert.are.equal(4, ds.tokens) -- <s> a b </s>: one EOS
    ds:close()
    -- BERT's [CLS] $A [SEP], EOS another token: [SEP] stays in the document.
    file = byte_tokenizer('bert', '["[CLS]", "[SEP]", "<|endoftext|>"]',
      'processors.BertProcessing(("[SEP]", ids["[SEP]"]), ("[CLS]", ids["[CLS]"]))')
    local bert = assert(tokenizer.open(file))
    r = corpus.convert(('%s -o %s --tokenizer %s -q'):format(q(jsonl { 'ab' }), q(root .. '/bert-ds'), q(file)))
    assert.are.equal(0, r.rc, r.err)
    ds = assert(dataset.open(root .. '/bert-ds'))
    assert.are.same({ bert:ids('ab') }, corpus.documents(ds))
    assert.are.same({ applied = true, prefix = { bert:token_id('[CLS]') }, suffix = { bert:token_id('[SEP]') } },
      ds.template)
    ds:close()
    tok:close()
    bert:close()
  end)

  it('records nothing for a tokenizer without one, reads older indexes, and refuses a bad record', function()
    local docs = jsonl { 'plain bytes' }
    local r = corpus.convert(('%s -o %s -q'):format(q(docs), q(root .. '/bytes-ds')))
    assert.are.equal(0, r.rc, r.err)
    local index = helper.read_file(root .. '/bytes-ds/index.json')
    assert.is_nil(index:find('"template"', 1, true)) -- byte for byte the index of before
    local ds = assert(dataset.open(root .. '/bytes-ds'))
    assert.is_nil(ds.template)
    assert.is_nil(ds.bos)
    ds:close()
    for _, case in ipairs {
      { '"template": {"applied": true, "prefix": [257], "suffix": []},', '"template".prefix[0] is not a token id below the vocabulary (257)' },
      { '"template": {"applied": 1, "prefix": [], "suffix": []},', '"template" must be {"applied": true or false' },
      { '"template": {"applied": true, "prefix": [1]},', '"template".suffix must be a list of ids' },
    } do
      helper.write_file(root .. '/bytes-ds/index.json', (index:gsub('  "tokens"', '  ' .. case[1]:gsub('%%', '%%%%') .. '\n  "tokens"', 1)))
      local none, err = dataset.open(root .. '/bytes-ds')
      assert.is_nil(none)
      assert.matches(case[2], err, 1, true)
      assert.matches('index.json', err, 1, true)
    end
  end)
end)

describe('the converter and token files of a declared vocabulary', function()
  -- A .npy file NumPy writes of ids with dtype.
  local function npy(name, ids, dtype)
    local path = root .. '/' .. name
    python(('import numpy as np; np.save(%q, np.array([%s], dtype=%q))'):format(path, table.concat(ids, ', '), dtype))
    return path
  end

  local IDS = { 5, 6, 7, 0, 8, 9, 0, 3 } -- EOS 0: documents {5 6 7}, {8 9}, {3}

  it('reads .npy arrays of every supported dtype, and declared .bin ids', function()
    if not need_venv() then return end
    for _, dtype in ipairs { '<u2', '<u4', '<i4', '<i8' } do
      local file = npy('ids' .. dtype:sub(2) .. '.npy', IDS, dtype)
      local out = root .. '/npy-' .. dtype:sub(2)
      local r = corpus.convert(('%s -o %s --vocab-size 10 --eos 0 -q'):format(q(file), q(out)))
      assert.are.equal(0, r.rc, r.err)
      local ds = assert(dataset.open(out))
      assert.are.equal('ids', ds.tokenizer)
      assert.are.equal(10, ds.vocab_size)
      assert.are.equal(0, ds.eos)
      assert.are.same({ { 5, 6, 7 }, { 8, 9 }, { 3 } }, corpus.documents(ds))
      ds:close()
    end
    -- A vocabulary past 2^16 is stored 4 bytes a token.
    local big = npy('big.npy', { 70000, 1, 99999, 2 }, '<u4')
    local r = corpus.convert(('%s -o %s --vocab-size 100000 --eos 99999 -q'):format(q(big), q(root .. '/big')))
    assert.are.equal(0, r.rc, r.err)
    local ds = assert(dataset.open(root .. '/big'))
    assert.are.equal(4, ds.token_bytes)
    assert.are.same({ { 70000, 1 }, { 2 } }, corpus.documents(ds))
    ds:close()
    -- .bin ids of another vocabulary than GPT-2's.
    helper.write_file(root .. '/nano.bin', corpus.nanogpt_bin(IDS))
    r = corpus.convert(('%s -o %s --headerless-bin --vocab-size 10 --eos 0 -q'):format(q(root .. '/nano.bin'),
      q(root .. '/bin-ds')))
    assert.are.equal(0, r.rc, r.err)
    ds = assert(dataset.open(root .. '/bin-ds'))
    assert.are.same({ 'ids', 10, 0 }, { ds.tokenizer, ds.vocab_size, ds.eos })
    assert.are.same({ { 5, 6, 7 }, { 8, 9 }, { 3 } }, corpus.documents(ds))
    ds:close()
  end)

  it("says it took undeclared .bin ids as GPT-2's", function()
    helper.write_file(root .. '/gpt2.bin', corpus.nanogpt_bin { 1, 2, 50256 })
    local r = corpus.convert(('%s -o %s --headerless-bin'):format(q(root .. '/gpt2.bin'), q(root .. '/gpt2-ds')))
    assert.are.equal(0, r.rc, r.err)
    assert.matches("took the token files' ids as GPT-2's (vocabulary 50257, EOS 50256); --vocab-size N --eos ID " ..
      'declare others', r.err, 1, true)
  end)

  it('refuses a bad id naming the file and its offset, and every .npy it cannot read, in one line', function()
    if not need_venv() then return end
    local cases = {
      { npy('over.npy', { 1, 2, 10 }, '<u2'), "over.npy': token 10 at byte 132 is outside" },
      { npy('negative.npy', { 1, -2 }, '<i8'), "negative.npy': token -2 at byte 136 is negative" },
      { npy('float.npy', { 1, 2 }, '<f4'), "float.npy': dtype '<f4' is not supported (token ids must be a 1-D " ..
        'C-order NumPy array of <u2, <u4, <i4 or <i8)' },
      { npy('big-endian.npy', { 1, 2 }, '>u4'), "dtype '>u4' is not supported" },
      { npy('bytes.npy', { 1, 2 }, '|u1'), "dtype '|u1' is not supported" },
      { helper.write_file(root .. '/text.npy', 'not numpy at all'), 'no NumPy magic at offset 0 (not a .npy file)' },
    }
    local path = root .. '/square.npy'
    python(('import numpy as np; np.save(%q, np.zeros((2, 2), dtype="<u2"))'):format(path))
    cases[#cases + 1] = { path, 'shape (2, 2) is not 1-D' }
    path = root .. '/fortran.npy'
    python(('import numpy as np; np.save(%q, np.asfortranarray(np.zeros((2, 2), dtype="<u2")))'):format(path))
    cases[#cases + 1] = { path, 'a Fortran-order array is not supported' }
    local whole = helper.read_file(npy('cut.npy', { 1, 2, 3 }, '<u4'))
    cases[#cases + 1] = { helper.write_file(root .. '/cut.npy', whole:sub(1, -3)),
      "cut.npy': the header says 3 ids (12 bytes after it) but the file has 10 (truncated?)" }
    for _, case in ipairs(cases) do
      local r = corpus.convert(('%s -o %s --vocab-size 10 --eos 0'):format(q(case[1]), q(root .. '/bad')))
      assert.are.equal(1, r.rc, case[1])
      assert.are.equal(1, #helper.lines(r.err), r.err)
      assert.matches(case[2], r.err, 1, true)
    end
    assert.is_nil(io.open(root .. '/bad/index.json'), 'no dataset written')
  end)

  it('refuses a declaration that is incomplete, inconsistent or of text', function()
    helper.write_file(root .. '/some.bin', corpus.nanogpt_bin { 1, 0 })
    helper.write_file(root .. '/some.npy', 'x')
    helper.write_file(root .. '/some.txt', 'text')
    local bin = q(root .. '/some.bin') .. ' --headerless-bin -o ' .. q(root .. '/refused')
    for _, case in ipairs {
      { bin .. ' --vocab-size 10', 2, '--vocab-size needs --eos ID' },
      { bin .. ' --eos 0', 2, '--eos needs a tokenizer file (--tokenizer FILE) or, for token files, --vocab-size' },
      { bin .. ' --vocab-size 10 --eos 10', 1, 'EOS 10 is outside the declared vocabulary (10 ids)' },
      { bin .. ' --vocab-size 0 --eos 0', 2, 'vocab' },
      { bin .. ' --vocab-size 10 --eos 0 --tokenizer gpt2', 2, 'give it without --tokenizer' },
      { bin .. ' --no-special-tokens', 2, '--pattern, --special and --no-special-tokens need a tokenizer file' },
      { q(root .. '/some.txt') .. ' -o ' .. q(root .. '/refused') .. ' --vocab-size 10 --eos 0', 1,
        "'" .. root .. "/some.txt' is text" },
      { q(root .. '/some.npy') .. ' -o ' .. q(root .. '/refused'), 1,
        "some.npy' holds token ids of an unknown vocabulary; declare it with --vocab-size N and --eos ID" },
    } do
      local r = corpus.convert(case[1])
      assert.are.equal(case[2], r.rc, case[1] .. ': ' .. r.err)
      assert.are.equal(1, #helper.lines(r.err), r.err)
      assert.matches(case[3], r.err, 1, true)
    end
  end)
end)
