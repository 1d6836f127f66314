-- wick.recipe's pieces in Lua, without a run: a source entry's shape, the run's flags
-- (wick.recipe.args) and the dataset paths a recipe reads. What a whole run makes of them is in
-- tests/train/trainer_spec.lua and tests/host/user_errors_spec.lua.
local recipe = require 'wick.recipe'
local args = require 'wick.recipe.args'

-- A small valid recipe around `data`.
local function with_data(data)
  return { model = { layers = 1, heads = 1, dim = 8 }, data = data, batch = { global = 2 }, steps = 1 }
end

-- The user error recipe.check raises, as its one line.
local function refusal(raw)
  local ok, err = pcall(recipe.check, raw, 'r.lua')
  assert.is_false(ok)
  return tostring(err)
end

describe('a source entry', function()
  it('is a path, or a table of its path and the keys the source schema declares', function()
    local config = recipe.check(with_data({ sources = { 'a', { 'b/index.json', name = 'web', epochs = 2 } } }), 'r.lua')
    assert.are.same({ 'a', 'b/index.json' }, recipe.dataset_paths(config))
    assert.are.equal('web', recipe.source_name(config.data.sources[2]))
    assert.are.equal('a', recipe.source_name('a'))
    assert.are.same({ 'c' }, recipe.check(with_data({ sources = 'c' }), 'r.lua').data.sources)
  end)

  it('has its keys checked by name, with the nearest one for a typo', function()
    assert.matches('sources[2].nmae: unknown key (did you mean sources[2].name?)',
      refusal(with_data({ sources = { 'a', { 'b', nmae = 'x' } } })), 1, true)
    assert.matches('sources[1].epochs = -1: must be within [0, ',
      refusal(with_data({ sources = { { 'a', epochs = -1 } } })), 1, true)
    assert.matches('sources[1].epochs = 1.5: must be a whole number',
      refusal(with_data({ sources = { { 'a', epochs = 1.5 } } })), 1, true)
    assert.matches('sources[1].name = "1x": must be an identifier',
      refusal(with_data({ sources = { { 'a', name = '1x' } } })), 1, true)
    assert.matches('source 1 needs a path', refusal(with_data({ sources = { { name = 'x' } } })), 1, true)
  end)

  it("takes data.columns as a list of distinct column names, from a table or a flag's comma list", function()
    local config = recipe.check(with_data({ sources = 'a', columns = { 'loss_mask', 'label' } }), 'r.lua')
    assert.are.same({ 'loss_mask', 'label' }, config.data.columns)
    assert.matches('data.columns = {...}: names column label twice',
      refusal(with_data({ sources = 'a', columns = { 'label', 'label' } })), 1, true)
    assert.matches('item 1 must be a column name', refusal(with_data({ sources = 'a', columns = { '1x' } })), 1, true)
    local option = recipe.SCHEMA:option('data').schema:option('columns')
    assert.are.same({ 'loss_mask', 'label' }, option.parse('loss_mask,label'))
  end)

  it('puts the eval source last among the datasets a recipe reads', function()
    local raw = with_data({ sources = { 'a', 'b' } })
    raw.eval = { source = 'held-out', every = 1 }
    assert.are.same({ 'a', 'b', 'held-out' }, recipe.dataset_paths(recipe.check(raw, 'r.lua')))
  end)
end)

describe("the run's flags", function()
  it('are told from overrides and read by their declarations', function()
    local flags, overrides = args.parse(recipe.FLAGS, 'r.lua',
      { '--repl-at=3', '--resume', '--steps', '4', '--log', 'l.jsonl', '--data.seq-len=8' })
    assert.are.same({ repl_at = 3, resume = true, log = 'l.jsonl' }, flags)
    assert.are.same({ { 'steps', '4' }, { 'data.seq_len', '8' } }, overrides)
  end)

  it('refuse a value that is not of their type, in one line naming the flag', function()
    for word, message in pairs {
      ['--repl-at=0'] = "--repl-at needs a step number >= 1, got '0'",
      ['--repl-at=2.5'] = "--repl-at needs a step number >= 1, got '2.5'",
      ['--repl-at=x'] = "--repl-at needs a step number >= 1, got 'x'",
      ['--dry-run=1'] = '--dry-run takes no value',
      ['--log'] = '--log needs a value',
      ['steps=1'] = "unexpected argument 'steps=1' (overrides are --key=value)",
    } do
      local ok, err = pcall(args.parse, recipe.FLAGS, 'r.lua', { word })
      assert.is_false(ok, word)
      assert.matches('^r.lua: ' .. message:gsub('%p', '%%%0') .. ' %(see run r.lua %-%-help%)$', tostring(err))
    end
  end)

  it('write the usage line from their declarations', function()
    assert.are.equal('[--resume] [--log=FILE] [--dry-run] [--repl-at=STEP]', args.usage(recipe.FLAGS))
  end)
end)
