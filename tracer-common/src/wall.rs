//! Wall-time accounting (issue 3): per-thread state, the in-kernel sums of time per
//! (thread, category or off-CPU reason, stacks), syscall statistics and block I/O.
//!
//! Every event (switch out, switch in, wakeup, CUDA enter/exit) closes the thread's running
//! interval at that instant and charges it according to the phase the thread was in, so the
//! intervals of a thread tile its life without gaps or overlap.

/// Thread states whose slot in `THREAD_SLOTS_MAP` another live thread holds, keyed by tid.
pub const THREADS_MAP: &str = "THREADS";
/// Thread states, direct-mapped: thread `tid` is in slot `tid & THREAD_SLOT_MASK` (a global
/// of the programs: `THREAD_SLOTS - 1` unless a test asks for fewer) when that slot's
/// `ThreadState::tid` is `tid`, else in `THREADS_MAP` (its spill). Every scheduler, syscall
/// and block event of a traced thread finds its state; an array slot is a few loads the
/// verifier inlines, where a hash lookup is a helper call, a hash and a bucket walk. Mappable
/// (`BPF_F_MMAPABLE`), so user space scans it in memory rather than a syscall per slot.
pub const THREAD_SLOTS_MAP: &str = "THREAD_SLOTS";
/// One `u64`: how many states `THREADS_MAP` holds. While 0 a thread not in its slot has no
/// state, with no hash lookup.
pub const THREADS_SPILLED_MAP: &str = "THREADS_SPILLED";
pub const WALL_MAP: &str = "WALL";
pub const LIFE_MAP: &str = "LIFE";
/// Deaths recorded in `LIFE` so far (one shared counter): user space takes dead threads' rows
/// out of the maps when it has moved enough since the last time.
pub const DEATHS_MAP: &str = "DEATHS";
pub const SYSCALLS_MAP: &str = "SYSCALLS";
/// `THREAD_SLOTS` entries of [`SysHeld`], at each thread state's slot.
pub const SYS_HELD_MAP: &str = "SYS_HELD";
pub const ERRNOS_MAP: &str = "ERRNOS";
pub const FILEIO_MAP: &str = "FILEIO";
pub const FD_GEN_MAP: &str = "FD_GEN";
/// One `u64`: renames of tasks that may be traced, so far.
pub const RENAMES_MAP: &str = "RENAMES";
/// One `u64`: successful closes by traced processes so far.
pub const FD_EPOCH_MAP: &str = "FD_EPOCH";
pub const FD_NAMES_MAP: &str = "FD_NAMES";
pub const BLOCK_MAP: &str = "BLOCK_IO";
/// One [`BlockSample`]: how block requests are sampled. User space sets it from the rate of
/// [`BLOCK_COUNTED_MAP`] (`accounting::block_sample`).
pub const BLOCK_SAMPLE_MAP: &str = "BLOCK_SAMPLE";
/// Per CPU, one `u64`: the traced block requests counted so far, each by its weight (an
/// estimate of all of them while they are sampled).
pub const BLOCK_COUNTED_MAP: &str = "BLOCK_COUNTED";
/// The largest sampling shift: 1 request in 64.
pub const BLOCK_SHIFT_MAX: u32 = 6;

/// How block requests are sampled: 0 `shift`, every request is counted; else those
/// [`block_selected`] picks, 1 in `2^shift`, each counted `2^shift` times. A request is picked
/// by its first sector and the salt of when its bio was queued: user space draws a new `salt`
/// every few seconds (keeping the last as `prev_salt`, which the completions of requests
/// queued under it still try), so a workload that rereads a few hot sectors is not stuck with
/// whichever of them one draw picked. A map value, where a clock would do: the clock (or
/// `jiffies`) cost the completion's early return ~40 ns more here.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockSample {
    pub shift: u64,
    pub salt: u64,
    pub prev_salt: u64,
    /// The shift before the last change, for a look after it (~250 ms): a request picked at
    /// a smaller shift than the one set since is still tried at its own (the picks of a
    /// smaller shift include a larger one's).
    pub prev_shift: u64,
}
/// Two `u32`s: [`STOPPED_SLOT`] non-zero once user space has stopped the accounting to read it
/// (see `account::stopped` in the eBPF crate), [`SEEDED_SLOT`] once it has seeded the threads
/// that existed at the attach (`account::seeded`).
pub const STOPPED_MAP: &str = "ACCOUNT_STOPPED";
pub const STOPPED_SLOT: u32 = 0;
/// Until it is set, a traced process's thread the scheduler sees with no state is left alone,
/// not taken as born then: the seeding, as the trace's window starts, accounts it from there.
/// Taken as born at its first switch-out after the programs attached, a thread's life began
/// up to the other families' whole attach (~0.2 s) before the window, and a 0.3 s `--pid`
/// trace reported threads alive for 0.48 s.
pub const SEEDED_SLOT: u32 = 1;
pub const STOPPED_SLOTS: u32 = 2;
/// One `u64`: `bpf_ktime_get_ns` just after user space last took the syscall programs off
/// (0: never). A syscall a thread entered before it is one whose exit may have gone unseen:
/// its number is not trusted ([`ThreadState::sys_nr`]).
pub const SYS_OFF_AT_MAP: &str = "SYS_OFF_AT";
/// One `u64`: `bpf_ktime_get_ns` when a traced thread's block of syscalls came in under the
/// storm window, 0 while the syscall programs work. The exit program sets it as it sees the
/// storm, and from then on both programs return at once, as if taken off (no syscall entered
/// before is trusted): user space's detach takes a while, more on a loaded host, and a
/// storming thread paid the programs' full run for every syscall of that time. Cleared by
/// user space as it puts them back on.
pub const SYS_HALT_MAP: &str = "SYS_HALT";
/// One `u64`: 1 when a thread that may be traced entered a close, a dup onto an fd or an exec
/// while the programs were stopped (`SYS_HALT_MAP`): /proc may then name an fd's row after
/// a file opened since under its number. Cleared with `SYS_HALT_MAP`.
pub const SYS_HALT_FDS_MAP: &str = "SYS_HALT_FDS";
/// Per-CPU `u64`: traced threads' syscalls made while the programs were stopped
/// (`SYS_HALT_MAP`) and still attached. Each still paid the tracepoints' dispatch and two
/// early returns: the report charges them to the thread that stormed.
pub const SYS_HALTED_MAP: &str = "SYS_HALTED";
/// One u64: the syscalls in a block a traced thread's syscalls are timed in, 0 for none
/// (written by user space once it has measured what a syscall costs).
pub const SYS_STORM_CALLS_MAP: &str = "SYS_STORM_CALLS";

/// `ThreadState::off_kstack` of a wait under way when the thread was seeded: user space read
/// its kernel frames from /proc (`/proc/PID/task/TID/stack`), the kernel walked nothing.
pub const KSTACK_SEEDED: i32 = -2;

pub const THREADS_ENTRIES: u32 = 65_536;
/// Slots of `THREAD_SLOTS_MAP` (~3 MB): thread ids are handed out in sequence, so the threads
/// of a job share a slot only when their ids differ by a multiple of this.
pub const THREAD_SLOTS: u32 = 8_192;
/// `BPF_F_MMAPABLE`, for `THREAD_SLOTS_MAP`.
pub const MAP_F_MMAPABLE: u32 = 1 << 10;
/// `BPF_F_NO_PREALLOC`: a hash map whose rows are allocated as they are added.
pub const MAP_F_NO_PREALLOC: u32 = 1;
pub const WALL_ENTRIES: u32 = 65_536;
pub const LIFE_ENTRIES: u32 = 65_536;
/// Rows of `SYSCALLS`, preallocated (~26 MB of kernel memory). Allocated as they were made
/// (`BPF_F_NO_PREALLOC`), each new row and each row taken out cost the kernel's BPF allocator,
/// which refills and drains its caches by self-interrupts (VM exits on a guest): under a shell
/// loop, `sys_exit` cost 280-407 ns a hit where it costs 129-234 ns preallocated, and 18% of
/// gputrace's own CPU went to deleting the rows it took. A thread storm's 8,000 threads of ~5
/// rows each in under a second (the e2e storms) fill 40,000 before user space has taken many
/// dead threads' rows out on a busy host: at 32,768 a fresh-clone CI run lost 406 of 56,000
/// getppid calls (`SyscallMapFull`).
pub const SYSCALLS_ENTRIES: u32 = 65_536;
pub const ERRNOS_ENTRIES: u32 = 8_192;
pub const FILEIO_ENTRIES: u32 = 16_384;
/// Slots for opened paths (`FdName`), as many as `FILEIO` has rows: ~4.5 MB of kernel memory.
pub const FD_NAMES_ENTRIES: u32 = 16_384;
/// Slots of `FD_NAMES` a key may use (a power of two dividing `FD_NAMES_ENTRIES`).
pub const FD_NAME_WAYS: u32 = 4;
/// Longest path kept, NUL included: longer ones are cut at the end.
pub const FD_NAME_LEN: usize = 256;
pub const BLOCK_ENTRIES: u32 = 4_096;
pub const BLOCK_INFLIGHT_ENTRIES: u32 = 16_384;

