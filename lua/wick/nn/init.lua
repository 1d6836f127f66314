-- wick.nn: modules (wick.nn.modules) and the GPT-2 model (wick.nn.gpt).
local nn = require 'wick.nn.modules'
nn.gpt = require('wick.nn.gpt').new
return nn
