-- wick: the recipe API. `require 'wick'` loads the native runtime and checks its version;
-- subsystems load on first use (wick.log, later wick.data, wick.tensor, ...), so a recipe pays only
-- for what it touches.
local core = require 'wick.core'
require 'wick.renamed' -- the old module names, for one release

-- wick.NAME -> the module it loads (its file under lua/wick/).
local SUBMODULES = {
  log = 'wick.log', data = 'wick.data', schedule = 'wick.schedule', cli = 'wick.cli',
  dataset = 'wick.data.dataset', tokenizer = 'wick.data.tokenizer', tensor = 'wick.tensor', nn = 'wick.nn',
  optim = 'wick.optim', safetensors = 'wick.safetensors', precision = 'wick.precision', dist = 'wick.dist',
  train = 'wick.train', recipe = 'wick.recipe', checkpoint = 'wick.train.checkpoint',
}

local wick = {
  version = core.version,
  build_info = core.build_info,
}

return setmetatable(wick, {
  __index = function(t, name)
    if not SUBMODULES[name] then return nil end
    local module = require(SUBMODULES[name])
    rawset(t, name, module)
    return module
  end,
})