/// Whether the block request at `sector`, its bio queued under `salt`, is one of those
/// sampled at shift `shift` (1 in `2^shift`, see [`BlockSample`]). The picks of a larger shift
/// are among those of a smaller one, so a request picked at the shift its bio was queued under
/// is still picked where the shift fell since. Fibonacci hashing: the top bits of the product
/// mix every bit of the sector (sequential reads' sectors differ only in their low bits).
#[inline(always)]
pub fn block_selected(sector: u64, salt: u64, shift: u32) -> bool {
    if shift == 0 {
        return true;
    }
    let h = (sector ^ salt).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h >> (64 - shift.min(BLOCK_SHIFT_MAX)) == 0
}

/// Buckets of the log2 latency histograms (bucket i: [2^i, 2^(i+1)) ns; the last is open).
pub const HIST_BUCKETS: usize = 32;

/// What the thread is doing during its running interval.
pub const PHASE_ONCPU: u32 = 0;
/// Off CPU and not runnable (blocked in the kernel).
pub const PHASE_BLOCKED: u32 = 1;
/// Runnable but not running: preempted, or woken and waiting for a CPU.
pub const PHASE_RUNNABLE: u32 = 2;

/// `WallKey::kind` for blocked time: classified in user space from the syscall, the kernel
/// stack and the task state (see `tracer/src/accounting/classify.rs`). Other kinds are
/// [`crate::time::Category`] ids.
pub const KIND_BLOCKED: u32 = 100;

/// `WallKey::state` for runqueue time: how the thread became runnable.
pub const RQ_PREEMPTED: u32 = 0;
pub const RQ_WOKEN: u32 = 1;

/// No syscall in progress.
pub const NO_SYSCALL: i32 = -1;
/// `ThreadState::off_run_delay` of a thread not yet seen leaving the CPU (seeded blocked at
/// the attach).
pub const RUN_DELAY_UNKNOWN: u64 = u64::MAX;
/// `ThreadState::off_sys_nr` (and the rows keyed by it) of a wait the syscall programs could
/// not place: they were off (the overhead budget takes them off a syscall storm) when the
/// thread's last syscall began, so it may be in one they did not see, or in none.
pub const SYSCALL_UNSEEN: i32 = -2;

/// Per-thread state (`THREAD_SLOTS_MAP`, `THREADS_MAP`). Only traced threads have one.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadState {
    /// When accounting of this thread started: its creation, or the seeding at attach.
    /// Identifies the thread across tid reuse.
    pub born_ns: u64,
    /// When the thread's process began, as near as known: its last exec, or its fork; a forked
    /// child takes its parent's until it execs (see `image_mm`), a thread created in a live
    /// process its leader's (its creator's where the leader is gone), a thread seeded at the
    /// attach its process's start from /proc. A thread's user stacks go to the young
    /// processes' map while this is under `crate::cpu::YOUNG_NS` ago: by the process's age, not
    /// the thread's, so that a long-running job's new threads (a thread per request) and forked
    /// workers (a data loader's) do not share that map with the churn of short processes.
    pub proc_born_ns: u64,
    /// A forked child that has not exec'd runs its parent's code, and takes its parent's
    /// `proc_born_ns`: this is its `mm` (`task_struct.mm`) at its fork, else 0. An exec
    /// replaces the `mm` before its tracepoint: while the current `mm` differs, the thread
    /// counts as young (the stacks taken inside a shell child's exec filled the older
    /// processes' map when such a child counted as old until the tracepoint).
    pub image_mm: u64,
    /// Start of the running interval.
    pub start_ns: u64,
    /// Entry time of the syscall in progress.
    pub sys_start_ns: u64,
    /// First argument of the syscall in progress (the fd of the read/write family).
    pub sys_arg0: u64,
    /// User address of the path of an open in progress (open, openat, openat2, creat), else
    /// 0: sys_exit names the new fd with it (`FD_NAMES`).
    pub sys_path: u64,
    pub tgid: u32,
    /// One of `PHASE_*`.
    pub phase: u32,
    /// Syscall in progress, or [`NO_SYSCALL`]; trusted only when it began after the syscall
    /// programs last came off ([`nr_since`], `SYS_OFF_AT_MAP`).
    pub sys_nr: i32,
    /// The syscall whose row the thread holds in its slot (`SysHeld`), else [`NO_SYSCALL`];
    /// the syscall it made last and how many times running (see [`SYS_HOLD_RUN`]; the run
    /// of a held syscall is not kept). Beside `sys_nr`, which `sys_exit` reads anyway, so that
    /// a call of another syscall costs a compare and two stores, not a look at the held row.
    pub sys_held_nr: i32,
    pub sys_last_nr: i32,
    pub sys_run: u32,
    /// The fd a blocking switch-out's syscall had as its first argument, plus one, where the
    /// wait has no kernel stack to say what it waits for (the walk failed: another stack held
    /// its slot in the stack map; or `GPUTRACE_OFFCPU_STACKS=0`), else 0. A read of a pipe is
    /// then told from a read of a disk by the file (`WallKey::fd1`).
    pub off_fd1: u32,
    /// CUDA category while inside a CUDA call, else [`crate::time::NO_OVERRIDE`].
    pub override_cat: u32,
    /// Captured at the last switch-out, for the blocked/runqueue interval that follows.
    pub off_state: u32,
    pub off_sys_nr: i32,
    pub off_kstack: i32,
    pub off_ustack: i32,
    /// 1 once the thread's on-CPU row exists in `WALL` (written at its first switch-out).
    pub cpu_row: u32,
    /// The thread's id: in `THREAD_SLOTS_MAP`, 0 marks a free slot.
    pub tid: u32,
    /// When the thread last left the CPU (the start of its off-CPU interval, for the timeline).
    pub off_ns: u64,
    /// The scheduler's sum of the thread's runqueue waits (`sched_info.run_delay`) when it
    /// last left the CPU, or [`RUN_DELAY_UNKNOWN`]: where no `sched_wakeup` program runs, the
    /// part of a wait it spent runnable is told at its switch-in from this and the kernel's
    /// own accounting (see the eBPF crate's `sched::queued_ns`).
    pub off_run_delay: u64,
    /// The stacks walked for the thread's last waits: blocking again in one of them soon
    /// after reuses its stacks instead of walking again. Several, because a thread often
    /// cycles through a few waits (a loader's read and its write to a pipe; a trainer reading
    /// two producers' pipes in turn, with a sync between).
    pub walked: [Walked; WALK_SLOTS],
    /// The Python stack at the last blocking switch-out.
    pub off_pystack: u64,
    /// Set at a switch-out into a wait on the GIL: the `PyThreadState *` holding it then, or
    /// [`GIL_HOLDER_UNKNOWN`]; 0 for any other wait.
    pub off_gil: u64,
    /// Where the CUDA call in progress was made: its Python stack, native user stack and
    /// function id (`tracer_common::cuda` fid), captured at the outermost entry.
    pub cuda_pystack: u64,
    pub cuda_ustack: i32,
    pub cuda_fid: i32,
    /// Closed intervals not yet added to `WALL`: plain on-CPU time, and time in one CUDA call
    /// site (category, function, stacks in `held_*`). A thread that launches a million kernels
    /// between two context switches alternates between these two rows; summing them here
    /// saves two hash updates per call. On-CPU time is written out at the first switch-out
    /// (which creates its row while `WALL` has room) and at death, CUDA time when the call
    /// site changes and at death.
    /// User space adds what is held to the open rows at the end ([`ThreadState::held_rows`]).
    pub held_cpu: WallVal,
    pub held_cuda: WallVal,
    pub held_pystack: u64,
    pub held_cat: u32,
    pub held_fid: i32,
    pub held_ustack: i32,
    /// The fd of the thread's last per-file syscall and that fd's open generation (`FD_GEN`),
    /// good while no traced process has closed an fd since (`fd_epoch` against `FD_EPOCH`):
    /// a reader looping on one fd skips a hash lookup per call. Also the file whose I/O
    /// `held_file` holds.
    pub fd_cached: i32,
    pub fd_gen: u32,
    /// `--cuda-entry-only`: the CUDA function (fid) the thread last called and its calls not
    /// yet added to its `CUDA_API` row (`held_api_count`): a thread launching one kernel
    /// function a million times counts them here, with no hash lookup per call. Written out
    /// when the function changes, at death and before a stale state is replaced; user space
    /// adds what is held at the end.
    pub held_api_fid: i32,
    pub fd_epoch: u64,
    /// Off-CPU time of the thread's last wait, not yet added to `WALL`: its blocked and its
    /// runqueue row (`wait_key`). A thread that blocks again and again in the same wait (a
    /// reader on one fd, a ping-pong on one futex) then charges its waits without a hash
    /// lookup at its wakeup and at its switch-in. Written out when the wait changes, at death
    /// and before a stale state is replaced; user space adds what is held at the end.
    pub held_wait: Wait,
    pub held_blocked: WallVal,
    pub held_runqueue: WallVal,
    /// Per-file I/O of the thread's last file (`fd_cached` of open generation `fd_gen`) not
    /// yet added to its `FILEIO` row. The row itself is written at the first call on a file
    /// (so the file can be named while it is open); later calls on it are summed here and
    /// written out when the thread turns to another file, at death and before a stale state
    /// is replaced. User space adds what is held at the end ([`ThreadState::held_file`]).
    pub held_file: FdStat,
    /// Bytes of block I/O the thread submitted to device `bio_dev` (`u32::MAX`: none yet) not
    /// yet added to its process's `BLOCK_IO` row: as `held_file`, the row is written at the
    /// first bio to a device and later ones are summed here ([`ThreadState::held_bio`]).
    pub bio_dev: u32,
    /// Syscalls in the current block, and when it started (`SYS_STORM_CALLS` in the eBPF
    /// crate's syscalls.rs, `crate::proc::SYS_STORM_WINDOW_NS`).
    pub sys_calls: u32,
    pub held_bio_read: u64,
    pub held_bio_write: u64,
    pub held_api_count: u64,
    pub sys_block_ns: u64,
    /// 1 while the held syscall's (`sys_held_nr`) calls come fast and are timed 1 in
    /// `2^SYS_TIME_SHIFT`; its calls in the pacing window under way, and when that began (see
    /// [`SYS_TIME_GAP_NS`]).
    pub sys_fast: u32,
    pub sys_since: u32,
    pub sys_timed_ns: u64,
    /// `start_ns` when an untimed call began; the first switch-out after it, while still in
    /// that running interval, stamps its own time here with [`SYS_LEFT_CPU`]: at the call's
    /// exit, the time since is a lower bound of its latency, for the max and the timeline.
    pub sys_in_ns: u64,
}

