//! Reads the accounting maps at the end of a trace and fills the report and the folded stacks.

use std::collections::{BTreeMap, HashMap as StdHashMap};

use anyhow::{Context, Result};
use aya::{maps::MapData, Ebpf};
use tracer_common::{
    python::{PySeed, PY_SEED_MAP, PY_STACK_PENDING},
    time::Category,
    wall::{
        BlkKey, BlkStat, FdGenKey, FdKey, FdName, FdStat, LifeKey, LifeVal, SysHeld, SysKey,
        SysStat, ThreadState, WallKey, WallVal, BLOCK_MAP, ERRNOS_MAP, FD_GEN_MAP, FD_NAMES_MAP,
        FD_NAME_WAYS, FILEIO_MAP, GIL_HOLDER_UNKNOWN, KIND_BLOCKED, KSTACK_SEEDED, LIFE_MAP,
        PHASE_ONCPU, SYSCALLS_MAP, SYS_HELD_MAP, WALL_MAP,
    },
};

use super::{
    aggregate::{self, Row, ThreadTime},
    classify::{self, Verdict},
    render, sites, syscall_names,
};
use crate::{
    collect::Stacks,
    probes::FinishCtx,
    report::{
        model::{
            time::{BlockIo, DirIo, ErrnoCount, FileIo, SyscallStat},
            ThreadReport,
        },
        ReportData,
    },
};

/// The fds seen doing I/O whose file is still the one open now (no close since): those can
/// be resolved from /proc.
pub fn open_fds(ebpf: &Ebpf, gens: &BTreeMap<(u32, i32), u32>) -> Vec<FdKey> {
    crate::batch::read::<FdKey, FdStat>(ebpf, FILEIO_MAP)
        .map(|v| {
            v.into_iter()
                .map(|(k, _)| k)
                .filter(|k| gens.get(&(k.tgid, k.fd)).copied().unwrap_or(0) == k.gen)
                .collect()
        })
        .unwrap_or_default()
}

/// The parent of `pid` whose standard fds it got, if that is known for sure: it was seen fork
/// once the syscall programs counted closes and `dup2`s (`seen_since`; a process that existed
/// at the attach may have replaced what its parent gave it, unseen), and its parent's pid is
/// still its parent's: not forgotten (its fd generations gone with it, read as none), not
/// taken by a later process.
pub(super) fn parent_for_fds(
    tracker: &crate::tracker::Tracker,
    forgotten: &PidSet,
    seen_since: Option<u64>,
    pid: u32,
) -> Option<u32> {
    let t = tracker.procs.get(&pid)?;
    let at = t.forked_at?;
    if at < seen_since? {
        return None;
    }
    let parent = t.info.ppid?;
    let later = tracker
        .procs
        .get(&parent)?
        .forked_at
        .is_some_and(|p| p > at);
    (!later && !forgotten.contains(parent) && !tracker.pids_reused.contains(&parent))
        .then_some(parent)
}

/// A set of pids, as bits (512 KiB for Linux's largest pid space, allocated at the first).
#[derive(Debug, Default)]
pub struct PidSet(Vec<u64>);

impl PidSet {
    pub fn insert(&mut self, pid: u32) {
        let (w, b) = (pid as usize / 64, pid % 64);
        if self.0.len() <= w {
            self.0.resize((w + 1).max(1 << 16), 0);
        }
        self.0[w] |= 1 << b;
    }

    pub fn remove(&mut self, pid: u32) {
        if let Some(w) = self.0.get_mut(pid as usize / 64) {
            *w &= !(1 << (pid % 64));
        }
    }

    pub fn contains(&self, pid: u32) -> bool {
        self.0
            .get(pid as usize / 64)
            .is_some_and(|w| w & (1 << (pid % 64)) != 0)
    }
}

/// Each fd's current generation (successful closes of that fd number so far): a `FILEIO` row
/// of an older generation is a closed file's.
pub(super) fn fd_gens(ebpf: &Ebpf) -> Result<BTreeMap<(u32, i32), u32>> {
    Ok(crate::batch::read::<FdGenKey, u32>(ebpf, FD_GEN_MAP)?
        .into_iter()
        .map(|(k, g)| ((k.tgid, k.fd), g))
        .collect())
}

/// The paths files were opened by (`FD_NAMES`), for `file_name`.
pub(crate) fn opened_paths(ebpf: &Ebpf) -> Option<aya::maps::Array<&MapData, FdName>> {
    ebpf.map(FD_NAMES_MAP)
        .and_then(|m| aya::maps::Array::try_from(m).ok())
}

/// The name of the file `k`: resolved while it was open (an absolute path), else the name a
/// files pass gave an earlier row of it (`recent`: a thread writes the rest of a file's I/O
/// it held as a row of its own, perhaps after the file's `FD_NAMES` slot went to another
/// open), else the path it was opened by (`FD_NAMES`, if its set still holds it), else its
/// parent's ([`inherited`]), or none: a later file under the same fd number must not lend it
/// its name.
pub(super) fn file_name(
    fds: &BTreeMap<FdKey, String>,
    recent: &StdHashMap<FdKey, String>,
    opened: Option<&aya::maps::Array<&MapData, FdName>>,
    k: &FdKey,
    lineage: &Lineage,
) -> String {
    let slot = |k: &FdKey| opened.and_then(|m| opened_slot(m, k));
    named(fds, recent, &slot, k, lineage, 0).unwrap_or_else(|| format!("<closed fd {}>", k.fd))
}

/// What a slot of `FD_NAMES` says of its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Slot {
    /// The path it was opened by.
    Path(String),
    /// Left blank (two files opened under the key, past an exec's or close_range's closes,
    /// which move no generation on).
    Blank,
    /// The file a dup (`dup`, `dup2`, `dup3`, fcntl `F_DUPFD`) put there: that of this fd and
    /// generation of the process.
    Dup(i32, u32),
}

/// Dups followed at most to name a file (a dup of a dup of ...).
const MAX_DUPS: usize = 4;

/// [`file_name`], or none; `slot` reads a key's slot.
fn named(
    fds: &BTreeMap<FdKey, String>,
    recent: &StdHashMap<FdKey, String>,
    slot: &dyn Fn(&FdKey) -> Option<Slot>,
    k: &FdKey,
    lineage: &Lineage,
    depth: usize,
) -> Option<String> {
    if let Some(n) = fds.get(k).or_else(|| recent.get(k)) {
        return Some(n.clone());
    }
    // A slot of its own, even one left blank: not the file it inherited.
    match slot(k) {
        Some(Slot::Path(p)) => Some(p),
        Some(Slot::Blank) => None,
        Some(Slot::Dup(fd, gen)) if depth < MAX_DUPS => {
            let source = FdKey { fd, gen, ..*k };
            named(fds, recent, slot, &source, lineage, depth + 1)
        }
        Some(Slot::Dup(..)) => None,
        None => inherited(fds, k, lineage),
    }
}

/// Who handed a process its standard fds: its parent, for a process forked during the trace
/// (`parent`), and each fd's generation now (`gens`: closes of that fd number seen so far).
pub struct Lineage<'a> {
    pub parent: &'a dyn Fn(u32) -> Option<u32>,
    pub gens: &'a BTreeMap<(u32, i32), u32>,
}

