//! Wall-time accounting (issue 3): where every nanosecond of every traced thread went, with
//! syscall statistics, I/O per file and block I/O per device. The kernel side
//! (tracer-ebpf/src/{account,sched,syscalls,block}.rs) sums time per thread and reason; this
//! module seeds the threads that exist at attach, reads the sums at the end, classifies the
//! off-CPU time ([`classify`]), aggregates it ([`aggregate`]) and fills the report.

pub mod aggregate;
pub mod block_sample;
pub mod classify;
mod crosscheck;
pub(crate) mod fill;
pub mod render;
mod retire;
pub mod sites;
mod states;
pub mod syscall_gate;
pub mod syscall_names;
pub mod take;

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, Result};
use aya::{programs::Program, Ebpf, EbpfLoader};
use tracer_common::{
    python::PY_STACK_PENDING,
    wall::{ThreadState, PHASE_BLOCKED, PHASE_ONCPU, STOPPED_MAP},
};

pub use states::States;

use crate::{
    bpf,
    probes::{ktime_now, AttachCtx, FinishCtx, ProbeFamily},
    procfs,
    report::ReportData,
    tracefs::{self, Format},
    tracker::{Life, Tracker},
};

/// Folded stacks for the off-CPU and wall-clock flame graphs (weights in µs).
#[derive(Debug, Clone, Default)]
pub struct Folded {
    pub offcpu: Vec<String>,
    pub wall: Vec<String>,
}

/// (program, tracepoint category, tracepoint name), in attach order.
const TASK_PROGRAMS: [(&str, &str, &str); 1] = [("acct_newtask", "task", "task_newtask")];
/// The scheduler programs on classic tracepoints, for kernels without the raw ones' arguments.
const SCHED_TP_PROGRAMS: [(&str, &str, &str); 3] = [
    ("sched_switch_tp", "sched", "sched_switch"),
    ("sched_wakeup_tp", "sched", "sched_wakeup"),
    ("sched_wakeup_new_tp", "sched", "sched_wakeup_new"),
];
/// (program, raw tracepoint, its argument count): these run for every context switch and
/// every syscall on the machine, and a raw tracepoint skips the record a classic tracepoint
/// builds first (~25% of the added cost per syscall here).
const SCHED_RAW_PROGRAMS: [(&str, &str, usize); 3] = [
    ("sched_switch", "sched_switch", 4),
    ("sched_wakeup", "sched_wakeup", 1),
    ("sched_wakeup_new", "sched_wakeup_new", 1),
];
/// The same programs on BTF tracepoints (the default): their reads of the task's pid are
/// plain loads there, not helper calls. So are sys_enter's reads of the syscall's registers on
/// its BTF tracepoint (`sys_enter_btf`); sys_exit reads nothing and comes on a raw one.
const SCHED_BTF_PROGRAMS: [(&str, &str); 3] = [
    ("sched_switch_btf", "sched_switch"),
    ("sched_wakeup_btf", "sched_wakeup"),
    ("sched_wakeup_new_btf", "sched_wakeup_new"),
];

/// The kernel's BTF, for the raw tracepoint programs. GPUTRACE_RAW_TRACEPOINTS=0 picks the
/// classic ones (what an older kernel gets).
fn raw_btf() -> Result<crate::btf::Btf> {
    if std::env::var("GPUTRACE_RAW_TRACEPOINTS").is_ok_and(|v| v == "0") {
        anyhow::bail!("GPUTRACE_RAW_TRACEPOINTS=0");
    }
    crate::btf::Btf::kernel()
}

/// `f` on the BTF if it was read, else why it was not.
fn on_btf<T>(
    btf: &Result<crate::btf::Btf>,
    f: impl FnOnce(&crate::btf::Btf) -> Result<T>,
) -> Result<T> {
    match btf {
        Ok(b) => f(b),
        Err(e) => Err(anyhow::anyhow!("{e:#}")),
    }
}

/// Fails unless each raw tracepoint passes the number of arguments its program reads.
fn check_args<'a>(
    btf: &crate::btf::Btf,
    tracepoints: impl IntoIterator<Item = (&'a str, usize)>,
) -> Result<()> {
    for (tp, args) in tracepoints {
        let n = btf.raw_tracepoint_args(tp)?;
        if n != args {
            anyhow::bail!("raw tracepoint {tp} passes {n} arguments, not {args}");
        }
    }
    Ok(())
}

/// `task_struct.pid`, when the kernel's BTF shows the raw scheduler tracepoints with the
/// arguments the programs read (`sched_switch` has passed `prev_state` since Linux 5.18).
fn raw_sched_offset(btf: &crate::btf::Btf) -> Result<u32> {
    check_args(btf, SCHED_RAW_PROGRAMS.map(|(_, tp, args)| (tp, args)))?;
    btf.member_offset("task_struct", "pid")
}
/// Whether `sched_switch_btf` tells a woken thread's runqueue wait at its switch-in, so that
/// no `sched_wakeup` program runs (the eBPF crate's `sched::queued_ns`), once the kernel's BTF
/// shows the fields it reads ([`sched_info_offsets`]). GPUTRACE_SCHED_WAKEUP=1 gets the
/// `sched_wakeup` program, as a kernel without them does.
fn split_at_switch_in() -> Result<()> {
    if std::env::var("GPUTRACE_SCHED_WAKEUP").is_ok_and(|v| v == "1") {
        anyhow::bail!("GPUTRACE_SCHED_WAKEUP=1");
    }
    Ok(())
}

/// The scheduler's run-delay accounting (`CONFIG_SCHED_INFO`) and the task's runqueue clock,
/// reached through its CFS runqueue (`CONFIG_FAIR_GROUP_SCHED`), for every program set: the
/// switch-in split reads them ([`split_at_switch_in`]), and they date a switch-in that ran no
/// program (the eBPF crate's `sched::gputrace_switched_in`, `sched_info.last_arrival`).
fn sched_info_offsets(btf: &crate::btf::Btf) -> Result<Vec<(&'static str, u32)>> {
    let off = |s: &str, f: &str| btf.member_offset(s, f);
    let info = off("task_struct", "sched_info")?;
    let se = off("task_struct", "se")?;
    Ok(vec![
        ("ARRIVAL_KNOWN", 1),
        (
            "OFF_TASK_LAST_QUEUED",
            info + off("sched_info", "last_queued")?,
        ),
        (
            "OFF_TASK_LAST_ARRIVAL",
            info + off("sched_info", "last_arrival")?,
        ),
        ("OFF_TASK_RUN_DELAY", info + off("sched_info", "run_delay")?),
        ("OFF_TASK_CFS_RQ", se + off("sched_entity", "cfs_rq")?),
        ("OFF_CFS_RQ_RQ", off("cfs_rq", "rq")?),
        ("OFF_RQ_CLOCK", off("rq", "clock")?),
    ])
}

/// The block programs on classic tracepoints, for kernels whose BTF does not show the fields
/// the raw ones read. Each set attaches in its order: a request's last step first, and
/// `block_bio_queue`, which counts a bio and names its owner, last. Attached first, it counted
/// the bios of a running reader that completed before the completion program was on (a
/// tracepoint's first attach patches the kernel's text: milliseconds here), and its bytes read
/// as never completing: 5-30 MB of a `dd bs=4M iflag=direct` traced by `--pid`.
const BLOCK_TP_PROGRAMS: [(&str, &str, &str); 6] = [
    ("block_rq_complete_tp", "block", "block_rq_complete"),
    ("block_rq_issue_tp", "block", "block_rq_issue"),
    ("block_rq_insert_tp", "block", "block_rq_insert"),
    ("block_split_tp", "block", "block_split"),
    ("block_bio_remap_tp", "block", "block_bio_remap"),
    ("block_bio_queue_tp", "block", "block_bio_queue"),
];
/// (program, raw tracepoint, its argument count). Four runs per disk request, where the
/// classic set takes five and formats a record for each first.
const BLOCK_RAW_PROGRAMS: [(&str, &str, usize); 5] = [
    ("block_rq_complete", "block_rq_complete", 3),
    ("block_rq_issue", "block_rq_issue", 1),
    ("block_split", "block_split", 2),
    ("block_bio_remap", "block_bio_remap", 3),
    ("block_bio_queue", "block_bio_queue", 1),
];

/// The same programs on BTF tracepoints (the default): (program, tracepoint). They read the
/// same fields with plain loads instead of a helper call each.
const BLOCK_BTF_PROGRAMS: [(&str, &str); 5] = [
    ("block_rq_complete_btf", "block_rq_complete"),
    ("block_rq_issue_btf", "block_rq_issue"),
    ("block_split_btf", "block_split"),
    ("block_bio_remap_btf", "block_bio_remap"),
    ("block_bio_queue_btf", "block_bio_queue"),
];

/// The scheduler programs on BTF tracepoints: the wakeup program only where the switch
/// cannot tell the runqueue waits itself.
fn sched_btf_set(wakeup_needed: bool) -> Vec<(&'static str, &'static str)> {
    SCHED_BTF_PROGRAMS
        .into_iter()
        .filter(|(prog, _)| wakeup_needed || *prog != "sched_wakeup_btf")
        .collect()
}

/// The block programs on BTF and on raw tracepoints, (program, tracepoint): the issue only
/// where it must stamp requests itself, the remap only where a stacked device needs it
/// ([`remap_needed`]).
type TpSet = Vec<(&'static str, &'static str)>;
fn block_sets(issue: bool, remap: bool) -> (TpSet, TpSet) {
    let keep = |tp: &str| (issue || tp != "block_rq_issue") && (remap || tp != "block_bio_remap");
    let btf = BLOCK_BTF_PROGRAMS
        .into_iter()
        .filter(|(_, tp)| keep(tp))
        .collect();
    let raw = BLOCK_RAW_PROGRAMS
        .map(|(prog, tp, _)| (prog, tp))
        .into_iter()
        .filter(|(_, tp)| keep(tp))
        .collect();
    (btf, raw)
}

/// Whether `block_bio_remap` runs: where a stacked device passes its bios on to another
/// device as they are (an NVMe multipath head, md's striping), so that their owners follow
/// them ([`stacked_devices`]); GPUTRACE_BLOCK_REMAP=1 runs it anyway. Elsewhere it would
/// run for every bio to a partition, for nothing.
fn remap_needed() -> bool {
    std::env::var("GPUTRACE_BLOCK_REMAP").is_ok_and(|v| v == "1")
        || stacked_devices(std::path::Path::new("/sys/block"))
}

/// Whether a disk under `sys_block` (`/sys/block`) sits on others (`slaves/`: md, a device
/// mapper) or is an NVMe multipath head (`multipath/`). One set up during the trace is not
/// seen: its bios that go on as they are keep their owners at the first device only.
fn stacked_devices(sys_block: &std::path::Path) -> bool {
    let Ok(disks) = std::fs::read_dir(sys_block) else {
        return false;
    };
    disks.flatten().any(|d| {
        d.path().join("multipath").is_dir()
            || std::fs::read_dir(d.path().join("slaves")).is_ok_and(|mut s| s.next().is_some())
    })
}