/// A thread whose held syscall (`ThreadState::sys_held_nr`, a run of one syscall) came
/// faster than once in this many ns on average over its last 256 calls or more (`pace` in the
/// eBPF crate's syscalls.rs) has each of its next calls timed
/// with a chance of 1 in `2^SYS_TIME_SHIFT` (an eBPF global, 0: all timed), drawn at its entry:
/// an untimed call is counted (and its bytes, errors and file) but reads no clock at its
/// entry or exit (~40 ns each on the development VM), and a timed one adds its latency
/// `2^SYS_TIME_SHIFT` times to the sums and the histogram (an unbiased estimate; `min_ns` is
/// the timed calls'). An untimed call that left the CPU reads the clock at its exit: the time
/// since it first left (`ThreadState::sys_in_ns`) counts in `max_ns` and draws it on the
/// timeline, so the one slow call of a fast run is not missed 7 times in 8; not in the sums.
/// `SysStat::timed` and `FdStat::timed` count the timed ones.
pub const SYS_TIME_GAP_NS: u64 = 200_000;
/// Marks `ThreadState::sys_in_ns` as the time an untimed call first left the CPU (no clock
/// reaches bit 63).
pub const SYS_LEFT_CPU: u64 = 1 << 63;

/// SplitMix64's finalizer: every bit of `x` moves every bit of the result (a fast run's draws
/// of which calls to time, see [`SYS_TIME_GAP_NS`]).
#[inline(always)]
pub fn mix64(x: u64) -> u64 {
    let x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The default `SYS_TIME_SHIFT` below `--max-overhead 100%`: 1 call in 8 timed.
pub const SYS_TIME_SHIFT: u32 = 3;

/// Stacks walked at a blocking switch-out, and the wait they were walked for: the syscall,
/// its first argument (fd, futex word) and when.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Walked {
    pub ns: u64,
    pub arg0: u64,
    pub sys_nr: i32,
    /// Ids of the kernel stack (`KSTACKS`) and user stack (`STACKS`, or a young processes' map
    /// for an id with `crate::cpu::YOUNG_STACK_BIT`: `crate::cpu::UserStack`); negative: none.
    pub kstack: i32,
    pub ustack: i32,
    /// How many walks in a row for this wait found the stacks the one before had: each
    /// doubles how long these are reused ([`Walked::reuse_ns`]), up to [`STEADY_MAX`].
    pub steady: u32,
    /// The Python stack (`PY_STACKS` key) walked with them, 0 for none.
    pub pystack: u64,
}

impl Walked {
    pub const NONE: Walked = Walked {
        ns: 0,
        arg0: 0,
        sys_nr: NO_SYSCALL,
        kstack: -1,
        ustack: -1,
        steady: 0,
        pystack: 0,
    };

    /// Whether these were walked for a wait in syscall `sys_nr` on `arg0`.
    #[inline(always)]
    pub fn is_for(&self, sys_nr: i32, arg0: u64) -> bool {
        self.sys_nr == sys_nr && self.arg0 == arg0
    }

    /// Whether a thread blocking at `now` in syscall `sys_nr` on `arg0` may reuse these.
    /// `seen`: 1 when its syscall was seen ([`seen_since`]), 0 when the syscall programs were
    /// off as it began: then all of its waits look alike, and none reuses another's walk.
    #[inline(always)]
    pub fn reusable(&self, sys_nr: i32, arg0: u64, now: u64, seen: u64) -> bool {
        self.is_for(sys_nr, arg0)
            && now.saturating_sub(self.ns) < self.reuse_ns() * seen
            && (self.kstack >= 0 || lasting_walk_error(self.kstack))
    }

    /// How long after their walk these stacks are reused: [`STACK_REUSE_NS`], doubled for
    /// each walk in a row that found what the one before had.
    #[inline(always)]
    pub fn reuse_ns(&self) -> u64 {
        STACK_REUSE_NS << self.steady.min(STEADY_MAX)
    }

    /// [`Walked::steady`] for a new walk for the wait in syscall `sys_nr` on `arg0` that
    /// found stacks `kstack` and `ustack`, taking the place of these: one more when these
    /// were that wait's and found the same, 0 otherwise (another wait, other stacks, a
    /// failed walk).
    #[inline(always)]
    pub fn steady_after(&self, sys_nr: i32, arg0: u64, kstack: i32, ustack: i32) -> u32 {
        if self.is_for(sys_nr, arg0)
            && kstack >= 0
            && self.kstack == kstack
            && self.ustack == ustack
        {
            (self.steady + 1).min(STEADY_MAX)
        } else {
            0
        }
    }
}

/// A stack walk's error that walking again would meet again: another stack holds the slot
/// of this one in the stack map (-EEXIST; stacks stay there for the trace), or the map is full
/// (-ENOMEM). A walk that failed so is reused like a stack (its drop counted again at each
/// reuse): walking again at every switch cost a loader 2.8 us a switch, 4% of its time, in a
/// data demo whose reads' stack had lost its slot (18,880 collisions in 10 s).
#[inline(always)]
pub const fn lasting_walk_error(id: i32) -> bool {
    id == -17 || id == -12
}

