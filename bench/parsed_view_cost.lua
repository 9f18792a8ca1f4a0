-- The shared parsed request's cost (bench/plugins.md): per request, two plugins that read
-- the prompt's text, each decoding the body itself (before r:prompt_text existed) or both
-- through r's shared view (zccp.core.request_view: one decode, one walk). LuaJIT alone.
--   luajit bench/parsed_view_cost.lua [N]
local dir = arg[0]:match("^(.*)/bench/") or "."
package.path = dir .. "/lua/?.lua;" .. package.path
local cjson = require "cjson.safe"
local MT = require("zccp.core.request_view").MT
local N = tonumber(arg[1]) or 200000

local msgs = {}
for i = 1, 6 do
    msgs[i] = { role = i % 2 == 1 and "user" or "assistant", content = string.rep("word ", 30) .. i }
end
local body = cjson.encode({ model = "m", max_tokens = 64, system = "be brief", messages = msgs })

-- What a plugin did by itself: decode, then walk the shape it knows.
local function own_text(b)
    local doc = cjson.decode(b)
    local out = { doc.system }
    for i = 1, #doc.messages do
        out[#out + 1] = doc.messages[i].content
    end
    return table.concat(out, "\n")
end

local function bench(f)
    for _ = 1, N / 10 do f() end
    local t0 = os.clock()
    for _ = 1, N do f() end
    return (os.clock() - t0) / N * 1e6
end

print(string.format("body %d bytes, %d requests per round", #body, N))
for round = 1, 5 do
    local each = bench(function() own_text(body); own_text(body) end)
    local shared = bench(function()
        local r = setmetatable({ body = body }, MT)
        r:prompt_text()
        r:prompt_text()
    end)
    local one = bench(function() own_text(body) end)
    print(string.format("round %d: two plugins decoding each %.2f us, sharing r:prompt_text() %.2f us "
        .. "(one plugin decoding alone %.2f us)", round, each, shared, one))
end
