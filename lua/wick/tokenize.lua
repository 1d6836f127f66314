-- wick.tokenize: JSONL of text -> JSONL of token ids (or back, with --decode), on all cores, in input
-- order; the tool to check a tokenizer against a Python stack.
--   ./run -m wick.tokenize --tokenizer FILE [--decode] [--field NAME] [--output OUT] INPUT.jsonl
-- Options are declared once (OPTIONS, wick.schema): the parser's types, ranges and help text come
-- from the same table. The work happens on C threads (runtime/data/tokenizer/tokenize.c).
local cli = require 'wick.cli'
local core = require 'wick.core'
local schema = require 'wick.schema'
local ffi, C = core.ffi, core.C

local NAME = 'wick.tokenize'
local TOKENIZER = require 'wick.tokenizer'

local OPTIONS = schema.define(NAME .. ' option', {
  { 'tokenizer', 'string', required = true,
    help = "a tokenizer.json, a .tiktoken rank file, or 'bytes'" },
  { 'pattern', 'enum', values = TOKENIZER.OPTIONS:option('pattern').values,
    help = "a rank file's encoding when its name does not say (r50k, p50k, cl100k, o200k)" },
  { 'decode', 'boolean', default = false, help = 'read arrays of ids, write {"<field>": text} lines' },
  { 'field', 'string', default = 'text', help = 'the JSON string member holding the text' },
  { 'output', 'string', default = '-', help = "where to write ('-': standard output)" },
  { 'special', 'boolean', default = false, help = 'special tokens written in the text become their ids' },
  { 'threads', 'integer', min = 0, max = 256, default = 0, help = 'worker threads (0: all CPUs)' },
  { 'stats', 'boolean', default = false, help = 'print lines, tokens and MB/s (per core too) on stderr' },
})

-- The command line's spec for wick.cli, from OPTIONS: booleans are flags, the rest take a value.
local CLI_TYPES = { boolean = 'flag', integer = 'number' }
local spec = { name = NAME, usage = '--tokenizer FILE [options] INPUT.jsonl (or - for stdin)', positional = 'INPUT',
               description = 'Writes one JSON array of token ids per line of text (or, with --decode, text per array).',
               options = {} }
for _, option in ipairs(OPTIONS.options) do
  spec.options[#spec.options + 1] = { option[1], CLI_TYPES[option[2]] or 'string', default = option.default,
                                      required = option.required, help = option.help }
end

local M = { OPTIONS = OPTIONS }

-- Checks parsed options (raises a usage message) and runs; returns the stats table.
function M.tokenize(input, opts)
  local tok, err = TOKENIZER.open(opts.tokenizer, { pattern = opts.pattern, special = opts.special })
  if not tok then error(err, 0) end
  local stats = ffi.new('WkTokenizeStats')
  io.stdout:flush()
  local status = C.wk_tokenize_jsonl(tok.handle, input, opts.output, opts.field, opts.decode and 1 or 0,
    opts.threads, stats)
  local message = status ~= 0 and core.last_error()
  tok:close()
  if message then error(message, 0) end
  return { lines = tonumber(stats.lines), text_bytes = tonumber(stats.text_bytes), tokens = tonumber(stats.tokens),
           seconds = tonumber(stats.seconds), cpu_seconds = tonumber(stats.cpu_seconds),
           threads = tonumber(stats.threads) }
end

function M.main(args)
  local given, positional = cli.parse(spec, args)
  local ok, opts = pcall(OPTIONS.check, OPTIONS, given, 0)
  if not ok then cli.usage_error(spec, tostring(opts)) end
  if #positional ~= 1 then cli.usage_error(spec, 'give one INPUT.jsonl (or - for standard input)') end
  local done, stats = pcall(M.tokenize, positional[1], opts)
  if not done then
    io.stderr:write(NAME, ': ', tostring(stats), '\n')
    return 1
  end
  if opts.stats then
    local mb = stats.text_bytes / 1e6
    io.stderr:write(('%s: %d lines, %.2f MB of text, %d tokens in %.3f s on %d threads: %.1f MB/s, %.1f MB/s per ' ..
      'core (%.2f CPU s)\n'):format(NAME, stats.lines, mb, stats.tokens, stats.seconds, stats.threads,
      mb / math.max(stats.seconds, 1e-9), mb / math.max(stats.cpu_seconds, 1e-9), stats.cpu_seconds))
  end
  return 0
end

return M
