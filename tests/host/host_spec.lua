-- The `run` host program: how a user starts scripts, code, modules, and what errors look like.
local helper = require 'helper'
local q = helper.shell_quote

describe('run', function()
  -- On a CPU whose model OpenBLAS does not know (a VM's), it falls back to its SSE3 kernels when it
  -- loads; run then starts itself again on the kernels the CPU runs (wk_blas_better_kernels). A
  -- machine OpenBLAS knows needs nothing, and OPENBLAS_CORETYPE given by the user stands.
  it('runs on the OpenBLAS kernels the CPU runs best, or on those OPENBLAS_CORETYPE names', function()
    local probe = q("local C, ffi = require('wick.core').C, require 'ffi' " ..
      "print(ffi.string(C.wk_blas_kernels()), C.wk_blas_better_kernels() == nil)")
    local r = helper.run('-e ' .. probe)
    assert.are.equal(0, r.rc, r.err)
    local kernels, settled = r.out:match('^(%S+)\t(%a+)\n$')
    assert.are.equal('true', settled, r.out)
    local flags = helper.read_file('/proc/cpuinfo'):match('\nflags%s*:([^\n]*)') or ''
    if flags:find(' avx2 ', 1, true) and flags:find(' fma ', 1, true) then
      assert.are_not.equal('Prescott', kernels) -- this CPU runs AVX2 kernels at least
    end
    r = helper.sh('OPENBLAS_CORETYPE=Prescott ' .. q(helper.RUN) .. ' -e ' .. probe)
    assert.are.equal('Prescott\ttrue\n', r.out, r.err)
  end)

  it('runs -e code', function()
    local r = helper.run("-e 'io.write(1+1)'")
    assert.are.equal(0, r.rc)
    assert.are.equal('2', r.out)
  end)

  it('prints the library version through require "wick"', function()
    local r = helper.run([[-e 'print(require("wick").version)']])
    assert.are.equal(0, r.rc)
    assert.matches('^%d+%.%d+%.%d+\n$', r.out)
  end)

  it('finds lua/ relative to the executable from any directory', function()
    local dir = helper.tmpdir()
    local r = helper.sh('cd ' .. q(dir) .. ' && ' .. q(helper.RUN) .. [[ -e 'print(require("wick").version)']])
    helper.rmtree(dir)
    assert.are.equal(0, r.rc, r.err)
    assert.matches('^%d+%.%d+%.%d+\n$', r.out)
  end)

  it('runs a script with arg and ... set, and returns its exit code', function()
    local dir = helper.tmpdir()
    local script = helper.write_file(dir .. '/s.lua', [[
      print(arg[0]:match('[^/]*$'), arg[1], arg[2], select('#', ...))
      os.exit(tonumber(arg[2]))
    ]])
    local r = helper.run(q(script) .. ' hello 7')
    helper.rmtree(dir)
    assert.are.equal(7, r.rc)
    assert.are.equal('s.lua\thello\t7\t2\n', r.out)
  end)

  it('passes options after the script to the script, not to run', function()
    local dir = helper.tmpdir()
    local script = helper.write_file(dir .. '/s.lua', 'print(...)')
    local r = helper.run(q(script) .. ' --bogus --lr=3')
    local e = helper.run("-e 'print(...)' -- --bogus x")
    helper.rmtree(dir)
    assert.are.equal(0, r.rc, r.err)
    assert.are.equal('--bogus\t--lr=3\n', r.out)
    assert.are.equal(0, e.rc, e.err)
    assert.are.equal('--bogus\tx\n', e.out)
  end)

  it('reads a program from piped stdin', function()
    local r = helper.run('', { stdin = 'print("from stdin")\n' })
    assert.are.equal(0, r.rc)
    assert.are.equal('from stdin\n', r.out)
  end)

  it('runs a module as a program with -m', function()
    local env = 'LUA_PATH=' .. q(helper.ROOT .. '/tests/fixtures/lua/?.lua;;') .. ' '
    local r = helper.sh(env .. q(helper.RUN) .. ' -m echo_args a b')
    assert.are.equal(0, r.rc, r.err)
    assert.are.equal('module args: a,b\narg[0]: echo_args.lua\n', r.out)
  end)

  it('calls main(args) of a library module run with -m and uses its result as exit code', function()
    local env = 'LUA_PATH=' .. q(helper.ROOT .. '/tests/fixtures/lua/?.lua;;') .. ' '
    local r = helper.sh(env .. q(helper.RUN) .. ' -m with_main 5 x')
    assert.are.equal(5, r.rc)
    assert.are.equal('main got 2 args, twice(21) = 42\n', r.out)
  end)

  it('reports an unknown module with the paths it searched', function()
    local r = helper.run('-m no.such.module')
    assert.are.equal(1, r.rc)
    assert.matches("no module named 'no.such.module'", r.err, 1, true)
    assert.is_nil(r.err:find('stack traceback', 1, true), r.err)
  end)

  it('exits 1 naming the path of a missing script', function()
    local r = helper.run('/nonexistent.lua')
    assert.are.equal(1, r.rc)
    assert.matches('/nonexistent.lua', r.err, 1, true)
  end)

  it('exits 1 with file:line: message and a traceback on a Lua error', function()
    local dir = helper.tmpdir()
    local script = helper.write_file(dir .. '/bad.lua', 'local x = 1\nlocal function f() error("boom") end\nf()\n')
    local r = helper.run(q(script))
    helper.rmtree(dir)
    assert.are.equal(1, r.rc)
    assert.matches('bad.lua:2: boom', r.err, 1, true)
    assert.matches('stack traceback:', r.err, 1, true)
    assert.matches('bad.lua:3', r.err, 1, true)
  end)

  it('reports a syntax error with file and line', function()
    local dir = helper.tmpdir()
    local script = helper.write_file(dir .. '/syntax.lua', 'local x = \n\n = 3\n')
    local r = helper.run(q(script))
    helper.rmtree(dir)
    assert.are.equal(1, r.rc)
    assert.matches('syntax.lua:3:', r.err, 1, true)
  end)

  it("prints a user error raised through wick.cli as its one line and exits with its status", function()
    local code = [[require('wick.cli').fail('wick.example: the thing you gave is wrong', 3)]]
    local r = helper.run('-e ' .. q(code))
    assert.are.equal(3, r.rc)
    assert.are.equal('wick.example: the thing you gave is wrong\n', r.err)
    local debug = helper.sh('WICK_LOG=debug ' .. q(helper.RUN) .. ' -e ' .. q(code))
    assert.are.equal(3, debug.rc)
    assert.matches('^wick.example: the thing you gave is wrong\nstack traceback:', debug.err)
  end)

  it('prints a data error of the runtime as its one line (exit 1), without Lua internals', function()
    local r = helper.run('-e ' .. q([[require('wick').data.loader { data = '/nonexistent/data' }]]))
    assert.are.equal(1, r.rc)
    assert.are.equal("dataset '/nonexistent/data': open '/nonexistent/data': No such file or directory\n", r.err)
  end)

  it("keeps the traceback for the runtime's refusal of a script's own arguments (a bug of the script)", function()
    local dir = helper.tmpdir()
    local script = helper.write_file(dir .. '/bad_args.lua',
      "local t = require('wick').tensor\nlocal x = t.zeros({ 2, 3 })\nprint(x:view({ 7 }))\n")
    local r = helper.run(q(script))
    helper.rmtree(dir)
    assert.are.equal(1, r.rc)
    assert.matches('bad_args.lua:3', r.err, 1, true)
    assert.matches('stack traceback:', r.err, 1, true)
  end)

  it('refuses a bad WICK_LOG once, before starting any rank (exit 2)', function()
    local r = helper.sh('WICK_LOG=verbose ' .. q(helper.RUN) .. ' --nproc-per-node 2 ' .. q(helper.ROOT .. '/recipes/hello.lua'))
    assert.are.equal(2, r.rc)
    assert.are.equal("run: WICK_LOG='verbose' is not one of error, warn, info, debug (unset it for the default, warn)\n",
      r.err)
    assert.are.equal('', r.out)
    local ok = helper.sh('WICK_LOG=info ' .. q(helper.RUN) .. [[ -e 'print(require("wick.log").level())']])
    assert.are.equal(0, ok.rc, ok.err)
    assert.are.equal('info\n', ok.out)
  end)

  it('exits 2 with usage on an unknown option', function()
    local r = helper.run('--bogus')
    assert.are.equal(2, r.rc)
    assert.matches("unknown option '--bogus'", r.err, 1, true)
    assert.matches('usage: run', r.err, 1, true)
  end)

  it('exits 2 when an option lacks its value or has a bad one', function()
    assert.are.equal(2, helper.run('-e').rc)
    local r = helper.run('--nproc-per-node zero x.lua')
    assert.are.equal(2, r.rc)
    assert.matches("got 'zero'", r.err, 1, true)
  end)

  it('lists every option the parser accepts in --help', function()
    local r = helper.run('--help')
    assert.are.equal(0, r.rc)
    for _, option in ipairs { '-e', '-m', '-i', '--version', '--nproc-per-node', '--nnodes', '--node-rank',
      '--master-addr', '--master-port' } do
      assert.matches(option, r.out, 1, true)
    end
  end)

  it('prints version and build with --version', function()
    local r = helper.run('--version')
    assert.are.equal(0, r.rc)
    assert.matches('^Wick %d+%.%d+%.%d+ %(', r.out)
  end)

  it('plain make on a machine without a build package stops with one line naming it and make deps', function()
    -- The Makefile and its manifest, with one package this machine cannot have and the header it would bring.
    local dir = helper.tmpdir()
    assert.are.equal(0, helper.sh(('cp %s %s && cp -r %s %s'):format(q(helper.ROOT .. '/Makefile'), q(dir),
      q(helper.ROOT .. '/third_party'), q(dir))).rc)
    local manifest = dir .. '/third_party/debian-packages.txt'
    helper.write_file(manifest, helper.read_file(manifest) .. 'build     wick-no-such-package    0    a test\n')
    local r = helper.sh(('make -C %s BUILD_HEADERS="zstd.h wick_no_such_header.h"'):format(q(dir)))
    assert.are.equal(2, r.rc, r.out .. r.err)
    assert.are.equal(1, #helper.lines(r.err), r.err)
    assert.matches("wick_no_such_header.h not found; missing build packages: wick-no-such-package; 'make deps' " ..
      'installs them', r.err, 1, true)
    assert.are.equal(0, helper.sh(('make -n -C %s deps BUILD_HEADERS=wick_no_such_header.h'):format(q(dir))).rc)
    helper.rmtree(dir)
    local here = helper.sh('make -n -C ' .. q(helper.ROOT) .. ' all')
    assert.are.equal(0, here.rc, here.err)
  end)

  it('make deps says each stage and what it installs before it runs: apt-get update, then the packages', function()
    -- apt-get and dpkg-query stand-ins first on PATH: no package is installed, and apt-get only says it ran
    local dir = helper.tmpdir()
    helper.write_file(dir .. '/dpkg-query', '#!/bin/sh\nexit 1\n')
    helper.write_file(dir .. '/apt-get', '#!/bin/sh\necho "apt-get $*"\n')
    helper.write_file(dir .. '/id', '#!/bin/sh\necho 0\n')  -- as root: no sudo
    local r = helper.sh(('chmod +x %s/* && PATH=%s:$PATH sh %s test'):format(q(dir), q(dir),
      q(helper.ROOT .. '/third_party/deps.sh')))
    helper.rmtree(dir)
    assert.are.equal(0, r.rc, r.err)
    local lines = helper.lines(r.out)
    assert.are.equal("deps: [1/2] apt-get update: the package lists of this machine's sources", lines[1])
    assert.are.equal('apt-get update -qq', lines[2])
    local count, listed = lines[3]:match('^deps: %[2/2%] apt%-get install: (%d+) package%(s%): (.+)$')
    assert.is_not_nil(count, lines[3])
    assert.are.equal(tonumber(count), #helper.lines(listed:gsub(' ', '\n')))
    assert.matches('^apt%-get install %-y %-qq %-%-no%-install%-recommends ' .. listed:gsub('%p', '%%%0') .. '$', lines[4])
    assert.are.equal('deps: installed ' .. listed, lines[5])
  end)

  it("a venv says each stage and the packages it installs, then that it is up to date", function()
    local dir = helper.tmpdir()
    -- pip at the version every venv starts with (ensurepip's): satisfied offline, with no download
    local pip = helper.sh([[/usr/bin/python3 -c 'import ensurepip; print(ensurepip.version())']]).out:match('[%d.]+')
    helper.write_file(dir .. '/req.txt', ('# the pins\n\npip==%s  # in the venv already\n'):format(pip))
    local venv = dir .. '/venv'
    local script = helper.ROOT .. '/third_party/python-venv.sh'
    local r = helper.sh(('sh %s demo %s %s'):format(q(script), q(dir .. '/req.txt'), q(venv)))
    local again = helper.sh(('sh %s demo %s %s'):format(q(script), q(dir .. '/req.txt'), q(venv)))
    helper.rmtree(dir)
    assert.are.equal(0, r.rc, r.err)
    assert.are.same({ 'demo venv: [1/2] python3 -m venv ' .. venv,
      'demo venv: [2/2] pip install: 1 pinned package(s) of ' .. dir .. '/req.txt: pip', 'demo venv: made ' .. venv },
      helper.lines(r.out))
    assert.are.equal('demo venv: ' .. venv .. ' is up to date\n', again.out)
  end)

  it('works after make install into a prefix', function()
    local prefix = helper.tmpdir()
    local install = helper.sh('make -s -C ' .. q(helper.ROOT) .. ' install PREFIX=' .. q(prefix))
    assert.are.equal(0, install.rc, install.out .. install.err)
    local r = helper.sh('cd / && ' .. q(prefix .. '/bin/run') .. [[ -e 'print(require("wick").version)']])
    helper.rmtree(prefix)
    assert.are.equal(0, r.rc, r.err)
    assert.matches('^%d+%.%d+%.%d+\n$', r.out)
  end)
end)
