//! `gputrace check`: can this machine trace? One line per check (ok / info / warn / fail) with
//! a one-line fix; exits 1 when a failed check means a trace cannot work.
//!
//! Every check asks the kernel the way a trace would (opens a perf event, creates a ring
//! buffer, loads the embedded eBPF object) rather than guessing from version numbers.

use std::{fmt::Write as _, path::Path, process::ExitCode};

use anyhow::Result;
use clap::Args;

use crate::{bpf, procfs, tracefs};

#[derive(Debug, Clone, Args)]
pub struct CheckArgs {}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    Ok,
    Info,
    Warn,
    Fail,
}

impl Status {
    pub fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Info => "info",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    pub status: Status,
    pub name: &'static str,
    pub detail: String,
    /// What to do about a warn or fail.
    pub fix: Option<String>,
    /// Extra lines under the check (the CUDA processes found).
    pub items: Vec<String>,
}

impl Check {
    fn new(status: Status, name: &'static str, detail: impl Into<String>) -> Check {
        Check {
            status,
            name,
            detail: detail.into(),
            fix: None,
            items: vec![],
        }
    }
    fn fix(mut self, fix: impl Into<String>) -> Check {
        self.fix = Some(fix.into());
        self
    }
}

pub fn run(_args: &CheckArgs) -> Result<ExitCode> {
    let checks = gather();
    print!("{}", render(&checks));
    Ok(if can_trace(&checks) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

pub fn can_trace(checks: &[Check]) -> bool {
    checks.iter().all(|c| c.status != Status::Fail)
}

pub fn render(checks: &[Check]) -> String {
    let mut o = String::from("gputrace check: can this machine trace?\n");
    for c in checks {
        let fix = c
            .fix
            .as_deref()
            .map(|f| format!(" -> fix: {f}"))
            .unwrap_or_default();
        let _ = writeln!(
            o,
            "{:<4}  {:<12}  {}{fix}",
            c.status.label(),
            c.name,
            c.detail
        );
        for i in &c.items {
            let _ = writeln!(o, "                    {i}");
        }
    }
    let failed = checks.iter().filter(|c| c.status == Status::Fail).count();
    let warned = checks.iter().filter(|c| c.status == Status::Warn).count();
    if failed == 0 {
        let _ = writeln!(
            o,
            "gputrace can trace on this machine ({warned} warning(s): those parts of the report \
             will be missing)."
        );
    } else {
        let _ = writeln!(
            o,
            "gputrace cannot trace here: {failed} check(s) failed, {warned} warning(s)."
        );
    }
    o
}

/// Runs every check, in the order a trace needs them.
pub fn gather() -> Vec<Check> {
    let privileged = procfs::is_privileged();
    let mut v = vec![privileges(privileged), kernel()];
    v.push(btf());
    let tracefs = tracefs_root();
    let tracefs_ok = tracefs.status == Status::Ok;
    v.push(tracefs);
    v.push(tracepoints(tracefs_ok));
    v.push(uprobes());
    v.push(kprobes());
    v.push(perf_events());
    v.push(ring_buffer());
    v.push(map_memory(privileged));
    v.push(ebpf_object(privileged && tracefs_ok));
    v.push(uprobe_links(privileged && tracefs_ok));
    v.push(nvml());
    v.push(cuda_processes(privileged));
    v
}

fn privileges(privileged: bool) -> Check {
    let euid = unsafe { libc::geteuid() };
    if euid == 0 {
        Check::new(Status::Ok, "privileges", "running as root")
    } else if privileged {
        Check::new(
            Status::Ok,
            "privileges",
            format!("uid {euid} with CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN)"),
        )
    } else {
        Check::new(
            Status::Fail,
            "privileges",
            format!("uid {euid} without CAP_BPF and CAP_PERFMON: eBPF programs cannot be loaded"),
        )
        .fix("run it with sudo")
    }
}

/// (major, minor) of a kernel release string such as `6.18.44-fc-v595`.
pub fn parse_kernel_release(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

/// Ring buffers (5.8) are the newest kernel feature every trace uses.
pub fn kernel_check(release: &str) -> Check {
    match parse_kernel_release(release) {
        Some(v) if v >= (5, 8) => Check::new(Status::Ok, "kernel", format!("Linux {release}")),
        Some(_) => Check::new(
            Status::Fail,
            "kernel",
            format!("Linux {release}: BPF ring buffers and CAP_BPF need 5.8 or newer"),
        )
        .fix("upgrade to a 5.8+ kernel"),
        None => Check::new(
            Status::Warn,
            "kernel",
            format!("cannot read a version from `{release}`"),
        ),
    }
}

fn kernel() -> Check {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    kernel_check(&release)
}

fn btf() -> Check {
    let path = Path::new("/sys/kernel/btf/vmlinux");
    match std::fs::metadata(path) {
        Ok(m) => Check::new(
            Status::Ok,
            "btf",
            format!("{} ({:.1} MiB)", path.display(), m.len() as f64 / 1048576.0),
        ),
        Err(_) => Check::new(
            Status::Warn,
            "btf",
            "no /sys/kernel/btf/vmlinux: the scheduler programs use classic tracepoints (dearer \
             per context switch)",
        )
        .fix("use a kernel built with CONFIG_DEBUG_INFO_BTF=y"),
    }
}

fn tracefs_root() -> Check {
    match tracefs::root() {
        Ok(r) => Check::new(Status::Ok, "tracefs", format!("mounted at {r}")),
        Err(e) => Check::new(Status::Fail, "tracefs", format!("{e:#}")).fix(
            "run as root (tracefs is root-only), or mount -t tracefs tracefs /sys/kernel/tracing",
        ),
    }
}

/// The tracepoints gputrace attaches to: (category, name, what is lost without it, required).
pub const TRACEPOINTS: &[(&str, &str, &str, bool)] = &[
    ("task", "task_newtask", "following children", true),
    ("sched", "sched_process_exec", "following execs", true),
    ("sched", "sched_process_exit", "process exits", true),
    ("sched", "sched_switch", "off-CPU time", true),
    ("sched", "sched_wakeup", "wakeup and runqueue time", true),
    ("raw_syscalls", "sys_enter", "syscall time", true),
    ("raw_syscalls", "sys_exit", "syscall time", true),
    ("block", "block_rq_issue", "block I/O", false),
    ("block", "block_rq_complete", "block I/O", false),
];

/// Judges which tracepoints exist: missing required ones fail, missing optional ones warn.
pub fn tracepoints_check(present: &dyn Fn(&str, &str) -> bool) -> Check {
    let missing: Vec<&(&str, &str, &str, bool)> = TRACEPOINTS
        .iter()
        .filter(|(c, n, _, _)| !present(c, n))
        .collect();
    if missing.is_empty() {
        return Check::new(
            Status::Ok,
            "tracepoints",
            format!(
                "all {} present (sched, raw_syscalls, task, block)",
                TRACEPOINTS.len()
            ),
        );
    }
    let required = missing.iter().any(|t| t.3);
    let list = missing
        .iter()
        .map(|(c, n, lost, _)| format!("{c}/{n} ({lost})"))
        .collect::<Vec<_>>()
        .join(", ");
    Check::new(
        if required { Status::Fail } else { Status::Warn },
        "tracepoints",
        format!("missing: {list}"),
    )
    .fix("use a kernel with CONFIG_FTRACE and CONFIG_TRACEPOINTS (and CONFIG_BLOCK for block/)")
}

fn tracepoints(tracefs_ok: bool) -> Check {
    if !tracefs_ok {
        return Check::new(
            Status::Fail,
            "tracepoints",
            "cannot be checked without tracefs (see above)",
        )
        .fix("fix tracefs first");
    }
    tracepoints_check(&|c, n| tracefs::exists(c, n))
}

fn uprobes() -> Check {
    let dev = Path::new("/sys/bus/event_source/devices/uprobe");
    if dev.exists() {
        let ty = std::fs::read_to_string(dev.join("type")).unwrap_or_default();
        Check::new(
            Status::Ok,
            "uprobes",
            format!("uprobe PMU (type {}): CUDA calls can be traced", ty.trim()),
        )
    } else {
        Check::new(
            Status::Warn,
            "uprobes",
            "no uprobe PMU: CUDA runtime/driver calls cannot be traced",
        )
        .fix("use a kernel with CONFIG_UPROBE_EVENTS=y")
    }
}

fn kprobes() -> Check {
    let present = Path::new("/sys/bus/event_source/devices/kprobe").exists();
    Check::new(
        Status::Info,
        "kprobes",
        if present {
            "available (gputrace does not need them)"
        } else {
            "absent, which is fine: gputrace uses tracepoints and uprobes only"
        },
    )
}

/// Opens a cpu-clock sampling event on CPU 0 for all processes, as the CPU sampler does.
fn perf_events() -> Check {
    let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    // struct perf_event_attr, PERF_ATTR_SIZE_VER7 (128 bytes): type, size, config,
    // sample_period, ..., flags (bit 0: disabled).
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&1u32.to_ne_bytes()); // PERF_TYPE_SOFTWARE
    attr[4..8].copy_from_slice(&128u32.to_ne_bytes());
    attr[8..16].copy_from_slice(&0u64.to_ne_bytes()); // PERF_COUNT_SW_CPU_CLOCK
    attr[16..24].copy_from_slice(&10_000_000u64.to_ne_bytes());
    attr[40..48].copy_from_slice(&1u64.to_ne_bytes());
    const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr.as_ptr(),
            -1 as libc::pid_t,
            0 as libc::c_int,
            -1 as libc::c_int,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd >= 0 {
        unsafe { libc::close(fd as i32) };
        return Check::new(
            Status::Ok,
            "perf events",
            format!("cpu-clock sampling opens (perf_event_paranoid={paranoid})"),
        );
    }
    let e = std::io::Error::last_os_error();
    let fix = match e.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EPERM) => {
            "run it with sudo (system-wide sampling needs CAP_PERFMON)"
        }
        _ => "use a kernel with CONFIG_PERF_EVENTS=y",
    };
    Check::new(
        Status::Fail,
        "perf events",
        format!("cannot open a cpu-clock event: {e} (perf_event_paranoid={paranoid})"),
    )
    .fix(fix)
}