/// What tells one off-CPU row of a thread from another: where the thread left the CPU
/// (`ThreadState::off_*`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wait {
    pub sys_nr: i32,
    pub kstack: i32,
    pub ustack: i32,
    pub state: u32,
    pub pystack: u64,
    pub gil: u64,
    /// `ThreadState::off_fd1` (64 bits: no padding to zero, which made the scheduler program
    /// call `memset` past the older kernels' 512-byte stack).
    pub fd1: u64,
}

/// Fds under this are kept in `ThreadState::off_fd1`: a first argument past it is no fd (a
/// futex word's address), and would split a thread's rows by address.
pub const FD1_LIMIT_BITS: u32 = 20;

/// `ThreadState::off_fd1` at a switch-out into `phase` with kernel stack `kstack`, in
/// syscall `nr` (negative: none, or unseen) whose first argument is `arg0`: `arg0 + 1` for a
/// blocked wait with no stack, in a syscall under 64 whose bit is set in `fd_mask` (those
/// that take an fd first), with an argument under 2^[`FD1_LIMIT_BITS`]; else 0. Only those:
/// any other value would split the thread's rows (a `wait4` per child pid) for nothing.
/// Branch-free, for the scheduler programs (see [`seen_since`]).
#[inline(always)]
pub fn unwalked_fd1(phase: u32, kstack: i32, nr: i32, fd_mask: u64, arg0: u64) -> u32 {
    let other = phase ^ PHASE_BLOCKED;
    let blocked = 1 - ((other | other.wrapping_neg()) >> 31);
    let no_stack = (kstack as u32) >> 31;
    let high = arg0 >> FD1_LIMIT_BITS;
    let small = 1 - ((high | high.wrapping_neg()) >> 63) as u32;
    // A negative `nr` is over 63 as a u32.
    let over = (nr as u32) >> 6;
    let low = 1 - ((over | over.wrapping_neg()) >> 31);
    let fd_call = ((fd_mask >> ((nr as u32) & 63)) & 1) as u32 & low;
    (arg0 as u32).wrapping_add(1) * (blocked & no_stack & small & fd_call)
}

/// 1 when a thread's last syscall, begun at `sys_start_ns`, began after the syscall programs
/// last came off at `off_at` (or they never did: 0), else 0: then it may have ended unseen, or
/// another begun unseen. Without a branch, for the scheduler programs, which are near the
/// verifier's limit on explored states (a branch doubles the states of everything after it):
/// `off_at - start - 1` has its top bit set exactly when `start >= off_at`, for timestamps far
/// under 2^63 apart.
#[inline(always)]
pub fn seen_since(sys_start_ns: u64, off_at: u64) -> u64 {
    off_at.wrapping_sub(sys_start_ns).wrapping_sub(1) >> 63
}

/// The syscall a thread is in (`sys_nr`, [`NO_SYSCALL`] for none) when [`seen_since`] says
/// it would have been seen, else [`SYSCALL_UNSEEN`]. Branch-free as that.
#[inline(always)]
pub fn nr_since(sys_nr: i32, sys_start_ns: u64, off_at: u64) -> i32 {
    let keep = (seen_since(sys_start_ns, off_at) as i32).wrapping_neg();
    (sys_nr & keep) | (SYSCALL_UNSEEN & !keep)
}

impl ThreadState {
    /// Every user stack id the state holds for rows still to be written (where the thread
    /// left the CPU, its CUDA call's site, what it holds, its reusable walks): a stack freed
    /// from its map while a state holds it would be written out with no stack, or another's.
    pub fn user_stacks(&self) -> impl Iterator<Item = i32> + '_ {
        [
            self.off_ustack,
            self.cuda_ustack,
            self.held_ustack,
            self.held_wait.ustack,
        ]
        .into_iter()
        .chain(self.walked.iter().map(|w| w.ustack))
    }

    /// Thread `tid` accounted from `born_ns` in `phase`, in no syscall and with no stacks yet.
    #[inline(always)]
    pub const fn new(born_ns: u64, tid: u32, tgid: u32, phase: u32) -> Self {
        ThreadState {
            born_ns,
            proc_born_ns: born_ns,
            image_mm: 0,
            start_ns: born_ns,
            sys_start_ns: 0,
            sys_arg0: 0,
            sys_path: 0,
            tgid,
            phase,
            sys_nr: NO_SYSCALL,
            sys_held_nr: NO_SYSCALL,
            sys_last_nr: NO_SYSCALL,
            sys_run: 0,
            off_fd1: 0,
            override_cat: crate::time::NO_OVERRIDE,
            off_state: 0,
            off_sys_nr: NO_SYSCALL,
            off_kstack: -1,
            off_ustack: -1,
            cpu_row: 0,
            tid,
            off_ns: 0,
            off_run_delay: RUN_DELAY_UNKNOWN,
            walked: [Walked::NONE; WALK_SLOTS],
            off_pystack: 0,
            off_gil: 0,
            cuda_pystack: 0,
            cuda_ustack: -1,
            cuda_fid: -1,
            held_cpu: WallVal { ns: 0, count: 0 },
            held_cuda: WallVal { ns: 0, count: 0 },
            held_pystack: 0,
            held_cat: 0,
            held_fid: -1,
            held_ustack: -1,
            fd_cached: -1,
            fd_gen: 0,
            held_api_fid: -1,
            // Never an epoch: the first per-file call looks the generation up.
            fd_epoch: u64::MAX,
            held_wait: Wait {
                sys_nr: NO_SYSCALL,
                kstack: -1,
                ustack: -1,
                state: 0,
                pystack: 0,
                gil: 0,
                fd1: 0,
            },
            held_blocked: WallVal { ns: 0, count: 0 },
            held_runqueue: WallVal { ns: 0, count: 0 },
            held_file: FdStat {
                ns: 0,
                bytes: 0,
                calls: 0,
                timed: 0,
            },
            bio_dev: u32::MAX,
            sys_calls: 0,
            held_bio_read: 0,
            held_bio_write: 0,
            held_api_count: 0,
            sys_block_ns: 0,
            sys_fast: 0,
            sys_since: 0,
            sys_timed_ns: 0,
            sys_in_ns: 0,
        }
    }

    /// The `BLOCK_IO` row (process, device) of the bio bytes the thread holds, and the bytes
    /// read and written.
    pub fn held_bio(&self) -> Option<(BlkKey, u64, u64)> {
        (self.held_bio_read != 0 || self.held_bio_write != 0).then_some((
            BlkKey {
                tgid: self.tgid,
                dev: self.bio_dev,
            },
            self.held_bio_read,
            self.held_bio_write,
        ))
    }

    /// The `FILEIO` row of the file I/O the thread holds, and what it holds.
    pub fn held_file(&self) -> Option<(FdKey, FdStat)> {
        (self.held_file.calls != 0).then_some((
            FdKey {
                tgid: self.tgid,
                fd: self.fd_cached,
                gen: self.fd_gen,
                _pad: 0,
            },
            self.held_file,
        ))
    }

    /// The plain on-CPU row of this thread.
    #[inline(always)]
    pub fn cpu_key(&self, tid: u32) -> WallKey {
        WallKey {
            born_ns: self.born_ns,
            tgid: self.tgid,
            tid,
            kind: crate::time::Category::Cpu as u32,
            sys_nr: -1,
            kstack: -1,
            ustack: -1,
            state: 0,
            fd1: 0,
            pystack: 0,
            gil: 0,
        }
    }

    /// The row of the CUDA call site whose time is held in `held_cuda`.
    #[inline(always)]
    pub fn held_cuda_key(&self, tid: u32) -> WallKey {
        let mut key = self.cpu_key(tid);
        key.kind = self.held_cat;
        key.sys_nr = self.held_fid;
        key.ustack = self.held_ustack;
        key.pystack = self.held_pystack;
        key
    }

    /// Whether the running interval's row is the one whose time `held_cuda` holds.
    #[inline(always)]
    pub fn running_is_held_cuda(&self) -> bool {
        self.override_cat != crate::time::NO_OVERRIDE
            && self.held_cuda.count != 0
            && self.held_cat == self.override_cat
            && self.held_fid == self.cuda_fid
            && self.held_ustack == self.cuda_ustack
            && self.held_pystack == self.cuda_pystack
    }

    /// Whether the wait whose time the thread holds is the one it is in (`current_wait`),
    /// field by field: a `Wait` built on the stack to compare made the scheduler program's
    /// frames too deep for the older kernels' 512 bytes.
    #[inline(always)]
    pub fn holds_current_wait(&self) -> bool {
        let w = &self.held_wait;
        w.sys_nr == self.off_sys_nr
            && w.kstack == self.off_kstack
            && w.ustack == self.off_ustack
            && w.state == self.off_state
            && w.pystack == self.off_pystack
            && w.gil == self.off_gil
            && w.fd1 == self.off_fd1 as u64
    }

    /// Holds the wait the thread is in from now (`held_wait`).
    #[inline(always)]
    pub fn hold_current_wait(&mut self) {
        self.held_wait = self.current_wait();
    }

    /// The wait the thread is in now (meaningful off CPU).
    #[inline(always)]
    pub fn current_wait(&self) -> Wait {
        Wait {
            sys_nr: self.off_sys_nr,
            kstack: self.off_kstack,
            ustack: self.off_ustack,
            state: self.off_state,
            pystack: self.off_pystack,
            gil: self.off_gil,
            fd1: self.off_fd1 as u64,
        }
    }

    /// The row of blocked (`blocked`) or runqueue time in wait `w`.
    #[inline(always)]
    pub fn wait_key(&self, tid: u32, w: &Wait, blocked: bool) -> WallKey {
        let mut key = self.cpu_key(tid);
        key.sys_nr = w.sys_nr;
        key.kstack = w.kstack;
        key.ustack = w.ustack;
        key.pystack = w.pystack;
        if blocked {
            key.kind = KIND_BLOCKED;
            key.state = w.state;
            key.gil = w.gil;
            key.fd1 = w.fd1 as u32;
        } else {
            key.kind = crate::time::Category::Runqueue as u32;
            key.state = if w.state & 0xff == 0 {
                RQ_PREEMPTED
            } else {
                RQ_WOKEN
            };
        }
        key
    }

    /// The rows whose time the thread holds (see `held_cpu`, `held_wait`), as the kernel will
    /// write them.
    pub fn held_rows(&self, tid: u32) -> [(WallKey, WallVal); 4] {
        [
            (self.cpu_key(tid), self.held_cpu),
            (self.held_cuda_key(tid), self.held_cuda),
            (self.wait_key(tid, &self.held_wait, true), self.held_blocked),
            (
                self.wait_key(tid, &self.held_wait, false),
                self.held_runqueue,
            ),
        ]
    }

    /// The time-sum row the thread's running interval is charged to. One definition for the
    /// kernel side (which closes intervals as they end) and user space (which closes the ones
    /// still open at the end of the window), so both always agree.
    #[inline(always)]
    pub fn row_key(&self, tid: u32) -> WallKey {
        if self.override_cat == crate::time::NO_OVERRIDE && self.phase != PHASE_ONCPU {
            return self.wait_key(tid, &self.current_wait(), self.phase == PHASE_BLOCKED);
        }
        let mut key = self.cpu_key(tid);
        if self.override_cat != crate::time::NO_OVERRIDE {
            key.kind = self.override_cat;
            key.sys_nr = self.cuda_fid;
            key.ustack = self.cuda_ustack;
            key.pystack = self.cuda_pystack;
        }
        key
    }
}