/// The name of a standard fd (0-2) a process got from its parent at fork: one it never closed
/// or replaced (its first generation), in a process forked during the trace, whose parent
/// still has that fd's first generation, named from /proc while open (`fds`: a process
/// forgotten since has no names there). Up the ancestors while each inherited it: a shell's
/// children write to the stdout gputrace's command had, and exit before /proc can be read.
/// Other fds are left unnamed: a file a child opened itself whose name went unseen would take
/// its parent's file's name.
fn inherited(fds: &BTreeMap<FdKey, String>, k: &FdKey, lineage: &Lineage) -> Option<String> {
    if !(0..=2).contains(&k.fd) || k.gen != 0 {
        return None;
    }
    let mut tgid = k.tgid;
    for _ in 0..8 {
        let parent = (lineage.parent)(tgid)?;
        if lineage.gens.get(&(parent, k.fd)).copied().unwrap_or(0) != 0 {
            return None;
        }
        let key = FdKey { tgid: parent, ..*k };
        if let Some(name) = fds.get(&key) {
            return Some(name.clone());
        }
        tgid = parent;
    }
    None
}

/// What user space learned about the threads and files while they were alive.
pub struct Learned<'a> {
    /// (tgid, tid) -> thread name.
    pub comms: &'a BTreeMap<u32, (u32, String)>,
    /// Files by fd and open generation, read from /proc.
    pub fds: &'a BTreeMap<FdKey, String>,
    /// The kernel frames of the waits threads were seeded in (`KSTACK_SEEDED`).
    pub seeded: &'a super::SeededStacks,
    /// Processes whose fd generations and names were forgotten ([`parent_for_fds`]).
    pub forgotten: &'a PidSet,
    /// Since when the syscall programs have counted closes, if they do now.
    pub fds_seen_since: Option<u64>,
}

pub fn fill(
    ebpf: &Ebpf,
    ctx: &mut FinishCtx<'_>,
    data: &mut ReportData,
    end: u64,
    learned: Learned<'_>,
    mut retired: super::retire::Retired,
) -> Result<()> {
    let Learned {
        comms,
        fds,
        seeded,
        forgotten,
        fds_seen_since,
    } = learned;
    let mut rows: Vec<Row> = crate::batch::read::<WallKey, WallVal>(ebpf, WALL_MAP)?
        .into_iter()
        .map(|(key, val)| Row { key, val })
        .chain(std::mem::take(&mut retired.wall))
        .chain(
            std::mem::take(&mut retired.folded_wall)
                .into_iter()
                .map(|(key, val)| Row { key, val }),
        )
        .collect();
    let mut open: Vec<(u32, ThreadState)> = super::States::open(ebpf)?.all(ebpf)?;
    // What the kernel would have done had these waits ended now.
    let seeds: StdHashMap<u32, PySeed> = crate::batch::read::<u32, PySeed>(ebpf, PY_SEED_MAP)
        .unwrap_or_default()
        .into_iter()
        .collect();
    for (tid, st) in open.iter_mut() {
        if st.off_pystack == PY_STACK_PENDING && st.phase != PHASE_ONCPU {
            if let Some(s) = seeds.get(tid).filter(|s| s.off_ns == st.off_ns) {
                st.off_pystack = s.key;
            }
        }
    }
    rows.extend(
        open.iter()
            .flat_map(|(tid, st)| aggregate::open_rows(*tid, st, end)),
    );
    let mut deaths: Vec<(LifeKey, LifeVal)> = crate::batch::read(ebpf, LIFE_MAP)?;
    deaths.append(&mut retired.deaths);
    // A thread that ended between two looks at /proc is named as it died: the terminal, the
    // JSON and the off-CPU stacks had it nameless ('?'), its CPU samples under its name.
    let mut comms = comms.clone();
    for (k, v) in &deaths {
        let name = crate::session::comm_str(&v.comm);
        if !name.is_empty() {
            comms.entry(k.tid).or_insert((v.tgid, name));
        }
    }
    let comms = &comms;

    let gens = fd_gens(ebpf).unwrap_or_default();
    let copies = std::mem::take(&mut retired.copies);
    data.report.followed.young_stacks_copied = copies.len() as u64;
    data.report.followed.young_stacks_not_copied = copies.not_copied;
    if copies.missing > 0 {
        data.report.warnings.push(format!(
            "{} time rows of dead threads found their young stack gone from its map when \
             taken (freed while they held it: a gputrace bug); they show no user stack",
            copies.missing
        ));
    }
    let mut stacks = Stacks::new(ebpf)?.with_copies(&copies);
    let mut kframes: StdHashMap<(i32, u32), Vec<String>> = StdHashMap::new();
    let mut verdicts: StdHashMap<WallKey, Category> = StdHashMap::new();
    let mut uframes: StdHashMap<(u32, i32), Vec<String>> = StdHashMap::new();
    let mut linked: StdHashMap<(u32, i32), Option<String>> = StdHashMap::new();
    let tracker = ctx.tracker;
    let sym = &mut *ctx.symbolizer;
    let folded = std::mem::take(&mut retired.folded_lives);
    let threads = aggregate::threads(&rows, &[], &deaths, &folded, end, |k| {
        let v = if k.gil_wait() {
            classify::gil_wait(k.sys_nr)
        } else if k.kind == KIND_BLOCKED {
            // Seeded frames are a thread's own: keyed by its tid too.
            let seeded_tid = if k.kstack == KSTACK_SEEDED { k.tid } else { 0 };
            let frames = kframes.entry((k.kstack, seeded_tid)).or_insert_with(|| {
                render::kernel_frames(k, seeded, &mut stacks, sym)
                    .into_iter()
                    .map(|f| f.name)
                    .collect()
            });
            let names: Vec<&str> = frames.iter().map(String::as_str).collect();
            let user = uframes.entry((k.tgid, k.ustack)).or_insert_with(|| {
                let (maps, alive) = match tracker.procs.get(&k.tgid) {
                    Some(t) => (t.maps.as_slice(), !t.info.exited),
                    None => (&[][..], false),
                };
                stacks
                    .user(k.ustack)
                    .map(<[u64]>::to_vec)
                    .map(|ips| {
                        sym.user(k.tgid, maps, alive, &ips)
                            .into_iter()
                            .map(|f| f.name)
                            .collect()
                    })
                    .unwrap_or_default()
            });
            let unames: Vec<&str> = user.iter().map(String::as_str).collect();
            // A wait without a kernel stack, in a syscall on an fd: the file it waits on. One
            // whose syscall has not returned (an idle worker's read of its pipe) left no I/O
            // row for /proc to have named: what /proc shows under the fd now, while the
            // process lives.
            let file = (k.fd1 != 0).then(|| k.fd1 as i32 - 1).and_then(|fd| {
                file_of(fds, &gens, k.tgid, fd)
                    .map(str::to_owned)
                    .or_else(|| {
                        linked
                            .entry((k.tgid, fd))
                            .or_insert_with(|| {
                                // Not a pid reused since the traced process exited.
                                let alive =
                                    tracker.procs.get(&k.tgid).is_some_and(|t| !t.info.exited);
                                alive
                                    .then(|| {
                                        std::fs::read_link(format!("/proc/{}/fd/{fd}", k.tgid))
                                    })
                                    .and_then(Result::ok)
                                    .map(|p| p.display().to_string())
                            })
                            .clone()
                    })
            });
            classify::blocked_with_file(k.sys_nr, k.state, &names, &unames, file.as_deref())
        } else if k.kind == Category::Runqueue as u32 {
            Verdict {
                category: Category::Runqueue,
                reason: classify::runqueue_reason(k.state).into(),
            }
        } else {
            let category = Category::from_u32(k.kind).unwrap_or(Category::Other);
            Verdict {
                category,
                reason: if category == Category::Cpu {
                    "on-CPU".into()
                } else {
                    category.name().into()
                },
            }
        };
        verdicts.insert(*k, v.category);
        v
    });

    // Every instance's, those of processes the report does not remember included: the
    // overhead estimate prices all their syscalls (`overhead::complete`).
    data.report
        .overhead
        .get_or_insert_with(Default::default)
        .traced_alive_ns = Some(threads.iter().map(ThreadTime::alive_ns).sum());
    fill_time(data, &threads, &folded, comms);
    // Before the syscall tables are made: under process churn each holds tens of MB at once.
    drop(threads);
    let site_rows: Vec<sites::SiteRow> = rows
        .iter()
        .filter(|r| r.key.pystack != 0 || r.key.gil != 0)
        .filter_map(|r| {
            let k = &r.key;
            let category = *verdicts.get(k)?;
            Some(sites::SiteRow {
                tgid: k.tgid,
                tid: k.tid,
                category,
                frame: ctx.python.innermost(k.tgid, k.pystack),
                call: render::cuda_call(k, category),
                gil_holder: k.gil_wait().then(|| {
                    (k.gil != GIL_HOLDER_UNKNOWN)
                        .then(|| ctx.python.thread_of(k.tgid, k.gil))
                        .flatten()
                }),
                ns: r.val.ns,
            })
        })
        .collect();
    sites::fill(&mut data.report.processes, &site_rows, |tid| {
        if tid == aggregate::FOLDED_TID {
            return aggregate::FOLDED_COMM.to_string();
        }
        comms.get(&tid).map(|c| c.1.clone()).unwrap_or_default()
    });
    let closed = std::mem::take(&mut retired.files);
    let gone_block = std::mem::take(&mut retired.block);
    let recent = retired.take_recent_names();
    fill_syscalls(ebpf, data, retired)?;
    let gens = fd_gens(ebpf).unwrap_or_default();
    let parent = |pid: u32| parent_for_fds(ctx.tracker, forgotten, fds_seen_since, pid);
    let lineage = Lineage {
        parent: &parent,
        gens: &gens,
    };
    fill_files(
        ebpf,
        data,
        (fds, &recent),
        ctx.args.top,
        &open,
        &closed,
        &lineage,
    )?;
    fill_block(ebpf, data, &open, gone_block)?;
    data.time = render::folded(&rows, &verdicts, ctx, data, comms, seeded, &mut stacks);
    Ok(())
}