/// Whether the sparsest hash maps take kernel memory as they fill or all at the load (the
/// `ebpf object` row says how much the load held).
fn map_memory(privileged: bool) -> Check {
    const NAME: &str = "map memory";
    if !privileged {
        return Check::new(
            Status::Info,
            NAME,
            "not checked: needs the privileges above",
        );
    }
    match crate::prealloc::why_upfront() {
        None => Check::new(
            Status::Ok,
            NAME,
            "the sparsest hash maps take kernel memory as rows are added",
        ),
        Some(why) => Check::new(
            Status::Info,
            NAME,
            format!("every hash map is preallocated: {why}"),
        ),
    }
}

/// Creates (and closes) a 64 KiB BPF ring buffer map.
fn ring_buffer() -> Check {
    // union bpf_attr for BPF_MAP_CREATE: map_type, key_size, value_size, max_entries.
    let mut attr = [0u8; 72];
    attr[0..4].copy_from_slice(&27u32.to_ne_bytes()); // BPF_MAP_TYPE_RINGBUF
    attr[12..16].copy_from_slice(&(64u32 * 1024).to_ne_bytes());
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            0 as libc::c_int, // BPF_MAP_CREATE
            attr.as_ptr(),
            attr.len() as libc::c_uint,
        )
    };
    if fd >= 0 {
        unsafe { libc::close(fd as i32) };
        return Check::new(Status::Ok, "ring buffer", "BPF ring buffer map created");
    }
    let e = std::io::Error::last_os_error();
    let fix = match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => "run it with sudo (needs CAP_BPF)",
        _ => "use a 5.8+ kernel with CONFIG_BPF_SYSCALL=y",
    };
    Check::new(
        Status::Fail,
        "ring buffer",
        format!("cannot create a BPF ring buffer: {e}"),
    )
    .fix(fix)
}

