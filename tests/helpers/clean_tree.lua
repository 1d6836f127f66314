-- The checkout holds only what people wrote: a test run may write under build/ (and the other paths
-- .gitignore names) and in its temporary directories, never elsewhere in the tree. tests/busted.lua
-- lists the tree's unignored untracked files before and after the suite and fails the run on any new
-- one (a disk cache made with a relative WICK_CACHE_DIR was once committed that way).
local clean_tree = {}

local function shell_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- The set of files under root that git neither tracks nor ignores, or nil when root is no git
-- checkout (an installed tree: nothing to compare).
function clean_tree.untracked(root)
  local pipe = io.popen(('git -C %s ls-files --others --exclude-standard -z 2>/dev/null; echo " $?"')
    :format(shell_quote(root)))
  local text = pipe:read('*a')
  pipe:close()
  local listing, rc = text:match('^(.*) (%d+)%s*$')
  if rc ~= '0' then return nil end
  local files = {}
  for path in listing:gmatch('([^%z]+)%z') do files[path] = true end
  return files
end

-- The files of after that before lacks, sorted.
function clean_tree.added(before, after)
  local added = {}
  for path in pairs(after) do
    if not before[path] then added[#added + 1] = path end
  end
  table.sort(added)
  return added
end

return clean_tree