/// Each listed thread's index in `threads`, by tid: a thread storm lists tens of thousands
/// before the report is bounded.
fn places(threads: &[ThreadReport]) -> StdHashMap<u32, usize> {
    threads
        .iter()
        .enumerate()
        .map(|(i, t)| (t.tid, i))
        .collect()
}

fn user_percent(samples: u64, kernel: u64) -> Option<f64> {
    (samples > 0).then(|| 100.0 * samples.saturating_sub(kernel) as f64 / samples as f64)
}

/// `folded`: the exited threads of each process whose time is in its `FOLDED_TID` entry.
fn fill_time(
    data: &mut ReportData,
    threads: &[ThreadTime],
    folded: &BTreeMap<u32, aggregate::FoldedLives>,
    comms: &BTreeMap<u32, (u32, String)>,
) {
    let mut warnings = Vec::new();
    let mut by_process: StdHashMap<u32, Vec<&ThreadTime>> = StdHashMap::new();
    for t in threads {
        by_process.entry(t.tgid).or_default().push(t);
    }
    for p in data.report.processes.iter_mut() {
        let Some(mine) = by_process.get(&p.pid) else {
            continue;
        };
        let kernel: u64 = p.threads.iter().map(|t| t.kernel_samples).sum();
        p.time = Some(aggregate::breakdown(
            mine.iter().copied(),
            user_percent(p.samples, kernel),
        ));
        // By tid, and the listed threads' places: a thread storm has tens of thousands.
        let mut by_tid: BTreeMap<u32, Vec<&ThreadTime>> = BTreeMap::new();
        for t in mine {
            // Folded threads count in the process's time above, not as threads of their own.
            if t.tid != aggregate::FOLDED_TID {
                by_tid.entry(t.tid).or_default().push(t);
            }
        }
        let mut place = places(&p.threads);
        for (tid, instances) in by_tid {
            let idx = match place.get(&tid) {
                Some(&i) => i,
                None => {
                    p.threads.push(ThreadReport {
                        tid,
                        // A thread that lived less than the 500 ms between /proc reads has
                        // no name of its own; the main thread has the process's.
                        comm: comms
                            .get(&tid)
                            .map(|c| c.1.clone())
                            .or_else(|| (tid == p.pid).then(|| p.comm.clone()))
                            .unwrap_or_default(),
                        samples: 0,
                        kernel_samples: 0,
                        top_self: Vec::new(),
                        top_python: Vec::new(),
                        time: None,
                        syscalls: Vec::new(),
                        python_sites: Vec::new(),
                    });
                    place.insert(tid, p.threads.len() - 1);
                    p.threads.len() - 1
                }
            };
            let t = &mut p.threads[idx];
            // The name /proc gave after its last rename: a thread the sampler caught only
            // under an earlier name (its first microseconds, before it named itself) was
            // listed under that name (`time_accounting::threads_renamed_while_traced...`
            // failed so, now and then, in CI).
            if let Some((_, c)) = comms.get(&tid).filter(|c| !c.1.is_empty()) {
                t.comm = c.clone();
            }
            let b = aggregate::breakdown(instances, user_percent(t.samples, t.kernel_samples));
            if !aggregate::invariant_holds(&b, 0.01) {
                warnings.push(format!(
                    "time accounting of thread {tid} (pid {}) is off: {} ns accounted of {} ns alive",
                    p.pid, b.accounted_ns, b.alive_ns
                ));
            }
            t.time = Some(b);
        }
        // Folded threads the list has no entry for (CPU samples give one) are threads it does
        // not list: every folded life, less one for each tid the list has. Counted by lives,
        // not by tids: where tids wrap (pid_max 32,768) a storm of 400,000 threads reused each
        // tid a dozen times and read as 32,444 threads.
        if let Some(f) = folded.get(&p.pid) {
            let listed = f.tids.iter().filter(|t| place.contains_key(t)).count() as u64;
            p.threads_not_listed += f.threads.saturating_sub(listed);
        }
        p.threads.sort_by_key(|t| t.tid);
    }
    data.report.warnings.extend(warnings);
}

