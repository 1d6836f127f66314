-- S3 datasets against a real S3-compatible server: moto's server mode (tests/helpers/s3_server.py, from the
-- pinned test venv of third_party/test-venv.sh), which checks every request's SigV4 signature against an
-- access key made through its IAM. Reading s3://bucket/prefix gives exactly the local samples; a wrong
-- secret is refused at once, naming the bucket.
local helper = require 'helper'
local data_helper = require 'helpers.data'
local core = require 'wick.core'
local q = helper.shell_quote

local PYTHON = helper.TEST_PYTHON
local BUCKET = 'wick-test-data'
local INSPECT = '-m wick.data.inspect --seq-len 64 --global-batch 8 --pool-tokens 4096 --window-tokens 40000'
local READY_POLLS = 600 -- x 50 ms: moto takes a few seconds to import and start

if helper.sh('test -x ' .. q(PYTHON)).rc ~= 0 then
  describe('S3 datasets', function()
    pending('need the test venv with moto (make deps runs third_party/test-venv.sh; it needs PyPI)')
  end)
  return
end

describe('an S3 dataset', function()
  local root, pid, server
  setup(function()
    root = helper.tmpdir()
    assert(os.execute('mkdir -p ' .. q(root .. '/upload/corpus')) == 0)
    data_helper.make_dataset(root .. '/upload/corpus/web', data_helper.documents(1200, 60, 5),
      { shard_size = 20000, block_size = 512, compression = 'zstd' })
    -- converter inputs: two text files and a hidden one (skipped, as in a directory)
    assert(os.execute('mkdir -p ' .. q(root .. '/upload/inputs/sub')) == 0)
    helper.write_file(root .. '/upload/inputs/a.txt', data_helper.documents(1, 4000, 3)[1])
    helper.write_file(root .. '/upload/inputs/sub/b.txt', data_helper.documents(1, 4000, 4)[1])
    helper.write_file(root .. '/upload/inputs/.hidden.txt', 'not an input')
    local r = helper.sh(('%s %s/tests/helpers/s3_server.py %s %s %s > %s/server.log 2>&1 & echo $!'):format(q(PYTHON),
      q(helper.ROOT), q(root .. '/ready'), BUCKET, q(root .. '/upload'), q(root)))
    pid = tonumber(r.out:match('%d+'))
    for _ = 1, READY_POLLS do
      local text = helper.read_file(root .. '/ready')
      if text ~= '' then
        server = {
          port = tonumber(text:match('"port": (%d+)')), key = text:match('"key": "([^"]+)"'),
          secret = text:match('"secret": "([^"]+)"'),
        }
        break
      end
      helper.sh('sleep 0.05')
    end
    assert(server, 'moto did not start: ' .. helper.read_file(root .. '/server.log'))
  end)
  teardown(function()
    if pid then helper.sh(('kill %d; sleep 0.1; kill -9 %d 2>/dev/null'):format(pid, pid)) end
    helper.rmtree(root)
  end)

  local function env(cache, secret)
    return ('AWS_ACCESS_KEY_ID=%s AWS_SECRET_ACCESS_KEY=%s AWS_ENDPOINT_URL=http://127.0.0.1:%d AWS_REGION=us-east-1 '
      .. 'WICK_CACHE_DIR=%s'):format(q(server.key), q(secret or server.secret), server.port, q(cache))
  end

  it('gives every rank exactly the samples of the local copy, every request signed', function()
    local cache = helper.tmpdir()
    for rank = 0, 1 do
      local args = ('--world 2 --rank %d --steps 5'):format(rank)
      local here = helper.run(('%s --data %s %s'):format(INSPECT, q(root .. '/upload/corpus/web'), args))
      local there = helper.sh(('%s %s %s --data s3://%s/corpus/web %s'):format(env(cache), q(helper.RUN), INSPECT,
        BUCKET, args))
      assert.are.equal(0, there.rc, there.err)
      assert.are.equal(here.out, there.out)
    end
    helper.rmtree(cache)
  end)

  it('is refused at once with a wrong secret, naming the bucket and what S3 said', function()
    local cache = helper.tmpdir()
    local started = core.now()
    local r = helper.sh(('%s %s %s --data s3://%s/corpus/web'):format(env(cache, 'not' .. server.secret),
      q(helper.RUN), INSPECT, BUCKET))
    assert.are_not.equal(0, r.rc)
    assert.matches(('s3://%s/corpus/web/index.json'):format(BUCKET), r.err, 1, true)
    assert.matches('HTTP 403 (SignatureDoesNotMatch)', r.err, 1, true)
    assert.matches('access denied by the bucket', r.err, 1, true)
    assert.matches('attempt 1', r.err, 1, true)
    assert.is_true(core.now() - started < 5)
    helper.rmtree(cache)
  end)

  it('names a missing key with its s3:// location and 404', function()
    local cache = helper.tmpdir()
    local r = helper.sh(('%s %s %s --data s3://%s/corpus/nothing'):format(env(cache), q(helper.RUN), INSPECT, BUCKET))
    assert.are_not.equal(0, r.rc)
    assert.matches(('s3://%s/corpus/nothing/index.json'):format(BUCKET), r.err, 1, true)
    assert.matches('HTTP 404', r.err, 1, true)
    helper.rmtree(cache)
  end)

  it("runs docs/data.md's s3:// command as written", function()
    local docs = require 'helpers.docs'
    local cache = helper.tmpdir()
    local ran = 0
    for _, line in ipairs(docs.commands('docs/data.md', 'Remote datasets')) do
      if line:find('s3://', 1, true) then
        line = docs.substitute(line, { ['./run'] = q(helper.RUN),
                                         ['https://minio.example.org'] = 'http://127.0.0.1:' .. server.port,
                                         ['s3://team-bucket/web'] = ('s3://%s/corpus/web'):format(BUCKET) })
        local r = helper.sh(env(cache) .. ' ' .. line)
        assert.are.equal(0, r.rc, line .. '\n' .. r.out .. r.err)
        assert.matches('^step=0 ', r.out)
        ran = ran + 1
      end
    end
    assert.are.equal(1, ran)
    helper.rmtree(cache)
  end)

  it('converts every object under an s3:// prefix, as the same files in a directory', function()
    local cache = helper.tmpdir()
    local here = helper.run(('-m wick.data.convert %s -o %s -q'):format(q(root .. '/upload/inputs'), q(root .. '/conv-local')))
    assert.are.equal(0, here.rc, here.err)
    local there = helper.sh(('%s %s -m wick.data.convert s3://%s/inputs/ -o %s -q'):format(env(cache), q(helper.RUN), BUCKET,
      q(root .. '/conv-s3')))
    assert.are.equal(0, there.rc, there.err)
    local shard = '/shard-00000.wks'
    assert.are.equal(helper.read_file(root .. '/conv-local' .. shard), helper.read_file(root .. '/conv-s3' .. shard))
    local empty = helper.sh(('%s %s -m wick.data.convert s3://%s/nothing/ -o %s -q'):format(env(cache), q(helper.RUN), BUCKET,
      q(root .. '/conv-none')))
    assert.are_not.equal(0, empty.rc)
    assert.matches(('s3://%s/nothing/'):format(BUCKET) .. "': no objects under this prefix", empty.err, 1, true)
    helper.rmtree(cache)
  end)

  it('refuses bad AWS variables by name', function()
    local cache = helper.tmpdir()
    for _, case in ipairs {
      { 'AWS_REGION=Not_A_Region', 'AWS_REGION' },
      { 'AWS_SECRET_ACCESS_KEY=', 'AWS_SECRET_ACCESS_KEY' },
      { 'AWS_ENDPOINT_URL=ftp://127.0.0.1', 'AWS_ENDPOINT_URL' },
    } do
      local r = helper.sh(('%s %s %s %s --data s3://%s/corpus/web'):format(env(cache), case[1], q(helper.RUN),
        INSPECT, BUCKET))
      assert.are_not.equal(0, r.rc)
      assert.matches('environment variable ' .. case[2], r.err, 1, true)
    end
    helper.rmtree(cache)
  end)
end)
