-- wick.schema's types read their values from text (schema.parse), which is how a command line's
-- --key=value becomes a value for recipes (wick.recipe) and tools (wick.cli) alike.
local schema = require 'wick.schema'

describe('schema.parse', function()
  it('reads each built-in type from its text, unchecked', function()
    assert.are.equal(12, schema.parse({ 'n', 'integer' }, '12'))
    assert.are.equal(1.5, schema.parse({ 'n', 'integer' }, '1.5')) -- the check that follows refuses it
    assert.are.equal(0.25, schema.parse({ 'x', 'number' }, '0.25'))
    assert.is_true(schema.parse({ 'b', 'boolean' }, 'true'))
    assert.is_false(schema.parse({ 'b', 'boolean' }, 'false'))
    assert.are.equal('packed', schema.parse({ 'mode', 'enum', values = { 'packed' } }, 'packed'))
    assert.are.equal('a b', schema.parse({ 's', 'string' }, 'a b'))
    assert.are.equal('18446744073709551615', schema.parse({ 'seed', 'uint64' }, '18446744073709551615'))
  end)

  it('says which text its type cannot read', function()
    assert.are.same({ nil, "cannot read 'ten' as integer" }, { schema.parse({ 'n', 'integer' }, 'ten') })
    assert.are.same({ nil, "cannot read 'yes' as boolean" }, { schema.parse({ 'b', 'boolean' }, 'yes') })
  end)

  it('takes the first of several types that reads the text', function()
    local eos = { 'eos', types = { 'integer', 'string' } }
    assert.are.equal(7, schema.parse(eos, '7'))
    assert.are.equal('<|endoftext|>', schema.parse(eos, '<|endoftext|>'))
    local shuffle = { 'shuffle', 'shuffle', types = { 'boolean', 'table' } }
    assert.is_true(schema.parse(shuffle, 'true'))
    assert.are.same({ nil, "cannot read 'x' as shuffle" }, { schema.parse(shuffle, 'x') })
  end)

  it("uses a type of an option's own reader, or the one it borrows by name", function()
    local lr = { 'lr', 'lr', check = function() return true end, parse = 'number' }
    assert.are.equal(0.01, schema.parse(lr, '0.01'))
    local pair = { 'pair', 'pair', check = function() return true end, parse = function(text)
      local a, b = text:match('^(%d+),(%d+)$')
      return a and { tonumber(a), tonumber(b) }
    end }
    assert.are.same({ 3, 4 }, schema.parse(pair, '3,4'))
    assert.are.same({ nil, "cannot read '3' as pair" }, { schema.parse(pair, '3') })
  end)

  it('refuses text for a type that has no reader', function()
    assert.are.same({ nil, 'cannot be set from the command line (set it in the recipe)' },
      { schema.parse({ 'fn', 'function' }, 'print') })
    assert.are.same({ nil, 'cannot be set from the command line (set it in the recipe)' },
      { schema.parse({ 'cb', 'callbacks', check = function() return true end }, 'x') })
  end)
end)

-- A renamed option keeps its old spelling for one release: read as the new name wherever options
-- enter (a table, a recipe's tree, a --path=value override, a tool's --flag), with one warning.
describe('a renamed option (alias)', function()
  local helper = require 'helper'
  local q = helper.shell_quote

  local function renamed_set()
    return schema.define('test option', {
      { 'node_cache_bytes', 'integer', min = 0, max = 100, alias = 'cache_bytes' },
      { 'seq_len', 'integer', min = 1, max = 10 },
    })
  end

  it('reads the old name as the new one and refuses both together', function()
    local set = renamed_set()
    assert.are.same({ node_cache_bytes = 7 }, set:check({ cache_bytes = 7 }))
    assert.are.same({ node_cache_bytes = 7 }, (set:check_tree({ cache_bytes = 7 }, 'data')))
    local option, path = set:find('cache_bytes')
    assert.are.equal('node_cache_bytes', option[1])
    assert.are.equal('node_cache_bytes', path)
    assert.has_error(function() set:check({ cache_bytes = 7, node_cache_bytes = 8 }) end,
      'test options: both node_cache_bytes and its old name cache_bytes are given')
    assert.are.same({ nil, 'data: both node_cache_bytes and its old name cache_bytes are given' },
      { set:check_tree({ cache_bytes = 7, node_cache_bytes = 8 }, 'data') })
    assert.has_error(function() set:check({ cache_bytes = 101 }) end, 'test option node_cache_bytes = 101 must be within [0, 100]')
    assert.has_error(function() set:check({ node_cache_byts = 1 }) end,
      "unknown test option 'node_cache_byts' (did you mean 'node_cache_bytes'?)")
  end)

  it("warns once per process, naming both, in data.loader{}, a recipe's override and a tool's flag", function()
    local dir = helper.tmpdir()
    local data_helper = require 'helpers.data'
    local ds = data_helper.make_dataset(dir .. '/ds', data_helper.documents(200, 40, 3), { shard_size = 4096 })
    local script = helper.write_file(dir .. '/old.lua', ([[
      local data = require 'wick.data'
      for _ = 1, 2 do
        local l = data.loader { data = %q, seq_len = 16, global_batch = 4, cache_bytes = 2 ^ 20,
                                shuffle = { buffer_tokens = 4096 } }
        print(l:next().rows)
        l:close()
      end
    ]]):format(ds))
    local r = helper.run(q(script))
    assert.are.equal(0, r.rc, r.err)
    assert.are.equal('4\n4\n', r.out)
    local _, cache_warnings = r.err:gsub("'cache_bytes' is now 'node_cache_bytes'", '')
    local _, pool_warnings = r.err:gsub("'buffer_tokens' is now 'pool_tokens'", '')
    assert.are.same({ 1, 1 }, { cache_warnings, pool_warnings }, r.err)

    local recipe = ('%s/recipes/tiny.lua --data.sources=%s --steps=1 --log.sample=0 --dry-run'):format(helper.ROOT, q(ds))
    local old, new = helper.run(recipe .. ' --data.cache_bytes=65536'), helper.run(recipe .. ' --data.node_cache_bytes=65536')
    assert.are_not.equal(0, new.rc) -- the same refusal by either name: 64 KiB holds too few pools
    assert.are.same({ new.rc, new.err }, { old.rc, (old.err:gsub("[^\n]*'cache_bytes' is now[^\n]*\n", '')) })
    assert.matches("data: 'cache_bytes' is now 'node_cache_bytes'", old.err, 1, true)

    local inspect = ('-m wick.data.inspect --data %s --seq-len 16 --global-batch 4 --steps 1 '):format(q(ds))
    local flag_old, flag_new = helper.run(inspect .. '--buffer-tokens 4096'), helper.run(inspect .. '--pool-tokens 4096')
    assert.are.equal(0, flag_new.rc, flag_new.err)
    assert.are.same({ 0, flag_new.out }, { flag_old.rc, flag_old.out })
    assert.matches("'--buffer-tokens' is now '--pool-tokens'", flag_old.err, 1, true)
    helper.rmtree(dir)
  end)
end)
