-- wick.data.convert: the dataset converter's command line.
--   ./run -m wick.data.convert INPUTS... -o OUTDIR [options]
-- Lua only parses arguments and prints the summary; reading, tokenizing, compressing and writing
-- happen on C threads (runtime/convert/). The options are declared once (SPEC, wick.cli): the
-- parser, the checks and the help text come from that table.
local cli = require 'wick.cli'
local core = require 'wick.core'
local TOKENIZER = require 'wick.data.tokenizer'
local ffi, C = core.ffi, core.C

-- An integer option with the converter's own bounds (wk_converter_param_bounds), and its default when
-- `with_default` (wk_converter_param_default).
local function bounded(option, param, with_default)
  option.min, option.max = core.bounds(C.wk_converter_param_bounds, param)
  if with_default then option.default = core.default(C.wk_converter_param_default, param) end
  return option
end

local function compression_form(v)
  return type(v) == 'string' and (v == 'none' or v == 'zstd' or v:match('^zstd:%-?%d+$') ~= nil),
      "must be 'none', 'zstd' or 'zstd:LEVEL'"
end

-- The input formats, as --help and docs/data.md list them, from the converter's own table
-- (wk_converter_input_format): the names padded to a column, what is read wrapped to WIDTH.
local WIDTH, NAMES_WIDTH = 100, 28
local function input_formats()
  local lines, reads = {}, ffi.new('const char *[1]')
  local i = 0
  while true do
    local names = C.wk_converter_input_format(i, reads)
    if names == nil then return table.concat(lines, '\n') end
    local line = ('  %-' .. NAMES_WIDTH .. 's'):format(ffi.string(names))
    for word in ffi.string(reads[0]):gmatch('%S+') do
      if #line + 1 + #word > WIDTH and line:match('%S') then
        lines[#lines + 1] = line
        line = (' '):rep(NAMES_WIDTH + 2)
      end
      line = line .. ' ' .. word
    end
    lines[#lines + 1] = line
    i = i + 1
  end
end

local DESCRIPTION = ([[
Converts text to a Wick dataset (index.json + shard-NNNNN.wks; format: runtime/format/FORMAT.md).
INPUTS are files or directories (walked recursively in sorted order, hidden entries skipped):
%s
Bad lines (invalid JSON, missing field, invalid UTF-8) are skipped and reported as file:line (for
Parquet and tar: file:row and file:sample).
The output is byte-identical for the same inputs and options, whatever --threads.]]):format(input_formats())

local SPEC = cli.spec {
  name = 'wick.data.convert',
  usage = 'INPUTS... -o OUTDIR [options]',
  positional = 'INPUTS',
  description = DESCRIPTION,
  options = {
    { 'output', 'path', short = 'o', value = 'DIR', required = true, help = 'dataset directory to write (created)' },
    { 'tokenizer', 'string', value = 'NAME|FILE',
      help = "a tokenizer.json or .tiktoken rank file, 'bytes' (bytes 0..255 + EOS 256) or 'gpt2' (.bin " ..
             "token files); default: bytes for text, gpt2 for .bin" },
    cli.from(TOKENIZER.OPTIONS, 'pattern', { value = 'ENCODING',
      help = "a rank file's encoding when its name does not say (r50k, p50k, cl100k, o200k)" }),
    { 'special', 'flag', help = 'special tokens written in the text become their ids (default: plain text)' },
    { 'no_special_tokens', 'flag',
      help = "do not put the tokenizer.json post_processor's tokens around each document (e.g. Llama 3's " ..
             "<|begin_of_text|> before it); default: they are, as Hugging Face's add_special_tokens" },
    { 'eos', 'string', value = 'TOKEN',
      help = "the token ending each document, by text or id (default: the tokenizer's own EOS); for token files " ..
             "(.bin, .npy), the id separating their documents, with --vocab-size" },
    { 'vocab_size', 'integer', value = 'N', min = 1, max = select(2, core.bounds(C.wk_converter_param_bounds,
                                                                                   C.WK_CONVERT_VOCAB_SIZE)),
      help = 'token files (.bin, .npy) hold ids below N (each is checked), documents separated by --eos ID ' ..
             "(default for .bin: GPT-2's 50257 and 50256)" },
    { 'field', 'string', value = 'NAME', default = 'text',
      help = 'where the text is: the JSON string member (.jsonl), the column (.parquet), the member extension (.tar)' },
    { 'column', 'strings', value = 'NAME=FIELD:KIND',
      help = "a column of the dataset from each record's FIELD (JSONL member, Parquet column, tar member " ..
             "extension or json.NAME of its .json member; a text file has only its text, --field): KIND " ..
             "tokens (NAME tokens: the token stream, a string tokenized or a list of ids), mask (a list aligned " ..
             "with the tokens: -100 -> 0, else 1), token_u8 (0..255 per token), i64, f32, bytes, or a tensor " ..
             "f32[4,8] (f32, i32, i64, u8); a record whose field does not fit is a bad line" },
    { 'no_text', 'flag',
      help = 'records have no text (images, labels): each is its --column values and an EOS; without it a record ' ..
             'missing its text field is a bad line' },
    { 'json_field', 'string', value = 'NAME', default = 'text',
      help = "the string member of a tar sample's .json member (with --field json)" },
    { 'headerless_bin', 'flag',
      help = ".bin inputs are nanoGPT's uint16 tokens without a header (default: llm.c files, magic checked)" },
    { 'split', 'enum', values = { 'file', 'paragraph', 'line' }, default = 'file',
      help = 'how a text file becomes documents: whole, per blank-line-separated paragraph, or per line' },
    { 'include', 'string', value = 'GLOBS',
      help = "only files matching one of these comma-separated globs when walking directories, e.g. '*.py,*.md'" },
    { 'compression', 'string', value = 'zstd[:LEVEL]|none', default = 'zstd:3', check = compression_form,
      help = "block compression; 'none' writes raw, mmap-able blocks" },
    bounded({ 'shard_size', 'size', value = 'TOKENS',
      help = 'a shard closes after the document that reaches this many tokens (K, M, G = 2^10, 2^20, 2^30)' },
      C.WK_CONVERT_SHARD_TOKENS, true),
    bounded({ 'block_size', 'size', value = 'TOKENS',
      help = 'tokens per block: the unit of fetch and decode' }, C.WK_CONVERT_BLOCK_TOKENS, true),
    bounded({ 'threads', 'integer', help = 'worker threads (default: all CPUs, up to the maximum)' }, C.WK_CONVERT_THREADS),
    { 'strict', 'flag', help = 'fail on the first bad line or document instead of skipping it' },
    { 'resume', 'flag', help = 'keep shards of an interrupted run that hold exactly what this run would write' },
    { 'progress', 'flag', help = 'draw a progress bar on stderr (default: when stderr is a terminal)' },
    { 'no_progress', 'flag', help = 'never draw the progress bar' },
    { 'quiet', 'flag', short = 'q', help = 'print nothing on success' },
  },
}

-- Returns options (keyed by Lua name) and the inputs; raises a usage error (wick.cli).
local function parse(args) return cli.parse(SPEC, args) end

local function human_bytes(n)
  local units = { 'B', 'KB', 'MB', 'GB', 'TB' }
  local u = 1
  while n >= 1000 and u < #units do n, u = n / 1000, u + 1 end
  return string.format(u == 1 and '%d %s' or '%.1f %s', n, units[u])
end

local M = { SPEC = SPEC, OPTIONS = SPEC.options, help = function() return cli.help(SPEC) end, parse = parse,
            input_formats = input_formats }

-- What the written dataset's ids are (stats.tokenizer, .vocab_size, .eos) and, when the converter put the
-- tokenizer's template around each document, what each is as text, its EOS last:
-- '<|begin_of_text|> $A <|end_of_text|>' (.template).
local function describe_dataset(stats, dir, tok)
  local ds = require('wick.data.dataset').open(dir)
  if not ds then return end
  stats.tokenizer, stats.vocab_size, stats.eos = ds.tokenizer, ds.vocab_size, ds.eos
  local t = ds.template
  if tok and t and t.applied then
    local parts = {}
    for _, id in ipairs(t.prefix) do parts[#parts + 1] = tok:decode { id } end
    parts[#parts + 1] = '$A'
    for _, id in ipairs(t.suffix) do parts[#parts + 1] = tok:decode { id } end
    parts[#parts + 1] = tok:decode { ds.eos }
    stats.template = table.concat(parts, ' ')
  end
  ds:close()
end

-- Runs the converter; returns the stats table (with describe_dataset's fields) and the list of reported
-- bad lines. `opts` holds the options by Lua name (shard_size = 2^20, ...), checked by SPEC. What the converter refuses
-- of the options is a usage error; a failure on the inputs, a data error (wick.cli user errors).
function M.convert(inputs, opts)
  opts = cli.check(SPEC, opts or {}, 2)
  local function refused_option(status)
    if status ~= 0 then cli.fail('wick.data.convert: ' .. core.last_error(), cli.EXIT_USAGE) end
  end
  local function failed_input(status)
    if status ~= 0 then cli.fail('wick.data.convert: ' .. core.last_error(), cli.EXIT_DATA) end
  end
  -- gpt2 only describes .bin tokens; any other tokenizer is opened here, with its options, and lent
  -- to the converter for the run.
  local tok
  local file = opts.tokenizer and opts.tokenizer ~= 'gpt2'
  local declared_eos -- token files' EOS id, declared with their vocabulary size
  if opts.vocab_size then
    if file or opts.tokenizer then cli.fail('wick.data.convert: --vocab-size declares the ids of token files; ' ..
                                            'give it without --tokenizer', cli.EXIT_USAGE) end
    declared_eos = opts.eos and tonumber(opts.eos:match('^%d+$'))
    if not declared_eos then
      cli.fail('wick.data.convert: --vocab-size needs --eos ID, the id separating documents', cli.EXIT_USAGE)
    end
  elseif opts.eos and not file then
    cli.fail('wick.data.convert: --eos needs a tokenizer file (--tokenizer FILE) or, for token files, --vocab-size',
             cli.EXIT_USAGE)
  end
  if file then
    local eos = opts.eos and (opts.eos:match('^%d+$') and tonumber(opts.eos) or opts.eos)
    local ok, opened, err = pcall(TOKENIZER.open, opts.tokenizer, { pattern = opts.pattern, special = opts.special,
                                                                   eos = eos,
                                                                   add_special_tokens = not opts.no_special_tokens })
    if not ok or not opened then cli.fail('wick.data.convert: ' .. tostring(ok and err or opened), cli.EXIT_USAGE) end
    tok = opened
  elseif opts.pattern or opts.special or opts.no_special_tokens then
    cli.fail('wick.data.convert: --pattern, --special and --no-special-tokens need a tokenizer file (--tokenizer FILE)',
             cli.EXIT_USAGE)
  end
  local cv = C.wk_converter_new(opts.output, not file and opts.tokenizer or nil)
  if cv == nil then refused_option(C.wk_last_status()) end
  cv = ffi.gc(cv, C.wk_converter_free)
  if tok then refused_option(C.wk_converter_use_tokenizer(cv, tok.handle)) end
  local function set(param, value) refused_option(C.wk_converter_set(cv, param, value)) end
  if opts.compression == 'none' then
    set(C.WK_CONVERT_COMPRESSION, 0)
  else
    set(C.WK_CONVERT_COMPRESSION, 1)
    local level = opts.compression:match('^zstd:(%-?%d+)$')
    if level then set(C.WK_CONVERT_LEVEL, tonumber(level)) end
  end
  set(C.WK_CONVERT_SHARD_TOKENS, opts.shard_size)
  set(C.WK_CONVERT_BLOCK_TOKENS, opts.block_size)
  if opts.threads then set(C.WK_CONVERT_THREADS, opts.threads) end
  set(C.WK_CONVERT_STRICT, opts.strict and 1 or 0)
  set(C.WK_CONVERT_PROGRESS, opts.progress and 1 or 0)
  set(C.WK_CONVERT_RESUME, opts.resume and 1 or 0)
  set(C.WK_CONVERT_HEADERLESS_BIN, opts.headerless_bin and 1 or 0)
  set(C.WK_CONVERT_VOCAB_SIZE, opts.vocab_size or 0)
  set(C.WK_CONVERT_EOS, declared_eos or -1)
  set(C.WK_CONVERT_NO_TEXT, opts.no_text and 1 or 0)
  local splits = { file = C.WK_TEXT_SPLIT_FILE, paragraph = C.WK_TEXT_SPLIT_PARAGRAPH, line = C.WK_TEXT_SPLIT_LINE }
  set(C.WK_CONVERT_TEXT_SPLIT, splits[opts.split])
  refused_option(C.wk_converter_set_field(cv, opts.field))
  refused_option(C.wk_converter_set_json_field(cv, opts.json_field))
  refused_option(C.wk_converter_set_include(cv, opts.include))
  for _, spec in ipairs(opts.column or {}) do refused_option(C.wk_converter_add_column(cv, spec)) end
  for _, path in ipairs(inputs) do failed_input(C.wk_converter_add_input(cv, path)) end
  local status = C.wk_converter_run(cv)
  local s = ffi.new('WkConvertStats')
  C.wk_converter_stats(cv, s)
  local stats = {}
  for _, f in ipairs { 'inputs', 'input_bytes', 'documents', 'tokens', 'shards', 'output_bytes', 'bad', 'empty',
                       'reused', 'nulls' } do
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
  local message = status ~= 0 and core.last_error()
  if not message and tok and opts.tokenizer:match('%.json$') then
    -- the dataset carries its tokenizer.json (and the chat template beside it), which a run trained on
    -- it saves beside its checkpoints (wick.train.tokenizer_files)
    local ok, why = TOKENIZER.copy_files(opts.tokenizer, opts.output)
    if not ok then message = "cannot keep the tokenizer's files with the dataset: " .. why end
  end
  if not message then describe_dataset(stats, opts.output, tok) end
  C.wk_converter_free(ffi.gc(cv, nil))
  if tok then tok:close() end
  if message then cli.fail('wick.data.convert: ' .. message, cli.EXIT_DATA) end
  return stats, bad
end

local SHOWN_BAD = 20

function M.main(args)
  local opts, inputs = parse(args)
  if #inputs == 0 then cli.usage_error(SPEC, 'no INPUTS given') end
  if opts.no_progress then
    opts.progress = false
  elseif not opts.progress then
    local ok, host = pcall(require, 'wick.host')
    opts.progress = ok and host.isatty(2) and not opts.quiet
  end
  local stats, bad = M.convert(inputs, opts)
  if not opts.quiet and stats.tokenizer == 'gpt2' and not opts.tokenizer then
    io.stderr:write(("wick.data.convert: took the token files' ids as GPT-2's (vocabulary %d, EOS %d); " ..
      '--vocab-size N --eos ID declare others\n'):format(stats.vocab_size, stats.eos))
  end
  if #bad > 0 then
    for k = 1, math.min(#bad, SHOWN_BAD) do io.stderr:write('wick.data.convert: skipped ', bad[k], '\n') end
    if stats.bad > SHOWN_BAD then
      io.stderr:write(string.format('wick.data.convert: ... and %d more bad lines\n', stats.bad - SHOWN_BAD))
    end
  end
  if not opts.quiet then
    local seconds = math.max(stats.seconds, 1e-9)
    io.stdout:write(string.format(
      '%s: %d inputs (%s) -> %d documents, %d tokens in %d shards (%s%s) in %.2f s (%s/s in, %.1f M tokens/s); ' ..
      '%d bad, %d empty%s skipped\n',
      opts.output, stats.inputs, human_bytes(stats.input_bytes), stats.documents, stats.tokens, stats.shards,
      human_bytes(stats.output_bytes), stats.reused > 0 and string.format(', %d reused', stats.reused) or '',
      stats.seconds, human_bytes(stats.input_bytes / seconds), stats.tokens / seconds / 1e6, stats.bad, stats.empty,
      stats.nulls > 0 and string.format(', %d null', stats.nulls) or ''))
    if stats.template then
      io.stdout:write(("%s: each document is %s (the tokenizer's post_processor around the text, then EOS; " ..
        "--no-special-tokens leaves the post_processor's out)\n"):format(opts.output, stats.template))
    end
  end
  return 0
end

return M
