-- A user's mistake is one line: exit 2 for usage, exit 1 for data, no Lua traceback; and the dry
-- run refuses what the run itself would refuse at its start. Every case is a real `run` process on
-- a real converted dataset.
local helper = require 'helper'
local data_helper = require 'data_helper'
local q = helper.shell_quote

-- One line on stderr naming `text`, nothing of Lua's internals, exit `rc`.
local function assert_one_line(r, rc, text)
  assert.are.equal(rc, r.rc, r.out .. r.err)
  assert.are.equal(1, #helper.lines(r.err), r.err)
  assert.matches(text, r.err, 1, true)
  assert.is_nil(r.err:find('traceback', 1, true), r.err)
  assert.is_nil(r.err:find('%.lua:%d+'), r.err)
end

-- The REPL's errors: each `text` on a line of its own, no traceback, no frame of wick's own files.
local function assert_repl_lines(r, texts)
  for _, text in ipairs(texts) do assert.matches('\n' .. text .. '\n', '\n' .. r.err, 1, true) end
  assert.are.equal(#texts, #helper.lines(r.err), r.err)
  assert.is_nil(r.err:find('traceback', 1, true), r.err)
  assert.is_nil(r.err:find('wick/', 1, true), r.err)
end

describe('user errors', function()
  local root, dataset, recipe
  setup(function()
    root = helper.tmpdir()
    dataset = data_helper.make_dataset(root .. '/data', data_helper.documents(200, 40, 5), { shard_size = 4096 })
    recipe = helper.write_file(root .. '/recipe.lua', ([[
return {
  model = { layers = 1, heads = 2, dim = 16 },
  data = { sources = { %q }, seq_len = 32 },
  batch = { global = 8, micro = 2 },
  steps = 4, seed = 3, timeout = 30,
}
]]):format(dataset))
  end)
  teardown(function() helper.rmtree(root) end)

  it('a diverged loss (--optim.lr=1e30) is one line naming the step and the lr, on every rank (exit 1)', function()
    local r = helper.run(q(recipe) .. ' --optim.lr=1e30')
    assert_one_line(r, 1, 'optim.adamw: gradient norm is nan at step 2, lr ')
    local two = helper.run('--nproc-per-node 2 ' .. q(recipe) .. ' --optim.lr=1e30')
    assert.are.equal(1, two.rc, two.err)
    assert.matches('[rank1] optim.adamw: gradient norm is nan at step 2', two.out .. two.err, 1, true)
    assert.is_nil((two.out .. two.err):find('traceback', 1, true), two.err)
  end)

  it("the REPL's helpers refuse bad arguments in one line at the typed line: stats(nil), set_lr, set_mix", function()
    local built = helper.run('-i ' .. q(recipe), { stdin = 'stats(nil)\nx = stats(3)\nprint("still here")\n' })
    assert.are.equal(1, built.rc)
    assert.matches('still here', built.out, 1, true)
    assert_repl_lines(built, { 'stdin:1: stats(t): t must be a tensor, got nil',
      'stdin:2: stats(t): t must be a tensor, got number' })
    local paused = helper.run(q(recipe) .. ' --steps=2 --repl-at=1', { stdin =
      'set_lr(-1)\nset_mix(3)\nset_mix{ nosuch = 1 }\nset_mix{ data = 1 / 0 }\ncontinue()\n' })
    assert.are.equal(0, paused.rc, paused.err)
    assert.matches('step 2/2', paused.out, 1, true)
    assert_repl_lines(paused, { 'stdin:1: set_lr(scale): scale must be a finite number >= 0, got -1',
      'stdin:2: set_mix{ name = weight, ... } takes a table, got number', 'stdin:3: set_mix: no source is named nosuch',
      'stdin:4: set_mix: data must be a finite number >= 0, got inf' })
  end)
end)
