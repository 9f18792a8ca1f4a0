-- Whether the client of the current request has gone, asked while a request waits for
-- its engine (zccp.core.relay). ngx.on_abort alone misses some: lua-nginx-module watches the
-- client only while its read handler is installed, and nginx replaces it with
-- ngx_http_block_reading when a body read finishes in one go after a wait (HTTP/1.1
-- headers and body in two packets, HTTP/2 DATA that arrived before ngx.req.read_body);
-- from then on a close or an RST_STREAM goes unseen until something is written, which a
-- non-streamed answer does only at its end. So watch() puts the module's handler back
-- once the body is read (on Linux's epoll the read event stays registered), and the relay
-- also asks, every poll, for a close that came before that:
--   HTTP/2: the module's own check (ngx_http_lua_check_broken_connection), which reads the
--           stream's error flag nginx sets on RST_STREAM, GOAWAY and a closed connection;
--   HTTP/1.x: poll(2) on the connection's socket for POLLRDHUP (a peer that shut down
--           its side, TLS close_notify or not: a MSG_PEEK would see the alert's bytes).
-- The request and connection are read through the first fields of nginx's structs,
-- which have not moved since nginx 0.x (signature, connection, ctx, main_conf, srv_conf,
-- loc_conf, read_event_handler; data, read, write, fd),
-- and only after the request's signature is checked: an unknown layout answers false.
local ffi = require "ffi"
local band = require("bit").band
local get_request = require("resty.core.base").get_request

local C = ffi.C
local ffi_cast = ffi.cast
local http_version = ngx.req.http_version

local _M = { _VERSION = "0.1.0" }

ffi.cdef [[
typedef struct { uint32_t signature; void *connection; void **ctx, **main_conf, **srv_conf, **loc_conf;
                 void *read_event_handler; } zccp_ngx_request_head_t;
typedef struct { void *data; void *read; void *write; int fd; } zccp_ngx_connection_head_t;
struct zccp_pollfd { int fd; short events; short revents; };
int poll(struct zccp_pollfd *fds, unsigned long nfds, int timeout);
intptr_t ngx_http_lua_check_broken_connection(void *r, void *ev);
void ngx_http_block_reading(void *r);
void ngx_http_lua_rd_check_broken_connection(void *r);
]]

local NGX_HTTP_MODULE = 0x50545448   -- "HTTP": the first field of every ngx_http_request_t
local POLLERR, POLLHUP, POLLNVAL, POLLRDHUP = 0x8, 0x10, 0x20, 0x2000
local GONE = POLLERR + POLLHUP + POLLNVAL + POLLRDHUP
local req_ptr_t = ffi.typeof("zccp_ngx_request_head_t *")
local conn_ptr_t = ffi.typeof("zccp_ngx_connection_head_t *")
local pfd = ffi.new("struct zccp_pollfd[1]")

local BLOCK_READING = ffi_cast("void *", C.ngx_http_block_reading)
local CHECK_BROKEN = ffi_cast("void *", C.ngx_http_lua_rd_check_broken_connection)

-- Puts the Lua module's watch back where nginx left ngx_http_block_reading after the body
-- (lua_check_client_abort's handler, which wakes ngx.on_abort): a client that leaves from
-- now on is seen at once. Any other handler is left alone; a close that came before is
-- for gone() to find (an edge-triggered event is not delivered twice).
function _M.watch()
    local r = get_request()
    if r == nil then
        return
    end
    local req = ffi_cast(req_ptr_t, r)
    if req.signature == NGX_HTTP_MODULE and req.read_event_handler == BLOCK_READING then
        req.read_event_handler = CHECK_BROKEN
    end
end

function _M.gone()
    local r = get_request()
    if r == nil then
        return false
    end
    local req = ffi_cast(req_ptr_t, r)
    if req.signature ~= NGX_HTTP_MODULE or req.connection == nil then
        return false
    end
    local c = ffi_cast(conn_ptr_t, req.connection)
    local v = http_version()
    if v and v >= 2 then
        return C.ngx_http_lua_check_broken_connection(r, c.read) ~= 0
    end
    pfd[0].fd = c.fd
    pfd[0].events = POLLRDHUP
    pfd[0].revents = 0
    if C.poll(pfd, 1, 0) ~= 1 then
        return false
    end
    return band(pfd[0].revents, GONE) ~= 0
end

return _M
