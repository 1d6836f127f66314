-- wick.shard: the dataset converter's command line.
--   ./run -m wick.shard INPUTS... -o OUTDIR [options]
-- Lua only parses arguments and prints the summary; reading, tokenizing, compressing and writing
-- happen on C threads (runtime/data/convert.c). The help text is generated from OPTIONS, the same
-- table the parser reads.
local core = require 'wick.core'
local ffi, C = core.ffi, core.C

local OPTIONS = {
  { long = 'output', short = 'o', value = 'DIR', help = 'dataset directory to write (created; required)' },
  { long = 'tokenizer', value = 'NAME',
    help = "'bytes' (bytes 0..255 + EOS 256) or 'gpt2' (.bin token files); default: by the inputs" },
  { long = 'field', value = 'NAME', default = 'text', help = 'the JSON string member holding the text in .jsonl' },
  { long = 'split', value = 'file|paragraph|line', default = 'file',
    help = 'how a text file becomes documents: whole, per blank-line-separated paragraph, or per line' },
  { long = 'include', value = 'GLOBS',
    help = "only files matching one of these comma-separated globs when walking directories, e.g. '*.py,*.md'" },
  { long = 'compression', value = 'zstd[:LEVEL]|none', default = 'zstd:3',
    help = "block compression; 'none' writes raw, mmap-able blocks" },
  { long = 'shard-size', value = 'TOKENS', default = '64M',
    help = 'a shard closes after the document that reaches this many tokens (K, M, G = 2^10, 2^20, 2^30)' },
  { long = 'block-size', value = 'TOKENS', default = '64K', help = 'tokens per block: the unit of fetch and decode' },
  { long = 'threads', value = 'N', help = 'worker threads (default: all CPUs)' },
  { long = 'strict', help = 'fail on the first bad line or document instead of skipping it' },
  { long = 'resume', help = 'keep shards of an interrupted run that hold exactly what this run would write' },
  { long = 'progress', help = 'draw a progress bar on stderr (default: when stderr is a terminal)' },
  { long = 'no-progress', help = 'never draw the progress bar' },
  { long = 'quiet', short = 'q', help = 'print nothing on success' },
  { long = 'help', short = 'h', help = 'show this help' },
}

local USAGE = [[
usage: run -m wick.shard INPUTS... -o OUTDIR [options]

Converts text to a Wick dataset (index.json + shard-NNNNN.wks; format: runtime/data/FORMAT.md).
INPUTS are files or directories (walked recursively in sorted order, hidden entries skipped):
  *.jsonl, *.ndjson            one JSON object per line; the document is its --field string
  *.jsonl.zst, *.ndjson.zst    the same, zstd-compressed
  *.bin                        llm.c (magic 20240520) or nanoGPT uint16 GPT-2 tokens,
                               documents separated by <|endoftext|>
  anything else                text: one document per file (or per paragraph, or line: --split)
Bad lines (invalid JSON, missing field, invalid UTF-8) are skipped and reported as file:line.
The output is byte-identical for the same inputs and options, whatever --threads.
]]

