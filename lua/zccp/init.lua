-- Start-up hooks: init_by_lua (settings + ABI) and init_worker_by_lua (map the
-- arena early, and re-check every second that the engine behind it is the same).
local settings = require "zccp.settings"
local abi = require "zccp.abi"

local ngx = ngx
local ipairs = ipairs

local _M = { _VERSION = "0.1.0" }

local REFRESH_S = 1
local PRELOAD = { "zccp.fingerprint", "zccp.handler", "zccp.relay", "zccp.arena", "zccp.slots",
                  "zccp.doorbell", "zccp.health", "zccp.metrics", "zccp.errors" }

function _M.init(opts)
    settings.set(opts)
    abi.init(opts.abi_header)
    -- Compile the operator's mask patterns now: a broken one is logged by name and
    -- the last good set stays in force (see zccp.masks).
    require("zccp.masks").init({ path = opts.mask_patterns, last_good_path = opts.mask_last_good })
    -- Every module the workers run, loaded here in the master: workers inherit them, and
    -- never need to read the Lua files after dropping to an unprivileged user.
    for _, name in ipairs(PRELOAD) do
        require(name)
    end
end

function _M.init_worker()
    local arena = require "zccp.arena"
    local a = arena.acquire()
    if a then
        a:release()
    end
    local ok, err = ngx.timer.every(REFRESH_S, function(premature)
        if not premature then
            arena.refresh()
        end
    end)
    if not ok then
        ngx.log(ngx.ERR, "zccp: cannot start the arena refresh timer: ", err)
    end
end

return _M
