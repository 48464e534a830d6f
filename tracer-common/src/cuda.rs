//! CUDA runtime/driver API probes: the per-attachment cookie, the aggregation maps' keys and
//! values, and the ordered events (allocations, frees, kernel names).
//!
//! One entry and one return program serve every probed function. What a function's arguments
//! mean is told to them by the attachment's cookie ([`Cookie`]), so adding a function is one row
//! in the user-side table, not a new program.

pub const API_MAP: &str = "CUDA_API";
pub const ERRS_MAP: &str = "CUDA_ERRS";
pub const LAUNCH_MAP: &str = "CUDA_LAUNCH";
pub const COPY_MAP: &str = "CUDA_COPY";
pub const EVENTS_MAP: &str = "CUDA_EVENTS";
/// Per CPU: `bpf_ktime_get_ns` of the latest traced launch call's entry. The budget's gate
/// takes a window's end from it: the breakpoints go some ms after it decides to close.
pub const GATE_LAST_MAP: &str = "CUDA_GATE_LAST";
/// Per CPU: the first traced launch entry since user space zeroed it (a window's start).
pub const GATE_FIRST_MAP: &str = "CUDA_GATE_FIRST";
/// Per CPU: the runs of the entry (0) and return (1) programs at a launch function on
/// that CPU, in a traced process or not (every process that maps the library traps). What the
/// budget's windows cost: the other functions' probes stay on outside them, and a PyTorch
/// import's ~21,000 `__cudaRegisterFunction` calls counted as a window's launches once shut its
/// windows and spread them 8 s apart before the job's first launch (an H100 trace of a launch-
/// bound loop started under gputrace then counted no launch at all).
pub const LAUNCH_RUNS_MAP: &str = "CUDA_LAUNCH_RUNS";
/// More u64s of `LAUNCH_RUNS_MAP`, for the budget's estimate: the traced threads' outermost
/// copies and syncs (counted exactly while their own probes are on), their outermost launches (as the
/// report counts them: once each, in traced processes only), and the copies and syncs made
/// inside a window (between two counted launches). The estimate fills in the launches between
/// windows from the copies and syncs made there: a training loop makes as many launches each
/// step, and the ratio needs no price of a probe hit.
pub const STEADY_CALLS_SLOT: u32 = 2;
pub const OUTER_LAUNCH_SLOT: u32 = 3;
pub const STEADY_ON_SLOT: u32 = 4;
/// The runs of copies and syncs in `STEADY_ON_SLOT` (a step's, between its launches and the
/// next step's): how many steps a window's ratio was taken over.
pub const STEADY_STEPS_SLOT: u32 = 5;
/// The pid_tgid of the traced thread that made the last outermost launch on the CPU: the
/// budget fills its bucket at the pace of that thread's CPU time where it waits for one.
pub const LAUNCHER_SLOT: u32 = 6;
/// The entry program's runs at launch functions while launches are off (`LAUNCHES_OFF_SLOT`):
/// paid by the calls, but not a window's.
pub const CLOSING_RUNS_SLOT: u32 = 7;
/// The entry (`OTHER_ENTRY_SLOT`) and return (`OTHER_RET_SLOT`) programs' runs at the other
/// functions (copies, syncs, allocations) in traced threads: probes the launch windows do not
/// switch, whose cost the budget leaves out of their share.
pub const OTHER_ENTRY_SLOT: u32 = 8;
pub const OTHER_RET_SLOT: u32 = 9;
/// The entry program's runs at copies and syncs in traced threads: what the copy and sync
/// probes' windows saw (`overhead::calls`), once their cost alone passes the budget.
pub const CALL_RUNS_SLOT: u32 = 10;
pub const LAUNCH_RUNS_SLOTS: u32 = 11;
/// Per CPU, one u64: the entry program's launch runs on that CPU (`LAUNCH_RUNS_MAP`) at which
/// it wakes the budget's watchdog (0: never). Set by the watchdog to each CPU's count plus its share of
/// what is left of the window's share of the bucket.
pub const GATE_AT_MAP: &str = "CUDA_GATE_AT";
/// The ring the entry program wakes the watchdog on (one u64 a record: the count).
pub const GATE_WAKE_MAP: &str = "CUDA_GATE_WAKE";
/// One u64, raised by user space each time a launch window's return probes are gone: a call
/// entered before it may have lost its return, so a thread's call depth from before it is not
/// trusted after it.
pub const RET_GEN_MAP: &str = "CUDA_RET_GEN";
/// The second u64 of `RET_GEN_MAP`, raised by user space as each launch window opens: the
/// copies and syncs a thread made after its last launch of one window are not the next
/// window's (the budget's estimate, `count_step`).
pub const WINDOW_GEN_SLOT: u32 = 1;
/// The third u64 of `RET_GEN_MAP`: 1 from the budget's watchdog deciding to close a window
/// until the next window's launch probes are all on, and the entry program then counts no
/// launch. The window's links drop one by one, each on a thread of its own, and a runtime
/// launch made while the driver's probe was still on and the runtime's already off counted as
/// a direct driver launch (2,067 of 3M in a CI run): the window ends here, for every library
/// at once, whatever order the kernel takes the probes off in.
pub const LAUNCHES_OFF_SLOT: u32 = 2;
/// The fourth u64 of `RET_GEN_MAP`, raised by user space once a window of the copy and sync
/// probes (`overhead::calls`) has dropped its return probes: an outermost copy or sync entered
/// before it may have lost its return, and a return at its stack level after it is not its
/// own. Apart from slot 0, which would cut a launch in flight from the driver launch inside
/// it whenever a copy window closed.
pub const CALL_GEN_SLOT: u32 = 3;
pub const RET_GEN_SLOTS: u32 = 4;
/// tgid -> [`RtText`]: where the shared CUDA runtimes (libcudart) a traced process maps have
/// their code. A driver launch entered at no call depth but called from there is nested in a
/// runtime launch whose entry was not seen (entered just before a window's runtime probe went
/// on, or before the attach, and held inside until the driver's probe was on): not counted
/// as a direct driver launch.
pub const RT_TEXT_MAP: &str = "CUDA_RT_TEXT";
pub const RT_TEXT_ENTRIES: u32 = 4_096;
/// Executable mappings kept per process: a libcudart maps one; more come from two runtimes
/// (a wheel's and a vendored copy).
pub const RT_TEXT_RANGES: usize = 4;
pub const ENTRY_PROG: &str = "cuda_entry";
pub const RET_PROG: &str = "cuda_ret";
/// Global: 1 counts calls at entry only (no return probe, no durations), for cost measurement.
pub const GLOBAL_ENTRY_ONLY: &str = "CUDA_ENTRY_ONLY";

