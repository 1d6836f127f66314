-- The recipe's data section reaches the loader whole: train.loader_options passes every field of the
-- section (recipe.SCHEMA) except the sources and their mix, so a field added to the schema arrives at
-- the loader, or is refused by it by name, and is never silently ignored.
local helper = require 'helper'
local data_helper = require 'helpers.data'
local wick = require 'wick'
local recipe = require 'wick.recipe'
local schema = require 'wick.schema'
local train = require 'wick.train'

local DATA = recipe.SCHEMA:option('data').schema

-- Adds an option to the data section for the duration of fn.
local function with_field(option, fn)
  DATA.options[#DATA.options + 1] = option
  DATA.by_name[option[1]] = option
  DATA.names[#DATA.names + 1] = option[1]
  local ok, err = pcall(fn)
  DATA.options[#DATA.options], DATA.by_name[option[1]], DATA.names[#DATA.names] = nil, nil, nil
  if not ok then error(err, 0) end
end

describe('the data section and the loader', function()
  local root, corpus
  setup(function()
    root = helper.tmpdir()
    corpus = data_helper.make_dataset(root .. '/corpus', data_helper.documents(40, 10, 3), { shard_size = 1024 })
  end)
  teardown(function() helper.rmtree(root) end)

  local function options(data)
    local config = { data = DATA:check(data), batch = { global = 4 }, seed = 7 }
    return train.loader_options(config, 1, 0, 4, 10)
  end

  it('passes every field of the section but the sources and their mix', function()
    local o = options({ sources = { corpus }, seq_len = 16, threads = 1, on_corrupt = 'skip' })
    for _, name in ipairs(DATA.names) do
      if name ~= 'sources' and name ~= 'mix' then
        assert.are.equal(DATA:check({ sources = { corpus }, seq_len = 16, threads = 1, on_corrupt = 'skip' })[name],
          o[name], name)
      end
    end
    assert.are.equal(16, o.seq_len)
    assert.are.equal(1, o.threads)
    assert.are.equal('skip', o.on_corrupt)
    assert.is_nil(o.sources)
    assert.is_nil(o.mix)
  end)

  it('hands a field added to the schema to the loader', function()
    with_field(schema.from(wick.data.LOADER_OPTIONS, 'document_ids'), function()
      local o = options({ sources = { corpus }, seq_len = 16, threads = 1, document_ids = true })
      assert.is_true(o.document_ids)
      local loader = wick.data.loader(o)
      assert.is_true(loader.options.document_ids)
      loader:close()
    end)
  end)

  it('has the loader refuse, by name, a field added to the schema that it does not know', function()
    with_field({ 'colour', 'string', help = 'no loader option' }, function()
      local o = options({ sources = { corpus }, seq_len = 16, threads = 1, colour = 'blue' })
      assert.are.equal('blue', o.colour)
      local ok, err = pcall(wick.data.loader, o)
      assert.is_false(ok)
      assert.matches("unknown loader option 'colour'", tostring(err))
    end)
  end)
end)