fn errno_name(e: i32) -> String {
    let n = match e {
        1 => "EPERM",
        2 => "ENOENT",
        3 => "ESRCH",
        4 => "EINTR",
        5 => "EIO",
        9 => "EBADF",
        10 => "ECHILD",
        11 => "EAGAIN",
        12 => "ENOMEM",
        13 => "EACCES",
        14 => "EFAULT",
        17 => "EEXIST",
        22 => "EINVAL",
        25 => "ENOTTY",
        29 => "ESPIPE",
        32 => "EPIPE",
        34 => "ERANGE",
        38 => "ENOSYS",
        61 => "ENODATA",
        104 => "ECONNRESET",
        107 => "ENOTCONN",
        110 => "ETIMEDOUT",
        111 => "ECONNREFUSED",
        115 => "EINPROGRESS",
        _ => return format!("errno {e}"),
    };
    n.to_string()
}

/// A histogram up to its last bucket used, sized to it: a storm of short processes makes
/// ~100,000 syscall rows, and the whole array is 256 bytes.
fn used_buckets(hist: &[u64]) -> Vec<u64> {
    let used = hist.iter().rposition(|&n| n != 0).map_or(0, |i| i + 1);
    hist[..used].to_vec()
}

fn to_stat(nr: i32, s: &SysStat, errnos: &BTreeMap<i32, u64>) -> SyscallStat {
    let hist = used_buckets(&s.hist);
    let mut errnos: Vec<ErrnoCount> = errnos
        .iter()
        .map(|(e, n)| ErrnoCount {
            errno: errno_name(*e),
            count: *n,
        })
        .collect();
    errnos.sort_by_key(|x| std::cmp::Reverse(x.count));
    SyscallStat {
        name: syscall_names::name(nr as i64),
        nr: nr as i64,
        count: s.count,
        errors: s.errors,
        total_ns: s.total_ns,
        min_ns: s.min_ns,
        max_ns: s.max_ns,
        hist_log2_ns: hist,
        bytes: s.bytes,
        errnos,
        timed: (s.timed < s.count).then_some(s.timed),
    }
}

/// The syscall rows threads still hold (`SysHeld`): live threads', and those of threads whose
/// death went unseen.
fn held_syscalls(ebpf: &Ebpf) -> Vec<(SysKey, SysStat)> {
    let Some(held) = ebpf
        .map(SYS_HELD_MAP)
        .and_then(|m| aya::maps::Array::<_, SysHeld>::try_from(m).ok())
    else {
        return Vec::new();
    };
    held.iter().filter_map(|r| r.ok()?.row()).collect()
}

fn fill_syscalls(
    ebpf: &Ebpf,
    data: &mut ReportData,
    mut retired: super::retire::Retired,
) -> Result<()> {
    let mut rows: Vec<(SysKey, SysStat)> = crate::batch::read(ebpf, SYSCALLS_MAP)?;
    rows.extend(held_syscalls(ebpf));
    let stats = retired.syscalls_with(rows);
    let errs = retired.errnos_with(crate::batch::read(ebpf, ERRNOS_MAP)?);
    let mut by_call: BTreeMap<(u32, u32, i32), BTreeMap<i32, u64>> = BTreeMap::new();
    for (k, n) in errs {
        *by_call
            .entry((k.tgid, k.tid, k.nr))
            .or_default()
            .entry(k.errno)
            .or_default() += n;
    }
    let empty = BTreeMap::new();
    let untimed: u64 = stats
        .values()
        .map(|s| s.count.saturating_sub(s.timed))
        .sum();
    if untimed > 0 {
        let o = data.report.overhead.get_or_insert_with(Default::default);
        o.syscalls_timed = Some(crate::report::model::overhead::SyscallTiming {
            one_in: 1 << tracer_common::wall::SYS_TIME_SHIFT,
            untimed_calls: untimed,
            gap_us: tracer_common::wall::SYS_TIME_GAP_NS / 1000,
        });
    }
    // Moved out of the map, and dropped process by process as its tables are made: a storm of
    // short processes holds 200,000 retired rows (~100 MB), which stayed whole beside the
    // tables made from them (~140 MB) until the last process's.
    let mut by_process: StdHashMap<u32, Vec<(SysKey, super::retire::SysRow)>> = StdHashMap::new();
    for row in stats {
        by_process.entry(row.0.tgid).or_default().push(row);
    }
    for p in data.report.processes.iter_mut() {
        // The process's table: its threads' rows and errno counts summed per syscall.
        let mut per_proc: BTreeMap<i32, (SysStat, BTreeMap<i32, u64>)> = BTreeMap::new();
        let place = places(&p.threads);
        for (k, s) in by_process.remove(&p.pid).into_iter().flatten() {
            let s = s.whole();
            let errnos = by_call.get(&(k.tgid, k.tid, k.nr)).unwrap_or(&empty);
            let (sum, sum_errnos) = per_proc.entry(k.nr).or_default();
            sum.add(&s);
            for (e, n) in errnos {
                *sum_errnos.entry(*e).or_default() += n;
            }
            if let Some(&i) = place.get(&k.tid) {
                p.threads[i].syscalls.push(to_stat(k.nr, &s, errnos));
            }
        }
        for t in p.threads.iter_mut() {
            t.syscalls.sort_by_key(|x| std::cmp::Reverse(x.total_ns));
            // Grown a row at a time: up to twice its rows' room, kept until the report is
            // bounded (~60,000 one-thread processes under a shell loop).
            t.syscalls.shrink_to_fit();
        }
        p.syscalls = per_proc
            .into_iter()
            .map(|(nr, (s, errnos))| to_stat(nr, &s, &errnos))
            .collect();
        p.syscalls.sort_by_key(|x| std::cmp::Reverse(x.total_ns));
    }
    Ok(())
}

/// `names`: what /proc named while the files were open, and what the files passes named.
fn fill_files(
    ebpf: &Ebpf,
    data: &mut ReportData,
    (fds, recent): (&BTreeMap<FdKey, String>, &StdHashMap<FdKey, String>),
    top: usize,
    open: &[(u32, ThreadState)],
    closed: &BTreeMap<(u32, String), FdStat>,
    lineage: &Lineage,
) -> Result<()> {
    let mut rows: Vec<(FdKey, FdStat)> = crate::batch::read(ebpf, FILEIO_MAP)?;
    // The paths files were opened by: for those closed before /proc showed them.
    let opened = opened_paths(ebpf);
    // What live threads hold on top of their rows (`ThreadState::held_file`).
    rows.extend(open.iter().filter_map(|(_, st)| st.held_file()));
    // By process: a storm of short processes lists tens of thousands, each of which went
    // through every row.
    let mut by_process: StdHashMap<u32, Vec<&(FdKey, FdStat)>> = StdHashMap::new();
    for r in &rows {
        by_process.entry(r.0.tgid).or_default().push(r);
    }
    for p in data.report.processes.iter_mut() {
        let mut files: BTreeMap<String, FileIo> = BTreeMap::new();
        let in_maps = by_process
            .remove(&p.pid)
            .into_iter()
            .flatten()
            .map(|(k, s)| (file_name(fds, recent, opened.as_ref(), k, lineage), s));
        // Closed files taken out of the map during the trace, named then.
        let taken = closed
            .range((p.pid, String::new())..)
            .take_while(|((t, _), _)| *t == p.pid)
            .map(|((_, name), s)| (name.clone(), s));
        for (name, s) in in_maps.chain(taken) {
            let f = files.entry(name.clone()).or_insert_with(|| FileIo {
                file: name,
                ..Default::default()
            });
            f.ns += s.ns;
            f.bytes += s.bytes;
            f.calls += s.calls;
            f.timed = Some(f.timed.unwrap_or(0) + s.timed);
        }
        for f in files.values_mut() {
            f.timed = f.timed.filter(|&t| t < f.calls);
        }
        let mut files: Vec<FileIo> = files.into_values().collect();
        p.dirs = rollup_dirs(&files, top.max(1));
        files.sort_by_key(|x| std::cmp::Reverse(x.ns));
        files.truncate(top.max(1));
        p.files = files;
    }
    Ok(())
}

