-- The converter (`run -m wick.data.convert`): round trips for every input kind, determinism across thread
-- counts, bad-line reporting, shard sizing, and its command line.
local helper = require 'helper'
local corpus = require 'helpers.corpus'
local dataset = require 'wick.data.dataset'
local q = helper.shell_quote

local function open(dir)
  local ds = assert(dataset.open(dir))
  return ds
end

describe('wick.data.convert (the converter)', function()
  local root
  before_each(function() root = helper.tmpdir() end)
  after_each(function() helper.rmtree(root) end)

  it('turns a directory of text files into one document per file, in sorted order, losslessly', function()
    local files = {
      ['src/b.txt'] = corpus.text(1, 3000),
      ['src/a.py'] = 'print("hi")\n',
      ['src/sub/c.md'] = corpus.text(2, 50),
      ['src/sub/empty.txt'] = '',
      ['src/.hidden'] = 'never read',
    }
    corpus.tree(root, files)
    local r = corpus.convert(q(root .. '/src') .. ' -o ' .. q(root .. '/out'))
    assert.are.equal(0, r.rc, r.err)
    assert.matches('3 documents', r.out)
    assert.matches('1 empty', r.out)
    local ds = open(root .. '/out')
    assert.are.equal('bytes', ds.tokenizer)
    assert.are.equal(257, ds.vocab_size)
    assert.are.equal(256, ds.eos)
    assert.are.equal(2, ds.token_bytes)
    assert.are.same({ files['src/a.py'], files['src/b.txt'], files['src/sub/c.md'] }, corpus.documents(ds))
    -- The stream is the documents, each followed by one EOS.
    local expected = #files['src/a.py'] + #files['src/b.txt'] + #files['src/sub/c.md'] + 3
    assert.are.equal(expected, ds.tokens)
    ds:close()
  end)

  it('splits text files into paragraphs or lines with --split', function()
    helper.write_file(root .. '/t.txt', 'First para\r\nstill first\r\n\r\n\n  \t\nSecond \255 bad\n\nThird\n  indented\n')
    local r = corpus.convert(q(root .. '/t.txt') .. ' -o ' .. q(root .. '/p') .. ' --split paragraph')
    assert.are.equal(0, r.rc, r.err)
    assert.matches(root .. '/t.txt:6: invalid UTF-8', r.err, 1, true)
    local ds = open(root .. '/p')
    assert.are.same({ 'First para\r\nstill first', 'Third\n  indented' }, corpus.documents(ds))
    ds:close()
    r = corpus.convert(q(root .. '/t.txt') .. ' -o ' .. q(root .. '/l') .. ' --split line')
    assert.are.equal(0, r.rc, r.err)
    ds = open(root .. '/l')
    assert.are.same({ 'First para', 'still first', 'Third', '  indented' }, corpus.documents(ds))
    ds:close()
    assert.are.equal(2, corpus.convert(q(root .. '/t.txt') .. ' -o ' .. q(root .. '/x') .. ' --split words').rc) -- a usage error
  end)

  it('reads only files matching --include when walking directories', function()
    corpus.tree(root, { ['src/a.py'] = 'a', ['src/b.pyc'] = '\0\255', ['src/sub/c.md'] = 'c', ['src/d.txt'] = 'd',
                        ['x.pyc'] = 'x' })
    local r = corpus.convert(q(root .. '/src') .. ' ' .. q(root .. '/x.pyc') .. ' -o ' .. q(root .. '/out') ..
      " --include '*.py,*.md'")
    assert.are.equal(0, r.rc, r.err)
    local ds = open(root .. '/out')
    assert.are.same({ 'a', 'c', 'x' }, corpus.documents(ds)) -- x.pyc was named explicitly
    ds:close()
  end)

  it('writes byte-identical output for 1, 2 and 3 threads and for a second run', function()
    local files = {}
    for i = 1, 40 do files[string.format('in/%02d.txt', i)] = corpus.text(i, 200 + i * 37) end
    local lines = {}
    for i = 1, 500 do lines[i] = '{"text": ' .. corpus.json_string(corpus.text(1000 + i, i % 60 + 1)) .. '}' end
    files['in/z.jsonl'] = table.concat(lines, '\n') .. '\n'
    corpus.tree(root, files)
    local outputs = {}
    for _, run in ipairs { { 't1', 1 }, { 't2', 2 }, { 't3', 3 }, { 't2again', 2 } } do
      local out = root .. '/' .. run[1]
      local r = corpus.convert(q(root .. '/in') .. ' -o ' .. q(out) ..
        ' --shard-size 8K --block-size 1K --threads ' .. run[2])
      assert.are.equal(0, r.rc, r.err)
      outputs[#outputs + 1] = corpus.files(out)
    end
    local names = {}
    for name in pairs(outputs[1]) do names[#names + 1] = name end
    assert.is_true(#names > 4, 'expected several shards, got ' .. #names - 1)
    for k = 2, #outputs do assert.are.same(outputs[1], outputs[k]) end
  end)

  it('cuts shards at document boundaries once they reach --shard-size', function()
    local files = {}
    for i = 1, 30 do files[string.format('in/%02d.txt', i)] = corpus.text(i, 100) end
    corpus.tree(root, files)
    local r = corpus.convert(q(root .. '/in') .. ' -o ' .. q(root .. '/out') .. ' --shard-size 2K --block-size 256')
    assert.are.equal(0, r.rc, r.err)
    local ds = open(root .. '/out')
    assert.is_true(ds.shards > 3)
    local total, docs = 0, 0
    for s = 0, ds.shards - 1 do
      local info = ds:shard(s)
      assert.are.equal(string.format('shard-%05d.wks', s), info.name)
      if s < ds.shards - 1 then assert.is_true(info.tokens >= 2048) end
      -- Each shard ends with the EOS of a whole document.
      local last = ds:read(s, info.tokens - 1, 1)
      assert.are.equal(ds.eos, last[0])
      total, docs = total + info.tokens, docs + info.documents
    end
    assert.are.equal(ds.tokens, total)
    assert.are.equal(30, docs)
    ds:close()
  end)

  it('reads .jsonl, skips and reports bad lines as file:line, and honours --field', function()
    local path = root .. '/data.jsonl'
    helper.write_file(path, table.concat({
      '{"text": "first doc", "id": 1}',
      '{"text": "second\\ndoc \\u00e9\\ud83d\\ude00"}',
      'not json at all',
      '{"id": 3}',
      '',
      '{"text": "bad \255 byte"}',
      '{"text": 42}',
      '   ',
      '{"meta": {"nested": [1, 2, {"text": "no"}]}, "text": "third"}',
      '{"text": "unpaired \\ud800 surrogate"}',
      '{"text": "fourth"}  ',
    }, '\n') .. '\n')
    local r = corpus.convert(q(path) .. ' -o ' .. q(root .. '/out'))
    assert.are.equal(0, r.rc, r.err)
    assert.matches('4 documents', r.out)
    assert.matches('5 bad', r.out)
    assert.matches(path .. ':3: invalid JSON', r.err, 1, true)
    assert.matches(path .. ":4: missing field 'text'", r.err, 1, true)
    assert.matches(path .. ':6: invalid UTF-8', r.err, 1, true)
    assert.matches(path .. ":7: field 'text' is not a string", r.err, 1, true)
    assert.matches(path .. ':10: invalid UTF-8', r.err, 1, true)
    local ds = open(root .. '/out')
    assert.are.same({ 'first doc', 'second\ndoc é😀', 'third', 'fourth' }, corpus.documents(ds))
    ds:close()

    helper.write_file(root .. '/other.jsonl', '{"body": "x", "text": "y"}\n')
    r = corpus.convert(q(root .. '/other.jsonl') .. ' -o ' .. q(root .. '/out2') .. ' --field body')
    assert.are.equal(0, r.rc, r.err)
    ds = open(root .. '/out2')
    assert.are.same({ 'x' }, corpus.documents(ds))
    ds:close()
  end)

  it('takes the first of a repeated --field in a .jsonl line, as FORMAT.md says', function()
    helper.write_file(root .. '/d.jsonl', '{"text": "first", "id": 1, "id": 2, "text": "second"}\n{"text": "x"}\n')
    local r = corpus.convert(q(root .. '/d.jsonl') .. ' -o ' .. q(root .. '/out') .. ' --strict')
    assert.are.equal(0, r.rc, r.err)
    local ds = open(root .. '/out')
    assert.are.same({ 'first', 'x' }, corpus.documents(ds))
    ds:close()
  end)

  it('numbers lines across chunks, and takes CRLF, a last line without newline and a multi-MB line', function()
    local lines = {}
    for i = 1, 40000 do lines[i] = '{"text": "line ' .. i .. ' ' .. string.rep('x', i % 50) .. '"}' end
    lines[31234] = '{"text": oops}'
    lines[5] = '{"text": "' .. string.rep('long ', 700000) .. '"}' -- 3.5 MB, longer than a chunk
    local path = root .. '/many.jsonl'
    helper.write_file(path, table.concat(lines, '\r\n'))
    local r = corpus.convert(q(path) .. ' -o ' .. q(root .. '/out') .. ' --threads 2')
    assert.are.equal(0, r.rc, r.err)
    assert.matches(path .. ':31234: invalid JSON at column 10', r.err, 1, true)
    assert.matches('39999 documents', r.out)
    local ds = open(root .. '/out')
    local docs = corpus.documents(ds)
    assert.are.equal('line 1 x', docs[1])
    assert.are.equal(3500000, #docs[5])
    assert.are.equal('line 40000 ' .. string.rep('x', 0), docs[39999])
    ds:close()
  end)

  it('fails on the first bad line with --strict, naming file and line, and leaves no index', function()
    local path = root .. '/data.jsonl'
    helper.write_file(path, '{"text": "ok"}\n{"text": "ok"}\n{"txt": "oops"}\n')
    local r = corpus.convert(q(path) .. ' -o ' .. q(root .. '/out') .. ' --strict')
    assert.are.equal(1, r.rc)
    assert.matches(path .. ":3: missing field 'text'", r.err, 1, true)
    assert.are.equal('', helper.read_file(root .. '/out/index.json'))
  end)

  it('reads .jsonl.zst into exactly the shards the plain .jsonl gives', function()
    local lines = {}
    for i = 1, 3000 do lines[i] = '{"text": ' .. corpus.json_string(corpus.text(i, i % 40 + 1)) .. '}' end
    local plain = root .. '/plain/data.jsonl'
    corpus.tree(root, { ['plain/data.jsonl'] = table.concat(lines, '\n') .. '\n' })
    os.execute('mkdir -p ' .. q(root .. '/zst'))
    assert.are.equal(0, helper.sh('zstd -q -19 ' .. q(plain) .. ' -o ' .. q(root .. '/zst/data.jsonl.zst')).rc)
    local a = corpus.convert(q(plain) .. ' -o ' .. q(root .. '/a') .. ' --shard-size 16K')
    local b = corpus.convert(q(root .. '/zst/data.jsonl.zst') .. ' -o ' .. q(root .. '/b') .. ' --shard-size 16K')
    assert.are.equal(0, a.rc, a.err)
    assert.are.equal(0, b.rc, b.err)
    local fa, fb = corpus.files(root .. '/a'), corpus.files(root .. '/b')
    fa['index.json'], fb['index.json'] = nil, nil -- converter notes differ only in input naming
    assert.are.same(fa, fb)
    local ds = open(root .. '/b')
    assert.are.equal(3000, ds.documents)
    ds:close()
  end)

  it('reports a truncated .jsonl.zst instead of converting part of it', function()
    local lines = {}
    for i = 1, 2000 do lines[i] = '{"text": ' .. corpus.json_string(corpus.text(i, 30)) .. '}' end
    helper.write_file(root .. '/d.jsonl', table.concat(lines, '\n'))
    helper.sh('zstd -q ' .. q(root .. '/d.jsonl') .. ' -o ' .. q(root .. '/d.jsonl.zst'))
    local data = helper.read_file(root .. '/d.jsonl.zst')
    helper.write_file(root .. '/cut.jsonl.zst', data:sub(1, #data - 100))
    local r = corpus.convert(q(root .. '/cut.jsonl.zst') .. ' -o ' .. q(root .. '/out'))
    assert.are.equal(1, r.rc)
    assert.matches('cut.jsonl.zst', r.err, 1, true)
    assert.matches('truncated', r.err, 1, true)
  end)

  it('reads llm.c and nanoGPT token .bin files, splitting documents at <|endoftext|>', function()
    local EOT = 50256
    local tokens = { EOT, 15496, 995, 13, EOT, 40, 1101, 50255, 0, EOT, 7, 8, 9 }
    helper.write_file(root .. '/train_000001.bin', corpus.llmc_bin(tokens))
    helper.write_file(root .. '/nano.bin', corpus.nanogpt_bin(tokens))
    for name, flags in pairs { ['train_000001.bin'] = '', ['nano.bin'] = ' --headerless-bin' } do
      local out = root .. '/out-' .. name
      local r = corpus.convert(q(root .. '/' .. name) .. ' -o ' .. q(out) .. flags)
      assert.are.equal(0, r.rc, r.err)
      local ds = open(out)
      assert.are.equal('gpt2', ds.tokenizer)
      assert.are.equal(50257, ds.vocab_size)
      assert.are.equal(EOT, ds.eos)
      assert.are.same({ { 15496, 995, 13 }, { 40, 1101, 50255, 0 }, { 7, 8, 9 } }, corpus.documents(ds))
      ds:close()
    end
    -- A token beyond GPT-2's vocabulary, and a header that lies about the size, are errors.
    helper.write_file(root .. '/bad.bin', corpus.nanogpt_bin { 1, 2, 60000 })
    local r = corpus.convert(q(root .. '/bad.bin') .. ' -o ' .. q(root .. '/x') .. ' --headerless-bin')
    assert.are.equal(1, r.rc)
    assert.matches('60000', r.err, 1, true)
    assert.matches("bad.bin': token 60000 at byte 4 is outside", r.err, 1, true) -- the file's offset
    local data = corpus.llmc_bin { 1, 2, 3, 4 }
    helper.write_file(root .. '/short.bin', data:sub(1, #data - 2))
    r = corpus.convert(q(root .. '/short.bin') .. ' -o ' .. q(root .. '/y'))
    assert.are.equal(1, r.rc)
    assert.matches('truncated', r.err, 1, true)
    -- Token files and text do not mix.
    helper.write_file(root .. '/t.txt', 'text')
    r = corpus.convert(q(root .. '/nano.bin') .. ' ' .. q(root .. '/t.txt') .. ' -o ' .. q(root .. '/z') ..
      ' --headerless-bin')
    assert.are.equal(1, r.rc)
    assert.matches('separately', r.err, 1, true)
  end)

  it('refuses a .bin without llm.c\'s magic naming the file and the magic, unless asked for headerless tokens', function()
    local tokens = {}
    for i = 1, 101 do tokens[i] = i end
    local damaged = '\0\0\0\0' .. corpus.llmc_bin(tokens):sub(5) -- the magic zeroed
    helper.write_file(root .. '/damaged.bin', damaged)
    local r = corpus.convert(q(root .. '/damaged.bin') .. ' -o ' .. q(root .. '/d'))
    assert.are.equal(1, r.rc, r.err)
    assert.are.equal(1, #helper.lines(r.err), r.err)
    assert.matches("damaged.bin' offset 0: magic 0 is not llm.c's 20240520", r.err, 1, true)
    assert.matches('--headerless-bin', r.err, 1, true)
    assert.is_nil(io.open(root .. '/d/index.json'), 'no dataset written')
    helper.write_file(root .. '/tiny.bin', corpus.nanogpt_bin { 1, 2, 3 })
    r = corpus.convert(q(root .. '/tiny.bin') .. ' -o ' .. q(root .. '/t'))
    assert.are.equal(1, r.rc, r.err)
    assert.matches("tiny.bin': 6 bytes is shorter than llm.c's 1024-byte header", r.err, 1, true)
    r = corpus.convert(q(root .. '/damaged.bin') .. ' -o ' .. q(root .. '/h') .. ' --headerless-bin')
    assert.are.equal(0, r.rc, r.err)
    local ds = open(root .. '/h')
    assert.are.equal((#damaged / 2) + 1, ds.tokens) -- every uint16 of the file, and the EOS
    ds:close()
  end)

  it('writes no dataset from inputs that hold no document, saying why (exit 1), and keeps the one there', function()
    corpus.tree(root, { ['none/bad.jsonl'] = '{"x": 1}\nnot json\n', ['none/tar/a.json'] = '{"text": "hi"}' })
    helper.sh(('tar -cf %s -C %s a.json'):format(q(root .. '/none/s.tar'), q(root .. '/none/tar')))
    for input, why in pairs {
      ['bad.jsonl'] = "(2 bad, 0 empty, 0 null skipped): the first skipped, " .. root .. "/none/bad.jsonl:1: missing field 'text'",
      ['s.tar'] = "(1 bad, 0 empty, 0 null skipped): the first skipped, " .. root .. "/none/s.tar:1: sample 'a' has no .text member",
    } do
      local out = root .. '/none-' .. input
      local r = corpus.convert(q(root .. '/none/' .. input) .. ' -o ' .. q(out))
      assert.are.equal(1, r.rc, r.out .. r.err)
      assert.are.equal(1, #helper.lines(r.err), r.err)
      assert.matches('wick.data.convert: converter: no document in 1 input ' .. why, r.err, 1, true)
      assert.matches("'" .. out .. "' is not written", r.err, 1, true)
      assert.is_nil(io.open(out .. '/index.json'), 'no dataset written')
    end
    -- A dataset already in the output stays as it was.
    corpus.tree(root, { ['some/a.txt'] = corpus.text(1, 100) })
    assert.are.equal(0, corpus.convert(q(root .. '/some') .. ' -o ' .. q(root .. '/kept')).rc)
    local before = helper.read_file(root .. '/kept/index.json')
    assert.are.equal(1, corpus.convert(q(root .. '/none/bad.jsonl') .. ' -o ' .. q(root .. '/kept')).rc)
    assert.are.equal(before, helper.read_file(root .. '/kept/index.json'))
  end)

  it('skips an earlier converter output inside its input, refuses one named as input, and -o equal to it', function()
    corpus.tree(root, { ['tree/a.txt'] = corpus.text(3, 200) })
    local earlier = root .. '/tree/dataset'
    assert.are.equal(0, corpus.convert(q(root .. '/tree') .. ' -o ' .. q(earlier) .. ' -q').rc)
    local r = corpus.convert(q(root .. '/tree') .. ' -o ' .. q(root .. '/again'))
    assert.are.equal(0, r.rc, r.err)
    assert.matches("skipping '" .. earlier .. "': it holds a Wick dataset", r.err, 1, true)
    assert.is_nil(r.err:find('skipped', 1, true), r.err) -- its shards were not read as text
    local ds = open(root .. '/again')
    assert.are.equal(1, ds.documents) -- a.txt alone: not the index.json
    ds:close()
    r = corpus.convert(q(earlier) .. ' -o ' .. q(root .. '/of-dataset'))
    assert.are.equal(1, r.rc, r.err)
    assert.are.equal(1, #helper.lines(r.err), r.err)
    assert.matches("input '" .. earlier .. "' is a Wick dataset (its index.json says so)", r.err, 1, true)
    r = corpus.convert(q(root .. '/tree') .. ' -o ' .. q(root .. '/tree'))
    assert.are.equal(1, r.rc, r.err)
    assert.are.equal(1, #helper.lines(r.err), r.err)
    assert.matches("input '" .. root .. "/tree' is the output directory (-o)", r.err, 1, true)
  end)

  it('writes raw blocks with --compression none and zstd blocks by default, same tokens', function()
    corpus.tree(root, { ['in/a.txt'] = corpus.text(5, 20000) })
    local a = corpus.convert(q(root .. '/in') .. ' -o ' .. q(root .. '/raw') .. ' --compression none')
    local b = corpus.convert(q(root .. '/in') .. ' -o ' .. q(root .. '/zstd') .. ' --compression zstd:19')
    assert.are.equal(0, a.rc, a.err)
    assert.are.equal(0, b.rc, b.err)
    local raw, zstd = open(root .. '/raw'), open(root .. '/zstd')
    assert.is_true(raw:shard(0).bytes > 2 * raw.tokens)
    assert.is_true(zstd:shard(0).bytes < raw:shard(0).bytes / 2)
    assert.are.same(corpus.documents(raw), corpus.documents(zstd))
    raw:close()
    zstd:close()
  end)

  it('resumes with --resume: keeps verified shards that match, rewrites missing or damaged ones', function()
    local files = {}
    for i = 1, 30 do files[string.format('in/%02d.txt', i)] = corpus.text(i, 300) end
    corpus.tree(root, files)
    local args = q(root .. '/in') .. ' -o ' .. q(root .. '/out') .. ' --shard-size 4K --block-size 512'
    assert.are.equal(0, corpus.convert(args).rc)
    local fresh = corpus.files(root .. '/out')
    -- An interrupted run: no index yet, one shard missing, one damaged.
    os.remove(root .. '/out/index.json')
    os.remove(root .. '/out/shard-00002.wks')
    local damaged = root .. '/out/shard-00004.wks'
    local data = helper.read_file(damaged)
    helper.write_file(damaged, data:sub(1, 300) .. string.char((data:byte(301) + 1) % 256) .. data:sub(302))
    helper.write_file(root .. '/out/shard-00002.wks.tmp', 'half a shard')
    local r = corpus.convert(args .. ' --resume')
    assert.are.equal(0, r.rc, r.err)
    local shards = 0
    for name in pairs(fresh) do shards = shards + (name:match('%.wks$') and 1 or 0) end
    assert.matches(string.format('%d reused', shards - 2), r.out, 1, true)
    assert.are.same(fresh, corpus.files(root .. '/out'))
    -- Other options: nothing matches, everything is rewritten.
    r = corpus.convert(q(root .. '/in') .. ' -o ' .. q(root .. '/out') .. ' --shard-size 4K --block-size 256 --resume')
    assert.are.equal(0, r.rc, r.err)
    assert.is_nil(r.out:find('reused', 1, true))
  end)

  it('does not read its own output when it lies inside an input directory', function()
    corpus.tree(root, { ['data/a.txt'] = 'alpha', ['data/b.txt'] = 'beta' })
    local args = q(root .. '/data') .. ' -o ' .. q(root .. '/data/out')
    for _ = 1, 2 do
      local r = corpus.convert(args)
      assert.are.equal(0, r.rc, r.err)
      assert.matches('2 inputs', r.out, 1, true)
      assert.matches('0 bad', r.out, 1, true)
    end
  end)

  it('removes shards of an earlier, larger conversion into the same directory', function()
    local files = {}
    for i = 1, 20 do files[string.format('in/%02d.txt', i)] = corpus.text(i, 200) end
    corpus.tree(root, files)
    assert.are.equal(0, corpus.convert(q(root .. '/in') .. ' -o ' .. q(root .. '/out') .. ' --shard-size 1K').rc)
    local before = 0
    for _ in pairs(corpus.files(root .. '/out')) do before = before + 1 end
    assert.are.equal(0, corpus.convert(q(root .. '/in') .. ' -o ' .. q(root .. '/out')).rc)
    assert.are.same({ 'index.json', 'shard-00000.wks' }, (function()
      local names = {}
      for name in pairs(corpus.files(root .. '/out')) do names[#names + 1] = name end
      table.sort(names)
      return names
    end)())
    assert.is_true(before > 3)
  end)

  it('refuses an input that is a FIFO or a device, named or met in a directory, without blocking', function()
    corpus.tree(root, { ['in/a.txt'] = 'alpha', ['in/b.jsonl'] = '{"text": "beta"}\n' })
    assert.are.equal(0, helper.sh('mkfifo ' .. q(root .. '/in/pipe.jsonl') .. ' ' .. q(root .. '/pipe.txt')).rc)
    local cases = {
      { q(root .. '/in'), root .. "/in/pipe.jsonl' is a FIFO (named pipe)" },
      { q(root .. '/pipe.txt'), root .. "/pipe.txt' is a FIFO (named pipe)" },
      { '/dev/null', "'/dev/null' is a character device" },
    }
    for _, case in ipairs(cases) do
      local r = helper.sh(('timeout 20 %s -m wick.data.convert %s -o %s'):format(q(helper.RUN), case[1], q(root .. '/out')))
      assert.are.equal(1, r.rc, case[1] .. ': ' .. r.err)
      assert.matches(case[2], r.err, 1, true)
      assert.matches('only regular files and directories', r.err, 1, true)
    end
    os.remove(root .. '/in/pipe.jsonl')
    assert.are.equal(0, corpus.convert(q(root .. '/in') .. ' -o ' .. q(root .. '/out')).rc)
  end)

  -- Names the converter keeps next to an output directory (runtime/convert/output.c).
  local function beside(out, suffix) return out:gsub('([^/]+)$', '.%1.' .. suffix) end
  local function listing(dir) return helper.sh('ls -1A ' .. q(dir)).out end

  describe('replacing an existing dataset', function()
    local out, before
    before_each(function()
      corpus.tree(root, { ['old/a.txt'] = corpus.text(1, 3000), ['old/b.txt'] = corpus.text(2, 100) })
      out = root .. '/out'
      assert.are.equal(0, corpus.convert(q(root .. '/old') .. ' -o ' .. q(out) .. ' --shard-size 1K').rc)
      before = corpus.files(out)
    end)

    local function assert_old_intact()
      assert.are.same(before, corpus.files(out))
      local ds = open(out)
      assert.are.same({ corpus.text(1, 3000), corpus.text(2, 100) }, corpus.documents(ds))
      ds:close()
    end

    it('leaves it whole when the new conversion fails, before or after writing shards', function()
      local lines = {}
      for i = 1, 400 do lines[i] = '{"text": ' .. corpus.json_string(corpus.text(i, 20)) .. '}' end
      -- The bad line comes in the second input, after the first one's shards are written.
      corpus.tree(root, { ['late/1.jsonl'] = table.concat(lines, '\n') .. '\n', ['late/2.jsonl'] = '{"txt": 1}\n' })
      helper.write_file(root .. '/early.jsonl', '{"txt": "bad"}\n')
      for _, input in ipairs { 'early.jsonl', 'late' } do
        local r = corpus.convert(q(root .. '/' .. input) .. ' -o ' .. q(out) .. ' --shard-size 256 --strict')
        assert.are.equal(1, r.rc, input)
        assert.matches(":%d+: missing field 'text'", r.err)
        assert_old_intact()
        assert.are.equal('', listing(beside(out, 'lock')))
      end
      -- The failed run's finished shards wait in the staging directory for --resume; temporaries are gone.
      local staging = listing(beside(out, 'converting'))
      assert.matches('shard%-00000%.wks', staging)
      assert.is_nil(staging:find('.tmp', 1, true))
      os.remove(root .. '/late/2.jsonl')
      local r = corpus.convert(q(root .. '/late') .. ' -o ' .. q(out) .. ' --shard-size 256 --strict --resume')
      assert.are.equal(0, r.rc, r.err)
      assert.matches('%d+ reused', r.out)
      local ds = open(out)
      assert.are.equal(400, ds.documents)
      ds:close()
      assert.is_nil(listing(root):find('.out.', 1, true)) -- no staging, lock or old dataset left
    end)

    it('keeps files it did not write, and finishes a replacement a killed run left half done', function()
      helper.write_file(out .. '/README', 'my notes')
      assert.are.equal(0, helper.sh('chmod 750 ' .. q(out)).rc)
      corpus.tree(root, { ['new/c.txt'] = 'gamma' })
      assert.are.equal(0, corpus.convert(q(root .. '/new') .. ' -o ' .. q(out)).rc)
      assert.are.equal('750\n', helper.sh('stat -c %a ' .. q(out)).out) -- the new directory keeps the old mode
      assert.are.same({ 'README', 'index.json', 'shard-00000.wks' }, (function()
        local names = helper.lines(listing(out))
        table.sort(names)
        return names
      end)())
      assert.are.equal('my notes', helper.read_file(out .. '/README'))
      os.remove(out .. '/README')
      before = nil
      -- Killed between the two renames of a swap: the output is missing, the whole old one is aside.
      assert.are.equal(0, corpus.convert(q(root .. '/old') .. ' -o ' .. q(out) .. ' --shard-size 1K').rc)
      before = corpus.files(out)
      assert.is_true(os.rename(out, beside(out, 'old')))
      helper.write_file(root .. '/bad.jsonl', '{"txt": 1}\n')
      assert.are.equal(1, corpus.convert(q(root .. '/bad.jsonl') .. ' -o ' .. q(out) .. ' --strict').rc)
      assert_old_intact()
      -- Killed after the swap, before the old one was removed: the next run removes it.
      helper.sh('cp -r ' .. q(out) .. ' ' .. q(beside(out, 'old')))
      assert.are.equal(0, corpus.convert(q(root .. '/new') .. ' -o ' .. q(out)).rc)
      assert.are.equal('', listing(beside(out, 'old')))
      assert.is_nil(listing(root):find('.out.', 1, true))
    end)

    it('refuses a second converter at once, naming its pid; a kill -9 mid-run leaves the old one readable', function()
      local files = {}
      for i = 1, 40 do files[('big/%02d.txt'):format(i)] = corpus.text(100 + i, 2000) end
      corpus.tree(root, files)
      local args = q(root .. '/big') .. ' -o ' .. q(out) .. ' --shard-size 16K --compression zstd:19 --threads 1'
      local pid = tonumber(helper.sh(('%s -m wick.data.convert %s > %s 2>&1 & echo $!'):format(q(helper.RUN), args,
        q(root .. '/first.log'))).out)
      assert.is_number(pid)
      local staging = beside(out, 'converting')
      local function running() return helper.sh('kill -0 ' .. pid .. ' && ! grep -q "^State:.*Z" /proc/' .. pid ..
        '/status').rc == 0 end
      -- Wait for its first finished shard, then freeze it there.
      for _ = 1, 2000 do
        if helper.read_file(staging .. '/shard-00001.wks') ~= '' or not running() then break end
        helper.sh('sleep 0.01')
      end
      assert.are.equal(0, helper.sh('kill -STOP ' .. pid).rc)
      assert.is_true(running(), 'the first converter ended too soon: ' .. helper.read_file(root .. '/first.log'))
      local started = os.time()
      local r = corpus.convert(args)
      assert.are.equal(1, r.rc)
      assert.matches("output '" .. out .. "' is being written by another converter (pid " .. pid .. ',', r.err, 1, true)
      assert.is_true(os.time() - started < 10)
      assert_old_intact() -- readable while another run is under way
      assert.are.equal(0, helper.sh('kill -9 ' .. pid).rc)
      for _ = 1, 500 do
        if not running() then break end
        helper.sh('sleep 0.01')
      end
      assert.is_false(running())
      assert_old_intact()
      -- The rerun takes the stale lock, reuses what the killed run finished, and replaces the dataset.
      r = corpus.convert(args .. ' --resume')
      assert.are.equal(0, r.rc, r.err)
      assert.matches('%d+ reused', r.out)
      local ds = open(out)
      assert.are.equal(40, ds.documents)
      for s = 0, ds.shards - 1 do assert.is_true((ds:check(s))) end
      ds:close()
      assert.is_nil(listing(root):find('.out.', 1, true))
    end)
  end)

  describe('command line', function()
    it('prints help generated from its option table', function()
      local r = corpus.convert('--help')
      assert.are.equal(0, r.rc)
      for _, o in ipairs(require('wick.data.convert').OPTIONS) do assert.matches('--' .. o.long, r.out, 1, true) end
    end)

    it('rejects bad usage with exit code 2 and a hint', function()
      local cases = { '', q(root) , '-o ' .. q(root .. '/o'), q(root) .. ' -o ' .. q(root .. '/o') .. ' --bogus',
                      q(root) .. ' -o' }
      for _, args in ipairs(cases) do
        local r = corpus.convert(args)
        assert.are.equal(2, r.rc, args)
        assert.matches('--help', r.err, 1, true)
      end
    end)

    it('reports bad option values as usage errors (exit code 2) and missing inputs as errors (exit code 1)', function()
      helper.write_file(root .. '/a.txt', 'x')
      for _, extra in ipairs { '--compression lz4', '--shard-size 12Q', '--tokenizer nope', '--threads 0' } do
        local r = corpus.convert(q(root .. '/a.txt') .. ' -o ' .. q(root .. '/o') .. ' ' .. extra)
        assert.are.equal(2, r.rc, extra)
      end
      local r = corpus.convert(q(root .. '/missing.txt') .. ' -o ' .. q(root .. '/o'))
      assert.are.equal(1, r.rc)
      assert.matches("missing.txt': No such file", r.err, 1, true)
    end)

    it('draws a progress bar on stderr when asked, ending at 100%', function()
      helper.write_file(root .. '/a.txt', corpus.text(1, 1000))
      local r = corpus.convert(q(root .. '/a.txt') .. ' -o ' .. q(root .. '/o') .. ' --progress')
      assert.are.equal(0, r.rc, r.err)
      assert.matches('\r\27[K[', r.err, 1, true)
      assert.matches('100.0%', r.err, 1, true)
      assert.matches('1 shards', r.err, 1, true)
    end)

    it('redraws the bar with the time left, cut to the terminal (COLUMNS=40 here); the last says the time taken', function()
      -- a million words, so that the builder waits for its first chunk and draws before it
      helper.write_file(root .. '/big.txt', corpus.text(3, 1000000))
      local function bars(columns)
        helper.rmtree(root .. '/o')
        local r = helper.sh(('COLUMNS=%d %s -m wick.data.convert %s -o %s --progress'):format(columns, q(helper.RUN),
          q(root .. '/big.txt'), q(root .. '/o')))
        assert.are.equal(0, r.rc, r.err)
        local list = {}
        for bar in r.err:gmatch('\r\27%[K([^\r\n]*)') do list[#list + 1] = bar end
        assert.is_true(#list >= 2, r.err)
        assert.matches('^%[=+%] 100%.0%% +[%d.]+ MB/s  1 docs  1 shards  0 bad  in %d+:%d%d:%d%d$', list[#list])
        return list
      end
      local wide = bars(200)
      for i = 1, #wide - 1 do
        assert.matches('^%[[=> ]+%] +[%d.]+%% +[%d.]+ MB/s  %d+ docs  %d+ shards  0 bad  eta [%d:?]+$', wide[i])
      end
      local narrow = bars(40)
      for i = 1, #narrow - 1 do assert.are.equal(39, #narrow[i], narrow[i]) end
    end)

    it('draws no progress bar when stderr is not a terminal', function()
      helper.write_file(root .. '/a.txt', 'x')
      local r = corpus.convert(q(root .. '/a.txt') .. ' -o ' .. q(root .. '/o'))
      assert.are.equal(0, r.rc)
      assert.is_nil(r.err:find('\r', 1, true))
    end)
  end)
end)
