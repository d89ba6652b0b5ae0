-- The remat module: loads the library's parts into the table luaopen_remat made.
local remat = package.loaded.remat
require "remat.tensor"
require "remat.autograd"
require "remat.io"
require "remat.data"
require "remat.nn"
require "remat.layers"
require "remat.optim"
require "remat.policy"
require "remat.checkpoint"
require "remat.dist"
require "remat.train"
return remat
