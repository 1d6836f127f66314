-- Tokenizers (runtime/tokenizer/) against independent oracles: Hugging Face `tokenizers` and
-- tiktoken, installed from PyPI into build/test/venv (third_party/test-python.txt, kept
-- across runs). tests/helpers/tokenizer_oracle.py trains two small byte-level BPE tokenizers on this
-- machine's text (GPT-2, Llama 3 and Qwen 2 style), writes GPT-2's and cl100k's rank files from
-- packages that bundle them and the same vocabularies as tokenizer.json files, and the test texts (code, licenses, many scripts, emoji, CRLF, runs of
-- spaces and digits, contractions in both cases, odd whitespace, special tokens in text, pieces of
-- 20000 bytes). Every tokenizer must give the oracle's ids on every text, through run -m
-- wick.data.tokenize, and decode them back to the text.
local helper = require 'helper'
local json = require 'wick.json'
local q = helper.shell_quote

local PYTHON = helper.TEST_PYTHON
local ORACLE = helper.ROOT .. '/tests/helpers/tokenizer_oracle.py'
-- Text every Debian machine has: Python's sources and the license texts.
local CORPUS = '/usr/lib/python3.11/email /usr/lib/python3.11/json /usr/lib/python3.11/http ' ..
               '/usr/lib/python3.11/urllib /usr/share/common-licenses'

local venv_error -- why the oracles are unavailable, when they are
local root

local function oracle(args)
  return helper.sh(('%s %s %s'):format(q(PYTHON), q(ORACLE), args))
end

local function tokenize(args)
  return helper.run('-m wick.data.tokenize ' .. args)
end

setup(function()
  local made, why = helper.test_python()
  if not made then
    venv_error = why
    return
  end
  root = helper.tmpdir()
  local files = helper.sh(('find %s -type f -size -200k | LC_ALL=C sort'):format(CORPUS)).out:gsub('\n', ' ')
  local p = oracle(('prepare %s %s'):format(q(root), files))
  assert(p.rc == 0, 'tokenizer_oracle.py prepare failed:\n' .. p.out .. p.err)
end)

teardown(function()
  if root then helper.rmtree(root) end
end)

local function need_oracles()
  if venv_error then
    pending('skipped: ' .. venv_error)
    return false
  end
  return true
end

