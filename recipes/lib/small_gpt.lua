-- lib/small_gpt.lua: a GPT small enough to train on a CPU in minutes, and the optimizer settings
-- that train it; shared by recipes/tiny.lua and recipes/mix.lua.
return {
  model = { layers = 2, heads = 4, dim = 64 },
  optim = { lr = 3e-3, betas = { 0.9, 0.95 }, weight_decay = 0.1, clip = 1.0, schedule = 'cosine', warmup = 30 },
}
