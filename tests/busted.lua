-- Runs the busted suite inside `run`, so specs exercise the real host and the real libwick.
--   ./run tests/busted.lua [busted options] [spec files]
require 'busted.runner'({ standalone = false })
