-- What durability costs a checkpoint: wick.checkpoint.save of a model of recipes/gpt2_124m.lua's
-- shape (weights and AdamW's moments, f32: ~1.5 GB), which fsyncs every file, DONE and the
-- directories, next to writing the same files without fsync, into build/bench/checkpoint/ (this
-- checkout's file system). The page cache is flushed (sync) before each timing, so neither pays for
-- the other's writeback.
--   ./run tests/bench/checkpoint.lua     (make bench runs it; ~1 min here, and 2 GB of memory)
package.path = require('wick.host').home .. '/tests/bench/lib/?.lua;' .. package.path
local report = require 'report'
local host = require 'wick.host'
local wick = require 'wick'
local checkpoint = require 'wick.train.checkpoint'
local safetensors = require 'wick.safetensors'

local SHAPE = { vocab = 50304, seq_len = 1024, layers = 12, heads = 12, dim = 768 } -- recipes/gpt2_124m.lua's
local REPEATS = 2
local DIR = host.home .. '/build/bench/checkpoint'
local METADATA = { step = 1, recipe_text = '' }

local model = wick.nn.gpt(SHAPE)
local opt = wick.optim.adamw { lr = 1e-4 }
opt:build(model)

local function parts(dir)
  model:save(dir .. '/model.safetensors')
  checkpoint.save_optimizer(dir, opt, model)
end

local function clean()
  report.sh('checkpoint bench', 'rm -rf ' .. DIR .. ' && mkdir -p ' .. DIR .. '/plain && sync', true)
end

local plain = report.best(REPEATS, function()
  parts(DIR .. '/plain')
  safetensors.save(DIR .. '/plain/state.safetensors', {}, METADATA)
end, clean)
local durable = report.best(REPEATS, function() checkpoint.save(DIR .. '/ck', 1, METADATA, parts, 1) end, clean)
clean()
local gb = (model:parameter_count() * 4 * 3) / 1e9
report.row(('checkpoint save, gpt2_124m (%.2f GB), fsynced'):format(gb), durable, 's', 'same files, no fsync', plain,
  false)
report.sh('checkpoint bench', 'rm -rf ' .. DIR, true)
model:free()
opt:free()
