-- wick.plot: curves of training logs (the trainer's JSONL, log.file) over steps.
--   ./run -m wick.plot LOG.jsonl [more.jsonl ...] [-o FILE.svg] [--fields loss,lr,tokens_per_s] [--smooth N]
-- With -o, one SVG (any browser opens it): a panel per field, one polyline per log (run) with a
-- point per logged step, a legend, the eval loss marked on the loss panel. Without it, a compact
-- text chart per field on standard output. The same logs give the same bytes.
--
-- A log is a run: a resumed run's log continues its line (if a step is in a log twice, its last
-- record wins, as the run that wrote it last is the one that went on). A line that is no JSON
-- object with a step, an empty log and a field that no record has are one line naming the file
-- (and line).
local cli = require 'wick.cli'
local core = require 'wick.core'
local json = require 'wick.json'

local NAME = 'wick.plot'
local MAX_SMOOTH = 2 ^ 20
local EVAL_FIELD, EVAL_PANEL = 'eval_loss', 'loss' -- eval points are marked on the loss panel

local SPEC = cli.spec {
  name = NAME,
  usage = 'LOG.jsonl [more.jsonl ...] [options]',
  positional = 'LOG.jsonl',
  description = 'Plots fields of training logs over steps: an SVG with -o, else a text chart.',
  options = {
    { 'output', 'path', short = 'o', value = 'FILE.svg', help = 'write an SVG there (default: a text chart on stdout)' },
    { 'fields', 'string', value = 'A,B,...', default = 'loss,lr,tokens_per_s', help = 'numeric fields of the records, a panel each' },
    { 'smooth', 'integer', min = 1, max = MAX_SMOOTH, default = 1, help = 'mean of the last N points of each line' },
  },
}

local M = { SPEC = SPEC }

local function data_error(message) cli.fail(NAME .. ': ' .. message, cli.EXIT_DATA) end

-- ---- reading logs --------------------------------------------------------------------------------

