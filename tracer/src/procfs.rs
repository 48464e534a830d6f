//! Reading /proc: process liveness, names, threads, descendants and memory maps.

use std::{fs, path::PathBuf};

/// True while `pid` exists and is not a zombie.
pub fn is_alive(pid: u32) -> bool {
    match stat(pid) {
        Some(s) if !s.is_dead() => true,
        Some(_) => live_thread(pid).is_some(),
        None => false,
    }
}

/// Another thread of `pid` that still runs. A leader that left with `pthread_exit` is a zombie
/// while its other threads run on, and its /proc entry has no memory (maps, map_files, reads):
/// /proc/TID has, for any thread.
fn live_thread(pid: u32) -> Option<u32> {
    fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&tid| tid != pid)
        .find(|&tid| task_stat(pid, tid).is_some_and(|s| !s.is_dead()))
}

/// The id under which /proc shows `pid`'s memory: its own, or a live thread's when its leader
/// has left (see [`live_thread`]).
pub fn mm_pid(pid: u32) -> u32 {
    match stat(pid) {
        Some(s) if s.is_dead() => live_thread(pid).unwrap_or(pid),
        _ => pid,
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    pub comm: String,
    pub state: char,
    pub ppid: u32,
    /// When it started, in clock ticks after boot (0 when the line is cut short): with the
    /// pid, tells one thread or process from a later one under the same id.
    pub starttime: u64,
}

impl Stat {
    /// A zombie (or dead) task: it ran its last.
    pub fn is_dead(&self) -> bool {
        matches!(self.state, 'Z' | 'X')
    }
}

/// A task's kernel stack as function names, innermost first (`/proc/PID/task/TID/stack`: root
/// only; empty where the kernel has no CONFIG_STACKTRACE or the task is running).
pub fn kernel_stack(pid: u32, tid: u32) -> Vec<String> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stack"))
        .map(|s| parse_kernel_stack(&s))
        .unwrap_or_default()
}

/// Lines such as `[<0>] n_tty_read+0x4bd/0x660` (a module's frames end in ` [name]`).
pub fn parse_kernel_stack(s: &str) -> Vec<String> {
    s.lines()
        .filter_map(|l| {
            let f = l.split_whitespace().nth(1)?;
            let name = f.split('+').next()?;
            (!name.is_empty()).then(|| name.to_string())
        })
        .collect()
}

/// Parses /proc/PID/stat; the comm is in parentheses and may itself contain spaces and ')'.
pub fn parse_stat(stat: &str) -> Option<Stat> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_string();
    let mut rest = stat.get(close + 2..)?.split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    // Field 22; `rest` began at field 3 and two are taken.
    let starttime = rest.nth(17).and_then(|s| s.parse().ok()).unwrap_or(0);
    Some(Stat {
        comm,
        state,
        ppid,
        starttime,
    })
}

/// What `--pid` was given, where it is not a user process's id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotAProcess {
    /// A thread's id: /proc/TID resolves, though it is not listed.
    Thread { tgid: u32 },
    /// A kernel thread (`PF_KTHREAD`): no user memory, no syscalls of its own.
    KernelThread,
}

/// `PF_KTHREAD` in a task's flags (stat field 9).
const PF_KTHREAD: u64 = 0x0020_0000;

/// Field 9 of a stat line: the task's flags.
pub fn parse_stat_flags(stat: &str) -> Option<u64> {
    let close = stat.rfind(')')?;
    // `rest` begins at field 3 (the state).
    stat.get(close + 2..)?
        .split_whitespace()
        .nth(6)?
        .parse()
        .ok()
}

/// The `Tgid:` line of /proc/PID/status.
pub fn parse_status_tgid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Whether `pid`, alive, is not a user process's id (None where /proc does not say).
pub fn not_a_process(pid: u32) -> Option<NotAProcess> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    if parse_stat_flags(&stat).is_some_and(|f| f & PF_KTHREAD != 0) {
        return Some(NotAProcess::KernelThread);
    }
    let tgid = parse_status_tgid(&fs::read_to_string(format!("/proc/{pid}/status")).ok()?)?;
    (tgid != pid).then_some(NotAProcess::Thread { tgid })
}

