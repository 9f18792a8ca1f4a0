-- The admin surface's gate: purge, warm-up, L1 purge, keys and /metrics answer only on the
-- admin listener (its server {} sets $zccp_admin, zccp_admin.conf), and there only with the
-- admin token when server.admin_token_file names one. The connection's address counts for
-- nothing: behind a proxy on the same host every client is 127.0.0.1.
--
--   if not admin.allowed(api) then return end   -- answered 404 / 401
local settings = require "zccp.settings"
local sha256 = require "zccp.lib.sha256"
local errors = require "zccp.errors"
local libc = require "zccp.lib.libc"
local ffi = require "ffi"

pcall(ffi.cdef, [[
int mkdir(const char *path, unsigned int mode);
int chmod(const char *path, unsigned int mode);
unsigned int geteuid(void);
]])

local ngx = ngx
local ngx_var = ngx.var
local str_match = string.match
local io_open = io.open
local error = error
local tostring = tostring
local tonumber = tonumber
local str_format = string.format
local band = require("bit").band

local _M = { _VERSION = "0.1.0" }

-- Constant-time comparison of two strings of the same length (hex digests).
local function same(a, b)
    if #a ~= #b then
        return false
    end
    local bit = require "bit"
    local diff = 0
    for i = 1, #a do
        diff = bit.bor(diff, bit.bxor(a:byte(i), b:byte(i)))
    end
    return diff == 0
end

-- The admin token's digest for init_by_lua (settings.admin_token_sha256): read from the file
-- the renderer wrote owner-only (zccp.ops.nginx_conf), never from the world-readable config.
-- path "": no token. A named file that cannot be read stops nginx's start (failing open
-- would serve the admin surface without its token).
function _M.read_digest(path)
    if path == "" then
        return ""
    end
    local f, err = io_open(path, "rb")
    if not f then
        error("server.admin_token_file: cannot read the admin token's digest: " .. tostring(err))
    end
    local digest = f:read("*a")
    f:close()
    digest = digest and str_match(digest, "^(%x+)%s*$")
    if not digest or #digest ~= 64 then
        error("server.admin_token_file: " .. path .. " does not hold a SHA-256 digest")
    end
    return digest
end

local OWNER_ONLY = 448    -- 0700
local EEXIST = 17
local AT_FDCWD, AT_SYMLINK_NOFOLLOW, STATX_BASIC = -100, 0x100, 0x7ff
local S_IFMT, S_IFDIR = 0xF000, 0x4000
local NOT_OURS = 19       -- 0023: group or others may write, others may enter

-- A directory that was there already is used only when it is this user's or root's, a
-- directory (not a link), and nobody else may write to or enter it (zccp.config.own_dirs, the
-- renderer's check): a member of a 2770 /run/zccp's group could have made it before a
-- restart of nginx that no render preceded.
local function check_own(path)
    local C = ffi.C
    local st = ffi.new("struct zccp_statx")
    if C.statx(AT_FDCWD, path, AT_SYMLINK_NOFOLLOW, STATX_BASIC, st) ~= 0 then
        error("server.admin_listen: cannot stat " .. path .. ": " .. libc.errstr())
    end
    local uid = st.uid
    if band(st.mode, S_IFMT) ~= S_IFDIR or (uid ~= 0 and uid ~= C.geteuid())
            or band(st.mode, NOT_OURS) ~= 0 then
        error("server.admin_listen: " .. path .. " (uid " .. tonumber(uid) .. ", mode "
              .. str_format("%o", band(st.mode, 4095)) .. ") is not a directory of this user's or "
              .. "root's that only its owner may enter: someone else made it; refusing to use it")
    end
end

-- The admin socket's directory, made by nginx's master at init (before it binds its listening
-- sockets), so that it is there whoever starts nginx and whenever (at boot, /run is empty):
-- nginx makes unix listen sockets 0666, so this directory, 0700 and the master's own, is what
-- keeps every other user (nginx's workers' included) out. path "": an address or an
-- operator's own directory (checked at render). A failure stops nginx's start.
function _M.make_socket_dir(path)
    if path == "" then
        return true
    end
    local C = ffi.C
    if C.mkdir(path, OWNER_ONLY) == 0 then
        C.chmod(path, OWNER_ONLY)      -- no umask, no setgid from a 2770 parent
        return true
    end
    if ffi.errno() ~= EEXIST then
        error("server.admin_listen: cannot make " .. path .. ": " .. libc.errstr())
    end
    check_own(path)
    return true
end

-- true, or false once the request has been answered.
function _M.allowed(api)
    if ngx_var.zccp_admin ~= "1" then   -- the public listener: as if the path did not exist
        errors.send(api, 404, "not_found_error", "not found")
        return false
    end
    local want = settings.get().admin_token_sha256
    if not want or want == "" then
        return true
    end
    local auth = ngx_var.http_authorization
    local token = auth and str_match(auth, "^[Bb][Ee][Aa][Rr][Ee][Rr]%s+(%S+)%s*$")
    if not token or not same(sha256.hex(sha256.digest(token, #token), 32), want) then
        errors.send(api, 401, "authentication_error", "the admin token is missing or wrong")
        return false
    end
    return true
end

return _M
