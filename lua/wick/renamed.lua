-- wick.renamed: the module names that changed, kept working for one release. A public name that
-- changes keeps its old spelling as an alias, with a warning on stderr once per process, so a
-- script that says `require 'wick.shard'` or `run -m wick.shard` still runs and learns the new name.
-- `run` installs the loader at start (runtime/host/run.c), `require 'wick'` too (a plain luajit).
-- The next release deletes this table and the file.
local renamed = {}

local NEW_NAME = {
  ['wick.shard'] = 'wick.data.convert', -- it converts a corpus; a shard is only what it writes
  ['wick.tokenize'] = 'wick.data.tokenize',
  ['wick.dataset'] = 'wick.data.dataset',
  ['wick.tokenizer'] = 'wick.data.tokenizer',
  ['wick.checkpoint'] = 'wick.train.checkpoint',
  ['wick.pause'] = 'wick.train.pause',
  ['wick.plan'] = 'wick.train.plan',
  ['wick.runlog'] = 'wick.train.runlog',
  ['wick.tensorboard'] = 'wick.train.tensorboard',
  ['wick.inspector'] = 'wick.train.inspector',
}

renamed.NEW_NAME = NEW_NAME -- for the tree's own check that it uses none of the old names

local warned = {}

-- The name to load for `name`: its new one (warning once) when it was renamed, else itself.
function renamed.resolve(name)
  local new = NEW_NAME[name]
  if not new then return name end
  if not warned[name] then
    warned[name] = true
    io.stderr:write(('%s is now %s; the old name goes in the next release\n'):format(name, new))
  end
  return new
end

-- A package.loaders entry: an old name loads as its new one (require caches it under both).
local function load_renamed(name)
  if not NEW_NAME[name] then return nil end
  return function() return require(renamed.resolve(name)) end
end

table.insert(package.loaders, load_renamed) -- once: require runs this file once per process
return renamed
