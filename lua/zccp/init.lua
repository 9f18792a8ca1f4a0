-- Start-up hooks: init_by_lua (settings + ABI) and init_worker_by_lua (map the
-- arena early, and re-check every second that the engine behind it is the same;
-- worker 0 also frees the slot claims of workers that died).
local settings = require "zccp.settings"
local abi = require "zccp.lib.abi"

local ngx = ngx
local ipairs = ipairs

local _M = { _VERSION = "0.1.0" }

local REFRESH_S = 1

function _M.init(opts)
    -- `zccp-stack reload`'s check (zccp.ops.nginx_check): this nginx is a throwaway one that
    -- only reports what it would refuse, and ends before it opens a listener
    local check_dir = os.getenv("ZCCP_CHECK_DIR")
    if check_dir then
        require("zccp.check").run_rendered(opts, check_dir)
        os.exit(0)
    end
    settings.set(opts)
    abi.init(opts.abi_header)
    -- Compile the operator's mask patterns now: a broken one is logged by name and
    -- the last good set stays in force (see zccp.fp.mask_store).
    require("zccp.fp.mask_store").init({ path = opts.mask_patterns, last_good_path = opts.mask_last_good })
    require("zccp.fp.mask_apply")   -- zccp.fp.fingerprint requires it lazily: load it here (below)
    require("zccp.fp.fingerprint")
    -- Load the request-time modules here too, in the master (root under a distribution's
    -- nginx): the workers inherit them, so a worker user (www-data) needs no read access
    -- to the Lua files, only to the arena and the socket (docs/existing-nginx.md).
    -- The plugin chain (config.yaml plugins:): an operator plugin that fails to load is
    -- logged with its file and line, and its last good copy stays (zccp.core.pipeline).
    -- A plugin that does not load with no good copy in force stops nginx here (a reload
    -- under HUP keeps going with it refusing its requests: zccp.core.pipeline).
    require("zccp.core.pipeline").init(opts.plugins)
    require("zccp.handler")
    -- L1 outlives a reload (the dict is kept): the masks or cache.scope may have changed.
    -- Through the l1 plugin's hook: without l1 in the chain, nothing touches L1.
    local purge_l1 = require("zccp.core.pipeline").hooks.purge_l1
    if purge_l1 then
        purge_l1()
    end
    require("zccp.admin.health")
    require("zccp.admin.keys")
    require("zccp.lib.metrics")
    require("zccp.admin.metrics_page")   -- required lazily by lib.metrics (a cycle): loaded here,
                                         -- where the master can read it (an operator's workers may not)
end

-- A dead worker's claims (zccp.lib.slots): claims never expire by time, so this is how
-- a crashed worker's slots come back.
local function reap_claims(premature)
    if premature then
        return
    end
    local n = require("zccp.lib.slots").reap()
    if n > 0 then
        ngx.log(ngx.WARN, "zccp: freed ", n, " slot claim(s) of nginx workers that are gone")
    end
end

function _M.init_worker()
    local arena = require "zccp.lib.arena"
    for _, e in ipairs(require("zccp.lib.engines").list()) do
        local a = arena.acquire(e)
        if a then
            a:release()
        end
    end
    local ok, err = ngx.timer.every(REFRESH_S, function(premature)
        if not premature then
            arena.refresh_all()
        end
    end)
    if not ok then
        ngx.log(ngx.ERR, "zccp: cannot start the arena refresh timer: ", err)
    end
    if ngx.worker.id() == 0 then
        ok, err = ngx.timer.every(REFRESH_S, reap_claims)
        if not ok then
            ngx.log(ngx.ERR, "zccp: cannot start the slot reaper timer: ", err)
        end
    end
end

-- exit_worker_by_lua: a worker that exits (reload, shutdown) hands back the claims its
-- ended requests left, at once, instead of leaving them to the reaper.
function _M.exit_worker()
    local n = require("zccp.lib.slots").release_mine()
    if n > 0 then
        ngx.log(ngx.WARN, "zccp: exiting worker freed ", n, " slot claim(s)")
    end
end

return _M
