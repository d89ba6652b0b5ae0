-- The tensor API: factories, methods and operators over the C op call.
local remat = package.loaded.remat
local C = remat._C
local mt = C.Tensor_mt
local Tensor = {}
remat.Tensor = Tensor

local function op(name, attrs, ...) return C.op(name, attrs, ...) end
remat._op = op

-- Shape from varargs or a table: randn(2, 3) or randn({2, 3}).
local function shape_of(...)
  local first = ...
  if type(first) == "table" then return first end
  return { ... }
end

function remat.full(shape, value, dtype, device) return C.full(shape, value, dtype, device) end
function remat.zeros(...) return C.full(shape_of(...), 0) end
function remat.ones(...) return C.full(shape_of(...), 1) end

function Tensor:shape() local s = C.info(self) return s end
function Tensor:dim() return #(C.info(self)) end
function Tensor:numel() local n = 1 for _, d in ipairs(C.info(self)) do n = n * d end return n end
function Tensor:dtype() local _, dt = C.info(self) return dt end
function Tensor:device() local _, _, dev = C.info(self) return dev end
function Tensor:item() return C.item(self) end
function Tensor:free() C.free(self) end

function Tensor:matmul(other) return op("matmul", nil, self, other) end

mt.__index = Tensor
mt.__add = function(a, b) return op("add", nil, a, b) end
mt.__tostring = function(t)
  local s = C.info(t)
  return string.format("[remat.FloatTensor of size %s]", table.concat(s, "x"))
end

return Tensor