/// The directories of the named files (paths, not pipes, sockets or unnamed fds) that hold two
/// files or more, the `top` costliest first.
fn rollup_dirs(files: &[FileIo], top: usize) -> Vec<DirIo> {
    let mut dirs: BTreeMap<&str, DirIo> = BTreeMap::new();
    for f in files {
        if f.file.starts_with('<') || f.file.contains(":[") {
            continue;
        }
        let Some(cut) = f.file.rfind('/') else {
            continue;
        };
        let dir = if cut == 0 { "/" } else { &f.file[..cut] };
        let d = dirs.entry(dir).or_insert_with(|| DirIo {
            dir: dir.to_string(),
            ..Default::default()
        });
        d.files += 1;
        d.ns += f.ns;
        d.bytes += f.bytes;
        d.calls += f.calls;
    }
    let mut dirs: Vec<DirIo> = dirs.into_values().filter(|d| d.files >= 2).collect();
    dirs.sort_by_key(|d| std::cmp::Reverse(d.ns));
    dirs.truncate(top);
    dirs
}

/// What `FD_NAMES` says of the file `key`, if its set still holds its slot: a set's lookups
/// per row that /proc did not name, not a read of every slot.
fn opened_slot(names: &aya::maps::Array<&MapData, FdName>, key: &FdKey) -> Option<Slot> {
    let set = FdName::set(key);
    let n = (set..set + FD_NAME_WAYS)
        .filter_map(|i| names.get(&i, 0).ok())
        .find(|n| n.key == *key)?;
    Some(match n.dup_of() {
        Some((fd, gen)) => Slot::Dup(fd, gen),
        None if n.bytes().is_empty() => Slot::Blank,
        None => Slot::Path(String::from_utf8_lossy(n.bytes()).into_owned()),
    })
}

/// The file a wait on `fd` of process `tgid` was on, as far as /proc's names tell: the name
/// /proc showed for the fd's open generation now (`gens`; none when /proc never named that
/// one). A wait's own generation is not kept: a wait on an earlier file under the same
/// number is told by the file there now (the ground truth's pipe reuses a closed file's
/// number, so the names of all generations cannot be asked to agree).
fn file_of<'a>(
    fds: &'a BTreeMap<FdKey, String>,
    gens: &BTreeMap<(u32, i32), u32>,
    tgid: u32,
    fd: i32,
) -> Option<&'a str> {
    let key = |gen| FdKey {
        tgid,
        fd,
        gen,
        _pad: 0,
    };
    let (last_key, last) = fds.range(key(0)..=key(u32::MAX)).next_back()?;
    if gens.get(&(tgid, fd)).is_some_and(|g| *g != last_key.gen) {
        return None;
    }
    Some(last.as_str())
}

/// The map's rows and those taken out of it, one row a process and disk (a pid a new
/// process took has its rows in both: summed, as its other figures are).
fn merged_block(
    rows: Vec<(BlkKey, BlkStat)>,
    mut taken: BTreeMap<BlkKey, BlkStat>,
) -> Vec<(BlkKey, BlkStat)> {
    for (k, v) in rows {
        taken.entry(k).or_default().add(&v);
    }
    taken.into_iter().collect()
}

/// `BLOCK_IO`'s rows, each CPU's copy summed.
fn read_block(ebpf: &Ebpf) -> Result<Vec<(BlkKey, BlkStat)>> {
    let map: aya::maps::PerCpuHashMap<&MapData, BlkKey, BlkStat> =
        aya::maps::PerCpuHashMap::try_from(
            ebpf.map(BLOCK_MAP)
                .with_context(|| format!("map {BLOCK_MAP} missing"))?,
        )?;
    let mut out = Vec::new();
    for item in map.iter() {
        let (k, per_cpu) = item.with_context(|| format!("read {BLOCK_MAP}"))?;
        let mut sum = BlkStat::default();
        for v in per_cpu.iter() {
            sum.add(v);
        }
        out.push((k, sum));
    }
    Ok(out)
}

/// Adds the bio bytes live threads hold (`ThreadState::held_bio`) to their rows (the kernel
/// wrote each row at the thread's first bio to that device; a row it could not write is made
/// here).
fn add_held_bio(rows: &mut Vec<(BlkKey, BlkStat)>, open: &[(u32, ThreadState)]) {
    for (key, read, write) in open.iter().filter_map(|(_, st)| st.held_bio()) {
        let i = match rows.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                rows.push((key, BlkStat::default()));
                rows.len() - 1
            }
        };
        rows[i].1.read_bytes += read;
        rows[i].1.write_bytes += write;
    }
}

/// `major:minor` of a kernel `dev_t` (`major << 20 | minor`).
fn dev_numbers(dev: u32) -> String {
    format!("{}:{}", dev >> 20, dev & 0xf_ffff)
}

/// The sysfs directory of block device `dev`.
fn sysfs_dev(dev: u32) -> std::path::PathBuf {
    std::path::Path::new("/sys/dev/block").join(dev_numbers(dev))
}

fn device_name(dev: u32) -> String {
    let uevent = std::fs::read_to_string(sysfs_dev(dev).join("uevent")).unwrap_or_default();
    match uevent.lines().find_map(|l| l.strip_prefix("DEVNAME=")) {
        Some(n) => format!("{} {n}", dev_numbers(dev)),
        None => dev_numbers(dev),
    }
}

