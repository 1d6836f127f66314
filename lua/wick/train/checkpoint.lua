-- wick.train.checkpoint (wick.checkpoint in a recipe): the trainer's checkpoints on disk, and the checks of everything read back from
-- them (a checkpoint is input: it may be edited, truncated, or another run's). One directory per step:
--
--   DIR/LOCK                 flock'ed by the one process that writes DIR's checkpoints (rank 0 of a
--                            run) for its whole lifetime; it holds that process's pid
--   DIR/step-00000040/
--     config.json            with model.safetensors (the weights by Hugging Face names, in the
--     generation_config.json model's dtype, config.json's torch_dtype: the f32 masters of an fp32
--                            run, rounded to bf16 for a bf16 run as transformers saves it; their
--                            data in the flat parameter order) a Hugging Face model directory:
--                            wick.nn.from_pretrained and transformers load it as it is
--                            (GPT2LMHeadModel or a Llama family's); where the ranks hold slices of
--                            the masters, each writes its own into the one file, in parallel
--     optimizer.safetensors  AdamW's moments m and v, and under bf16 or fp16 the f32 masters
--                            (`master`), which resume reads; metadata: its step count, the loss
--                            scaler, the pieces of the flat parameter order they are; a sharded run
--                            (parallel.shard) writes optimizer-RRRRR-of-WWWWW.safetensors instead,
--                            each rank its own slice, in parallel; any world size and sharding
--                            reads either back
--     state.safetensors      no tensors; metadata: step, the data cursor, the seed, the lr scale, the
--                            recipe's text and hash, every field of the checked recipe, the
--                            overrides, the runtime version, each source's index.json hash, the
--                            tokenizer the data was converted with and its fingerprint
--     recipe.lua             the recipe's text, and provenance.json (the same metadata, for people)
--     tokenizer.json         the run's tokenizer, for Hugging Face tools (wick.train.tokenizer_files;
--     tokenizer_config.json  the state's tokenizer and tokenizer_fingerprint say which it was)
--     DONE                   written last
--
-- A checkpoint is written into DIR/.step-00000040.tmp-PID (rank 0's pid); every file is fsynced,
-- then DONE is written and fsynced, the directory fsynced, renamed into place and DIR fsynced: it
-- survives a lost machine, not only a killed process. A writer (any rank) killed mid-write leaves a
-- temporary directory (removed by the next save) and the previous checkpoints untouched; only
-- directories holding DONE count. After a save the oldest complete ones beyond `keep` are removed.
--
-- Reading back, every metadata field is checked for type, integrality, finiteness and range
-- (wick.schema) and against the others; tensors by dtype and shape from the header before any is
-- read. A bad checkpoint is one line naming the file and the field (exit 1).
local ffi = require 'ffi'
local cli = require 'wick.cli'
local core = require 'wick.core'
local json = require 'wick.json'
local recipe = require 'wick.recipe'
local safetensors = require 'wick.safetensors'
local schema = require 'wick.schema'

local checkpoint = {}

local NAME = 'step-%08d'
local F32 = 4  -- bytes of an f32 master weight
local BYTES = { f32 = 4, bf16 = 2, f16 = 2 }

-- The dtype a model's weights are saved in: the one it computes in (the policy's), as transformers
-- saves a model in its torch_dtype. Another than f32 puts the f32 masters in the optimizer files.
local function weights_dtype(model) return model.policy.dtype end

-- The f32 masters of piece p (stored_pieces'): this rank's slice of them under a sharded data
-- parallelism that holds them (layout.masters, at p.at), else the model's own (at p.offset).
local function master_piece(model, layout, p)
  if layout and layout.masters then return layout.masters:narrow(1, p.at + 1, p.numel) end
  return model.flat.params:narrow(1, p.offset + 1, p.numel)
end
local DONE = 'DONE'
local LOCK = 'LOCK'

-- ---- libc: directories, the lock, fsync ------------------------------------------------------------

for _, declaration in ipairs({ 'int getpid(void);', 'int open(const char *path, int flags, ...);',
  'int close(int fd);', 'int flock(int fd, int operation);', 'int fsync(int fd);',
  'int ftruncate(int fd, int64_t length);', 'ssize_t write(int fd, const void *buffer, size_t count);',
  'int mkdir(const char *path, unsigned int mode);', 'int access(const char *path, int mode);',
  'char *strerror(int errnum);' }) do
  pcall(ffi.cdef, declaration) -- another module may have declared it already
end
local C = ffi.C

-- Linux's values (x86-64 and AArch64 share them).
local O_RDONLY, O_RDWR, O_CREAT, O_CLOEXEC = 0, 2, 0x40, 0x80000
local LOCK_SH, LOCK_EX, LOCK_NB = 1, 2, 4
local F_OK, X_OK, W_OK = 0, 1, 2
local EEXIST, EWOULDBLOCK = 17, 11
local FILE_MODE, DIRECTORY_MODE = tonumber('644', 8), tonumber('755', 8)
local SLASH = ('/'):byte()

local function strerror(errno) return ffi.string(C.strerror(errno)) end

local function fail(fmt, ...) cli.fail(('checkpoint: ' .. fmt):format(...), cli.EXIT_DATA) end

-- The fd of path opened with flags, or nil and why not (naming it).
local function open(path, flags, mode)
  local fd = C.open(path, flags, ffi.new('int', mode or 0))
  if fd < 0 then return nil, ("'%s': %s"):format(path, strerror(ffi.errno())) end
  return fd
end

local function close(fd, path)
  if C.close(fd) ~= 0 then fail("cannot close '%s': %s", path, strerror(ffi.errno())) end
end

-- Flushes a file or a directory (its entries) to the disk.
local function sync(path)
  local fd, why = open(path, O_RDONLY + O_CLOEXEC)
  if not fd then fail('cannot fsync %s', why) end
  if C.fsync(fd) ~= 0 then
    local errno = ffi.errno()
    C.close(fd) -- the fsync's failure is the one to report
    fail("cannot fsync '%s': %s", path, strerror(errno))
  end
  close(fd, path)
end

local function is_directory(path) return C.access(path .. '/.', F_OK) == 0 end -- 'file/.' does not resolve

-- mkdir -p: true, or nil and why not.
local function make_directories(path)
  for i = 1, #path do
    if (path:byte(i) == SLASH and i > 1) or i == #path then
      local prefix = path:byte(i) == SLASH and path:sub(1, i - 1) or path
      if C.mkdir(prefix, DIRECTORY_MODE) ~= 0 then
        local errno = ffi.errno()
        if errno ~= EEXIST then return nil, ("cannot create '%s': %s"):format(prefix, strerror(errno)) end
        if not is_directory(prefix) then return nil, ("'%s' is not a directory"):format(prefix) end
      end
    end
  end
  return true
end

-- ---- writing ---------------------------------------------------------------------------------------

local function quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function sh(command, what)
  if os.execute(command) ~= 0 then fail('cannot %s (%s)', what, command) end
end

local function exists(path)
  local f = io.open(path, 'rb')
  if f then f:close() end
  return f ~= nil
end
checkpoint.exists = exists

-- Writes a file of a checkpoint (a failure is one line naming it, exit 1).
local function write_file(path, text)
  local ok, why = core.write_file(path, text)
  if not ok then fail('cannot write %s', why) end
end
checkpoint.write_file = write_file

local function entries(dir)
  local out = {}
  local listing = io.popen('ls -a ' .. quote(dir) .. ' 2>/dev/null')
  for name in listing:lines() do
    if name ~= '.' and name ~= '..' then out[#out + 1] = name end
  end
  listing:close()
  return out
end

-- The complete checkpoints of dir, oldest first: { step =, path = }.
function checkpoint.list(dir)
  local out = {}
  for _, name in ipairs(entries(dir)) do
    local step = name:match('^step%-(%d+)$')
    if step and exists(dir .. '/' .. name .. '/' .. DONE) then out[#out + 1] = { step = tonumber(step), path = dir .. '/' .. name } end
  end
  table.sort(out, function(a, b) return a.step < b.step end)
  return out
end

function checkpoint.latest(dir)
  local list = checkpoint.list(dir)
  return list[#list]
end

-- A write that fails (a full disk) is one line naming the file, not a traceback; else what fn returns.
local function written(fn, ...)
  local ok, result = pcall(fn, ...)
  if not ok then fail('%s', (tostring(result):gsub('^.-:%d+: ', ''))) end
  return result
end

local function temporary_path(dir, step, pid) return ('%s/.%s.tmp-%d'):format(dir, NAME:format(step), pid) end

-- The temporary directory a checkpoint of `step` is written into (made in dir, where what killed
-- writers left is removed first: the lock keeps out live ones). Rank 0 makes it; every rank of a
-- sharded run writes its optimizer slice there.
function checkpoint.start(dir, step)
  local made, why = make_directories(dir)
  if not made then fail('checkpoint.dir: %s', why) end
  for _, name in ipairs(entries(dir)) do
    if name:match('^%.step%-%d+%.tmp%-%d+$') then sh('rm -rf ' .. quote(dir .. '/' .. name), 'remove ' .. name) end
  end
  local tmp = temporary_path(dir, step, C.getpid())
  made, why = make_directories(tmp)
  if not made then fail('%s', why) end
  return tmp
end

-- Whether `path` is a temporary directory start() made for `step` in dir: another rank learns it
-- through the store and checks it before writing there, so no value in the store can point a
-- rank's writes anywhere else.
function checkpoint.is_temporary(dir, step, path)
  local pid = type(path) == 'string' and path:match('%.tmp%-(%d+)$')
  return pid and #pid <= 10 and path == temporary_path(dir, step, tonumber(pid)) and is_directory(path) or false
end

-- Completes the checkpoint in tmp (start's, its other files written): the state with `metadata`,
-- every file fsynced, DONE last, renamed into place; keeps the newest `keep`. Returns its path.
function checkpoint.finish(dir, tmp, step, metadata, keep)
  written(safetensors.save, tmp .. '/state.safetensors', {}, metadata)
  write_file(tmp .. '/recipe.lua', metadata.recipe_text or '')
  local readable = {}
  for k, v in pairs(metadata) do if k ~= 'recipe_text' then readable[k] = v end end
  write_file(tmp .. '/provenance.json', json.encode(readable) .. '\n')
  for _, name in ipairs(entries(tmp)) do sync(tmp .. '/' .. name) end
  write_file(tmp .. '/' .. DONE, ('%d\n'):format(step))
  sync(tmp .. '/' .. DONE)
  sync(tmp)
  local final = dir .. '/' .. NAME:format(step)
  if exists(final) then sh('rm -rf ' .. quote(final), 'replace ' .. final) end
  local ok, rename_error = os.rename(tmp, final)
  if not ok then fail('cannot rename %s to %s: %s', tmp, final, rename_error) end
  sync(dir)
  local list = checkpoint.list(dir)
  for i = 1, #list - keep do sh('rm -rf ' .. quote(list[i].path), 'remove an old checkpoint') end
  return final
end

-- One process's checkpoint: start, `parts(tmp)` writes the files, finish. Returns its path.
function checkpoint.save(dir, step, metadata, parts, keep)
  local tmp = checkpoint.start(dir, step)
  written(parts, tmp)
  return checkpoint.finish(dir, tmp, step, metadata, keep)
end

-- The optimizer's part: AdamW's moments and counters, the loss scaler and the f32 masters where the
-- model file holds 2-byte weights, in one file when one
-- rank holds them all (OPTIMIZER_FILE), else one file per rank of a sharded run (OPTIMIZER_SLICE),
-- written by that rank in parallel with the others. A file's m and v are the moments of its
-- `pieces` ([offset, numel] ranges of the flat parameter order, in that order; all of it when
-- absent), so a checkpoint reads back onto any world size and sharding (checkpoint.load_optimizer).
local OPTIMIZER_FILE = 'optimizer.safetensors'
local OPTIMIZER_SLICE = 'optimizer-%05d-of-%05d.safetensors'

-- The pieces a rank stores: with a layout (wick.nn.shard) its own, the replicated head once (rank
-- 0's); without, all of it. Each { offset, numel, at } (at: where it starts in the rank's moments).
local function stored_pieces(layout, numel)
  if not layout then return { { offset = 0, numel = numel, at = 0 } } end
  local pieces = {}
  for _, p in ipairs(layout.pieces) do
    if layout:counts(p) then pieces[#pieces + 1] = p end
  end
  return pieces
end

-- Writes this rank's optimizer file into dir (a checkpoint's temporary directory); layout: a sharded
-- nn.data_parallel's (nil: this rank holds every moment). Returns its path. The pieces it stores need
-- not lie together in its moments (a rank other than 0 skips the replicated ones between its
-- blocks): the file is created for all of them and each is written where it goes, with no copy.
function checkpoint.save_optimizer(dir, opt, model, layout)
  local numel = model:parameter_count()
  local m, v = opt:moments(model, layout)
  local pieces, spans, held = stored_pieces(layout, numel), {}, 0
  for i, p in ipairs(pieces) do
    spans[i] = { p.offset, p.numel }
    held = held + p.numel
  end
  local sharded = layout and layout.world_size > 1
  local path = dir .. '/' .. (sharded and OPTIMIZER_SLICE:format(layout.rank, layout.world_size) or OPTIMIZER_FILE)
  local scaler = model.policy.scaler
  local names, shapes = { 'm', 'v' }, { m = { held }, v = { held } }
  if weights_dtype(model) ~= 'f32' then names[3], shapes.master = 'master', { held } end
  local offsets = written(safetensors.create, path, names, shapes, 'f32', {
    step_count = opt.step_count,
    scale = scaler and ('%.17g'):format(scaler.scale) or nil,
    good_steps = scaler and scaler.good_steps or nil,
    skipped = scaler and scaler.skipped or nil,
    numel = numel,
    pieces = json.encode(spans),
  })
  local at = 0
  for _, p in ipairs(pieces) do
    for _, name in ipairs(names) do
      local part = name == 'master' and master_piece(model, layout, p)
        or (name == 'm' and m or v):narrow(1, p.at + 1, p.numel)
      written(safetensors.write_at, path, offsets[name] + at * F32, part)
      part:free()
    end
    at = at + p.numel
  end
  -- Rank 0's finish fsyncs every file in the directory; another rank fsyncs its own, since on a
  -- shared file system one node's fsync does not reach another node's writes.
  if layout and layout.rank ~= 0 then sync(path) end
  return path
end

-- ---- one writer a directory ------------------------------------------------------------------------

local function in_use(dir, path)
  local text = core.read_file(path)
  return ("checkpoint.dir '%s' is in use by another run (pid %s holds %s): wait for it to end, or set another " ..
    'checkpoint.dir'):format(dir, text and text:match('%d+') or 'unknown', path)
end

-- Takes dir's lock (creating dir) for as long as this process lives or until checkpoint.unlock:
-- the lock, or nil and why not (naming the pid of the run that holds it). A directory that cannot be
-- created or written is found here, before any step.
function checkpoint.lock(dir)
  local made, why = make_directories(dir)
  if not made then return nil, 'checkpoint.dir: ' .. why end
  local path = dir .. '/' .. LOCK
  local fd, err = open(path, O_RDWR + O_CREAT + O_CLOEXEC, FILE_MODE)
  if not fd then return nil, ("checkpoint.dir '%s' cannot be written: %s"):format(dir, err) end
  if C.flock(fd, LOCK_EX + LOCK_NB) ~= 0 then
    local errno = ffi.errno()
    close(fd, path)
    if errno == EWOULDBLOCK then return nil, in_use(dir, path) end
    return nil, ("cannot lock '%s': %s"):format(path, strerror(errno))
  end
  local pid = ('%d\n'):format(C.getpid())
  if C.ftruncate(fd, 0) ~= 0 or C.write(fd, pid, #pid) ~= #pid then
    local errno = ffi.errno()
    close(fd, path)
    return nil, ("checkpoint.dir '%s' cannot be written: '%s': %s"):format(dir, path, strerror(errno))
  end
  return { fd = fd, path = path }
end

function checkpoint.unlock(lock)
  if lock and lock.fd then
    close(lock.fd, lock.path)
    lock.fd = nil
  end
end

-- ---- reading back ----------------------------------------------------------------------------------

local MAX_STEPS = recipe.SCHEMA:find('steps').max
local MAX_WORLD = require('wick.dist').MAX_WORLD
local HASH_DIGITS = 16

local function cursor_step(cursor) return tonumber(cursor:match('^wick%-cursor/%d+ step=(%d+) ')) end

local function is_cursor(v)
  return type(v) == 'string' and cursor_step(v) ~= nil, 'must be a loader cursor (wick-cursor/N step=S ...)'
end
local function is_hash(v)
  return type(v) == 'string' and #v == HASH_DIGITS and v:match('^%x+$') ~= nil, 'must be 16 hex digits'
end
local function is_positive(v)
  return type(v) == 'number' and v > 0 and v < math.huge, 'must be a finite number > 0'
end

local seed = schema.from(recipe.SCHEMA, 'seed', { required = true })
seed.default = nil -- a state without its seed is refused, not given the recipe's default

local STATE = schema.define('checkpoint state', {
  { 'step', 'integer', min = 0, max = MAX_STEPS, required = true },
  { 'cursor', 'cursor', check = is_cursor, required = true },
  seed,
  { 'lr_scale', 'number', min = 0, required = true }, -- set_lr's range: a negative one would ascend
  { 'world_size', 'integer', min = 1, max = MAX_WORLD, required = true },
  { 'recipe_hash', 'hash', check = is_hash, required = true },
  { 'recipe_text', 'string', required = true },
  { 'recipe_name', 'string' }, { 'overrides', 'string' }, { 'version', 'string' }, { 'data', 'string' },
  { 'tokenizer', 'string' }, -- the run's (wick.train.tokenizer_files): 'bytes', 'gpt2' or the file converted with
  { 'tokenizer_fingerprint', 'hash', check = is_hash },
})

local OPTIMIZER = schema.define('optimizer state', {
  { 'step_count', 'integer', min = 0, max = MAX_STEPS, required = true },
  { 'scale', 'loss scale', check = is_positive },
  { 'good_steps', 'integer', min = 0, max = MAX_STEPS },
  { 'skipped', 'integer', min = 0, max = MAX_STEPS },
  { 'numel', 'integer', min = 1, max = 2 ^ 53 }, -- the flat parameters' (checked against the model's)
  { 'pieces', 'string' },                         -- JSON [[offset, numel], ...] (checked by pieces_of)
})

-- metadata (strings) checked by `set`, numbers where the set declares them; keys matching `elsewhere`
-- are left to their own check (the recipe's fields: wick.recipe.provenance.diff). Raises naming file and field.
local function checked(set, metadata, path, elsewhere)
  local given = {}
  for key, text in pairs(metadata) do
    if not (elsewhere and key:match(elsewhere)) then
      local option = set:option(key)
      local numeric = option and (option[2] == 'integer' or option[2] == 'number' or option[2] == 'loss scale')
      given[key] = numeric and tonumber(text) or text
    end
  end
  local out, why = set:check_tree(given)
  if not out then fail('%s: %s', path, why) end
  return out
end

-- The state of a checkpoint, checked: its fields typed, the recipe's as `recipe.PATH` texts. Raises
-- naming the file and the field.
function checkpoint.state(dir)
  local path = dir .. '/state.safetensors'
  local tensors, metadata = safetensors.header(path)
  if not tensors then fail('%s', metadata) end
  if next(tensors) then fail('%s: holds tensors; a state holds metadata only', path) end
  local state = checked(STATE, metadata, path, '^recipe%.')
  local at = cursor_step(state.cursor)
  if at ~= state.step then
    fail('%s: step %d but its cursor is at step %d (resuming would skip or repeat data)', path, state.step, at)
  end
  local recipe_seed = metadata['recipe.seed']
  if recipe_seed and tonumber(recipe_seed) ~= state.seed then
    fail('%s: seed %d but its recipe.seed is %s', path, state.seed, recipe_seed)
  end
  for key, text in pairs(metadata) do
    if key:match('^recipe%.') then state[key] = text end
  end
  return state
end

local function shape_text(shape) return '[' .. table.concat(shape, ', ') .. ']' end

-- Refuses tensors of path whose dtype or shape differ from `expected` (name -> tensor), from the
-- header, naming the tensor; with `required` the names must be exactly those expected. Returns the
-- file's metadata.
local function check_tensors(path, expected, required, whose)
  local header, metadata = safetensors.header(path)
  if not header then fail('%s', metadata) end
  local names = {}
  for name in pairs(expected) do names[#names + 1] = name end
  table.sort(names) -- the same first problem every run
  for _, name in ipairs(names) do
    local got, want = header[name], expected[name]
    if not got and required then fail('%s: has no tensor %s', path, name) end
    if got and (got.dtype ~= want.dtype or shape_text(got.shape) ~= shape_text(want.shape)) then
      fail("%s: %s is %s %s, %s %s %s", path, name, got.dtype, shape_text(got.shape), whose or "the model's is",
        want.dtype, shape_text(want.shape))
    end
  end
  for name in pairs(required and header or {}) do
    if not expected[name] then fail('%s: has a tensor %s, which is not expected there', path, name) end
  end
  return metadata
end

-- The model into a checkpoint's directory, as a Hugging Face model directory, in three calls:
-- create_model (rank 0, first: model.safetensors with its header, sized for the weights in the
-- model's dtype laid out in the flat parameter order, so a piece of the flat storage lies at its
-- offset times the dtype's size), write_model
-- (every rank that holds masters: rank 0 all of them, or under sliced masters, layout.masters, each
-- rank its pieces, in parallel and without gathering them) and finish_model (rank 0, after every
-- rank wrote: config.json and generation_config.json).
local MODEL_FILE = 'model.safetensors'

function checkpoint.create_model(dir, model)
  local shapes = {}
  for _, p in ipairs(model.entries) do shapes[p.name] = p.shape end
  local dtype = weights_dtype(model)
  local offsets = written(safetensors.create, dir .. '/' .. MODEL_FILE, model.order, shapes, dtype, { format = 'pt' })
  for _, p in ipairs(model.entries) do
    assert(offsets[p.name] == p.offset * BYTES[dtype], 'checkpoint: a gap in the flat order')
  end
end

-- Writes masters (f32) at the flat offset `offset` of a model file of dtype, rounded to it (to
-- nearest even, as the compute copy is) where it is not f32.
local function write_weights(path, offset, masters, dtype)
  if dtype == 'f32' then return written(safetensors.write_at, path, offset * F32, masters) end
  local rounded = masters:to(dtype)
  written(safetensors.write_at, path, offset * BYTES[dtype], rounded)
  rounded:free()
end

function checkpoint.write_model(dir, model, layout)
  local path, dtype = dir .. '/' .. MODEL_FILE, weights_dtype(model)
  if not (layout and layout.masters) then return write_weights(path, 0, model.flat.params, dtype) end
  for _, p in ipairs(stored_pieces(layout, model:parameter_count())) do
    local piece = master_piece(model, layout, p)
    write_weights(path, p.offset, piece, dtype)
    piece:free()
  end
  if layout.rank ~= 0 then sync(path) end  -- as save_optimizer's slices: rank 0's finish syncs its own
end

function checkpoint.finish_model(dir, model)
  written(model.save_pretrained, model, dir, { weights = false, dtype = weights_dtype(model) })
end

-- Copies into dst (the wanted pieces' values, at their `at`) what src (a file's, at its pieces'
-- `at`) holds of them.
local function copy_overlaps(dst, wanted, src, stored)
  for _, s in ipairs(stored) do
    for _, w in ipairs(wanted) do
      local lo, hi = math.max(s.offset, w.offset), math.min(s.offset + s.numel, w.offset + w.numel)
      if lo < hi then
        local to, from = dst:narrow(1, w.at + lo - w.offset + 1, hi - lo), src:narrow(1, s.at + lo - s.offset + 1, hi - lo)
        to:copy(from)
        to:free()
        from:free()
      end
    end
  end
end

-- The weights of a checkpoint's f32 model file into model (a checkpoint whose optimizer files hold
-- the masters is read by load_optimizer): every tensor f32, of the model's shape. Where a sharded
-- data parallelism holds the f32 masters (layout.masters: the model keeps a compute copy or, under
-- 'parameters', no weights), only this rank's pieces of them are read, from the file's mapping, and
-- the caller refreshes the compute weights from them (nn.data_parallel's refresh_weights).
function checkpoint.load_model(path, model, layout)
  local expected = {}
  for _, p in ipairs(model.entries) do expected[p.name] = { dtype = 'f32', shape = p.shape } end
  if not (layout and layout.masters) then
    check_tensors(path, expected, false) -- a missing or unexpected name: gpt:load says
    local ok, err = pcall(model.load, model, path)
    if not ok then fail('%s', tostring(err)) end
    return
  end
  check_tensors(path, expected, true)
  local reader, why = safetensors.open(path)
  if not reader then fail('%s', why) end
  for _, p in ipairs(model.entries) do
    local view = reader:view(p.name)
    local flat = view:view({ p.numel })
    copy_overlaps(layout.masters, layout.pieces, flat, { { offset = p.offset, numel = p.numel, at = 0 } })
    flat:free()
    view:free()
  end
  reader:close()
end

-- The optimizer's counters, checked: its step count cannot be above the checkpoint's step.
local function optimizer_counts(metadata, path, step)
  local counts = checked(OPTIMIZER, metadata, path)
  for _, key in ipairs({ 'step_count', 'skipped' }) do
    if counts[key] and counts[key] > step then
      fail("%s: %s %d is above the checkpoint's step %d", path, key, counts[key], step)
    end
  end
  if counts.scale and not (counts.good_steps and counts.skipped) then
    fail('%s: a loss scale needs good_steps and skipped', path)
  end
  return counts
end

-- The optimizer files of checkpoint dir: its one OPTIMIZER_FILE, or every OPTIMIZER_SLICE of a
-- sharded run (all K of K, none missing, none of another K).
local function optimizer_files(dir)
  local whole, slices, count = false, {}, nil
  for _, name in ipairs(entries(dir)) do
    local rank, of = name:match('^optimizer%-(%d+)%-of%-(%d+)%.safetensors$')
    if name == OPTIMIZER_FILE then
      whole = true
    elseif rank then
      rank, of = tonumber(rank), tonumber(of)
      if name ~= OPTIMIZER_SLICE:format(rank, of) or of < 1 or of > MAX_WORLD or rank >= of then
        fail('%s/%s: not an optimizer file name (%s)', dir, name, OPTIMIZER_SLICE:format(0, 2))
      end
      if count and of ~= count then fail('%s: optimizer files of %d and of %d ranks', dir, count, of) end
      count, slices[rank + 1] = of, dir .. '/' .. name
    end
  end
  if whole and count then fail('%s: both %s and %s files', dir, OPTIMIZER_FILE, OPTIMIZER_SLICE:format(0, count)) end
  if whole then return { dir .. '/' .. OPTIMIZER_FILE } end
  if not count then fail('%s: has no %s', dir, OPTIMIZER_FILE) end
  for r = 1, count do
    if not slices[r] then fail('%s: has no %s', dir, OPTIMIZER_SLICE:format(r - 1, count)) end
  end
  return slices
end

local function is_count(x, min) return type(x) == 'number' and x % 1 == 0 and x >= min and x <= 2 ^ 53 end

-- The pieces of an optimizer file, checked against the model's numel: { { offset =, numel =, at = } }
-- (at: where the piece starts in the file's m and v), and the elements they hold.
local function pieces_of(counts, path, numel)
  if counts.numel and counts.numel ~= numel then
    fail("%s: numel %d, the model's flat parameters are %d", path, counts.numel, numel)
  end
  if not counts.pieces then return { { offset = 0, numel = numel, at = 0 } }, numel end -- a whole file
  local spans = json.decode(counts.pieces)
  if type(spans) ~= 'table' or #spans == 0 then fail('%s: pieces must be a list of [offset, numel] pairs', path) end
  local pieces, at = {}, 0
  for i, span in ipairs(spans) do
    local offset, n = type(span) == 'table' and span[1], type(span) == 'table' and span[2]
    if not (is_count(offset, 0) and is_count(n, 1) and offset + n <= numel and #span == 2) then
      fail('%s: pieces[%d] must be [offset, numel] within the %d parameters', path, i, numel)
    end
    pieces[i] = { offset = offset, numel = n, at = at }
    at = at + n
  end
  return pieces, at
end

-- Every parameter's moments are in exactly one file: the pieces of all files, sorted, tile [0, numel).
local function check_coverage(dir, files, numel)
  local all = {}
  for _, file in ipairs(files) do
    for _, p in ipairs(file.pieces) do all[#all + 1] = { offset = p.offset, numel = p.numel, path = file.path } end
  end
  table.sort(all, function(a, b) return a.offset < b.offset end)
  local at = 0
  for _, p in ipairs(all) do
    if p.offset > at then fail('%s: no file holds the moments of parameters %d to %d', dir, at, p.offset - 1) end
    if p.offset < at then fail('%s: the moments of parameter %d are in two files (one is %s)', dir, p.offset, p.path) end
    at = at + p.numel
  end
  if at ~= numel then fail('%s: no file holds the moments of parameters %d to %d', dir, at, numel - 1) end
end

-- The optimizer's state of checkpoint dir into opt (built for model, and for this rank's pieces
-- with a sharded nn.data_parallel's layout) and the model's loss scaler; `step` is the checkpoint's.
-- The files may come from any world size and sharding: each is read through its mapping, and only
-- what this rank keeps of it is copied, so a rank never holds more than its own moments. Where the
-- files hold the f32 masters (a bf16 or fp16 run's: all of them or none), they go into the model's
-- masters (or this rank's slice of them) too. Returns whether they did: else load_model reads them.
function checkpoint.load_optimizer(dir, opt, model, step, layout)
  local numel = model:parameter_count()
  local files, first, masters = {}, nil, nil
  for i, path in ipairs(optimizer_files(dir)) do
    local header, metadata = safetensors.header(path)
    if not header then fail('%s', metadata) end
    local counts = optimizer_counts(checked(OPTIMIZER, metadata, path), path, step)
    local pieces, held = pieces_of(counts, path, numel)
    local shape = { dtype = 'f32', shape = { held } }
    if masters ~= nil and masters ~= (header.master ~= nil) then
      fail('%s: %s the f32 masters and %s does not', path, masters and files[1].path or path,
        masters and path or files[1].path)
    end
    masters = header.master ~= nil
    check_tensors(path, { m = shape, v = shape, master = masters and shape or nil }, true,
      held < numel and 'its pieces hold' or nil)
    counts.numel, counts.pieces = nil, nil
    if first and json.encode(counts) ~= json.encode(first) then
      fail('%s: its step count and loss scale are not those of %s', path, files[1].path)
    end
    first, files[i] = counts, { path = path, pieces = pieces }
  end
  check_coverage(dir, files, numel)
  local m, v = opt:moments(model, layout)
  local whole = { { offset = 0, numel = numel, at = 0 } }
  local targets = { { 'm', m, layout and layout.pieces or whole }, { 'v', v, layout and layout.pieces or whole } }
  if masters then
    local sliced = layout and layout.masters
    targets[3] = { 'master', sliced or model.flat.params, sliced and layout.pieces or whole }
  end
  for _, file in ipairs(files) do
    local reader, why = safetensors.open(file.path)
    if not reader then fail('%s', why) end
    for _, target in ipairs(targets) do
      local stored = reader:view(target[1])
      copy_overlaps(target[2], target[3], stored, file.pieces)
      stored:free()
    end
    reader:close()
  end
  opt.step_count = first.step_count
  local scaler = model.policy.scaler
  if scaler and first.scale then
    scaler.scale, scaler.good_steps, scaler.skipped = first.scale, first.good_steps, first.skipped
  end
  return masters
end

-- ---- the dry run -----------------------------------------------------------------------------------

-- The nearest existing directory at or above path, or nil and why not.
local function writable_base(path)
  while C.access(path, F_OK) ~= 0 do
    local parent = path:match('^(.*)/[^/]*$')
    path = parent == nil and '.' or (parent == '' and '/' or parent)
  end
  if not is_directory(path) then return nil, ("'%s' is not a directory"):format(path) end
  if C.access(path, W_OK + X_OK) ~= 0 then return nil, ("'%s': %s"):format(path, strerror(ffi.errno())) end
  return path
end

-- Whether another process holds dir's lock (probed with a shared lock, released at once).
local function held(dir)
  local path = dir .. '/' .. LOCK
  local fd = open(path, O_RDONLY + O_CLOEXEC)
  if not fd then return false end
  local busy = C.flock(fd, LOCK_SH + LOCK_NB) ~= 0 and ffi.errno() == EWOULDBLOCK
  close(fd, path)
  return busy and in_use(dir, path)
end

-- Refuses, for a run without --resume, a directory that holds checkpoints (this recipe's or
-- another's: a later --resume would take the newest step of either run): nil, or the problem naming
-- the directory and the three ways on.
function checkpoint.occupied(dir, hash)
  local latest = checkpoint.latest(dir)
  if not latest then return nil end
  local theirs = checkpoint.state(latest.path).recipe_hash
  local whose = theirs == hash and ("this recipe's checkpoints (newest %s)"):format(latest.path)
    or ("another recipe's checkpoints (%s: recipe %s; this recipe is %s)"):format(latest.path, theirs, hash)
  return ("checkpoint.dir '%s' holds %s: pass --resume to continue from them, --checkpoint.overwrite to remove " ..
    'them and start again, or set another checkpoint.dir'):format(dir, whose)
end

-- Removes the checkpoints of dir (complete or not) for checkpoint.overwrite, its lock held: nil.
function checkpoint.clear(dir)
  for _, name in ipairs(entries(dir)) do
    if name:match('^step%-%d+$') or name:match('^%.step%-%d+%.tmp%-%d+$') then
      sh('rm -rf ' .. quote(dir .. '/' .. name), 'remove ' .. dir .. '/' .. name)
    end
  end
  sync(dir)
end

-- What a run would find wrong with dir, taking and creating nothing (run --dry-run): a list of
-- problems. With `resume` the newest checkpoint's state is checked; with `overwrite` the
-- checkpoints there are the run's to remove.
function checkpoint.problems(dir, hash, resume, overwrite)
  local base, why = writable_base(dir)
  if not base then return { ("checkpoint.dir '%s' cannot be created or written: %s"):format(dir, why) } end
  local problems = {}
  local busy = held(dir)
  if busy then problems[#problems + 1] = busy end
  local ok, problem = pcall(function()
    if not resume then return not overwrite and checkpoint.occupied(dir, hash) or nil end
    local latest = checkpoint.latest(dir)
    if latest then checkpoint.state(latest.path) end
  end)
  if not ok or problem then problems[#problems + 1] = tostring(problem) end
  return problems
end

return checkpoint