pub const API_ENTRIES: u32 = 16_384;
pub const ERRS_ENTRIES: u32 = 4_096;
pub const LAUNCH_ENTRIES: u32 = 16_384;
pub const COPY_ENTRIES: u32 = 1_024;
pub const STASH_ENTRIES: u32 = 16_384;
pub const EVENTS_BYTES: u32 = 4 * 1024 * 1024;
pub const HIST_BUCKETS: usize = 32;
pub const NAME_BYTES: usize = 256;

/// How the return program reads a function's arguments and result.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Only count, duration and error code.
    Plain = 0,
    /// `cudaLaunchKernel(func, dim3 grid, dim3 block, ...)`: dim3 by value in rsi/rdx, rcx/r8.
    LaunchRt = 1,
    /// `cudaLaunchKernelExC(const cudaLaunchConfig_t*, func, ...)`.
    LaunchRtEx = 2,
    /// `cuLaunchKernel(f, gx, gy, gz, bx, by, bz /* stack */, ...)`.
    LaunchDrv = 3,
    /// `cuLaunchKernelEx(const CUlaunchConfig*, f, ...)`.
    LaunchDrvEx = 4,
    /// `cudaMemcpy(dst, src, count, kind)` and the Async variant.
    CopyRt = 5,
    /// `cudaMemcpy2D(dst, dpitch, src, spitch, width, height, kind /* stack */)`.
    Copy2dRt = 6,
    /// Bytes in the third argument, direction from the cookie (`cuMemcpyHtoD_v2`, ...).
    CopyBytes3 = 7,
    /// Bytes in the fifth argument, direction from the cookie (peer copies).
    CopyBytes5 = 8,
    /// `cudaMalloc(void **out, size)`: pointer written through the first argument.
    AllocOut = 9,
    /// `cudaMallocPitch(void **out, size_t *pitch, width, height)`.
    AllocPitch = 10,
    /// `cudaFree(ptr)`.
    Free = 11,
    /// `cuModuleGetFunction(CUfunction *out, mod, const char *name)` (and cuLibraryGetKernel).
    NameOut = 12,
    /// `cuKernelGetFunction(CUfunction *out, CUkernel k)`: an alias of a named handle.
    AliasOut = 13,
    /// `__cudaRegisterFunction(handle, const char *hostFun, char *deviceFun, ...)`.
    Register = 14,
    /// `cudaMemcpy3D(const cudaMemcpy3DParms *p)`: extent and kind read from the struct.
    Copy3dRt = 15,
}

