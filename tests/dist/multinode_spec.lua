-- Multi-node for real: two hosts made as network namespaces joined by a veth pair (iproute2), two
-- ranks in each, launched with `run --nnodes 2 --node-rank R --master-addr A`. The ranks of the
-- second host reach the store and their peers only through the veth link. Every node is given the
-- job's secret (WICK_STORE_SECRET, or WICK_STORE_SECRET_FILE), as a multi-node launch must be; a
-- stranger on the second host tries the store without it. Needs root (CI runs as root); elsewhere
-- the test says why it cannot run. docs/multinode.md's commands run here too: its two `--nnodes` lines, one
-- per host, and its SLURM script, run as sbatch runs it, with an srun that starts 2 tasks on each host.
local helper = require 'helper'
local docs = require 'helpers.docs'
local stranger = require 'helpers.stranger'
local q = helper.shell_quote

local SECRET = 'a multi-node job secret, given to every node alike'

local PREFIX_LENGTH = 24

describe('multi-node', function()
  -- Unique per run: names and subnet from our pid, so parallel runs on one machine do not collide.
  local pid = tonumber(helper.read_file('/proc/self/stat'):match('^(%d+)'))
  local tag = 'wk' .. pid % 100000
  local hosts = { tag .. 'a', tag .. 'b' }
  local subnet = ('10.231.%d.'):format(pid % 250)
  local address = { subnet .. '1', subnet .. '2' }
  local ready, why = false, nil

  local function ip(args) return helper.sh('ip ' .. args) end

  local function remove_hosts()
    for _, host in ipairs(hosts) do ip('netns del ' .. host .. ' 2>/dev/null') end
  end

  setup(function()
    remove_hosts()
    local steps = {
      'netns add ' .. hosts[1], 'netns add ' .. hosts[2],
      ('link add %sv type veth peer name %sv'):format(hosts[1], hosts[2]),
    }
    for i, host in ipairs(hosts) do
      steps[#steps + 1] = ('link set %sv netns %s'):format(host, host)
      steps[#steps + 1] = ('-n %s addr add %s/%d dev %sv'):format(host, address[i], PREFIX_LENGTH, host)
      steps[#steps + 1] = ('-n %s link set %sv up'):format(host, host)
      steps[#steps + 1] = ('-n %s link set lo up'):format(host)
    end
    for _, step in ipairs(steps) do
      local r = ip(step)
      if r.rc ~= 0 then
        why = ('`ip %s` failed (%s): making network namespaces needs root or CAP_SYS_ADMIN and iproute2'):format(step,
          (r.err:gsub('\n', ' ')))
        remove_hosts()
        return
      end
    end
    ready = true
  end)
  teardown(remove_hosts)

  it('runs 2 nodes x 2 ranks over a veth link: collectives exact, store and Gloo across hosts', function()
    if not ready then
      pending(why)
      return
    end
    local function received(i)
      local r = helper.sh(('ip netns exec %s cat /sys/class/net/%sv/statistics/rx_bytes'):format(hosts[i], hosts[i]))
      return tonumber(r.out) or 0
    end
    local before = received(2)
    local node = 'ip netns exec %s env WICK_STORE_SECRET=' .. q(SECRET) .. ' timeout 120 %s --nnodes 2 --node-rank %d '
      .. '--nproc-per-node 2 --master-addr %s tests/fixtures/dist/collectives.lua > %s 2>&1'
    local dir = helper.tmpdir()
    local script = ('cd %s && (%s; echo $? > %s/rc1) & %s; echo $? > %s/rc0; wait'):format(q(helper.ROOT),
      node:format(hosts[2], q(helper.RUN), 1, address[1], q(dir .. '/out1')), q(dir),
      node:format(hosts[1], q(helper.RUN), 0, address[1], q(dir .. '/out0')), q(dir))
    helper.sh('bash -c ' .. q(script))
    local outputs = { helper.read_file(dir .. '/out0'), helper.read_file(dir .. '/out1') }
    local codes = { helper.read_file(dir .. '/rc0'), helper.read_file(dir .. '/rc1') }
    helper.rmtree(dir)
    for n = 1, 2 do
      assert.are.equal('0', codes[n]:match('%d+'), 'node ' .. (n - 1) .. ':\n' .. outputs[n])
    end
    for rank = 0, 3 do
      local out = outputs[rank < 2 and 1 or 2]
      assert.matches('%[rank' .. rank .. '%] checked %d+', out)
    end
    -- The second host received its share of the all-reduces through the veth link.
    assert.is_true(received(2) - before > 8 * 2 ^ 20, 'bytes over the veth link: ' .. (received(2) - before))
    assert.is_nil(outputs[1]:find('unauthenticated', 1, true), outputs[1])
  end)

  -- The stranger fixture on 2 nodes x 2 ranks; secrets[n] is the env of node n's launcher.
  local function start_job(secrets)
    local launchers = {}
    for n = 1, 2 do
      launchers[n] = function(args)
        return ('ip netns exec %s env -u WICK_STORE_SECRET -u WICK_STORE_SECRET_FILE %s timeout 120 %s --nnodes 2 '
          .. '--node-rank %d --nproc-per-node 2 --master-addr %s tests/fixtures/dist/stranger.lua %s'):format(hosts[n],
          secrets[n], q(helper.RUN), n - 1, address[1], args)
      end
    end
    return stranger.start_job(launchers)
  end

  -- Every socket of node n's ranks is on that host's veth address.
  local function check_addresses(job, n)
    local addresses, listeners = stranger.addresses(job.out)
    assert.is_true(#addresses >= 2 * 4, job.out) -- each rank's store connection and 3 Gloo pairs
    for _, a in ipairs(addresses) do assert.are.equal(address[n], a:match('^(.*):%d+$'), job.out) end
    return listeners
  end

  it('serves no stranger on another host: each attempt refused and logged, no key set, job exact', function()
    if not ready then
      pending(why)
      return
    end
    local dir = helper.tmpdir()
    local file = helper.write_file(dir .. '/secret', SECRET .. '\n')
    assert.are.equal(0, helper.sh('chmod 600 ' .. q(file)).rc)
    local ready_job, finish = start_job { 'WICK_STORE_SECRET=' .. q(SECRET), 'WICK_STORE_SECRET_FILE=' .. q(file) }
    local addr, port = ready_job()
    local attempt = helper.sh(('ip netns exec %s %s'):format(hosts[2], stranger.command(addr, port, 4)))
    local jobs = finish()
    helper.rmtree(dir)
    assert.are.equal(0, attempt.rc, attempt.err)
    for n = 1, 2 do
      assert.are.equal(0, jobs[n].rc, jobs[n].out .. jobs[n].err)
      local _, exact = jobs[n].out:gsub('key absent, sum 10, sockets on', '')
      assert.are.equal(2, exact, jobs[n].out)
    end
    assert.are.equal(1, check_addresses(jobs[1], 1)) -- the store, on the master's address only
    assert.are.equal(0, check_addresses(jobs[2], 2))
    local _, refused = jobs[1].err:gsub('store server: refused the connection from ' .. address[2]:gsub('%.', '%%.')
      .. ':%d+: ', '')
    assert.are.equal(stranger.ATTEMPTS, refused, jobs[1].err)
  end)

  it('without a secret warns once that the store is unauthenticated, and still listens on one address', function()
    if not ready then
      pending(why)
      return
    end
    local ready_job, finish = start_job { '', '' }
    ready_job()
    local jobs = finish()
    for n = 1, 2 do assert.are.equal(0, jobs[n].rc, jobs[n].out .. jobs[n].err) end
    local _, warnings = (jobs[1].err .. jobs[2].err):gsub('is unauthenticated', '')
    assert.are.equal(1, warnings, jobs[1].err .. jobs[2].err)
    assert.are.equal(1, check_addresses(jobs[1], 1))
  end)
  -- A fresh copy of the checkout holding tiny.lua's data, converted once before the job: the ranks of
  -- both hosts share this machine's disk, as a cluster's nodes share a file system.
  local function tree_with_data()
    local tree = docs.fresh_copy()
    local planned = helper.sh(('cd %s && ./run --dry-run recipes/tiny.lua'):format(q(tree)))
    assert.are.equal(0, planned.rc, planned.out .. planned.err)
    return tree
  end

  local function received(i)
    local r = helper.sh(('ip netns exec %s cat /sys/class/net/%sv/statistics/rx_bytes'):format(hosts[i], hosts[i]))
    return tonumber(r.out) or 0
  end

  it("runs docs/multinode.md's --nnodes lines, one per host, with the job's secret file", function()
    if not ready then
      pending(why)
      return
    end
    local tree = tree_with_data()
    local secret = helper.write_file(tree .. '/secret', SECRET .. '\n')
    assert.are.equal(0, helper.sh('chmod 600 ' .. q(secret)).rc)
    local lines = docs.commands('docs/multinode.md', 'On each host')
    assert.are.equal(2, #lines)
    local started = {}
    for n, line in ipairs(lines) do
      line = docs.substitute(line, { ['10.0.0.1'] = address[1] })
      started[n] = ('(ip netns exec %s env WICK_STORE_SECRET_FILE=%s timeout 120 %s --steps=3 --log.sample=0 > %s/out%d 2>&1; '
        .. 'echo $? > %s/rc%d)'):format(hosts[n], q(secret), line, q(tree), n, q(tree), n)
    end
    local before = received(2)
    helper.sh(('cd %s || exit 1; %s & %s; wait'):format(q(tree), started[2], started[1]))
    for n = 1, 2 do
      assert.are.equal('0', helper.read_file(('%s/rc%d'):format(tree, n)):match('%d+'), helper.read_file(('%s/out%d'):format(tree, n)))
    end
    local out = helper.read_file(tree .. '/out1')
    helper.rmtree(tree)
    assert.matches('[rank0] recipes/tiny.lua: 4 ranks', out, 1, true)
    assert.matches('step 3/3', out, 1, true)
    assert.is_nil(out:find('unauthenticated', 1, true), out)
    assert.is_true(received(2) > before, 'nothing crossed the veth link')
  end)

  -- srun as SLURM starts a job step on the job's 2 nodes: 2 tasks on each host, each with the variables
  -- srun sets (its own options are taken and ignored).
  local SRUN = [=[#!/bin/bash
while [[ $1 == -* ]]; do shift; done
pids=()
node=0
for host in %s %s; do
  for local_id in 0 1; do
    rank=$((node * 2 + local_id))
    ip netns exec "$host" env SLURM_PROCID=$rank SLURM_NTASKS=4 SLURM_LOCALID=$local_id SLURM_NODEID=$node \
      SLURM_TASKS_PER_NODE='2(x2)' SLURM_STEP_ID=0 "$@" > %s/task$rank 2>&1 &
    pids+=($!)
  done
  node=$((node + 1))
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
exit $rc
]=]

  it('runs recipes/slurm/train.sbatch as sbatch would, its srun starting 2 tasks on each of 2 hosts', function()
    if not ready then
      pending(why)
      return
    end
    local tree = tree_with_data()
    local bin = tree .. '/slurm-bin'
    assert(os.execute('mkdir -p ' .. q(bin)) == 0)
    helper.write_file(bin .. '/srun', SRUN:format(hosts[1], hosts[2], tree))
    assert.are.equal(0, helper.sh('chmod +x ' .. q(bin .. '/srun')).rc)
    local before = received(2)
    -- What sbatch gives the batch script: the job's id and node list; the script runs on the first node.
    local r = helper.sh(('cd %s && env -u WICK_STORE_SECRET -u WICK_STORE_SECRET_FILE PATH=%s:"$PATH" SLURM_JOB_ID=%d '
      .. 'SLURM_JOB_NODELIST=%s RECIPE=recipes/tiny.lua timeout 120 bash recipes/slurm/train.sbatch --steps=3 --batch.micro=4 '
      .. '--log.sample=0')
      :format(q(tree), q(bin), pid, q(address[1] .. ',' .. address[2])))
    local tasks = {}
    for rank = 0, 3 do tasks[rank] = helper.read_file(('%s/task%d'):format(tree, rank)) end
    helper.rmtree(tree)
    assert.are.equal(0, r.rc, r.out .. r.err .. tasks[0] .. tasks[2])
    assert.matches('recipes/tiny.lua: 4 ranks', tasks[0], 1, true)
    assert.matches('step 3/3', tasks[0], 1, true)
    -- the script made the job's secret: no rank ran unauthenticated
    for rank = 0, 3 do assert.is_nil(tasks[rank]:find('unauthenticated', 1, true), tasks[rank]) end
    assert.is_true(received(2) > before, 'nothing crossed the veth link')
  end)
end)