/// `gone`: the rows the passes took out of the map (gone processes').
fn fill_block(
    ebpf: &Ebpf,
    data: &mut ReportData,
    open: &[(u32, ThreadState)],
    gone: BTreeMap<BlkKey, BlkStat>,
) -> Result<()> {
    let mut rows: Vec<(BlkKey, BlkStat)> = match read_block(ebpf) {
        Ok(r) => merged_block(r, gone),
        Err(_) => return Ok(()),
    };
    add_held_bio(&mut rows, open);
    let sampling = data
        .report
        .overhead
        .as_ref()
        .is_some_and(|o| o.block_sampled.is_some());
    for p in data.report.processes.iter_mut() {
        for (k, s) in rows.iter().filter(|(k, _)| k.tgid == p.pid) {
            let hist = used_buckets(&s.hist);
            p.block_io.push(BlockIo {
                device: device_name(k.dev),
                requests: s.requests,
                reads: s.reads,
                writes: s.writes,
                read_bytes: s.read_bytes,
                write_bytes: s.write_bytes,
                hist_log2_ns: hist,
                total_ns: s.total_ns,
                queue_ns: s.queue_ns,
                completed_bytes: s.done_bytes,
                // A stacked device's row (a device mapper's: bytes, no requests of its own)
                // has its bios' bytes counted by their picks too, while requests are sampled.
                sampled: (s.var > 0 || sampling && s.requests == 0).then(|| {
                    crate::report::model::time::BlockSampled {
                        seen: s.seen,
                        requests_error: (2.0 * (s.var as f64).sqrt()).ceil() as u64,
                    }
                }),
            });
        }
    }
    let exited: std::collections::HashSet<u32> = data
        .report
        .processes
        .iter()
        .filter(|p| p.exited)
        .map(|p| p.pid)
        .collect();
    for u in unseen_completions(&rows, disk_of, request_based, |t| exited.contains(&t)) {
        let comm = data
            .report
            .processes
            .iter()
            .find(|p| p.pid == u.tgid)
            .map_or(String::new(), |p| format!(" ({})", p.comm));
        data.report.blind_spots.push(format!(
            "pid {}{comm}: {} of the {} it read and wrote on {} were not seen completing: \
             its block requests, their count and latencies, are missing those (requests in \
             flight at the end, completions the kernel never traced, owners lost to other \
             bios, requests merged into another process's)",
            u.tgid,
            crate::report::units::bytes(u.submitted - u.completed),
            crate::report::units::bytes(u.submitted),
            device_name(u.disk),
        ));
    }
    Ok(())
}

/// The disk a block device is on: a partition's parent, else itself (the kernel's `dev_t`
/// layout, `major << 20 | minor`).
fn disk_of(dev: u32) -> u32 {
    let part = sysfs_dev(dev);
    if !part.join("partition").exists() {
        return dev;
    }
    std::fs::read_to_string(part.join("../dev"))
        .ok()
        .and_then(|t| {
            let (ma, mi) = t.trim().split_once(':')?;
            Some((ma.parse::<u32>().ok()? << 20) | mi.parse::<u32>().ok()?)
        })
        .unwrap_or(dev)
}

/// Whether a disk makes requests: not a device mapper, md, zram or NVMe multipath head, whose
/// bios go on to other disks (counted again there, and completed there) or complete without a
/// request.
fn request_based(disk: u32) -> bool {
    makes_requests(&sysfs_dev(disk))
}

/// Whether the disk whose sysfs directory is `dir` makes requests: a blk-mq disk, which alone
/// has an `mq` directory on every kernel. Not whether it has a `queue/scheduler` file: before
/// Linux 6.10 every queue showed one (`none` on a device mapper's), and so did
/// `wbt_lat_usec`.
pub(super) fn makes_requests(dir: &std::path::Path) -> bool {
    dir.join("mq").is_dir()
}

/// Each (process, request-based disk)'s rows summed: a partition's submitted bytes under its
/// disk, where its requests complete.
fn by_disk(
    rows: &[(BlkKey, BlkStat)],
    disk_of: impl Fn(u32) -> u32,
    request_based: impl Fn(u32) -> bool,
) -> BTreeMap<(u32, u32), BlkStat> {
    let mut by_disk: BTreeMap<(u32, u32), BlkStat> = BTreeMap::new();
    for (k, s) in rows {
        let disk = disk_of(k.dev);
        if !request_based(disk) {
            continue;
        }
        by_disk.entry((k.tgid, disk)).or_default().add(s);
    }
    by_disk
}

/// What the end of a trace waits on, once no more bios are counted (`drain_block`).
pub(super) struct InFlight {
    /// The traced processes' bytes submitted to request-based disks and not seen completing.
    pub short: u64,
    /// The bytes seen completing.
    pub done: u64,
    /// The slowest request seen (the top of its latency bucket), 0 for none.
    pub slowest_ns: u64,
}

/// [`InFlight`] now; None without block programs.
pub(super) fn block_in_flight(ebpf: &Ebpf, open: &[(u32, ThreadState)]) -> Option<InFlight> {
    let mut rows = read_block(ebpf).ok()?;
    add_held_bio(&mut rows, open);
    let slowest_ns = rows
        .iter()
        .filter_map(|(_, s)| s.hist.iter().rposition(|&n| n != 0))
        .max()
        .map_or(0, |b| 1u64 << (b + 1).min(63));
    let (short, done) =
        by_disk(&rows, disk_of, request_based)
            .values()
            .fold((0, 0), |(short, done), s| {
                let submitted = s.read_bytes + s.write_bytes;
                (
                    short + submitted.saturating_sub(s.done_bytes),
                    done + s.done_bytes,
                )
            });
    Some(InFlight {
        short,
        done,
        slowest_ns,
    })
}

/// A process's bytes on a disk that were submitted and not seen completing.
#[derive(Debug, PartialEq)]
struct Unseen {
    tgid: u32,
    disk: u32,
    submitted: u64,
    completed: u64,
}

