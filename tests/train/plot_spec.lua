-- run -m wick.plot: SVG curves of real training logs, parsed back as XML (Python's ElementTree, an
-- independent parser), the text chart, and bad logs refused in one line naming file and line.
local helper = require 'helper'
local data_helper = require 'helpers.data'
local q = helper.shell_quote

-- For each panel (data-field) and run (data-run) of an SVG: its polyline's points as "x,y" strings,
-- and the eval markers' count; ElementTree raises on anything that is not well-formed XML.
local SVG_READER = [[
import sys, xml.etree.ElementTree as ET
ns = {"s": "http://www.w3.org/2000/svg"}
root = ET.parse(sys.argv[1]).getroot()
assert root.tag == "{http://www.w3.org/2000/svg}svg", root.tag
for g in root.findall("s:g[@class='panel']", ns):
    for line in g.findall("s:polyline", ns):
        print("line", g.get("data-field"), line.get("data-run"), " ".join(line.get("points").split()))
    print("evals", g.get("data-field"), len(g.findall("s:circle[@class='eval']", ns)))
]]

local function read_svg(path)
  local reader = helper.write_file(os.tmpname(), SVG_READER)
  local r = helper.sh('python3 ' .. q(reader) .. ' ' .. q(path))
  os.remove(reader)
  assert.are.equal(0, r.rc, r.err)
  local lines, evals = {}, {}
  for line in r.out:gmatch('[^\n]+') do
    local field, run, points = line:match('^line (%S+) (%S+) ?(.*)$')
    if field then
      lines[field] = lines[field] or {}
      local list = {}
      for p in points:gmatch('%S+') do list[#list + 1] = p end
      lines[field][tonumber(run)] = list
    else
      local f, n = line:match('^evals (%S+) (%d+)$')
      evals[f] = tonumber(n)
    end
  end
  return lines, evals
end

local function plot(args) return helper.run('-m wick.plot ' .. args) end

describe('run -m wick.plot', function()
  local root, trained, resumed
  setup(function()
    root = helper.tmpdir()
    local dataset = data_helper.make_dataset(root .. '/data', data_helper.documents(300, 40, 6), { shard_size = 4096 })
    local recipe = helper.write_file(root .. '/recipe.lua', ([[
return {
  model = { layers = 1, heads = 2, dim = 16 },
  data = { sources = { %q }, seq_len = 32 },
  batch = { global = 4, micro = 2 },
  optim = { lr = 3e-3, warmup = 2 },
  steps = 6, seed = 3, eval = { source = %q, every = 2 },
}
]]):format(dataset, dataset))
    trained = root .. '/trained.jsonl'
    local r = helper.run(q(recipe) .. ' --log=' .. q(trained))
    assert.are.equal(0, r.rc, r.err)
    -- A log as a resumed run leaves it when the killed run had logged past its checkpoint: steps 3
    -- and 4 twice, the resumed run's records last.
    local lines = helper.lines(helper.read_file(trained))
    resumed = helper.write_file(root .. '/resumed.jsonl', table.concat({ lines[1], lines[2],
      lines[3]:gsub('"loss":[^,]+', '"loss":99'), lines[4]:gsub('"loss":[^,]+', '"loss":99'),
      lines[3], lines[4], lines[5], lines[6] }, '\n') .. '\n')
  end)
  teardown(function() helper.rmtree(root) end)

  it('draws a panel per field with one polyline per run and one point per logged step', function()
    local svg = root .. '/two.svg'
    local r = plot(('%s %s -o %s --fields loss,lr,tokens_per_s,eval_loss'):format(q(trained), q(resumed), q(svg)))
    assert.are.equal(0, r.rc, r.err)
    local lines, evals = read_svg(svg)
    for _, field in ipairs({ 'loss', 'lr', 'tokens_per_s' }) do
      assert.are.equal(2, #lines[field], field)
      assert.are.equal(6, #lines[field][1], field)
      assert.are.equal(6, #lines[field][2], field .. ': the resumed log continues one line')
    end
    assert.are.same(lines.loss[1], lines.loss[2]) -- the resumed run's records of steps 3 and 4 won
    assert.are.equal(3, #lines.eval_loss[1])      -- evaluated at steps 2, 4 and 6
    assert.are.equal(6, evals.loss)               -- and marked on the loss panel, for both runs
    assert.matches(trained, helper.read_file(svg), 1, true) -- the legend names the runs
    local again = root .. '/again.svg'
    assert.are.equal(0, plot(('%s %s -o %s --fields loss,lr,tokens_per_s,eval_loss'):format(q(trained), q(resumed),
      q(again))).rc)
    assert.are.equal(helper.read_file(svg), helper.read_file(again), 'the same logs, the same bytes')
  end)

  it('smooths each line by the mean of its last N points', function()
    local log = helper.write_file(root .. '/saw.jsonl',
      '{"step":1,"loss":0}\n{"step":2,"loss":10}\n{"step":3,"loss":0}\n{"step":4,"loss":10}\n')
    local svg = root .. '/saw.svg'
    assert.are.equal(0, plot(('%s -o %s --fields loss --smooth 2'):format(q(log), q(svg))).rc)
    local points = read_svg(svg).loss[1]
    local y = {}
    for i, p in ipairs(points) do y[i] = p:match(',(.+)$') end
    assert.are_not.equal(y[1], y[2])
    assert.are.same({ y[2], y[2] }, { y[3], y[4] }) -- 0, 5, 5, 5
  end)

  it('prints a text chart without -o', function()
    local r = plot(('%s %s --fields loss,lr'):format(q(trained), q(resumed)))
    assert.are.equal(0, r.rc, r.err)
    assert.matches('* ' .. trained .. '   + ' .. resumed .. '   o eval_loss\n', r.out, 1, true)
    assert.matches('\nloss\n', r.out, 1, true)
    assert.matches('\nlr\n', r.out, 1, true)
    assert.matches('step 6\n$', r.out)
    assert.is_nil(r.out:find('<svg', 1, true))
  end)

  it("plots a line that ends at 0 down to 0, smoothed or not (a running mean's rounding is no axis label)", function()
    local values = { 0.1, 0.2, 0.7, 0.3, 0, 0, 0, 0 } -- (0.1 + 0.2) - 0.1 is not 0.2 in doubles
    local lines = {}
    for step, v in ipairs(values) do lines[step] = ('{"step":%d,"lr":%.17g}'):format(step, v) end
    local log = helper.write_file(os.tmpname(), table.concat(lines, '\n') .. '\n')
    for _, smooth in ipairs({ 1, 4 }) do
      local r = plot(('%s --fields lr --smooth %d'):format(q(log), smooth))
      assert.are.equal(0, r.rc, r.err)
      assert.matches('\n +0 |', r.out) -- the axis' low end is the last points' exact mean
    end
    os.remove(log)
  end)

  it('refuses bad logs in one line naming the file and line', function()
    local cases = {
      { '{"step":1,"loss":1}\n{"step":2,"loss":\n', ':2: not JSON (column 18: unexpected end)' },
      { '{"step":1,"loss":1}\n\n[1, 2]\n', ':3: not a record of a step (no integer "step")' },
      { '', ': empty (no records)' },
      { '{"step":1,"lr":1}\n', ": has a number 'loss'" },
    }
    for i, case in ipairs(cases) do
      local log = helper.write_file(('%s/bad%d.jsonl'):format(root, i), case[1])
      local r = plot(q(log) .. ' --fields loss')
      assert.are.equal(1, r.rc, r.err)
      local want = i == 4 and ("wick.plot: no record of " .. log .. " has a number 'loss'\n") or ('wick.plot: ' .. log .. case[2] .. '\n')
      assert.are.equal(want, r.err)
    end
    local missing = plot(q(root .. '/missing.jsonl'))
    assert.are.equal(1, missing.rc)
    assert.matches(root .. '/missing.jsonl', missing.err, 1, true)
  end)

  it('refuses bad usage with exit status 2', function()
    for args, want in pairs({ [''] = 'give at least one LOG.jsonl', ['x.jsonl --smooth 0'] = '--smooth',
      ['x.jsonl --fields "a b"'] = "--fields: 'a b' is not a field name", ['x.jsonl --colour red'] = "unknown option" }) do
      local r = plot(args)
      assert.are.equal(2, r.rc, args .. ': ' .. r.err)
      assert.matches(want, r.err, 1, true)
    end
  end)
end)
