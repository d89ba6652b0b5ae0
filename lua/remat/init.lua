-- The remat module: loads the library's parts into the table luaopen_remat made.
local remat = package.loaded.remat
require "remat.tensor"
require "remat.autograd"
require "remat.io"
require "remat.data"
require "remat.nn"
require "remat.layers"
require "remat.optim"
require "remat.schedule"
require "remat.policy"
require "remat.checkpoint"
require "remat.dist"
require "remat.train"
require "remat.metrics"
require "remat.fit"

-- A method called with a dot (x.f() for x:f()) or on another kind of object raises an
-- error naming the method, instead of one from inside the library.
local fail = remat._fail
local function guard(class, what, is_instance)
  local names = {}
  for name, f in pairs(class) do
    if type(name) == "string" and type(f) == "function" and not name:find("^_") then names[#names + 1] = name end
  end
  for _, name in ipairs(names) do
    local f = class[name]
    class[name] = function(self, ...)
      if not is_instance(self) then
        fail(("%s: expected %s as self (call it with a colon: x:%s(...)), got %s"):format(
          name, what, name, type(self) == "userdata" and "another object" or type(self)))
      end
      return f(self, ...)
    end
  end
end
local function has_mt(mt) return function(v) return getmetatable(v) == mt end end
guard(remat.Tensor, "a tensor", remat.is_tensor)
guard(remat.nn.Module, "a module", remat.nn.is_module)
guard(remat.optim.Optimizer, "an optimizer", has_mt(remat.optim.Optimizer))
guard(remat.data.Dataset, "a dataset", has_mt(remat.data.Dataset))
guard(remat.data.Text, "a text dataset", has_mt(remat.data.Text))
guard(remat.train.Stepper, "a stepper", has_mt(remat.train.Stepper))
guard(remat.train.Metrics, "a metrics log", has_mt(remat.train.Metrics))
return remat