-- A log's records in step order, one per step (the last one read wins).
function M.read_log(path)
  local text, err = core.read_file(path)
  if not text then data_error('cannot read ' .. err) end
  local by_step, number = {}, 0
  for line in (text .. '\n'):gmatch('([^\n]*)\n') do
    number = number + 1
    if line:match('%S') then
      local record, why = json.decode(line)
      if not record then data_error(('%s:%d: not JSON (%s)'):format(path, number, why)) end
      local step = type(record) == 'table' and record.step
      if type(step) ~= 'number' or step % 1 ~= 0 or step < 0 then
        data_error(('%s:%d: not a record of a step (no integer "step")'):format(path, number))
      end
      by_step[step] = record
    end
  end
  local steps = {}
  for step in pairs(by_step) do steps[#steps + 1] = step end
  if #steps == 0 then data_error(path .. ': empty (no records)') end
  table.sort(steps)
  local records = {}
  for i, step in ipairs(steps) do records[i] = by_step[step] end
  return records
end

-- { {step, value}, ... } of a field, smoothed by the mean of the last `smooth` values.
local function series(records, field, smooth)
  local points, window, sum = {}, {}, 0
  for _, r in ipairs(records) do
    local v = r[field]
    if type(v) == 'number' and v == v and v ~= math.huge and v ~= -math.huge then
      window[#window + 1] = v
      sum = sum + v
      if #window > smooth then sum = sum - table.remove(window, 1) end
      points[#points + 1] = { r.step, sum / #window }
    end
  end
  return points
end

-- runs: { name, records }; returns panels { field, lines = { points per run }, evals = { points per run } }.
local function panels_of(runs, fields, smooth)
  local panels = {}
  for _, field in ipairs(fields) do
    local panel, any = { field = field, lines = {}, evals = {} }, false
    for i, run in ipairs(runs) do
      panel.lines[i] = series(run.records, field, smooth)
      panel.evals[i] = field == EVAL_PANEL and series(run.records, EVAL_FIELD, 1) or {}
      any = any or #panel.lines[i] > 0
    end
    if not any then
      local names = {}
      for i, run in ipairs(runs) do names[i] = run.name end
      data_error(("no record of %s has a number '%s'"):format(table.concat(names, ', '), field))
    end
    panels[#panels + 1] = panel
  end
  return panels
end

-- An end of the y axis within a billionth of its range of 0 is 0 (a mean of zeros summed with
-- rounding, an lr decayed to 0).
local NEAR_ZERO = 1e-9

-- The x (steps) and y extents of a panel, padded when flat.
local function extents(panel)
  local x0, x1, y0, y1 = math.huge, -math.huge, math.huge, -math.huge
  for _, set in ipairs({ panel.lines, panel.evals }) do
    for _, points in ipairs(set) do
      for _, p in ipairs(points) do
        x0, x1, y0, y1 = math.min(x0, p[1]), math.max(x1, p[1]), math.min(y0, p[2]), math.max(y1, p[2])
      end
    end
  end
  if x1 == x0 then x1 = x0 + 1 end
  if y1 == y0 then
    local pad = math.abs(y0) > 0 and math.abs(y0) * 0.05 or 1
    y0, y1 = y0 - pad, y1 + pad
  end
  if math.abs(y0) < (y1 - y0) * NEAR_ZERO then y0 = 0 end
  if math.abs(y1) < (y1 - y0) * NEAR_ZERO then y1 = 0 end
  return x0, x1, y0, y1
end

local function label(v) return ('%.4g'):format(v) end

local function has_evals(panels)
  for _, panel in ipairs(panels) do
    for _, points in ipairs(panel.evals) do if #points > 0 then return true end end
  end
  return false
end

-- ---- SVG -----------------------------------------------------------------------------------------

local WIDTH, PANEL_HEIGHT, LEFT, RIGHT, TOP, GAP, LEGEND_ROW = 760, 200, 70, 20, 30, 50, 18
local COLORS = { '#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b', '#e377c2', '#7f7f7f', '#bcbd22',
  '#17becf' }

local function escape(s) return (s:gsub('[&<>"]', { ['&'] = '&amp;', ['<'] = '&lt;', ['>'] = '&gt;', ['"'] = '&quot;' })) end

local function svg_of(runs, panels)
  local legend_height = #runs * LEGEND_ROW + 10
  local height = TOP + legend_height + #panels * (PANEL_HEIGHT + GAP)
  local out = { ('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" ' ..
    'font-family="sans-serif" font-size="12">'):format(WIDTH, height, WIDTH, height),
    ('<rect width="%d" height="%d" fill="white"/>'):format(WIDTH, height) }
  local function add(fmt, ...) out[#out + 1] = fmt:format(...) end
  for i, run in ipairs(runs) do
    local y = TOP + (i - 1) * LEGEND_ROW
    add('<g class="legend"><line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"/>' ..
      '<text x="%d" y="%d">%s</text></g>', LEFT, y, LEFT + 24, y, COLORS[(i - 1) % #COLORS + 1], LEFT + 30, y + 4,
      escape(run.name))
  end
  local plot_width = WIDTH - LEFT - RIGHT
  for p, panel in ipairs(panels) do
    local top = TOP + legend_height + (p - 1) * (PANEL_HEIGHT + GAP)
    local x0, x1, y0, y1 = extents(panel)
    local function at(point)
      return LEFT + (point[1] - x0) / (x1 - x0) * plot_width, top + PANEL_HEIGHT - (point[2] - y0) / (y1 - y0) * PANEL_HEIGHT
    end
    add('<g class="panel" data-field="%s">', escape(panel.field))
    add('<text x="%d" y="%d" font-weight="bold">%s</text>', LEFT, top - 8, escape(panel.field))
    add('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#999"/>', LEFT, top, plot_width, PANEL_HEIGHT)
    add('<text x="%d" y="%d" text-anchor="end">%s</text>', LEFT - 6, top + 10, label(y1))
    add('<text x="%d" y="%d" text-anchor="end">%s</text>', LEFT - 6, top + PANEL_HEIGHT, label(y0))
    add('<text x="%d" y="%d">%s</text>', LEFT, top + PANEL_HEIGHT + 16, label(x0))
    add('<text x="%d" y="%d" text-anchor="end">step %s</text>', LEFT + plot_width, top + PANEL_HEIGHT + 16, label(x1))
    for i, points in ipairs(panel.lines) do
      local color, coords = COLORS[(i - 1) % #COLORS + 1], {}
      for k, point in ipairs(points) do coords[k] = ('%.2f,%.2f'):format(at(point)) end
      add('<polyline data-run="%d" fill="none" stroke="%s" stroke-width="1.5" points="%s"/>', i, color,
        table.concat(coords, ' '))
      for _, point in ipairs(panel.evals[i]) do
        local x, y = at(point)
        add('<circle class="eval" data-run="%d" cx="%.2f" cy="%.2f" r="3.5" fill="white" stroke="%s"/>', i, x, y, color)
      end
    end
    add('</g>')
  end
  if has_evals(panels) then
    add('<text x="%d" y="%d" fill="#555">o: eval loss</text>', WIDTH - RIGHT - 80, TOP)
  end
  out[#out + 1] = '</svg>'
  return table.concat(out, '\n') .. '\n'
end

-- ---- text ----------------------------------------------------------------------------------------

local CHART_WIDTH, CHART_HEIGHT = 60, 8
local MARKS = { '*', '+', 'x', '#', '@', '%', '&', '=', '~', '$' }

local function text_of(runs, panels)
  local out = {}
  local legend = {}
  for i, run in ipairs(runs) do legend[i] = MARKS[(i - 1) % #MARKS + 1] .. ' ' .. run.name end
  out[1] = table.concat(legend, '   ') .. (has_evals(panels) and '   o eval_loss' or '')
  for _, panel in ipairs(panels) do
    local x0, x1, y0, y1 = extents(panel)
    local grid = {}
    for row = 1, CHART_HEIGHT do grid[row] = {} for col = 1, CHART_WIDTH do grid[row][col] = ' ' end end
    local function put(point, mark)
      local col = 1 + math.floor((point[1] - x0) / (x1 - x0) * (CHART_WIDTH - 1) + 0.5)
      local row = CHART_HEIGHT - math.floor((point[2] - y0) / (y1 - y0) * (CHART_HEIGHT - 1) + 0.5)
      grid[row][col] = mark
    end
    for i, points in ipairs(panel.lines) do
      for _, point in ipairs(points) do put(point, MARKS[(i - 1) % #MARKS + 1]) end
    end
    for _, points in ipairs(panel.evals) do
      for _, point in ipairs(points) do put(point, 'o') end
    end
    out[#out + 1] = ''
    out[#out + 1] = panel.field
    for row = 1, CHART_HEIGHT do
      local axis = row == 1 and label(y1) or row == CHART_HEIGHT and label(y0) or ''
      out[#out + 1] = ('%10s |%s'):format(axis, table.concat(grid[row]))
    end
    out[#out + 1] = ('%10s +%s'):format('', ('-'):rep(CHART_WIDTH))
    out[#out + 1] = ('%10s  %-' .. (CHART_WIDTH - 10) .. 's%10s'):format('', label(x0), 'step ' .. label(x1))
  end
  return table.concat(out, '\n') .. '\n'
end

-- ---- the tool ------------------------------------------------------------------------------------

-- The SVG (svg = true) or text chart of logs (paths) for fields (a list) smoothed over `smooth`.
function M.render(paths, fields, smooth, svg)
  local runs = {}
  for i, path in ipairs(paths) do runs[i] = { name = path, records = M.read_log(path) } end
  local panels = panels_of(runs, fields, smooth)
  return svg and svg_of(runs, panels) or text_of(runs, panels)
end

local function fields_of(text)
  local fields = {}
  for field in text:gmatch('[^,]+') do
    if not field:match('^[%w_]+$') then cli.usage_error(SPEC, ("--fields: '%s' is not a field name"):format(field)) end
    fields[#fields + 1] = field
  end
  if #fields == 0 then cli.usage_error(SPEC, '--fields names no field') end
  return fields
end

function M.main(args)
  local opts, paths = cli.parse(SPEC, args)
  if #paths == 0 then cli.usage_error(SPEC, 'give at least one LOG.jsonl') end
  local result = M.render(paths, fields_of(opts.fields), opts.smooth, opts.output ~= nil)
  if not opts.output then
    io.stdout:write(result)
    return 0
  end
  local f, err = io.open(opts.output, 'wb')
  if not f then data_error('cannot write ' .. tostring(err)) end
  local ok, why = f:write(result)
  local closed, close_why = f:close()
  if not ok or not closed then data_error(('cannot write %s: %s'):format(opts.output, tostring(why or close_why))) end
  return 0
end

return M
