-- wick.data: streaming datasets for training.
--
--   local data = require 'wick.data'
--   local loader = data.loader {
--     data = data.mix { { 'data/web', weight = 0.8 }, { 'data/code', weight = wick.schedule.linear(0.1, 0.3, 1e4) } },
--     seq_len = 1024, global_batch = 512, micro_batch = 16,   -- world size and rank come from the env
--   }
--   local batch = loader:next()      -- nil at the end; else wick.tensor tensors (and numbers):
--   -- batch.tokens    i32 (or dtype = 'i64') [rows, seq_len + 1]
--   -- batch.inputs, batch.targets   views tokens[:, :-1] and tokens[:, 1:], read in place by the model
--   -- batch.loss_mask u8 [rows, seq_len]; batch.doc_ids, batch.positions (document_ids = true)
--   -- columns = { 'loss_mask', 'label', 'image' }: batch.columns.<name> per column asked for (also
--   -- batch.<name> unless a field above has that name); token_u8 u8 [rows, seq_len + 1] aligned with
--   -- tokens, i64/f32 [rows], tensor [rows, shape...], bytes u8 [rows, blob_bytes] with batch.sizes.<name>
--   -- i64 [rows]. A token_u8 column named loss_mask also masks batch.loss_mask where it is 0.
--   local cursor = loader:state()    -- a short string; data.loader{ ..., cursor = cursor } resumes exactly
--
-- The tensors are made once per slot of the loader's ring and belong to the loader (do not free
-- them): they stay valid until a next() that starts another step, so a step's micro-batches can be
-- used together. With device = 'cuda:0' they live on the GPU, copied there on the loader's own copy
-- stream; work this thread queues on its current stream waits for the copy, the host does not.
-- All per-token work happens in C threads (runtime/loader); this module only configures them.
local core = require 'wick.core'
local schedule = require 'wick.schedule'
local schema = require 'wick.schema'
local T = require 'wick.tensor'
local ffi, C = core.ffi, core.C

local data = {}

local CURSOR_CAPACITY = 8192
local MODES = { packed = 0, pad = 1 }
local ON_CORRUPT = { error = 0, skip = 1 }
local AT_END = { drop = 0, pad = 1 }
local DTYPES = { i32 = C.WK_I32, i64 = C.WK_I64 }

-- An integer option whose range is the C setter's own (wk_loader_param_bounds): one source of truth.
local function bounded(name, param, help)
  local min, max = core.bounds(C.wk_loader_param_bounds, param)
  return { name, 'integer', min = min, max = max, param = param, help = help }
end

-- An option whose C default 0 means "derived at start", which Lua spells by leaving the option out: the
-- smallest value it may be given is larger than C's bound.
local function derived(option, min)
  option.min = min
  return option
end

