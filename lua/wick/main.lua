-- wick.main: the entry points `run` calls into for -m, -i and recipes (the rest of `run` is C).
local main = {}

-- The world a dry run plans for: run's --nproc-per-node x --nnodes, else WORLD_SIZE, else 1.
-- The ranks a dry run plans for: `given` when the launcher's flags named them, else the variable's.
local function planned_ranks(given, variable)
  if given and given > 0 then return given end
  local text = os.getenv(variable)
  if text == nil then return 1 end
  local n = tonumber(text)
  if not n or n < 1 or n % 1 ~= 0 or n > 2 ^ 31 then
    require('wick.cli').fail(("run: %s='%s' is not a number of ranks (a whole number >= 1)"):format(variable, text), 2)
  end
  return n
end

-- run recipe.lua [--key=value ...]: the script returned a value; a recipe (wick.recipe.is_recipe)
-- is trained, or with --dry-run (run's or the recipe's) checked and planned. Another table is a
-- module's and left alone, except for --dry-run; anything else is no recipe at all.
function main.run_recipe(path, raw, ...)
  local host = require 'wick.host'
  if not require('wick.recipe').is_recipe(raw) then
    if type(raw) == 'table' and not host.dry_run then return end -- some other table: a module's
    require('wick.cli').fail(("%s: %s returned %s, not a recipe (a table of model, data, batch, steps, ...)")
      :format(path, host.dry_run and '--dry-run plans a recipe, and the script' or 'the script',
      raw == nil and 'nothing' or ('a ' .. type(raw))), require('wick.cli').EXIT_USAGE)
  end
  local job = require('wick.recipe').load(path, raw, { ... })
  if host.dry_run or job.flags.dry_run then
    local ok = require('wick.train.plan').report(job, planned_ranks(host.dry_run, 'WORLD_SIZE'),
      planned_ranks(host.dry_run_local, 'LOCAL_WORLD_SIZE'))
    if not ok then os.exit(require('wick.cli').EXIT_USAGE) end
    return
  end
  require('wick.train').run(job)
end

-- run -m MODULE args...: runs the module's file as a program with `arg` and `...` set. A module that
-- is also a library may return a table with main(args); its return value becomes the exit code.
function main.run_module(name, ...)
  name = require('wick.renamed').resolve(name) -- a renamed module runs under its new name, with a warning
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

-- run -i [script [args]]: a recipe the script returned is built, not trained (wick.train.repl).
function main.repl(result_count, ...)
  local value = (...)
  if result_count and result_count > 0 and require('wick.recipe').is_recipe(value) and _G.arg and _G.arg[0] then
    local args = {}
    for i = 1, #_G.arg do args[i] = _G.arg[i] end
    require('wick.train.inspector').expose(require('wick.recipe').load(_G.arg[0], value, args))
    result_count = 0 -- `recipe` is the checked one
  end
  return require('wick.repl').start(result_count, ...)
end

return main
