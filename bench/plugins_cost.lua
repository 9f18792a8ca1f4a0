-- A do-nothing plugin's per-request cost in zccp.core.pipeline.run (bench/plugins.md):
-- LuaJIT alone, with a stub ngx (the runner touches ngx only when a plugin raises).
--   luajit bench/plugins_cost.lua [N]
local dir = arg[0]:match("^(.*)/bench/") or "."
package.path = dir .. "/lua/?.lua;" .. package.path
local stub = setmetatable({}, { __index = function() return function() end end })
ngx = setmetatable({ ERR = 4, WARN = 5, shared = {}, header = {}, var = {}, socket = { tcp = stub },
                     worker = stub, timer = stub, config = stub }, { __index = stub })   -- luacheck: ignore
local p = require "zccp.core.pipeline"
local N = tonumber(arg[1]) or 5000000
local noop = dir .. "/bench/plugins_noop"
local function per_call(chain)
    p.init({ chain = chain, dir = noop })
    local r, run = {}, p.run
    for _ = 1, 100000 do run("prepare", r) end
    local t0 = os.clock()
    for _ = 1, N do run("prepare", r) end
    return (os.clock() - t0) / N * 1e9
end
for round = 1, 5 do
    local e, one, three = per_call({}), per_call({ "noop" }), per_call({ "noop", "noop2", "noop3" })
    print(string.format("round %d: empty phase %.1f ns, 1 do-nothing plugin %.1f ns (+%.1f), 3: %.1f ns (+%.1f each)",
        round, e, one, one - e, three, (three - e) / 3))
end