/// Loads the embedded object (maps) and runs the verifier on the programs that need no
/// attach target to load.
fn ebpf_object(can_load: bool) -> Check {
    if !can_load {
        return Check::new(
            Status::Info,
            "ebpf object",
            "not loaded: needs the privileges and tracefs above",
        );
    }
    // With the accounting's offsets: the BTF programs' field reads are checked against them.
    let families: [Box<dyn crate::probes::ProbeFamily>; 1] =
        [Box::new(crate::accounting::Accounting::default())];
    let mut ebpf = match bpf::load(
        &bpf::LoadOptions {
            follow_children: true,
        },
        &families,
    ) {
        Ok(e) => e,
        Err(e) => {
            return Check::new(Status::Fail, "ebpf object", format!("{e:#}"))
                .fix("see the verifier's message; report it with `uname -r`")
        }
    };
    let maps = ebpf.maps().count();
    // Only this object's maps are open here yet.
    let held = crate::overhead::own::kernel_maps_bytes();
    let mut verified = 0;
    let mut skipped = 0;
    // The BTF tracepoint programs (the defaults where the kernel takes them) are named for
    // their tracepoint: `<tracepoint>_btf`. A kernel that refuses them gets the same code on
    // raw tracepoints when tracing, so a refusal is a warning, not a failure.
    let btf = aya::Btf::from_sys_fs().ok();
    let mut refused: Vec<String> = Vec::new();
    // How far the verifier walked each program, and how long its load took.
    let mut walked: Vec<(String, u64, std::time::Duration)> = Vec::new();
    for (name, prog) in ebpf.programs_mut() {
        use aya::programs::Program;
        let started = std::time::Instant::now();
        let res = match prog {
            Program::TracePoint(p) => p.load(),
            Program::PerfEvent(p) => p.load(),
            Program::UProbe(p) => p.load(),
            Program::RawTracePoint(p) => p.load(),
            Program::BtfTracePoint(p) if btf.is_some() && name.ends_with("_btf") => {
                let tp = name.trim_end_matches("_btf");
                if let Err(e) = p.load(tp, btf.as_ref().expect("checked")) {
                    refused.push(format!("{:#}", bpf::load_error(name, e)));
                    continue;
                }
                Ok(())
            }
            _ => {
                skipped += 1;
                continue;
            }
        };
        if let Err(e) = res {
            return Check::new(
                Status::Fail,
                "ebpf object",
                format!("{:#}", bpf::load_error(name, e)),
            )
            .fix("report it with `uname -r` and this line");
        }
        verified += 1;
        let took = started.elapsed();
        if let Some(n) = crate::collect::verified_insns(prog) {
            walked.push((name.to_string(), n, took));
        }
    }
    let names: Vec<&str> = ebpf.programs().map(|(n, _)| n).collect();
    let extra = if skipped > 0 {
        format!(" ({skipped} load when attached)")
    } else {
        String::new()
    };
    let mut summary = format!(
        "{maps} maps created ({} of kernel memory; before Linux 6.4 one allocated as used \
         counts whole), {verified} programs passed the verifier{extra}",
        crate::report::units::bytes(held)
    );
    let limit = crate::collect::VERIFIER_LIMIT;
    let share = |n: u64| 100.0 * n as f64 / limit as f64;
    if let Some((name, n, took)) = walked.iter().max_by_key(|w| w.1) {
        let _ = write!(
            summary,
            "; the largest, {name}, took {:.0}% of the verifier's limit ({n} instructions, \
             {:.0} ms)",
            share(*n),
            took.as_secs_f64() * 1e3
        );
    }
    // Near the limit with nothing to fall back on: a kernel whose verifier walks it further
    // cannot trace at all.
    let at_risk = walked
        .iter()
        .filter(|w| near_limit(w.1) && !has_fallback(&w.0, &names))
        .max_by_key(|w| w.1);
    let check = match refused.first() {
        None if at_risk.is_none() => return Check::new(Status::Ok, "ebpf object", summary),
        None => Check::new(Status::Warn, "ebpf object", summary),
        Some(first) => Check::new(
            Status::Warn,
            "ebpf object",
            format!(
                "{summary}; {} BTF tracepoint programs refused, their raw or classic versions \
                 are used (slower: a helper call per field read). First: {first}",
                refused.len()
            ),
        ),
    };
    match at_risk {
        Some((name, n, _)) => check.fix(format!(
            "{name} takes {:.0}% of the verifier's limit and has no other version: report it \
             with `uname -r`",
            share(*n)
        )),
        None => check,
    }
}

