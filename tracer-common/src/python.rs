//! CPython stacks: user space finds each thread's `PyThreadState` and the struct offsets of the
//! process's interpreter version; the CPU sampler walks the frame chain and stores
//! (code object, instruction offset) pairs, which user space turns into `file:line function`.

pub const PY_TSTATE_MAP: &str = "PY_TSTATE";
pub const PY_PROCS_MAP: &str = "PY_PROCS";
pub const PY_STACKS_MAP: &str = "PY_STACKS";
pub const PY_STATS_MAP: &str = "PY_STATS";
pub const PY_SEED_MAP: &str = "PY_SEED";
/// Processes user space found not to run a supported CPython (tgid -> 1). A traced process in
/// neither this map nor `PY_PROCS` is not classified yet: its threads' waits are marked
/// [`PY_STACK_PENDING`], so that they can get their Python stack once it is known. An exec
/// takes the process out (the kernel does, at once).
pub const PY_NOT_MAP: &str = "PY_NOT";
pub const PY_NOT_ENTRIES: u32 = 16_384;
/// Global of the eBPF object: 0 with `--python off` (no walk, nothing pending).
pub const PY_ENABLED_GLOBAL: &str = "PY_ENABLED";

/// The Python stack of a thread that left the CPU before user space knew its thread state (a
/// thread just started, or one blocked since before the attach). A blocked thread's frames do
/// not change, so user space walks them itself once it knows the thread state and leaves the
/// stack in `PY_SEED`, where the kernel finds it when the wait ends. Never a walked stack's key.
pub const PY_STACK_PENDING: u64 = 2;
pub const PY_SEED_ENTRIES: u32 = 4_096;

/// `PY_SEED` value (keyed by tid): the stack of the wait that began at `off_ns`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PySeed {
    pub off_ns: u64,
    pub key: u64,
}

/// Frames recorded per Python stack; deeper stacks keep their leaf-most frames and are flagged.
pub const PY_MAX_FRAMES: usize = 64;
pub const PY_TSTATE_ENTRIES: u32 = 16_384;
pub const PY_PROCS_ENTRIES: u32 = 1_024;
pub const PY_STACKS_ENTRIES: u32 = 8_192;

/// Bytes of each frame read in one go, from [`PyOffsets::frame_window`]; every frame offset in
/// [`PyOffsets`] lies within them, and pointer fields are 8-aligned.
pub const PY_FRAME_WINDOW: usize = 80;

/// An offset that does not apply to this version.
pub const PY_NO_OFFSET: u32 = u32::MAX;

/// Where the frame chain of one interpreter version lives, per traced process (`PY_PROCS`,
/// keyed by tgid), so one object serves processes of several versions at once.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PyOffsets {
    /// `PyThreadState` -> pointer read first (3.11: `cframe`).
    pub tstate_frame: u32,
    /// Then, from that pointer, the current `_PyInterpreterFrame *` (3.11: `cframe->current_frame`),
    /// or [`PY_NO_OFFSET`] when the first pointer already is the frame.
    pub cframe_current: u32,
    pub frame_code: u32,
    pub frame_previous: u32,
    pub frame_prev_instr: u32,
    /// Byte that marks the first frame run by one `_PyEval_EvalFrameDefault` activation (3.11),
    /// or [`PY_NO_OFFSET`].
    pub frame_is_entry: u32,
    /// Byte saying who owns the frame (3.12+), or [`PY_NO_OFFSET`]. A frame owned by the C stack
    /// is the shim each `_PyEval_EvalFrameDefault` activation pushes first: it is not recorded,
    /// and the frame it called is marked as the activation's entry frame.
    pub frame_owner: u32,
    /// The `owner` value of those shim frames (`FRAME_OWNED_BY_CSTACK`).
    pub owner_cstack: u32,
    /// Where the window starts in the frame; the `frame_*` offsets are relative to it. 3.10's
    /// `f_lasti` lies beyond the first [`PY_FRAME_WINDOW`] bytes of a `PyFrameObject`.
    pub frame_window: u32,
    /// [`PY_OFF_LASTI`] or 0.
    pub flags: u32,
    /// Address of the process's `struct _gil_runtime_state` (not an offset: set per process),
    /// 0 when not known. A futex wait on a word inside it is a wait for the GIL.
    pub gil: u64,
}

/// `struct _gil_runtime_state`, the same in 3.11, 3.12 and 3.13 (checked with gdb on pyenv's
/// builds and by the futex words threads wait on under contention): its size, and where
/// `last_holder` (`PyThreadState *`) and `locked` (int) sit.
pub const GIL_SIZE: u64 = 208;
pub const GIL_LAST_HOLDER: u64 = 8;
pub const GIL_LOCKED: u64 = 16;

/// Bit in [`PyOffsets::flags`] (3.10): `frame_prev_instr` is `f_lasti`, an `int` counting 2-byte
/// code units (-1 before the first instruction), not a pointer into the code object; the
/// recorded [`PyFrame::instr_off`] is `2 * f_lasti`, and every frame is an entry frame, as each
/// `PyFrameObject` is run by its own `_PyEval_EvalFrameDefault` activation.
pub const PY_OFF_LASTI: u32 = 1;

// Shared with the kernel as raw bytes: no implicit padding.
const _: () = assert!(core::mem::size_of::<PyOffsets>() == 10 * 4 + 8);

/// Bit in [`PyFrame::flags`]: the frame is an entry frame (a C -> Python boundary).
pub const PY_FRAME_ENTRY: u32 = 1;

/// One recorded frame: the code object and where its last instruction is.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PyFrame {
    pub code: u64,
    /// `prev_instr - code` (bytes), from which user space subtracts the offset of the bytecode;
    /// with [`PY_OFF_LASTI`], `2 * f_lasti` (bytes into `co_code`, negative as `i32` before the
    /// first instruction).
    pub instr_off: u32,
    pub flags: u32,
}

/// Bit in [`PyStack::status`]: the chain was longer than [`PY_MAX_FRAMES`].
pub const PY_STACK_TRUNCATED: u32 = 1;

/// A Python stack, leaf first, as stored in `PY_STACKS` keyed by a hash of its frames.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PyStack {
    pub len: u32,
    pub status: u32,
    /// The process the code objects belong to.
    pub pid: u32,
    pub _pad: u32,
    pub frames: [PyFrame; PY_MAX_FRAMES],
}

/// Slots of the per-CPU `PY_STATS` counters: what happened to the Python walk of each sample of
/// a Python process.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PyStat {
    /// A Python stack was recorded.
    Walked = 0,
    /// The thread had no known `PyThreadState` yet (new thread, or not a Python thread).
    NoThreadState = 1,
    /// Reading the target's memory failed mid-walk (frame freed or being rewritten).
    ReadFailed = 2,
    /// The chain was longer than `PY_MAX_FRAMES`; the root-most frames were left out.
    Truncated = 3,
    /// `PY_STACKS` was full: native frames only.
    StacksFull = 4,
    /// The thread ran no Python code (empty frame chain).
    NoFrames = 5,
}

impl PyStat {
    pub const COUNT: u32 = 8;
    pub const ALL: [PyStat; 6] = [
        PyStat::Walked,
        PyStat::NoThreadState,
        PyStat::ReadFailed,
        PyStat::Truncated,
        PyStat::StacksFull,
        PyStat::NoFrames,
    ];
}

crate::user_pod!(PyOffsets, PyFrame, PyStack, PySeed);