/// The earliest CLOCK_MONOTONIC ns (the clock `bpf_ktime_get_ns` reads) at which a task whose
/// `starttime` is this may have started: the kernel rounds its boot-time start down to a clock
/// tick (10 ms), so it started within a tick after. `None` where the tick is unknown.
pub fn start_floor_ktime(starttime: u64) -> Option<u64> {
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz <= 0 {
        return None;
    }
    // The boot-time clock goes on through a suspend, the monotonic one does not. Read second,
    // a delay between the two can only lower the floor (a reuse missed, never a child lost).
    let mono = crate::probes::ktime_now();
    let suspended = crate::probes::clock_ns(libc::CLOCK_BOOTTIME).saturating_sub(mono);
    let boot_ns = starttime.checked_mul(1_000_000_000 / hz as u64)?;
    Some(boot_ns.saturating_sub(suspended))
}

/// Beyond a tick's rounding (the floor's), what the two clocks' reading may put between a
/// task's start and an event of its own.
const START_SLACK_NS: u64 = 1_000_000;

/// Whether a task whose `starttime` is this surely started after `ns` (CLOCK_MONOTONIC): then
/// it is not the task an event of then was about, but a later one under its id. False where
/// the tick is unknown.
pub fn started_after(starttime: u64, ns: u64) -> bool {
    start_floor_ktime(starttime).is_some_and(|s| s > ns + START_SLACK_NS)
}

pub fn stat(pid: u32) -> Option<Stat> {
    stat_if_any(pid).ok().flatten()
}

/// One thread's stat (`/proc/PID/task/TID/stat`).
pub fn task_stat(pid: u32, tid: u32) -> Option<Stat> {
    parse_stat(&fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?)
}

/// `Ok(None)`: there is no such process now; `Err`: /proc did not say (a read that failed
/// otherwise, a line that does not parse).
pub fn stat_if_any(pid: u32) -> std::io::Result<Option<Stat>> {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => parse_stat(&s).map(Some).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, "unparsable stat line")
        }),
        // ESRCH: it exited between the open and the read.
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                || e.raw_os_error() == Some(libc::ESRCH) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// The sizes of a process's executable mappings (`VmExe`, `VmLib` of /proc/PID/status, kB):
/// a library mapped or unmapped changes them, so an unchanged pair means the executable part
/// of the maps has not changed (bar a library swapped for one of the same size), and a look
/// at /proc/PID/maps (a line per mapping: 20,000 for a process of 10,000 threads, each with
/// its stack and guard page) can wait.
pub fn exec_sizes(pid: u32) -> Option<(u64, u64)> {
    let read = |id: u32| parse_exec_sizes(&fs::read_to_string(format!("/proc/{id}/status")).ok()?);
    // A leader that left while its threads run has no sizes of its own.
    read(pid).or_else(|| match mm_pid(pid) {
        id if id != pid => read(id),
        _ => None,
    })
}

fn parse_exec_sizes(status: &str) -> Option<(u64, u64)> {
    let kb = |key: &str| -> Option<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))?
            .trim()
            .strip_suffix("kB")?
            .trim()
            .parse()
            .ok()
    };
    Some((kb("VmExe:")?, kb("VmLib:")?))
}

/// A thread's time on a CPU and waiting runnable for one, ns (`/proc/PID/task/TID/schedstat`).
pub fn schedstat(pid: u32, tid: u32) -> Option<(u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat")).ok()?;
    parse_schedstat(&s)
}

fn parse_schedstat(s: &str) -> Option<(u64, u64)> {
    let mut f = s.split_whitespace().map(|v| v.parse::<u64>().ok());
    Some((f.next()??, f.next()??))
}

pub fn comm(pid: u32) -> Option<String> {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_string())
}

