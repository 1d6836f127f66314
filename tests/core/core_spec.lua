-- The FFI boundary: declarations from wick.h, the error model, logging, the version check.
local helper = require 'helper'
local q = helper.shell_quote
local core = require 'wick.core'
local ffi, C = core.ffi, core.C

-- Every `typedef struct { ... } Name;` of the generated cdef, with its field names.
local function cdef_structs()
  local structs = {}
  for body, name in require('wick.cdef'):gmatch('typedef struct%s*(%b{})%s*([%w_]+)%s*;') do
    local fields = {}
    for declaration in body:sub(2, -2):gmatch('[^;]+') do
      -- "uint32_t major, minor" / "const char *name" / "float v[4]": the last word of each
      -- comma-separated declarator is a field name.
      for declarator in declaration:gsub('%b[]', ''):gmatch('[^,]+') do
        local field = declarator:match('([%w_]+)%s*$')
        if field then fields[#fields + 1] = field end
      end
    end
    structs[name] = fields
  end
  return structs
end

describe('the FFI declarations', function()
  it('come from wick.h and agree with C on the size and offsets of every struct', function()
    local structs = cdef_structs()
    assert.is_not_nil(structs.WkBuildInfo, 'the cdef parser found no WkBuildInfo')
    for name, fields in pairs(structs) do
      assert.are.equal(tonumber(C.wk_abi_layout(name, nil)), ffi.sizeof(name), 'sizeof ' .. name)
      for _, field in ipairs(fields) do
        assert.are.equal(tonumber(C.wk_abi_layout(name, field)), ffi.offsetof(name, field),
          'offsetof ' .. name .. '.' .. field)
      end
    end
    assert.are.equal(-1, tonumber(C.wk_abi_layout('NoSuchStruct', nil)))
  end)

  it("check a struct added to wick.h with no row written by hand: the build writes the layout table", function()
    local awk = helper.ROOT .. '/runtime/core/abi_layout.awk'
    local function rows(cdef)
      return helper.sh(('printf %%s %s | awk -f %s'):format(q(cdef), q(awk)))
    end
    local r = rows('typedef struct WkOpaque WkOpaque;\ntypedef struct {\n  uint32_t a, b;\n  const char *name;\n' ..
                   '  char text[16];\n} WkNew;\n')
    assert.are.equal(0, r.rc, r.err)
    assert.are.same({ '    SIZE_OF(WkNew),', '    OFFSET_OF(WkNew, a),', '    OFFSET_OF(WkNew, b),',
                      '    OFFSET_OF(WkNew, name),', '    OFFSET_OF(WkNew, text),' }, helper.lines(r.out))
    local bad = rows('typedef struct {\n  void (*callback)(int);\n} WkCallback;\n')
    assert.are_not.equal(0, bad.rc)
    assert.matches('WkCallback: a nested struct or a function pointer', bad.err, 1, true)
    -- The table the library answers from is that script's output for wick.h, struct for struct.
    local generated = helper.read_file(helper.ROOT .. '/build/gen/abi_layout.h')
    local count = select(2, generated:gsub('SIZE_OF%(', ''))
    local structs = 0
    for _ in pairs(cdef_structs()) do structs = structs + 1 end
    assert.are.equal(structs, count)
  end)

  it('describe the build', function()
    local info = require('wick').build_info()
    assert.are.equal(core.version, info.version)
    assert.is_boolean(info.has_cuda)
    assert.is_true(info.cuda_devices >= 0)
    assert.is_string(info.compiler)
  end)
end)

describe('the CUDA backend module', function()
  it('is not loaded on a machine without an NVIDIA device: no process pays for cuBLAS', function()
    if io.open('/dev/nvidiactl') then
      pending('this machine has an NVIDIA device node')
      return
    end
    local wick = require 'wick'
    assert.are.equal(0, wick.build_info().cuda_devices)
    local x = wick.tensor.zeros({ 4 })
    x:free()
    local maps = helper.read_file('/proc/self/maps')
    assert.is_nil(maps:find('libcublas', 1, true))
    assert.is_nil(maps:find('libcudart', 1, true))
    assert.is_nil(maps:find('libwick_cuda', 1, true))
  end)
end)

describe('the error model', function()
  it('turns a failing status into a Lua error carrying the library message, blaming the caller', function()
    local log = require 'wick.log'
    local ok, err = pcall(function() log.set('loud') end)
    assert.is_false(ok)
    assert.matches("unknown log level 'loud'", err, 1, true)
    assert.matches('core_spec.lua:%d+:', err)
  end)

  it('offers nil, message, status name for recoverable failures', function()
    local level = ffi.new('WkLogLevel[1]')
    local ok, message, status = core.try(C.wk_parse_log_level('nope', level))
    assert.is_nil(ok)
    assert.matches("unknown log level 'nope'", message, 1, true)
    assert.are.equal('WK_ERR_INVALID_ARG', status)
    assert.is_true(core.try(C.wk_parse_log_level('info', level)))
    assert.are.equal(C.WK_LOG_INFO, level[0])
  end)

  it('names every status', function()
    for status = 0, 10 do
      assert.matches('^WK_', ffi.string(C.wk_status_name(status)))
    end
    assert.are.equal('WK_ERR_UNKNOWN', ffi.string(C.wk_status_name(99)))
  end)
end)

describe('logging', function()
  local function log_all(env)
    return helper.sh(env .. ' ' .. q(helper.RUN) .. [[ -e 'local log = require("wick.log")
      log.error("e%d", 1) log.warn("w") log.info("i") log.debug("d")']])
  end

  it('defaults to warn and follows WICK_LOG', function()
    assert.are.equal('wick error: e1\nwick warn: w\n', log_all('env -u WICK_LOG -u RANK').err)
    assert.are.equal('wick error: e1\nwick warn: w\nwick info: i\nwick debug: d\n',
      log_all('env -u RANK WICK_LOG=debug').err)
    assert.are.equal('wick error: e1\n', log_all('env -u RANK WICK_LOG=error').err)
  end)

  it('refuses an unknown WICK_LOG (usage error, exit 2) instead of running at another level', function()
    local r = log_all('env -u RANK WICK_LOG=chatty')
    assert.matches("WICK_LOG='chatty' is not one of", r.err, 1, true)
    assert.are.equal(2, r.rc)
    assert.are.equal(1, #helper.lines(r.err))
    assert.are.equal('', r.out)
  end)

  it('prefixes lines with the rank in a multi-process job', function()
    assert.are.equal('wick[3] error: e1\nwick[3] warn: w\n', log_all('env -u WICK_LOG RANK=3').err)
  end)

  it('can be changed from Lua', function()
    local log = require 'wick.log'
    local before = log.level()
    log.set('debug')
    assert.are.equal('debug', log.level())
    log.set(before)
  end)
end)

describe('loading', function()
  it('works under a plain luajit through WICK_LIB', function()
    local code = [[package.path = ']] .. helper.ROOT .. [[/lua/?.lua;' .. package.path
      print(require('wick.core').version)]]
    local env = 'WICK_LIB=' .. q(helper.ROOT .. '/build/libwick.so')
    if require('wick').build_info().build_flags:find('asan') then
      -- A sanitized libwick needs the ASan runtime loaded first; luajit itself is not instrumented.
      local libasan = helper.sh('cc -print-file-name=libasan.so').out:gsub('%s+$', '')
      env = env .. ' LD_PRELOAD=' .. q(libasan) .. ' ASAN_OPTIONS=detect_leaks=0'
    end
    local r = helper.sh(env .. ' luajit -e ' .. q(code))
    assert.are.equal(0, r.rc, r.err)
    assert.matches('^%d+%.%d+%.%d+\n$', r.out)
  end)
end)

describe('core.handle', function()
  -- A free function that counts its calls, for pointers no C code owns.
  local function counting_free()
    local calls = {}
    return calls, function(ptr, ...) calls[#calls + 1] = { tonumber(ffi.cast('intptr_t', ptr)), ... }; return 'freed' end
  end

  it('frees a handle that is never closed when it is collected', function()
    local calls, free = counting_free()
    local own = core.handle(free)
    local object = { handle = own(ffi.cast('void *', 7)) }
    assert.are.same({}, calls)
    object = nil -- dropped without close()
    collectgarbage()
    collectgarbage()
    assert.are.same({ { 7 } }, calls)
  end)

  it('closes once: the field is cleared, a second close does nothing, the collector frees nothing', function()
    local calls, free = counting_free()
    local own, close = core.handle(free)
    local object = { handle = own(ffi.cast('void *', 9)) }
    assert.are.equal('freed', close(object, 250))
    assert.is_nil(object.handle)
    assert.is_nil(close(object, 250))
    collectgarbage()
    collectgarbage()
    assert.are.same({ { 9, 250 } }, calls)
  end)

  it('closes the runtime objects that own one, twice without harm', function()
    local tok = require('wick.data.tokenizer').open('bytes')
    tok:close()
    tok:close()
    assert.is_nil(tok.handle)
  end)
end)
