-- wick.nn: modules (wick.nn.modules), the GPT-2 model (wick.nn.gpt) and data parallelism over a
-- wick.dist group (wick.nn.data_parallel).
local nn = require 'wick.nn.modules'
nn.gpt = require('wick.nn.gpt').new
nn.data_parallel = require('wick.nn.data_parallel').new
return nn