impl Shape {
    pub fn from_u8(v: u8) -> Option<Shape> {
        use Shape::*;
        [
            Plain,
            LaunchRt,
            LaunchRtEx,
            LaunchDrv,
            LaunchDrvEx,
            CopyRt,
            Copy2dRt,
            CopyBytes3,
            CopyBytes5,
            AllocOut,
            AllocPitch,
            Free,
            NameOut,
            AliasOut,
            Register,
            Copy3dRt,
        ]
        .get(v as usize)
        .copied()
    }
}

/// Copy directions, numbered as `cudaMemcpyKind` (0..=4).
pub const DIR_H2H: u8 = 0;
pub const DIR_H2D: u8 = 1;
pub const DIR_D2H: u8 = 2;
pub const DIR_D2D: u8 = 3;
pub const DIR_DEFAULT: u8 = 4;
/// Not a copy.
pub const DIR_NONE: u8 = 0xff;

/// The attach cookie, packed into a u64:
/// bits 0..16 function id, 16..24 [`Shape`], 24..32 time category, 32..40 copy direction,
/// 40..48 flags ([`FLAG_ASYNC`], [`FLAG_NO_RESULT`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cookie {
    pub fid: u16,
    pub shape: u8,
    pub category: u8,
    pub dir: u8,
    pub flags: u8,
}

pub const FLAG_ASYNC: u8 = 1;
/// The function returns nothing (or nothing that is an error code).
pub const FLAG_NO_RESULT: u8 = 2;

impl Cookie {
    #[inline(always)]
    pub const fn pack(self) -> u64 {
        (self.fid as u64)
            | (self.shape as u64) << 16
            | (self.category as u64) << 24
            | (self.dir as u64) << 32
            | (self.flags as u64) << 40
    }
    #[inline(always)]
    pub const fn unpack(v: u64) -> Cookie {
        Cookie {
            fid: v as u16,
            shape: (v >> 16) as u8,
            category: (v >> 24) as u8,
            dir: (v >> 32) as u8,
            flags: (v >> 40) as u8,
        }
    }
}

/// Per (process, thread, function).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ApiKey {
    pub pid: u32,
    pub tid: u32,
    pub fid: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ApiVal {
    pub count: u64,
    pub total_ns: u64,
    pub min_ns: u64,
    pub max_ns: u64,
    pub errors: u64,
    /// Bucket i counts durations in [2^i, 2^(i+1)) ns (bucket 0 also holds 0).
    pub hist: [u64; HIST_BUCKETS],
}

