-- wick.nn: modules (wick.nn.modules), the GPT-2 model (wick.nn.gpt), the Llama family
-- (wick.nn.llama), their generation (wick.nn.generate), Hugging Face model directories
-- (wick.nn.pretrained) and data parallelism over a wick.dist group (wick.nn.data_parallel).
local nn = require 'wick.nn.modules'
nn.gpt = require('wick.nn.gpt').new
nn.llama = require('wick.nn.llama').new
nn.from_pretrained = require('wick.nn.pretrained').from_pretrained
require 'wick.nn.generate'  -- model:generate(prompt, opts) of nn.gpt and nn.llama models
nn.data_parallel = require('wick.nn.data_parallel').new
return nn
