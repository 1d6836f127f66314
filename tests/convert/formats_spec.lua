-- The converter's input formats are listed once (runtime/convert/convert.h, CONVERT_INPUTS): a file's
-- name picks its reader from that table, `run -m wick.data.convert --help` prints it, and docs/data.md's copy of
-- the list must read the same.
local helper = require 'helper'
local corpus = require 'helpers.corpus'
local shard = require 'wick.data.convert'
local dataset = require 'wick.data.dataset'
local core = require 'wick.core'
local ffi, C = core.ffi, core.C
local q = helper.shell_quote

-- The formats as { names = '*.jsonl, *.ndjson', reads = '...' }, from C.
local function formats()
  local list, reads = {}, ffi.new('const char *[1]')
  while true do
    local names = C.wk_converter_input_format(#list, reads)
    if names == nil then return list end
    list[#list + 1] = { names = ffi.string(names), reads = ffi.string(reads[0]) }
  end
end

describe("the converter's input formats", function()
  local root
  setup(function() root = helper.tmpdir() end)
  teardown(function() helper.rmtree(root) end)

  it('are what --help lists and what docs/data.md lists, word for word', function()
    local list = formats()
    assert.are.equal('anything else', list[#list].names) -- text takes the rest, so it comes last
    local text = shard.input_formats()
    for _, f in ipairs(list) do assert.truthy(text:find(f.names, 1, true), f.names) end
    local help = helper.run('-m wick.data.convert --help')
    assert.are.equal(0, help.rc, help.err)
    assert.truthy((help.out .. help.err):find(text, 1, true), 'the --help text')
    local guide = helper.read_file(helper.ROOT .. '/docs/data.md')
    local section = guide:match('\n## Converting\n(.-)\n## ')
    assert.truthy(section, 'docs/data.md has no "## Converting" section')
    local block = section:match('```text\n(.-)\n```')
    assert.are.equal(text, block, 'docs/data.md\'s list of input formats (from ./run -m wick.data.convert --help)')
  end)

  it('choose the reader by every name they list', function()
    local doc = '{"text": "hello formats"}\n'
    local files = { ['in/a.ndjson'] = doc, ['in/b.jsonl'] = doc, ['in/c.txt'] = 'hello formats' }
    corpus.tree(root, files)
    local r = corpus.convert(q(root .. '/in') .. ' -o ' .. q(root .. '/out') .. ' -q')
    assert.are.equal(0, r.rc, r.err)
    local ds = assert(dataset.open(root .. '/out'))
    local texts = corpus.documents(ds)
    ds:close()
    assert.are.same({ 'hello formats', 'hello formats', 'hello formats' }, texts)
  end)
end)