/// A program the verifier accepted within a fifth of its limit: a kernel whose verifier prunes
/// fewer of its paths may not.
fn near_limit(verified_insns: u64) -> bool {
    verified_insns * 5 >= crate::collect::VERIFIER_LIMIT * 4
}

/// Whether a trace has another version of the program where the kernel refuses it: a BTF
/// tracepoint program its raw one, a raw one its classic one (`<name>_tp`).
fn has_fallback(prog: &str, programs: &[&str]) -> bool {
    prog.ends_with("_btf") || programs.contains(&format!("{prog}_tp").as_str())
}

/// Whether the CUDA probes get uprobe_multi links (what the launch gate's windows cost).
fn uprobe_links(can_load: bool) -> Check {
    const NAME: &str = "uprobe links";
    if !can_load {
        return Check::new(
            Status::Info,
            NAME,
            "not checked: needs the privileges and tracefs above",
        );
    }
    let Ok(mut ebpf) = bpf::load(
        &bpf::LoadOptions {
            follow_children: true,
        },
        &[],
    ) else {
        return Check::new(Status::Info, NAME, "not checked: see the ebpf object row");
    };
    let progs = [
        tracer_common::cuda::ENTRY_PROG,
        tracer_common::cuda::RET_PROG,
    ];
    match crate::uprobes::Uprobes::load(&mut ebpf, bpf::OBJECT, &progs) {
        Ok(u) => match u.why_perf() {
            None => Check::new(
                Status::Ok,
                NAME,
                "uprobe_multi: one link per program and library, breakpoints removed before \
                 the kernel's grace period",
            ),
            Some(why) => Check::new(
                Status::Warn,
                NAME,
                format!("perf-event links, one per function ({why})"),
            )
            .fix(
                "Linux 6.6+ has uprobe_multi links; without them each close of a launch-probe \
                 window lets the calls trap ~100 ms uncounted, and exit waits per function",
            ),
        },
        Err(e) => Check::new(Status::Fail, NAME, format!("{e:#}"))
            .fix("report it with `uname -r` and this line"),
    }
}

