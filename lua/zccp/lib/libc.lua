-- The few libc calls ZCCP needs, declared once for every module.
local ffi = require "ffi"

local _M = { _VERSION = "0.1.0" }

ffi.cdef [[
int shm_open(const char *name, int oflag, unsigned int mode);
int open(const char *path, int oflag, unsigned int mode);
int fchmod(int fd, unsigned int mode);
long write(int fd, const void *buf, size_t n);
int close(int fd);
long lseek(int fd, long offset, int whence);
void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset);
int munmap(void *addr, size_t length);
int getpid(void);
int kill(int pid, int sig);
char *strerror(int errnum);
size_t strcspn(const uint8_t *s, const char *reject);
typedef long zccp_time_t;
struct zccp_timespec { zccp_time_t tv_sec; long tv_nsec; };
int clock_gettime(int clk_id, struct zccp_timespec *tp);
struct zccp_statx { uint32_t mask, blksize; uint64_t attributes; uint32_t nlink, uid, gid;
                    uint16_t mode, spare0; uint64_t rest[30]; };
int statx(int dirfd, const char *path, int flags, unsigned int mask, struct zccp_statx *buf);
]]

-- POSIX/Linux values (these are the OS's constants, not ZCCP's ABI).
_M.O_RDWR = 2
_M.O_WRONLY = 1
_M.O_CREAT = 0x40
_M.O_TRUNC = 0x200
_M.O_CLOEXEC = 0x80000
_M.ENOENT = 2
_M.PROT_READ_WRITE = 3
_M.MAP_SHARED = 1
_M.MAP_POPULATE = 0x8000   -- pre-fault the mapping: no page faults on the request path
_M.MAP_FAILED = ffi.cast("void *", -1)
_M.SEEK_END = 2
_M.CLOCK_REALTIME = 0
_M.CLOCK_MONOTONIC = 1

local C = ffi.C
local ts = ffi.new("struct zccp_timespec")
local tonumber = tonumber

_M.C = C

-- Writes `data` to a new file at `path` with exactly `mode` (whatever the umask: the
-- file is created owner-only, then fchmod'ed). true, or nil and the error.
function _M.write_file(path, data, mode)
    local fd = C.open(path, _M.O_WRONLY + _M.O_CREAT + _M.O_TRUNC + _M.O_CLOEXEC, 384)   -- 0600
    if fd < 0 then
        return nil, "open " .. path .. ": " .. _M.errstr()
    end
    local err
    if C.fchmod(fd, mode) ~= 0 then
        err = "fchmod " .. path .. ": " .. _M.errstr()
    end
    local off, n = 0, #data
    while not err and off < n do
        local w = tonumber(C.write(fd, ffi.cast("const char *", data) + off, n - off))
        if w < 0 then
            if ffi.errno() ~= 4 then       -- EINTR: again
                err = "write " .. path .. ": " .. _M.errstr()
            end
        else
            off = off + w
        end
    end
    C.close(fd)
    if err then
        return nil, err
    end
    return true
end

function _M.errstr()
    local msg = ffi.string(C.strerror(ffi.errno()))
    return msg
end

-- CLOCK_REALTIME in ns as a uint64 cdata (the engine compares it with time.time_ns()).
function _M.now_ns()
    C.clock_gettime(_M.CLOCK_REALTIME, ts)
    return ffi.cast("uint64_t", ts.tv_sec) * 1000000000ULL + tonumber(ts.tv_nsec)
end

-- CLOCK_MONOTONIC in seconds (a double): phase timings finer than ngx.now()'s cached ms
-- (a vDSO call, no system call).
function _M.mono_s()
    C.clock_gettime(_M.CLOCK_MONOTONIC, ts)
    return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

return _M
