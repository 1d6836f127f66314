-- The checkout holds only what people wrote: a test run may write under build/ (and the other paths
-- .gitignore names, checkpoints/ excepted) and in its temporary directories, never elsewhere in the tree. tests/busted.lua
-- lists the tree's unignored untracked files before and after the suite and fails the run on any new
-- one (a disk cache made with a relative WICK_CACHE_DIR was once committed that way).
local clean_tree = {}

local function shell_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- Ignored for people, not for tests: a run's checkpoints/ (the default checkpoint.dir of a recipe run
-- from the checkout), which no test may write.
local WATCHED_IGNORED = { 'checkpoints' }

-- The files of one git ls-files listing of root, into files; false when root is no git checkout.
local function list(root, options, files)
  local pipe = io.popen(('git -C %s ls-files --others --exclude-standard -z %s 2>/dev/null; echo " $?"')
    :format(shell_quote(root), options))
  local text = pipe:read('*a')
  pipe:close()
  local listing, rc = text:match('^(.*) (%d+)%s*$')
  if rc ~= '0' then return false end
  for path in listing:gmatch('([^%z]+)%z') do files[path] = true end
  return true
end

-- The set of files under root that git neither tracks nor ignores, and those under WATCHED_IGNORED,
-- or nil when root is no git checkout (an installed tree: nothing to compare).
function clean_tree.untracked(root)
  local files = {}
  if not list(root, '', files) then return nil end
  for _, path in ipairs(WATCHED_IGNORED) do list(root, '--ignored -- ' .. shell_quote(path), files) end
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