pub fn cmdline(pid: u32) -> Option<Vec<String>> {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect(),
    )
}

/// Thread ids of a process.
pub fn tasks(pid: u32) -> Vec<u32> {
    numeric_entries(&format!("/proc/{pid}/task"))
}

/// Every process whose ancestry leads to one of `roots` (not including the roots), but for
/// gputrace itself and its own children: traced, a target that is gputrace's ancestor (a
/// shell, `--pid 1`) would have gputrace profile its own work and blame the target for it.
pub fn descendants(roots: &[u32]) -> Vec<u32> {
    let me = std::process::id();
    let parents: Vec<(u32, u32)> = numeric_entries("/proc")
        .into_iter()
        .filter(|&pid| pid != me)
        .filter_map(|pid| stat(pid).map(|s| (pid, s)))
        // An unreaped child died before the trace (its own children went to a reaper). A
        // process whose leader left by pthread_exit reads dead too, and lives on.
        .filter(|(pid, s)| !s.is_dead() || is_alive(*pid))
        .map(|(pid, s)| (pid, s.ppid))
        .collect();
    descendants_from(&parents, roots)
}

/// Pure part of [`descendants`]: `parents` is (pid, ppid) for every process.
pub fn descendants_from(parents: &[(u32, u32)], roots: &[u32]) -> Vec<u32> {
    let mut found: Vec<u32> = Vec::new();
    let mut frontier: Vec<u32> = roots.to_vec();
    while let Some(p) = frontier.pop() {
        for &(pid, ppid) in parents {
            if ppid == p && !roots.contains(&pid) && !found.contains(&pid) {
                found.push(pid);
                frontier.push(pid);
            }
        }
    }
    found.sort_unstable();
    found
}

fn numeric_entries(dir: &str) -> Vec<u32> {
    let mut v: Vec<u32> = fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort_unstable();
    v
}

/// Root, or the capabilities that loading tracing programs needs.
pub fn is_privileged() -> bool {
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let Some(eff) = fs::read_to_string("/proc/self/status").ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
    }) else {
        return false;
    };
    let has = |bit: u32| eff & (1u64 << bit) != 0;
    has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))
}

/// One line of /proc/PID/maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub perms: String,
    pub inode: u64,
    /// Empty for anonymous mappings; `[heap]`, `[stack]`, `[vdso]` for special ones.
    pub path: String,
}

impl Mapping {
    pub fn is_file(&self) -> bool {
        self.inode != 0 && self.path.starts_with('/')
    }
    pub fn is_exec(&self) -> bool {
        self.perms.as_bytes().get(2) == Some(&b'x')
    }
}

pub fn parse_maps(text: &str) -> Vec<Mapping> {
    text.lines().filter_map(parse_maps_line).collect()
}

fn parse_maps_line(line: &str) -> Option<Mapping> {
    let mut it = line.splitn(6, ' ');
    let range = it.next()?;
    let perms = it.next()?.to_string();
    let offset = u64::from_str_radix(it.next()?, 16).ok()?;
    let _dev = it.next()?;
    let inode = it.next()?.parse().ok()?;
    let path = it.next().unwrap_or("").trim_start().to_string();
    let (s, e) = range.split_once('-')?;
    Some(Mapping {
        start: u64::from_str_radix(s, 16).ok()?,
        end: u64::from_str_radix(e, 16).ok()?,
        offset,
        perms,
        inode,
        path,
    })
}

pub fn read_maps(pid: u32) -> Option<Vec<Mapping>> {
    let read = |id: u32| fs::read_to_string(format!("/proc/{id}/maps")).ok();
    let text = read(pid)?;
    if !text.is_empty() {
        return Some(parse_maps(&text));
    }
    // Empty for a leader that left while its threads run.
    match mm_pid(pid) {
        id if id != pid => read(id).map(|t| parse_maps(&t)),
        _ => Some(Vec::new()),
    }
}