fn nvml() -> Check {
    match nvml_wrapper::Nvml::init() {
        Ok(nvml) => {
            let driver = nvml
                .sys_driver_version()
                .unwrap_or_else(|_| "unknown".into());
            let count = nvml.device_count().unwrap_or(0);
            let names: Vec<String> = (0..count)
                .filter_map(|i| nvml.device_by_index(i).ok()?.name().ok())
                .collect();
            Check::new(
                Status::Ok,
                "nvidia",
                format!(
                    "driver {driver}, {count} GPU(s){}",
                    if names.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", names.join(", "))
                    }
                ),
            )
        }
        Err(e) => Check::new(
            Status::Warn,
            "nvidia",
            format!("no NVML ({e}); CUDA calls are still traced, GPU counters are not"),
        )
        .fix("install the NVIDIA driver (libnvidia-ml.so.1) on GPU machines"),
    }
}

/// True for the CUDA runtime (`libcudart.so*`) and driver (`libcuda.so*`) libraries, also
/// under the hashed names pip wheels give them (`libcudart-d0da41ae.so.11.0`).
pub fn is_cuda_library(path: &str) -> bool {
    let base = path.rsplit('/').next().unwrap_or(path);
    ["libcudart.so", "libcudart-", "libcuda.so", "libcuda-"]
        .iter()
        .any(|p| base.starts_with(p))
}

/// The CUDA libraries a process has mapped (deduplicated, in map order).
pub fn cuda_libraries(maps: &[procfs::Mapping]) -> Vec<String> {
    let mut libs: Vec<String> = Vec::new();
    for m in maps {
        if m.is_file() && is_cuda_library(&m.path) && !libs.contains(&m.path) {
            libs.push(m.path.clone());
        }
    }
    libs
}

