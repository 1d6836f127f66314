-- The README and the guides in docs/ say what a user types, and it works: every line of their ```sh
-- blocks runs as written, in order, each file in a fresh copy of the checkout (tests/helpers/docs.lua:
-- the files and the build, none of the data an earlier command or file made) with a HOME of its own.
-- Commands a test machine cannot run are skipped, and commands run with a change, each named here
-- with the reason. Every link resolves; the README stays short; the reference pages in
-- docs/reference/ are what `./run -m wick.docs` generates from the schemas today.
local helper = require 'helper'
local docs = require 'helpers.docs'
local q = helper.shell_quote

local README_LINES = 300

-- Per file, in the order they run: the lines skipped and the lines rewritten, each with its reason.
-- A skip or a rewrite that no line matches is an error, so the lists cannot go stale.
local FILES = {
  {
    'README.md',
    skipped = {
      { '^make test$', 'runs this suite: it would run itself' },
    },
    rewritten = {
      { '^make demo$', 'make demo DEMO_ARGS=--steps=30', 'the default job trains for minutes; 30 steps prove it runs' },
    },
  },
  {
    'docs/data.md',
    skipped = {
      -- tests/io/remote_spec.lua and tests/io/s3_spec.lua run these lines against a real nginx and moto,
      -- with the example hosts and the reader's corpus/ replaced by theirs.
      { '^%./run %-m wick%.data%.convert corpus/ ', "converts the reader's own corpus/ (remote_spec.lua: a generated one)" },
      { 'https://data%.example%.org', 'needs the example server (remote_spec.lua: a local nginx)' },
      { 's3://team%-bucket', 'needs the example bucket (s3_spec.lua: moto)' },
    },
  },
  { 'docs/pretrain.md' },
  {
    'docs/finetune.md',
    skipped = {
      { '^WICK_MODEL_DIR=~/models/', "fine-tunes the reader's own Hugging Face model (the lines above run the same recipe on one Wick saves)" },
    },
  },
  {
    'docs/multinode.md',
    skipped = {
      { '^%./run %-%-nnodes 2 ', 'needs a second host (tests/dist/multinode_spec.lua runs these lines on two, in network namespaces)' },
      { '%f[%w]sbatch ', 'needs SLURM (tests/dist/multinode_spec.lua runs the script with srun\'s variables on two hosts)' },
      { '^torchrun ', "Debian's torchrun (torch 1.13 on Python 3.11) fails before it starts a worker; the variables it sets are run --nproc-per-node's" },
    },
  },
  {
    'docs/gpu.md',
    skipped = {
      { '^make gpu%-check$', 'needs an NVIDIA GPU (a lent GPU machine runs it)' },
      { '^make test%-gpu$', 'needs an NVIDIA GPU' },
    },
  },
  {
    'docs/models.md',
    skipped = {
      { '^%./run %-m wick%.generate %-%-model DIR ', 'a placeholder directory (tests/nn/generate_spec.lua runs it on a Llama and a GPT-2 Wick saves)' },
    },
  },
}

-- Commands that need the pinned test venv (PyPI): `make example` and what reads the files it makes.
-- Without the venv they are skipped and the test says so, as the other venv tests do.
local NEED_VENV = { { '^make example$' }, { 'build/example/' } }

local function first_match(rules, command)
  for _, rule in ipairs(rules or {}) do
    if command:match(rule[1]) then return rule end
  end
end

local function read(file) return helper.read_file(helper.ROOT .. '/' .. file) end

-- The test venv, or nil and why not: made (or checked) once for every file.
local venv, venv_error
local function test_venv()
  if venv == nil and venv_error == nil then venv, venv_error = helper.test_python() end
  return venv, venv_error
end

local function guides()
  local found = helper.lines(helper.sh(('cd %s && ls docs/*.md'):format(q(helper.ROOT))).out)
  table.insert(found, 1, 'README.md')
  return found
end

describe('the README and the guides', function()
  it('find the commands of their sh blocks (and only shell in them)', function()
    local total = 0
    for _, entry in ipairs(FILES) do
      for _, command in ipairs(docs.all_commands(read(entry[1]))) do
        assert.matches('^[%w%./(~]', command, 1) -- a program, not a prompt, output or placeholder
        assert.is_nil(command:find('[<>%[%]]%u') or command:find('%f[%w]N%f[%W]'), 'placeholder in: ' .. command)
        total = total + 1
      end
    end
    assert.is_true(total >= 30, total .. ' commands')
  end)

  it('are all run here: every file with a sh block is listed above', function()
    local listed = {}
    for _, entry in ipairs(FILES) do listed[entry[1]] = true end
    for _, file in ipairs(guides()) do
      if #docs.all_commands(read(file)) > 0 then assert.is_true(listed[file], file .. ' has commands no test runs') end
    end
  end)

  for _, entry in ipairs(FILES) do
    local file = entry[1]
    it(file .. ': runs every command as written, in order, in a fresh copy of the checkout', function()
      -- `make demo` builds with the build under test's switches: the suite's make passes them down,
      -- and a direct run of the suite gets them here.
      local sanitize = require('wick').build_info().build_flags:find('asan') and 'SANITIZE=1 ' or ''
      local python, why_not = test_venv()
      local tree, home = docs.fresh_copy(), helper.tmpdir()
      local ran, used, without_venv = 0, {}, {}
      for _, command in ipairs(docs.all_commands(read(file))) do
        local skip = first_match(entry.skipped, command)
        if skip then
          used[skip] = true
        elseif not python and first_match(NEED_VENV, command) then
          without_venv[#without_venv + 1] = command
        else
          local rewrite = first_match(entry.rewritten, command)
          if rewrite then used[rewrite] = true end
          local r = helper.sh(('cd %s && export HOME=%s %s&& %s < /dev/null'):format(q(tree), q(home), sanitize,
            rewrite and rewrite[2] or command))
          assert.are.equal(0, r.rc, ('%s: `%s` exited %s:\n%s'):format(file, command, tostring(r.rc), r.err:sub(-2000)))
          ran = ran + 1
        end
      end
      helper.rmtree(tree)
      helper.rmtree(home)
      for _, rule in ipairs(entry.skipped or {}) do assert.is_true(used[rule], file .. ': no command is skipped for ' .. rule[1]) end
      for _, rule in ipairs(entry.rewritten or {}) do assert.is_true(used[rule], file .. ': no command is rewritten by ' .. rule[1]) end
      if #without_venv > 0 then
        pending(('%s: skipped %d commands that need the test venv (%s): %s'):format(file, #without_venv,
          table.concat(without_venv, '; '), why_not))
      end
    end)
  end

  it('link only to what exists: files of the checkout, and headings of theirs', function()
    local broken = {}
    for _, file in ipairs(guides()) do
      local dir = file:match('^(.*)/') or '.'
      local text = read(file):gsub('\n```.-\n```', '') -- code blocks hold no links
      for target in text:gmatch('%]%(([^)%s]+)%)') do
        if not target:match('^%a+://') and not target:match('^mailto:') then
          local path, anchor = target:match('^([^#]*)#?(.*)$')
          local full = path == '' and file or (dir .. '/' .. path):gsub('^%./', '')
          local exists = helper.sh(('cd %s && test -e %s'):format(q(helper.ROOT), q(full))).rc == 0
          if not exists then
            broken[#broken + 1] = file .. ': ' .. target
          elseif anchor ~= '' and not docs.anchors(read(full))[anchor] then
            broken[#broken + 1] = file .. ': ' .. target .. ' (no such heading)'
          end
        end
      end
    end
    assert.are.same({}, broken)
  end)

  it(('keep the README under %d lines'):format(README_LINES), function()
    local _, lines = read('README.md'):gsub('\n', '')
    assert.is_true(lines < README_LINES, 'README.md has ' .. lines .. ' lines')
  end)
end)

describe('docs/reference/', function()
  it('is what ./run -m wick.docs generates from the schemas today', function()
    local pages = require('wick.docs').pages()
    local stale = {}
    for name, text in pairs(pages) do
      if read('docs/reference/' .. name) ~= text then stale[#stale + 1] = 'docs/reference/' .. name end
    end
    local listed = helper.lines(helper.sh(('cd %s && ls docs/reference'):format(q(helper.ROOT))).out)
    for _, name in ipairs(listed) do
      if not pages[name] then stale[#stale + 1] = 'docs/reference/' .. name .. ' (no longer generated)' end
    end
    table.sort(stale)
    assert.are.same({}, stale, 'out of date: run ./run -m wick.docs (make docs)')
  end)

  it('lists every field of a recipe, with its type, default and help', function()
    local page = read('docs/reference/recipe.md')
    for _, leaf in ipairs(require('wick.recipe').SCHEMA:leaves()) do
      assert.truthy(page:find('| `' .. leaf[1] .. '` |', 1, true), leaf[1])
    end
  end)

  it('--check names a stale page and exits 1', function()
    local tree = docs.fresh_copy()
    helper.write_file(tree .. '/docs/reference/recipe.md', 'old\n')
    local r = helper.sh(('cd %s && ./run -m wick.docs --check'):format(q(tree)))
    helper.rmtree(tree)
    assert.are.equal(1, r.rc, r.out .. r.err)
    assert.matches('docs/reference/recipe.md is out of date: run ./run -m wick.docs', r.err, 1, true)
  end)
end)
