-- The include graph of runtime/ against the layering its folders claim (runtime/LAYERS: bottom up, a
-- folder includes only itself, the folders above it in the list, and runtime/wick.h).
local layers = {}

local function shell_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function read(path)
  local f = assert(io.open(path, 'rb'))
  local text = f:read('*a')
  f:close()
  return text
end

-- runtime/LAYERS as { folder = rank } (1 the lowest) and the folders in order.
function layers.read_order(runtime)
  local rank, order = {}, {}
  for line in read(runtime .. '/LAYERS'):gmatch('[^\n]+') do
    local folder = line:match('^(%w+)%s')
    if folder and not line:match('^#') then
      order[#order + 1] = folder
      rank[folder] = #order
    end
  end
  return rank, order
end

-- a/b/../c -> a/c
function layers.normalize(path)
  local parts = {}
  for part in path:gmatch('[^/]+') do
    if part == '..' then parts[#parts] = nil elseif part ~= '.' then parts[#parts + 1] = part end
  end
  return table.concat(parts, '/')
end

-- Every source file under runtime/, relative to it.
local function sources(runtime)
  local pipe = io.popen(('cd %s && find . -type f \\( -name "*.c" -o -name "*.h" -o -name "*.cu" -o '
    .. '-name "*.cuh" -o -name "*.cpp" \\) | sort'):format(shell_quote(runtime)))
  local files = {}
  for path in pipe:read('*a'):gmatch('[^\n]+') do files[#files + 1] = path:gsub('^%./', '') end
  pipe:close()
  return files
end

-- The breaches of the layering: one line each ("file:line includes 'x' (folder a below b)"), plus the
-- folders LAYERS does not place.
function layers.violations(runtime)
  local rank = layers.read_order(runtime)
  local found, unplaced = {}, {}
  for _, file in ipairs(sources(runtime)) do
    local folder = file:match('^([^/]+)/')
    if folder and not rank[folder] then
      unplaced[folder] = true
    elseif folder then
      local n = 0
      for line in (read(runtime .. '/' .. file) .. '\n'):gmatch('([^\n]*)\n') do
        n = n + 1
        local target = line:match('^%s*#%s*include%s+"([^"]+)"')
        if target then
          local resolved = layers.normalize(file:match('^(.*)/') .. '/' .. target)
          local to = resolved:match('^([^/]+)/')
          if resolved:match('^%.%.') or (not to and resolved ~= 'wick.h') then
            found[#found + 1] = ('%s:%d includes "%s", outside runtime/'):format(file, n, target)
          elseif to and rank[to] and rank[to] > rank[folder] then
            found[#found + 1] = ('%s:%d includes "%s": %s/ is above %s/ in runtime/LAYERS')
              :format(file, n, target, to, folder)
          end
        end
      end
    end
  end
  for folder in pairs(unplaced) do
    found[#found + 1] = ('runtime/%s/ is not in runtime/LAYERS'):format(folder)
  end
  table.sort(found)
  return found
end

return layers