/// The `prev_state` the `sched_switch` tracepoint reports (`__trace_sched_switch_state`),
/// worked out from what its raw tracepoint passes: `preempt` and the task's `__state`. One bit,
/// the highest of the task's reportable state: 0x1 S, 0x2 D, 0x4 T, 0x8 t, 0x10 X, 0x20 Z,
/// 0x40 P, 0x80 I (idle), 0x100 preempted; 0 for running (a yield).
///
/// The tracepoint also ORs in `exit_state`, which the raw arguments lack; the last switch of
/// an exiting task is the only one with `TASK_DEAD` set, and it reports that task as a zombie.
#[inline(always)]
pub fn report_state(preempt: bool, raw: u32) -> u32 {
    const TASK_REPORT: u32 = 0x7f;
    const TASK_DEAD: u32 = 0x80;
    const TASK_IDLE: u32 = 0x402;
    const TASK_RTLOCK_WAIT: u32 = 0x1000;
    const EXIT_ZOMBIE: u32 = 0x20;
    if preempt {
        return 0x100;
    }
    let mut state = raw & TASK_REPORT;
    if raw & TASK_DEAD != 0 {
        state |= EXIT_ZOMBIE;
    }
    if raw & TASK_IDLE == TASK_IDLE {
        state = 0x80;
    }
    if raw & TASK_RTLOCK_WAIT != 0 {
        state = 0x2;
    }
    // The highest set bit, unrolled: the BPF target has no count-leading-zeros instruction.
    let mut bit = 0x80;
    while bit != 0 {
        if state & bit != 0 {
            return bit;
        }
        bit >>= 1;
    }
    0
}

/// How many waits' walked stacks a thread keeps (`ThreadState::walked`).
pub const WALK_SLOTS: usize = 3;

/// How long walked stacks are reused for the same wait (ns), at first.
pub const STACK_REUSE_NS: u64 = 50_000_000;

/// The most doublings of [`STACK_REUSE_NS`] for a wait whose walks keep finding the same
/// stacks: a walk at least every 0.4 s, so a wait that changes (a read that starts blocking
/// on a lock where it blocked on the disk) is told apart again within that. A walk cost ~15
/// us on the development VM: a loader looping on one read walked ~20 times a second at 50 ms.
pub const STEADY_MAX: u32 = 3;

/// One row of the time sums.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WallKey {
    pub born_ns: u64,
    pub tgid: u32,
    pub tid: u32,
    /// A [`crate::time::Category`] id, or [`KIND_BLOCKED`].
    pub kind: u32,
    /// Syscall in progress when the thread left the CPU (off-CPU kinds); for CUDA kinds the
    /// function id of the call (`tracer_common::cuda`), else -1.
    pub sys_nr: i32,
    pub kstack: i32,
    pub ustack: i32,
    /// `prev_state` at switch-out for blocked time; `RQ_*` for runqueue time.
    pub state: u32,
    /// Blocked rows without a kernel stack: the wait's fd plus one (`ThreadState::off_fd1`),
    /// else 0.
    pub fd1: u32,
    /// The Python stack (`PY_STACKS` key) of off-CPU and CUDA rows, 0 for none.
    pub pystack: u64,
    /// Blocked rows waiting for the GIL: its holder's `PyThreadState *` at switch-out, or
    /// [`GIL_HOLDER_UNKNOWN`]; 0 otherwise.
    pub gil: u64,
}

impl WallKey {
    /// Blocked time the kernel saw waiting on the interpreter's GIL.
    pub fn gil_wait(&self) -> bool {
        self.kind == KIND_BLOCKED && self.gil != 0
    }
}

/// A GIL wait whose holder could not be read (the GIL was free at that instant: a race with
/// its release).
pub const GIL_HOLDER_UNKNOWN: u64 = u64::MAX;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WallVal {
    pub ns: u64,
    /// Intervals summed.
    pub count: u64,
}

