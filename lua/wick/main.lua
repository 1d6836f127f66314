-- wick.main: the entry points `run` calls into for -m and -i (the rest of `run` is C).
local main = {}

-- run -m MODULE args...: runs the module's file as a program with `arg` and `...` set. A module that
-- is also a library may return a table with main(args); its return value becomes the exit code.
function main.run_module(name, ...)
  local path, searched = package.searchpath(name, package.path)
  if not path then -- the user's mistake: its message, without a traceback of this file
    require('wick.cli').fail(string.format("run: no module named '%s'; searched:%s", name, searched), 1)
  end
  local chunk = assert(loadfile(path))
  arg[0] = path
  local module = chunk(...)
  if module ~= nil then package.loaded[name] = module end
  if type(module) == 'table' and type(module.main) == 'function' then
    local code = module.main({ ... })
    if type(code) == 'number' and code ~= 0 then os.exit(code) end
  end
end

function main.repl(result_count, ...)
  return require('wick.repl').start(result_count, ...)
end

return main
