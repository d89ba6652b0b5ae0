-- Specs that need something a machine may lack (Open MPI, luarocks, lua5.1): pending
-- with the reason, except where REMAT_REQUIRE names it (CI sets "mpi,luarocks,lua5.1"),
-- where the lack is a failure: CI must run these specs, not skip them.
local need = {}

function need.required(what)
  return ("," .. (os.getenv("REMAT_REQUIRE") or "") .. ","):find("," .. what .. ",", 1, true) ~= nil
end

-- Inside a describe block: when why is nil (nothing lacks) returns true; otherwise adds
-- a pending spec (or, when required, a failing one) and returns false.
function need.check(what, why)
  if not why then return true end
  local msg = what .. " specs skipped: " .. why
  if need.required(what) then
    it(msg, function() error("REMAT_REQUIRE names " .. what .. ", but " .. why, 0) end)
  else
    pending(msg)
  end
  return false
end

return need