/// Whether every request-based disk's queue stamps its requests' issues
/// (`request.io_start_time_ns`, set where the queue keeps I/O statistics: writeback throttling
/// is what keeps them by default), so that the completions can be timed without a
/// `block_rq_issue` program. A disk added later, or a queue whose throttling is turned off
/// during the trace, is timed from its requests' allocation (`Drop::BlockIssueUnstamped`).
/// GPUTRACE_BLOCK_ISSUE=1 runs the issue program anyway.
fn issue_stamped() -> Result<()> {
    if std::env::var("GPUTRACE_BLOCK_ISSUE").is_ok_and(|v| v == "1") {
        anyhow::bail!("GPUTRACE_BLOCK_ISSUE=1");
    }
    let disks = std::fs::read_dir("/sys/block").context("list /sys/block")?;
    for d in disks.flatten() {
        // Bio-based devices (zram, device mapper, md) have no requests to stamp.
        if !fill::makes_requests(&d.path()) {
            continue;
        }
        let wbt = std::fs::read_to_string(d.path().join("queue/wbt_lat_usec")).unwrap_or_default();
        if !wbt_on(&wbt) {
            anyhow::bail!(
                "{} does not throttle writeback (wbt_lat_usec {:?}): its queue may not stamp \
                 its issues",
                d.file_name().to_string_lossy(),
                wbt.trim()
            );
        }
    }
    Ok(())
}

/// A `wbt_lat_usec` that says writeback throttling is on (0 or unreadable: off).
fn wbt_on(text: &str) -> bool {
    text.trim().parse::<u64>().is_ok_and(|us| us > 0)
}

/// The struct offsets and `enum req_op` values the raw block programs read, from the
/// kernel's BTF.
fn raw_block_offsets(btf: &crate::btf::Btf) -> Result<Vec<(&'static str, u32)>> {
    check_args(btf, BLOCK_RAW_PROGRAMS.map(|(_, tp, args)| (tp, args)))?;
    let off = |s: &str, f: &str| btf.member_offset(s, f);
    let iter = off("bio", "bi_iter")?;
    Ok(vec![
        ("OFF_K_BIO_SECTOR", iter + off("bvec_iter", "bi_sector")?),
        ("OFF_K_BIO_SIZE", iter + off("bvec_iter", "bi_size")?),
        ("OFF_K_BIO_OPF", off("bio", "bi_opf")?),
        ("OFF_K_BIO_BDEV", off("bio", "bi_bdev")?),
        ("OFF_K_BDEV_DEV", off("block_device", "bd_dev")?),
        ("OFF_K_BDEV_DISK", off("block_device", "bd_disk")?),
        ("OFF_K_BDEV_START", off("block_device", "bd_start_sect")?),
        ("OFF_K_RQ_Q", off("request", "q")?),
        ("OFF_K_RQ_SECTOR", off("request", "__sector")?),
        ("OFF_K_RQ_LEN", off("request", "__data_len")?),
        ("OFF_K_RQ_FLAGS", off("request", "cmd_flags")?),
        ("OFF_K_RQ_START", off("request", "start_time_ns")?),
        ("OFF_K_RQ_BIO", off("request", "bio")?),
        ("OFF_K_Q_DISK", off("request_queue", "disk")?),
        ("OFF_K_DISK_MAJOR", off("gendisk", "major")?),
        ("OFF_K_DISK_MINOR", off("gendisk", "first_minor")?),
        ("REQ_OP_READ", btf.enum_value("REQ_OP_READ")?),
        ("REQ_OP_WRITE", btf.enum_value("REQ_OP_WRITE")?),
        // Zoned devices only; a kernel without it has no such requests.
        (
            "REQ_OP_ZONE_APPEND",
            btf.enum_value("REQ_OP_ZONE_APPEND").unwrap_or(u32::MAX),
        ),
    ])
}

