-- wick.data.tokenize: JSONL of text -> JSONL of token ids (or back, with --decode), on all cores, in input
-- order; the tool to check a tokenizer against a Python stack.
--   ./run -m wick.data.tokenize --tokenizer FILE [--decode] [--field NAME] [--output OUT] INPUT.jsonl
-- Options are declared once (SPEC, wick.cli): the parser's types, ranges and help text come from the
-- same table, and the pattern's choices from wick.tokenizer's own declaration. The work happens on C threads (runtime/tokenizer/tokenize.c).
local cli = require 'wick.cli'
local core = require 'wick.core'
local ffi, C = core.ffi, core.C

local NAME = 'wick.data.tokenize'
local TOKENIZER = require 'wick.data.tokenizer'
local MIN_THREADS, MAX_THREADS = core.bounds(C.wk_tokenize_param_bounds, C.WK_TOKENIZE_THREADS)

local SPEC = cli.spec {
  name = NAME,
  usage = '--tokenizer FILE [options] INPUT.jsonl (or - for standard input)',
  positional = 'INPUT.jsonl',
  description = 'Writes one JSON array of token ids per line of text (or, with --decode, text per array).',
  options = {
    { 'tokenizer', 'path', value = 'FILE', required = true, help = "a tokenizer.json, a .tiktoken rank file, or 'bytes'" },
    cli.from(TOKENIZER.OPTIONS, 'pattern',
      { help = "a rank file's encoding when its name does not say (r50k, p50k, cl100k, o200k)" }),
    { 'decode', 'flag', help = 'read arrays of ids, write {"<field>": text} lines' },
    { 'field', 'string', value = 'NAME', default = 'text', help = 'the JSON string member holding the text' },
    { 'output', 'path', default = '-', help = "where to write ('-': standard output)" },
    { 'special', 'flag', help = 'special tokens written in the text become their ids' },
    { 'no_special_tokens', 'flag',
      help = "without the tokenizer.json post_processor's tokens around each text (e.g. Llama 3's " ..
             "<|begin_of_text|>): Hugging Face's add_special_tokens=False" },
    { 'threads', 'integer', min = MIN_THREADS, max = MAX_THREADS, default = 0, help = 'worker threads (0: all CPUs)' },
    { 'stats', 'flag', help = 'print lines, tokens and MB/s (per core too) on stderr' },
  },
}

local M = { SPEC = SPEC }

-- Tokenizes (or decodes) `input` with options keyed by Lua name (checked: raises on a bad one); returns
-- the stats table, or raises the message of what failed.
function M.tokenize(input, opts)
  opts = cli.check(SPEC, opts, 2)
  local tok, err = TOKENIZER.open(opts.tokenizer, { pattern = opts.pattern, special = opts.special,
                                                   add_special_tokens = not opts.no_special_tokens })
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
  local opts, positional = cli.parse(SPEC, args)
  if #positional ~= 1 then cli.usage_error(SPEC, 'give one INPUT.jsonl (or - for standard input)') end
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
