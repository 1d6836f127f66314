-- wick.data.tokenizer (wick.tokenizer in a recipe): text <-> token ids, with the C tokenizers of runtime/tokenizer/ (Hugging Face
-- tokenizer.json files of BPE, byte-level or SentencePiece-style, and Unigram models, and tiktoken rank files) and the
-- built-in 'bytes'.
--   local tok = assert(wick.tokenizer.open('llama3/tokenizer.json', { special = true, eos = '<|eot_id|>' }))
--   local tok = wick.tokenizer.open('cl100k_base.tiktoken')            -- the encoding from the name
--   local tok = wick.tokenizer.open('ranks.tiktoken', { pattern = 'o200k' })
--   wick.tokenizer.open('llama3/tokenizer.json', { add_special_tokens = false })  -- no <|begin_of_text|>
--   tok.name, tok.vocab_size, tok.eos (nil when none), tok.fingerprint (16 hex digits)
--   tok.template: what the tokenizer.json's post_processor puts around a text, { prefix = { 128000 },
--     suffix = {} } (nil when it has none); tok:encode adds it unless add_special_tokens = false, as
--     Hugging Face's encode(text, add_special_tokens=...)
--   local ids, n = tok:encode(text)    -- uint32_t[n] cdata (a reused buffer: copy what you keep)
--   tok:ids(text)                      -- the same as a Lua table, for the REPL and tests
--   tok:decode(ids, n) / tok:decode { 1, 2, 3 }  -> string (bytes; UTF-8 when the ids are whole)
--   tok:token_id('<|endoftext|>')      -- the id of exactly that token, or nil
--   tok:close()
local core = require 'wick.core'
local schema = require 'wick.schema'
local ffi, C = core.ffi, core.C

local NONE = 0xFFFFFFFF
local PATTERNS = { 'r50k', 'r50k_base', 'gpt2', 'p50k', 'p50k_base', 'cl100k', 'cl100k_base', 'o200k', 'o200k_base' }

-- Any tokenizer's EOS bounds (an open one narrows them to its vocabulary): wk_tokenizer_param_bounds with no tokenizer.
local EOS_MIN, EOS_MAX = core.bounds(function(param, lo, hi) return C.wk_tokenizer_param_bounds(nil, param, lo, hi) end,
                                     C.WK_TOKENIZER_EOS)

local OPTIONS = schema.define('tokenizer option', {
  { 'special', 'boolean', default = false,
    help = 'special tokens written in text become their ids (default: plain text, as encode_ordinary)' },
  { 'pattern', 'enum', values = PATTERNS, help = "a tiktoken rank file's encoding, when its name does not say" },
  { 'eos', types = { 'string', 'integer' }, min = EOS_MIN, max = EOS_MAX, help = 'the EOS token, by text or id' },
  { 'add_special_tokens', 'boolean', default = true,
    help = "encoding puts the post_processor's tokens around the text (e.g. Llama 3's <|begin_of_text|>), as " ..
           "Hugging Face's encode does by default" },
})

local Tokenizer = {}
Tokenizer.__index = Tokenizer
local own_handle, close_handle = core.handle(C.wk_tokenizer_free)

local M = { OPTIONS = OPTIONS }

local ids_box, prefix_box, suffix_box = ffi.new('const uint32_t *[1]'), ffi.new('uint32_t[1]'), ffi.new('uint32_t[1]')

-- A template's ids (C's: ids[0 .. prefix) then suffix more) as { prefix = {...}, suffix = {...} }, into t.
function M.template_table(ids, prefix, suffix, t)
  t = t or {}
  t.prefix, t.suffix = {}, {}
  for i = 1, prefix do t.prefix[i] = tonumber(ids[i - 1]) end
  for i = 1, suffix do t.suffix[i] = tonumber(ids[prefix + i - 1]) end
  return t
end

-- The post_processor's ids around a text as { prefix = {...}, suffix = {...} }, nil when none.
local function template_of(handle)
  C.wk_tokenizer_template(handle, ids_box, prefix_box, suffix_box)
  local prefix, suffix = tonumber(prefix_box[0]), tonumber(suffix_box[0])
  if prefix + suffix == 0 then return nil end
  return M.template_table(ids_box[0], prefix, suffix)
end

