-- bench/string_hash.lua: what a table keyed by long strings costs when the strings agree
-- where LuaJIT hashes them (bench/engine_stages.md, round 12). LuaJIT (OpenResty's
-- luajit2 as Debian packages it) hashes a long string from a few of its bytes, so
-- strings of one length that differ only elsewhere share one hash chain: interning a new
-- copy (what ngx.shared.DICT:get and ngx.req.get_body_data make) and looking it up walk
-- that chain. Shapes: nginx's L1 entries as zccp.plugins.l1.cache kept them before round 12 (one
-- answer to many prompts: only the born time and counts differ), the same led by the tag
-- zccp.plugins.l1.cache now puts first (8 hex digits of those numbers), and bench.keys' 2000 bodies.
--
--   luajit bench/string_hash.lua [N_LIVE] [LOOKUPS]
local bit = require "bit"
local N = tonumber(arg and arg[1]) or 2000
local LOOKUPS = tonumber(arg and arg[2]) or 20000

local TPL = '{"id":"\1","type":"message","role":"assistant","model":"zccp-null","content":[{"type":"text",'
    .. '"text":"' .. ("Hello from the null model. "):rep(12) .. '"}],"stop_reason":"end_turn",'
    .. '"usage":{"input_tokens":250,"output_tokens":64}}'
local FILLER = "The quick brown fox jumps over the lazy dog. "

local shapes = {
    { "L1 entries, untagged (before)", function(i)
        return "J" .. (1764998000 + i % 900) .. "," .. (250 + math.floor(i / 900)) .. ",64:" .. TPL
    end },
    { "L1 entries, tagged (zccp.plugins.l1.cache now)", function(i)
        local born, pin = 1764998000 + i % 900, 250 + math.floor(i / 900)
        local tag = string.reverse(bit.tohex(bit.bxor(born, bit.rol(pin, 11), bit.rol(64, 21))))   -- zccp.plugins.l1.cache's tag_of
        return tag .. "J" .. born .. "," .. pin .. ",64:" .. TPL
    end },
    { "bench.keys bodies (one template, one length)", function(i)
        local head = '{"model":"zccp-tiny","max_tokens":16,"temperature":0,"messages":[{"role":"user","content":"'
        return head .. ("#" .. i .. " " .. FILLER:rep(40)):sub(1, 1020 - #head) .. '"}]}'
    end },
}

print(("%d live strings, %d lookups each"):format(N, LOOKUPS))
print("| strings | length | µs per copy interned and looked up |")
print("|---|---|---|")
for _, shape in ipairs(shapes) do
    local live, by = {}, {}
    for i = 1, N do
        live[i] = shape[2](i)
        by[live[i]] = i
    end
    local cut = math.floor(#live[1] / 2)
    local t0, sum = os.clock(), 0
    for k = 1, LOOKUPS do
        local s = live[k % N + 1]
        local copy = s:sub(1, cut) .. s:sub(cut + 1)   -- a new string of the same bytes: found interned
        sum = sum + by[copy]
    end
    print(("| %s | %d | %.2f |"):format(shape[1], #live[1], (os.clock() - t0) / LOOKUPS * 1e6))
    assert(sum > 0)
end
