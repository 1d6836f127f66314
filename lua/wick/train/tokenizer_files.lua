-- wick.train.tokenizer_files: the tokenizer beside a checkpoint's model, so that Hugging Face tools
-- read a step directory whole (AutoTokenizer.from_pretrained(step_dir) encodes as the run did), and
-- the record of which tokenizer the run trained with. The run's tokenizer is the one its first
-- source was converted with (its index.json names it and gives its fingerprint):
--   a tokenizer.json      copied, with the companions beside it (wick.data.tokenizer.HF_FILES:
--                         tokenizer_config.json holds the chat template), or else
--                         model.from_pretrained's; without any, a tokenizer_config.json that loads
--                         tokenizer.json as it is (PreTrainedTokenizerFast). The file is the copy
--                         the converter keeps in the dataset's directory, model.from_pretrained's
--                         tokenizer.json, or the index's name (the file's last two path parts) from
--                         the working directory, whichever has the fingerprint first; none: recorded
--                         only, and the run says so
--   'bytes'               written: a byte-level BPE of the 256 bytes and no merges (ids 0..255 are
--                         the bytes), EOS 256 as the special token <|eos|>, which text does not
--                         produce (split_special_tokens), as Wick's bytes tokenizer encodes it
--   tiktoken ranks, 'gpt2' recorded only: no Hugging Face file is written for them
-- It does not open or run tokenizers (wick.data.tokenizer does), nor write the model's files.
local checkpoint = require 'wick.train.checkpoint'
local cli = require 'wick.cli'
local core = require 'wick.core'
local json = require 'wick.json'
local recipe = require 'wick.recipe'

local tokenizer_files = {}

-- The files of a Hugging Face tokenizer directory copied beside tokenizer.json when present.
local COMPANIONS = { select(2, unpack(require('wick.data.tokenizer').HF_FILES)) }
local BYTES_EOS = '<|eos|>'

local function dir_of(path) return path:match('^(.*)/[^/]*$') or '.' end

local write_file, exists = checkpoint.write_file, checkpoint.exists

local function copy(from, to)
  local text, why = core.read_file(from)
  if not text then cli.fail(("checkpoint: cannot copy the run's tokenizer: %s"):format(why), cli.EXIT_DATA) end
  write_file(to, text)
end

-- GPT-2's byte-to-character table (the printable bytes stand for themselves, the others for 256 +
-- their rank among them), which a ByteLevel pre-tokenizer and decoder use: byte -> UTF-8 text.
local function byte_characters()
  local out, shifted = {}, 0
  for b = 0, 255 do
    local printable = (b >= 33 and b <= 126) or (b >= 161 and b <= 172) or (b >= 174 and b <= 255)
    local code = printable and b or 256 + shifted
    if not printable then shifted = shifted + 1 end
    out[b] = code < 0x80 and string.char(code) or string.char(0xC0 + math.floor(code / 64), 0x80 + code % 64)
  end
  return out
end

-- tokenizer.json of Wick's 'bytes' tokenizer.
local function bytes_tokenizer()
  local vocab = {}
  for b, text in pairs(byte_characters()) do vocab[text] = b end
  local byte_level = { type = 'ByteLevel', add_prefix_space = false, trim_offsets = true, use_regex = false }
  return json.encode({
    version = '1.0',
    added_tokens = { { id = 256, content = BYTES_EOS, single_word = false, lstrip = false, rstrip = false,
      normalized = false, special = true } },
    pre_tokenizer = byte_level, decoder = byte_level,
    model = { type = 'BPE', vocab = vocab, merges = json.empty_array, fuse_unk = false, byte_fallback = false },
  }) .. '\n'
end

-- The tokenizer.json of the run's tokenizer found here (see above), or nil.
local function find_file(info, config, dataset_dir)
  local from = config.model.from_pretrained
  -- the index's name comes from a dataset's index.json: only a path below the working directory
  local below = not info.name:match('^/') and not ('/' .. info.name .. '/'):find('/%.%./') and info.name
  local candidates = { dataset_dir .. '/tokenizer.json', from and from .. '/tokenizer.json', below }
  for i = 1, 3 do
    local path = candidates[i]
    if path and exists(path) then
      local tok = require('wick.data.tokenizer').open(path)
      local same = tok and (info.fingerprint == nil or tok.fingerprint == info.fingerprint)
      if tok then tok:close() end
      if same then return path end
    end
  end
end

-- The run's tokenizer: { name = as the index names it ('bytes', 'gpt2', or the file converted
-- with as parent/file), fingerprint = 16 hex digits or nil, file = its tokenizer.json found here or
-- nil, missing = why a Hugging Face tokenizer is not written, or nil }, or nil when the first
-- source says none.
function tokenizer_files.of(config)
  local dataset_dir = recipe.source_path(config.data.sources[1])
  local ds = require('wick.data.dataset').open(dataset_dir)
  if not ds then return nil end
  local info = { name = ds.tokenizer, fingerprint = ds.tokenizer_fingerprint }
  ds:close()
  if info.name == '' then return nil end
  if info.name:match('%.json$') then
    info.file = find_file(info, config, dataset_dir)
    if not info.file then
      info.missing = ("the data's tokenizer %s (fingerprint %s) is neither in its dataset's directory, nor " ..
        "model.from_pretrained's tokenizer.json, nor that path from here"):format(info.name, info.fingerprint or 'unknown')
    end
  elseif info.name ~= 'bytes' then
    info.missing = ("the data's tokenizer %s is no Hugging Face file"):format(info.name)
  end
  return info
end

-- Writes the tokenizer's files into dir (a checkpoint's temporary directory) for the run's `info`
-- (tokenizer_files.of) and config (model.from_pretrained's files stand in for missing companions).
-- Returns the state's metadata for it: tokenizer, tokenizer_fingerprint.
function tokenizer_files.write(dir, info, config)
  if not info then return {} end
  local name = info.name
  local config_text
  if name == 'bytes' then
    write_file(dir .. '/tokenizer.json', bytes_tokenizer())
    config_text = json.encode({ tokenizer_class = 'PreTrainedTokenizerFast', eos_token = BYTES_EOS,
      split_special_tokens = true, clean_up_tokenization_spaces = false })
  elseif info.file then
    copy(info.file, dir .. '/tokenizer.json')
    local from = config.model.from_pretrained
    local copied = false
    for _, source in ipairs({ dir_of(info.file), from }) do
      for _, file in ipairs(not copied and COMPANIONS or {}) do
        if exists(source .. '/' .. file) then
          copy(source .. '/' .. file, dir .. '/' .. file)
          copied = copied or file == 'tokenizer_config.json'
        end
      end
    end
    if not copied then
      config_text = json.encode({ tokenizer_class = 'PreTrainedTokenizerFast', clean_up_tokenization_spaces = false })
    end
  end
  if config_text then write_file(dir .. '/tokenizer_config.json', config_text .. '\n') end
  return { tokenizer = name, tokenizer_fingerprint = info.fingerprint }
end

return tokenizer_files
