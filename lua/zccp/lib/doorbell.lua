-- The doorbell client: fixed-size frames over a pooled unix-socket cosocket.
-- Cosockets yield to the worker's event loop; they never block it.
local ffi = require "ffi"
local abi = require "zccp.lib.abi"
local settings = require "zccp.settings"
local engines = require "zccp.lib.engines"

local ngx_socket_tcp = ngx.socket.tcp
local ffi_string = ffi.string
local ffi_cast = ffi.cast
local ffi_new = ffi.new
local setmetatable = setmetatable

local _M = { _VERSION = "0.1.0" }
local mt = { __index = _M }

local ring_buf

local MAX_DOORBELLS = 64    -- server.engine_processes' bound; more in the control page is not an engine's
local turn = 0

local function connect(s, path)
    local sock = ngx_socket_tcp()
    sock:settimeouts(s.connect_timeout_ms, s.connect_timeout_ms, s.request_timeout_ms)
    local ok, err = sock:connect("unix:" .. path, { pool = "zccp:" .. path, pool_size = s.pool_size })
    return ok and sock, err
end

-- Connect to engine e's doorbell (nil: the first engine), or reuse a pooled connection;
-- nil, err within connect_timeout_ms. With arena a, whose engine runs n processes
-- (its control page's doorbell_count), each process's own doorbell in turn: a pool takes
-- its newest connection first, so one shared socket would keep one process's connections
-- busy and leave the others' idle. One that does not answer (a prep process restarting):
-- the shared socket, which every process accepts on.
function _M.open(e, a)
    local s = settings.get()
    local path = (e or engines.list()[1]).socket_path
    local n = a and a.control.doorbell_count or 0
    local sock, err
    if n > 1 and n <= MAX_DOORBELLS then
        turn = turn + 1
        sock = connect(s, path .. ".p" .. turn % n)
    end
    if not sock then
        sock, err = connect(s, path)
    end
    if not sock then
        if err == "timeout" then
            return nil, "engine not answering (doorbell connect timed out)"
        end
        return nil, "engine not running (doorbell " .. path .. ": " .. err .. ")"
    end
    local conn = setmetatable({ sock = sock }, mt)
    return conn
end

local function frame(op, slot, generation)
    if not ring_buf then
        ring_buf = ffi_new(abi.ring_t)
    end
    ring_buf.op = op
    ring_buf.slot = slot
    ring_buf.generation = generation
    local s = ffi_string(ring_buf, abi.C.ZCCP_RING_SIZE)
    return s
end

function _M.ring(self, slot, generation)
    return self.sock:send(frame(abi.C.ZCCP_OP_RING, slot, generation))
end

function _M.ping(self)
    return self.sock:send(frame(abi.C.ZCCP_OP_PING, 0, 0))
end

function _M.set_read_timeout(self, ms)
    self.sock:settimeouts(nil, nil, ms)
end

-- Next notice as a cdata pointer (valid until the next call) plus its backing
-- string; nil, err on timeout ("timeout" keeps the socket usable) or close.
function _M.read_notice(self)
    local data, err = self.sock:receive(abi.C.ZCCP_NOTICE_SIZE)
    if not data then
        return nil, err
    end
    return ffi_cast(abi.notice_ptr_t, data), data
end

-- Back to the pool: only after a final notice, so no stray frame is left behind.
function _M.keep(self)
    self.sock:setkeepalive(60000, settings.get().pool_size)
end

-- Closing makes the engine cancel whatever was rung on this connection.
function _M.close(self)
    self.sock:close()
end

return _M