/// Tracepoint field offsets, as globals of the eBPF object, and why the scheduler and the block
/// programs run on classic tracepoints (`None`: on raw ones).
struct Offsets {
    globals: Vec<(&'static str, u32)>,
    /// `classify::fd_syscall_mask` (a 64-bit global; the others are 32-bit).
    fd_mask: u64,
    sched_classic: Option<String>,
    block_classic: Option<String>,
    /// Why the raw and BTF block sets run `block_rq_issue` (`None`: they do not, the
    /// completions read the kernel's issue stamps: [`issue_stamped`]).
    issue_program: Option<String>,
    /// Why `sched_switch_btf` does not tell woken threads' runqueue waits itself (`None`: it
    /// does, and `sched_wakeup_btf` is not attached).
    wakeup_needed: Option<String>,
}

impl Offsets {
    fn read() -> Result<Offsets> {
        // x86-64's `uretprobe` syscall; elsewhere a number no syscall has.
        const SYS_URETPROBE: u32 = if cfg!(target_arch = "x86_64") {
            335
        } else {
            u32::MAX - 1
        };
        const SYS_FUTEX: u32 = if cfg!(target_arch = "x86_64") {
            202
        } else if cfg!(target_arch = "aarch64") {
            98
        } else {
            u32::MAX - 1
        };
        let sw = Format::read("sched", "sched_switch")?;
        let wake = Format::read("sched", "sched_wakeup")?;
        let tn = Format::read("task", "task_newtask")?;
        // Where a syscall's first argument sits in `struct pt_regs` (x86-64 `di`, arm64
        // `regs[0]`): the raw tracepoint hands over the registers, not a copied record.
        const REGS_ARG0: u32 = if cfg!(target_arch = "aarch64") {
            0
        } else {
            112
        };
        const REGS_ARG1: u32 = if cfg!(target_arch = "aarch64") {
            8
        } else {
            104
        };
        // mmap's prot, flags, fd and offset (x86-64 dx, r10, r8, r9; arm64 x2-x5).
        let (regs_arg2, regs_arg3, regs_arg4, regs_arg5) = if cfg!(target_arch = "aarch64") {
            (16, 24, 32, 40)
        } else {
            (96, 56, 72, 64)
        };
        // The open family, whose paths name the files (arm64 has only openat and openat2).
        const NONE: u32 = u32::MAX - 1;
        let arm = cfg!(target_arch = "aarch64");
        let (sys_open, sys_creat, sys_openat) = if arm { (NONE, NONE, 56) } else { (2, 85, 257) };
        let [sys_close, sys_close_range, sys_dup2, sys_dup3, sys_execve, sys_execveat] =
            FD_MOVING_SYSCALLS;
        let (sys_pipe, sys_pipe2) = if arm { (NONE, 59) } else { (22, 293) };
        let (sys_socket, sys_accept, sys_accept4) =
            if arm { (198, 202, 242) } else { (41, 43, 288) };
        // GPUTRACE_OFFCPU_STACKS=0 turns off the stack walks at switch-out (cheaper; off-CPU
        // time is then classified by syscall only and the off-CPU graphs have no stacks).
        let stacks = std::env::var("GPUTRACE_OFFCPU_STACKS").map_or(1, |v| u32::from(v != "0"));
        // Parsed once for both raw sets (the kernel's BTF is megabytes).
        let btf = raw_btf();
        let raw = on_btf(&btf, raw_sched_offset);
        // A field's offset from the BTF, `unknown` where it (or the BTF) is not there: the
        // programs leave what needs it unread.
        let member = |strukt: &str, field: &str, unknown: u32| {
            on_btf(&btf, |b| b.member_offset(strukt, field)).unwrap_or(unknown)
        };
        let mut v = vec![
            ("OFF_TASK_PID", *raw.as_ref().unwrap_or(&0)),
            // Which image a CPU sample or an exec is of (the eBPF crate's
            // `proc::self_exec_id`).
            (
                "OFF_TASK_SELF_EXEC_ID",
                member("task_struct", "self_exec_id", 0),
            ),
            // A forked child's image until it execs (the eBPF crate's `proc::current_mm`;
            // unread, such a child counts as a new process).
            ("OFF_TASK_MM", member("task_struct", "mm", 0)),
            // Where an exec's new image lies (`tracer_common::proc::ExecEvent`), for a process
            // gone before its maps are read.
            ("OFF_MM_SAVED_AUXV", member("mm_struct", "saved_auxv", 0)),
            ("OFF_MM_EXE_FILE", member("mm_struct", "exe_file", 0)),
            ("OFF_FILE_INODE", member("file", "f_inode", 0)),
            ("OFF_INODE_INO", member("inode", "i_ino", 0)),
            ("OFF_INODE_SB", member("inode", "i_sb", 0)),
            ("OFF_SB_DEV", member("super_block", "s_dev", 0)),
            // Which file a young process maps code from (`MappedCodeEvent`): its fd's.
            ("OFF_TASK_FILES", member("task_struct", "files", 0)),
            ("OFF_FILES_FDT", member("files_struct", "fdt", 0)),
            // Its first field: offset 0, unknown u32::MAX.
            ("OFF_FDT_MAX_FDS", member("fdtable", "max_fds", u32::MAX)),
            ("OFF_FDT_FD", member("fdtable", "fd", 0)),
            (
                "OFF_EXEC_FILENAME",
                Format::read("sched", "sched_process_exec")
                    .and_then(|f| f.offset("filename"))
                    .unwrap_or(0),
            ),
            // A process's wait status at its exit (the eBPF crate's `proc::emit_exit`).
            ("OFF_TASK_EXIT_CODE", member("task_struct", "exit_code", 0)),
            ("OFFCPU_STACKS", stacks),
            ("OFF_SW_PREV_STATE", sw.offset("prev_state")?),
            ("OFF_SW_NEXT_PID", sw.offset("next_pid")?),
            ("OFF_WAKE_PID", wake.offset("pid")?),
            ("OFF_TN_PID", tn.offset("pid")?),
            ("OFF_TN_FLAGS", tn.offset("clone_flags")?),
            // The renamed task (0 where the kernel has no task_rename: the program is then
            // not attached).
            (
                "OFF_RN_PID",
                Format::read("task", "task_rename")
                    .and_then(|f| f.offset("pid"))
                    .unwrap_or(0),
            ),
            ("OFF_REGS_ARG0", REGS_ARG0),
            ("OFF_REGS_ARG1", REGS_ARG1),
            ("OFF_REGS_ARG2", regs_arg2),
            ("OFF_REGS_ARG3", regs_arg3),
            ("OFF_REGS_ARG4", regs_arg4),
            ("OFF_REGS_ARG5", regs_arg5),
            ("SYS_MMAP", if arm { 222 } else { 9 }),
            ("SYS_OPEN", sys_open),
            ("SYS_CREAT", sys_creat),
            ("SYS_OPENAT", sys_openat),
            ("SYS_OPENAT2", 437),
            ("SYS_DUP2", sys_dup2),
            ("SYS_DUP3", sys_dup3),
            ("SYS_DUP", if arm { 23 } else { 32 }),
            ("SYS_FCNTL", if arm { 25 } else { 72 }),
            ("SYS_CLOSE", sys_close),
            ("SYS_CLOSE_RANGE", sys_close_range),
            ("SYS_EXECVE", sys_execve),
            ("SYS_EXECVEAT", sys_execveat),
            // Returns the restored register, not a result: never an error.
            ("SYS_RT_SIGRETURN", if arm { 139 } else { 15 }),
            ("SYS_PIPE", sys_pipe),
            ("SYS_PIPE2", sys_pipe2),
            ("SYS_SOCKET", sys_socket),
            ("SYS_ACCEPT", sys_accept),
            ("SYS_ACCEPT4", sys_accept4),
            ("SYS_URETPROBE", SYS_URETPROBE),
            ("SYS_FUTEX", SYS_FUTEX),
            ("THREAD_SLOT_MASK", states::slot_mask()),
        ];
        let split = on_btf(&btf, sched_info_offsets).and_then(|o| {
            v.extend(o);
            split_at_switch_in()
        });
        if split.is_ok() {
            v.push(("SPLIT_AT_SWITCH_IN", 1));
        }
        // Tests only: every traced thread's switch-in goes unseen, as it does on a kernel that
        // runs no program for a switch from a task it hides (the eBPF crate's
        // `sched::gputrace_switched_in`).
        if std::env::var("GPUTRACE_TEST_UNSEEN_SWITCH_INS").is_ok_and(|v| v == "1") {
            v.push(("UNSEEN_SWITCH_INS", 1));
        }
        let mut block_classic = None;
        let mut issue_program = None;
        if tracefs::exists("block", "block_rq_issue") {
            match on_btf(&btf, raw_block_offsets) {
                Ok(o) => {
                    v.extend(o);
                    let why = on_btf(&btf, |b| b.member_offset("request", "io_start_time_ns"))
                        .map(|off| v.push(("OFF_K_RQ_IO_START", off)))
                        .and_then(|()| issue_stamped());
                    if std::env::var("GPUTRACE_TEST_UNSTAMPED_ISSUES").is_ok_and(|v| v == "1") {
                        v.push(("TEST_UNSTAMPED_ISSUES", 1));
                    }
                    match why {
                        Ok(()) => v.push(("ISSUE_STAMPED", 1)),
                        Err(e) => issue_program = Some(format!("{e:#}")),
                    }
                }
                Err(e) => block_classic = Some(format!("{e:#}")),
            }
            let issue = Format::read("block", "block_rq_issue")?;
            let done = Format::read("block", "block_rq_complete")?;
            let bio = Format::read("block", "block_bio_queue")?;
            let split = Format::read("block", "block_split")?;
            let remap = Format::read("block", "block_bio_remap")?;
            v.extend([
                ("OFF_RQ_DEV", issue.offset("dev")?),
                ("OFF_RQ_SECTOR", issue.offset("sector")?),
                ("OFF_RQ_BYTES", issue.offset("bytes")?),
                ("OFF_RQ_RWBS", issue.offset("rwbs")?),
                ("OFF_RQC_DEV", done.offset("dev")?),
                ("OFF_RQC_NR_SECTOR", done.offset("nr_sector")?),
                ("OFF_BIO_SECTOR", bio.offset("sector")?),
                ("OFF_BIO_DEV", bio.offset("dev")?),
                ("OFF_BIO_NR_SECTOR", bio.offset("nr_sector")?),
                ("OFF_BIO_RWBS", bio.offset("rwbs")?),
                ("OFF_SPLIT_SECTOR", split.offset("sector")?),
                ("OFF_SPLIT_NEW", split.offset("new_sector")?),
                ("OFF_REMAP_SECTOR", remap.offset("sector")?),
                ("OFF_REMAP_OLD_SECTOR", remap.offset("old_sector")?),
                ("OFF_REMAP_DEV", remap.offset("dev")?),
                ("OFF_REMAP_OLD_DEV", remap.offset("old_dev")?),
                ("OFF_RQC_SECTOR", done.offset("sector")?),
            ]);
        }
        Ok(Offsets {
            globals: v,
            fd_mask: classify::fd_syscall_mask(),
            sched_classic: raw.err().map(|e| format!("{e:#}")),
            block_classic,
            issue_program,
            wakeup_needed: split.err().map(|e| format!("{e:#}")),
        })
    }
}

pub struct Accounting {
    offsets: std::result::Result<Offsets, String>,
    /// Whether the block set has its remap program ([`remap_needed`]), decided once.
    remap: bool,
    /// (tgid, tid) -> thread name, read while the threads are alive.
    comms: BTreeMap<u32, (u32, String)>,
    /// (tgid, fd, generation) -> the file, read from /proc while that generation was open.
    fds: BTreeMap<tracer_common::wall::FdKey, String>,
    /// Processes gone a files pass ago, their fd generations and names forgotten (until a
    /// fork takes the pid): a child's inherited fds are not named through them.
    forgotten: fill::PidSet,
    /// Processes whose standard fds (0-2) were named from /proc ([`Accounting::learn`]).
    std_named: fill::PidSet,
    /// When the syscall programs last came on (attached, or back after a storm): closes and
    /// `dup2`s are counted from then.
    sys_on_since: Option<u64>,
    attached: Vec<&'static str>,
    /// What dead threads left in the maps, taken out as the trace runs.
    retired: retire::Retired,
    /// Processes seen exited at the last files pass, whose files the next one forgets
    /// (`retire::Retired::files_pass`).
    exited_seen: BTreeSet<u32>,
    /// Processes that exited since the last files pass (net of a pid forked again since),
    /// and pids forked since: one of `exited_seen` forked again is another process's now.
    exited_since: BTreeSet<u32>,
    forked_since: BTreeSet<u32>,
    /// Why taking dead threads' rows out stopped, if it did.
    retire_failed: Option<String>,
    ticks: u64,
    /// Held while `-v` asks for the programs' own run time (kernel.bpf_stats_enabled), and
    /// their runs and run time when it was turned on.
    stats: Option<crate::overhead::StatsOn>,
    stats_base: BTreeMap<&'static str, (u64, u64)>,
    /// `RENAMES` when the names were last read, once `task_rename` is attached (else every
    /// look reads every live thread's name); whether the next look reads them all again
    /// anyway; and the thread instance (birth) each tid's name was read for.
    renames_seen: Option<u64>,
    reread_names: bool,
    named: std::collections::HashMap<u32, u64>,
    /// The syscall programs, entry first: (program, tracepoint, its link while attached).
    sys_links: Vec<(&'static str, &'static str, Option<bpf::TpLink>)>,
    /// The budget's control over them (None: a budget that never samples), and why it stopped
    /// if putting them back failed.
    sys_gate: Option<syscall_gate::SyscallGate>,
    sys_gate_failed: Option<String>,
    /// The names of threads that stormed, as the kernel gave them (they may be gone by the
    /// time names are read).
    storm_comms: BTreeMap<u32, String>,
    /// `--max-overhead`, and the syscalls in a block (`syscall_gate::block_calls`; 0: the
    /// budget never samples) at what a syscall was measured to cost as the programs attached.
    budget: f64,
    storm_calls: u64,
    sys_cost_ns: f64,
    /// Why moving the fds to new generations failed, if it did (file rows may mix files).
    fd_bump_failed: Option<String>,
    /// The seeded threads' run times, to check the accounting against at the end.
    run_times: crosscheck::RunTimes,
    /// Block requests sampled at high rates: None where every one counts (`--max-overhead
    /// 100%`, the classic block set, no block programs).
    block_sampler: Option<block_sample::BlockSampler>,
    /// Why setting the sampling shift failed, if it did.
    block_sample_failed: Option<String>,
    /// What a syscall tracepoint hit costs outside its program, measured as they attach.
    sys_trap: crate::overhead::SharedSyscallTrap,
    /// The kernel frames of the waits seeded threads were in (`KSTACK_SEEDED`).
    seeded_stacks: SeededStacks,
    /// The processes that existed at the attach, seeded as the window starts (`attached`).
    existing: Vec<u32>,
    /// When the programs were stopped (`window_ended`): the end of every open interval.
    stopped_at: Option<u64>,
}

/// tid -> kernel frames (innermost first) of the wait it was seeded in.
pub type SeededStacks = std::collections::HashMap<u32, Vec<String>>;

impl Accounting {
    /// Under the overhead budget `budget` (a fraction, `--max-overhead`).
    pub fn new(budget: f64, sys_trap: crate::overhead::SharedSyscallTrap) -> Accounting {
        Accounting {
            sys_trap,
            seeded_stacks: SeededStacks::new(),
            existing: Vec::new(),
            stopped_at: None,
            budget,
            storm_calls: 0,
            sys_cost_ns: syscall_gate::SYSCALL_COST_NS,
            fd_bump_failed: None,
            offsets: Offsets::read().map_err(|e| format!("{e:#}")),
            remap: remap_needed(),
            comms: BTreeMap::new(),
            renames_seen: None,
            reread_names: false,
            named: std::collections::HashMap::new(),
            fds: BTreeMap::new(),
            forgotten: fill::PidSet::default(),
            std_named: fill::PidSet::default(),
            sys_on_since: None,
            attached: Vec::new(),
            retired: retire::Retired::default(),
            exited_seen: BTreeSet::new(),
            exited_since: BTreeSet::new(),
            forked_since: BTreeSet::new(),
            retire_failed: None,
            ticks: 0,
            stats: None,
            stats_base: BTreeMap::new(),
            sys_links: Vec::new(),
            sys_gate: None,
            sys_gate_failed: None,
            storm_comms: BTreeMap::new(),
            run_times: crosscheck::RunTimes::default(),
            block_sampler: None,
            block_sample_failed: None,
        }
    }