-- A renamed option: its old spelling is read for one release, with a warning (wick.schema's alias).
local function formerly(old, option)
  option.alias = old
  return option
end

-- An integer field of WkRemoteOptions, with the bounds C checks it against (wk_remote_param_bounds).
local function remote(name, param, help)
  local min, max = core.bounds(C.wk_remote_param_bounds, param)
  return { name, 'integer', min = min, max = max, help = help }
end

-- Remote sources' options (http://, https://, s3://; wick.dataset.open takes them too).
local REMOTE = {
  { 'cache_dir', 'string', help = 'on-disk cache of remote data, shared by the node (default WICK_CACHE_DIR, '
    .. 'else $XDG_CACHE_HOME/wick, else ~/.cache/wick)' },
  remote('cache_disk_bytes', C.WK_REMOTE_CACHE_DISK_BYTES, 'bytes the cache directory may hold (default 16 GiB)'),
  remote('prefetch_bytes', C.WK_REMOTE_PREFETCH_BYTES, 'read-ahead queued or in transfer, per source (default 64 MiB)'),
  remote('max_transfers', C.WK_REMOTE_MAX_TRANSFERS, 'parallel transfers per source (default 16)'),
  remote('connect_timeout_ms', C.WK_REMOTE_CONNECT_TIMEOUT_MS, 'connection timeout, then retried (default 10 s)'),
  remote('stall_timeout_ms', C.WK_REMOTE_STALL_TIMEOUT_MS, 'a transfer receiving nothing this long is retried (default 30 s)'),
  remote('request_timeout_ms', C.WK_REMOTE_REQUEST_TIMEOUT_MS,
    'one request at most, all its attempts and the waits between them (default 10 min)'),
  remote('retries', C.WK_REMOTE_RETRIES, 'attempts after the first, with backoff (default 5)'),
  remote('low_speed_bytes_per_s', C.WK_REMOTE_LOW_SPEED_BYTES_PER_S,
    'a transfer receiving less over low_speed_window_ms is retried; it also sizes each attempt\'s deadline '
    .. '(default 1024)'),
  remote('low_speed_window_ms', C.WK_REMOTE_LOW_SPEED_WINDOW_MS, 'the window of low_speed_bytes_per_s (default 30 s)'),
}
data.REMOTE_OPTIONS = schema.define('remote option', REMOTE)

-- Checked remote options (by name) as C's WkRemoteOptions, the defaults where one is not given; its
-- cache_dir points into the Lua string, so keep `options` alive for the call that reads it.
function data.remote_options(options)
  local c = ffi.new('WkRemoteOptions')
  C.wk_remote_options_default(c)
  for _, option in ipairs(REMOTE) do
    local value = options[option[1]]
    if value ~= nil then c[option[1]] = value end
  end
  return c
end

local function with_remote(options)
  for _, option in ipairs(REMOTE) do options[#options + 1] = option end
  return options
end

-- columns: a list of distinct column names (C checks each against every source at start).
local function check_columns(v)
  if type(v) ~= 'table' then return false, "must be a list of column names, e.g. { 'loss_mask', 'label' }" end
  local seen = {}
  for i, name in ipairs(v) do
    if type(name) ~= 'string' or not name:match('^[%a_][%w_]*$') then
      return false, ('item %d must be a column name ([A-Za-z_][A-Za-z0-9_]*), got %s'):format(i, tostring(name))
    end
    if seen[name] then return false, ('names column %s twice'):format(name) end
    seen[name] = true
  end
  for k in pairs(v) do
    if type(k) ~= 'number' or k % 1 ~= 0 or k < 1 or k > #v then return false, 'must be a list, not a table of keys' end
  end
  return true
end

-- The loader's options (a mix may carry them too: see data.mix).
local LOADER = schema.define('loader option', with_remote {
  { 'data', 'dataset', check = function(v)
      return type(v) == 'string' or data.is_mix(v), 'must be a dataset path or a data.mix{}'
    end, help = 'a dataset (directory or index.json; a path, file://, http(s):// or s3://) or a data.mix{}' },
  bounded('seq_len', C.WK_LOADER_SEQ_LEN, 'tokens per sample minus one (default 1024)'),
  bounded('global_batch', C.WK_LOADER_GLOBAL_BATCH, 'samples per optimizer step over all ranks (default 8)'),
  derived(bounded('micro_batch', C.WK_LOADER_MICRO_BATCH,
    'rows per next() on this rank (default: global batch / world size)'), 1),
  bounded('world_size', C.WK_LOADER_WORLD_SIZE, 'ranks sharing the stream (default: WORLD_SIZE, or 1)'),
  bounded('rank', C.WK_LOADER_RANK, 'this rank (default: RANK, or 0)'),
  { 'seed', 'uint64', param = C.WK_LOADER_SEED, help = 'shuffle seed, any 64-bit integer (default 0)' },
  { 'shuffle', 'shuffle', types = { 'boolean', 'table' }, help = 'true, false, or { window_tokens, pool_tokens }' },
  bounded('partitions', C.WK_LOADER_PARTITIONS, 'canonical partitions (default 1)'),
  bounded('chunk', C.WK_LOADER_CHUNK, 'draws per partition turn (default 1)'),
  bounded('threads', C.WK_LOADER_THREADS, 'reader threads (default 2)'),
  derived(bounded('prefetch', C.WK_LOADER_PREFETCH, 'micro-batches buffered ahead (default 4 per thread + 4)'), 2),
  bounded('memory_budget', C.WK_LOADER_MEMORY_BUDGET, 'bytes for the batch ring; 0 no limit (default 0)'),
  formerly('cache_bytes', bounded('node_cache_bytes', C.WK_LOADER_NODE_CACHE_BYTES,
    'node cache of each source (default 64 MiB; its units also hold the per-token columns asked for, a byte a token each)')),
  { 'mode', 'enum', values = { 'packed', 'pad' }, help = 'packed windows or one padded document per row' },
  { 'on_corrupt', 'enum', values = { 'error', 'skip' }, help = 'stop at corrupt data, or mask and count it' },
  { 'at_end', 'enum', values = { 'drop', 'pad' }, help = 'the last partial batch of finite sources' },
  { 'document_ids', 'boolean', help = 'also fill doc_ids and positions' },
  { 'mixed_tokenizers', 'boolean',
    help = 'allow sources made by different tokenizers (fingerprint, vocabulary or EOS), or with different ' ..
           "tokens around their documents (a tokenizer's template applied to one only), in one mix" },
  { 'dtype', 'enum', values = { 'i32', 'i64' }, help = 'token type of the rows (default i32)' },
  { 'columns', 'columns', check = check_columns, parse = function(text)
      local names = {}
      for name in text:gmatch('[^,]+') do names[#names + 1] = name end
      return names
    end, help = "the dataset's columns each batch carries besides tokens (batch.<name>), e.g. { 'loss_mask', 'label' }; "
      .. 'per-record columns need mode = pad' },
  bounded('blob_bytes', C.WK_LOADER_BLOB_BYTES, 'bytes a row holds of a bytes column (default 1 MiB)'),
  { 'device', 'string', help = "where batches live: 'cpu' or 'cuda:N' (default cpu)" },
  { 'cursor', 'string', help = 'resume from this loader:state()' },
  { 'audit', 'string', help = 'append one line per delivered sample to this file' },
})
data.LOADER_OPTIONS = LOADER

local SHUFFLE = schema.define('shuffle option', {
  bounded('window_tokens', C.WK_LOADER_WINDOW_TOKENS, 'shards holding this many tokens have their units permuted together'),
  formerly('buffer_tokens', bounded('pool_tokens', C.WK_LOADER_POOL_TOKENS,
    'the shuffle pool: units holding this many tokens have their samples shuffled together')),
})
data.SHUFFLE_OPTIONS = SHUFFLE

local MIX_ENTRY = schema.define('mix source option', {
  { 'weight', 'weight', check = function(v)
      local kind = type(v)
      return kind == 'number' or kind == 'table' or kind == 'function', 'must be a number, a wick.schedule or fn(step)'
    end, help = 'a number, a wick.schedule or fn(step): finite and >= 0 at every step' },
  { 'epochs', 'integer', min = 0, max = 2 ^ 53, help = 'stop after this many epochs (0: never)' },
})

-- ---- sources and mixes -----------------------------------------------------------------------------

local mix_mt = { __index = {} }

-- A weight: finite and >= 0 at every point of its schedule (a function is sampled over `horizon`).
local function weight_schedule(value, horizon, where)
  local ok, s = pcall(schedule.of, value, horizon)
  if not ok then error(('%s: %s'):format(where, tostring(s):gsub('^.-:%d+: ', '')), 4) end
  for i, w in ipairs(s.values) do
    if type(w) ~= 'number' or w ~= w or w < 0 or w == math.huge then
      error(('%s: weight %s at step %s must be a finite number >= 0'):format(where, tostring(w), tostring(s.steps[i])), 4)
    end
  end
  return s
end

-- data.mix { {path, weight = w, epochs = n}, ..., steps = horizon for function weights, [loader options] }
function data.mix(spec)
  if type(spec) ~= 'table' or #spec == 0 then error('data.mix expects a list of sources', 2) end
  local sources = {}
  for i, entry in ipairs(spec) do
    if type(entry) == 'string' then entry = { entry } end
    if type(entry) ~= 'table' or type(entry[1]) ~= 'string' then
      error(('data.mix: source %d needs a path as its first item'):format(i), 2)
    end
    local named = {}
    for k, v in pairs(entry) do if k ~= 1 then named[k] = v end end
    local o = MIX_ENTRY:check(named, 2)
    sources[i] = {
      path = entry[1],
      weight = weight_schedule(o.weight == nil and 1 or o.weight, spec.steps, ('data.mix source %d (%s)'):format(i, entry[1])),
      epochs = o.epochs or 0,
    }
  end
  local options = {}
  for k, v in pairs(spec) do
    if type(k) ~= 'number' and k ~= 'steps' then options[k] = v end
  end
  if spec.steps ~= nil then schema.define('mix option', { { 'steps', 'integer', min = 1, max = 2 ^ 53 } }):check({ steps = spec.steps }, 2) end
  if options.data ~= nil then error('data.mix: a mix cannot name `data` (its sources are its list items)', 2) end
  return setmetatable({ sources = sources, options = LOADER:check(options, 2) }, mix_mt)
end

function data.is_mix(value) return getmetatable(value) == mix_mt end

-- ---- the loader ------------------------------------------------------------------------------------

local Loader = {}
Loader.__index = Loader
local own_handle, close_handle = core.handle(C.wk_loader_free)

-- An integer from the environment (torchrun's RANK, WORLD_SIZE), checked like the option it stands for.
local function from_env(variable, option)
  local text = os.getenv(variable)
  if text == nil then return nil end
  local value = tonumber(text)
  local ok, why = pcall(LOADER.check_value, LOADER, option, value, 0)
  if value == nil or not ok then
    error(('%s=%q is not a valid %s: %s'):format(variable, text, option, value and tostring(why) or 'not a number'), 0)
  end
  return value
end

local function set(handle, param, value)
  core.check(C.wk_loader_set(handle, param, value), 3)
end

local function set_shuffle(handle, shuffle)
  set(handle, C.WK_LOADER_SHUFFLE, shuffle and 1 or 0)
  if type(shuffle) ~= 'table' then return end
  if shuffle.window ~= nil then
    error('shuffle.window counted shards; the order now sizes its window in tokens: shuffle = { window_tokens = ' ..
      'N, pool_tokens = M } (defaults 2^29 and 2^22)', 0)
  end
  for name, value in pairs(SHUFFLE:check(shuffle, 0)) do set(handle, SHUFFLE:option(name).param, value) end
end

local function configure(handle, opts)
  -- Options may sit on the mix (shared recipes) or on the loader call; the call wins.
  local given = LOADER:check(opts, 0)
  local mix = given.data
  if mix == nil then error('data.loader: `data` is required (a dataset path or a data.mix{})', 0) end
  if type(mix) == 'string' then mix = data.mix { mix } end
  local o = {}
  for k, v in pairs(mix.options) do o[k] = v end
  for k, v in pairs(given) do o[k] = v end
  if o.world_size == nil then o.world_size = from_env('WORLD_SIZE', 'world_size') or 1 end
  if o.rank == nil then o.rank = from_env('RANK', 'rank') or 0 end
  for name, value in pairs(o) do
    local option = LOADER:option(name)
    if option.param then set(handle, option.param, value) end
  end
  set_shuffle(handle, o.shuffle == nil and true or o.shuffle)
  set(handle, C.WK_LOADER_DTYPE, DTYPES[o.dtype or 'i32'])
  set(handle, C.WK_LOADER_MODE, MODES[o.mode or 'packed'])
  set(handle, C.WK_LOADER_ON_CORRUPT, ON_CORRUPT[o.on_corrupt or 'error'])
  set(handle, C.WK_LOADER_PAD_LAST, AT_END[o.at_end or 'drop'])
  set(handle, C.WK_LOADER_DOCUMENT_IDS, o.document_ids and 1 or 0)
  core.check(C.wk_loader_set_remote(handle, data.remote_options(o)), 3)
  set(handle, C.WK_LOADER_MIXED_TOKENIZERS, o.mixed_tokenizers and 1 or 0)
  if o.device ~= nil then
    local kind, index = T.parse_device(o.device, 3)
    set(handle, C.WK_LOADER_DEVICE, kind == C.WK_DEVICE_CPU and C.WK_LOADER_ON_CPU or index)
  end
  for _, name in ipairs(o.columns or {}) do core.check(C.wk_loader_add_column(handle, name), 3) end
  local index = ffi.new('uint32_t[1]')
  for _, source in ipairs(mix.sources) do
    core.check(C.wk_loader_add_source(handle, source.path, source.epochs, index), 3)
    local w = source.weight
    local n = #w.steps
    core.check(C.wk_loader_set_weight(handle, index[0], ffi.new('double[?]', n, w.steps),
      ffi.new('double[?]', n, w.values), n), 3)
  end
  return mix, o
end

-- The batch's own fields: a column of one of these names is only in batch.columns.
local BATCH_FIELDS = { tokens = true, inputs = true, targets = true, loss_mask = true, doc_ids = true, positions = true,
  dtype = true, rows = true, seq_len = true, step = true, micro_step = true, micro_steps = true, fingerprint = true,
  wait_ns = true, columns = true, sizes = true }

-- The columns next() also puts at batch.<name>: index in the slot's column_list -> name.
local function column_fields(columns)
  local fields = {}
  for c, name in ipairs(columns) do
    if not BATCH_FIELDS[name] then fields[#fields + 1] = { c, name } end
  end
  return fields
end

function data.loader(opts)
  if type(opts) ~= 'table' then error('data.loader expects a table of options', 2) end
  local handle = core.check_handle(C.wk_loader_new(), 2)
  handle = own_handle(handle)
  local self = setmetatable({
    handle = handle,
    started = false,
    -- cdata reused by every call: no garbage per batch.
    c_batch = ffi.new('WkBatch'),
    c_info = ffi.new('WkSampleInfo'),
    c_cursor = ffi.new('char[?]', CURSOR_CAPACITY),
    c_length = ffi.new('size_t[1]'),
    c_count = ffi.new('uint64_t[1]'),
    c_vocab = ffi.new('uint32_t[1]'),
    c_eos = ffi.new('uint32_t[1]'),
    batch = {},
    slots = {},  -- ring slot + 1 -> its tensors (our handles on the loader's), made at start
  }, Loader)
  local ok, err = pcall(function() self.mix, self.options = configure(handle, opts) end)
  if not ok then
    self:close()
    error(err, 2)
  end
  self.columns = self.options.columns or {}
  self.column_fields = column_fields(self.columns)
  if self.options.cursor then self:restore(self.options.cursor) end
  if self.options.audit then self:audit(self.options.audit) end
  return self
end

local function share_or_nil(handle)
  if handle == nil then return nil end
  return T.share(handle)
end

-- Our handles on the tensors of each ring slot, made at start: next() only looks them up.
local function make_slots(self)
  local b = self.c_batch
  for s = 0, self:stats().buffers - 1 do
    core.check(C.wk_loader_slot(self.handle, s, b), 3)
    local slot = {
      tokens = T.share(b.tokens), inputs = T.share(b.inputs), targets = T.share(b.targets),
      loss_mask = T.share(b.loss_mask), doc_ids = share_or_nil(b.doc_ids), positions = share_or_nil(b.positions),
      columns = {}, sizes = {}, column_list = {},
    }
    for c = 0, b.column_count - 1 do
      local name = self.columns[c + 1]
      slot.columns[name], slot.sizes[name] = T.share(b.columns[c]), share_or_nil(b.column_sizes[c])
      slot.column_list[c + 1] = slot.columns[name]
    end
    slot.dtype = slot.tokens.dtype
    self.slots[s + 1] = slot
  end
end

-- Runs once per loader over a dozen slots: a loop the JIT would only start recording and abandon
-- (an abort inside the caller's step loop).
jit.off(make_slots)

-- What start would refuse, raised the same way, without allocating the ring or reading a shard (a
-- dry run's check); returns the bytes the ring of micro-batches would take.
function Loader:check()
  local bytes = ffi.new('uint64_t[1]')
  core.check(C.wk_loader_check(self.handle, bytes), 2)
  return tonumber(bytes[0])
end

function Loader:start()
  if not self.started then
    core.check(C.wk_loader_start(self.handle), 2)
    self.started = true
    make_slots(self)
  end
  return self
end

-- The next micro-batch of this rank, or nil at the end of a finite stream. The returned table is
-- reused (its tensors are those of the batch's ring slot, see the top of this file).
function Loader:next()
  if not self.started then self:start() end
  local status = C.wk_loader_next(self.handle, self.c_batch)
  if status == C.WK_ERR_CLOSED then return nil end
  core.check(status, 2)
  local b, out = self.c_batch, self.batch
  local slot = self.slots[b.slot + 1]
  out.tokens, out.inputs, out.targets, out.loss_mask = slot.tokens, slot.inputs, slot.targets, slot.loss_mask
  out.doc_ids, out.positions, out.dtype = slot.doc_ids, slot.positions, slot.dtype
  out.columns, out.sizes = slot.columns, slot.sizes
  local fields = self.column_fields
  for i = 1, #fields do
    local field = fields[i]
    out[field[2]] = slot.column_list[field[1]]
  end
  out.rows, out.seq_len = b.rows, b.seq_len
  out.step, out.micro_step, out.micro_steps = tonumber(b.step), b.micro_step, b.micro_steps
  out.fingerprint = bit.tohex(b.fingerprint, 16)
  out.wait_ns = tonumber(b.wait_ns)
  return out
end

function Loader:state()
  if not self.started then self:start() end
  core.check(C.wk_loader_state(self.handle, self.c_cursor, CURSOR_CAPACITY, self.c_length), 2)
  return ffi.string(self.c_cursor, self.c_length[0])
end

function Loader:restore(cursor)
  if self.started then error('loader:restore must come before the first next() (or pass cursor = ... to data.loader)', 2) end
  if type(cursor) ~= 'string' then error('loader:restore expects the string from loader:state()', 2) end
  core.check(C.wk_loader_restore(self.handle, cursor), 2)
end

local SAMPLE_STATUS = { [C.WK_SAMPLE_OK] = 'ok', [C.WK_SAMPLE_SKIPPED] = 'skipped', [C.WK_SAMPLE_PADDING] = 'padding' }

-- Identity of row `row` (0-based) of the last batch: source, shard, offset, length, epoch, hash.
function Loader:sample(row)
  core.check(C.wk_loader_sample_info(self.handle, row, self.c_info), 2)
  local i = self.c_info
  return {
    source = i.source, shard = i.shard, offset = tonumber(i.offset), length = tonumber(i.length),
    epoch = tonumber(i.epoch), hash = bit.tohex(i.token_hash, 16), status = SAMPLE_STATUS[i.status],
  }
end

-- Appends one line per delivered sample to `path` (see wk_loader_audit in wick.h).
function Loader:audit(path)
  core.check(C.wk_loader_audit(self.handle, path), 2)
end

function Loader:epoch_length(source)
  if not self.started then self:start() end
  local out = ffi.new('uint64_t[1]')
  core.check(C.wk_loader_source_epoch_length(self.handle, (source or 1) - 1, out), 2)
  return tonumber(out[0])
end

local STAT_FIELDS = { 'batches', 'wait_ns', 'skipped', 'buffers', 'buffer_bytes', 'decoded_bytes', 'delivered_bytes',
  'node_decoded_bytes', 'node_delivered_bytes', 'node_private_decodes', 'node_edges_saved', 'node_edges_used',
  'node_edges_missing', 'node_edges_dropped', 'node_waits', 'node_steals' }
data.REMOTE_STAT_FIELDS = { 'requests', 'bytes_fetched', 'cache_hits', 'cache_misses', 'prefetched', 'prefetch_dropped',
  'retries_connect', 'retries_reset', 'retries_timeout', 'retries_server', 'retries_throttle', 'retries_corrupt',
  'rate_bytes_per_s', 'wait_ns', 'disk_bytes', 'evicted_bytes' }

-- Counters; decode amplification is decoded_bytes / delivered_bytes (node_*: all local ranks); `remote`
-- holds the remote sources' fetches (bytes, cache hits, retries by cause, rate, network wait).
function Loader:stats()
  local s = ffi.new('WkLoaderStats')
  C.wk_loader_stats(self.handle, s)
  local out = { remote = {} }
  for _, field in ipairs(STAT_FIELDS) do out[field] = tonumber(s[field]) end
  for _, field in ipairs(data.REMOTE_STAT_FIELDS) do out.remote[field] = tonumber(s.remote[field]) end
  return out
end

-- The largest vocabulary of the sources and the EOS id (the first source's): what a model needs.
function Loader:vocab_size()
  core.check(C.wk_loader_vocab(self.handle, self.c_vocab, self.c_eos), 2)
  return self.c_vocab[0]
end

function Loader:eos()
  core.check(C.wk_loader_vocab(self.handle, self.c_vocab, self.c_eos), 2)
  return self.c_eos[0]
end

-- What print() shows of proportions(): each source's path, share and draws on one line.
local function proportions_text(paths, shares, draws)
  local parts = {}
  for i, share in ipairs(shares) do parts[i] = ('%s %.1f%% (%d draws)'):format(paths[i], 100 * share, draws[i]) end
  return table.concat(parts, ', ')
end

local Draws = { __tostring = function(draws) return '{' .. table.concat(draws, ', ') .. '}' end }

-- Draws per source for the batches returned so far (as the cursor counts them), and each source's
-- share of them; both print readably (print(loader:proportions()): 'a 75.0% (6 draws), b 25.0% (2
-- draws)  {6, 2}').
function Loader:proportions()
  if not self.started then self:start() end
  local draws, total = {}, 0
  for i = 1, C.wk_loader_source_count(self.handle) do
    core.check(C.wk_loader_source_draws(self.handle, i - 1, self.c_count), 2)
    draws[i] = tonumber(self.c_count[0])
    total = total + draws[i]
  end
  local shares = {}
  for i, n in ipairs(draws) do shares[i] = total > 0 and n / total or 0 end
  local paths = {}
  for i, source in ipairs(self.mix.sources) do paths[i] = source.path end
  return setmetatable(shares, { __tostring = function() return proportions_text(paths, shares, draws) end }),
    setmetatable(draws, Draws)
end

-- Tokens of row `row` (0-based) of the last batch as a Lua table (from any device): for debugging.
function Loader:row_tokens(row)
  local view = self.batch.tokens:narrow(1, row + 1, 1)
  local values = view:totable()[1]
  view:free()
  return values
end

-- Row `row` (0-based) of the last batch's columns as Lua values (from any device), for debugging: a
-- list per column in the order asked for, { name = , value = } where value is a number (i64, f32), a
-- table of numbers (token_u8: the row's seq_len + 1 values; tensor: its values, flattened) or a string
-- (bytes: the blob).
local function flatten(values, out)
  for _, v in ipairs(values) do
    if type(v) == 'table' then flatten(v, out) else out[#out + 1] = v end
  end
  return out
end

local function row_values(t, row)
  local view = t:narrow(1, row + 1, 1)
  local values = view:totable()[1]
  view:free()
  return values
end

function Loader:row_columns(row)
  local out = {}
  for c, name in ipairs(self.columns) do
    local values, size = row_values(self.batch.columns[name], row), self.batch.sizes[name]
    if size then
      local chars = {}
      for i = 1, row_values(size, row) do chars[i] = string.char(values[i]) end
      values = table.concat(chars)
    elseif type(values) == 'table' then
      values = flatten(values, {})
    end
    out[c] = { name = name, value = values }
  end
  return out
end

function Loader:close()
  for _, slot in pairs(self.slots) do
    for _, t in pairs(slot) do
      if T.is_tensor(t) then t:free() end
    end
    for _, t in pairs(slot.columns) do t:free() end
    for _, t in pairs(slot.sizes) do t:free() end
  end
  self.slots, self.batch = {}, {}
  close_handle(self)
end

data.Loader = Loader
return data
