-- Spec cases for the optimizer steps (see spec/ops_spec.lua for the contract). They run
-- in place through rm_op_into in the library; here C.op runs them with fresh outputs,
-- which tests the same kernel math. References follow torch.optim.SGD / Adam / AdamW.
local remat = require "remat"
local kit = require "support.kit"
local C = remat._C

-- adamw_step takes the weight decay as the IEEE-754 bits of a double in i[2].

-- torch.optim.SGD on flat tables; returns new param and buffer.
local function ref_sgd(p, g, buf, o, first)
  local np, nb = {}, {}
  for i = 1, #p do
    local d = g[i] + o.wd * p[i]
    local b = buf[i]
    if o.momentum ~= 0 then
      b = first and d or o.momentum * buf[i] + (1 - o.dampening) * d
      d = o.nesterov and d + o.momentum * b or b
    end
    np[i], nb[i] = p[i] - o.lr * d, b
  end
  return np, nb
end

-- torch.optim.Adam (decoupled = false) / AdamW (decoupled = true), step t.
local function ref_adam(p, g, m, v, o, t)
  local np, nm, nv = {}, {}, {}
  local w = 1 - o.beta1
  local bc1, bc2 = 1 - o.beta1 ^ t, 1 - o.beta2 ^ t
  for i = 1, #p do
    local pi, gi = p[i], g[i]
    if o.decoupled then pi = pi * (1 - o.lr * o.wd) else gi = gi + o.wd * pi end
    local mi = w < 0.5 and m[i] + w * (gi - m[i]) or gi - (gi - m[i]) * (1 - w)
    local vi = v[i] * o.beta2 + (1 - o.beta2) * gi * gi
    local denom = math.sqrt(vi) / math.sqrt(bc2) + o.eps
    np[i], nm[i], nv[i] = pi - o.lr / bc1 * (mi / denom), mi, vi
  end
  return np, nm, nv
end

-- torch.optim.RMSprop on flat tables; returns new param, square_avg, buf and grad_avg.
local function ref_rmsprop(p, g, sq, buf, ga, o)
  local np, ns, nb, na = {}, {}, {}, {}
  for i = 1, #p do
    local gi = g[i] + o.wd * p[i]
    local s = sq[i] * o.alpha + (1 - o.alpha) * gi * gi
    local a, avg = ga[i], nil
    if o.centered then
      a = a + (1 - o.alpha) * (gi - a)
      avg = math.sqrt(s - a * a) + o.eps
    else
      avg = math.sqrt(s) + o.eps
    end
    local b = buf[i]
    if o.momentum ~= 0 then
      b = b * o.momentum + gi / avg
      np[i] = p[i] - o.lr * b
    else
      np[i] = p[i] - o.lr * (gi / avg)
    end
    ns[i], nb[i], na[i] = s, b, a
  end
  return np, ns, nb, na
end

local raises = kit.raises