    /// Learns names of new threads and targets of new fds while they still exist.
    fn learn(&mut self, ebpf: &Ebpf) {
        // A name changes only by a rename (prctl, /proc/.../comm, exec), which task_rename
        // counts, or with a new thread: reading every live thread's name at every look cost
        // a 10,000-thread process ~25% of a CPU. The tracepoint fires just before the kernel
        // copies the new name, so the look that sees the count move may still read the old
        // one: the next look reads them all again too.
        let renames = self
            .renames_seen
            .and_then(|_| retire::counter(ebpf, tracer_common::wall::RENAMES_MAP).ok());
        let moved = renames.is_none() || renames != self.renames_seen;
        let all = moved || self.reread_names;
        let mut tgids = BTreeSet::new();
        if let Ok(threads) = States::open(ebpf).and_then(|s| s.all(ebpf)) {
            for (tid, st) in threads {
                if !all && self.named.get(&tid) == Some(&st.born_ns) {
                    continue;
                }
                // Not a later thread under its id (its state outlives it until retired): one
                // started after it was born is another's.
                let Some(now) = procfs::task_stat(st.tgid, tid) else {
                    continue;
                };
                if procfs::started_after(now.starttime, st.born_ns) {
                    continue;
                }
                // Its process is the one /proc shows under the pid (not a later one, an
                // untraced process's, whose fds would name the dead one's rows).
                tgids.insert(st.tgid);
                self.comms.insert(tid, (st.tgid, now.comm));
                self.named.insert(tid, st.born_ns);
            }
            // Only once the names were read: a look that could not read the states leaves
            // the renames for the next one.
            if renames.is_some() {
                self.renames_seen = renames;
            }
            self.reread_names = moved;
        }
        // While the syscall programs are off, closes go unseen: the file /proc shows under an
        // fd may not be the one its row counted. They are named as they come back (with new
        // generations, `retire::next_fd_generations`). Stopped by a storm (`SYS_HALT_MAP`)
        // before the gate hears of it, only while no fd moved since (`name_open_fds`).
        if self.sys_gate.as_ref().is_some_and(|g| !g.is_on()) {
            return;
        }
        self.name_open_fds(ebpf, &tgids);
    }

    /// Names the files of the rows of open fds (their generation current) from /proc, and the
    /// standard fds of the processes `tgids` not named yet, unless the programs stopped while
    /// /proc was read (its names may then be of files opened after a close they did not see).
    /// The standard fds before any I/O on them: a program that writes its one line as it exits
    /// (a trainer's summary on stderr) is gone by the next look, and its stderr read
    /// `<closed fd 2>`.
    fn name_open_fds(&mut self, ebpf: &Ebpf, tgids: &BTreeSet<u32>) {
        let gens = fill::fd_gens(ebpf).unwrap_or_default();
        let new: Vec<u32> = tgids
            .iter()
            .copied()
            .filter(|p| !self.std_named.contains(*p))
            .collect();
        let std = new.iter().flat_map(|&tgid| {
            let gens = &gens;
            (0..=2).map(move |fd| fd_key(tgid, fd, gens.get(&(tgid, fd)).copied().unwrap_or(0)))
        });
        let mut read: Vec<(tracer_common::wall::FdKey, String)> = fill::open_fds(ebpf, &gens)
            .into_iter()
            .chain(std)
            .filter(|k| !self.fds.contains_key(k))
            .filter_map(|k| {
                let p = std::fs::read_link(format!("/proc/{}/fd/{}", k.tgid, k.fd)).ok()?;
                Some((k, p.display().to_string()))
            })
            .collect();
        // A close or dup2 between the generations' read and the fd's (a shell child
        // redirecting before its exec): that name is the next generation's.
        if !read.is_empty() {
            let after = fill::fd_gens(ebpf).unwrap_or_default();
            read.retain(|(k, _)| after.get(&(k.tgid, k.fd)).copied().unwrap_or(0) == k.gen);
        }
        // Looked at after the read: a move under way at the stop stays under way (its exit is
        // stopped), and one entered since is marked before it runs. The thread states are
        // read last, and only when there is something to name.
        if halted_at(ebpf).is_none() || (fds_unmoved_since_halt(ebpf) && !fd_move_in_flight(ebpf)) {
            self.fds.extend(read);
            for pid in new {
                self.std_named.insert(pid);
            }
        }
    }
}

/// Ticks (100 ms) between passes that take dead threads' rows out of the maps (`retire`): 2 s,
/// or sooner after `retire::DEATHS_PER_PASS` deaths. A pass reads the maps' keys, so it does
/// not run at every tick.
const RETIRE_EVERY_TICKS: u64 = 20;

impl Default for Accounting {
    fn default() -> Self {
        Self::new(crate::budget::DEFAULT_BUDGET, Default::default())
    }
}

/// Threads that exist now: accounted from now, in what /proc says they are doing.
/// A thread the programs already saw keeps the kernel's exact state.
/// Blocked threads whose kernel stacks seeding reads from /proc at most (~30 us each): past it
/// their waits are told by the syscall alone.
const SEEDED_STACKS_MAX: usize = 2048;

/// What seeding finds the threads in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Seeding {
    /// As the window opens, at this instant (`ktime_now`): whatever they are doing. Files
    /// they wait on are named now (`fds`), as a read that completes and exits at once leaves
    /// /proc no time to.
    Window(u64),
    /// A launched command in its read of gputrace's release pipe: that read is gputrace's,
    /// not the command's, and counts in none of its syscall or file figures.
    Release,
}

fn seed_threads(
    ebpf: &mut Ebpf,
    pids: &[u32],
    run_times: &mut crosscheck::RunTimes,
    stacks: &mut SeededStacks,
    seeding: Seeding,
    fds: &mut BTreeMap<tracer_common::wall::FdKey, String>,
) -> Result<()> {
    let tids: Vec<(u32, u32)> = pids
        .iter()
        .flat_map(|&pid| procfs::tasks(pid).into_iter().map(move |tid| (pid, tid)))
        .collect();
    bpf::mark_maybe(ebpf, tids.iter().map(|&(_, tid)| tid))?;
    let now = match seeding {
        Seeding::Window(at) => at,
        Seeding::Release => ktime_now(),
    };
    let states = States::open(ebpf)?;
    let mut proc_born = BTreeMap::new();
    for &(pid, tid) in &tids {
        let Some(Now {
            phase,
            state,
            nr,
            arg0,
            started,
        }) = thread_now(pid, tid)
        else {
            continue;
        };
        run_times.record(pid, tid, started);
        // A wait under way since before the attach: the kernel walks no stack for it, and a
        // `read` told by its syscall alone is disk I/O, whether it reads a file, a pipe, a
        // socket or a terminal. /proc has the stack.
        let mut off_kstack = -1;
        if phase != PHASE_ONCPU && stacks.len() < SEEDED_STACKS_MAX {
            let frames = procfs::kernel_stack(pid, tid);
            if !frames.is_empty() {
                stacks.insert(tid, frames);
                off_kstack = tracer_common::wall::KSTACK_SEEDED;
            }
        }
        let own = seeding == Seeding::Release;
        let fd_wait = phase != PHASE_ONCPU
            && arg0 >> tracer_common::wall::FD1_LIMIT_BITS == 0
            && classify::takes_fd_first(nr);
        if fd_wait && !own {
            // Generation 0: the fd's first file of the trace.
            let key = tracer_common::wall::FdKey {
                tgid: pid,
                fd: arg0 as i32,
                gen: 0,
                _pad: 0,
            };
            if let Ok(p) = std::fs::read_link(format!("/proc/{pid}/fd/{arg0}")) {
                fds.entry(key).or_insert_with(|| p.display().to_string());
            }
        }
        let st = ThreadState {
            off_kstack,
            sys_start_ns: now,
            sys_nr: if own {
                tracer_common::wall::NO_SYSCALL
            } else {
                nr
            },
            // The fd a read already under way waits on: its I/O row and its wait's file.
            sys_arg0: if own { 0 } else { arg0 },
            off_fd1: tracer_common::wall::unwalked_fd1(
                phase,
                off_kstack,
                nr,
                classify::fd_syscall_mask(),
                arg0,
            ),
            off_state: state,
            off_sys_nr: nr,
            // Blocked since before the attach: user space walks its Python frames, if any,
            // once it knows the thread state (tracer_common::python::PY_SEED_MAP).
            off_pystack: if phase == PHASE_ONCPU {
                0
            } else {
                PY_STACK_PENDING
            },
            // A process running since before the attach is not young for the trace's first
            // second: its threads' stacks go to the older processes' map at once. (Dated by
            // its start: /proc does not say when it last exec'd.)
            proc_born_ns: *proc_born.entry(pid).or_insert_with(|| {
                // The leader's start is its process's, read already.
                let start = if tid == pid {
                    Some(started)
                } else {
                    procfs::stat(pid).map(|s| s.starttime)
                };
                process_born(start, now)
            }),
            ..ThreadState::new(now, tid, pid, phase)
        };
        states.seed(ebpf, &st)?;
    }
    Ok(())
}

/// When a process that started at `start` (/proc's clock ticks since boot) started, on the
/// clock of `now` (the programs'), and not after `now`; `now` where /proc does not say.
fn process_born(start: Option<u64>, now: u64) -> u64 {
    start
        .and_then(procfs::start_floor_ktime)
        .map_or(now, |s| s.min(now))
}

/// Reads /proc for what a thread is doing now.
fn thread_now(pid: u32, tid: u32) -> Option<Now> {
    let st = procfs::task_stat(pid, tid)?;
    // A zombie (a leader gone by pthread_exit while its threads run, an unreaped child) is
    // dead: seeded, it was blocked "in no syscall" for the whole window.
    if st.is_dead() {
        return None;
    }
    let sys =
        std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).unwrap_or_default();
    let (nr, arg0) = parse_syscall(&sys);
    let (phase, state, nr) = match st.state {
        'R' => (PHASE_ONCPU, 0, -1),
        'D' => (PHASE_BLOCKED, 2, nr),
        'T' => (PHASE_BLOCKED, classify::TASK_STOPPED, nr),
        't' => (PHASE_BLOCKED, classify::TASK_TRACED, nr),
        _ => (PHASE_BLOCKED, 1, nr),
    };
    Some(Now {
        phase,
        state,
        nr,
        arg0,
        started: st.starttime,
    })
}

/// What [`thread_now`] read.
struct Now {
    phase: u32,
    /// prev_state-like bits.
    state: u32,
    /// The syscall it is in (-1: none, or running).
    nr: i32,
    /// That syscall's first argument (the fd of a read).
    arg0: u64,
    /// Its start time (clock ticks since boot).
    started: u64,
}

/// `/proc/PID/task/TID/syscall`: the syscall's number and its first argument (`0x`-prefixed
/// hex), or (-1, 0) for `running` or none.
fn parse_syscall(text: &str) -> (i32, u64) {
    let mut it = text.split_whitespace();
    let Some(nr) = it.next().and_then(|s| s.parse::<i32>().ok()) else {
        return (-1, 0);
    };
    if nr < 0 {
        // Blocked outside a syscall: the fields are its stack and program counters.
        return (nr, 0);
    }
    let arg0 = it
        .next()
        .and_then(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok())
        .unwrap_or(0);
    (nr, arg0)
}

/// Sets slot `slot` of `ACCOUNT_STOPPED` (`tracer_common::wall::STOPPED_SLOT`, `SEEDED_SLOT`).
fn set_flag(ebpf: &mut Ebpf, slot: u32) -> Result<()> {
    let mut flags: aya::maps::Array<_, u32> = aya::maps::Array::try_from(
        ebpf.map_mut(STOPPED_MAP)
            .context("map ACCOUNT_STOPPED missing")?,
    )?;
    flags.set(slot, 1, 0)?;
    Ok(())
}

