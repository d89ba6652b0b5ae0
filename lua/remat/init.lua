-- The remat module: loads the library's parts into the table luaopen_remat made.
local remat = package.loaded.remat
require "remat.tensor"
require "remat.autograd"
require "remat.nn"
return remat
