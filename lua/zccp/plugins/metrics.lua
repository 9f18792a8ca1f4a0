-- Request metrics (zccp.lib.metrics): one count per answer, in the log phase.
local metrics = require "zccp.lib.metrics"

local _M = { name = "metrics" }

function _M.log(r)
    local api = r.log_api
    if api then   -- nil: the models location, counted by its limits only
        metrics.log(api)
    end
end

return _M