fn cuda_processes(privileged: bool) -> Check {
    let mut items = Vec::new();
    let me = std::process::id();
    let pids: Vec<u32> = std::fs::read_dir("/proc")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let mut pids = pids;
    pids.sort_unstable();
    for pid in pids {
        if pid == me {
            continue;
        }
        let Some(maps) = procfs::read_maps(pid) else {
            continue;
        };
        let libs = cuda_libraries(&maps);
        if libs.is_empty() {
            continue;
        }
        let comm = procfs::comm(pid).unwrap_or_else(|| "?".into());
        items.push(format!("pid {pid} {comm}: {}", libs.join(", ")));
    }
    let scope = if privileged {
        ""
    } else {
        " (only your own processes are visible without root)"
    };
    let mut c = if items.is_empty() {
        Check::new(
            Status::Info,
            "cuda procs",
            format!("no running process has libcudart or libcuda loaded{scope}"),
        )
    } else {
        Check::new(
            Status::Ok,
            "cuda procs",
            format!("{} process(es) with CUDA libraries{scope}:", items.len()),
        )
    };
    c.items = items;
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_near_the_verifiers_limit_is_warned_of() {
        assert!(!near_limit(593_997));
        assert!(!near_limit(799_999));
        assert!(near_limit(800_000));
        let progs = [
            "sched_switch",
            "sched_switch_tp",
            "sched_switch_btf",
            "sys_exit",
        ];
        assert!(has_fallback("sched_switch_btf", &progs));
        assert!(has_fallback("sched_switch", &progs));
        assert!(!has_fallback("sched_switch_tp", &progs));
        assert!(!has_fallback("sys_exit", &progs));
    }

    #[test]
    fn kernel_versions() {
        assert_eq!(parse_kernel_release("6.18.44-fc-v595"), Some((6, 18)));
        assert_eq!(parse_kernel_release("5.4.0-150-generic"), Some((5, 4)));
        assert_eq!(parse_kernel_release("garbage"), None);
        assert_eq!(kernel_check("6.18.44-fc").status, Status::Ok);
        assert_eq!(kernel_check("5.8.0").status, Status::Ok);
        let old = kernel_check("5.4.0-150-generic");
        assert_eq!(old.status, Status::Fail);
        assert!(old.fix.is_some());
        assert_eq!(kernel_check("").status, Status::Warn);
    }

    #[test]
    fn tracepoint_judgement() {
        assert_eq!(tracepoints_check(&|_, _| true).status, Status::Ok);
        let no_block = tracepoints_check(&|c, _| c != "block");
        assert_eq!(no_block.status, Status::Warn);
        assert!(no_block.detail.contains("block/block_rq_issue"));
        let no_switch = tracepoints_check(&|_, n| n != "sched_switch");
        assert_eq!(no_switch.status, Status::Fail);
        assert!(no_switch.detail.contains("off-CPU time"), "{no_switch:?}");
    }

    #[test]
    fn finds_cuda_libraries_in_maps() {
        let maps = procfs::parse_maps(
            "7f0000000000-7f0000001000 r--p 00000000 08:01 11 /opt/venv/nvidia/cuda_runtime/lib/libcudart.so.12\n\
             7f0000001000-7f0000002000 r-xp 00001000 08:01 11 /opt/venv/nvidia/cuda_runtime/lib/libcudart.so.12\n\
             7f0000003000-7f0000004000 r-xp 00000000 08:01 12 /usr/lib/x86_64-linux-gnu/libcuda.so.565.57.01\n\
             7f0000005000-7f0000006000 r-xp 00000000 08:01 13 /usr/lib/libcudnn.so.9\n\
             7f0000006000-7f0000007000 r-xp 00000000 08:01 15 /venv/torch/lib/libcudart-d0da41ae.so.11.0\n\
             7f0000007000-7f0000008000 r-xp 00000000 08:01 14 /usr/lib/libcudart_static_helper.a\n\
             7f0000009000-7f000000a000 rw-p 00000000 00:00 0 \n",
        );
        assert_eq!(
            cuda_libraries(&maps),
            vec![
                "/opt/venv/nvidia/cuda_runtime/lib/libcudart.so.12".to_string(),
                "/usr/lib/x86_64-linux-gnu/libcuda.so.565.57.01".to_string(),
                "/venv/torch/lib/libcudart-d0da41ae.so.11.0".to_string(),
            ]
        );
    }

    #[test]
    fn rendering_and_exit() {
        let ok = Check::new(Status::Ok, "kernel", "Linux 6.18");
        let warn = Check::new(Status::Warn, "nvidia", "no NVML").fix("install the driver");
        let fail = Check::new(Status::Fail, "privileges", "uid 1000").fix("run it with sudo");
        assert!(can_trace(&[ok.clone(), warn.clone()]));
        assert!(!can_trace(&[ok.clone(), fail.clone()]));
        let text = render(&[ok, warn, fail]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[1], "ok    kernel        Linux 6.18");
        assert_eq!(
            lines[2],
            "warn  nvidia        no NVML -> fix: install the driver"
        );
        assert!(lines[3].starts_with("fail  privileges"));
        assert!(lines[4].contains("cannot trace here: 1 check(s) failed"));
    }
}