-- The first line where two id files differ, with the text it came from.
local function first_difference(ours, theirs)
  local a, b = helper.lines(helper.read_file(ours)), helper.lines(helper.read_file(theirs))
  local texts = helper.lines(helper.read_file(root .. '/texts.jsonl'))
  for i = 1, math.max(#a, #b) do
    if a[i] ~= b[i] then
      return ('line %d differs (of %d/%d)\n  text:   %s\n  wick:   %s\n  oracle: %s'):format(i, #a, #b,
        (texts[i] or ''):sub(1, 300), (a[i] or '(none)'):sub(1, 300), (b[i] or '(none)'):sub(1, 300))
    end
  end
end

-- The first text where two JSONL files of {"text": ...} differ.
local function first_text_difference(ours, theirs)
  local a, b = helper.lines(helper.read_file(ours)), helper.lines(helper.read_file(theirs))
  for i = 1, math.max(#a, #b) do
    local x, y = a[i] and json.decode(a[i]).text, b[i] and json.decode(b[i]).text
    if x ~= y then
      return ('text %d decodes differently (of %d/%d)\n  wick:   %q\n  oracle: %q'):format(i, #a, #b,
        (x or '(none)'):sub(1, 300), (y or '(none)'):sub(1, 300))
    end
  end
end

local CASES = {
  { name = 'a GPT-2 style tokenizer.json (ByteLevel regex, "a b" merges)', file = 'gpt2/tokenizer.json', kind = 'hf' },
  -- Its <mask> strips the whitespace around it (lstrip, rstrip): honoured, it cannot round-trip.
  { name = 'a Llama 3 style tokenizer.json (Split + ByteLevel, ignore_merges, pair merges, added tokens)',
    file = 'llama3/tokenizer.json', kind = 'hf', strips = true },
  -- It normalizes: the ids decode to the text in NFC.
  { name = 'a Qwen 2 style tokenizer.json (NFC normalizer, single digits)', file = 'qwen2/tokenizer.json', kind = 'hf',
    nfc = true },
  { name = "GPT-2's own tokenizer.json (50257 tokens)", file = 'gpt2-hf/tokenizer.json', kind = 'hf' },
  { name = "a Llama 3 style tokenizer.json of cl100k's 100k tokens", file = 'cl100k-llama3/tokenizer.json', kind = 'hf' },
  -- SentencePiece-style BPE (byte_fallback, "▁" for spaces): the ids decode to Hugging Face's decode
  -- of them, which is the text itself where the layout loses nothing.
  { name = 'a Llama 2 style tokenizer.json (Prepend + Replace normalizer, byte_fallback, fuse_unk)',
    file = 'llama2/tokenizer.json', kind = 'hf', hf_decode = true, roundtrip = true },
  { name = 'a Mistral v3 style tokenizer.json (Metaspace, prepend_scheme first)', file = 'mistral/tokenizer.json',
    kind = 'hf', hf_decode = true },
  { name = 'a Gemma style tokenizer.json (Replace normalizer only)', file = 'gemma/tokenizer.json', kind = 'hf',
    hf_decode = true, roundtrip = true },
  { name = 'a Llama 2 style tokenizer.json without the bytes past ASCII (unknown characters are <unk>)',
    file = 'llama2-unk/tokenizer.json', kind = 'hf', hf_decode = true },
  -- Llama 2 style files are merged word by word unless a merge joins a word to the next: this one's does.
  { name = 'a Llama 2 style tokenizer.json whose merges join words ("s" + "▁")', file = 'llama2-cross/tokenizer.json',
    kind = 'hf', hf_decode = true, roundtrip = true },
  { name = 'a Metaspace tokenizer.json (split, prepend_scheme always, Metaspace decoder, no byte_fallback)',
    file = 'metaspace/tokenizer.json', kind = 'hf', hf_decode = true },
  -- Unigram (T5 / ALBERT style): Viterbi over the vocabulary's scores, unknown characters fused into
  -- one <unk> or their bytes' tokens.
  { name = 'a Unigram tokenizer.json (Metaspace, <unk> for what it lacks)', file = 'unigram/tokenizer.json',
    kind = 'hf', hf_decode = true },
  { name = 'a T5 style Unigram tokenizer.json (Precompiled charsmap + Strip + Regex Replace, WhitespaceSplit)',
    file = 't5/tokenizer.json', kind = 'hf', hf_decode = true },
  { name = 'a Unigram tokenizer.json with byte_fallback (Lowercase + Strip normalizers)',
    file = 'unigram-bytes/tokenizer.json', kind = 'hf', hf_decode = true },
  { name = "GPT-2's tiktoken ranks (r50k)", file = 'gpt2.tiktoken', kind = 'tiktoken:r50k' },
  { name = "cl100k's tiktoken ranks", file = 'cl100k_base.tiktoken', kind = 'tiktoken:cl100k' },
  { name = "o200k's pattern (on cl100k's ranks)", file = 'cl100k_base.tiktoken', kind = 'tiktoken:o200k',
    args = '--pattern o200k' },
}

describe('wick.data.tokenize', function()
  for _, case in ipairs(CASES) do
    for _, special in ipairs { false, true } do
      local flag = special and ' --special' or ''
      it(('gives the ids of %s%s'):format(case.name, special and ', special tokens honoured' or ''), function()
        if not need_oracles() then return end
        local file, tag = root .. '/' .. case.file, case.kind:gsub(':', '-') .. (special and '-special' or '')
        local ours, theirs = root .. '/' .. tag .. '.wick', root .. '/' .. tag .. '.oracle'
        local r = tokenize(('--tokenizer %s %s%s --output %s %s'):format(q(file), case.args or '', flag, q(ours),
          q(root .. '/texts.jsonl')))
        assert.are.equal(0, r.rc, r.err)
        local o = oracle(('encode %s %s %s %s%s'):format(case.kind, q(file), q(root .. '/texts.jsonl'), q(theirs), flag))
        assert.are.equal(0, o.rc, o.err)
        local difference = first_difference(ours, theirs)
        assert.is_nil(difference, difference)
        if special and case.strips then return end
        -- Round trip: the ids decode to the very texts (SentencePiece-style: to Hugging Face's decode).
        local decoded = root .. '/' .. tag .. '.decoded'
        r = tokenize(('--tokenizer %s %s --decode --output %s %s'):format(q(file), case.args or '', q(decoded), q(ours)))
        assert.are.equal(0, r.rc, r.err)
        if case.hf_decode then
          local hf = root .. '/' .. tag .. '.hf-decoded'
          o = oracle(('decode %s %s %s'):format(q(file), q(ours), q(hf)))
          assert.are.equal(0, o.rc, o.err)
          difference = first_text_difference(decoded, hf)
          assert.is_nil(difference, difference)
          if not case.roundtrip then return end
        end
        local check = oracle(('roundtrip %s %s%s'):format(q(root .. '/texts.jsonl'), q(decoded),
          case.nfc and ' --nfc' or ''))
        assert.are.equal(0, check.rc, check.out .. check.err)
      end)
    end
  end

  -- Post-processors: the ids around each text, with Hugging Face's add_special_tokens and without.
  for _, name in ipairs { 'llama3-bos', 'llama2-bos', 'bert', 'roberta', 'bert-template' } do
    for _, add in ipairs { true, false } do
      it(('gives the ids of %s/tokenizer.json (post_processor) with add_special_tokens=%s'):format(name, add), function()
        if not need_oracles() then return end
        local file = root .. '/' .. name .. '/tokenizer.json'
        local ours, theirs = root .. '/post-' .. name .. '.wick', root .. '/post-' .. name .. '.oracle'
        local r = tokenize(('--tokenizer %s%s --output %s %s'):format(q(file), add and '' or ' --no-special-tokens',
          q(ours), q(root .. '/texts.jsonl')))
        assert.are.equal(0, r.rc, r.err)
        local o = oracle(('encode hf %s %s %s%s'):format(q(file), q(root .. '/texts.jsonl'), q(theirs),
          add and ' --add-special-tokens' or ''))
        assert.are.equal(0, o.rc, o.err)
        local difference = first_difference(ours, theirs)
        assert.is_nil(difference, difference)
      end)
    end
  end

  it('writes the same bytes on 1 thread and on 3, in input order', function()
    if not need_oracles() then return end
    local file = q(root .. '/llama3/tokenizer.json')
    local one = tokenize(('--tokenizer %s --threads 1 %s'):format(file, q(root .. '/texts.jsonl')))
    local three = tokenize(('--tokenizer %s --threads 3 --stats %s'):format(file, q(root .. '/texts.jsonl')))
    assert.are.equal(0, one.rc, one.err)
    assert.are.equal(0, three.rc, three.err)
    assert.are.equal(one.out, three.out)
    assert.matches('on 3 threads: [%d.]+ MB/s, [%d.]+ MB/s per core', three.err)
  end)

  it('reads a --field of standard input and decodes into that field', function()
    local r = helper.run('-m wick.data.tokenize --tokenizer bytes --field body -',
      { stdin = '{"id": 1, "body": "hi"}\n\n{"body": "\\u00e9"}\n' })
    assert.are.equal(0, r.rc, r.err)
    assert.are.equal('[104,105]\n[195,169]\n', r.out)
    r = helper.run('-m wick.data.tokenize --tokenizer bytes --decode --field body -', { stdin = r.out .. '[34, 92, 10, 255]\n' })
    assert.are.equal(0, r.rc, r.err)
    assert.are.equal('{"body":"hi"}\n{"body":"é"}\n{"body":"\\"\\\\\\n\xEF\xBF\xBD"}\n', r.out)
  end)

  it('refuses bad usage with one line and exit status 2', function()
    for _, args in ipairs { '', '--tokenizer bytes', '--tokenizer bytes --threads 1.5 x', '--tokenizer bytes --nope x',
                            '--tokenizer bytes --pattern p99k x', '--tokenizer bytes a b' } do
      local r = tokenize(args)
      assert.are.equal(2, r.rc, args .. ': ' .. r.err)
      assert.matches('^wick%.data%.tokenize: [^\n]+ %(see run %-m wick%.data%.tokenize %-%-help%)\n$', r.err, 1, false, args)
    end
  end)

  it('names the file and line of bad data, with exit status 1', function()
    local dir = helper.tmpdir()
    local input = helper.write_file(dir .. '/in.jsonl', '{"text": "ok"}\n{"text": 3}\n')
    local r = tokenize('--tokenizer bytes ' .. q(input))
    assert.are.equal(1, r.rc)
    assert.are.equal('[111,107]\n', r.out)
    assert.are.equal(('wick.data.tokenize: %s:2: field \'text\' is not a string\n'):format(input), r.err)
    input = helper.write_file(dir .. '/ids.jsonl', '[1, 2]\n[1,\n[300]\n')
    r = tokenize('--tokenizer bytes --decode ' .. q(input))
    assert.are.equal(1, r.rc)
    assert.matches(':2: column 4: expected a token id', r.err, 1, true)
    input = helper.write_file(dir .. '/ids.jsonl', '[1, 2]\n[300]\n')
    r = tokenize('--tokenizer bytes --decode ' .. q(input))
    assert.are.equal(1, r.rc)
    assert.matches(":2: tokenizer 'bytes': token 300 (at 0) is outside the vocabulary (257)", r.err, 1, true)
    r = tokenize('--tokenizer ' .. q(dir .. '/none.json') .. ' ' .. q(input))
    assert.are.equal(1, r.rc)
    assert.matches('none.json', r.err, 1, true)
    helper.rmtree(dir)
  end)
end)

describe('wick.tokenizer', function()
  local tokenizer = require 'wick.data.tokenizer'

  it('encodes, decodes and looks up tokens through the FFI; special tokens are text unless asked', function()
    if not need_oracles() then return end
    local plain = assert(tokenizer.open(root .. '/llama3/tokenizer.json'))
    local special = assert(tokenizer.open(root .. '/llama3/tokenizer.json', { special = true, eos = '<|eot_id|>' }))
    local eot = plain:token_id('<|eot_id|>')
    assert.is_number(eot)
    assert.are.equal(eot, special.eos)
    assert.are.equal(plain:token_id('<|end_of_text|>'), plain.eos)
    assert.are.same({ eot }, special:ids('<|eot_id|>'))
    assert.is_true(#plain:ids('<|eot_id|>') > 1)
    assert.are.equal(plain.fingerprint, special.fingerprint)
    assert.matches('^%x+$', plain.fingerprint)
    assert.are.equal('llama3/tokenizer.json', plain.name)
    -- Every test text round-trips through the Lua API too (special tokens honoured: by a tokenizer
    -- without whitespace-stripping tokens).
    local gpt2_special = assert(tokenizer.open(root .. '/gpt2/tokenizer.json', { special = true }))
    local data = helper.read_file(root .. '/texts.bin')
    local at, texts = 1, 0
    while at <= #data do
      local length, body = data:match('^(%d+)\n()', at)
      local text = data:sub(body, body + tonumber(length) - 1)
      for _, tok in ipairs { plain, gpt2_special } do
        local ids, n = tok:encode(text)
        assert.are.equal(text, tok:decode(ids, n))
      end
      at, texts = body + tonumber(length), texts + 1
    end
    assert.is_true(texts > 20)
    plain:close()
    special:close()
    gpt2_special:close()
  end)

  it("puts the post_processor's ids around a text unless add_special_tokens = false, as Hugging Face", function()
    if not need_oracles() then return end
    local llama = assert(tokenizer.open(root .. '/llama3-bos/tokenizer.json'))
    local bare = assert(tokenizer.open(root .. '/llama3-bos/tokenizer.json', { add_special_tokens = false }))
    local bos = llama:token_id('<|begin_of_text|>')
    assert.are.same({ prefix = { bos }, suffix = {} }, llama.template)
    assert.are.same(llama.template, bare.template) -- what it would add, either way
    local ids = llama:ids('hello world')
    assert.are.equal(bos, ids[1])
    assert.are.same(bare:ids('hello world'), { unpack(ids, 2) })
    assert.are.same({ bos }, llama:ids('')) -- Hugging Face: encode("") is [BOS]
    assert.are.same({}, bare:ids(''))
    local bert = assert(tokenizer.open(root .. '/bert/tokenizer.json'))
    local cls, sep = bert:token_id('[CLS]'), bert:token_id('[SEP]')
    assert.are.same({ prefix = { cls }, suffix = { sep } }, bert.template)
    assert.are.same({ cls, sep }, bert:ids(''))
    assert.is_nil(assert(tokenizer.open(root .. '/gpt2/tokenizer.json')).template)
    for _, tok in ipairs { llama, bare, bert } do tok:close() end
  end)

  it('decodes SentencePiece-style tokens to nothing, to a space, and through byte fallback', function()
    if not need_oracles() then return end
    local tok = assert(tokenizer.open(root .. '/llama2/tokenizer.json'))
    local space = tok:token_id('▁')
    assert.are.equal('', tok:decode {})
    assert.are.equal('', tok:decode { space }) -- Replace makes it ' ', Strip takes it off
    assert.are.equal(' ', tok:decode { space, space })
    assert.are.equal('é', tok:decode { tok:token_id('<0xC3>'), tok:token_id('<0xA9>') })
    assert.are.equal('\xEF\xBF\xBDa', tok:decode { tok:token_id('<0xC3>'), tok:token_id('a') })
    assert.are.same({ space, tok:token_id('<0xE4>'), tok:token_id('<0xB8>'), tok:token_id('<0xAD>') }, tok:ids('中'))
    tok:close()
  end)

  it('merges a long piece in time that grows like n log n, not n^2', function()
    if not need_oracles() then return end
    local tok = assert(tokenizer.open(root .. '/gpt2/tokenizer.json'))
    local core = require 'wick.core'
    local function seconds(text)
      local best = math.huge
      for _ = 1, 3 do
        local t = core.now()
        tok:encode(text)
        best = math.min(best, core.now() - t)
      end
      return best
    end
    -- One piece each (letters only): a quadratic merge would take 100x longer for 10x the bytes.
    local small, large = seconds(('qz'):rep(20000)), seconds(('qz'):rep(200000))
    assert.is_true(large < 30 * small + 0.05, ('%.4f s for 40 KB, %.4f s for 400 KB'):format(small, large))
  end)

  it('opens bytes; refuses gpt2 without its rank file and text that is not UTF-8', function()
    local bytes = assert(tokenizer.open('bytes'))
    assert.are.same({ 104, 105 }, bytes:ids('hi'))
    assert.are.equal(256, bytes.eos)
    local none, err = tokenizer.open('gpt2')
    assert.is_nil(none)
    assert.are.equal("tokenizer 'gpt2' only describes pre-tokenized data; to encode text open its rank file " ..
      '(gpt2.tiktoken, r50k_base.tiktoken) or its tokenizer.json', err)
    assert.has_error(function() tokenizer.open('bytes', { specail = true }) end,
      "unknown tokenizer option 'specail' (did you mean 'special'?)")
    if not need_oracles() then return end
    local tok = assert(tokenizer.open(root .. '/gpt2.tiktoken'))
    assert.are.equal(50257, tok.vocab_size)
    assert.are.equal(50256, tok.eos)
    local ok
    ok, err = pcall(tok.encode, tok, 'caf\xE9')
    assert.is_false(ok)
    assert.matches('not valid UTF-8 (at byte 3 of 4)', err, 1, true)
  end)
end)

describe('tokenizer files', function()
  local tokenizer = require 'wick.data.tokenizer'
  local dir

  before_each(function() dir = helper.tmpdir() end)
  after_each(function() helper.rmtree(dir) end)

  -- tokenizer.json with `edit` applied to its text; returns the error of opening it.
  local function open_edited(edit, name)
    local text = helper.read_file(root .. '/gpt2/tokenizer.json')
    local path = helper.write_file(dir .. '/' .. (name or 'tokenizer.json'), edit(text))
    local tok, err = tokenizer.open(path)
    assert.is_nil(tok, 'opened ' .. path)
    return err, path
  end

  local function replace(pattern, with) return function(text) return (text:gsub(pattern, with, 1)) end end

  it('give one clear error for each thing that is wrong or unsupported', function()
    if not need_oracles() then return end
    local cases = {
      { function(t) return t:sub(1, math.floor(#t / 2)) end, 'invalid JSON at line 1 column ' },
      { replace('"type": "BPE"', '"type": "WordPiece"'),
        "model type 'WordPiece' is not supported (only BPE and Unigram)" },
      { replace('"merges": ', '"merges_gone": '), 'model.merges is missing (a BPE model needs its merges)' },
      { replace('"normalizer": null', '"normalizer": {"type": "NFKD"}'), 'normalizer NFKD is not supported' },
      { replace('"pre_tokenizer": {"type": "ByteLevel"', '"pre_tokenizer": {"type": "Whitespace"'),
        'pre_tokenizer Whitespace is not supported' },
      { replace('"pre_tokenizer": {"type": "ByteLevel"',
          '"pre_tokenizer": {"type": "Metaspace", "replacement": "_", "prepend_scheme": "never"'),
        'decoder ByteLevel without a ByteLevel pre-tokenizer is not supported' },
      { replace('"byte_fallback": false', '"byte_fallback": true'),
        'model.byte_fallback with a ByteLevel pre-tokenizer is not supported' },
      { replace('"merges": %[', '"merges": ["zzz zzz", '),
        'model.merges[0] ("zzz" + "zzz"): the left side is not in the vocabulary' },
      { replace('"vocab": {', '"vocab": {"wick-x": -1, '), 'model.vocab["wick-x"] is not a token id' },
      { replace('"single_word": false', '"single_word": true'), 'single_word is not supported' },
    }
    for _, case in ipairs(cases) do
      local err, path = open_edited(case[1])
      assert.are.equal(path .. ': ', err:sub(1, #path + 2))
      assert.is_nil(err:find(': : ', 1, true), err)
      assert.matches(case[2], err, 1, true)
      assert.is_nil(err:find('\n'), err)
    end
  end)

  it('refuse a post_processor they cannot apply, naming the file and the component', function()
    if not need_oracles() then return end
    local function with(post) return function(text) return (text:gsub('"post_processor": null', '"post_processor": ' .. post, 1)) end end
    local special = '"special_tokens": {"<s>": {"id": "<s>", "ids": [5], "tokens": ["<s>"]}}'
    local piece = function(kind, id) return ('{"%s": {"id": "%s", "type_id": 0}}'):format(kind, id) end
    local function template(single, specials)
      return ('{"type": "TemplateProcessing", "single": [%s], "pair": null, %s}'):format(single, specials or special)
    end
    local cases = {
      { '{"type": "Lowercase"}', 'post_processor Lowercase is not supported (supported: TemplateProcessing, ' ..
        'BertProcessing, RobertaProcessing, ByteLevel, a Sequence of them)' },
      { '{"type": "Sequence", "processors": [{"type": "ByteLevel"}, {"type": "Sequence", "processors": []}]}',
        'post_processor Sequence (in a Sequence) is not supported' },
      { template(piece('SpecialToken', '<t>') .. ', ' .. piece('Sequence', 'A')),
        'post_processor TemplateProcessing uses "<t>", which special_tokens lacks' },
      { template(piece('SpecialToken', '<s>') .. ', ' .. piece('Sequence', 'B')),
        'single template with 0 $A and 1 $B is not supported (exactly one $A)' },
      { template(piece('Sequence', 'A') .. ', ' .. piece('Sequence', 'A')),
        'single template with 2 $A and 0 $B is not supported' },
      { template(piece('SpecialToken', '<s>') .. ', ' .. piece('Sequence', 'A'),
          '"special_tokens": {"<s>": {"id": "<s>", "ids": [99999999], "tokens": ["<s>"]}}'),
        'post_processor special_tokens[].ids[] = 99999999 is outside the vocabulary' },
      { template('{"Sequence": {"id": "C", "type_id": 0}}'), 'sequence "C" is neither A nor B' },
      { '{"type": "BertProcessing", "sep": ["[SEP]", -1], "cls": ["[CLS]", 1]}',
        'post_processor BertProcessing.sep is not a token id' },
      { '{"type": "RobertaProcessing", "sep": "</s>", "cls": ["<s>", 1]}',
        'post_processor RobertaProcessing.sep is not ["token", id]' },
    }
    for _, case in ipairs(cases) do
      local err, path = open_edited(with(case[1]))
      assert.are.equal(path .. ': ', err:sub(1, #path + 2))
      assert.matches(case[2], err, 1, true)
      assert.is_nil(err:find('\n'), err)
    end
  end)

  it('give one clear error for what is wrong in a SentencePiece-style file', function()
    if not need_oracles() then return end
    local function edited(file, edit, expected)
      local text = helper.read_file(root .. '/' .. file)
      local changed = edit(text)
      assert.are_not.equal(text, changed, expected)
      local path = helper.write_file(dir .. '/tokenizer.json', changed)
      local tok, err = tokenizer.open(path)
      assert.is_nil(tok, 'opened ' .. path .. ', expected: ' .. expected)
      assert.are.equal(path .. ': ', err:sub(1, #path + 2))
      assert.is_nil(err:find('\n'), err)
      return err
    end
    local cases = {
      { 'llama2', replace('"unk_token": "<unk>"', '"unk_token": "<wick-unk>"'),
        'model.unk_token "<wick-unk>" is not in the vocabulary' },
      { 'llama2', replace('"type": "Prepend",%s*"prepend": "[^"]*"', '"type": "Prepend"'),
        'normalizer Prepend.prepend is missing or not a non-empty string' },
      { 'llama2', replace('"pattern": {%s*"String": "▁"%s*}', '"pattern": {"Regex": "▁"}'),
        'decoder Replace with a Regex pattern is not supported (only String)' },
      { 'llama2', replace('"normalizers": %[', '"normalizers": [{"type": "NFKD"}, '),
        'normalizer NFKD (in a Sequence) is not supported' },
      { 'llama2', replace('"start": 1', '"start": -1'), 'decoder Strip.start is missing or not a whole number' },
      { 'llama2', replace('"type": "Fuse"', '"type": "CTC"'), 'decoder CTC (in a Sequence) is not supported' },
      { 'mistral', replace('"prepend_scheme": "first"', '"prepend_scheme": "sometimes"'),
        'pre_tokenizer Metaspace.prepend_scheme is not "always", "first" or "never"' },
      { 'mistral', replace('"prepend_scheme": "first"', '"prepend_scheme": "first", "add_prefix_space": false'),
        'pre_tokenizer Metaspace.add_prefix_space is false but prepend_scheme is not "never"' },
      { 'mistral', replace('"replacement": "▁"', '"replacement": "▁▁"'),
        'pre_tokenizer Metaspace.replacement "▁▁" is not one character' },
      { 'unigram', replace('"unk_id": 2', '"unk_id": null'),
        'model.unk_id is missing (a Unigram model needs its unk token)' },
      { 'unigram', replace('"unk_id": 2', '"unk_id": 99999'),
        'model.unk_id is not the place of a piece of model.vocab' },
      { 'unigram', replace('(%[%s*"<pad>",%s*)[^%]]+%]', '%1"high"]'),
        'model.vocab[0] ("<pad>"): the score is not a finite number' },
      { 'unigram', replace('%[%s*"<pad>",%s*[^%]]+%]', '["<pad>"]'), 'model.vocab[0] is not [piece, score]' },
      { 'unigram', replace('"type": "Unigram"', '"type": "Unigram", "alpha": 0.1'),
        'model.alpha is not supported (sampling makes encoding random)' },
      { 't5', replace('"precompiled_charsmap": "', '"precompiled_charsmap": "!'),
        'normalizer Precompiled.precompiled_charsmap is not base64' },
      { 't5', replace('"precompiled_charsmap": "[^"]*"', '"precompiled_charsmap": "AAAAAA=="'),
        "normalizer Precompiled: the charsmap's trie is 0 bytes, not a whole number of units within its 0" },
      { 't5', replace('"precompiled_charsmap": "[^"]*"', '"precompiled_charsmap": "CAAAAAAAAAAAAAAA/w=="'),
        "normalizer Precompiled: the charsmap's normalized strings are not UTF-8 (at byte 0 of 1)" },
      { 't5', replace('"Regex": " {2,}"', '"Regex": " {2,}("'), 'normalizer Replace: the regex does not compile' },
    }
    for _, case in ipairs(cases) do
      local err = edited(case[1] .. '/tokenizer.json', case[2], case[3])
      assert.matches(case[3], err, 1, true)
    end
  end)

  it('refuse an added token that reuses the id of another vocabulary string, naming both', function()
    if not need_oracles() then return end
    local plain = assert(tokenizer.open(root .. '/gpt2/tokenizer.json'))
    local taken = plain:decode({ 5 }) -- what id 5 stands for in the vocabulary
    plain:close()
    local err, path = open_edited(replace('"added_tokens": %[', '"added_tokens": [{"id": 5, "content": "<dup>", ' ..
      '"single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}, '))
    assert.are.equal(('%s: added_tokens[0] "<dup>" has id 5, which model.vocab gives to "%s" (one id, two strings)')
      :format(path, taken), err)
  end)

  it('split as Hugging Face does with a Split pattern that matches the empty string', function()
    if not need_oracles() then return end
    local texts = helper.write_file(dir .. '/texts.jsonl', table.concat({ '{"text": "say \\"hi\\" to a cab"}',
      '{"text": "aaa bab  x\\ny"}', '{"text": "\\u00e9t\\u00e9 a \\u4e2d\\u6587"}' }, '\n') .. '\n')
    local text = helper.read_file(root .. '/gpt2/tokenizer.json')
    for _, pattern in ipairs { '{"Regex": ""}', '{"Regex": "x*"}', '{"Regex": "(?=a)"}', '{"Regex": "\\\\b"}',
      '{"Regex": "a|"}', '{"String": ""}' } do
      local path = helper.write_file(dir .. '/tokenizer.json', (text:gsub('"pre_tokenizer": %b{}', function()
        return ('"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": %s, ' ..
          '"behavior": "Isolated", "invert": false}, {"type": "ByteLevel", "add_prefix_space": false, ' ..
          '"trim_offsets": true, "use_regex": false}]}'):format(pattern)
      end, 1)))
      local ours, theirs = dir .. '/ids.wick', dir .. '/ids.oracle'
      local r = tokenize(('--tokenizer %s --output %s %s'):format(q(path), q(ours), q(texts)))
      assert.are.equal(0, r.rc, pattern .. ': ' .. r.err)
      local o = oracle(('encode hf %s %s %s'):format(q(path), q(texts), q(theirs)))
      assert.are.equal(0, o.rc, o.err)
      assert.are.equal(helper.read_file(theirs), helper.read_file(ours), pattern)
    end
  end)

  it('give one clear error for a bad tiktoken file', function()
    if not need_oracles() then return end
    local path = helper.write_file(dir .. '/cl100k_base.tiktoken', 'IQ== 0\nIg== one\n')
    local tok, err = tokenizer.open(path)
    assert.is_nil(tok)
    assert.are.equal(path .. ':2: the rank is not a whole number (not a tiktoken rank file?)', err)
    path = helper.write_file(dir .. '/ranks.tiktoken', 'IQ== 0\nIQ== 1\n')
    tok, err = tokenizer.open(path, { pattern = 'r50k' })
    assert.are.equal(path .. ': tokens 0 and 1 stand for the same 1 bytes', err)
    path = helper.write_file(dir .. '/mine.tiktoken', 'IQ== 0\n')
    tok, err = tokenizer.open(path)
    assert.matches('which tiktoken encoding is it?', err, 1, true)
    tok, err = tokenizer.open(path, { pattern = 'cl100k' })
    assert.matches(': no token for the single byte 0x00 (every byte needs one)', err, 1, true)
    tok, err = tokenizer.open(dir .. '/missing.json')
    assert.are.equal(("tokenizer '%s/missing.json' is neither a built-in (bytes) nor a readable file: open '%s/missing.json': "
      .. 'No such file or directory'):format(dir, dir), err)
  end)
end)