/// Unloaded libraries' mappings kept per process (`with_unloaded`): a bound for a process that
/// loads and unloads code at ever new addresses all trace long.
pub const MAX_UNLOADED: usize = 64;

/// A process's `fresh` maps plus the executable file mappings of its `old` maps that are gone
/// and whose range no fresh mapping took: a library unloaded mid-trace (dlclose), whose
/// samples, symbolised at the end of the trace, keep its function names. A range that another
/// mapping took since names the later one (gputrace sees maps, not when each sample was
/// taken). At most [`MAX_UNLOADED`] are kept, the lowest addresses first. Sorted by start.
pub fn with_unloaded(old: &[Mapping], mut fresh: Vec<Mapping>) -> Vec<Mapping> {
    let gone: Vec<Mapping> = old
        .iter()
        .filter(|u| u.is_file() && u.is_exec())
        .filter(|u| {
            // `fresh` is sorted and without overlaps, so its ends are sorted too.
            let i = fresh.partition_point(|f| f.end <= u.start);
            fresh.get(i).is_none_or(|f| f.start >= u.end)
        })
        .take(MAX_UNLOADED)
        .cloned()
        .collect();
    if !gone.is_empty() {
        fresh.extend(gone);
        fresh.sort_by_key(|m| m.start);
    }
    fresh
}

/// A path through which a mapped file can be opened even from another mount namespace.
/// `pid` as [`mm_pid`] gives it: a leader that left while its threads run shows no mappings.
pub fn map_file_path(pid: u32, m: &Mapping) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end))
}