-- A Hugging Face tokenizer directory's files: tokenizer.json first, then the companions that travel
-- with it (tokenizer_config.json holds the chat template and the special tokens' roles).
M.HF_FILES = { 'tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json', 'chat_template.jinja' }

-- Copies a tokenizer.json and the companions beside it (M.HF_FILES) into the directory to: true, or
-- nil and a message naming the file that could not be read or written.
function M.copy_files(file, to)
  local from = file:match('^(.*)/[^/]*$') or '.'
  for i, name in ipairs(M.HF_FILES) do
    local text, why = core.read_file(i == 1 and file or from .. '/' .. name)
    if text then
      local ok, werr = core.write_file(to .. '/' .. name, text)
      if not ok then return nil, 'cannot write ' .. werr end
    elseif i == 1 then
      return nil, 'cannot read ' .. why
    end
  end
  return true
end

-- Opens a built-in name or a file. Returns the tokenizer, or nil and a message naming the file and
-- what is wrong with it; bad options raise.
function M.open(source, options)
  if type(source) ~= 'string' then error('wick.tokenizer.open: source must be a string (a file or "bytes")', 2) end
  local opts = OPTIONS:check(options or {}, 2)
  local handle = C.wk_tokenizer_open(source, opts.pattern)
  if handle == nil then return nil, core.last_error() end
  handle = own_handle(handle)
  local self = setmetatable({ handle = handle, capacity = 0 }, Tokenizer)
  if opts.special then core.check(C.wk_tokenizer_set(handle, C.WK_TOKENIZER_SPECIAL, 1), 2) end
  if not opts.add_special_tokens then core.check(C.wk_tokenizer_set(handle, C.WK_TOKENIZER_ADD_SPECIAL_TOKENS, 0), 2) end
  if opts.eos ~= nil then
    local id = opts.eos
    if type(id) == 'string' then
      id = self:token_id(id)
      if not id then error(('wick.tokenizer.open: eos %q is not a token of %s'):format(opts.eos, source), 2) end
    end
    core.check(C.wk_tokenizer_set(handle, C.WK_TOKENIZER_EOS, id), 2)
  end
  self.name = ffi.string(C.wk_tokenizer_name(handle))
  self.vocab_size = tonumber(C.wk_tokenizer_vocab_size(handle))
  local eos = tonumber(C.wk_tokenizer_eos(handle))
  self.eos = eos ~= NONE and eos or nil
  self.fingerprint = ('%016x'):format(C.wk_tokenizer_fingerprint(handle))
  self.template = template_of(handle)
  return self
end

local function live(self)
  if not self.handle then error('wick.tokenizer: the tokenizer is closed', 3) end
  return self.handle
end

function Tokenizer:close() close_handle(self) end

local count_box = ffi.new('size_t[1]')

local function reserve(self, n)
  if self.capacity < n then self.buffer, self.capacity = ffi.new('uint32_t[?]', n), n end
end

-- ids of text as uint32_t[n] (this tokenizer's buffer, reused by the next call) and n.
function Tokenizer:encode(text)
  if type(text) ~= 'string' then error('wick.tokenizer: encode needs a string', 2) end
  local handle = live(self)
  reserve(self, 2 * #text + 1) -- enough unless NFC lengthens the text (wick.h)
  local status = C.wk_tokenizer_encode(handle, text, #text, self.buffer, self.capacity, count_box)
  if status ~= 0 and tonumber(count_box[0]) > self.capacity then
    reserve(self, tonumber(count_box[0]))
    status = C.wk_tokenizer_encode(handle, text, #text, self.buffer, self.capacity, count_box)
  end
  core.check(status, 2)
  return self.buffer, tonumber(count_box[0])
end

function Tokenizer:ids(text)
  local buffer, n = self:encode(text)
  local out = {}
  for i = 1, n do out[i] = buffer[i - 1] end
  return out
end

-- Bytes of ids: a uint32_t array with its count, or a Lua table of numbers.
function Tokenizer:decode(ids, n)
  local handle = live(self)
  if type(ids) == 'table' then
    n = #ids
    local array = ffi.new('uint32_t[?]', math.max(n, 1))
    for i = 1, n do
      local id = ids[i]
      if type(id) ~= 'number' or id < 0 or id >= NONE or id ~= math.floor(id) then
        error(('wick.tokenizer: decode: ids[%d] = %s is not a token id'):format(i, tostring(id)), 2)
      end
      array[i - 1] = id
    end
    ids = array
  elseif type(n) ~= 'number' then
    error('wick.tokenizer: decode needs a table of ids, or a uint32_t array and its count', 2)
  end
  local capacity = 64 * n + 64
  for _ = 1, 2 do
    local out = ffi.new('char[?]', capacity)
    local status = C.wk_tokenizer_decode(handle, ids, n, out, capacity, count_box)
    if status == 0 then return ffi.string(out, count_box[0]) end
    if tonumber(count_box[0]) <= capacity then core.check(status, 2) end
    capacity = tonumber(count_box[0])
  end
  error('wick.tokenizer: decode: the output kept growing', 2)
end

function Tokenizer:token_id(text)
  local id = tonumber(C.wk_tokenizer_token_id(live(self), text, #text))
  return id ~= NONE and id or nil
end

return M
