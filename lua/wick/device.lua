-- wick.device: which device a rank of a run works on. A recipe names it as 'auto' (this rank's GPU,
-- cuda:LOCAL_RANK, when every rank of the machine has one, else the CPU), 'cpu', 'cuda' (this rank's
-- GPU, which must be there) or 'cuda:N' (that GPU, whatever the rank); device.choose turns the name
-- into the device itself from the rank's place on its machine and the CUDA devices the process sees,
-- as a pure function, so the trainer and the dry run decide alike and a test needs no GPU. It builds
-- nothing: wick.tensor's devices are 'cpu' and 'cuda:N'.
--
--   local device = require 'wick.device'
--   local chosen, why = device.choose('auto', dist.local_rank, dist.local_world_size, device.count())
--   -- 'cuda:3' on a rank of LOCAL_RANK 3 of 8 with 8 GPUs; 'cpu' without one; nil, why for 'cuda' on a CPU
local device = {}

device.NAMES = "'auto', 'cpu', 'cuda' or 'cuda:N'"

-- Why a process sees no CUDA device (wick.tensor's cuda_module: WICK_LOG=info says which).
local NO_DEVICE = 'this machine has no usable CUDA device (no GPU, no driver, WICK_CUDA=0, or a libwick built ' ..
  'without CUDA; WICK_LOG=info says which)'

-- Whether `name` is a device a recipe may name; as a wick.schema check (true, or false and why).
function device.check_name(name)
  local ok = name == 'auto' or name == 'cpu' or name == 'cuda' or (type(name) == 'string' and name:match('^cuda:%d+$') ~= nil)
  return ok, 'must be ' .. device.NAMES
end

-- The CUDA devices this process can use (0 without the backend, a driver or a GPU).
function device.count()
  return tonumber(require('wick.core').C.wk_cuda_device_count())
end

-- The device of local rank `local_rank` of `local_world` ranks on a machine with `count` CUDA devices,
-- for the name `name` (device.check_name's): 'cpu' or 'cuda:N', or nil and why not. Every rank of the
-- machine gets the same verdict: 'auto' and 'cuda' give each rank its own GPU or refuse for all.
function device.choose(name, local_rank, local_world, count)
  if name == 'cpu' then return 'cpu' end
  if name == 'auto' and count == 0 then return 'cpu' end
  if count == 0 then return nil, NO_DEVICE end
  local index = tonumber(name:match('^cuda:(%d+)$'))
  if index then
    if index >= count then
      return nil, ('this machine has %d CUDA device%s (cuda:0 to cuda:%d)'):format(count, count == 1 and '' or 's', count - 1)
    end
    return name
  end
  if local_world > count then
    return nil, ('%d ranks on this machine, %d CUDA device%s: one GPU a rank (--nproc-per-node %d), or the CPU'):format(
      local_world, count, count == 1 and '' or 's', count)
  end
  return 'cuda:' .. local_rank
end

-- How a run says what it chose, once for every rank of the machine: 'cpu (auto: no CUDA device)',
-- 'cuda:0', 'cuda:0 to cuda:7, one a rank'.
function device.describe(name, chosen, local_world)
  if name == 'auto' and chosen == 'cpu' then return 'cpu (auto: no CUDA device)' end
  if chosen ~= 'cpu' and local_world > 1 and (name == 'auto' or name == 'cuda') then
    return ('cuda:0 to cuda:%d, one a rank'):format(local_world - 1)
  end
  return chosen
end

return device
