-- Records with typed columns: `run -m wick.data.convert ... --column NAME=FIELD:KIND` on JSONL, Parquet (written
-- by pyarrow in the test venv, the Hugging Face Image struct included), WebDataset tar (Python's tarfile) and text.
-- Each dataset is read back through the dataset's column calls (wk_dataset_read_column, wk_dataset_read_blob) and
-- compared with the input's fields exactly; each way a field can fail its column is a bad row with its own line.
local helper = require 'helper'
local corpus = require 'helpers.corpus'
local dataset = require 'wick.data.dataset'
local ffi = require 'ffi'
local q = helper.shell_quote

local function convert(args) return corpus.convert(args .. ' -q') end

-- Every record of a dataset, read with the dataset's column calls (ds:read_column, ds:blob): { tokens = {...} (EOS
-- not included), [column] = value }, i64 and f32 as numbers, token_u8 as a list of the record's bytes (its EOS's
-- last), tensors flat, bytes as a string.
local function records(dir)
  local ds = assert(dataset.open(dir))
  local out = {}
  for s = 0, ds.shards - 1 do
    local shard = ds:shard(s)
    local tokens = ds:read(s, 0, shard.tokens)
    for d = 0, shard.documents - 1 do
      local start, length = ds:document(s, d)
      local r = { tokens = {} }
      for k = 0, length - 1 do r.tokens[k + 1] = tokens[start + k] end
      for c = 2, #ds.columns do
        local col = ds.columns[c]
        if col.kind == 'bytes' then
          r[col.name] = ds:blob(col.name, s, d)
        else
          local per_token = col.kind == 'token_u8'
          local n = per_token and length + 1 or (col.elements or 1)
          local values = ds:read_column(col.name, s, per_token and start or d, per_token and length + 1 or 1)
          local list = {}
          for k = 0, n - 1 do list[k + 1] = tonumber(values[k]) end
          r[col.name] = (per_token or col.kind == 'tensor') and list or list[1]
        end
      end
      out[#out + 1] = r
    end
  end
  ds:close()
  return out
end

local function index_of(dir) return helper.read_file(dir .. '/index.json') end

local function bytes_of(text)
  local list = {}
  for k = 1, #text do list[k] = text:byte(k) end
  return list
end

describe('--column on JSONL', function()
  local dir
  before_each(function() dir = helper.tmpdir() end)
  after_each(function() helper.rmtree(dir) end)

  it('stores each kind and reads back the fields exactly', function()
    helper.write_file(dir .. '/a.jsonl', table.concat({
      '{"text": "hi", "label": 3, "score": 0.25, "emb": [[1.5, 2], [3, -4]], "raw": "über", "m": [7, 9]}',
      '{"text": "", "label": true, "score": -1e3, "emb": [[0, 0], [0, 1]], "raw": "", "m": []}',
      '{"text": "abc", "label": -4503599627370497, "score": 3, "emb": [[1, 1], [1, 1]], "raw": "x\\u0000y", ' ..
        '"m": [0, 255, 1]}',
    }, '\n') .. '\n')
    local r = convert(q(dir .. '/a.jsonl') .. ' -o ' .. q(dir .. '/out') .. ' --column label=label:i64 ' ..
      '--column score=score:f32 --column emb=emb:f32[2,2] --column raw=raw:bytes --column m=m:token_u8')
    assert.are.equal(0, r.rc, r.err)
    assert.matches('"version": 2', index_of(dir .. '/out'), 1, true)
    assert.matches('{"name": "emb", "kind": "tensor", "dtype": "f32", "shape": [2, 2]}',
      index_of(dir .. '/out'):gsub('%s+', ' '), 1, true)
    local got = records(dir .. '/out')
    assert.are.equal(3, #got)
    assert.are.same(bytes_of('hi'), got[1].tokens)
    assert.are.same({}, got[2].tokens) -- an empty text is kept with its columns: its EOS alone
    assert.are.same({ 3, 1, -4503599627370497 }, { got[1].label, got[2].label, tonumber(got[3].label) })
    assert.are.same({ 0.25, -1000, 3 }, { got[1].score, got[2].score, got[3].score })
    assert.are.same({ 1.5, 2, 3, -4 }, got[1].emb)
    assert.are.same({ 'über', '', 'x\0y' }, { got[1].raw, got[2].raw, got[3].raw })
    -- per token, then the EOS's: its record's last value (0 for an empty record)
    assert.are.same({ 7, 9, 9 }, got[1].m)
    assert.are.same({ 0 }, got[2].m)
    assert.are.same({ 0, 255, 1, 1 }, got[3].m)
  end)

  it('takes token ids and a Hugging Face labels mask (-100 -> 0)', function()
    helper.write_file(dir .. '/a.jsonl',
      '{"input_ids": [5, 6, 7, 8], "labels": [-100, -100, 7, 8]}\n{"input_ids": [9], "labels": [9]}\n')
    local r = convert(q(dir .. '/a.jsonl') .. ' -o ' .. q(dir .. '/out') ..
      ' --column tokens=input_ids:tokens --column loss_mask=labels:mask')
    assert.are.equal(0, r.rc, r.err)
    local got = records(dir .. '/out')
    assert.are.same({ 5, 6, 7, 8 }, got[1].tokens)
    assert.are.same({ 0, 0, 1, 1, 1 }, got[1].loss_mask)
    assert.are.same({ 9 }, got[2].tokens)
    assert.are.same({ 1, 1 }, got[2].loss_mask)
  end)

  it('keeps every record whole across chunks and shards, the same bytes whatever --threads', function()
    local lines, want = {}, {}
    for i = 1, 5000 do
      local text = corpus.text(i, i % 61)
      local per = {}
      for k = 1, #text do per[k] = (i + k) % 256 end
      lines[i] = ('{"text": %s, "n": %d, "per": [%s], "blob": %s}'):format(corpus.json_string(text), i * 1000003,
        table.concat(per, ','), corpus.json_string(('b'):rep(i % 5)))
      want[i] = { tokens = bytes_of(text), n = i * 1000003, blob = ('b'):rep(i % 5) }
      per[#per + 1] = per[#per] or 0 -- the EOS's
      want[i].per = per
    end
    helper.write_file(dir .. '/a.jsonl', table.concat(lines, '\n') .. '\n')
    local args = ' --column n=n:i64 --column per=per:token_u8 --column blob=blob:bytes --shard-size 64K --block-size 4K'
    local r = convert(q(dir .. '/a.jsonl') .. ' -o ' .. q(dir .. '/one') .. args .. ' --threads 1')
    assert.are.equal(0, r.rc, r.err)
    r = convert(q(dir .. '/a.jsonl') .. ' -o ' .. q(dir .. '/three') .. args .. ' --threads 3')
    assert.are.equal(0, r.rc, r.err)
    assert.are.same(corpus.files(dir .. '/one'), corpus.files(dir .. '/three'))
    local ds = assert(dataset.open(dir .. '/one'))
    assert.is_true(ds.shards > 3, ds.shards .. ' shards')
    assert.is_true(#helper.read_file(dir .. '/a.jsonl') > 2 ^ 21) -- more than one chunk of lines
    ds:close()
    assert.are.same(want, records(dir .. '/one'))
  end)

  it('writes version 1, byte for byte as before, without --column', function()
    helper.write_file(dir .. '/a.jsonl', '{"text": "hello"}\n{"text": "world"}\n')
    assert.are.equal(0, convert(q(dir .. '/a.jsonl') .. ' -o ' .. q(dir .. '/plain')).rc)
    -- token ids given as a list are the same token stream
    helper.write_file(dir .. '/b.jsonl', ('{"ids": [%s]}\n{"ids": [%s]}\n'):format(
      table.concat(bytes_of('hello'), ','), table.concat(bytes_of('world'), ',')))
    assert.are.equal(0, convert(q(dir .. '/b.jsonl') .. ' -o ' .. q(dir .. '/ids') .. ' --column tokens=ids:tokens').rc)
    assert.matches('"version": 1', index_of(dir .. '/plain'), 1, true)
    assert.are.equal(helper.read_file(dir .. '/plain/shard-00000.wks'), helper.read_file(dir .. '/ids/shard-00000.wks'))
  end)

  it('reports each field that does not fit its column as a bad line, and --strict fails on the first', function()
    local lines = {
      '{"text": "a", "label": "3", "ids": [1], "labels": [1]}',
      '{"text": "a", "ids": [1], "labels": [1]}',
      '{"text": "a", "label": 1.5, "ids": [1], "labels": [1]}',
      '{"text": "a", "label": 1, "ids": [1, 300], "labels": [1, 1]}',
      '{"text": "a", "label": 1, "ids": [1, 2], "labels": [1]}',
      '{"text": "a", "label": 1, "ids": {"a": 1}, "labels": [1]}',
      '{"text": "a", "label": 1, "ids": [1], "labels": [1], "emb": [1, 2]}',
      '{"text": "a", "label": 1, "ids": [1], "labels": [1], "emb": [[1, 2], [3, "x"]]}',
      '{"text": "a", "label": 1, "ids": [1], "labels": [1], "emb": [[1, 2], [3, 4]], "f": 2.5}',
      'not json',
      '{"text": "a", "label": 1, "ids": [1], "labels": [1], "emb": [[1, 2], [3, 4]], "f": 1e300}',
    }
    helper.write_file(dir .. '/a.jsonl', table.concat(lines, '\n') .. '\n')
    local args = q(dir .. '/a.jsonl') .. ' -o ' .. q(dir .. '/out') .. ' --column tokens=ids:tokens ' ..
      '--column label=label:i64 --column mask=labels:mask --column emb=emb:i32[2,2] --column f=f:f32'
    local r = corpus.convert(args)
    assert.are.equal(0, r.rc, r.err)
    local file = dir .. '/a.jsonl'
    for _, expected in ipairs {
      file .. ":1: column 'label': field 'label' is a string, expected an integer",
      file .. ":2: column 'label': field 'label' is missing",
      file .. ":3: column 'label': field 'label' is a number that is not an integer, expected an integer",
      file .. ":4: column 'tokens': field 'ids' element 1 is token 300, outside the vocabulary (257 ids)",
      file .. ":5: column 'mask': field 'labels' has 1 values for the record's 2 tokens",
      file .. ":6: column 'tokens': field 'ids' is an object, expected a string or a list of token ids",
      file .. ":7: column 'emb': field 'emb' is a number at depth 1, expected a list of 2",
      file .. ":8: column 'emb': field 'emb' is a string, expected an integer",
      file .. ":10: invalid JSON at line 1 column 1",
      file .. ":11: column 'f': field 'f' is 1e+300, beyond f32's range",
    } do
      assert.matches(expected, r.err, 1, true)
    end
    assert.matches('1 documents, .* 10 bad', r.out)
    
    local s = corpus.convert(args .. ' --strict')
    assert.are.equal(1, s.rc)
    assert.matches(file .. ":1: column 'label': field 'label' is a string, expected an integer (--strict", s.err, 1,
      true)
  end)

  it('refuses a malformed --column, a repeated name, --resume and token files, in one line', function()
    helper.write_file(dir .. '/a.jsonl', '{"text": "a"}\n')
    for spec, why in pairs {
      ['label'] = "no '=' and ':'",
      ['1x=a:i64'] = 'a name is letters',
      ['x=a:int'] = 'an unknown kind',
      ['x=a:f16[2]'] = "a tensor's elements are f32, i32, i64 or u8",
      ['x=a:f32[2,0]'] = "a tensor's dimensions are integers from 1",
      ['x=a:f32[1,1,1,1,1]'] = 'a tensor has at most 4 dimensions',
      ['ids=a:tokens'] = "kind tokens is the token stream",
      ['tokens=a:i64'] = "the column 'tokens' is the token stream",
    } do
      local r = convert(q(dir .. '/a.jsonl') .. ' -o ' .. q(dir .. '/out') .. ' --column ' .. q(spec))
      assert.are.equal(2, r.rc, spec)
      assert.matches("column '" .. spec .. "': " .. why, r.err, 1, true)
    end
    local r = convert(q(dir .. '/a.jsonl') .. ' -o ' .. q(dir .. '/out') .. ' --column x=a:i64 --column x=b:f32')
    assert.matches("a column named 'x' is given twice", r.err, 1, true)
    r = convert(q(dir .. '/a.jsonl') .. ' -o ' .. q(dir .. '/out') .. ' --column x=a:i64 --resume')
    assert.matches('--resume cannot keep shards with columns', r.err, 1, true)
    helper.write_file(dir .. '/t.bin', corpus.llmc_bin { 1, 2, 50256 })
    r = convert(q(dir .. '/t.bin') .. ' -o ' .. q(dir .. '/out') .. ' --column x=a:i64')
    assert.matches("holds token ids, no fields for --column", r.err, 1, true)
  end)
end)

describe('--column on text and tar', function()
  local dir
  before_each(function() dir = helper.tmpdir() end)
  after_each(function() helper.rmtree(dir) end)

  it('a text file has only its text: a bytes column of it, any other field missing', function()
    helper.write_file(dir .. '/a.txt', 'one\ntwo\n')
    local r = convert(q(dir .. '/a.txt') .. ' -o ' .. q(dir .. '/out') .. ' --split line --column raw=text:bytes')
    assert.are.equal(0, r.rc, r.err)
    local got = records(dir .. '/out')
    assert.are.same({ 'one', 'two' }, { got[1].raw, got[2].raw })
    r = corpus.convert(q(dir .. '/a.txt') .. ' -o ' .. q(dir .. '/o2') .. ' --split line --column label=label:i64')
    assert.matches(dir .. "/a.txt:1: column 'label': field 'label' is missing", r.err, 1, true)
  end)

  it('reads members by extension: .cls as an integer, bytes, and fields of the .json member', function()
    local script = [=[
import io, json, sys, tarfile
with tarfile.open(sys.argv[1], 'w') as t:
    def add(name, data):
        info = tarfile.TarInfo(name); info.size = len(data); t.addfile(info, io.BytesIO(data))
    add('s/0001.txt', b'a cat'); add('s/0001.cls', b'3\n'); add('s/0001.jpg', b'\xff\xd8\x00jpeg')
    add('s/0001.json', json.dumps({'score': 0.5, 'ids': [1, 2]}).encode())
    add('s/0002.cls', b'7'); add('s/0002.jpg', b''); add('s/0002.json', b'{"score": 2, "ids": [3, 4]}')
    add('s/0003.txt', b'x'); add('s/0003.cls', b'seven'); add('s/0003.jpg', b'z'); add('s/0003.json', b'{}')
    add('s/0004.txt', b'y'); add('s/0004.jpg', b'z'); add('s/0004.json', b'{"score": 1}')
]=]
    helper.write_file(dir .. '/make.py', script)
    local made = helper.sh(('python3 %s %s'):format(q(dir .. '/make.py'), q(dir .. '/a.tar')))
    assert.are.equal(0, made.rc, made.err)
    local r = corpus.convert(q(dir .. '/a.tar') .. ' -o ' .. q(dir .. '/out') .. ' --field txt ' ..
      '--column label=cls:i64 ' ..
      '--column image=jpg:bytes --column score=json.score:f32 --column ids=json.ids:i64[2]')
    assert.are.equal(0, r.rc, r.err)
    local got = records(dir .. '/out')
    assert.are.equal(1, #got)
    assert.are.same(bytes_of('a cat'), got[1].tokens)
    assert.are.same({ 3, '\xff\xd8\x00jpeg', 0.5, { 1, 2 } },
      { got[1].label, got[1].image, got[1].score, got[1].ids })
    -- no .txt: a bad row, never an empty text in its place
    assert.matches(dir .. "/a.tar:2: the text: field 'txt' is missing (records without text: --no-text)", r.err, 1,
      true)
    assert.matches(dir .. "/a.tar:3: column 'label': field 'cls' is a member that is not an integer", r.err, 1, true)
    assert.matches(dir .. "/a.tar:4: column 'label': field 'cls' is missing", r.err, 1, true)
  end)
end)

describe('--column on Parquet', function()
  local venv_error
  setup(function()
    local made, why = helper.test_python()
    if not made then venv_error = why end
  end)
  local dir
  before_each(function() dir = helper.tmpdir() end)
  after_each(function() helper.rmtree(dir) end)

  local function write(script)
    helper.write_file(dir .. '/make.py', 'import sys, pyarrow as pa, pyarrow.parquet as pq\n' .. script)
    local r = helper.sh(('%s %s %s'):format(q(helper.TEST_PYTHON), q(dir .. '/make.py'), q(dir)))
    assert.are.equal(0, r.rc, r.err)
  end

  for _, options in ipairs { 'row_group_size=2', 'row_group_size=3, use_dictionary=False, data_page_version="2.0"',
                             'compression="zstd", use_dictionary=True' } do
    it('reads numbers, booleans, strings and the Image struct: ' .. options, function()
      if venv_error then return pending('skipped: ' .. venv_error) end
      write(([=[
image = pa.struct([('bytes', pa.binary()), ('path', pa.string())])
t = pa.table({
    'text': ['hello', None, 'abc', '', 'z'],
    'label': pa.array([1, 2, 3, None, -5], pa.int64()),
    'small': pa.array([5, 6, 7, 8, -2147483648], pa.int32()),
    'score': pa.array([0.5, 1.5, -2.25, 3.0, 1e-3], pa.float32()),
    'wide': pa.array([0.25, 1.0, 2.0, 3.0, 1e30], pa.float64()),
    'flag': pa.array([True, False, True, False, True]),
    'caption': ['a', 'b', 'c', 'd', 'ü'],
    'image': pa.array([{'bytes': b'\x89PNG\x00', 'path': 'a.png'}, {'bytes': b'x', 'path': None}, None,
                       {'bytes': b'', 'path': 'p'}, {'bytes': b'\x00' * 70000, 'path': None}], image),
})
pq.write_table(t, sys.argv[1] + '/a.parquet', %s)
]=]):format(options))
      local r = corpus.convert(q(dir .. '/a.parquet') .. ' -o ' .. q(dir .. '/out') .. ' --column label=label:i64 ' ..
        '--column small=small:i64 --column score=score:f32 --column flag=flag:i64 --column caption=caption:bytes ' ..
        '--column image=image:bytes --column wide=wide:f32')
      assert.are.equal(0, r.rc, r.err)
      -- row 2: a null text is skipped and counted; row 3: a null image; row 4: a null label
      assert.matches(', 1 null skipped', r.out, 1, true)
      assert.matches(dir .. "/a.parquet:3: column 'image': field 'image' is null, expected a string or bytes",
        r.err, 1, true)
      assert.matches(dir .. "/a.parquet:4: column 'label': field 'label' is null, expected an integer", r.err, 1, true)
      local got = records(dir .. '/out')
      assert.are.equal(2, #got)
      assert.are.same(bytes_of('hello'), got[1].tokens)
      assert.are.same({ 1, 5, 0.5, 1, 'a', '\x89PNG\0', 0.25 },
        { got[1].label, got[1].small, got[1].score, got[1].flag, got[1].caption, got[1].image, got[1].wide })
      assert.are.same(bytes_of('z'), got[2].tokens)
      assert.are.same({ -5, -2147483648, 1 }, { got[2].label, got[2].small, got[2].flag })
      assert.are.equal(ffi.cast('float', 1e-3), ffi.cast('float', got[2].score))
      assert.are.equal(tonumber(ffi.cast('float', 1e30)), got[2].wide)
      assert.are.equal(('\0'):rep(70000), got[2].image)
      assert.are.equal('ü', got[2].caption)
    end)
  end

  it('gives text-less records with --no-text (a bad row each without it), and refuses lists by name', function()
    if venv_error then return pending('skipped: ' .. venv_error) end
    write([=[
t = pa.table({'label': pa.array([4, 5], pa.int64()), 'ids': pa.array([[1, 2], [3]])})
pq.write_table(t, sys.argv[1] + '/a.parquet')
]=])
    local r = convert(q(dir .. '/a.parquet') .. ' -o ' .. q(dir .. '/out') .. ' --column label=label:i64')
    assert.are.equal(1, r.rc) -- the text column is missing: every row is bad, unless told there is no text
    assert.matches("a.parquet:1: the text: field 'text' is missing (records without text: --no-text)", r.err, 1, true)
    r = convert(q(dir .. '/a.parquet') .. ' -o ' .. q(dir .. '/o1') .. ' --no-text')
    assert.are_not.equal(0, r.rc)
    assert.matches('--no-text makes records of columns without text: it needs a --column', r.err, 1, true)
    r = convert(q(dir .. '/a.parquet') .. ' -o ' .. q(dir .. '/out') .. ' --column label=label:i64 --no-text')
    assert.are.equal(0, r.rc, r.err)
    local got = records(dir .. '/out')
    assert.are.same({ {}, {} }, { got[1].tokens, got[2].tokens })
    assert.are.same({ 4, 5 }, { got[1].label, got[2].label })
    r = convert(q(dir .. '/a.parquet') .. ' -o ' .. q(dir .. '/o2') .. ' --column ids=ids:token_u8')
    assert.are.equal(1, r.rc)
    assert.matches("column 'ids' is a group (a list or map", r.err, 1, true)
    r = convert(q(dir .. '/a.parquet') .. ' -o ' .. q(dir .. '/o3') .. ' --column x=nothere:i64')
    assert.matches("has no top-level column 'nothere' (it has: label, ids)", r.err, 1, true)
  end)
end)

-- The issue's round trip, as a script sees it: `run -m wick.data.inspect DIR --records N --json` prints each
-- record's fields as the input held them (per-token values as lists, numbers, tensors nested by shape, a blob
-- as its size and, for an image, its format and size), from JSONL, from Parquet's Image struct and from tar.
describe('inspect --records --json after --column', function()
  local json = require 'wick.json'
  local dir
  before_each(function() dir = helper.tmpdir() end)
  after_each(function() helper.rmtree(dir) end)

  -- Python writes the inputs and, per record, the object inspect must print (expected.jsonl).
  local MAKE = [=[
import io, json, struct, sys, tarfile, zlib
out = sys.argv[1]
def png(w, h):
    chunk = lambda kind, data: struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))
    raw = b''.join(b'\x00' + b'\x7f' * (3 * w) for _ in range(h))
    return (b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', w, h, 8, 2, 0, 0, 0)) +
            chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b''))
def gif(w, h): return b'GIF89a' + struct.pack('<HH', w, h) + b'\x00\x00\x00;'
rows = [('a cat', [-100, -100, 3, 4, 5], 3, 0.5, [[1, 2], [3, 4]], png(5, 3), 'png', 5, 3),
        ('dog', [1, -100, 1], -7, -2.25, [[0, 0], [1, 1]], gif(640, 480), 'gif', 640, 480),
        ('', [], 9, 3.0, [[5, 6], [7, 8]], b'not an image', None, 0, 0)]
expected = []
with open(out + '/a.jsonl', 'w') as f, tarfile.open(out + '/a.tar', 'w') as t:
    for k, (text, labels, label, score, emb, blob, kind, w, h) in enumerate(rows):
        f.write(json.dumps({'text': text, 'labels': labels, 'label': label, 'score': score, 'emb': emb,
                            'image': blob.decode('latin-1')}) + '\n')
        for ext, data in (('txt', text.encode()), ('cls', str(label).encode()), ('png', blob)):
            info = tarfile.TarInfo('s/%04d.%s' % (k, ext)); info.size = len(data); t.addfile(info, io.BytesIO(data))
        image = {'bytes': len(blob)}
        if kind: image.update(format=kind, width=w, height=h)
        expected.append({'tokens': list(text.encode()), 'loss_mask': [0 if x == -100 else 1 for x in labels],
                         'label': label, 'score': score, 'emb': emb, 'image': image})
with open(out + '/expected.jsonl', 'w') as f:
    for e in expected: f.write(json.dumps(e) + '\n')
if len(sys.argv) > 2:
    import pyarrow as pa, pyarrow.parquet as pq
    image = pa.struct([('bytes', pa.binary()), ('path', pa.string())])
    pq.write_table(pa.table({'text': [r[0] for r in rows], 'label': pa.array([r[2] for r in rows], pa.int64()),
                             'score': pa.array([r[3] for r in rows], pa.float32()),
                             'image': pa.array([{'bytes': r[5], 'path': None} for r in rows], image)}),
                   out + '/a.parquet')
]=]

  local function make(with_parquet)
    helper.write_file(dir .. '/make.py', MAKE)
    local python = with_parquet and helper.TEST_PYTHON or 'python3'
    local r = helper.sh(('%s %s %s%s'):format(q(python), q(dir .. '/make.py'), q(dir), with_parquet and ' parquet' or ''))
    assert.are.equal(0, r.rc, r.err)
    local expected = {}
    for line in helper.read_file(dir .. '/expected.jsonl'):gmatch('[^\n]+') do expected[#expected + 1] = json.decode(line) end
    return expected
  end

  -- inspect's objects, each with only the keys `keys` (shard and record are where, not what).
  local function inspected(out, keys)
    local r = helper.run('-m wick.data.inspect ' .. q(out) .. ' --records 10 --json')
    assert.are.equal(0, r.rc, r.err)
    local got = {}
    for line in r.out:gmatch('[^\n]+') do
      local all, kept = json.decode(line), {}
      for _, k in ipairs(keys) do kept[k] = all[k] end
      got[#got + 1] = kept
    end
    return got
  end

  local function only(list, keys)
    local out = {}
    for i, e in ipairs(list) do
      out[i] = {}
      for _, k in ipairs(keys) do out[i][k] = e[k] end
    end
    return out
  end

  it('from JSONL: tokens, a mask, an i64, an f32, a tensor and a blob', function()
    local expected = make(false)
    local r = convert(q(dir .. '/a.jsonl') .. ' -o ' .. q(dir .. '/out') .. ' --column loss_mask=labels:mask ' ..
      '--column label=label:i64 --column score=score:f32 --column emb=emb:i64[2,2] --column image=image:bytes')
    assert.are.equal(0, r.rc, r.err)
    -- a JSON string's characters are the blob's bytes as UTF-8: the sizes are the UTF-8 ones
    local keys = { 'tokens', 'loss_mask', 'label', 'score', 'emb' }
    assert.are.same(only(expected, keys), inspected(dir .. '/out', keys))
  end)

  it('from tar: the text, .cls as a label, an image member', function()
    local expected = make(false)
    local r = convert(q(dir .. '/a.tar') .. ' -o ' .. q(dir .. '/out') .. ' --field txt --column label=cls:i64 ' ..
      '--column image=png:bytes')
    assert.are.equal(0, r.rc, r.err)
    local keys = { 'tokens', 'label', 'image' }
    assert.are.same(only(expected, keys), inspected(dir .. '/out', keys))
  end)

  it("from Parquet: the text, an i64, an f32 and Hugging Face's Image struct", function()
    local _, why = helper.test_python()
    if why then return pending('skipped: ' .. why) end
    local expected = make(true)
    local r = convert(q(dir .. '/a.parquet') .. ' -o ' .. q(dir .. '/out') .. ' --column label=label:i64 ' ..
      '--column score=score:f32 --column image=image:bytes')
    assert.are.equal(0, r.rc, r.err)
    local keys = { 'tokens', 'label', 'score', 'image' }
    assert.are.same(only(expected, keys), inspected(dir .. '/out', keys))
  end)
end)