/// The processes and disks whose completed bytes fall short of their submitted ones by over
/// 0.1%, and over 1 MiB (what a few requests in flight at the end leave) for a process still
/// alive at the end (`exited`: it has none in flight, but for readahead it started just
/// before its exit, which may be told as unseen). On the development
/// VM a direct-I/O reader's fall 0-0.2% short a run: completions that ran no program (why
/// is not established; the kernel also runs none at a switch while the sandbox's agent is
/// current). Submitted bytes are under the bio's device (a partition), completed ones under
/// the request's (the disk); only disks that make requests (`request_based`) are compared.
fn unseen_completions(
    rows: &[(BlkKey, BlkStat)],
    disk_of: impl Fn(u32) -> u32,
    request_based: impl Fn(u32) -> bool,
    exited: impl Fn(u32) -> bool,
) -> Vec<Unseen> {
    by_disk(rows, disk_of, request_based)
        .into_iter()
        .map(|((tgid, disk), s)| {
            let unseen = Unseen {
                tgid,
                disk,
                submitted: s.read_bytes + s.write_bytes,
                completed: s.done_bytes,
            };
            // Sampled rows' bytes are estimates, submitted and completed alike, from bios and
            // requests picked apart (a request's merged bios each by its own pick): short by
            // less than three standard deviations of the request count's estimate, relative,
            // is noise.
            let noise = if s.requests > 0 {
                3.0 * (s.var as f64).sqrt() / s.requests as f64
            } else {
                0.0
            };
            (unseen, noise)
        })
        .filter(|(u, noise)| {
            let short = u.submitted.saturating_sub(u.completed);
            let floor = if exited(u.tgid) { 0 } else { 1 << 20 };
            short > floor && short * 1000 > u.submitted && short as f64 > noise * u.submitted as f64
        })
        .map(|(u, _)| u)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::accounting::fd_key as fd;

    /// Whose fds a child got, for sure: not a child forked before closes were counted, nor
    /// one whose parent's pid was forgotten or is a later process's.
    #[test]
    fn a_parent_is_trusted_only_while_its_pid_is_still_it() {
        use crate::tracker::{Tracked, Tracker};
        let mut tracker = Tracker::default();
        let mut add = |pid: u32, ppid: u32, forked_at: Option<u64>| {
            let mut t = Tracked {
                forked_at,
                ..Default::default()
            };
            t.info.ppid = Some(ppid);
            tracker.procs.insert(pid, t);
        };
        add(100, 1, None);
        add(200, 100, Some(1_000));
        add(300, 100, Some(50));
        add(400, 500, Some(2_000));
        add(500, 1, Some(3_000));
        add(600, 700, Some(2_000));
        add(700, 1, None);
        let mut forgotten = PidSet::default();
        let seen = Some(100);
        assert_eq!(parent_for_fds(&tracker, &forgotten, seen, 200), Some(100));
        assert_eq!(
            parent_for_fds(&tracker, &forgotten, None, 200),
            None,
            "closes unseen now"
        );
        assert_eq!(
            parent_for_fds(&tracker, &forgotten, seen, 300),
            None,
            "forked before"
        );
        assert_eq!(
            parent_for_fds(&tracker, &forgotten, seen, 100),
            None,
            "there at the attach"
        );
        assert_eq!(
            parent_for_fds(&tracker, &forgotten, seen, 400),
            None,
            "its pid, later"
        );
        assert_eq!(parent_for_fds(&tracker, &forgotten, seen, 600), Some(700));
        forgotten.insert(700);
        assert_eq!(
            parent_for_fds(&tracker, &forgotten, seen, 600),
            None,
            "forgotten"
        );
        forgotten.remove(700);
        tracker.pids_reused.insert(700);
        assert_eq!(
            parent_for_fds(&tracker, &forgotten, seen, 600),
            None,
            "taken again"
        );
        let mut big = PidSet::default();
        big.insert(4_194_303);
        assert!(big.contains(4_194_303) && !big.contains(4_194_302) && !big.contains(7));
    }

    /// A shell (100, its stdout a pipe gputrace named while it ran) forks a subshell (200),
    /// which forks `echo` (300): echo's stdout is the shell's. Not a fd the child replaced
    /// or reopened (a later generation), not past stderr, not where an ancestor closed it,
    /// and not for a process that was there at the attach.
    #[test]
    fn standard_fds_are_named_after_the_parent_they_came_from() {
        let fds: BTreeMap<FdKey, String> = [(fd(100, 1, 0), "pipe:[77]".to_string())].into();
        let parents: BTreeMap<u32, u32> = [(300, 200), (200, 100), (400, 100)].into();
        let parent = |p: u32| parents.get(&p).copied();
        let mut gens = BTreeMap::new();
        let lineage = Lineage {
            parent: &parent,
            gens: &gens,
        };
        assert_eq!(
            inherited(&fds, &fd(300, 1, 0), &lineage).as_deref(),
            Some("pipe:[77]")
        );
        assert_eq!(
            inherited(&fds, &fd(400, 1, 0), &lineage).as_deref(),
            Some("pipe:[77]")
        );
        assert_eq!(
            inherited(&fds, &fd(300, 1, 1), &lineage),
            None,
            "replaced (dup2)"
        );
        assert_eq!(
            inherited(&fds, &fd(300, 2, 0), &lineage),
            None,
            "no name up the line"
        );
        assert_eq!(
            inherited(&fds, &fd(100, 1, 0), &lineage),
            None,
            "no parent known"
        );
        let mut far = fds.clone();
        far.insert(fd(100, 3, 0), "/data/x".into());
        assert_eq!(
            inherited(&far, &fd(300, 3, 0), &lineage),
            None,
            "not a standard fd"
        );
        gens.insert((200, 1), 1);
        let lineage = Lineage {
            parent: &parent,
            gens: &gens,
        };
        assert_eq!(
            inherited(&fds, &fd(300, 1, 0), &lineage),
            None,
            "the subshell closed it"
        );
        assert_eq!(
            inherited(&fds, &fd(400, 1, 0), &lineage).as_deref(),
            Some("pipe:[77]")
        );
    }

    #[test]
    fn a_dup_is_named_after_the_file_it_copied() {
        // Process 100: stderr named from /proc; `>&2` put it on fd 1 (generation 1); fd 7 a
        // file opened by path, dup'ed onto fd 4 and that onto fd 5; a dup of a dup of itself.
        let fds: BTreeMap<FdKey, String> = [(fd(100, 2, 0), "/dev/pts/0".to_string())].into();
        let slots: BTreeMap<FdKey, Slot> = [
            (fd(100, 1, 1), Slot::Dup(2, 0)),
            (fd(100, 7, 3), Slot::Path("/data/x".into())),
            (fd(100, 4, 1), Slot::Dup(7, 3)),
            (fd(100, 5, 2), Slot::Dup(4, 1)),
            (fd(100, 6, 1), Slot::Dup(6, 1)),
            (fd(100, 8, 1), Slot::Dup(9, 0)),
            (fd(100, 9, 0), Slot::Blank),
        ]
        .into();
        let slot = |k: &FdKey| slots.get(k).cloned();
        let parent = |_: u32| None;
        let gens = BTreeMap::new();
        let lineage = Lineage {
            parent: &parent,
            gens: &gens,
        };
        let name = |k: FdKey| named(&fds, &StdHashMap::new(), &slot, &k, &lineage, 0);
        assert_eq!(name(fd(100, 1, 1)).as_deref(), Some("/dev/pts/0"));
        assert_eq!(name(fd(100, 4, 1)).as_deref(), Some("/data/x"));
        assert_eq!(name(fd(100, 5, 2)).as_deref(), Some("/data/x"));
        // Not another generation's file, not a cycle, not a blank source.
        assert_eq!(name(fd(100, 1, 2)), None);
        assert_eq!(name(fd(100, 6, 1)), None);
        assert_eq!(name(fd(100, 8, 1)), None);
    }

    #[test]
    fn files_roll_up_into_their_directories() {
        let f = |file: &str, ns| FileIo {
            file: file.into(),
            ns,
            bytes: 10,
            calls: 2,
            timed: None,
        };
        let files = vec![
            f("/data/train/a.jpg", 5),
            f("/data/train/b.jpg", 7),
            f("/data/train/c.jpg", 1),
            f("/data/val/x.jpg", 100),
            f("/data/labels.csv", 3),
            f("/data/index.bin", 4),
            f("shard/0.tar", 2),
            f("shard/1.tar", 2),
            f("/vmlinuz", 1),
            f("/init", 1),
            f("pipe:[123]", 50),
            f("socket:[9]", 50),
            f("<closed fd 3>", 50),
            f("<closed fd 4>", 50),
        ];
        let dirs = rollup_dirs(&files, 10);
        let got: Vec<(&str, u64, u64)> = dirs.iter().map(|d| (&d.dir[..], d.files, d.ns)).collect();
        // One file in /data/val: not a directory worth a line.
        assert_eq!(
            got,
            vec![
                ("/data/train", 3, 13),
                ("/data", 2, 7),
                ("shard", 2, 4),
                ("/", 2, 2),
            ]
        );
        assert_eq!((dirs[0].bytes, dirs[0].calls), (30, 6));
        assert_eq!(rollup_dirs(&files, 1).len(), 1);
    }

    #[test]
    fn bytes_never_seen_completing_are_told_per_disk() {
        let row = |tgid, dev, read, write, done| {
            (
                BlkKey { tgid, dev },
                BlkStat {
                    read_bytes: read,
                    write_bytes: write,
                    done_bytes: done,
                    ..Default::default()
                },
            )
        };
        const MIB: u64 = 1 << 20;
        // Devices 11 and 12 are partitions of disk 10.
        let disk = |d| if d == 11 || d == 12 { 10 } else { d };
        let rows = [
            // pid 1: submitted on two partitions, completed on the disk, all of it.
            row(1, 11, 300 * MIB, 0, 0),
            row(1, 12, 0, 100 * MIB, 0),
            row(1, 10, 0, 0, 400 * MIB),
            // pid 2: 2 MiB of 100 short (2%): told.
            row(2, 20, 100 * MIB, 0, 98 * MIB),
            // pid 3: 512 KiB short of 4 MiB (12%, but a few requests in flight).
            row(3, 20, 4 * MIB, 0, 4 * MIB - MIB / 2),
            // pid 7: the same, exited: nothing was in flight at the end.
            row(7, 20, 4 * MIB, 0, 4 * MIB - MIB / 2),
            // pid 4: 5 MiB short of 10 GiB (0.05%).
            row(4, 20, 10240 * MIB, 0, 10235 * MIB),
            // pid 5: more completed than submitted (another process's bios merged into its
            // requests).
            row(5, 20, MIB, 0, 3 * MIB),
            // pid 6: its bios to a device mapper (30), none of which completes there; the
            // bios it sends on to disk 20 are counted and completed there.
            row(6, 30, 50 * MIB, 0, 0),
            row(6, 20, 50 * MIB, 0, 50 * MIB),
        ];
        assert_eq!(
            unseen_completions(&rows, disk, |d| d != 30, |t| t == 7),
            vec![
                Unseen {
                    tgid: 2,
                    disk: 20,
                    submitted: 100 * MIB,
                    completed: 98 * MIB,
                },
                Unseen {
                    tgid: 7,
                    disk: 20,
                    submitted: 4 * MIB,
                    completed: 4 * MIB - MIB / 2,
                }
            ]
        );
    }

    #[test]
    fn sampled_rows_fall_short_within_their_noise_unsaid() {
        const MIB: u64 = 1 << 20;
        // 1,000 requests of 128 KiB counted 1 in 16: var = 1,000 x 16 x 15, sd ~490 requests
        // of ~16,000 (~3%): 3 sd is ~9%.
        let row = |tgid, done| {
            (
                BlkKey { tgid, dev: 20 },
                BlkStat {
                    read_bytes: 2000 * MIB,
                    done_bytes: done,
                    requests: 16_000,
                    seen: 1_000,
                    var: 1_000 * 16 * 15,
                    ..Default::default()
                },
            )
        };
        let rows = [row(1, 1900 * MIB), row(2, 1700 * MIB)];
        let unseen = unseen_completions(&rows, |d| d, |_| true, |_| false);
        // 5% short is noise; 15% is not.
        assert_eq!(
            unseen.iter().map(|u| u.tgid).collect::<Vec<_>>(),
            vec![2],
            "{unseen:?}"
        );
    }

    #[test]
    fn block_rows_taken_out_of_the_map_join_those_left() {
        let key = |tgid, dev| BlkKey { tgid, dev };
        let stat = |requests, read_bytes| BlkStat {
            requests,
            read_bytes,
            ..Default::default()
        };
        let taken: BTreeMap<BlkKey, BlkStat> =
            [(key(7, 8), stat(2, 8192)), (key(9, 8), stat(1, 4096))].into();
        // Pid 7 taken again by a new process that read the same disk; pid 11 still live.
        let rows = merged_block(
            vec![(key(7, 8), stat(3, 12288)), (key(11, 8), stat(1, 512))],
            taken,
        );
        let got: Vec<(u32, u64, u64)> = rows
            .iter()
            .map(|(k, s)| (k.tgid, s.requests, s.read_bytes))
            .collect();
        assert_eq!(got, [(7, 5, 20480), (9, 1, 4096), (11, 1, 512)]);
    }

    #[test]
    fn held_bio_bytes_join_their_rows() {
        let row = |tgid, dev, read| {
            (
                BlkKey { tgid, dev },
                BlkStat {
                    requests: 3,
                    read_bytes: read,
                    ..Default::default()
                },
            )
        };
        let mut rows = vec![row(7, 1, 4096), row(7, 2, 512)];
        let held = |tid, dev, read, write| {
            let mut st = ThreadState::new(0, tid, 7, PHASE_ONCPU);
            st.bio_dev = dev;
            st.held_bio_read = read;
            st.held_bio_write = write;
            (tid, st)
        };
        // Two threads on device 1 (one also wrote), one on a device whose row is missing, one
        // holding nothing.
        let open = [
            held(7, 1, 8192, 0),
            held(8, 1, 4096, 1024),
            held(9, 3, 100, 0),
            held(10, 2, 0, 0),
        ];
        add_held_bio(&mut rows, &open);
        assert_eq!(rows.len(), 3);
        assert_eq!((rows[0].1.read_bytes, rows[0].1.write_bytes), (16384, 1024));
        assert_eq!(rows[0].1.requests, 3, "only bytes are held");
        assert_eq!(rows[1].1.read_bytes, 512);
        assert_eq!((rows[2].0.dev, rows[2].1.read_bytes), (3, 100));
    }

    #[test]
    fn merges_syscall_stats_of_threads() {
        let mut a = SysStat {
            count: 2,
            timed: 2,
            min_ns: 10,
            max_ns: 50,
            total_ns: 60,
            ..Default::default()
        };
        a.hist[1] = 1;
        let mut b = SysStat {
            count: 1,
            timed: 1,
            min_ns: 5,
            max_ns: 5,
            total_ns: 5,
            ..Default::default()
        };
        b.hist[2] = 1;
        a.add(&b);
        let a = to_stat(0, &a, &BTreeMap::from([(11, 1)]));
        assert_eq!((a.count, a.min_ns, a.max_ns, a.total_ns), (3, 5, 50, 65));
        assert_eq!(a.hist_log2_ns, vec![0, 1, 1]);
        assert_eq!(a.errnos.len(), 1);
        assert_eq!(errno_name(11), "EAGAIN");
        assert_eq!(errno_name(999), "errno 999");
    }

    #[test]
    fn only_blk_mq_disks_make_requests() {
        let dir = tempfile::tempdir().unwrap();
        // A device mapper's or zram's queue before Linux 6.10: a scheduler file ("none") and a
        // writeback-throttling file, no `mq` directory.
        let bio_based = dir.path().join("dm-0");
        std::fs::create_dir_all(bio_based.join("queue")).unwrap();
        std::fs::write(bio_based.join("queue/scheduler"), "none\n").unwrap();
        std::fs::write(bio_based.join("queue/wbt_lat_usec"), "0\n").unwrap();
        assert!(!makes_requests(&bio_based));
        let disk = dir.path().join("vda");
        std::fs::create_dir_all(disk.join("mq/0")).unwrap();
        assert!(makes_requests(&disk));
    }
}
