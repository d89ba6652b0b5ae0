-- busted output handler: the plain terminal report, then one closing line
-- "N passed, N failed" (errors count as failures; pending tests are reported as skipped).
return function(options)
  local busted = require "busted"
  local handler = require "busted.outputHandlers.plainTerminal"(options)
  busted.subscribe({ "suite", "end" }, function()
    local failed = handler.failuresCount + handler.errorsCount
    io.write(("%d passed, %d failed, %d skipped\n"):format(handler.successesCount, failed,
      handler.pendingsCount))
    io.flush()
    return nil, true
  end)
  return handler
end
