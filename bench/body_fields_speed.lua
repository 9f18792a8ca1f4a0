-- bench/body_fields_speed.lua: zccp.plugins.limits.body_fields.read on large bodies of one text
-- shape, in LuaJIT alone (bench/engine_stages.md, round 12). One shape per process (the
-- traces of one shape would shape the next's). OLD: another version's file to set beside
-- it, e.g. the byte-by-byte one:
--
--   git show a9400e1:lua/zccp/plugins/limits/body_fields.lua > /tmp/bf_old.lua
--   for s in prose code dense json plain; do luajit bench/body_fields_speed.lua $s /tmp/bf_old.lua; done
package.path = "lua/?.lua;" .. package.path
local SHAPES = {   -- a chat message's text, repeated; 64 messages
    prose = { "some ordinary words of a sentence, and then some more of them to fill a line\\n", 80 },
    code = { "a line of code();\\n", 300 },
    dense = { "short\\n", 600 },                          -- an escape every 7 bytes
    json = { '{\\"a\\": 1, \\"b\\": [2, 3]}', 300 },      -- JSON inside a string
    plain = { "plain text without any escape at all, long lines of it.", 120 },
}
local shape = SHAPES[arg[1] or "prose"] or error("shapes: prose code dense json plain")
local msgs = {}
for i = 1, 64 do
    msgs[i] = '{"role": "user", "content": "' .. shape[1]:rep(shape[2]) .. '"}'
end
local body = '{"model": "m", "max_tokens": 100, "messages": [' .. table.concat(msgs, ", ") .. ']}'
local impls = { { "now", require("zccp.plugins.limits.body_fields") } }
if arg[2] then
    impls[2] = { arg[2], dofile(arg[2]) }
end
for _, impl in ipairs(impls) do
    local read = impl[2].read
    for _ = 1, 20 do
        read(body)
    end
    local t = os.clock()
    for _ = 1, 200 do
        assert(read(body) == true)
    end
    print(("%-6s %-24s %7d bytes  %6.0f µs per read"):format(arg[1] or "prose", impl[1], #body,
                                                               (os.clock() - t) / 200 * 1e6))
end