/// `task_rename`'s `pid` field in its record (0 where the kernel has no such tracepoint or
/// field: the offset `Offsets::read` resolved is then the common fields').
fn rename_pid(o: &Offsets) -> u32 {
    o.globals
        .iter()
        .find(|(name, _)| *name == "OFF_RN_PID")
        .map_or(0, |(_, off)| *off)
}

/// Whether the BTF tracepoint programs are tried (GPUTRACE_BTF_TRACEPOINTS=0: none, to run
/// the raw ones).
fn typed_btf_wanted() -> bool {
    !std::env::var("GPUTRACE_BTF_TRACEPOINTS").is_ok_and(|v| v == "0")
}

/// The kernel's BTF, for the BTF tracepoint programs (GPUTRACE_BTF_TRACEPOINTS=0: none, to run
/// the raw ones).
fn typed_btf() -> Result<aya::Btf> {
    if !typed_btf_wanted() {
        anyhow::bail!("GPUTRACE_BTF_TRACEPOINTS=0");
    }
    aya::Btf::from_sys_fs().context("read the kernel's BTF")
}

impl Accounting {
    /// A set of programs on BTF tracepoints, all or none.
    fn attach_btf_set(
        &mut self,
        ebpf: &mut Ebpf,
        btf: &Result<&aya::Btf>,
        set: &[(&'static str, &str)],
    ) -> Result<()> {
        let btf = btf.as_ref().map_err(|e| anyhow::anyhow!("{e:#}"))?;
        self.attach_set(ebpf, set, |ebpf, prog, tp| {
            bpf::attach_btf_tracepoint(ebpf, btf, prog, tp)
        })
    }

    /// A set of programs on raw tracepoints, all or none.
    fn attach_raw_set(&mut self, ebpf: &mut Ebpf, set: &[(&'static str, &str)]) -> Result<()> {
        self.attach_set(ebpf, set, bpf::attach_raw_tracepoint)
    }

    /// Each of `set` by `attach`, all or none: where one fails, the set is unloaded, which
    /// detaches the links of those attached before it (and frees those loaded ahead of it,
    /// `bpf::preload`).
    fn attach_set(
        &mut self,
        ebpf: &mut Ebpf,
        set: &[(&'static str, &str)],
        attach: impl Fn(&mut Ebpf, &str, &str) -> Result<bpf::TpLink>,
    ) -> Result<()> {
        let mut done = Vec::new();
        for &(prog, tp) in set {
            if let Err(e) = attach(ebpf, prog, tp) {
                for &(p, _) in set {
                    let _ = match ebpf.program_mut(p) {
                        Some(Program::BtfTracePoint(p)) => p.unload(),
                        Some(Program::RawTracePoint(p)) => p.unload(),
                        _ => Ok(()),
                    };
                }
                return Err(e);
            }
            done.push(prog);
        }
        self.attached.extend(done);
        Ok(())
    }

    /// `set` on BTF tracepoints, else `raw` on raw ones, else `classic` on classic ones (each
    /// said under --verbose). A raw program the verifier refuses (the raw `sched_switch`
    /// walks 87% of its limit on this kernel, where another kernel's verifier may walk more)
    /// leaves the classic one, which reads the same fields from the tracepoint's record.
    #[allow(clippy::too_many_arguments)]
    fn attach_btf_raw_or_classic(
        &mut self,
        ebpf: &mut Ebpf,
        btf: &Result<&aya::Btf>,
        set: &[(&'static str, &str)],
        raw: &[(&'static str, &str)],
        classic: &[(&'static str, &str, &str)],
        what: &str,
        verbose: bool,
    ) -> Result<()> {
        let Err(e) = self.attach_btf_set(ebpf, btf, set) else {
            return Ok(());
        };
        if verbose {
            crate::note!("gputrace: {what} programs on raw tracepoints: {e:#}");
        }
        let Err(e) = self.attach_raw_set(ebpf, raw) else {
            return Ok(());
        };
        if verbose {
            crate::note!("gputrace: {what} programs on classic tracepoints: {e:#}");
        }
        self.attach_classic_set(ebpf, classic)
    }

    fn attach_classic_set(
        &mut self,
        ebpf: &mut Ebpf,
        set: &[(&'static str, &str, &str)],
    ) -> Result<()> {
        for &(prog, cat, name) in set {
            bpf::attach_tracepoint(ebpf, prog, cat, name)?;
            self.attached.push(prog);
        }
        Ok(())
    }
}

/// Detaches tracepoint program `prog`.
fn unload(ebpf: &mut Ebpf, prog: &str) -> Result<()> {
    match ebpf.program_mut(prog) {
        Some(Program::TracePoint(p)) => p.unload(),
        Some(Program::RawTracePoint(p)) => p.unload(),
        Some(Program::BtfTracePoint(p)) => p.unload(),
        _ => Ok(()),
    }
    .with_context(|| format!("detach {prog}"))
}

/// How long the end of a trace waits for the completions of the traced bios in flight
/// ([`drain_block`]): at most `DRAIN_MAX`, and once no completion comes (one that ran no
/// program never does) no longer than `DRAIN_QUIET`, or twice the slowest request seen, on a
/// slower disk (a disk of spinning platters, a throttled cloud volume).
const DRAIN_MAX: std::time::Duration = std::time::Duration::from_millis(250);
const DRAIN_QUIET: std::time::Duration = std::time::Duration::from_millis(20);
const DRAIN_POLL: std::time::Duration = std::time::Duration::from_millis(2);

/// With `block_bio_queue` off (no bio counted from then on) and the later steps of a request
/// still on, waits until the completions of the traced bios in flight are counted (see
/// [`DRAIN_MAX`]): else a live reader's requests in flight at the end read as submitted and
/// never completed (an io_uring reader at depth 32 of 128 KiB reads holds 4 MiB), and the
/// blind spots would say so. The time accounting's end instant was taken before (the
/// scheduler and syscall programs are off): this adds to the time from stop to report only.
fn drain_block(ebpf: &Ebpf) {
    let Ok(states) = States::open(ebpf) else {
        return;
    };
    // The states hold bytes of bios the completions may still count (`ThreadState::held_bio`).
    let Ok(open) = states.all(ebpf) else {
        return;
    };
    let start = std::time::Instant::now();
    let (mut last, mut since) = (None, start);
    while start.elapsed() < DRAIN_MAX {
        let Some(f) = fill::block_in_flight(ebpf, &open) else {
            return;
        };
        if f.short == 0 {
            return;
        }
        let quiet = DRAIN_QUIET.max(std::time::Duration::from_nanos(f.slowest_ns * 2));
        if last != Some(f.done) {
            (last, since) = (Some(f.done), std::time::Instant::now());
        } else if since.elapsed() >= quiet {
            return;
        }
        std::thread::sleep(DRAIN_POLL);
    }
}

/// GPUTRACE_SLOW_TAKE_OFF_MS=n: the syscall programs come off n ms after a storm, as on a
/// loaded host (a CI run's dd storm paid 431 ms for them where this VM's pay 40-55 ms), so
/// that a test can show the storm's cost does not wait on it.
fn slow_take_off_ms() -> Option<u64> {
    static SET: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *SET.get_or_init(|| {
        std::env::var("GPUTRACE_SLOW_TAKE_OFF_MS")
            .ok()
            .and_then(|v| v.parse().ok())
    })
}

/// close, close_range, dup2, dup3, execve and execveat on this architecture (`u32::MAX - 1`
/// where one does not exist): the syscalls that can put another file under an fd in use.
const FD_MOVING_SYSCALLS: [u32; 6] = if cfg!(target_arch = "aarch64") {
    [57, 436, u32::MAX - 1, 24, 221, 281]
} else {
    [3, 436, 33, 292, 59, 322]
};

/// Whether a traced thread's syscall that can put another file under one of its fds was under
/// way (entered, its exit not seen) when the programs stopped: its exit, stopped, moves no
/// generation on and marks nothing (`SYS_HALT_FDS_MAP`). Also true when the states cannot be
/// read.
fn fd_move_in_flight(ebpf: &Ebpf) -> bool {
    let Ok(threads) = States::open(ebpf).and_then(|s| s.all(ebpf)) else {
        return true;
    };
    threads
        .iter()
        .any(|(_, st)| FD_MOVING_SYSCALLS.iter().any(|&n| st.sys_nr == n as i32))
}

/// The key of file `fd` of process `tgid` in its open generation `gen`.
fn fd_key(tgid: u32, fd: i32, gen: u32) -> tracer_common::wall::FdKey {
    tracer_common::wall::FdKey {
        tgid,
        fd,
        gen,
        _pad: 0,
    }
}

/// When the syscall programs stopped themselves at a storm, if they have not been put back on
/// since (`SYS_HALT_MAP`); None too when it cannot be read.
fn halted_at(ebpf: &Ebpf) -> Option<u64> {
    retire::counter(ebpf, tracer_common::wall::SYS_HALT_MAP)
        .ok()
        .filter(|&at| at != 0)
}

/// Whether no traced thread entered a syscall that can put another file under an fd since
/// the programs stopped (`SYS_HALT_FDS_MAP`); false when it cannot be read.
fn fds_unmoved_since_halt(ebpf: &Ebpf) -> bool {
    retire::counter(ebpf, tracer_common::wall::SYS_HALT_FDS_MAP).is_ok_and(|n| n == 0)
}

/// Sets a one-entry `u64` array map.
fn set_counter(ebpf: &mut Ebpf, map: &str, v: u64) -> Result<()> {
    let mut a: aya::maps::Array<_, u64> = aya::maps::Array::try_from(
        ebpf.map_mut(map)
            .with_context(|| format!("map {map} missing"))?,
    )?;
    a.set(0, v, 0).with_context(|| format!("set {map}"))
}

impl Accounting {
    /// sys_enter (on its BTF tracepoint, else a raw one) and sys_exit, kept by link: the
    /// budget takes them off a syscall storm and puts them back ([`syscall_gate`]).
    fn attach_syscalls(
        &mut self,
        ebpf: &mut Ebpf,
        btf: &Result<&aya::Btf>,
        typed: bool,
        verbose: bool,
    ) -> Result<()> {
        let mut enter = None;
        // Raw where the scheduler programs are classic: a kernel whose BTF fails them.
        if typed {
            let link = match btf {
                Ok(b) => bpf::attach_btf_tracepoint(ebpf, b, "sys_enter_btf", "sys_enter"),
                Err(e) => Err(anyhow::anyhow!("{e:#}")),
            };
            match link {
                Ok(l) => enter = Some(("sys_enter_btf", l)),
                Err(e) if verbose => {
                    crate::note!("gputrace: syscall programs on raw tracepoints: {e:#}")
                }
                Err(_) => {}
            }
        }
        let (prog, link) = match enter {
            Some(e) => e,
            None => (
                "sys_enter",
                bpf::attach_raw_tracepoint(ebpf, "sys_enter", "sys_enter")?,
            ),
        };
        self.attached.push(prog);
        self.sys_links.push((prog, "sys_enter", Some(link)));
        let link = bpf::attach_raw_tracepoint(ebpf, "sys_exit", "sys_exit")?;
        self.attached.push("sys_exit");
        self.sys_links.push(("sys_exit", "sys_exit", Some(link)));
        Ok(())
    }

    /// Since when closes and `dup2`s onto fds have been counted, if they are now
    /// (`sys_on_since`): not while the syscall programs are off or stopped themselves at a
    /// storm.
    fn fds_seen_since(&self, ebpf: &Ebpf) -> Option<u64> {
        if self.sys_gate.as_ref().is_some_and(|g| !g.is_on()) || halted_at(ebpf).is_some() {
            return None;
        }
        self.sys_on_since
    }

    /// A storm whose event went missing (a full ring), or has not been read yet at the end:
    /// the programs stopped themselves all the same (`SYS_HALT_MAP`), and the gate takes them
    /// as off from then. Whether they must now be taken off.
    fn poll_halt(&mut self, ebpf: &Ebpf) -> bool {
        match self.sys_gate.as_mut() {
            Some(g) if self.sys_gate_failed.is_none() && g.is_on() => halted_at(ebpf)
                .is_some_and(|at| g.halted(at.min(ktime_now())) == syscall_gate::Action::TakeOff),
            _ => false,
        }
    }

    /// Takes the syscall programs off: entry first, so that no syscall starts unseen whose
    /// exit is then counted.
    fn take_off_syscalls(&mut self, ebpf: &mut Ebpf) -> Result<()> {
        // The exit program stopped both at the storm (`SYS_HALT_MAP`): what this takes now
        // costs the storming thread the tracepoints' dispatch only.
        if let Some(ms) = slow_take_off_ms() {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
        // Named from /proc while the programs, stopped at the storm, are still attached: they
        // mark any close, dup onto an fd or exec since (`SYS_HALT_FDS_MAP`), after which a
        // row could take the name of a file opened under its fd (`name_open_fds`). dd's
        // input is a dup of /dev/zero onto fd 0, which no open names.
        self.name_open_fds(ebpf, &BTreeSet::new());
        for (prog, _, link) in self.sys_links.iter_mut() {
            if let Some(l) = link.take() {
                bpf::detach_tracepoint(ebpf, prog, l)?;
            }
        }
        // A run that began before its link went may still stamp an entry: after a grace
        // period (the programs run with preemption off) every entry stamped is older than
        // the time written here, and a number older than it is not trusted. Best effort
        // (membarrier may be missing): `put_on_syscalls` writes it again, which is what the
        // exits go by.
        crate::bpf::grace_period();
        set_counter(ebpf, tracer_common::wall::SYS_OFF_AT_MAP, ktime_now())
    }

    /// Puts them back, exit first: an exit whose entry went unseen finds a number older than
    /// `SYS_OFF_AT` and is skipped.
    fn put_on_syscalls(&mut self, ebpf: &mut Ebpf) -> Result<()> {
        if let Err(e) = retire::next_fd_generations(ebpf) {
            self.fd_bump_failed.get_or_insert(format!("{e:#}"));
        }
        // Every entry stamped so far is from before the programs came off: none is trusted.
        set_counter(ebpf, tracer_common::wall::SYS_OFF_AT_MAP, ktime_now())?;
        set_counter(ebpf, tracer_common::wall::SYS_HALT_FDS_MAP, 0)?;
        set_counter(ebpf, tracer_common::wall::SYS_HALT_MAP, 0)?;
        for (prog, tp, link) in self.sys_links.iter_mut().rev() {
            if link.is_none() {
                *link = Some(bpf::reattach_tracepoint(ebpf, prog, tp)?);
            }
        }
        self.sys_on_since = Some(ktime_now());
        self.name_fds_now(ebpf);
        Ok(())
    }

    /// Names every fd under its new generation from /proc, now that closes are seen again:
    /// the rows of those generations are written at the fds' next I/O, and the next look at
    /// /proc (`learn`) may come after a storm has taken the programs off again, when it names
    /// nothing. Until a close (seen from now on) moves a generation on, its file is the one
    /// /proc shows now.
    fn name_fds_now(&mut self, ebpf: &Ebpf) {
        let Ok(gens) = fill::fd_gens(ebpf) else {
            return;
        };
        for ((tgid, fd), gen) in gens {
            let key = tracer_common::wall::FdKey {
                tgid,
                fd,
                gen,
                _pad: 0,
            };
            if let std::collections::btree_map::Entry::Vacant(e) = self.fds.entry(key) {
                if let Ok(p) = std::fs::read_link(format!("/proc/{tgid}/fd/{fd}")) {
                    e.insert(p.display().to_string());
                }
            }
        }
    }

    /// Sets the block requests' sampling shift from their rate (`block_sample`).
    fn sample_block(&mut self, ebpf: &mut Ebpf) {
        if self.block_sample_failed.is_some() || self.stopped_at.is_some() {
            return;
        }
        let Some(s) = self.block_sampler.as_mut() else {
            return;
        };
        let counted = match sum_per_cpu(ebpf, tracer_common::wall::BLOCK_COUNTED_MAP) {
            Ok(n) => n,
            Err(e) => {
                self.block_sample_failed = Some(format!("{e:#}"));
                return;
            }
        };
        let Some(v) = s.look(ktime_now(), counted) else {
            return;
        };
        if let Err(e) = set_block_sample(ebpf, v) {
            self.block_sample_failed = Some(format!("{e:#}"));
        }
    }

    /// What the block sampling did, for the report: the overhead section's account of it.
    fn report_block_sampling(&mut self, ctx: &FinishCtx<'_>, data: &mut ReportData) {
        if let Some(e) = self.block_sample_failed.take() {
            data.report.warnings.push(format!(
                "setting how many block requests are counted failed ({e}): from then on the \
                 sampling stayed as it was"
            ));
        }
        let Some(s) = self.block_sampler.as_mut() else {
            return;
        };
        s.finish(ctx.window_end_ktime);
        let Some(first) = s.first_ns else {
            return;
        };
        let o = data.report.overhead.get_or_insert_with(Default::default);
        o.block_sampled = Some(crate::report::model::overhead::BlockSampling {
            one_in_max: 1u64 << s.max_shift,
            sampled_s: s.sampled_ns as f64 / 1e9,
            first_s: first.saturating_sub(ctx.window_start_ktime) as f64 / 1e9,
            above_per_s: 4 * s.keep,
            keep_per_s: s.keep,
        });
    }

    /// What the budget did to the syscall programs, in the report.
    fn report_syscalls_off(&mut self, ebpf: &Ebpf, ctx: &FinishCtx<'_>, data: &mut ReportData) {
        if let Some(e) = self.sys_gate_failed.take() {
            data.report.warnings.push(format!(
                "the overhead budget's control of the syscall tracepoints failed ({e}): from \
                 then on they stayed as they were, and the syscall figures may stop there"
            ));
        }
        if let Some(e) = self.fd_bump_failed.take() {
            data.report.warnings.push(format!(
                "after the syscall tracepoints came back on, the fds could not be moved to new \
                 generations ({e}): a file opened while they were off under a closed file's \
                 number may add to that file's row"
            ));
        }
        let Some(g) = self
            .sys_gate
            .as_mut()
            .and_then(|g| g.finish(ctx.window_end_ktime))
        else {
            return;
        };
        let window = ctx
            .window_end_ktime
            .saturating_sub(ctx.window_start_ktime)
            .max(1);
        // At the programs' measured cost where the overhead family has it.
        let per_hit = |name: &str| {
            data.report.overhead.as_ref().and_then(|o| {
                o.programs
                    .iter()
                    .find(|p| p.program == name && p.bpf_ns_per_hit > 0.0)
                    .map(|p| p.traced_ns_per_hit())
            })
        };
        let enter = self
            .sys_links
            .first()
            .and_then(|(prog, _, _)| per_hit(prog));
        let cost = match (enter, per_hit("sys_exit")) {
            (Some(a), Some(b)) => a + b,
            _ => self.sys_cost_ns,
        };
        let block = self.sys_gate.as_ref().map_or(0, |g| g.block());
        let mut threads: Vec<_> = g
            .storms
            .iter()
            .map(|(&tid, s)| crate::report::model::overhead::StormThread {
                pid: s.pid,
                tid,
                comm: self
                    .comms
                    .get(&tid)
                    .map(|(_, c)| c.clone())
                    .or_else(|| self.storm_comms.get(&tid).cloned())
                    .unwrap_or_default(),
                share: syscall_gate::share(block, cost, s.took_ns),
            })
            .collect();
        threads.sort_by(|a, b| b.share.total_cmp(&a.share));
        let o = data.report.overhead.get_or_insert_with(Default::default);
        o.syscalls_off = Some(crate::report::model::overhead::SyscallsOff {
            on_share: 1.0 - (g.off_ns as f64 / window as f64).min(1.0),
            off_s: g.off_ns as f64 / 1e9,
            first_off_s: g.first_off.saturating_sub(ctx.window_start_ktime) as f64 / 1e9,
            windows: g.windows,
            threads,
            halted_calls: halted_calls(ebpf),
        });
    }
}

/// `tracer_common::wall::SYS_TIME_SHIFT`, for the loader (it keeps a reference).
static SYS_TIME_SHIFT: u32 = tracer_common::wall::SYS_TIME_SHIFT;

/// The sum of a one-slot per-CPU `u64` array's copies.
fn sum_per_cpu(ebpf: &Ebpf, name: &str) -> Result<u64> {
    let m = ebpf
        .map(name)
        .with_context(|| format!("no map {name}"))
        .and_then(|m| {
            aya::maps::PerCpuArray::<_, u64>::try_from(m).with_context(|| format!("open {name}"))
        })?;
    let v = m.get(&0, 0).with_context(|| format!("read {name}"))?;
    Ok(v.iter().sum())
}

/// Sets how block requests are sampled (`tracer_common::wall::BLOCK_SAMPLE_MAP`).
fn set_block_sample(ebpf: &mut Ebpf, v: tracer_common::wall::BlockSample) -> Result<()> {
    let name = tracer_common::wall::BLOCK_SAMPLE_MAP;
    let mut m = aya::maps::Array::<_, tracer_common::wall::BlockSample>::try_from(
        ebpf.map_mut(name)
            .with_context(|| format!("no map {name}"))?,
    )
    .with_context(|| format!("open {name}"))?;
    m.set(0, v, 0)
        .with_context(|| format!("set {name} to {v:?}"))
}

/// Traced threads' syscalls made while the programs were stopped and still attached
/// (`SYS_HALTED_MAP`); 0 when it cannot be read.
fn halted_calls(ebpf: &Ebpf) -> u64 {
    sum_per_cpu(ebpf, tracer_common::wall::SYS_HALTED_MAP).unwrap_or(0)
}

impl ProbeFamily for Accounting {
    fn name(&self) -> &'static str {
        "time accounting"
    }

    fn configure<'a>(&'a self, loader: &mut EbpfLoader<'a>) -> Result<()> {
        let offsets = self
            .offsets
            .as_ref()
            .map_err(|e| anyhow::anyhow!("read the scheduler/syscall tracepoint formats: {e}"))?;
        for (name, off) in &offsets.globals {
            loader.override_global(name, off, true);
        }
        loader.override_global("FD_SYSCALL_MASK", &offsets.fd_mask, true);
        // 100% times every call (every count exact, as everywhere else).
        if self.budget < 1.0 {
            loader.override_global("SYS_TIME_SHIFT", &SYS_TIME_SHIFT, true);
        }
        Ok(())
    }

    fn preload(&self) -> Vec<bpf::Preload> {
        let Ok(o) = self.offsets.as_ref() else {
            return Vec::new();
        };
        // What `attach` tries first (a set the kernel refuses is left to it), the scheduler's
        // switch first: it takes the verifier longest.
        let typed = typed_btf_wanted();
        let mut v = Vec::new();
        if o.sched_classic.is_none() {
            if typed {
                for (prog, tp) in sched_btf_set(o.wakeup_needed.is_some()) {
                    v.push(bpf::Preload::btf(prog, tp));
                }
                v.push(bpf::Preload::btf("sys_enter_btf", "sys_enter"));
            } else {
                v.extend(SCHED_RAW_PROGRAMS.map(|(prog, _, _)| bpf::Preload::plain(prog)));
                v.push(bpf::Preload::plain("sys_enter"));
            }
            v.push(bpf::Preload::plain("sys_exit"));
        }
        if o.block_classic.is_none() && tracefs::exists("block", "block_rq_issue") {
            let (btf_set, raw) = block_sets(o.issue_program.is_some(), self.remap);
            if typed {
                v.extend(
                    btf_set
                        .into_iter()
                        .map(|(prog, tp)| bpf::Preload::btf(prog, tp)),
                );
            } else {
                v.extend(raw.into_iter().map(|(prog, _)| bpf::Preload::plain(prog)));
            }
        }
        v.extend(TASK_PROGRAMS.map(|(prog, _, _)| bpf::Preload::plain(prog)));
        if rename_pid(o) != 0 {
            v.push(bpf::Preload::plain("task_rename"));
        }
        v
    }

    fn attach(&mut self, ebpf: &mut Ebpf, ctx: &AttachCtx<'_>) -> Result<()> {
        let offsets = self.offsets.as_ref().ok();
        let classic = offsets.and_then(|o| o.sched_classic.clone());
        if let (Some(why), true) = (&classic, ctx.args.verbose) {
            crate::note!("gputrace: scheduler programs on classic tracepoints: {why}");
        }
        let block_classic = offsets.and_then(|o| o.block_classic.clone());
        let issue_program =
            offsets.map_or(Some("no offsets".to_string()), |o| o.issue_program.clone());
        let verbose = ctx.args.verbose;
        // Read only when some set may use it (the classic sets need none), and only once.
        let read;
        let btf: Result<&aya::Btf> = if classic.is_none() || block_classic.is_none() {
            match ctx.btf {
                Some(b) if typed_btf_wanted() => Ok(b),
                _ => {
                    read = typed_btf();
                    read.as_ref().map_err(|e| anyhow::anyhow!("{e:#}"))
                }
            }
        } else {
            Err(anyhow::anyhow!("not needed"))
        };
        if classic.is_none() {
            let raw = SCHED_RAW_PROGRAMS.map(|(prog, name, _)| (prog, name));
            // The raw set always has its wakeup program: only the BTF switch program tells
            // the runqueue waits itself.
            let wakeup_needed =
                offsets.map_or(Some("offsets unread".into()), |o| o.wakeup_needed.clone());
            if let (Some(why), true) = (&wakeup_needed, verbose) {
                crate::note!("gputrace: runqueue waits told by sched_wakeup: {why}");
            }
            let btf_set = sched_btf_set(wakeup_needed.is_some());
            self.attach_btf_raw_or_classic(
                ebpf,
                &btf,
                &btf_set,
                &raw,
                &SCHED_TP_PROGRAMS,
                "scheduler",
                verbose,
            )?;
        } else {
            self.attach_classic_set(ebpf, &SCHED_TP_PROGRAMS)?;
        }
        for (prog, cat, name) in TASK_PROGRAMS {
            bpf::attach_tracepoint(ebpf, prog, cat, name)?;
            self.attached.push(prog);
        }
        // Without it (a kernel with no task_rename, or one whose record has no `pid`: the
        // offset Offsets::read resolved is then 0, where the common fields sit), names are
        // read again at every look.
        let rename_pid = self.offsets.as_ref().map_or(0, rename_pid);
        if rename_pid != 0
            && bpf::attach_tracepoint(ebpf, "task_rename", "task", "task_rename").is_ok()
        {
            self.attached.push("task_rename");
            self.renames_seen = Some(u64::MAX);
        }
        // Timed before and after, while no thread is seeded (`overhead::syscall_trap`).
        let bare = crate::overhead::syscall_trap::bare();
        self.attach_syscalls(ebpf, &btf, classic.is_none(), verbose)?;
        self.sys_on_since = Some(ktime_now());
        let progs: Vec<&str> = self.sys_links.iter().map(|(p, _, _)| *p).collect();
        let measured = crate::overhead::syscall_trap::measure(ebpf, ctx.uprobes, &progs, bare);
        if ctx.args.verbose {
            // The per-event cost of our own programs, printed at the end (xtask bench-sched):
            // on from after the measurement, which times syscalls with them off, and counted
            // from here, without its early returns.
            self.stats = Some(crate::overhead::stats_on()).filter(|s| s.is_on());
            for prog in &self.attached {
                self.stats_base.insert(prog, ctx.uprobes.runs(ebpf, prog));
            }
        }
        if let Ok(trap) = measured {
            self.sys_cost_ns = syscall_gate::cost_ns(trap);
        }
        if let Ok(mut s) = self.sys_trap.lock() {
            *s = Some(measured.map_err(|e| format!("{e:#}")));
        }
        self.storm_calls = syscall_gate::block_calls(self.budget, self.sys_cost_ns);
        set_counter(
            ebpf,
            tracer_common::wall::SYS_STORM_CALLS_MAP,
            self.storm_calls,
        )?;
        if self.storm_calls != 0 {
            self.sys_gate = Some(syscall_gate::SyscallGate::new(
                self.storm_calls,
                ktime_now(),
            ));
        }
        if tracefs::exists("block", "block_rq_issue") {
            let remap = self.remap;
            let classic: Vec<_> = BLOCK_TP_PROGRAMS
                .into_iter()
                .filter(|(_, _, tp)| remap || *tp != "block_bio_remap")
                .collect();
            match block_classic {
                None => {
                    let (btf_set, raw) = block_sets(issue_program.is_some(), remap);
                    self.attach_btf_raw_or_classic(
                        ebpf, &btf, &btf_set, &raw, &classic, "block", verbose,
                    )?;
                    // Told once attached: the classic set, where the others were refused,
                    // always has its issue program.
                    let issue = self
                        .attached
                        .iter()
                        .any(|p| p.starts_with("block_rq_issue"));
                    match (&issue_program, issue, verbose) {
                        (_, false, true) => crate::note!(
                            "gputrace: block requests timed from the kernel's issue stamps"
                        ),
                        (Some(why), true, true) => crate::note!(
                            "gputrace: block requests timed from a block_rq_issue program: {why}"
                        ),
                        (None, true, true) => crate::note!(
                            "gputrace: block requests timed from a block_rq_issue program: the \
                             programs that read the stamps were refused"
                        ),
                        _ => {}
                    }
                }
                Some(why) => {
                    if verbose {
                        crate::note!("gputrace: block programs on classic tracepoints: {why}");
                    }
                    self.attach_classic_set(ebpf, &classic)?;
                }
            }
        }
        // The classic set counts every request: it has no sampling.
        let sampled_set = self
            .attached
            .iter()
            .any(|p| p.starts_with("block_rq_complete") && !p.ends_with("_tp"));
        if sampled_set && self.budget < 1.0 {
            self.block_sampler = Some(block_sample::BlockSampler::new(
                ktime_now() ^ u64::from(std::process::id()) << 32,
                block_sample::keep_per_s(),
            ));
        }
        // The launched command is seeded at its release (see `before_release`): until then it
        // only waits on our pipe. The rest as the window starts (`attached`).
        self.existing = ctx
            .pids
            .iter()
            .copied()
            .filter(|&p| Some(p) != ctx.launched)
            .collect();
        Ok(())
    }

    fn attached(&mut self, ebpf: &mut Ebpf, opened_ns: u64) -> Result<()> {
        // Seeded as the window starts, not as this family attached: the families after it
        // take ~0.2 s to attach, and a thread seeded then was alive that much longer than the
        // window (`tracer_common::wall::SEEDED_SLOT`). As of the window's first instant: the
        // seeding's reads of /proc took 1.5-6 ms of a 0.3 s `--pid` trace here, which its
        // threads were alive for on top of the window.
        let existing = std::mem::take(&mut self.existing);
        seed_threads(
            ebpf,
            &existing,
            &mut self.run_times,
            &mut self.seeded_stacks,
            Seeding::Window(opened_ns),
            &mut self.fds,
        )?;
        set_flag(ebpf, tracer_common::wall::SEEDED_SLOT).context("mark the threads seeded")?;
        self.learn(ebpf);
        Ok(())
    }

    fn storms(&mut self, ebpf: &mut Ebpf, storms: &[tracer_common::proc::ProcEvent]) -> Result<()> {
        let Some(g) = self
            .sys_gate
            .as_mut()
            .filter(|_| self.sys_gate_failed.is_none())
        else {
            return Ok(());
        };
        let now = ktime_now();
        let mut off = false;
        for s in storms {
            self.storm_comms
                .entry(s.tid)
                .or_insert_with(|| crate::session::comm_str(&s.comm));
            // Stopped as the event was sent, not as it is read.
            off |= g.storm(s.ts_ns.min(now), s.pid, s.tid, u64::from(s.arg) * 1000)
                == syscall_gate::Action::TakeOff;
        }
        if off {
            if let Err(e) = self.take_off_syscalls(ebpf) {
                // They may be half off: the gate stops where it is, the trace goes on and the
                // report says so.
                self.sys_gate_failed = Some(format!("{e:#}"));
            }
        }
        Ok(())
    }

    fn before_release(&mut self, ebpf: &mut Ebpf, pid: u32) -> Result<()> {
        // Seeded blocked in its read of the release pipe: its runqueue time after the wake-up
        // and then its CPU time are told at its switch-in, as for any other thread (its
        // run-delay sum unknown, only the wait under way counts: it cannot migrate while
        // queued between our release and its first run in a way that matters here).
        seed_threads(
            ebpf,
            &[pid],
            &mut self.run_times,
            &mut self.seeded_stacks,
            Seeding::Release,
            &mut self.fds,
        )
    }

    fn tick(&mut self, ebpf: &mut Ebpf, tracker: &Tracker) -> Result<()> {
        self.ticks += 1;
        if self.poll_halt(ebpf) {
            if let Err(e) = self.take_off_syscalls(ebpf) {
                self.sys_gate_failed = Some(format!("{e:#}"));
            }
        }
        let put_on = self.sys_gate_failed.is_none()
            && self
                .sys_gate
                .as_mut()
                .is_some_and(|g| g.tick(ktime_now()) == syscall_gate::Action::PutOn);
        if put_on {
            if let Err(e) = self.put_on_syscalls(ebpf) {
                // The gate stops where it is, the trace goes on; the report says so.
                self.sys_gate_failed = Some(format!("{e:#}"));
            }
        }
        // Before the look: a pid a new process took loses the earlier one's names (one that
        // closed nothing keeps them past its exit), and the new one's standard fds are named
        // at this look, not purged after it.
        for life in &tracker.lives {
            if let Life::Forked(pid) = *life {
                self.std_named.remove(pid);
                let old: Vec<tracer_common::wall::FdKey> = self
                    .fds
                    .range(fd_key(pid, i32::MIN, 0)..=fd_key(pid, i32::MAX, u32::MAX))
                    .map(|(k, _)| *k)
                    .collect();
                for k in old {
                    self.fds.remove(&k);
                }
            }
        }
        if self.ticks.is_multiple_of(5) {
            self.learn(ebpf);
        }
        self.sample_block(ebpf);
        // A failed pass costs room in the maps, not the trace: said at the end, not retried.
        if self.retire_failed.is_none()
            && self
                .retired
                .wanted(ebpf, self.ticks.is_multiple_of(RETIRE_EVERY_TICKS))
        {
            if let Err(e) = self.retired.pass(ebpf) {
                self.retire_failed = Some(format!("{e:#}"));
            }
        }
        // Only for the files passes, which stop when one fails.
        if self.retire_failed.is_none() {
            for life in &tracker.lives {
                match *life {
                    Life::Exited(pid) => {
                        self.exited_since.insert(pid);
                    }
                    Life::Forked(pid) => {
                        self.exited_since.remove(&pid);
                        self.forgotten.remove(pid);
                        self.forked_since.insert(pid);
                    }
                }
            }
        }
        let due = self.ticks.is_multiple_of(RETIRE_EVERY_TICKS);
        if self.retire_failed.is_none()
            && (self.retired.files_wanted(ebpf, due)
                || due && !(self.exited_seen.is_empty() && self.exited_since.is_empty()))
        {
            // Gone a pass ago and still (a pid taken since by a traced process is that one's):
            // what their dying threads held is written by now.
            let gone: BTreeSet<u32> = std::mem::take(&mut self.exited_seen)
                .difference(&self.forked_since)
                .copied()
                .collect();
            let seen_since = self.fds_seen_since(ebpf);
            let forgotten = &self.forgotten;
            let parent = |pid: u32| fill::parent_for_fds(tracker, forgotten, seen_since, pid);
            match self.retired.files_pass(ebpf, &self.fds, &gone, &parent) {
                Ok((_, forgotten)) => {
                    self.fds.retain(|k, _| !forgotten.contains(&k.tgid));
                    // All their rows were taken and named in the pass; those that had fd
                    // generations have them no more (read as none from now).
                    for pid in &gone {
                        self.forgotten.insert(*pid);
                    }
                }
                Err(e) => self.retire_failed = Some(format!("{e:#}")),
            }
            self.exited_seen = std::mem::take(&mut self.exited_since);
            self.forked_since.clear();
        }
        Ok(())
    }

    fn ends_the_window(&self) -> bool {
        true
    }

    fn window_ended(&mut self, ebpf: &mut Ebpf, _: &Tracker) -> Result<()> {
        // Stopped as the window ends, not once the report is under way: detaching the
        // programs takes a grace period a link (~0.1 s in all here), and the CPU profile's
        // symbolisation before it as long again or more, and a thread alive to the end was
        // alive past the window by that much (0.12-0.18 s of a 0.3 s `--pid` trace here,
        // seconds for a large target). From here the programs leave the threads' states and
        // rows alone (`account::stopped`), so the sums and the open intervals read in
        // `finish` are this instant's.
        set_flag(ebpf, tracer_common::wall::STOPPED_SLOT).context("stop the accounting")?;
        self.stopped_at = Some(ktime_now());
        // A program that read the flag just before it was set may still be writing (what it
        // saw before the end): wait for every CPU to pass through the scheduler (an RCU grace
        // period, which BPF programs run inside). Best effort: without membarrier that window
        // stays (microseconds).
        crate::bpf::grace_period();
        Ok(())
    }

    fn finish(
        &mut self,
        ebpf: &mut Ebpf,
        ctx: &mut FinishCtx<'_>,
        data: &mut ReportData,
    ) -> Result<()> {
        // Stopped as the window ended (`window_ended`), unless the session never said it had.
        if self.stopped_at.is_none() {
            self.window_ended(ebpf, ctx.tracker)?;
        }
        let end = self.stopped_at.unwrap_or_else(ktime_now);
        self.learn(ebpf);
        // Detached with everything else at the end: only the gate needs to know.
        self.poll_halt(ebpf);
        if self.stats.is_some() {
            for prog in &self.attached {
                let (runs, ns) = ctx.uprobes.runs(ebpf, prog);
                let (runs0, ns0) = self.stats_base.get(prog).copied().unwrap_or((0, 0));
                let runs = runs.saturating_sub(runs0);
                crate::note!(
                    "gputrace: program {prog}: {runs} runs, {:.1} ns/run",
                    ns.saturating_sub(ns0) as f64 / runs.max(1) as f64
                );
            }
        }
        // A block request's later steps stay on until the requests in flight complete
        // (`drain_block`); its first, `block_bio_queue`, comes off with the others.
        let consumers: Vec<&'static str> = self
            .attached
            .iter()
            .copied()
            .filter(|p| p.starts_with("block_") && !p.starts_with("block_bio_queue"))
            .collect();
        for prog in self.attached.drain(..) {
            if !consumers.contains(&prog) {
                unload(ebpf, prog)?;
            }
        }
        if !consumers.is_empty() {
            drain_block(ebpf);
            for prog in consumers {
                unload(ebpf, prog)?;
            }
            // A completion still running on another CPU finishes before the rows are read.
            crate::bpf::grace_period();
        }
        self.report_syscalls_off(ebpf, ctx, data);
        self.report_block_sampling(ctx, data);
        // The Python stacks of the switch-outs since the session's last read.
        ctx.python.sync(ebpf)?;
        if let Some(e) = &self.retire_failed {
            data.report.warnings.push(format!(
                "dead threads' rows could not be taken out of the kernel's maps during the trace \
                 ({e}); with many short-lived threads the maps may have filled (see drops)"
            ));
        }
        let retired = std::mem::take(&mut self.retired);
        if retired.folded_threads > 0 {
            data.report.warnings.push(format!(
                "to bound memory, the syscall tables of {} threads that exited were folded into \
                 their processes' (past {} retired rows): those threads list no syscalls",
                retired.folded_threads,
                retire::MAX_THREAD_SYSCALL_ROWS
            ));
        }
        if retired.syscall_rows_dropped > 0 {
            data.report.warnings.push(format!(
                "to bound memory, {} syscall rows of processes that exited ({} calls) were not \
                 kept, past {} retired rows: those processes' syscall tables are incomplete",
                retired.syscall_rows_dropped,
                retired.syscall_calls_dropped,
                retire::max_syscall_rows()
            ));
        }
        if retired.files_folded > 0 {
            data.report.warnings.push(format!(
                "to bound memory, {} closed files past {} names were counted under their \
                 directories (`dir/…`)",
                retired.files_folded,
                retire::max_closed_files()
            ));
        }
        if retired.files_dropped > 0 {
            data.report.warnings.push(format!(
                "to bound memory, the I/O of {} closed files ({}) was not kept, past {} rows of \
                 closed files: the file tables of the processes they belonged to are incomplete",
                retired.files_dropped,
                crate::report::units::bytes(retired.files_bytes_dropped),
                retire::max_closed_files() + retire::max_closed_files() / 4
            ));
        }
        let folded = retired.folded_time_threads();
        if folded > 0 {
            data.report.warnings.push(format!(
                "to bound memory, the time of {folded} threads that exited (past {} retired time \
                 rows) was summed into their processes': it counts in the processes' time, and \
                 those threads are not listed",
                retire::max_wall_rows()
            ));
        }
        let learned = fill::Learned {
            comms: &self.comms,
            fds: &self.fds,
            seeded: &self.seeded_stacks,
            forgotten: &self.forgotten,
            fds_seen_since: self.fds_seen_since(ebpf),
        };
        fill::fill(ebpf, ctx, data, end, learned, retired)?;
        if let Some(w) = self.run_times.check(&mut data.report) {
            data.report.warnings.push(w);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_syscall, stacked_devices, wbt_on};

    #[test]
    fn a_syscall_under_way_keeps_its_first_argument() {
        // A read of fd 9, as this VM's 6.18 shows it.
        let text = "0 0x9 0x7ffd6b0c9b10 0x1000 0x0 0x0 0x0 0x7ffd6b0c9af8 0x7f5a4c11a7e2\n";
        assert_eq!(parse_syscall(text), (0, 9));
        assert_eq!(parse_syscall("running\n"), (-1, 0));
        assert_eq!(parse_syscall("-1 0x7ffd6b0c9af8 0x401136\n"), (-1, 0));
        assert_eq!(parse_syscall(""), (-1, 0));
    }

    #[test]
    fn stacked_devices_are_those_on_others_and_multipath_heads() {
        let sys = tempfile::tempdir().unwrap();
        let disk = |name: &str| {
            let d = sys.path().join(name);
            std::fs::create_dir_all(d.join("slaves")).unwrap();
            d
        };
        disk("vda");
        disk("loop0");
        assert!(!stacked_devices(sys.path()), "plain disks");
        let md = disk("md0");
        std::fs::create_dir(md.join("slaves/nvme0n1p1")).unwrap();
        assert!(stacked_devices(sys.path()), "md on a partition");
        std::fs::remove_dir_all(&md).unwrap();
        std::fs::create_dir_all(disk("nvme0n1").join("multipath/nvme0c0n1")).unwrap();
        assert!(stacked_devices(sys.path()), "an NVMe multipath head");
        assert!(!stacked_devices(&sys.path().join("none")));
    }

    #[test]
    fn writeback_throttling_is_on_only_at_a_positive_latency() {
        assert!(wbt_on("75000\n"));
        assert!(wbt_on("2000"));
        // Turned off, missing (no CONFIG_BLK_WBT, or unreadable), or not a number.
        assert!(!wbt_on("0\n"));
        assert!(!wbt_on(""));
        assert!(!wbt_on("-1"));
    }
}
