-- Test helpers: run real processes and capture what they print.
local host = require 'wick.host'

local helper = {}

helper.RUN = host.exe   -- the `run` binary under test
helper.ROOT = host.home -- the checkout

function helper.shell_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

local function read_file(path)
  local f = io.open(path, 'rb')
  if not f then return '' end
  local data = f:read('*a')
  f:close()
  return data
end
helper.read_file = read_file

function helper.write_file(path, data)
  local f = assert(io.open(path, 'wb'))
  f:write(data)
  f:close()
  return path
end

-- Runs a shell command line; returns { out = stdout, err = stderr, rc = exit code }.
-- opts.stdin: text fed to standard input.
function helper.sh(command, opts)
  opts = opts or {}
  local out_path, err_path = os.tmpname(), os.tmpname()
  local redirect = ''
  if opts.stdin then
    local in_path = helper.write_file(os.tmpname(), opts.stdin)
    redirect = ' < ' .. in_path
  end
  local wrapped = string.format('( %s )%s > %s 2> %s; echo $?', command, redirect, out_path, err_path)
  local pipe = io.popen(wrapped)
  local rc = tonumber(pipe:read('*a'):match('(%d+)%s*$'))
  pipe:close()
  local result = { out = read_file(out_path), err = read_file(err_path), rc = rc }
  os.remove(out_path)
  os.remove(err_path)
  return result
end

-- The pinned test venv (third_party/test-venv.sh: moto, the tokenizer oracles, pyarrow, tensorboard), made when it is
-- missing or stale: its python, or nil and why it cannot be had (no PyPI).
helper.TEST_PYTHON = helper.ROOT .. '/build/test/venv/bin/python'
function helper.test_python()
  local q = helper.shell_quote
  local r = helper.sh(('sh %s %s'):format(q(helper.ROOT .. '/third_party/test-venv.sh'),
    q(helper.ROOT .. '/build/test/venv')))
  if r.rc ~= 0 then
    return nil, 'the test venv could not be made (is PyPI reachable?): ' .. (r.err ~= '' and r.err or r.out)
  end
  return helper.TEST_PYTHON
end

-- The Hugging Face venv (third_party/hf-venv.sh: transformers over Debian's python3-torch), made when
-- it is missing or stale: its python, or nil and why it cannot be had.
helper.HF_PYTHON = helper.ROOT .. '/build/test/hf-venv/bin/python'
function helper.hf_python()
  local r = helper.sh('sh ' .. helper.shell_quote(helper.ROOT .. '/third_party/hf-venv.sh'))
  if r.rc ~= 0 then
    return nil, 'the Hugging Face venv could not be made (python3-torch installed? PyPI reachable?): ' ..
      (r.err ~= '' and r.err or r.out)
  end
  return helper.HF_PYTHON
end

-- The checkout's top-level entries but checkpoints/, listed once.
local top_level
local function checkout_entries()
  if not top_level then
    top_level = {}
    local pipe = io.popen('ls -A ' .. helper.shell_quote(helper.ROOT))
    for name in pipe:lines() do
      if name ~= 'checkpoints' then top_level[#top_level + 1] = helper.shell_quote(helper.ROOT .. '/' .. name) end
    end
    pipe:close()
  end
  return table.concat(top_level, ' ')
end

-- A shell line that makes dir (new) a copy of the checkout for a run: its top-level entries linked
-- in (relative paths read and write as from the checkout), checkpoints/ its own: a recipe's default
-- checkpoint.dir, which no test may write into the checkout.
function helper.checkout_copy(dir)
  dir = helper.shell_quote(dir)
  return ('mkdir %s && ln -s %s %s/'):format(dir, checkout_entries(), dir)
end

-- A shell line that runs command in a fresh copy of the checkout (helper.checkout_copy), removed
-- after it; the line exits with the command's status.
function helper.in_checkout_copy(command)
  local path = os.tmpname()
  local dir = helper.shell_quote(path)
  return ('rm -f %s && %s && cd %s && { %s\n}; rc=$?; cd / && rm -rf %s; exit $rc')
    :format(dir, helper.checkout_copy(path), dir, command, dir)
end

-- Runs the `run` program with a string of (already quoted) arguments, as from the checkout
-- (helper.in_checkout_copy).
function helper.run(args, opts)
  return helper.sh(helper.in_checkout_copy(helper.shell_quote(helper.RUN) .. ' ' .. args), opts)
end

function helper.tmpdir()
  local path = os.tmpname()
  os.remove(path)
  assert(os.execute('mkdir -p ' .. helper.shell_quote(path)) == 0)
  return path
end

function helper.rmtree(path)
  os.execute('rm -rf ' .. helper.shell_quote(path))
end

function helper.lines(text)
  local lines = {}
  for line in text:gmatch('[^\n]+') do lines[#lines + 1] = line end
  return lines
end

return helper
