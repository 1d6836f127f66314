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
