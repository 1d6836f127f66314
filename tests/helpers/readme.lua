-- The commands the README shows, so tests can run them as written (with the example hosts and paths
-- replaced by the test's own): keeps what users copy runnable.
--   local readme = require 'helpers.readme'
--   readme.commands('Remote datasets')   -- the lines of the first ```sh block under that heading
local helper = require 'helper'

local readme = {}

function readme.commands(heading)
  local text = helper.read_file(helper.ROOT .. '/README.md')
  local at = text:find('\n#+ ' .. heading:gsub('%p', '%%%0') .. '\n')
  assert(at, 'README.md has no heading ' .. heading)
  local block = text:match('```sh\n(.-)```', at)
  assert(block, 'no ```sh block under ' .. heading)
  local lines = {}
  for line in block:gmatch('[^\n]+') do
    line = line:gsub('%s+#.*$', '')
    if line:match('%S') then lines[#lines + 1] = line end
  end
  return lines
end

-- line with every key of `replacements` replaced (plain text, longest first, so a host's prefix
-- does not shadow it).
function readme.substitute(line, replacements)
  local keys = {}
  for k in pairs(replacements) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return #a > #b end)
  for _, k in ipairs(keys) do
    local from = k:gsub('%p', '%%%0')
    line = line:gsub(from, (replacements[k]:gsub('%%', '%%%%')))
  end
  return line
end

return readme
