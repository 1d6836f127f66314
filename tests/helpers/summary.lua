-- busted output handler: the usual terminal report, then one plain line that CI reads:
--   "N passed, N failed, N skipped"   (failed counts failures and errors)
return function(options)
  local busted = require 'busted'
  local style = os.getenv('CI') and 'plainTerminal' or 'utfTerminal'
  local handler = require('busted.outputHandlers.' .. style)(options)

  busted.subscribe({ 'suite', 'end' }, function()
    local failed = handler.failuresCount + handler.errorsCount
    io.write(string.format('%d passed, %d failed, %d skipped\n', handler.successesCount, failed,
      handler.pendingsCount))
    io.flush()
    return nil, true
  end)

  return handler
end