/// The file and file offset of `addr` in gputrace's own code, to put a uprobe there.
pub fn own_code(addr: u64) -> anyhow::Result<(PathBuf, u64)> {
    use anyhow::Context;
    let pid = std::process::id();
    let maps = read_maps(pid).context("read /proc/self/maps")?;
    let m = maps
        .iter()
        .find(|m| m.start <= addr && addr < m.end && m.is_file())
        .context("gputrace's own code is not in a mapped file")?;
    Ok((map_file_path(pid, m), addr - m.start + m.offset))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_is_run_time_and_run_delay() {
        assert_eq!(
            parse_schedstat("5853112345 8771000123 4021\n"),
            Some((5_853_112_345, 8_771_000_123))
        );
        assert_eq!(parse_schedstat("12\n"), None);
        assert_eq!(parse_schedstat(""), None);
        let me = std::process::id();
        assert!(schedstat(me, me).is_some_and(|(run, _)| run > 0));
    }

    /// A child started between two readings of the clock `bpf_ktime_get_ns` reads: its start
    /// time's floor lies within a tick before the first.
    #[test]
    fn a_start_time_is_on_the_probes_clock() {
        let tick = 1_000_000_000 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
        let before = crate::probes::ktime_now();
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let after = crate::probes::ktime_now();
        let st = stat(child.id());
        child.kill().ok();
        child.wait().ok();
        let floor = start_floor_ktime(st.expect("the child's stat").starttime).unwrap();
        assert!(
            floor + tick + 1_000_000 >= before && floor <= after,
            "start floor {floor}, spawned in {before}..{after}, tick {tick}"
        );
        assert_eq!(stat_if_any(u32::MAX).ok(), Some(None), "no such process");
    }

    /// A process whose main thread called `pthread_exit` runs on in its other threads.
    #[test]
    fn a_process_whose_leader_left_is_alive() {
        let py = "import threading, time, ctypes\n\
                  threading.Thread(target=time.sleep, args=(5,)).start()\n\
                  ctypes.CDLL(None).pthread_exit(None)\n";
        let Ok(mut child) = std::process::Command::new("python3")
            .args(["-c", py])
            .spawn()
        else {
            eprintln!("!!! no python3: a_process_whose_leader_left_is_alive not run");
            assert!(std::env::var_os("CI").is_none(), "python3 is needed");
            return;
        };
        let pid = child.id();
        let zombie = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            stat(pid).is_some_and(|s| s.state == 'Z')
        });
        let alive = is_alive(pid);
        let mm = mm_pid(pid);
        let maps = read_maps(pid);
        let exe_link = maps.as_ref().and_then(|ms| {
            let m = ms.iter().find(|m| m.is_file() && m.is_exec())?;
            fs::read_link(map_file_path(mm, m)).ok()
        });
        child.kill().ok();
        child.wait().ok();
        assert!(zombie, "the leader never left");
        assert!(alive, "its other thread still runs");
        assert_ne!(mm, pid, "its memory is seen through a live thread");
        let maps = maps.expect("maps");
        let exe = maps
            .iter()
            .find(|m| m.is_file() && m.is_exec())
            .expect("code mapped");
        assert!(
            exe_link.is_some_and(|l| l == std::path::Path::new(&exe.path)),
            "{exe:?}"
        );
        assert!(!is_alive(pid), "reaped");
    }

    #[test]
    fn kernel_stacks_are_function_names_innermost_first() {
        let s = "[<0>] wait_woken+0x89/0x90\n[<0>] n_tty_read+0x4bd/0x660\n\
                 [<0>] os_wait+0x1/0x2 [nvidia]\n[<0>] entry_SYSCALL_64_after_hwframe+0x76/0x7e\n";
        assert_eq!(
            parse_kernel_stack(s),
            [
                "wait_woken",
                "n_tty_read",
                "os_wait",
                "entry_SYSCALL_64_after_hwframe"
            ]
        );
        assert!(parse_kernel_stack("").is_empty());
        // This test's own thread, running, has none to show; a missing one neither.
        assert!(kernel_stack(u32::MAX, u32::MAX).is_empty());
    }

    fn mapping(start: u64, end: u64, perms: &str, path: &str) -> Mapping {
        Mapping {
            start,
            end,
            offset: 0,
            perms: perms.into(),
            inode: if path.starts_with('/') { 7 } else { 0 },
            path: path.into(),
        }
    }

    #[test]
    fn unloaded_libraries_stay_until_their_range_is_taken() {
        let exe = mapping(0x1000, 0x2000, "r-xp", "/usr/bin/app");
        let lib = mapping(0x5000, 0x6000, "r-xp", "/opt/libhot.so");
        let lib_data = mapping(0x6000, 0x7000, "rw-p", "/opt/libhot.so");
        let anon = mapping(0x8000, 0x9000, "rwxp", "");
        let old = vec![exe.clone(), lib.clone(), lib_data, anon];

        // dlclose: only the library's code stays (data and anonymous memory are not code).
        let after = with_unloaded(&old, vec![exe.clone()]);
        assert_eq!(after, vec![exe.clone(), lib.clone()]);
        // Read again later: still there.
        assert_eq!(with_unloaded(&after, vec![exe.clone()]), after);
        // Loaded again where it was: once, as the fresh mapping.
        let again = with_unloaded(&after, vec![exe.clone(), lib.clone()]);
        assert_eq!(again, vec![exe.clone(), lib.clone()]);
        // Another library took part of its range: the later one names those addresses.
        let other = mapping(0x5800, 0x6800, "r-xp", "/opt/libother.so");
        let taken = with_unloaded(&after, vec![exe.clone(), other.clone()]);
        assert_eq!(taken, vec![exe.clone(), other]);
        // Below and above the fresh mappings, sorted by start.
        let low = mapping(0x100, 0x200, "r-xp", "/opt/liblow.so");
        let merged = with_unloaded(&[low.clone(), lib.clone()], vec![exe.clone()]);
        assert_eq!(merged, vec![low, exe, lib]);
    }

    #[test]
    fn unloaded_libraries_are_bounded() {
        let old: Vec<Mapping> = (0..MAX_UNLOADED as u64 + 10)
            .map(|i| {
                mapping(
                    0x10_000 * (i + 1),
                    0x10_000 * (i + 1) + 0x1000,
                    "r-xp",
                    "/l.so",
                )
            })
            .collect();
        assert_eq!(with_unloaded(&old, Vec::new()).len(), MAX_UNLOADED);
    }

    #[test]
    fn exec_sizes_from_status() {
        let status = "Name:\tpython\nVmExe:\t    2868 kB\nVmLib:\t   28112 kB\nThreads:\t3\n";
        assert_eq!(parse_exec_sizes(status), Some((2868, 28112)));
        // A kernel thread has no memory map, and so no sizes.
        assert_eq!(parse_exec_sizes("Name:\tkthreadd\nThreads:\t1\n"), None);
        let own = exec_sizes(std::process::id()).expect("own status");
        assert!(own.0 > 0 && own.1 > 0, "{own:?}");
    }

    #[test]
    fn stat_with_odd_comm() {
        let line = "42 (a b) c)) S 7 42 42 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 987654 1 2";
        assert_eq!(parse_stat(line).unwrap().starttime, 987654);
        let s = parse_stat("42 (a b) c)) S 7 42 42 0 -1").unwrap();
        assert_eq!(s.starttime, 0);
        assert_eq!(s.comm, "a b) c)");
        assert_eq!(s.state, 'S');
        assert_eq!(s.ppid, 7);
    }

    #[test]
    fn kernel_threads_and_thread_ids_are_told_from_processes() {
        // kthreadd's line (PF_KTHREAD set in field 9), and a user process's.
        let kthread = "2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 2 0 0";
        assert_eq!(parse_stat_flags(kthread), Some(2129984));
        assert_ne!(parse_stat_flags(kthread).unwrap() & PF_KTHREAD, 0);
        let user = "42 (a b) c)) S 7 42 42 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 987654 1 2";
        assert_eq!(parse_stat_flags(user).unwrap() & PF_KTHREAD, 0);
        assert_eq!(parse_stat_flags("42 (x) S 7"), None);
        assert_eq!(
            parse_status_tgid(
                "Name:\tpython3\nUmask:\t0022\nState:\tS\nTgid:\t15761\nPid:\t15804\n"
            ),
            Some(15761)
        );
        assert_eq!(parse_status_tgid("Name:\tx\n"), None);
        // Ours is a process; a kernel thread (any: in a pid namespace there may be none to
        // see) is one; a thread of ours is a thread.
        let me = std::process::id();
        assert_eq!(not_a_process(me), None);
        let kthread = fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .find(|&p| {
                fs::read_to_string(format!("/proc/{p}/stat"))
                    .ok()
                    .and_then(|s| parse_stat_flags(&s))
                    .is_some_and(|f| f & PF_KTHREAD != 0)
            });
        if let Some(k) = kthread {
            assert_eq!(not_a_process(k), Some(NotAProcess::KernelThread));
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(unsafe { libc::gettid() } as u32).unwrap();
            let _ = done_rx.recv();
        });
        let tid = rx.recv().unwrap();
        assert_eq!(not_a_process(tid), Some(NotAProcess::Thread { tgid: me }));
        drop(done_tx);
        t.join().unwrap();
    }

    #[test]
    fn maps_lines() {
        let m = parse_maps(
            "55d0c0a00000-55d0c0a21000 r-xp 00002000 08:01 1234   /usr/bin/cat\n\
             7ffd1c9f0000-7ffd1ca11000 rw-p 00000000 00:00 0                          [stack]\n\
             7f0000000000-7f0000001000 rw-p 00000000 00:00 0 \n",
        );
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].start, 0x55d0c0a00000);
        assert_eq!(m[0].offset, 0x2000);
        assert!(m[0].is_file() && m[0].is_exec());
        assert_eq!(m[1].path, "[stack]");
        assert!(!m[1].is_file());
        assert_eq!(m[2].path, "");
    }

    #[test]
    fn descendant_tree() {
        let parents = [(10, 1), (11, 10), (12, 11), (13, 1), (14, 12)];
        assert_eq!(descendants_from(&parents, &[10]), vec![11, 12, 14]);
        assert!(descendants_from(&parents, &[14]).is_empty());
    }
}