local function help_text()
  local lines = { USAGE, 'options:' }
  for _, o in ipairs(OPTIONS) do
    local names = (o.short and ('-' .. o.short .. ', ') or '    ') .. '--' .. o.long .. (o.value and (' ' .. o.value) or '')
    local text = o.help .. (o.default and (' (default ' .. o.default .. ')') or '')
    lines[#lines + 1] = string.format('  %-34s %s', names, text)
  end
  return table.concat(lines, '\n') .. '\n'
end

local by_name = {}
for _, o in ipairs(OPTIONS) do
  by_name['--' .. o.long] = o
  if o.short then by_name['-' .. o.short] = o end
end

-- Returns options (keyed by long name) and the inputs, or nil and a message.
local function parse(args)
  local opts, inputs = {}, {}
  for _, o in ipairs(OPTIONS) do opts[o.long] = o.default end
  local i = 1
  while i <= #args do
    local a = args[i]
    local name, inline = a:match('^(%-%-[^=]+)=(.*)$')
    name = name or a
    local o = a:sub(1, 1) == '-' and a ~= '-' and by_name[name]
    if o then
      if o.value then
        local v = inline
        if not v then
          i = i + 1
          v = args[i]
        end
        if not v then return nil, name .. ' needs a value (' .. o.value .. ')' end
        opts[o.long] = v
      else
        if inline then return nil, name .. ' takes no value' end
        opts[o.long] = true
      end
    elseif a:sub(1, 1) == '-' and a ~= '-' then
      return nil, "unknown option '" .. a .. "'"
    else
      inputs[#inputs + 1] = a
    end
    i = i + 1
  end
  return opts, inputs
end

local UNITS = { [''] = 1, K = 2 ^ 10, M = 2 ^ 20, G = 2 ^ 30 }

local function parse_size(text, what)
  local number, unit = tostring(text):match('^(%d+)([KMG]?)$')
  if not number then error(string.format("%s '%s' must be a whole number with an optional K, M or G", what, text), 0) end
  local value = tonumber(number) * UNITS[unit]
  if value < 1 then error(what .. ' must be at least 1', 0) end
  return value
end

local function human_bytes(n)
  local units = { 'B', 'KB', 'MB', 'GB', 'TB' }
  local u = 1
  while n >= 1000 and u < #units do n, u = n / 1000, u + 1 end
  return string.format(u == 1 and '%d %s' or '%.1f %s', n, units[u])
end

local M = { OPTIONS = OPTIONS, help = help_text, parse = parse }

-- Runs the converter; returns the stats table and the list of reported bad lines. Raises on failure.
function M.convert(inputs, opts)
  opts = opts or {}
  local cv = C.wk_converter_new(opts.output, opts.tokenizer)
  if cv == nil then error(core.last_error(), 0) end
  cv = ffi.gc(cv, C.wk_converter_free)
  local function set(param, value) core.check(C.wk_converter_set(cv, param, value), 0) end
  local compression = opts.compression or 'zstd:3'
  local level
  if compression == 'none' then
    set(C.WK_CONVERT_COMPRESSION, 0)
  else
    level = compression:match('^zstd:?(%-?%d*)$')
    if not level then error("--compression must be 'zstd', 'zstd:LEVEL' or 'none', not '" .. compression .. "'", 0) end
    set(C.WK_CONVERT_COMPRESSION, 1)
    if level ~= '' then set(C.WK_CONVERT_LEVEL, tonumber(level)) end
  end
  set(C.WK_CONVERT_SHARD_TOKENS, parse_size(opts['shard-size'] or '64M', '--shard-size'))
  set(C.WK_CONVERT_BLOCK_TOKENS, parse_size(opts['block-size'] or '64K', '--block-size'))
  if opts.threads then set(C.WK_CONVERT_THREADS, parse_size(opts.threads, '--threads')) end
  set(C.WK_CONVERT_STRICT, opts.strict and 1 or 0)
  set(C.WK_CONVERT_PROGRESS, opts.progress and 1 or 0)
  set(C.WK_CONVERT_RESUME, opts.resume and 1 or 0)
  local splits = { file = C.WK_TEXT_SPLIT_FILE, paragraph = C.WK_TEXT_SPLIT_PARAGRAPH, line = C.WK_TEXT_SPLIT_LINE }
  local split = splits[opts.split or 'file']
  if not split then error("--split must be 'file', 'paragraph' or 'line', not '" .. tostring(opts.split) .. "'", 0) end
  set(C.WK_CONVERT_TEXT_SPLIT, split)
  core.check(C.wk_converter_set_field(cv, opts.field or 'text'), 0)
  core.check(C.wk_converter_set_include(cv, opts.include), 0)
  for _, path in ipairs(inputs) do core.check(C.wk_converter_add_input(cv, path), 0) end
  local status = C.wk_converter_run(cv)
  local s = ffi.new('WkConvertStats')
  C.wk_converter_stats(cv, s)
  local stats = {}
  for _, f in ipairs { 'inputs', 'input_bytes', 'documents', 'tokens', 'shards', 'output_bytes', 'bad', 'empty',
                       'reused' } do
    stats[f] = tonumber(s[f])
  end
  stats.seconds = tonumber(s.seconds)
  local bad = {}
  local i = 0
  while true do
    local line = C.wk_converter_bad_line(cv, i)
    if line == nil then break end
    bad[#bad + 1] = ffi.string(line)
    i = i + 1
  end
  C.wk_converter_free(ffi.gc(cv, nil))
  if status ~= 0 then error(core.last_error(), 0) end
  return stats, bad
end

local SHOWN_BAD = 20

function M.main(args)
  local opts, inputs = parse(args)
  if not opts then
    io.stderr:write('wick.shard: ', inputs, '\n', 'run `run -m wick.shard --help` for usage\n')
    return 2
  end
  if opts.help then
    io.stdout:write(help_text())
    return 0
  end
  if not opts.output then
    io.stderr:write('wick.shard: -o OUTDIR is required\n', 'run `run -m wick.shard --help` for usage\n')
    return 2
  end
  if #inputs == 0 then
    io.stderr:write('wick.shard: no INPUTS given\n', 'run `run -m wick.shard --help` for usage\n')
    return 2
  end
  if opts['no-progress'] then
    opts.progress = false
  elseif not opts.progress then
    local ok, host = pcall(require, 'wick.host')
    opts.progress = ok and host.isatty(2) and not opts.quiet
  end
  local ok, stats, bad = pcall(M.convert, inputs, opts)
  if not ok then
    io.stderr:write('wick.shard: ', tostring(stats), '\n')
    return 1
  end
  if #bad > 0 then
    for k = 1, math.min(#bad, SHOWN_BAD) do io.stderr:write('wick.shard: skipped ', bad[k], '\n') end
    if stats.bad > SHOWN_BAD then
      io.stderr:write(string.format('wick.shard: ... and %d more bad lines\n', stats.bad - SHOWN_BAD))
    end
  end
  if not opts.quiet then
    local seconds = math.max(stats.seconds, 1e-9)
    io.stdout:write(string.format(
      '%s: %d inputs (%s) -> %d documents, %d tokens in %d shards (%s%s) in %.2f s (%s/s in, %.1f M tokens/s); ' ..
      '%d bad, %d empty skipped\n',
      opts.output, stats.inputs, human_bytes(stats.input_bytes), stats.documents, stats.tokens, stats.shards,
      human_bytes(stats.output_bytes), stats.reused > 0 and string.format(', %d reused', stats.reused) or '',
      stats.seconds, human_bytes(stats.input_bytes / seconds), stats.tokens / seconds / 1e6, stats.bad, stats.empty))
  end
  return 0
end

return M
