-- The rate-limit headers of an admitted request, in each API's own names (zccp.plugins.limits.headers:
-- the key's limits and what its leases have used). A 429 carries them whatever the chain (the
-- refusal is the limits plugin's); leaving this plugin out of plugins.chain drops them from admitted
-- answers only. After limits in the chain, before anything that answers (l1).
local set_headers = require("zccp.plugins.limits.headers").set

local _M = { name = "ratelimit_headers", after = { "limits" } }

-- As limits: a key is needed, so not in the chain with auth.mode off.
function _M._active()
    return require("zccp.settings").keys_on()
end

function _M.prepare(r)
    local t = r.admitted   -- set by plugins/limits when it reserved something
    if t then
        set_headers(t.api, t.w, t.at)
    end
end

return _M
