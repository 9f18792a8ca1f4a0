-- A unix listen socket that a killed nginx left behind: nginx unlinks its unix sockets only on
-- a clean stop, so after SIGKILL (the OOM killer, `docker kill`, a crashed host) the file stays
-- and every later start fails with "bind() ... (98: Address already in use)", for ever (a
-- container restarting in a loop). Called from init_by_lua in the master, before it binds.
--
-- The file is removed only when it is a socket and nothing listens on it (connect: refused).
-- A live one (this nginx's own on reload or `nginx -t`, or another program's) is left alone,
-- and its bind fails as before.
local ffi = require "ffi"
local libc = require "zccp.lib.libc"

-- each apart: one already declared by another module must not stop the others
for _, decl in ipairs({
    "int socket(int domain, int type, int protocol);",
    "int connect(int fd, const void *addr, unsigned int len);",
    "int unlink(const char *path);",
    "struct zccp_sockaddr_un { uint16_t sun_family; char sun_path[108]; };",
}) do
    pcall(ffi.cdef, decl)
end

local C = ffi.C
local band = require("bit").band
local ffi_errno = ffi.errno
local ffi_copy = ffi.copy
local error = error

local _M = { _VERSION = "0.1.0" }

local AF_UNIX, SOCK_STREAM, SOCK_NONBLOCK, SOCK_CLOEXEC = 1, 1, 0x800, 0x80000
local ECONNREFUSED, ENOENT = 111, 2
local AT_FDCWD, AT_SYMLINK_NOFOLLOW, STATX_TYPE = -100, 0x100, 0x1
local S_IFMT, S_IFSOCK = 0xF000, 0xC000
local SUN_PATH_MAX = 107

-- true when nobody listens on the socket at path (a non-blocking connect is refused; a full
-- backlog answers EAGAIN: someone listens)
local function refused(path)
    local fd = C.socket(AF_UNIX, SOCK_STREAM + SOCK_NONBLOCK + SOCK_CLOEXEC, 0)
    if fd < 0 then
        return false
    end
    local addr = ffi.new("struct zccp_sockaddr_un")
    addr.sun_family = AF_UNIX
    ffi_copy(addr.sun_path, path)
    local rc = C.connect(fd, addr, ffi.sizeof(addr))
    local errno = ffi_errno()
    C.close(fd)
    return rc ~= 0 and errno == ECONNREFUSED
end

-- path: the socket's file ("" or an address: nothing to do). true; raises when a stale
-- socket cannot be removed (the bind after would fail with a less telling message).
function _M.remove(path)
    if path == "" or #path > SUN_PATH_MAX then
        return true
    end
    local st = ffi.new("struct zccp_statx")
    if C.statx(AT_FDCWD, path, AT_SYMLINK_NOFOLLOW, STATX_TYPE, st) ~= 0
            or band(st.mode, S_IFMT) ~= S_IFSOCK or not refused(path) then
        return true
    end
    if C.unlink(path) ~= 0 and ffi_errno() ~= ENOENT then
        error("server.admin_listen: cannot remove the stale socket " .. path .. " a killed nginx left: "
              .. libc.errstr())
    end
    return true
end

return _M
