-- wick.safetensors: round trips of every supported dtype, header checks, and a file written by hand
-- to the format's specification (so the reader is not only tested against its own writer).
local helper = require 'helper'
local wick = require 'wick'
local T = wick.tensor
local st = wick.safetensors

describe('safetensors', function()
  local dir
  before_each(function() dir = helper.tmpdir() end)
  after_each(function() helper.rmtree(dir) end)

  it('round-trips every dtype, shape and metadata', function()
    local tensors = {}
    for _, dtype in ipairs({ 'f32', 'bf16', 'f16', 'i32', 'i64', 'u16', 'u8' }) do
      tensors['t.' .. dtype] = T.new({ { 1, 2, 3 }, { 4, 5, 6 } }, dtype)
    end
    tensors.scalar_like = T.new({ 7.5 })
    tensors.strided = T.new({ { 1, 2 }, { 3, 4 } }):narrow(2, 2, 1)
    st.save(dir .. '/a.safetensors', tensors, { format = 'pt', note = 'quote " and \\ ok' })
    local loaded, metadata = st.load(dir .. '/a.safetensors')
    assert.are.same({ format = 'pt', note = 'quote " and \\ ok' }, metadata)
    for name, t in pairs(tensors) do
      assert.are.equal(t.dtype, loaded[name].dtype)
      assert.are.same(t.shape, loaded[name].shape)
      assert.are.same(t:totable(), loaded[name]:totable())
    end
  end)

  it('views tensors where they lie in the mapped file, and copies one whose offset is unaligned', function()
    -- Names are written in sorted order: 'a' (3 bytes, viewed in place) puts 'b' (f32) at data offset 3
    -- and 'c' (bf16) at 19, both unaligned.
    st.save(dir .. '/v.safetensors', { a = T.new({ 1, 2, 3 }, 'u8'), b = T.new({ { 1.5, -2 }, { 3, 4.25 } }),
      c = T.new({ 7, 8 }, 'bf16') })
    local reader = assert(st.open(dir .. '/v.safetensors'))
    assert.are.same({ dtype = 'f32', shape = { 2, 2 } }, reader.entries.b)
    for name, expected in pairs({ a = { 1, 2, 3 }, b = { { 1.5, -2 }, { 3, 4.25 } }, c = { 7, 8 } }) do
      local view = reader:view(name)
      assert.are.same(expected, view:totable())
      view:free()
    end
    local bf16 = reader:view('c')
    assert.are.same({ 7, 8 }, T.empty({ 2 }):copy(bf16):totable())  -- converted straight from the view
    bf16:free()
    assert.has_error(function() reader:view('d') end, dir .. "/v.safetensors: no tensor 'd'")
    reader:close()
    assert.has_error(function() reader:view('a') end)
    local missing, err = st.open(dir .. '/none.safetensors')
    assert.is_nil(missing)
    assert.matches('none.safetensors', err, 1, true)
  end)

  it('gives each tensor\'s dtype and shape and the metadata from the header', function()
    local path = dir .. '/h.safetensors'
    st.save(path, { a = T.new({ { 1, 2, 3 }, { 4, 5, 6 } }, 'i32'), b = T.new({ 1.5 }, 'bf16') }, { step = 4 })
    local header, metadata = st.header(path)
    assert.are.same({ a = { dtype = 'i32', shape = { 2, 3 } }, b = { dtype = 'bf16', shape = { 1 } } }, header)
    assert.are.same({ step = '4' }, metadata)
    local missing, why = st.header(dir .. '/none.safetensors')
    assert.is_nil(missing)
    assert.matches(dir .. '/none.safetensors', why, 1, true)
  end)

  it('reads a file laid out by the specification', function()
    local header = '{"b":{"dtype":"I32","shape":[2],"data_offsets":[4,12]},"a":{"dtype":"F32","shape":[],"data_offsets":[0,4]}}'
    local bytes = string.char(#header, 0, 0, 0, 0, 0, 0, 0) .. header
        .. string.char(0, 0, 0x80, 0x3f) .. string.char(5, 0, 0, 0, 0xff, 0xff, 0xff, 0xff)
    helper.write_file(dir .. '/spec.safetensors', bytes)
    local loaded = assert(st.load(dir .. '/spec.safetensors'))
    assert.are.same({}, loaded.a.shape)
    assert.are.equal(1, loaded.a:totable())
    assert.are.same({ 5, -1 }, loaded.b:totable())
  end)

  it('pads the header to 8 bytes as the format requires', function()
    st.save(dir .. '/p.safetensors', { x = T.new({ 1 }) })
    local data = helper.read_file(dir .. '/p.safetensors')
    local size = data:byte(1) + 256 * data:byte(2)
    assert.are.equal(0, size % 8)
    assert.are.equal(8 + size + 4, #data)
  end)

  it('reports truncated, foreign and missing files by name', function()
    st.save(dir .. '/t.safetensors', { x = T.zeros({ 100 }) })
    local data = helper.read_file(dir .. '/t.safetensors')
    helper.write_file(dir .. '/cut.safetensors', data:sub(1, #data - 10))
    local ok, err = st.load(dir .. '/cut.safetensors')
    assert.is_nil(ok)
    assert.matches("cut.safetensors: tensor 'x' %[100%] F32 needs 400 bytes", err)
    helper.write_file(dir .. '/junk.safetensors', 'hello world, not a tensor file')
    ok, err = st.load(dir .. '/junk.safetensors')
    assert.matches('not a safetensors file', err)
    ok, err = st.load(dir .. '/nope.safetensors')
    assert.matches('No such file', err)
    local f64 = '{"x":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}'
    helper.write_file(dir .. '/f64.safetensors', string.char(#f64, 0, 0, 0, 0, 0, 0, 0) .. f64 .. ('\0'):rep(8))
    ok, err = st.load(dir .. '/f64.safetensors')
    assert.matches("tensor 'x' has dtype F64", err)
  end)

  it('refuses a FIFO or a directory by name instead of waiting for a writer', function()
    local pipe = dir .. '/pipe.safetensors'
    assert.are.equal(0, helper.sh('mkfifo ' .. helper.shell_quote(pipe)).rc)
    -- In a child under a timeout: a regression hangs there and fails here.
    local code = ('local ok, err = require("wick").safetensors.load(%q) io.write(tostring(err))'):format(pipe)
    local r = helper.sh(('timeout 20 %s -e %s'):format(helper.shell_quote(helper.RUN), helper.shell_quote(code)))
    assert.are.equal(0, r.rc, 'timed out or failed: ' .. r.err)
    assert.matches("'" .. pipe .. "' is a FIFO (named pipe), not a regular file (checkpoints", r.out, 1, true)
    local ok, err = st.load(dir)
    assert.is_nil(ok)
    assert.matches('is a directory, not a regular file', err, 1, true)
  end)

  it('decodes JSON escapes in names and metadata, and rejects malformed headers by file name', function()
    local header = '{"__metadata__":{"k\\u00e9":"v\\n"},"b\\n\\"q":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'
    header = header .. string.rep(' ', (8 - #header % 8) % 8)
    helper.write_file(dir .. '/esc.safetensors', string.char(#header, 0, 0, 0, 0, 0, 0, 0) .. header .. '\7')
    local loaded, metadata = assert(st.load(dir .. '/esc.safetensors'))
    assert.are.same({ ['k\195\169'] = 'v\n' }, metadata)
    assert.are.same({ 7 }, loaded['b\n"q']:totable())
    for name, bad in pairs { comma = '{"a": 1,}', duplicate = '{"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},' ..
        '"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', offsets = '{"x":{"dtype":"U8","shape":[2],"data_offsets":[0,1]}}' } do
      helper.write_file(dir .. '/' .. name, string.char(#bad, 0, 0, 0, 0, 0, 0, 0) .. bad .. '\0\0')
      local ok, err = st.load(dir .. '/' .. name)
      assert.is_nil(ok, name)
      assert.matches(name, err, 1, true)
    end
  end)

  -- create + write_at: one file whose parts several processes write (a sharded checkpoint's ranks);
  -- the data lies in the given order, so a part of a tensor is written at its own offset.
  it('creates a file for tensors laid out in a given order, and writes their parts at their offsets', function()
    local path = dir .. '/parts.safetensors'
    local a, b = T.new({ { 1, 2, 3 }, { 4, 5, 6 } }), T.new({ 7, 8 })
    local offsets = st.create(path, { 'b', 'a' }, { a = { 2, 3 }, b = { 2 } }, 'f32', { format = 'pt' })
    assert.are.same({ b = 0, a = 8 }, offsets)
    local header, metadata = st.header(path)
    assert.are.same({ dtype = 'f32', shape = { 2, 3 } }, { dtype = header.a.dtype, shape = header.a.shape })
    assert.are.equal('pt', metadata.format)
    local flat = a:view({ 6 })
    local second, first = flat:narrow(1, 4, 3), flat:narrow(1, 1, 3)
    st.write_at(path, offsets.a + 3 * 4, second)  -- the second half first: any order
    st.write_at(path, offsets.b, b)
    st.write_at(path, offsets.a, first)
    local back = st.load(path)
    assert.are.same(a:totable(), back.a:totable())
    assert.are.same(b:totable(), back.b:totable())
    assert.has_error(function() st.write_at(path, offsets.a + 20, b) end,
      "safetensors write '" .. path .. "': 8 bytes at data offset 28 run past its end")
    assert.has_error(function() st.create(path, { 'a' }, { a = { 2, 3 } }, 'f64') end, "safetensors.create: unknown dtype 'f64'")
    assert.has_error(function() st.create(path, { 'a', 'c' }, { a = { 2, 3 } }, 'f32') end, "safetensors.create: 'c' has no shape")
    -- a link planted where a part goes is refused, and what it points at is left alone
    local target, link = dir .. '/target.txt', dir .. '/planted.safetensors'
    helper.write_file(target, 'keep')
    assert(os.execute(('ln -s %s %s'):format(target, link)) == 0)
    assert.has_error(function() st.create(link, { 'a' }, { a = { 2 } }, 'f32') end)
    assert.has_error(function() st.write_at(link, 0, b) end)
    assert.are.equal('keep', helper.read_file(target))
  end)

  it('writes a name that needs escaping and reads it back', function()
    st.save(dir .. '/n.safetensors', { ['quote"back\\slash\tand tab'] = T.new({ 1, 2 }, 'i32') }, { ['m"'] = 'x\\y' })
    local loaded, metadata = assert(st.load(dir .. '/n.safetensors'))
    assert.are.same({ 1, 2 }, loaded['quote"back\\slash\tand tab']:totable())
    assert.are.same({ ['m"'] = 'x\\y' }, metadata)
  end)
end)
