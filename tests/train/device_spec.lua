-- Which device a rank trains on (wick.device.choose) and how a recipe's model.device and data.device
-- follow each other (wick.train.model.devices): pure functions of the rank's place on its machine and
-- the CUDA devices there, so every case runs without a GPU. The runs themselves: tests/host/user_errors_spec.lua.
local device = require 'wick.device'
local model = require 'wick.train.model'

local function recipe(model_device, data_device)
  return { model = { device = model_device }, data = { device = data_device } }
end

describe('wick.device.choose', function()
  it("'auto' is this rank's GPU, cuda:LOCAL_RANK, when every rank of the machine has one, else the CPU", function()
    assert.are.equal('cpu', device.choose('auto', 0, 1, 0))
    assert.are.equal('cpu', device.choose('auto', 3, 8, 0))
    assert.are.equal('cuda:0', device.choose('auto', 0, 1, 1))
    assert.are.equal('cuda:3', device.choose('auto', 3, 8, 8))
    assert.are.equal('cuda:1', device.choose('auto', 1, 2, 8)) -- fewer ranks than GPUs: the first ones
    -- more ranks than GPUs: refused on every rank alike, the one that has a GPU too
    for rank = 0, 3 do
      local chosen, why = device.choose('auto', rank, 4, 2)
      assert.is_nil(chosen)
      assert.are.equal('4 ranks on this machine, 2 CUDA devices: one GPU a rank (--nproc-per-node 2), or the CPU', why)
    end
  end)

  it("'cuda' is this rank's GPU and is refused where there is none; 'cuda:N' is that GPU for every rank", function()
    assert.are.equal('cuda:5', device.choose('cuda', 5, 8, 8))
    local chosen, why = device.choose('cuda', 0, 1, 0)
    assert.is_nil(chosen)
    assert.matches('^this machine has no usable CUDA device %(', why)
    assert.are.equal('cuda:1', device.choose('cuda:1', 0, 4, 2))
    assert.are.equal('cuda:1', device.choose('cuda:1', 3, 4, 2))
    chosen, why = device.choose('cuda:2', 0, 1, 2)
    assert.is_nil(chosen)
    assert.are.equal('this machine has 2 CUDA devices (cuda:0 to cuda:1)', why)
    assert.matches('no usable CUDA device', select(2, device.choose('cuda:0', 0, 1, 0)), 1, true)
    assert.are.equal('cpu', device.choose('cpu', 7, 8, 8))
  end)

  it('names the devices a recipe may name, and says what it chose in one phrase for the machine', function()
    for _, name in ipairs({ 'auto', 'cpu', 'cuda', 'cuda:0', 'cuda:12' }) do assert.is_true((device.check_name(name))) end
    for _, name in ipairs({ 'gpu', 'cuda:', 'cuda:-1', 'CPU', 'cuda:1x', 3 }) do
      local ok, why = device.check_name(name)
      assert.is_false(ok, tostring(name))
      assert.are.equal("must be 'auto', 'cpu', 'cuda' or 'cuda:N'", why)
    end
    assert.are.equal('cpu (auto: no CUDA device)', device.describe('auto', 'cpu', 4))
    assert.are.equal('cuda:0', device.describe('auto', 'cuda:0', 1))
    assert.are.equal('cuda:0 to cuda:7, one a rank', device.describe('auto', 'cuda:0', 8))
    assert.are.equal('cuda:0 to cuda:1, one a rank', device.describe('cuda', 'cuda:0', 2))
    assert.are.equal('cuda:1', device.describe('cuda:1', 'cuda:1', 8))
    assert.are.equal('cpu', device.describe('cpu', 'cpu', 8))
  end)
end)

describe('wick.train.model.devices', function()
  it('follows model.device and data.device each other when only one is set; auto when neither is', function()
    assert.are.same({ model = 'cpu', data = 'cpu', text = 'cpu (auto: no CUDA device)' }, model.devices(recipe(), 0, 1, 0))
    assert.are.same({ model = 'cuda:1', data = 'cuda:1', text = 'cuda:0 to cuda:1, one a rank' },
      model.devices(recipe(), 1, 2, 2))
    assert.are.same({ model = 'cpu', data = 'cpu', text = 'cpu' }, model.devices(recipe(nil, 'cpu'), 0, 1, 8))
    assert.are.same({ model = 'cuda:0', data = 'cuda:0', text = 'cuda:0' }, model.devices(recipe('cuda'), 0, 1, 1))
    assert.are.same({ model = 'cuda:0', data = 'cpu', text = 'cuda:0, batches on cpu' },
      model.devices(recipe('auto', 'cpu'), 0, 1, 1))
  end)

  it('refuses a device the machine lacks, naming the field that asked for it', function()
    local function why(r, rank, ranks, count) return select(2, model.devices(r, rank, ranks, count)) end
    assert.matches("^model.device 'cuda:0': this machine has no usable CUDA device", why(recipe('cuda:0'), 0, 1, 0))
    assert.matches("^data.device 'cuda': this machine has no usable CUDA device", why(recipe(nil, 'cuda'), 0, 1, 0))
    assert.matches("^data.device 'cuda:3': this machine has 2 CUDA devices", why(recipe('cpu', 'cuda:3'), 0, 1, 2))
    assert.are.equal("model.device 'auto' (the default): 4 ranks on this machine, 2 CUDA devices: one GPU a rank " ..
      '(--nproc-per-node 2), or the CPU', why(recipe(), 0, 4, 2))
  end)
end)
