-- A bounded libFuzzer run of each format parser (tests/fuzz/fuzz_*.c): builds them with `make fuzz`
-- (clang, libFuzzer, ASan, UBSan), then mutates the committed seed corpus for a few seconds each.
-- A crash, sanitizer report or abort fails the test and leaves the reproducer in the printed path.
local helper = require 'helper'
local q = helper.shell_quote

local RUNS, SECONDS = 20000, 20

describe('fuzzing', function()
  local built = helper.sh('cd ' .. q(helper.ROOT) .. ' && make -s fuzz 2>&1')

  for _, target in ipairs { 'index', 'shard', 'store', 'cursor', 'inputs', 'tokenizer', 'parquet', 'tfevents' } do
    it('fuzz_' .. target .. ' survives ' .. RUNS .. ' mutated inputs', function()
      assert.are.equal(0, built.rc, 'make fuzz failed:\n' .. built.out .. built.err)
      local work = helper.tmpdir()
      local r = helper.sh(string.format('cd %s && %s -runs=%d -max_total_time=%d -artifact_prefix=%s/ %s %s',
        q(work), q(helper.ROOT .. '/build/fuzz/fuzz_' .. target), RUNS, SECONDS, q(work), q(work),
        q(helper.ROOT .. '/tests/fuzz/corpus/' .. target)))
      local crashes = helper.sh('ls ' .. q(work) .. ' | grep -E "^(crash|leak|timeout|oom)-" || true').out
      if r.rc == 0 and crashes == '' then helper.rmtree(work) end
      assert.are.equal('', crashes, 'reproducers left in ' .. work)
      assert.are.equal(0, r.rc, (r.err:match('==%d+==ERROR.-\n\n') or r.err:sub(-3000)))
    end)
  end
end)
