-- The tree tells the truth about itself: runtime/'s include graph follows the layering runtime/LAYERS
-- claims, lua/wick/'s requires follow its folders' layers, every document a comment cites is a file
-- of the checkout, and a test run leaves nothing in the checkout outside build/ (tests/busted.lua
-- applies clean_tree to every run; here it is shown to catch what it should).
local helper = require 'helper'
local layers = dofile(helper.ROOT .. '/tests/helpers/layers.lua')
local clean_tree = dofile(helper.ROOT .. '/tests/helpers/clean_tree.lua')
local q = helper.shell_quote

local function plant(root, files)
  for path, text in pairs(files) do
    assert(os.execute('mkdir -p ' .. q((root .. '/' .. path):match('^(.*)/'))) == 0)
    helper.write_file(root .. '/' .. path, text)
  end
end

describe('runtime/ layering', function()
  it('every #include of runtime/ reaches only its own folder, a lower one, or wick.h', function()
    assert.are.same({}, layers.violations(helper.ROOT .. '/runtime'))
  end)

  it('places every folder of runtime/ in LAYERS', function()
    local rank = layers.read_order(helper.ROOT .. '/runtime')
    for _, folder in ipairs({ 'core', 'io', 'format', 'dataset', 'loader', 'tokenizer', 'convert' }) do
      assert.is_not_nil(rank[folder], folder)
    end
    assert.is_true(rank.io < rank.format and rank.format < rank.dataset and rank.dataset < rank.loader)
  end)

  it('names a lower folder that includes an upper one, an escape from runtime/, and an unplaced folder', function()
    local dir = helper.tmpdir()
    plant(dir, {
      ['LAYERS'] = '# bottom up\ncore   the base\nio     bytes\n',
      ['wick.h'] = '',
      ['core/core.h'] = '#include "../wick.h"\n',
      ['core/hash.c'] = '#include "core.h"\n#include "../io/blob.h"\n',
      ['io/blob.h'] = '#include "../core/core.h"\n',
      ['io/remote/fetch.c'] = '#include "../../core/core.h"\n#include "../blob.h"\n#include "../../../x.h"\n',
      ['extra/x.c'] = '#include "../core/core.h"\n',
    })
    local found = layers.violations(dir)
    helper.rmtree(dir)
    assert.are.same({
      'core/hash.c:2 includes "../io/blob.h": io/ is above core/ in runtime/LAYERS',
      'io/remote/fetch.c:3 includes "../../../x.h", outside runtime/',
      'runtime/extra/ is not in runtime/LAYERS',
    }, found)
  end)
end)

-- Notes kept outside the repository, which a reader of the code cannot open.
local OUTSIDE_NOTES = { 'DESIGN §', 'DESIGN%.md', 'STYLE%.md' }

