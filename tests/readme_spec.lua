-- Every shell command the README shows runs as written: each line of its ```sh blocks, in the
-- order they appear, from the checkout, must exit 0. Commands a test machine cannot run are skipped,
-- each named here with the reason.
local helper = require 'helper'
local q = helper.shell_quote

local SKIPPED = {
  { '^make test$', 'runs this suite: it would run itself' },
  { '^%./run %-%-nnodes 2 ', 'needs a second host (tests/dist/multinode_spec.lua: two in network namespaces)' },
  -- The remote recipe: tests/io/remote_spec.lua and tests/io/s3_spec.lua run these lines against a real nginx
  -- and moto, with the example hosts and the reader's corpus/ replaced by theirs.
  { '^%./run %-m wick%.data%.convert corpus/ ', "converts the reader's own corpus/ (remote_spec.lua: a generated one)" },
  { 'https://data%.example%.org', 'needs the example server (remote_spec.lua: a local nginx)' },
  { 's3://team%-bucket', 'needs the example bucket (s3_spec.lua: moto)' },
  { '^WICK_MODEL_DIR=~/models/', "fine-tunes the reader's own Hugging Face model (tests/train/recipes_spec.lua: one Wick saves)" },
}

-- The line without a trailing `# comment` (a # after a space, outside quotes).
local function strip_comment(line)
  local quote
  for i = 1, #line do
    local c = line:sub(i, i)
    if quote then
      if c == quote then quote = nil end
    elseif c == "'" or c == '"' then
      quote = c
    elseif c == '#' and (i == 1 or line:sub(i - 1, i - 1):match('%s')) then
      return line:sub(1, i - 1)
    end
  end
  return line
end

-- The commands of the README's sh code blocks, in order; a line ending in \ continues.
local function commands(readme)
  local found, block, pending = {}, nil, ''
  for line in (readme .. '\n'):gmatch('([^\n]*)\n') do
    local fence, info = line:match('^%s*(```+)%s*(%S*)')
    if fence then
      block = not block and info or nil
    elseif block == 'sh' then
      local text = strip_comment(line):gsub('^%s+', ''):gsub('%s+$', '')
      if text:sub(-1) == '\\' then
        pending = pending .. text:sub(1, -2)
      elseif pending .. text ~= '' then
        found[#found + 1] = pending .. text
        pending = ''
      end
    end
  end
  return found
end

-- Commands that need the pinned test venv (PyPI): `make example` and what reads the files it makes.
-- Without the venv they are skipped and the test says so, as the other venv tests do.
local NEED_VENV = { '^make example$', 'build/example/' }

local function needs_venv(command)
  for _, pattern in ipairs(NEED_VENV) do
    if command:match(pattern) then return true end
  end
  return false
end

-- Commands run with a change, each with the reason.
local REWRITTEN = {
  { '^make demo$', 'make demo DEMO_ARGS=--steps=30', 'the default job trains for minutes; 30 steps prove it runs' },
}

local function rewritten(command)
  for _, rule in ipairs(REWRITTEN) do
    if command:match(rule[1]) then return rule[2] end
  end
  return command
end

-- The checkpoint directories the README's commands name: each run writes into the test's own
-- directory instead (a reader following the README after `make test` once resumed from the tests'
-- checkpoints and trained zero steps). A command naming another fails the test until it is listed.
local CHECKPOINT_DIRS = { 'build/ckpt', 'build/llama-ckpt', 'build/readme-shard' }

local function escape(s) return (s:gsub('%p', '%%%0')) end

-- The command with every README checkpoint directory in `into`, or nil and the one not listed.
local function own_checkpoints(command, into)
  for dir in command:gmatch('%-%-checkpoint%.dir=(%S+)') do
    local listed = false
    for _, known in ipairs(CHECKPOINT_DIRS) do listed = listed or dir == known end
    if not listed then return nil, dir end
  end
  for _, dir in ipairs(CHECKPOINT_DIRS) do
    local replacement = (into .. '/' .. dir:gsub('/', '-')):gsub('%%', '%%%%')
    command = command:gsub(escape(dir) .. '%f[^%w_.%-]', replacement)
  end
  return command
end

local function skip_of(command)
  for _, skip in ipairs(SKIPPED) do
    if command:match(skip[1]) then return skip end
  end
end

describe('README', function()
  local readme = helper.read_file(helper.ROOT .. '/README.md')

  it('finds the commands of its sh blocks (and only shell in them)', function()
    local list = commands(readme)
    assert.is_true(#list >= 10, #list .. ' commands')
    for _, command in ipairs(list) do
      assert.matches('^[%./]*[%w]', command) -- a program, not a prompt, output or placeholder
      assert.is_nil(command:find('[<>%[%]]%u') or command:find('%f[%w]N%f[%W]'), 'placeholder in: ' .. command)
    end
  end)

  it('runs every command as written, from the checkout (the skipped ones named above)', function()
    -- `make demo` builds what later commands read (build/demo/data), with the build under test's
    -- switches: the suite's make passes them down, and a direct run of the suite gets them here.
    local sanitize = require('wick').build_info().build_flags:find('asan') and 'SANITIZE=1 ' or ''
    local home = helper.tmpdir()
    -- One reader's working directory for every command, as from the checkout (its recipes' default
    -- checkpoint.dir, checkpoints/NAME, is the reader's, not the checkout's).
    local reader = home .. '/checkout'
    local made = helper.sh(helper.checkout_copy(reader))
    assert.are.equal(0, made.rc, made.err)
    local ran, used, without_venv = 0, {}, {}
    local venv, venv_error = helper.test_python()
    for _, command in ipairs(commands(readme)) do
      local skip = skip_of(command)
      if skip then
        used[skip] = true
      elseif not venv and needs_venv(command) then
        without_venv[#without_venv + 1] = command
      else
        local run, unlisted = own_checkpoints(rewritten(command), home)
        assert.is_nil(unlisted, 'list the README checkpoint.dir ' .. tostring(unlisted) .. ' in CHECKPOINT_DIRS')
        local r = helper.sh(('cd %s && env HOME=%s %s%s < /dev/null'):format(q(reader), q(home), sanitize, run))
        assert.are.equal(0, r.rc, ('`%s` exited %s:\n%s'):format(command, tostring(r.rc), r.err:sub(-2000)))
        ran = ran + 1
      end
    end
    helper.rmtree(home)
    for _, skip in ipairs(SKIPPED) do assert.is_true(used[skip], 'no README command is skipped for ' .. skip[1]) end
    assert.is_true(ran >= 10, ran .. ' commands ran')
    if #without_venv > 0 then
      pending(('skipped %d commands that need the test venv (%s): %s'):format(#without_venv,
        table.concat(without_venv, '; '), venv_error))
    end
  end)

  it("lists the recipe's fields as the schema declares them", function()
    local block = readme:match('The fields of a recipe %(generated from the schema[^\n]*\n\n```text\n(.-)```')
    assert.is_not_nil(block, 'the README has the list of recipe fields')
    assert.are.equal(table.concat(require('wick.recipe').fields(), '\n') .. '\n', block)
  end)
end)