/// A thread that died during the trace.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LifeKey {
    pub born_ns: u64,
    pub tid: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LifeVal {
    pub died_ns: u64,
    pub tgid: u32,
    pub _pad: u32,
    /// The thread's name as it died: a thread that named itself and ended between two looks
    /// at /proc is named by this.
    pub comm: [u8; 16],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SysKey {
    pub tgid: u32,
    pub tid: u32,
    pub nr: i32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SysStat {
    pub count: u64,
    pub errors: u64,
    /// Estimates where not every call was timed (`timed` < `count`: a fast run's calls timed 1
    /// in `2^SYS_TIME_SHIFT`, each timed one counted that many times): `total_ns`, `hist`.
    /// `min_ns` and `max_ns` are the timed calls'.
    pub total_ns: u64,
    pub min_ns: u64,
    pub max_ns: u64,
    pub bytes: u64,
    pub hist: [u64; HIST_BUCKETS],
    pub timed: u64,
}

impl SysStat {
    /// Adds another row of the same syscall (another thread's, or a retired copy's) into this
    /// one.
    pub fn add(&mut self, o: &SysStat) {
        if o.count == 0 {
            return;
        }
        if o.timed != 0 && (self.timed == 0 || o.min_ns < self.min_ns) {
            self.min_ns = o.min_ns;
        }
        self.max_ns = self.max_ns.max(o.max_ns);
        self.count += o.count;
        self.timed += o.timed;
        self.errors += o.errors;
        self.total_ns += o.total_ns;
        self.bytes += o.bytes;
        for (a, b) in self.hist.iter_mut().zip(o.hist.iter()) {
            *a += b;
        }
    }
}

/// A traced thread's row for one syscall, summed at its state's slot (`SYS_HELD_MAP`): a
/// thread looping on one syscall (a loader's `pread64`) then pays no hash lookup per call
/// (~45 ns of `sys_exit`'s ~250 on the development VM). Its other syscalls go to their
/// `SYSCALLS_MAP` rows as before. The row is written out there when the thread makes another
/// syscall [`SYS_HOLD_RUN`] times running (and the row is taken for that one), at its first
/// switch-out, at
/// its death, and when a stale state in its slot is replaced; user space adds the rows still
/// held at the end (`row`). Only a thread whose state is in its slot holds one: a spilled
/// thread shares the slot's index with the slot's owner, on another CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SysHeld {
    pub tgid: u32,
    /// 0: holds nothing.
    pub tid: u32,
    pub nr: i32,
    pub _pad: u32,
    pub stat: SysStat,
}

/// A thread's row is taken for a syscall it made this many times running
/// (`ThreadState::sys_run`), so that a thread cycling through a few syscalls does not write a
/// row out at every call (the write-out adds and clears the row's 38 words: a pipe ping-pong
/// paid ~200 ns more per syscall when every change of syscall took the row, and a getppid,
/// getppid, getuid, getuid loop ~100 when the second call running did).
pub const SYS_HOLD_RUN: u32 = 4;

impl SysHeld {
    /// The row this holds, if any.
    pub fn row(&self) -> Option<(SysKey, SysStat)> {
        (self.tid != 0 && self.stat.count != 0).then_some((
            SysKey {
                tgid: self.tgid,
                tid: self.tid,
                nr: self.nr,
                _pad: 0,
            },
            self.stat,
        ))
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ErrnoKey {
    pub tgid: u32,
    pub tid: u32,
    pub nr: i32,
    pub errno: i32,
}

/// I/O syscalls per file descriptor (resolved to a path in user space). `gen` counts the
/// successful `close`s of this fd number before the calls, so a reused fd number is a new row.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FdKey {
    pub tgid: u32,
    pub fd: i32,
    pub gen: u32,
    pub _pad: u32,
}

/// The path a file was opened by, as the program passed it (NUL-terminated; relative paths
/// are relative to the opener's working directory or `openat`'s directory fd), for the file
/// `key` (its `FILEIO` row's key). A file opened, read and closed between two of user space's
/// looks at `/proc/PID/fd` (a data loader reading one file per sample) is named by this.
///
/// Kept in the array `FD_NAMES`, in one of the [`FD_NAME_WAYS`] slots of its key's set
/// ([`FdName::set`]): the first free one, else one of a process that exited, else its home
/// slot ([`FdName::slot`]), whose file is then unnamed, not misnamed (a slot holds its key;
/// only two opens on two CPUs writing one slot at the same instant could mix). With one slot per key, a loader's 130 opens lost
/// a name in about 4 runs of 10 (any two keys sharing a slot); with sets of four it takes
/// five keys in one set. On the development VM a hash-map update costs ~1 µs, an open ~3.5 µs.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FdName {
    pub key: FdKey,
    pub path: [u8; FD_NAME_LEN],
}

/// The first byte of an `FD_NAMES` slot that names no path but the file of another fd of the
/// process: a dup (`dup`, `dup2`, `dup3`, fcntl `F_DUPFD`) put that fd's file under this one
/// ([`FdName::dup_of`]). No path begins with it.
pub const FD_DUP_MARK: u8 = 1;

impl FdName {
    /// The fd and generation whose file a dup put under this slot's key, for a slot
    /// that says so ([`FD_DUP_MARK`]): `path[1..5]` the fd, `path[5..9]` its generation.
    pub fn dup_of(&self) -> Option<(i32, u32)> {
        if self.path[0] != FD_DUP_MARK {
            return None;
        }
        let word = |i: usize| {
            [
                self.path[i],
                self.path[i + 1],
                self.path[i + 2],
                self.path[i + 3],
            ]
        };
        Some((i32::from_le_bytes(word(1)), u32::from_le_bytes(word(5))))
    }

    /// The path up to its NUL (none for a slot that names a dup's source).
    pub fn bytes(&self) -> &[u8] {
        if self.path[0] == FD_DUP_MARK {
            return &[];
        }
        let end = self
            .path
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(FD_NAME_LEN);
        &self.path[..end]
    }

    /// The first slot of the set of `FD_NAME_WAYS` slots where the file `key` may be named.
    #[inline(always)]
    pub fn set(key: &FdKey) -> u32 {
        Self::slot(key) & !(FD_NAME_WAYS - 1)
    }

    /// The home slot of the file `key` in `FD_NAMES`: taken when its set is full.
    #[inline(always)]
    pub fn slot(key: &FdKey) -> u32 {
        // All of the key's bits mixed (murmur3's finaliser): a multiplicative hash alone put
        // one fd's generations onto another fd's, and a loader's files on fd 3 took the slots
        // of the interpreter's on fd 4.
        let mut k = ((key.tgid as u64) << 32 | key.fd as u32 as u64)
            ^ (key.gen as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        k ^= k >> 33;
        k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
        k ^= k >> 33;
        k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        k ^= k >> 33;
        (k % FD_NAMES_ENTRIES as u64) as u32
    }
}

/// (tgid, fd) -> closes of that fd number so far, in `FD_GEN`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FdGenKey {
    pub tgid: u32,
    pub fd: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FdStat {
    /// An estimate where not every call was timed (`timed` < `calls`; see `SysStat::timed`).
    pub ns: u64,
    pub bytes: u64,
    pub calls: u64,
    pub timed: u64,
}

impl FdStat {
    /// Adds another row of the same file into this one.
    pub fn add(&mut self, o: &FdStat) {
        self.ns += o.ns;
        self.bytes += o.bytes;
        self.calls += o.calls;
        self.timed += o.timed;
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlkInflightKey {
    pub sector: u64,
    pub dev: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlkInflight {
    pub insert_ns: u64,
    pub issue_ns: u64,
    pub tgid: u32,
    /// 0 read, 1 write, 2 neither (discard, flush).
    pub write: u32,
    pub bytes: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlkKey {
    pub tgid: u32,
    pub dev: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlkStat {
    pub requests: u64,
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub total_ns: u64,
    pub queue_ns: u64,
    /// Read and written bytes of the requests seen completing (under the disk's device where
    /// `read_bytes`/`write_bytes` are under the partition's): what falls short of those was
    /// submitted and never seen completing.
    pub done_bytes: u64,
    pub hist: [u64; HIST_BUCKETS],
    /// The requests counted, each once: `requests` counts each by its weight (`2^shift` while
    /// they are sampled), so this is what was seen of them.
    pub seen: u64,
    /// The sum over the counted requests of `w * (w - 1)` (`w` their weight): an unbiased
    /// estimate of the variance of `requests` as an estimate of all of them (0: exact).
    pub var: u64,
}

impl BlkStat {
    /// Adds another copy of the row (another CPU's) into this one.
    pub fn add(&mut self, o: &BlkStat) {
        self.requests += o.requests;
        self.reads += o.reads;
        self.writes += o.writes;
        self.read_bytes += o.read_bytes;
        self.write_bytes += o.write_bytes;
        self.total_ns += o.total_ns;
        self.queue_ns += o.queue_ns;
        self.done_bytes += o.done_bytes;
        self.seen += o.seen;
        self.var += o.var;
        for (a, b) in self.hist.iter_mut().zip(o.hist.iter()) {
            *a += b;
        }
    }
}

crate::user_pod!(
    ThreadState,
    WallKey,
    WallVal,
    LifeKey,
    LifeVal,
    SysKey,
    SysStat,
    SysHeld,
    ErrnoKey,
    FdKey,
    FdGenKey,
    FdStat,
    FdName,
    BlkKey,
    BlkStat,
    BlockSample
);

/// log2 bucket of a latency, without loops (the verifier wants bounded code).
#[inline(always)]
pub fn log2_bucket(v: u64) -> usize {
    let mut v = v;
    let mut r = 0usize;
    if v >= 1 << 32 {
        v >>= 32;
        r += 32;
    }
    if v >= 1 << 16 {
        v >>= 16;
        r += 16;
    }
    if v >= 1 << 8 {
        v >>= 8;
        r += 8;
    }
    if v >= 1 << 4 {
        v >>= 4;
        r += 4;
    }
    if v >= 1 << 2 {
        v >>= 2;
        r += 2;
    }
    if v >= 1 << 1 {
        r += 1;
    }
    if r >= HIST_BUCKETS {
        HIST_BUCKETS - 1
    } else {
        r
    }
}

#[cfg(test)]
mod tests {
    use super::{block_selected, BLOCK_SHIFT_MAX};

    /// Sequential 32 KiB reads' sectors (multiples of 64), as a data loader makes them.
    fn sectors() -> impl Iterator<Item = u64> {
        (0..65_536u64).map(|i| 1_000_000 + i * 64)
    }

    #[test]
    fn block_sampling_picks_its_share_of_sequential_sectors() {
        for shift in 1..=BLOCK_SHIFT_MAX {
            let n = sectors().filter(|&s| block_selected(s, 7, shift)).count() as f64;
            let want = 65_536.0 / (1u64 << shift) as f64;
            // Binomial: within 5 standard deviations.
            assert!(
                (n - want).abs() < 5.0 * want.sqrt(),
                "shift {shift}: {n} of 65,536"
            );
        }
        assert_eq!(
            sectors().filter(|&s| block_selected(s, 7, 0)).count(),
            65_536
        );
    }

    #[test]
    fn a_larger_shift_picks_among_a_smaller_ones_picks() {
        let six = sectors().filter(|&s| block_selected(s, 3, 6)).count();
        assert!(six > 0);
        assert!(sectors()
            .filter(|&s| block_selected(s, 3, 6))
            .all(|s| block_selected(s, 3, 4)));
    }

    #[test]
    fn a_fast_runs_draws_time_one_call_in_eight_independently() {
        use super::mix64;
        // As `sys_enter` draws: call k of a pacing window begun at clock `t` is timed when
        // the top 3 bits of its hash are 0. Over many windows, 1 call in 8 is timed, and two
        // calls in a row 1 pair in 64 (consecutive draws independent).
        let (mut calls, mut timed, mut pairs) = (0u64, 0u64, 0u64);
        let mut t = 1_234_567_891_011u64;
        for _ in 0..2_000 {
            let mut last = false;
            for k in 0..256u64 {
                let hit = mix64(t.wrapping_add(k.wrapping_mul(0x9E37_79B9_7F4A_7C15))) >> 61 == 0;
                calls += 1;
                timed += hit as u64;
                pairs += (hit && last) as u64;
                last = hit;
            }
            // The next window's start: ~28 ms later, with noise in its low bits.
            t += 28_000_000 + (mix64(t) & 0xfff);
        }
        let share = timed as f64 / calls as f64;
        assert!((share - 0.125).abs() < 0.004, "{timed} of {calls}");
        let pair_share = pairs as f64 / calls as f64;
        assert!(
            (pair_share - 1.0 / 64.0).abs() < 0.002,
            "{pairs} pairs of {calls}"
        );
    }

    #[test]
    fn another_salt_is_another_draw() {
        let (x, y) = (0x1234_5678_9abc_def0, 0x0fed_cba9_8765_4321);
        let a = sectors().filter(|&s| block_selected(s, x, 4)).count() as f64;
        let both = sectors()
            .filter(|&s| block_selected(s, x, 4) && block_selected(s, y, 4))
            .count() as f64;
        // Independent draws share ~1/16 of their picks.
        let want = a / 16.0;
        assert!(
            (both - want).abs() < 5.0 * want.sqrt() + 5.0,
            "{both} shared of {a}"
        );
    }

    #[test]
    fn an_fd_is_kept_for_blocked_waits_without_a_stack() {
        use super::{unwalked_fd1, PHASE_BLOCKED, PHASE_ONCPU, PHASE_RUNNABLE, SYSCALL_UNSEEN};
        // read (0) and recvfrom (45) take an fd first; wait4 (61) does not.
        let mask = 1 | 1 << 45;
        let f = |phase, kstack, nr, arg0| unwalked_fd1(phase, kstack, nr, mask, arg0);
        assert_eq!(f(PHASE_BLOCKED, -17, 0, 5), 6, "the walk failed");
        assert_eq!(f(PHASE_BLOCKED, -1, 45, 0), 1, "no walk; fd 0 is an fd");
        assert_eq!(
            f(PHASE_BLOCKED, 42, 0, 5),
            0,
            "its stack says what it waits for"
        );
        assert_eq!(f(PHASE_BLOCKED, 0, 0, 5), 0, "stack id 0 is a stack");
        assert_eq!(f(PHASE_RUNNABLE, -1, 0, 5), 0, "preempted: no wait");
        assert_eq!(f(PHASE_ONCPU, -1, 0, 5), 0);
        assert_eq!(f(PHASE_BLOCKED, -1, 0, (1 << 20) - 1), 1 << 20);
        assert_eq!(f(PHASE_BLOCKED, -1, 0, 1 << 20), 0, "not an fd");
        assert_eq!(f(PHASE_BLOCKED, -1, 0, 0x7f12_3456_7000), 0, "an address");
        assert_eq!(f(PHASE_BLOCKED, -1, 61, 1234), 0, "wait4's pid is no fd");
        assert_eq!(f(PHASE_BLOCKED, -1, 64, 5), 0, "only syscalls under 64");
        assert_eq!(f(PHASE_BLOCKED, -1, 64 + 45, 5), 0);
        assert_eq!(
            f(PHASE_BLOCKED, -1, -1, 5),
            0,
            "no syscall: a stale argument"
        );
        assert_eq!(f(PHASE_BLOCKED, -1, SYSCALL_UNSEEN, 5), 0);
        assert_eq!(unwalked_fd1(PHASE_BLOCKED, -1, 0, 0, 5), 0, "no mask: off");
    }

    #[test]
    fn a_held_syscall_row_is_one_only_while_it_holds_calls() {
        let mut h = super::SysHeld::default();
        assert_eq!(h.row(), None);
        h.tgid = 7;
        h.tid = 8;
        h.nr = 17;
        assert_eq!(h.row(), None, "tagged, no calls yet");
        h.stat.count = 3;
        h.stat.total_ns = 300;
        let (k, s) = h.row().unwrap();
        assert_eq!(
            (k.tgid, k.tid, k.nr, s.count, s.total_ns),
            (7, 8, 17, 3, 300)
        );
        h.tid = 0;
        assert_eq!(h.row(), None, "an empty slot");
    }

    use super::{
        report_state, BlkStat, FdKey, FdName, FD_NAMES_ENTRIES, FD_NAME_LEN, FD_NAME_WAYS,
    };

    #[test]
    fn a_walk_that_would_fail_again_is_reused_as_a_stack_is() {
        use super::{Walked, STACK_REUSE_NS};
        let walked = |kstack| Walked {
            ns: 1_000,
            arg0: 5,
            sys_nr: 17,
            kstack,
            ..Walked::NONE
        };
        let soon = 1_000 + STACK_REUSE_NS - 1;
        assert!(walked(42).reusable(17, 5, soon, 1));
        // Another stack holds its slot, or the map is full: walking again fails again.
        assert!(walked(-17).reusable(17, 5, soon, 1));
        assert!(walked(-12).reusable(17, 5, soon, 1));
        // Never walked, or a fault: walked again.
        assert!(!Walked::NONE.reusable(17, 5, soon, 1));
        assert!(!walked(-14).reusable(17, 5, soon, 1));
        // Stale, another wait, or the syscall unseen: walked again.
        assert!(!walked(-17).reusable(17, 5, 1_000 + STACK_REUSE_NS, 1));
        assert!(!walked(-17).reusable(17, 6, soon, 1));
        assert!(!walked(42).reusable(17, 5, soon, 0));
    }

    #[test]
    fn a_wait_whose_walks_agree_is_walked_less_often() {
        use super::{Walked, STACK_REUSE_NS, STEADY_MAX};
        let mut w = Walked {
            ns: 1_000,
            arg0: 5,
            sys_nr: 17,
            kstack: 42,
            ustack: 7,
            ..Walked::NONE
        };
        assert_eq!(w.reuse_ns(), STACK_REUSE_NS);
        // The same stacks again: twice as long, up to 2^STEADY_MAX times.
        for n in 1..=STEADY_MAX + 2 {
            w.steady = w.steady_after(17, 5, 42, 7);
            assert_eq!(w.steady, n.min(STEADY_MAX));
        }
        assert_eq!(w.reuse_ns(), STACK_REUSE_NS << STEADY_MAX);
        assert_eq!(w.reuse_ns(), 400_000_000);
        assert!(w.reusable(17, 5, 1_000 + STACK_REUSE_NS * 7, 1));
        assert!(!w.reusable(17, 5, 1_000 + STACK_REUSE_NS * 8, 1));
        // Still never for an unseen syscall.
        assert!(!w.reusable(17, 5, 2_000, 0));
        // Other stacks, another wait, a failed walk: back to the first limit.
        assert_eq!(w.steady_after(17, 5, 43, 7), 0);
        assert_eq!(w.steady_after(17, 5, 42, 8), 0);
        assert_eq!(w.steady_after(17, 6, 42, 7), 0);
        assert_eq!(w.steady_after(1, 5, 42, 7), 0);
        let failed = Walked { kstack: -17, ..w };
        assert_eq!(failed.steady_after(17, 5, -17, 7), 0);
    }

    #[test]
    fn a_syscall_begun_before_the_programs_came_off_is_unseen() {
        use super::{nr_since, seen_since, NO_SYSCALL, SYSCALL_UNSEEN};
        // Never off: everything seen, a new thread (no syscall yet, start 0) included.
        assert_eq!(nr_since(0, 0, 0), 0);
        assert_eq!(nr_since(NO_SYSCALL, 0, 0), NO_SYSCALL);
        assert_eq!(nr_since(17, 5_000, 0), 17);
        // Off at 10,000: begun before (or unknown) is unseen, after is seen.
        assert_eq!(nr_since(17, 5_000, 10_000), SYSCALL_UNSEEN);
        assert_eq!(nr_since(NO_SYSCALL, 5_000, 10_000), SYSCALL_UNSEEN);
        assert_eq!(nr_since(NO_SYSCALL, 0, 10_000), SYSCALL_UNSEEN);
        assert_eq!(nr_since(17, 10_001, 10_000), 17);
        assert_eq!(nr_since(NO_SYSCALL, 10_001, 10_000), NO_SYSCALL);
        assert_eq!(seen_since(10_000, 10_000), 1);
        assert_eq!(seen_since(9_999, 10_000), 0);
        // Real clocks: a year of uptime.
        let t = 365 * 86_400 * 1_000_000_000u64;
        assert_eq!(seen_since(t + 1, t), 1);
        assert_eq!(seen_since(t - 1, t), 0);
        assert_eq!(seen_since(1, t), 0);
    }

    #[test]
    fn per_cpu_block_rows_sum_field_by_field() {
        let mut a = BlkStat {
            requests: 2,
            reads: 2,
            read_bytes: 8192,
            total_ns: 300,
            ..Default::default()
        };
        a.hist[8] = 2;
        let mut b = BlkStat {
            requests: 1,
            writes: 1,
            write_bytes: 4096,
            total_ns: 1000,
            queue_ns: 50,
            ..Default::default()
        };
        b.hist[9] = 1;
        a.add(&b);
        assert_eq!((a.requests, a.reads, a.writes), (3, 2, 1));
        assert_eq!((a.read_bytes, a.write_bytes), (8192, 4096));
        assert_eq!((a.total_ns, a.queue_ns), (1300, 50));
        assert_eq!((a.hist[8], a.hist[9]), (2, 1));
    }

    #[test]
    fn opened_paths_end_at_their_nul_and_spread_over_the_slots() {
        let mut n = FdName {
            key: FdKey {
                tgid: 7,
                fd: 3,
                gen: 0,
                _pad: 0,
            },
            path: [0; FD_NAME_LEN],
        };
        assert!(n.bytes().is_empty());
        n.path[..6].copy_from_slice(b"/a/b\0x");
        assert_eq!(n.bytes(), b"/a/b");
        n.path = [b'x'; FD_NAME_LEN];
        assert_eq!(n.bytes().len(), FD_NAME_LEN);
        assert_eq!(n.dup_of(), None);
        // A dup's source, as the exit program writes it: no path.
        n.path[0] = super::FD_DUP_MARK;
        n.path[1..9].copy_from_slice(&((7u64 << 32) | 3).to_le_bytes());
        assert_eq!(n.dup_of(), Some((3, 7)));
        assert!(n.bytes().is_empty());
        n.path = [b'x'; FD_NAME_LEN];
        // A loader reopening fd 3 for file after file: each generation its own slot, mostly.
        let mut slots = [0u32; 1000];
        for (gen, s) in slots.iter_mut().enumerate() {
            *s = FdName::slot(&FdKey {
                gen: gen as u32,
                ..n.key
            });
        }
        assert!(slots.iter().all(|&s| s < FD_NAMES_ENTRIES));
        slots.sort_unstable();
        let distinct = 1 + slots.windows(2).filter(|w| w[0] != w[1]).count();
        assert!(distinct > 950, "{distinct} distinct slots of 1000");
        // An interpreter's 50 files on fd 4, then a loader's 1,000 on fd 3: about 3 of the 50
        // slots taken by chance (1000 / 16384 each), not most of them.
        let taken = (0..50u32)
            .filter(|&g| {
                let s4 = FdName::slot(&FdKey {
                    fd: 4,
                    gen: g,
                    ..n.key
                });
                (0..1000u32).any(|g3| {
                    FdName::slot(&FdKey {
                        fd: 3,
                        gen: g3,
                        ..n.key
                    }) == s4
                })
            })
            .count();
        assert!(taken <= 10, "{taken} of 50 slots taken");
        // A loader's 132 opens (6 files, 22 rounds) in 100 processes, placed as sys_exit does
        // (first free slot of the set, else the home slot): a name is lost only when five keys
        // share a set, where one slot per key lost one in about 4 runs of 10.
        let mut lost = 0;
        for tgid in 1000..1100u32 {
            let mut slots = [FdKey {
                tgid: 0,
                fd: 0,
                gen: 0,
                _pad: 0,
            }; FD_NAMES_ENTRIES as usize];
            let mut placed = [FdKey { tgid: 0, ..n.key }; 132];
            for (i, p) in placed.iter_mut().enumerate() {
                let key = FdKey {
                    tgid,
                    fd: 3 + (i % 6) as i32,
                    gen: (i / 6) as u32,
                    _pad: 0,
                };
                let set = FdName::set(&key);
                let at = (set..set + FD_NAME_WAYS)
                    .find(|&j| slots[j as usize].tgid == 0)
                    .unwrap_or(FdName::slot(&key));
                slots[at as usize] = key;
                *p = key;
            }
            lost += placed
                .iter()
                .filter(|k| {
                    let set = FdName::set(k);
                    !(set..set + FD_NAME_WAYS).any(|j| slots[j as usize] == **k)
                })
                .count();
        }
        assert!(lost <= 2, "{lost} names lost in 100 traces");
    }

    #[test]
    fn switch_states_match_the_tracepoints() {
        assert_eq!(
            report_state(true, 0x1),
            0x100,
            "preempted, whatever the state"
        );
        assert_eq!(report_state(false, 0), 0, "yield: still running");
        assert_eq!(report_state(false, 0x1), 0x1, "S");
        assert_eq!(report_state(false, 0x2), 0x2, "D");
        assert_eq!(report_state(false, 0x102), 0x2, "TASK_KILLABLE is D");
        assert_eq!(report_state(false, 0x2001), 0x1, "freezable S is S");
        assert_eq!(report_state(false, 0x402), 0x80, "TASK_IDLE is I, not D");
        assert_eq!(report_state(false, 0x1000), 0x2, "rtlock wait is D");
        assert_eq!(report_state(false, 0x80), 0x20, "TASK_DEAD: exiting");
        assert_eq!(report_state(false, 0x40), 0x40, "parked");
        assert_eq!(report_state(false, 0x8), 0x8, "traced");
    }
}