describe('cited documents', function()
  local files = helper.lines(helper.sh(('cd %s && git ls-files runtime lua tests README.md Makefile docs')
    :format(q(helper.ROOT))).out)

  it('are files of the checkout, under docs/ or runtime/', function()
    local missing = {}
    for _, file in ipairs(files) do
      if not file:match('^tests/fuzz/corpus/') and not file:match('%.safetensors$') then
        for cited in helper.read_file(helper.ROOT .. '/' .. file):gmatch('[%w_./-]+%.md') do
          local path = cited:match('^docs/.*') or cited:match('^runtime/.*')
          local f = path and io.open(helper.ROOT .. '/' .. path)
          if f then f:close() elseif path then missing[#missing + 1] = file .. ': ' .. path end
        end
      end
    end
    assert.are.same({}, missing)
  end)

  it('never include notes kept outside the repository', function()
    local found = {}
    for _, file in ipairs(files) do
      if file ~= 'tests/tree_spec.lua' then
        local text = helper.read_file(helper.ROOT .. '/' .. file)
        for _, pattern in ipairs(OUTSIDE_NOTES) do
          if text:find(pattern) then found[#found + 1] = file .. ': ' .. pattern end
        end
      end
    end
    assert.are.same({}, found)
  end)
end)

describe('a clean checkout after a run', function()
  it('reports the files a run added outside the ignored paths, and only those', function()
    local dir = helper.tmpdir()
    assert.are.equal(0, helper.sh('git init -q ' .. q(dir)).rc)
    plant(dir, { ['.gitignore'] = '/build/\n/checkpoints/\n', ['kept.txt'] = 'there before\n' })
    local before = clean_tree.untracked(dir)
    plant(dir, { ['build/cache/usage'] = 'x', ['rel/dir/v1/claims'] = '', ['kept.txt'] = 'changed\n',
      ['checkpoints/tiny/step-00000001/DONE'] = '1\n' })
    local added = clean_tree.added(before, clean_tree.untracked(dir))
    helper.rmtree(dir)
    -- checkpoints/ is ignored for a person's runs, never written by a test's
    assert.are.same({ 'checkpoints/tiny/step-00000001/DONE', 'rel/dir/v1/claims' }, added)
  end)

  it('has nothing to compare outside a git checkout', function()
    local dir = helper.tmpdir()
    local files = clean_tree.untracked(dir)
    helper.rmtree(dir)
    assert.is_nil(files)
  end)

  it('holds on a machine without PYTHONDONTWRITEBYTECODE: the runner sets it for every Python a spec starts', function()
    local dir = helper.tmpdir()
    helper.write_file(dir .. '/oracle.py', 'X = 1\n')
    helper.write_file(dir .. '/python_spec.lua', ([[
      it('imports a module', function()
        assert.are.equal(0, os.execute("cd '%s' && python3 -c 'import oracle'"))
      end)]]):format(dir))
    local r = helper.sh(('cd %s && env -u PYTHONDONTWRITEBYTECODE %s tests/busted.lua %s')
      :format(q(helper.ROOT), q(helper.RUN), q(dir .. '/python_spec.lua')))
    local cache = helper.sh('ls ' .. q(dir .. '/__pycache__')).rc
    helper.rmtree(dir)
    assert.are.equal(0, r.rc, r.out .. r.err)
    assert.are_not.equal(0, cache, 'python wrote ' .. dir .. '/__pycache__')
  end)
end)

describe('the Lua modules', function()
  local function tracked(paths)
    return helper.lines(helper.sh(('cd %s && git ls-files %s'):format(q(helper.ROOT), paths)).out)
  end

  -- lua/wick/a/b.lua -> wick.a.b; a folder's init.lua is the folder's module.
  local function module_names()
    local names = {}
    for _, file in ipairs(tracked('lua')) do
      local path = file:match('^lua/(.*)%.lua$')
      if path then names[#names + 1] = (path:gsub('/init$', ''):gsub('/', '.')) end
    end
    return names
  end

  it('each load under the name their file gives them, quietly', function()
    local names = module_names()
    assert.is_true(#names > 30, #names .. ' modules')
    local code = ("for _, name in ipairs { '%s' } do require(name) end"):format(table.concat(names, "', '"))
    local r = helper.run('-e ' .. q(code))
    assert.are.equal(0, r.rc, r.err)
    assert.are.equal('', r.err) -- a module that requires a renamed one would warn here
  end)

  -- lua/wick/'s layers, bottom up: its top (the bindings and tools every subsystem shares) is 0.
  -- A module requires only modules of its own folder or of a lower layer. main.lua (the entry of
  -- `run`), init.lua (the lazy fields of `require 'wick'`), renamed.lua (aliases), generate.lua
  -- (`run -m wick.generate`, a tool joining a model of nn to a tokenizer of data) and docs.lua (`run -m
  -- wick.docs`, the reference pages of every layer's options) stand above.
  local LAYER = { data = 1, nn = 1, recipe = 2, train = 3 }
  local ABOVE = { ['lua/wick/main.lua'] = true, ['lua/wick/init.lua'] = true, ['lua/wick/renamed.lua'] = true,
    ['lua/wick/generate.lua'] = true, ['lua/wick/docs.lua'] = true }

  local function layer_of(name) -- wick.data.dataset -> data's layer; wick.tensor -> 0
    local folder = name:match('^wick%.([%w_]+)%.') or name:match('^wick%.([%w_]+)$')
    return LAYER[folder] or 0, LAYER[folder] and folder or 'the top'
  end

  it('require only their own folder or a lower layer', function()
    local found = {}
    for _, file in ipairs(tracked('lua')) do
      local path = file:match('^lua/(.*)%.lua$')
      if path and not ABOVE[file] then
        local own, own_folder = layer_of((path:gsub('/init$', ''):gsub('/', '.')))
        for name in helper.read_file(helper.ROOT .. '/' .. file):gmatch("require%s*%(?%s*['\"](wick%.[%w_.]+)['\"]") do
          local theirs, folder = layer_of(name)
          if theirs > own or (theirs == own and own > 0 and folder ~= own_folder) then
            found[#found + 1] = ('%s requires %s (%s is not below %s)'):format(file, name, folder, own_folder)
          end
        end
      end
    end
    assert.are.same({}, found)
  end)

  it('are never named by the old names wick.renamed keeps for one release', function()
    local found = {}
    for _, file in ipairs(tracked('lua tests recipes docs README.md Makefile')) do
      if file ~= 'lua/wick/renamed.lua' and file ~= 'tests/host/cli_spec.lua' and not file:match('^tests/fuzz/corpus/')
          and not file:match('%.safetensors$') then
        local text = helper.read_file(helper.ROOT .. '/' .. file)
        for old in pairs(require('wick.renamed').NEW_NAME) do
          local pattern = old:gsub('%.', '%%.')
          if text:find("require%s*%(?%s*['\"]" .. pattern .. "['\"]") or text:find('%-m ' .. pattern .. '%f[^%w_.]') then
            found[#found + 1] = file .. ': ' .. old
          end
        end
      end
    end
    table.sort(found)
    assert.are.same({}, found)
  end)
end)
