-- wick: the recipe API. `require 'wick'` loads the native runtime and checks its version;
-- subsystems load on first use (wick.log, later wick.data, wick.tensor, ...), so a recipe pays only
-- for what it touches.
local core = require 'wick.core'

local SUBMODULES = {
  log = true, data = true, schedule = true, cli = true, dataset = true, tokenizer = true,
  tensor = true, nn = true, optim = true, safetensors = true, precision = true, dist = true,
}

local wick = {
  version = core.version,
  build_info = core.build_info,
}

return setmetatable(wick, {
  __index = function(t, name)
    if not SUBMODULES[name] then return nil end
    local module = require('wick.' .. name)
    rawset(t, name, module)
    return module
  end,
})