return function(K)
  local function op(name, attrs, ...) return C.op(C.ops[name], attrs, ...) end
  local function sgd_attrs(o, first)
    return { lr = o.lr, momentum = o.momentum, weight_decay = o.wd, dampening = o.dampening,
             nesterov = o.nesterov and true or false, first = first and true or false }
  end
  local function adam_attrs(o, t)
    return { lr = o.lr, beta1 = o.beta1, beta2 = o.beta2, eps = o.eps, step = t,
             decoupled = o.decoupled and true or false, weight_decay = o.wd }
  end

  -- Runs `steps` SGD steps from random state, checking every step against the
  -- reference applied to the values the previous step actually produced.
  local function run_sgd(o, shape, steps)
    local p, pv = K.rand(shape)
    local buf, bv = K.rand(shape)
    for s = 1, steps do
      local g, gv = K.rand(shape)
      local ep, eb = ref_sgd(pv, gv, bv, o, s == 1)
      p, buf = op("sgd_step", sgd_attrs(o, s == 1), p, g, buf)
      K.check(p, ep, shape, nil, "param after step " .. s)
      K.check(buf, eb, shape, nil, "buffer after step " .. s)
      pv, bv = C.flat(p), C.flat(buf)
    end
  end

  local function run_adam(o, shape, steps)
    local p, pv = K.rand(shape)
    local m, v = K.tensor(kit.values(shape, 0, 0), shape), K.tensor(kit.values(shape, 0, 0), shape)
    local mv, vv = C.flat(m), C.flat(v)
    for t = 1, steps do
      local g, gv = K.rand(shape)
      local ep, em, ev = ref_adam(pv, gv, mv, vv, o, t)
      p, m, v = op("adamw_step", adam_attrs(o, t), p, g, m, v)
      K.check(p, ep, shape, nil, "param after step " .. t)
      K.check(m, em, shape, nil, "m after step " .. t)
      K.check(v, ev, shape, nil, "v after step " .. t)
      pv, mv, vv = C.flat(p), C.flat(m), C.flat(v)
    end
  end

  local function rmsprop_attrs(o)
    return { lr = o.lr, alpha = o.alpha, eps = o.eps, momentum = o.momentum, weight_decay = o.wd,
             centered = o.centered and true or false }
  end

  -- A state after some steps: square_avg large enough that square_avg - grad_avg^2
  -- stays positive (as it does from zeros), grad_avg small.
  local function run_rmsprop(o, shape, steps)
    local p, pv = K.rand(shape)
    local sv = {}
    for i, x in ipairs(kit.values(shape, 1, 0)) do sv[i] = 3 + x * x end
    local sq = K.tensor(sv, shape)
    local b, bv = K.rand(shape)
    local av = kit.values(shape, -0.3, 0.3)
    local a = K.tensor(av, shape)
    for s = 1, steps do
      local g, gv = K.rand(shape)
      local ep, es, eb, ea = ref_rmsprop(pv, gv, sv, bv, av, o)
      p, sq, b, a = op("rmsprop_step", rmsprop_attrs(o), p, g, sq, b, a)
      K.check(p, ep, shape, nil, "param after step " .. s)
      K.check(sq, es, shape, nil, "square_avg after step " .. s)
      K.check(b, eb, shape, nil, "buffer after step " .. s)
      K.check(a, ea, shape, nil, "grad_avg after step " .. s)
      pv, sv, bv, av = C.flat(p), C.flat(sq), C.flat(b), C.flat(a)
    end
  end

  local plain = { lr = 0.1, momentum = 0, wd = 0, dampening = 0, nesterov = false }
  local adamw = { lr = 0.05, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, wd = 0.01, decoupled = true }

  return {
    sgd_step = {
      nodiff = "optimizer update: runs in place, outside autograd",
      forward = {
        ["plain SGD leaves the buffer alone"] = function()
          local p, pv = K.rand({ 3, 5 })
          local g, gv = K.rand({ 3, 5 })
          local b, bv = K.rand({ 3, 5 })
          local np, nb = op("sgd_step", sgd_attrs(plain, true), p, g, b)
          local e = {}
          for i = 1, #pv do e[i] = pv[i] - 0.1 * gv[i] end
          K.check(np, e, { 3, 5 })
          K.check(nb, bv, { 3, 5 })
        end,
        ["momentum, dampening and weight decay over 4 steps"] = function()
          run_sgd({ lr = 0.05, momentum = 0.9, wd = 0.01, dampening = 0.1, nesterov = false }, { 7, 3 }, 4)
        end,
        ["nesterov over 3 steps"] = function()
          run_sgd({ lr = 0.2, momentum = 0.8, wd = 0.001, dampening = 0, nesterov = true }, { 11 }, 3)
        end,
        ["weight decay without momentum; empty and 0-d params"] = function()
          run_sgd({ lr = 0.3, momentum = 0, wd = 0.5, dampening = 0, nesterov = false }, { 2, 1, 3 }, 2)
          run_sgd({ lr = 0.3, momentum = 0.5, wd = 0, dampening = 0, nesterov = false }, { 0, 4 }, 2)
          run_sgd({ lr = 0.3, momentum = 0.5, wd = 0, dampening = 0, nesterov = false }, {}, 2)
        end,
        ["non-contiguous grad"] = function()
          local p, pv = K.rand({ 4, 3 })
          local g, gv = K.noncontig({ 4, 3 })
          local b, bv = K.rand({ 4, 3 })
          local o = { lr = 0.1, momentum = 0.9, wd = 0, dampening = 0, nesterov = false }
          local ep, eb = ref_sgd(pv, gv, bv, o, false)
          local np, nb = op("sgd_step", sgd_attrs(o, false), p, g, b)
          K.check(np, ep, { 4, 3 })
          K.check(nb, eb, { 4, 3 })
        end,
        ["errors"] = function()
          local p, g, b = K.rand({ 2, 2 }), K.rand({ 2, 2 }), K.rand({ 2, 2 })
          raises("sgd_step: nesterov momentum requires a momentum and zero dampening", op, "sgd_step",
                 { lr = 0.1, momentum = 0.9, weight_decay = 0, dampening = 0.1, nesterov = true, first = false }, p, g, b)
          raises("sgd_step: nesterov", op, "sgd_step", { lr = 0.1, momentum = 0, weight_decay = 0, dampening = 0, nesterov = true, first = false }, p, g, b)
          raises("sgd_step: invalid learning rate -1", op, "sgd_step", { lr = -1 }, p, g, b)
          raises("sgd_step: grad is 4 but param is 2x2", op, "sgd_step", { lr = 0.1 }, p, (K.rand({ 4 })), b)
        end,
      },
    },

    rmsprop_step = {
      nodiff = "optimizer update: runs in place, outside autograd",
      forward = {
        ["plain over 3 steps leaves the unused states alone"] = function()
          run_rmsprop({ lr = 0.01, alpha = 0.99, eps = 1e-8, momentum = 0, wd = 0, centered = false }, { 4, 3 }, 3)
        end,
        ["momentum and weight decay over 3 steps"] = function()
          run_rmsprop({ lr = 0.02, alpha = 0.9, eps = 1e-6, momentum = 0.9, wd = 0.1, centered = false }, { 7 }, 3)
        end,
        ["centered, with momentum, over 3 steps"] = function()
          run_rmsprop({ lr = 0.01, alpha = 0.8, eps = 1e-4, momentum = 0.5, wd = 0, centered = true }, { 2, 5 }, 3)
        end,
        ["centered without momentum; empty and 0-d params"] = function()
          local o = { lr = 0.01, alpha = 0.3, eps = 1e-3, momentum = 0, wd = 0.01, centered = true }
          run_rmsprop(o, { 3 }, 2)
          run_rmsprop(o, { 0, 2 }, 2)
          run_rmsprop(o, {}, 2)
        end,
        ["errors"] = function()
          local t = {}
          for i = 1, 5 do t[i] = K.rand({ 2 }) end
          local function at(f, wd, centered)
            return { lr = f[1], alpha = f[2], eps = f[3], momentum = f[4], weight_decay = wd, centered = centered }
          end
          raises("rmsprop_step: invalid alpha 1.5", op, "rmsprop_step", at({ 0.1, 1.5, 1e-8, 0 }, 0, false), table.unpack(t))
          raises("rmsprop_step: invalid momentum -1", op, "rmsprop_step", at({ 0.1, 0.9, 1e-8, -1 }, 0, false), table.unpack(t))
          raises("rmsprop_step: invalid weight_decay -0.5", op, "rmsprop_step",
                 at({ 0.1, 0.9, 1e-8, 0 }, -0.5, false), table.unpack(t))
          raises("rmsprop_step: attribute 'centered' must be a boolean, got number", op, "rmsprop_step",
                 at({ 0.1, 0.9, 1e-8, 0 }, 0, 2), table.unpack(t))
          t[5] = K.rand({ 3 })
          raises("rmsprop_step: state 3 is 3 but param is 2", op, "rmsprop_step", at({ 0.1, 0.9, 1e-8, 0 }, 0, false),
                 table.unpack(t))
        end,
      },
    },

    adamw_multi_step = {
      nodiff = "optimizer update: runs in place on its inputs, outside autograd",
      forward = {
        ["equals adamw_step on each tensor, bit for bit (odd sizes, empty, 0-d; AdamW and Adam; 3 steps)"] = function()
          for _, o in ipairs({ adamw, { lr = 0.01, beta1 = 0.3, beta2 = 0.99, eps = 1e-6, wd = 0.1, decoupled = false } }) do
            local shapes = { { 5, 3 }, { 1 }, { 7 }, { 0, 2 }, {}, { 33, 31 } }
            local one, multi = {}, {}
            for k, s in ipairs(shapes) do
              local p = K.rand(s)
              one[k] = { p = p, m = K.tensor(kit.values(s, 0, 0), s), v = K.tensor(kit.values(s, 0, 0), s), s = s }
              multi[k] = { p = op("copy", nil, p), m = op("copy", nil, one[k].m), v = op("copy", nil, one[k].v) }
            end
            for t = 1, 3 do
              local ins = {}
              for k, s in ipairs(shapes) do
                local g = K.rand(s)
                local e = one[k]
                local pv, gv, mv, vv = C.flat(K.device == "cpu" and e.p or C.to_device(e.p, "cpu")),
                  C.flat(K.device == "cpu" and g or C.to_device(g, "cpu")),
                  C.flat(K.device == "cpu" and e.m or C.to_device(e.m, "cpu")),
                  C.flat(K.device == "cpu" and e.v or C.to_device(e.v, "cpu"))
                e.ep = ref_adam(pv, gv, mv, vv, o, t)
                e.p, e.m, e.v = op("adamw_step", adam_attrs(o, t), e.p, g, e.m, e.v)
                for _, x in ipairs({ multi[k].p, g, multi[k].m, multi[k].v }) do ins[#ins + 1] = x end
              end
              C.op_into(C.ops.adamw_multi_step, adam_attrs(o, t), ins, {})
              for k, s in ipairs(shapes) do
                local function flat(x) return C.flat(K.device == "cpu" and x or C.to_device(x, "cpu")) end
                K.check(multi[k].p, flat(one[k].p), s, 0, "param " .. k .. " after step " .. t)
                K.check(multi[k].m, flat(one[k].m), s, 0, "m " .. k .. " after step " .. t)
                K.check(multi[k].v, flat(one[k].v), s, 0, "v " .. k .. " after step " .. t)
                K.check(multi[k].p, one[k].ep, s, nil, "param " .. k .. " against the reference")
              end
            end
          end
        end,
        ["64 tensors in one call (the most), large ones split over many blocks"] = function()
          local ins, ref = {}, {}
          for k = 1, 64 do
            local s = { k == 1 and 20000 or k }
            local p, g = K.rand(s), K.rand(s)
            local m, v = K.rand(s, 0, 1), K.rand(s, 0, 1)
            ref[k] = { op("adamw_step", adam_attrs(adamw, 2), p, g, m, v) }
            for _, x in ipairs({ p, g, m, v }) do ins[#ins + 1] = x end
          end
          C.op_into(C.ops.adamw_multi_step, adam_attrs(adamw, 2), ins, {})
          local function flat(x) return C.flat(K.device == "cpu" and x or C.to_device(x, "cpu")) end
          for k = 1, 64 do
            for j, i in ipairs({ 1, 3, 4 }) do
              K.check(ins[4 * (k - 1) + i], flat(ref[k][j]), nil, 0, ("tensor %d, input %d"):format(k, i))
            end
          end
        end,
        ["errors: groups of 4, shapes, one dtype pair, contiguous, not through op()"] = function()
          local p, g, m, v = K.rand({ 2 }), K.rand({ 2 }), K.rand({ 2 }), K.rand({ 2 })
          local at = adam_attrs(adamw, 1)
          raises("adamw_multi_step takes its inputs in groups of 4 (got 3)", C.op_into, C.ops.adamw_multi_step, at,
                 { p, g, m }, {})
          raises("adamw_multi_step: adamw_step: state 2 is 3 but param is 2", C.op_into, C.ops.adamw_multi_step, at,
                 { p, g, m, v, p, g, m, (K.rand({ 3 })) }, {})
          raises("adamw_multi_step writes 0 outputs (got 1)", C.op_into, C.ops.adamw_multi_step, at, { p, g, m, v }, { p })
          raises("writes into its inputs: run it with op_into", op, "adamw_multi_step", at, p, g, m, v)
          raises("input 5 is not contiguous", C.op_into, C.ops.adamw_multi_step, at,
                 { p, g, m, v, (K.noncontig({ 2, 3 })), (K.rand({ 2, 3 })), (K.rand({ 2, 3 })), (K.rand({ 2, 3 })) }, {})
          if K.device == "cpu" then
            local d = C.from_table({ 1, 2 }, { 2 }, K.dtype == "float32" and "float64" or "float32")
            raises("one call takes one device and one pair of dtypes", C.op_into, C.ops.adamw_multi_step, at,
                   { p, g, m, v, d, d, d, d }, {})
          end
        end,
      },
    },

    adamw_step = {
      nodiff = "optimizer update: runs in place, outside autograd",
      forward = {
        ["AdamW over 4 steps"] = function() run_adam(adamw, { 5, 3 }, 4) end,
        ["Adam with L2 weight decay over 3 steps"] = function()
          run_adam({ lr = 0.01, beta1 = 0.8, beta2 = 0.99, eps = 1e-6, wd = 0.1, decoupled = false }, { 9 }, 3)
        end,
        ["beta1 below 0.5 (lerp from the other end), no decay"] = function()
          run_adam({ lr = 0.1, beta1 = 0.3, beta2 = 0.5, eps = 1e-3, wd = 0, decoupled = true }, { 2, 2 }, 3)
        end,
        ["empty, 0-d and non-contiguous params"] = function()
          run_adam(adamw, { 0, 3 }, 2)
          run_adam(adamw, {}, 2)
          local p, pv = K.noncontig({ 3, 2 })
          local g, gv = K.rand({ 3, 2 })
          local z = kit.values({ 3, 2 }, 0, 0)
          local ep = ref_adam(pv, gv, z, z, adamw, 1)
          K.check((op("adamw_step", adam_attrs(adamw, 1), p, g, K.tensor(z, { 3, 2 }), K.tensor(z, { 3, 2 }))), ep, { 3, 2 })
        end,
        ["first step moves each weight by lr against the gradient's sign"] = function()
          local o = { lr = 0.01, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, wd = 0, decoupled = true }
          local p = K.tensor({ 1, 1, 1 }, { 3 })
          local g = K.tensor({ 0.5, -2, 1e-3 }, { 3 })
          local z = K.tensor({ 0, 0, 0 }, { 3 })
          local np = op("adamw_step", adam_attrs(o, 1), p, g, z, z)
          K.check(np, { 0.99, 1.01, 1 - 0.01 * 1e-3 / (1e-3 + 1e-8) }, { 3 }, 1e-6)
        end,
        ["errors"] = function()
          local p, g = K.rand({ 2 }), K.rand({ 2 })
          local m, v = K.rand({ 2 }), K.rand({ 2 })
          local function at(f, step, decoupled, wd)
            return { lr = f[1], beta1 = f[2], beta2 = f[3], eps = f[4], step = step, decoupled = decoupled, weight_decay = wd }
          end
          raises("adamw_step: step 0 must be >= 1", op, "adamw_step", at({ 0.1, 0.9, 0.999, 1e-8 }, 0, true, 0), p, g, m, v)
          raises("adamw_step: invalid beta1 1", op, "adamw_step", at({ 0.1, 1, 0.999, 1e-8 }, 1, true, 0), p, g, m, v)
          raises("adamw_step: invalid beta2 -0.5", op, "adamw_step", at({ 0.1, 0.9, -0.5, 1e-8 }, 1, true, 0), p, g, m, v)
          raises("adamw_step: invalid weight_decay -0.5", op, "adamw_step",
                 at({ 0.1, 0.9, 0.999, 1e-8 }, 1, true, -0.5), p, g, m, v)
          raises("adamw_step: attribute 'decoupled' must be a boolean, got number", op, "adamw_step",
                 at({ 0.1, 0.9, 0.999, 1e-8 }, 1, 2, 0), p, g, m, v)
          raises("adamw_step: attribute 'step' must be an integer, got a non-integer number", op, "adamw_step",
                 at({ 0.1, 0.9, 0.999, 1e-8 }, 1.5, true, 0), p, g, m, v)
          raises("adamw_step: unknown attribute 'betas' (adamw_step takes lr, beta1, beta2, eps, weight_decay, step, decoupled)",
                 op, "adamw_step", { lr = 0.1, betas = { 0.9, 0.999 } }, p, g, m, v)
          raises("adamw_step: state 2 is 3 but param is 2", op, "adamw_step", at({ 0.1, 0.9, 0.999, 1e-8 }, 1, true, 0),
                 p, g, m, (K.rand({ 3 })))
        end,
      },
    },
  }
end
