-- The few libc calls ZCCP needs, declared once for every module.
local ffi = require "ffi"

local _M = { _VERSION = "0.1.0" }

ffi.cdef [[
int shm_open(const char *name, int oflag, unsigned int mode);
int close(int fd);
long lseek(int fd, long offset, int whence);
void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset);
int munmap(void *addr, size_t length);
int getpid(void);
char *strerror(int errnum);
typedef long zccp_time_t;
struct zccp_timespec { zccp_time_t tv_sec; long tv_nsec; };
int clock_gettime(int clk_id, struct zccp_timespec *tp);
]]

-- POSIX/Linux values (these are the OS's constants, not ZCCP's ABI).
_M.O_RDWR = 2
_M.ENOENT = 2
_M.PROT_READ_WRITE = 3
_M.MAP_SHARED = 1
_M.MAP_POPULATE = 0x8000   -- pre-fault the mapping: no page faults on the request path
_M.MAP_FAILED = ffi.cast("void *", -1)
_M.SEEK_END = 2
_M.CLOCK_REALTIME = 0

local C = ffi.C
local ts = ffi.new("struct zccp_timespec")
local tonumber = tonumber

_M.C = C

function _M.errstr()
    return ffi.string(C.strerror(ffi.errno()))
end

-- CLOCK_REALTIME in ns as a uint64 cdata (the engine compares it with time.time_ns()).
function _M.now_ns()
    C.clock_gettime(_M.CLOCK_REALTIME, ts)
    return ffi.cast("uint64_t", ts.tv_sec) * 1000000000ULL + tonumber(ts.tv_nsec)
end

return _M
