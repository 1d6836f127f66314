-- The commands the README and the guides in docs/ show, so tests can run them as written: every line
-- of their ```sh blocks (tests/docs_spec.lua runs each file's in order, in a fresh copy of the
-- checkout), or the block under one heading (with the example hosts and paths replaced by a test's own).
--   local docs = require 'helpers.docs'
--   docs.commands('docs/data.md', 'Remote datasets')  -- the lines of the first ```sh block under it
--   docs.all_commands(text)                           -- every line of every ```sh block, in order
--   local tree = docs.fresh_copy()                     -- the checkout's files and build, without its data
--   docs.anchors(text)                                -- the #anchors its headings give
local helper = require 'helper'
local q = helper.shell_quote

local docs = {}

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

-- The commands of a text's sh code blocks, in order; a line ending in \ continues.
function docs.all_commands(text)
  local found, block, pending = {}, nil, ''
  for line in (text .. '\n'):gmatch('([^\n]*)\n') do
    local fence, info = line:match('^%s*(```+)%s*(%S*)')
    if fence then
      block = not block and info or nil
    elseif block == 'sh' then
      local command = strip_comment(line):gsub('^%s+', ''):gsub('%s+$', '')
      if command:sub(-1) == '\\' then
        pending = pending .. command:sub(1, -2)
      elseif pending .. command ~= '' then
        found[#found + 1] = pending .. command
        pending = ''
      end
    end
  end
  return found
end

-- The commands of the first ```sh block under `heading` in `file` (relative to the checkout).
function docs.commands(file, heading)
  local text = helper.read_file(helper.ROOT .. '/' .. file)
  local at = text:find('\n#+ ' .. heading:gsub('%p', '%%%0') .. '\n')
  assert(at, file .. ' has no heading ' .. heading)
  local block = text:match('\n```sh\n(.-)```', at)
  assert(block, 'no ```sh block under ' .. heading .. ' in ' .. file)
  return docs.all_commands('```sh\n' .. block .. '```')
end

-- line with every key of `replacements` replaced (plain text, longest first, so a host's prefix
-- does not shadow it).
function docs.substitute(line, replacements)
  local keys = {}
  for k in pairs(replacements) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return #a > #b end)
  for _, k in ipairs(keys) do
    local from = k:gsub('%p', '%%%0')
    line = line:gsub(from, (replacements[k]:gsub('%%', '%%%%')))
  end
  return line
end

-- The anchors a Markdown text's headings get on GitHub: lower case, punctuation but - and _ dropped,
-- spaces as dashes, a repeated one suffixed -1, -2, ...
function docs.anchors(text)
  local found, seen = {}, {}
  for heading in (('\n' .. text):gsub('\n```.-\n```', '')):gmatch('\n#+ ([^\n]+)') do
    local slug = heading:lower():gsub('[^%w%s_-]', ''):gsub('%s', '-')
    local anchor = seen[slug] and (slug .. '-' .. seen[slug]) or slug
    seen[slug] = (seen[slug] or 0) + 1
    found[anchor] = true
  end
  return found
end

-- What make builds into build/ (the libraries, objects, generated headers and its mode markers):
-- copied with their times, so make finds the copy up to date. Everything else there is data a
-- command made (build/demo, build/example, checkpoints), which a fresh copy must not have.
local BUILT = { '*.so', '*.a', 'mode-*', 'cuda-arch-*', 'obj', 'gen', 'lua' }
-- The pinned venvs: large, made once per machine, read by the copy where they are.
local VENVS = { 'build/test/venv', 'build/test/hf-venv' }

-- A new directory holding the checkout's files (tracked, and untracked ones git does not ignore),
-- ./run and make's outputs, the venvs linked: commands run there as in the checkout, and what they
-- write stays there. Returns its path; helper.rmtree removes it.
function docs.fresh_copy()
  local tree = helper.tmpdir()
  local built = {}
  for _, pattern in ipairs(BUILT) do built[#built + 1] = 'build/' .. pattern end
  local script = table.concat({
    'cd ' .. q(helper.ROOT),
    'git ls-files -co --exclude-standard -z | xargs -0 cp -a --parents -t ' .. q(tree),
    'mkdir -p ' .. q(tree .. '/build/test'),
    'cp -a run ' .. q(tree),
    ('for f in %s; do if [ -e "$f" ]; then cp -a "$f" %s/build/; fi; done'):format(table.concat(built, ' '), q(tree)),
  }, ' && ')
  local r = helper.sh(script)
  assert(r.rc == 0, 'copying the checkout: ' .. r.err)
  for _, venv in ipairs(VENVS) do
    local real = helper.sh('readlink -f ' .. q(helper.ROOT .. '/' .. venv)).out:gsub('%s+$', '')
    if real ~= '' and helper.sh('test -d ' .. q(real)).rc == 0 then
      assert(helper.sh(('ln -s %s %s'):format(q(real), q(tree .. '/' .. venv))).rc == 0)
    end
  end
  return tree
end

return docs
