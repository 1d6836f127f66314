-- The files `make example` makes (tests/helpers/corpus_oracle.py example: a FineWeb-style Parquet corpus,
-- its documents as JSONL, small tokenizers trained on this machine's license texts, GPT-2's and cl100k's
-- rank files), made once per test run into a temporary directory with the pinned test venv, for specs
-- that read them. The guides' own `make example` runs in fresh copies of the checkout (tests/docs_spec.lua),
-- so no spec may count on the checkout's build/example.
--   local dir, why = require('helpers.example').dir()   -- nil and why not without the test venv
local helper = require 'helper'
local q = helper.shell_quote

local example = {}

local made, why_not

function example.dir()
  if made or why_not then return made, why_not end
  local python, err = helper.test_python()
  if not python then
    why_not = err
    return nil, why_not
  end
  local dir = helper.tmpdir() .. '/example'
  local r = helper.sh(('%s %s example %s'):format(q(python), q(helper.ROOT .. '/tests/helpers/corpus_oracle.py'), q(dir)))
  assert(r.rc == 0, 'corpus_oracle.py example: ' .. r.err)
  made = dir
  return made
end

return example