/// Failed calls per (process, function, result code).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ErrKey {
    pub pid: u32,
    pub fid: u32,
    pub code: i32,
    pub _pad: u32,
}

/// Launches per (process, launching function, kernel handle or host stub, dimensions).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LaunchKey {
    pub pid: u32,
    pub fid: u32,
    /// Host stub pointer (runtime) or CUfunction handle (driver).
    pub func: u64,
    pub grid: [u32; 3],
    pub block: [u32; 3],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct LaunchVal {
    pub count: u64,
    pub total_ns: u64,
}

/// Copies per (process, direction, sync/async).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CopyKey {
    pub pid: u32,
    pub dir: u32,
    /// 1 for async.
    pub asynchronous: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CopyVal {
    pub count: u64,
    pub bytes: u64,
    pub total_ns: u64,
}

#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// `addr` allocated `size` bytes.
    Alloc = 1,
    /// `addr` freed.
    Free = 2,
    /// Handle `addr` is named `name`.
    Name = 3,
    /// Handle `addr` is the same kernel as handle `size`.
    Alias = 4,
}

impl EventKind {
    pub fn from_u32(v: u32) -> Option<EventKind> {
        match v {
            1 => Some(EventKind::Alloc),
            2 => Some(EventKind::Free),
            3 => Some(EventKind::Name),
            4 => Some(EventKind::Alias),
            _ => None,
        }
    }
}

/// Ordered events on the `CUDA_EVENTS` ring buffer. `name` is only filled for [`EventKind::Name`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CudaEvent {
    pub kind: u32,
    pub pid: u32,
    pub tid: u32,
    pub fid: u32,
    pub ts_ns: u64,
    pub addr: u64,
    pub size: u64,
    pub name: [u8; NAME_BYTES],
}

/// Bytes of an event without a name (allocations are the common case).
pub const EVENT_HEADER_BYTES: usize = 40;

/// log2 bucket of a duration.
#[inline(always)]
pub fn log2_bucket(ns: u64) -> usize {
    if ns == 0 {
        return 0;
    }
    let b = 63 - ns.leading_zeros() as usize;
    if b >= HIST_BUCKETS {
        HIST_BUCKETS - 1
    } else {
        b
    }
}

/// Up to [`RT_TEXT_RANGES`] address ranges `[start, end)`; unused ones are `[0, 0)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RtText {
    pub start: [u64; RT_TEXT_RANGES],
    pub end: [u64; RT_TEXT_RANGES],
}

impl RtText {
    /// Whether `addr` lies in one of the ranges.
    #[inline(always)]
    pub fn holds(&self, addr: u64) -> bool {
        let mut i = 0;
        while i < RT_TEXT_RANGES {
            if addr >= self.start[i] && addr < self.end[i] {
                return true;
            }
            i += 1;
        }
        false
    }
}

crate::user_pod!(ApiKey, ApiVal, ErrKey, LaunchKey, LaunchVal, CopyKey, CopyVal, CudaEvent, RtText);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookie_roundtrip() {
        let c = Cookie {
            fid: 513,
            shape: Shape::Copy2dRt as u8,
            category: 11,
            dir: DIR_D2H,
            flags: FLAG_ASYNC,
        };
        assert_eq!(Cookie::unpack(c.pack()), c);
        assert_eq!(Shape::from_u8(14), Some(Shape::Register));
        assert_eq!(Shape::from_u8(15), Some(Shape::Copy3dRt));
        assert_eq!(Shape::from_u8(16), None);
    }

    #[test]
    fn buckets() {
        assert_eq!(log2_bucket(0), 0);
        assert_eq!(log2_bucket(1), 0);
        assert_eq!(log2_bucket(1024), 10);
        assert_eq!(log2_bucket(2047), 10);
        assert_eq!(log2_bucket(u64::MAX), HIST_BUCKETS - 1);
    }
}
