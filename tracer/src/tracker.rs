//! What user space knows of each traced process: names, parent, exit, and a snapshot of its
//! memory maps taken while it was alive (for symbolisation after it exits).
//!
//! Memory is bounded however many processes come and go (a fork storm, an hour of a shell
//! loop): at most [`MAX_TRACKED`] processes are known by name and at most
//! [`MAX_EXITED_MAPS`] exited ones keep their maps; what is forgotten is counted and reported.

use std::collections::{BTreeMap, VecDeque};

use tracer_common::proc::{ExecEvent, MappedCodeEvent, ProcEvent, ProcEventKind};

use crate::{
    procfs::{self, Mapping},
    report::build::ProcessInfo,
};

#[derive(Debug, Clone, Default)]
pub struct Tracked {
    pub info: ProcessInfo,
    /// Its maps at the last read, with the code of libraries it unloaded since an earlier one
    /// (`procfs::with_unloaded`).
    pub maps: Vec<Mapping>,
    /// Maps must be read again (new process, exec).
    pub maps_stale: bool,
    /// The executable mappings' sizes when the maps were read (`procfs::exec_sizes`).
    pub exec_sizes: Option<(u64, u64)>,
    /// Called exec while traced: its maps are its own, not its parent's.
    pub execed: bool,
    /// Its start time (`/proc/PID/stat`, clock ticks since boot) at the first read of its
    /// /proc, which later reads must find again: after it exits (before its exit is seen) its
    /// pid can be another process's.
    pub start: Option<u64>,
    /// Its /proc was never its own when looked at (gone, or its pid already taken): never read.
    pub foreign: bool,
    /// When it was forked (CLOCK_MONOTONIC ns), for a process seen fork: a first read of its
    /// /proc after a failed one must find a process started no later, and what it did with
    /// the fds its parent gave it since is in the syscall programs' counts, where they were on.
    pub forked_at: Option<u64>,
    /// Its parent's start time at the first read, to tell the parent from a later process
    /// under the parent's pid.
    pub parent_start: Option<u64>,
    /// Its image's `self_exec_id` (`ProcEvent::arg` of its last exec), when an exec was seen.
    pub exec_id: Option<u32>,
    /// When its maps were last read (CLOCK_MONOTONIC ns): maps read after an exec whose event
    /// is handled later are the new image's, not the old one's.
    pub maps_read_ns: u64,
    /// The maps of the images it exec'd from, by their `self_exec_id`, oldest first (at most
    /// [`MAX_IMAGES`]): CPU samples taken before an exec are symbolised with them.
    pub images: Vec<(u32, Vec<Mapping>)>,
}

impl Tracked {
    /// Where its files are found: where its parent's are (a child execs and opens with its
    /// parent's root and directory unless it moved); from our root where the parent is gone
    /// by now (its events read late: a busy host, the end's last read) or unknown.
    fn dirs(&self) -> crate::image::Dirs {
        self.info
            .ppid
            .and_then(crate::image::Dirs::of)
            .unwrap_or_else(crate::image::Dirs::ours)
    }
}

/// Earlier images kept per process (a shell script that execs its job: one).
pub const MAX_IMAGES: usize = 4;

/// Code files held open (by their /proc/PID/map_files link, as each was first read in a
/// process's maps) for symbolisation after their processes exit, at most (and at most a
/// quarter of the open-files limit): beyond it, an exited process's files are opened by path,
/// and used only if the path still has their inode.
pub const MAX_HELD_FILES: usize = 4096;

/// JIT perf maps held open (`crate::perf_map`), at most: one per process that runs a JIT,
/// which few do.
pub const MAX_HELD_PERF_MAPS: usize = 256;

/// The code files held open, by (inode, path) as a process's maps name them.
#[derive(Debug, Default)]
pub struct HeldFiles {
    files: std::collections::HashMap<(u64, String), std::fs::File>,
    /// The paths of `files` by their device (major, minor) and inode: the kernel names a
    /// young process's mapped library so (`MappedCodeEvent`).
    by_id: std::collections::HashMap<(u32, u32, u64), String>,
    /// How many may be held: [`MAX_HELD_FILES`], or a quarter of the open-files limit where
    /// that is lower, so that the probes always have fds (read at the first hold).
    cap: Option<usize>,
    /// Processes' JIT perf maps by pid, opened while they ran: after an exit its /proc, which
    /// leads to its /tmp and tells the name it gave the file, is gone.
    perf_maps: std::collections::HashMap<u32, std::fs::File>,
    /// The pid each live process sees itself as, from the first look for its perf map: the
    /// next looks (every 2 s) are one lookup.
    ns_tgids: std::collections::HashMap<u32, u32>,
}

/// A quarter of the soft open-files limit (0 when it cannot be read).
fn open_files_quarter() -> usize {
    crate::session::open_files_limit()
        .map_or(0, |r| (r.rlim_cur / 4).min(usize::MAX as u64) as usize)
}

impl HeldFiles {
    /// Opens the executable file mappings of `maps` (of live process `pid`) not held yet.
    /// Through map_files: the file the process mapped, in its own mount namespace, even
    /// once that path holds another file or none.
    fn hold(&mut self, pid: u32, maps: &[Mapping]) {
        let cap = *self
            .cap
            .get_or_insert_with(|| MAX_HELD_FILES.min(open_files_quarter()));
        for m in maps.iter().filter(|m| m.is_file() && m.is_exec()) {
            if self.files.len() + self.perf_maps.len() >= cap {
                return;
            }
            let key = (m.inode, m.path.clone());
            if self.files.contains_key(&key) {
                continue;
            }
            if let Ok(f) = std::fs::File::open(procfs::map_file_path(procfs::mm_pid(pid), m)) {
                self.insert(key, f);
            }
        }
    }

    /// Opens the perf map of live process `pid` if one is not held yet: when its maps `maps`,
    /// just read, have code in anonymous memory (a JIT's), or without them (`None`) when the
    /// maps at hand may predate the JIT's memory.
    fn hold_perf_map(&mut self, pid: u32, maps: Option<&[Mapping]>) {
        let cap = *self
            .cap
            .get_or_insert_with(|| MAX_HELD_FILES.min(open_files_quarter()));
        if self.perf_maps.len() >= MAX_HELD_PERF_MAPS
            || self.files.len() + self.perf_maps.len() >= cap
            || self.perf_maps.contains_key(&pid)
            || maps.is_some_and(|maps| !maps.iter().any(|m| m.is_exec() && m.path.is_empty()))
        {
            return;
        }
        let mut ns = self.ns_tgids.get(&pid).copied();
        let f = crate::perf_map::open(pid, &mut ns);
        if let Some(ns) = ns {
            self.ns_tgids.insert(pid, ns);
        }
        if let Some(f) = f {
            self.perf_maps.insert(pid, f);
        }
    }

    /// Holds `file` as the file of mappings named by `key` (inode, path).
    fn insert(&mut self, key: (u64, String), file: std::fs::File) {
        match file.metadata() {
            Ok(m) => self.insert_as(key, file, crate::image::meta_id(&m)),
            Err(_) => {
                self.files.insert(key, file);
            }
        }
    }

    /// [`HeldFiles::insert`] of a file whose device and inode are `id`.
    fn insert_as(&mut self, key: (u64, String), file: std::fs::File, id: crate::image::FileId) {
        self.by_id.entry(id).or_insert_with(|| key.1.clone());
        self.files.insert(key, file);
    }

    /// The path the maps name a held file by, by its device (major, minor) and inode.
    fn path_of(&self, id: crate::image::FileId) -> Option<&str> {
        self.by_id.get(&id).map(String::as_str)
    }

    /// Whether the file of mappings named by `key` (inode, path) is not held yet and room is
    /// left to hold it.
    fn wants(&mut self, key: &(u64, String)) -> bool {
        let cap = *self
            .cap
            .get_or_insert_with(|| MAX_HELD_FILES.min(open_files_quarter()));
        self.files.len() + self.perf_maps.len() < cap && !self.files.contains_key(key)
    }

    /// Lets go of process `pid`'s perf map: it exec'd (the new image's JIT writes its own,
    /// which the next read of its maps opens), or its maps were dropped (its samples cannot
    /// be symbolised any more).
    fn drop_perf_map(&mut self, pid: u32) {
        self.perf_maps.remove(&pid);
    }

    /// Forgets process `pid` (exited, or its pid another process's): its perf map and the
    /// pid it saw itself as.
    fn forget(&mut self, pid: u32) {
        self.perf_maps.remove(&pid);
        self.ns_tgids.remove(&pid);
    }

    /// Where each held perf map can be opened again: pid -> /proc/self/fd/N.
    pub fn perf_map_paths(&self) -> std::collections::HashMap<u32, std::path::PathBuf> {
        use std::os::fd::AsRawFd;
        self.perf_maps
            .iter()
            .map(|(pid, f)| (*pid, format!("/proc/self/fd/{}", f.as_raw_fd()).into()))
            .collect()
    }

    /// Where each held file can be opened again: (inode, path) -> /proc/self/fd/N.
    pub fn paths(&self) -> std::collections::HashMap<(u64, String), std::path::PathBuf> {
        use std::os::fd::AsRawFd;
        self.files
            .iter()
            .map(|(k, f)| {
                let p = format!("/proc/self/fd/{}", f.as_raw_fd());
                (k.clone(), std::path::PathBuf::from(p))
            })
            .collect()
    }
}

/// Processes known by name and parent; beyond this new ones are counted, not stored.
/// `GPUTRACE_MAX_TRACKED` lowers it, for tests.
pub const MAX_TRACKED: usize = 16_384;

fn max_tracked() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| crate::env_cap("GPUTRACE_MAX_TRACKED", MAX_TRACKED).max(1))
}

/// Exited processes whose maps snapshot is kept for symbolisation (the oldest are evicted;
/// `cpu_samples::Exited` takes and symbolises the samples of exited processes every half
/// of this many exits, so most are symbolised before).
/// `GPUTRACE_MAX_EXITED_MAPS` lowers it, for tests.
pub const MAX_EXITED_MAPS: usize = 256;

pub fn max_exited_maps() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| crate::env_cap("GPUTRACE_MAX_EXITED_MAPS", MAX_EXITED_MAPS))
}

/// A traced process's start or end, as the families learn of it at their next tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Life {
    Forked(u32),
    Exited(u32),
}

#[derive(Debug, Default)]
pub struct Tracker {
    /// Fork/exec/exit events as they came, for the timeline (bounded by
    /// `report::timeline::LIFECYCLE_MAX`: a fork storm must not grow memory unbounded).
    pub lifecycle: Vec<ProcEvent>,
    pub procs: BTreeMap<u32, Tracked>,
    /// The pids of `procs` not exited, for the walks made every tick: under process churn
    /// `procs` holds thousands of exited processes for each live one, and a walk over them
    /// all (Python detection, liveness polls) read each one's entry to skip it.
    running: std::collections::BTreeSet<u32>,
    pub exited_roots: Vec<u32>,
    pub roots: Vec<u32>,
    pub events: u64,
    /// Processes seen start (fork events and the initial set), tracked or not.
    pub seen: u64,
    /// Processes not tracked because [`MAX_TRACKED`] was reached (their samples keep pid and
    /// comm but lose cmdline and symbols).
    pub untracked: u64,
    /// Exited processes whose maps were evicted; their samples are not symbolised.
    pub maps_evicted: u64,
    /// Execs whose code was placed from their event, /proc having given no maps
    /// ([`Tracker::on_exec_image`]).
    pub images_placed: u64,
    /// The exec'd files read for that.
    images: crate::image::Images,
    /// Code mappings placed from a young process's mmap ([`Tracker::on_mapped_code`]).
    pub libraries_placed: u64,
    /// Exited processes that still hold maps, oldest first.
    exited_with_maps: VecDeque<u32>,
    /// The code files of the maps read so far, open.
    pub held: HeldFiles,
    /// Pids a traced process exited from and a new traced process took.
    pub pids_reused: std::collections::BTreeSet<u32>,
    /// Latest exit seen (CLOCK_MONOTONIC ns).
    last_exit_ns: u64,
    /// Refreshes of all processes so far (every [`FULL_MAPS_EVERY`]th reads every map).
    all_refreshes: u64,
    /// Processes whose maps are stale (`Tracked::maps_stale`), for the refreshes between two
    /// of all: under process churn `procs` holds tens of thousands of exited ones, and a walk
    /// over them at every tick was 4% of gputrace's CPU.
    stale: std::collections::BTreeSet<u32>,
    /// Syscall storms the kernel reported and the accounting has not taken yet (bounded: the
    /// kernel sends one per block of syscalls until the programs are off).
    pub storms: Vec<ProcEvent>,
    /// Processes that mapped a file executable since the families last looked
    /// (`ProcEventKind::MappedExec`), with the first such mapping's time (ktime ns).
    pub mapped: BTreeMap<u32, u64>,
    /// Every process that mapped a file executable during the trace: the CUDA family names
    /// those that exited with a CUDA library it never saw in their maps.
    pub mapped_ever: std::collections::BTreeSet<u32>,
    /// Forks and exits since the last tick ([`Tracker::ticked`]), of every traced process,
    /// remembered or not: the accounting forgets an exited process's file rows by them. From
    /// `procs`, a storm past [`MAX_TRACKED`] (whose exited processes are forgotten first, the
    /// lowest pid first: just after the pids wrap, those just gone) left most processes' rows
    /// in `FD_GEN` for good; full, it lost the later processes' files (a 10 minute shell
    /// loop: 279,451 `FileMapFull`).
    pub lives: Vec<Life>,
}

/// Storms kept for the accounting between two of its looks.
const MAX_PENDING_STORMS: usize = 64;

/// Every this many refreshes of all processes (2 s apart: 20 s), their maps are read whatever
/// their executable mappings' sizes say: a library swapped for one of the same size, JIT code
/// grown inside a writable mapping.
const FULL_MAPS_EVERY: u64 = 10;

impl Tracker {
    pub fn new(roots: &[u32]) -> Self {
        Self {
            roots: roots.to_vec(),
            ..Default::default()
        }
    }

    /// Starts tracking a process that exists now (roots, pre-existing descendants, forks).
    pub fn add(&mut self, pid: u32, ppid: Option<u32>) {
        self.add_with(pid, ppid, true);
    }

    /// `read_proc`: whether /proc/PID describes this process (not when its pid was reused).
    fn add_with(&mut self, pid: u32, ppid: Option<u32>, read_proc: bool) {
        if !self.procs.contains_key(&pid) {
            self.seen += 1;
            if self.procs.len() >= max_tracked() && !self.evict_one_exited() {
                self.untracked += 1;
                return;
            }
        }
        let t = self.procs.entry(pid).or_default();
        t.info.pid = pid;
        if !t.info.exited {
            self.running.insert(pid);
        }
        if !read_proc {
            t.info.ppid = ppid;
            if t.start.is_none() {
                t.foreign = true;
            }
            return;
        }
        if t.info.ppid.is_none() {
            t.info.ppid = ppid.or_else(|| procfs::stat(pid).map(|s| s.ppid));
        }
        t.maps_stale = true;
        self.stale.insert(pid);
        Self::refresh_names(pid, t);
    }

    /// Whether /proc/PID is no longer the child a fork event names. The event is read up to
    /// 100 ms late: a short-lived child may be gone and its pid taken by another process.
    /// Its name and maps then come from its parent only. The other process started after the
    /// fork, or (within the same clock tick) has another parent while the child's is still
    /// there: a child whose parent exited has been given to init or a subreaper, and is
    /// still the child.
    fn pid_reused_since(&self, fork: &ProcEvent) -> bool {
        let Some(st) = procfs::stat(fork.pid) else {
            return false;
        };
        if procfs::started_after(st.starttime, fork.ts_ns) {
            return true;
        }
        if st.ppid == fork.ppid {
            return false;
        }
        let parent_start = self.procs.get(&fork.ppid).and_then(|p| p.start);
        // A zombie parent has given its children away already.
        procfs::stat(fork.ppid)
            .is_some_and(|p| !p.is_dead() && parent_start.is_none_or(|s| s == p.starttime))
    }

    /// Whether /proc/PID is still the process first read there. A CI run named a fork storm's
    /// child, gone within a millisecond, after the process that took its pid next (`spin 2`),
    /// read before the child's exit was seen.
    /// `None`: /proc could not tell (a read that failed for another reason than the process
    /// being gone, such as too many open files).
    fn is_same(pid: u32, t: &mut Tracked) -> Option<bool> {
        if t.foreign {
            return Some(false);
        }
        let st = match procfs::stat_if_any(pid) {
            Ok(Some(st)) => st,
            Ok(None) => {
                // Gone before its first read: whatever has its pid later is not it.
                if t.start.is_none() {
                    t.foreign = true;
                }
                return Some(false);
            }
            Err(_) => return None,
        };
        // The start time counts in clock ticks (10 ms), and a CI run's `spin` took the pid
        // within the tick the child was born in: another parent, while the one the process
        // had is alive (a live parent keeps its children), tells them apart too. Once read, the
        // parent is told by its own start time: a parent that exited may have left its pid to
        // another process, and the child, reparented, is still the child.
        let other_parent = t.info.ppid.filter(|&pp| pp != st.ppid);
        let parent_alive = |pp: u32, start: Option<u64>| {
            procfs::stat(pp).is_some_and(|p| !p.is_dead() && start.is_none_or(|s| s == p.starttime))
        };
        Some(match t.start {
            Some(s) => {
                s == st.starttime
                    && !other_parent.is_some_and(|pp| {
                        t.parent_start.is_some() && parent_alive(pp, t.parent_start)
                    })
            }
            None => {
                let started_after_fork = t
                    .forked_at
                    .is_some_and(|f| procfs::started_after(st.starttime, f));
                if started_after_fork || other_parent.is_some_and(|pp| parent_alive(pp, None)) {
                    t.foreign = true;
                    return Some(false);
                }
                t.start = Some(st.starttime);
                t.parent_start = procfs::stat(st.ppid).map(|p| p.starttime);
                true
            }
        })
    }

    fn refresh_names(pid: u32, t: &mut Tracked) {
        if Self::is_same(pid, t) != Some(true) {
            return;
        }
        if let Some(c) = procfs::comm(pid) {
            t.info.comm = c;
        }
        if let Some(c) = procfs::cmdline(pid) {
            if !c.is_empty() {
                t.info.cmdline = c;
            }
        }
    }

    pub fn on_event(&mut self, ev: &ProcEvent) {
        if ev.kind == ProcEventKind::SyscallStorm as u32 {
            if self.storms.len() < MAX_PENDING_STORMS {
                self.storms.push(*ev);
            }
            return;
        }
        if ev.kind == ProcEventKind::MappedCode as u32 {
            // Its mapping comes with the rest of its event (`on_mapped_code`).
            return;
        }
        if ev.kind == ProcEventKind::MappedExec as u32 {
            self.mapped.entry(ev.pid).or_insert(ev.ts_ns);
            self.mapped_ever.insert(ev.pid);
            return;
        }
        self.events += 1;
        if self.lifecycle.len() < crate::report::timeline::LIFECYCLE_MAX {
            self.lifecycle.push(*ev);
        }
        match ProcEventKind::from_u32(ev.kind) {
            Some(ProcEventKind::Fork) => {
                self.lives.push(Life::Forked(ev.pid));
                // A pid a traced process had before it exited, taken by a new one (wrapped
                // pids, clone3's set_tid): the new process starts afresh, not as the exited
                // one (which kept its name and maps, stayed exited, and was never handed to
                // the CUDA probes). The report is by pid: the two share its figures.
                if self.procs.get(&ev.pid).is_some_and(|t| t.info.exited) {
                    self.procs.remove(&ev.pid);
                    self.running.remove(&ev.pid);
                    self.held.forget(ev.pid);
                    self.exited_with_maps.retain(|p| *p != ev.pid);
                    self.pids_reused.insert(ev.pid);
                }
                let reused = self.pid_reused_since(ev);
                self.add_with(ev.pid, Some(ev.ppid), !reused);
                if let Some(t) = self.procs.get_mut(&ev.pid) {
                    t.forked_at = Some(ev.ts_ns);
                    // An entry kept from an earlier process (its exit unseen) had that one's.
                    t.info.ppid = Some(ev.ppid);
                }
                // Until it execs the child runs its parent's code: start from the parent's maps
                // and name (a short-lived child is gone before /proc can be read).
                let parent = self
                    .procs
                    .get(&ev.ppid)
                    .map(|p| (p.maps.clone(), p.info.comm.clone()));
                if let (Some((parent_maps, parent_comm)), Some(t)) =
                    (parent, self.procs.get_mut(&ev.pid))
                {
                    if t.maps.is_empty() {
                        t.maps = parent_maps;
                    }
                    if t.info.comm.is_empty() {
                        t.info.comm = parent_comm;
                    }
                }
            }
            Some(ProcEventKind::Exec) => {
                let t = self.procs.entry(ev.pid).or_default();
                t.info.pid = ev.pid;
                if !t.info.exited {
                    self.running.insert(ev.pid);
                }
                // The old image's maps are not the new one's: a child that execs and exits
                // before its maps are read was symbolised with its parent's, under the
                // parent's names. They symbolise the old image's samples, where the kernel
                // told the images apart.
                let old = std::mem::take(&mut t.maps);
                if ev.arg != 0 {
                    // Read after the exec (a tick between it and this event): the new image's.
                    if !old.is_empty() && t.maps_read_ns < ev.ts_ns {
                        t.images.push((ev.arg.wrapping_sub(1), old));
                        if t.images.len() > MAX_IMAGES {
                            t.images.remove(0);
                        }
                    }
                    t.exec_id = Some(ev.arg);
                }
                t.maps_stale = true;
                self.stale.insert(ev.pid);
                t.execed = true;
                // The new image's name, as the event saw it (a process that execs and exits
                // at once is gone before /proc can name it), and no command line until /proc
                // gives the new one: the old one is the parent's.
                let comm = crate::session::comm_str(&ev.comm);
                if !comm.is_empty() {
                    t.info.comm = comm;
                }
                t.info.cmdline.clear();
                Self::refresh_names(ev.pid, t);
                self.held.drop_perf_map(ev.pid);
                // Its maps now, while it runs: it may be gone by the next tick.
                Self::read_maps_of(ev.pid, t, &mut self.held);
            }
            Some(ProcEventKind::Exit) => {
                self.lives.push(Life::Exited(ev.pid));
                self.mark_exited_at(ev.pid, ev.ts_ns);
            }
            Some(ProcEventKind::ThreadExit)
            | Some(ProcEventKind::SyscallStorm)
            | Some(ProcEventKind::MappedExec)
            | Some(ProcEventKind::MappedCode)
            | None => {}
        }
    }

    /// Where the image of an exec just handled (its [`ProcEventKind::Exec`] event) lies,
    /// from the event: the process's code until /proc gives its maps, and for good where it
    /// exited first (most of a shell loop's children: 10 ms pass between two reads of the
    /// events).
    pub fn on_exec_image(&mut self, ev: &ExecEvent) {
        let pid = ev.head.pid;
        let Some(t) = self.procs.get(&pid) else {
            return;
        };
        // Read since the exec, or placed already.
        if !t.maps_stale || !t.maps.is_empty() {
            return;
        }
        let dirs = t.dirs();
        let (maps, files) = self.images.exec_maps(ev, &dirs);
        if maps.is_empty() {
            return;
        }
        for f in files {
            if self.held.wants(&f.key) {
                if let Some(file) = f.open(&dirs) {
                    self.held.insert(f.key.clone(), file);
                }
            }
        }
        let Some(t) = self.procs.get_mut(&pid) else {
            return;
        };
        t.maps = maps;
        self.images_placed += 1;
        // Its exit was seen first (a poll): its maps go where the exited ones' are bounded.
        if t.info.exited && !self.exited_with_maps.contains(&pid) {
            self.exited_with_maps.push_back(pid);
            self.evict_exited_maps();
        }
    }

    /// A young process mapped a file's code ([`MappedCodeEvent`]): where maps read from
    /// /proc or placed from the exec do not have it yet (a library its loader mapped after
    /// the exec), it goes in, for the process that exits before its maps are read. Named as
    /// another process's maps named that file (a shell loop's children map the shell's libc),
    /// else found by the path it was opened by (checked to be that file, and held).
    pub fn on_mapped_code(&mut self, ev: &MappedCodeEvent) {
        let Some(t) = self.procs.get(&ev.head.pid) else {
            return;
        };
        let end = ev
            .addr
            .checked_add(ev.len)
            .and_then(|e| e.checked_next_multiple_of(crate::image::PAGE));
        let (Some(end), true) = (end, ev.ino != 0 && ev.len > 0) else {
            return;
        };
        if crate::symbolize::find_mapping(&t.maps, ev.addr).is_some() {
            return;
        }
        let id = crate::image::kernel_file_id(ev.dev, ev.ino);
        let path = match self.held.path_of(id) {
            Some(p) => p.to_string(),
            None => {
                let name = crate::image::cstr(&ev.path);
                if name.is_empty() {
                    return;
                }
                let Some((file, path)) = crate::image::find_file(&t.dirs(), &name, id) else {
                    return;
                };
                let key = (ev.ino, path.clone());
                if self.held.wants(&key) {
                    self.held.insert_as(key, file, id);
                }
                path
            }
        };
        let Some(t) = self.procs.get_mut(&ev.head.pid) else {
            return;
        };
        // A fixed mapping replaces what it covers.
        t.maps.retain(|m| m.end <= ev.addr || m.start >= end);
        let at = t.maps.partition_point(|m| m.start < ev.addr);
        t.maps.insert(
            at,
            Mapping {
                start: ev.addr,
                end,
                offset: ev.offset,
                perms: "r-xp".into(),
                inode: ev.ino,
                path,
            },
        );
        self.libraries_placed += 1;
    }

    /// An exit found by polling: it happened by now.
    pub fn mark_exited(&mut self, pid: u32) {
        if self.procs.get(&pid).is_some_and(|t| !t.info.exited) {
            self.lives.push(Life::Exited(pid));
        }
        self.mark_exited_at(pid, crate::probes::ktime_now());
    }

    /// The families have seen this tick's [`Tracker::lives`].
    pub fn ticked(&mut self) {
        self.lives.clear();
    }

    /// An exit at `ts_ns` (CLOCK_MONOTONIC).
    pub fn mark_exited_at(&mut self, pid: u32, ts_ns: u64) {
        if let Some(t) = self.procs.get_mut(&pid) {
            if !t.info.exited {
                self.last_exit_ns = self.last_exit_ns.max(ts_ns);
                t.info.exited = true;
                self.running.remove(&pid);
                // Looked for only while it runs.
                self.held.ns_tgids.remove(&pid);
                if !t.maps.is_empty() || !t.images.is_empty() {
                    self.exited_with_maps.push_back(pid);
                }
            }
        }
        self.evict_exited_maps();
        if self.roots.contains(&pid) && !self.exited_roots.contains(&pid) {
            self.exited_roots.push(pid);
        }
    }

    /// Drops the maps of the earliest exited processes past [`max_exited_maps`].
    fn evict_exited_maps(&mut self) {
        while self.exited_with_maps.len() > max_exited_maps() {
            let Some(old) = self.exited_with_maps.pop_front() else {
                break;
            };
            if let Some(t) = self.procs.get_mut(&old) {
                if !self.roots.contains(&old) {
                    t.maps = Vec::new();
                    t.images = Vec::new();
                    self.held.forget(old);
                    // A child that never exec'd is symbolised with its parent's maps.
                    if t.execed {
                        self.maps_evicted += 1;
                    }
                }
            }
        }
    }

    /// Forgets an exited non-root process (lowest pid) to make room; false when there is none.
    fn evict_one_exited(&mut self) -> bool {
        let victim = self
            .procs
            .iter()
            .find(|(pid, t)| t.info.exited && !self.roots.contains(pid))
            .map(|(pid, _)| *pid);
        match victim {
            Some(pid) => {
                if self.procs[&pid].execed && !self.procs[&pid].maps.is_empty() {
                    self.maps_evicted += 1;
                }
                self.procs.remove(&pid);
                self.exited_with_maps.retain(|p| *p != pid);
                self.untracked += 1;
                true
            }
            None => false,
        }
    }

    /// The maps to symbolise `pid`'s addresses with in a sample of its image `exec_id` (the
    /// sample's `self_exec_id`, 0 when unknown), and whether they are an earlier image's: an
    /// earlier image's where it exec'd since (none where that image's maps were never read),
    /// else [`Tracker::maps_for`].
    pub fn maps_for_image(&self, pid: u32, exec_id: u32) -> (&[Mapping], bool) {
        if let Some(t) = self.procs.get(&pid) {
            if exec_id != 0 && t.exec_id.is_some_and(|now| now != exec_id) {
                let maps = t
                    .images
                    .iter()
                    .find(|(id, _)| *id == exec_id)
                    .map_or(&[][..], |(_, m)| m.as_slice());
                return (maps, true);
            }
        }
        (self.maps_for(pid), false)
    }

    /// The maps to symbolise `pid`'s addresses with: its own, or for a child that never exec'd
    /// and whose snapshot was evicted, its nearest ancestor's.
    pub fn maps_for(&self, pid: u32) -> &[Mapping] {
        let mut cur = pid;
        for _ in 0..64 {
            let Some(t) = self.procs.get(&cur) else {
                break;
            };
            if !t.maps.is_empty() || t.execed {
                return &t.maps;
            }
            match t.info.ppid {
                Some(pp) if pp != cur => cur = pp,
                _ => break,
            }
        }
        &[]
    }

    /// When the last traced process exited (CLOCK_MONOTONIC ns), if every one did: nothing
    /// of theirs ran after it.
    pub fn ended_at(&self) -> Option<u64> {
        (self.last_exit_ns > 0 && self.running.is_empty()).then_some(self.last_exit_ns)
    }

    /// The processes not exited, by pid.
    pub fn running(&self) -> impl Iterator<Item = (u32, &Tracked)> {
        self.running
            .iter()
            .filter_map(|pid| Some((*pid, self.procs.get(pid)?)))
    }

    pub fn all_roots_exited(&self) -> bool {
        self.roots.iter().all(|r| self.exited_roots.contains(r))
    }

    /// Re-reads maps: the stale ones, or, when `all`, the names of all live processes (a
    /// worker retitles itself) and the maps of those whose executable mappings changed size
    /// since (a library loaded or unloaded; every map now and then).
    pub fn refresh_maps(&mut self, all: bool) {
        let full = all && {
            self.all_refreshes += 1;
            self.all_refreshes.is_multiple_of(FULL_MAPS_EVERY)
        };
        let mut gone = Vec::new();
        let held = &mut self.held;
        let pids: Vec<u32> = if all {
            self.stale.clear();
            self.procs.keys().copied().collect()
        } else {
            std::mem::take(&mut self.stale).into_iter().collect()
        };
        for pid in &pids {
            let Some(t) = self.procs.get_mut(pid) else {
                continue;
            };
            if t.info.exited || !(all || t.maps_stale) {
                continue;
            }
            match Self::is_same(*pid, t) {
                Some(true) => {}
                Some(false) => {
                    gone.push(*pid);
                    continue;
                }
                None => continue,
            }
            let sizes = procfs::exec_sizes(*pid);
            if !full && !t.maps_stale && sizes.is_some() && sizes == t.exec_sizes {
                // Maps are read again when code is mapped from a file, or its size changes;
                // a JIT's memory is often writable too (V8's), which the sizes leave out.
                held.hold_perf_map(*pid, None);
                Self::refresh_names(*pid, t);
                continue;
            }
            if Self::take_maps(*pid, t, sizes, held) {
                Self::refresh_names(*pid, t);
            }
        }
        // Still stale (/proc gave no maps yet, or no answer): looked at again next time.
        self.stale.extend(pids.iter().filter(|p| {
            self.procs
                .get(p)
                .is_some_and(|t| t.maps_stale && !t.info.exited)
        }));
        // Exited (their pid free, or another process's): their exit event is late or lost.
        for pid in gone {
            self.mark_exited(pid);
        }
    }

    /// Reads the maps of `pid` (its executable mappings' sizes `sizes`) into `t`; false when
    /// /proc gave none.
    fn take_maps(
        pid: u32,
        t: &mut Tracked,
        sizes: Option<(u64, u64)>,
        held: &mut HeldFiles,
    ) -> bool {
        match procfs::read_maps(pid) {
            Some(m) if !m.is_empty() => {
                held.hold(pid, &m);
                held.hold_perf_map(pid, Some(&m));
                // A new process's or a new image's old maps are another program's.
                t.maps = if t.maps_stale {
                    m
                } else {
                    procfs::with_unloaded(&t.maps, m)
                };
                t.maps_stale = false;
                t.exec_sizes = sizes;
                t.maps_read_ns = crate::probes::ktime_now();
                true
            }
            _ => false,
        }
    }

    /// Reads the maps of `pid` into `t` now, if it is still the process `t` is.
    fn read_maps_of(pid: u32, t: &mut Tracked, held: &mut HeldFiles) {
        if !t.info.exited && Self::is_same(pid, t) == Some(true) {
            Self::take_maps(pid, t, procfs::exec_sizes(pid), held);
        }
    }

    /// Reads the maps of processes that just mapped a file executable (a library loaded with
    /// dlopen, a Python extension): a process that exits before the next full read (2 s) had
    /// its samples in them unnamed.
    pub fn refresh_mapped(&mut self, pids: &[u32]) {
        for pid in pids {
            if let Some(t) = self.procs.get_mut(pid) {
                Self::read_maps_of(*pid, t, &mut self.held);
            }
        }
    }

    /// Checks liveness of processes whose exit event may have been lost.
    pub fn poll_liveness(&mut self) {
        let dead: Vec<u32> = self
            .running()
            .filter(|(pid, _)| !procfs::is_alive(*pid))
            .map(|(pid, _)| pid)
            .collect();
        for pid in dead {
            self.mark_exited(pid);
        }
    }

    pub fn infos(&self) -> BTreeMap<u32, ProcessInfo> {
        self.procs
            .iter()
            .map(|(pid, t)| (*pid, t.info.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Above the kernel's pid_max (4194304), so /proc never has them.
    const BASE: u32 = 5_000_000;

    /// A fork event older than the process /proc shows under its pid (this test process, at a
    /// fork at boot): the pid was reused, and its /proc names are not the child's.
    #[test]
    fn a_reused_pid_is_not_named_from_proc() {
        let me = std::process::id();
        let mut t = storm_parent();
        t.on_event(&ev(ProcEventKind::Fork, me, BASE));
        let child = &t.procs[&me];
        assert_eq!(
            child.info.comm, "storm",
            "named after the parent, not /proc/{me}"
        );
        assert!(child.info.cmdline.is_empty());
        assert!(!child.maps_stale, "its maps would be another process's");
        assert_eq!(child.info.ppid, Some(BASE));
    }

    /// Another process under the pid in the same clock tick, told by its parent.
    #[test]
    fn a_pid_taken_within_the_childs_clock_tick_is_told_by_its_parent() {
        let me = std::process::id();
        let mut t = Tracker::new(&[BASE]);
        t.add(me, None);
        // Recorded as its own child (a live process, with its start time), where /proc shows
        // another parent: the same start tick, but another process under the pid.
        let p = t.procs.get_mut(&me).unwrap();
        p.info.ppid = Some(me);
        p.parent_start = p.start;
        p.info.comm = "child".into();
        t.refresh_maps(true);
        assert_eq!(t.procs[&me].info.comm, "child");
        assert!(t.procs[&me].info.exited);
        // A parent that exited, its pid now another process's (another start time): still
        // the child, reparented.
        let mut t = Tracker::new(&[BASE]);
        t.add(me, None);
        let p = t.procs.get_mut(&me).unwrap();
        p.info.ppid = Some(me);
        p.parent_start = p.start.map(|s| s + 1);
        p.info.comm.clear();
        t.refresh_maps(true);
        assert!(!t.procs[&me].info.comm.is_empty());
        assert!(!t.procs[&me].info.exited);
        // A first read put off after a fork at boot: this process started later, so is not
        // that child.
        let mut t = Tracker::new(&[BASE]);
        let p = t.procs.entry(me).or_default();
        p.forked_at = Some(0);
        p.maps_stale = true;
        t.refresh_maps(true);
        assert!(t.procs[&me].foreign);
        assert!(t.procs[&me].info.comm.is_empty());
    }

    /// The same pid later: /proc shows this test process, and the tracked one started at
    /// another time (it exited, its exit not yet seen): its names are not read, its maps not
    /// taken, and it is taken to have exited.
    #[test]
    fn a_pid_taken_after_the_first_read_is_not_read_again() {
        let me = std::process::id();
        let mut t = Tracker::new(&[BASE]);
        t.add(me, None);
        let started = t.procs[&me].start;
        assert!(started.is_some(), "the first read keeps its start time");
        let p = t.procs.get_mut(&me).unwrap();
        p.info.comm = "child".into();
        p.info.cmdline = vec!["./child".into()];
        p.start = started.map(|s| s + 1);
        p.maps_stale = true;
        t.refresh_maps(true);
        let p = &t.procs[&me];
        assert_eq!(p.info.comm, "child");
        assert_eq!(p.info.cmdline, vec!["./child".to_string()]);
        assert!(p.maps.is_empty(), "another process's maps");
        assert!(p.info.exited);
        // Its own start time: read as before.
        let mut t = Tracker::new(&[BASE]);
        t.add(me, None);
        t.procs.get_mut(&me).unwrap().info.comm.clear();
        t.refresh_maps(true);
        assert!(!t.procs[&me].info.comm.is_empty());
        assert!(!t.procs[&me].info.exited);
    }

    /// A fork seen now whose child /proc shows with another parent: given to init or a
    /// subreaper when its parent (BASE, which /proc never has) exited, it is still the child.
    /// Another parent that is alive means another process took the pid within the tick.
    #[test]
    fn a_child_whose_parent_exited_is_still_the_child() {
        let me = std::process::id();
        let mut t = storm_parent();
        let fork = ProcEvent {
            ts_ns: crate::probes::ktime_now(),
            ..ev(ProcEventKind::Fork, me, BASE)
        };
        t.on_event(&fork);
        let child = &t.procs[&me];
        assert_eq!(
            child.info.comm,
            procfs::comm(me).unwrap(),
            "read from /proc"
        );
        assert!(child.maps_stale, "its own maps are read");
        t.refresh_maps(true);
        assert!(!t.procs[&me].info.exited);
        assert!(!t.procs[&me].maps.is_empty());

        // Forked by init (alive) by the event, by someone else by /proc: not the child.
        assert_ne!(procfs::stat(me).unwrap().ppid, 1);
        let mut t = Tracker::new(&[1]);
        t.on_event(&ProcEvent {
            ts_ns: crate::probes::ktime_now(),
            ..ev(ProcEventKind::Fork, me, 1)
        });
        assert!(t.procs[&me].foreign);
        assert_eq!(t.procs[&me].info.comm, "");
    }

    /// A tracker of BASE, named `storm` (a pid /proc never has: gone before it was read).
    fn storm_parent() -> Tracker {
        let mut t = Tracker::new(&[BASE]);
        t.add(BASE, None);
        t.procs.get_mut(&BASE).unwrap().info.comm = "storm".into();
        t
    }

    fn ev(kind: ProcEventKind, pid: u32, ppid: u32) -> ProcEvent {
        let mut comm = [0u8; 16];
        comm[..5].copy_from_slice(b"storm");
        ProcEvent {
            kind: kind as u32,
            pid,
            tid: pid,
            ppid,
            ts_ns: 0,
            exit_code: 0,
            arg: 0,
            comm,
        }
    }

    fn mapping() -> Mapping {
        Mapping {
            start: 0x1000,
            end: 0x2000,
            offset: 0,
            perms: "r-xp".into(),
            inode: 1,
            path: "/usr/bin/storm".into(),
        }
    }

    #[test]
    fn fork_storm_stays_bounded_and_counts_what_it_forgot() {
        let mut t = Tracker::new(&[BASE]);
        t.add(BASE, None);
        t.procs.get_mut(&BASE).unwrap().maps = vec![mapping(); 50];
        t.procs.get_mut(&BASE).unwrap().info.comm = "parent".into();
        let children = MAX_TRACKED as u32 + 500;
        for i in 1..=children {
            t.on_event(&ev(ProcEventKind::Fork, BASE + i, BASE));
            t.on_event(&ev(ProcEventKind::Exit, BASE + i, 0));
        }
        assert!(t.procs.len() <= MAX_TRACKED, "{} tracked", t.procs.len());
        assert_eq!(t.seen, children as u64 + 1);
        assert!(t.untracked >= 500, "untracked {}", t.untracked);
        let with_maps = t.procs.values().filter(|p| !p.maps.is_empty()).count();
        assert!(with_maps <= MAX_EXITED_MAPS + 1, "{with_maps} keep maps");
        // Children that never exec'd fall back to their parent's maps: nothing is lost.
        assert_eq!(t.maps_evicted, 0);
        let evicted = *t
            .procs
            .iter()
            .find(|(_, p)| p.maps.is_empty())
            .expect("some child lost its snapshot")
            .0;
        assert_eq!(t.maps_for(evicted).len(), 50);
        // The root keeps its maps and stays known.
        assert_eq!(t.procs[&BASE].maps.len(), 50);
        // A child that exited before /proc could be read is named after its parent.
        let last = BASE + children;
        assert_eq!(t.procs[&last].info.comm, "parent");
        assert!(t.procs[&last].info.exited);
    }

    #[test]
    fn execed_children_count_as_evicted() {
        let mut t = Tracker::new(&[BASE]);
        t.add(BASE, None);
        for i in 1..=(MAX_EXITED_MAPS as u32 + 10) {
            t.on_event(&ev(ProcEventKind::Fork, BASE + i, BASE));
            t.on_event(&ev(ProcEventKind::Exec, BASE + i, 0));
            t.procs.get_mut(&(BASE + i)).unwrap().maps = vec![mapping()];
            t.on_event(&ev(ProcEventKind::Exit, BASE + i, 0));
        }
        assert_eq!(t.maps_evicted, 10);
        assert!(t.maps_for(BASE + 1).is_empty());
        assert_eq!(t.maps_for(BASE + 11).len(), 1);
    }

    /// A pid an exited process left and a new child took is the new process's, alive.
    #[test]
    fn a_reused_pid_starts_a_new_process() {
        let mut t = Tracker::new(&[BASE]);
        t.add(BASE, None);
        let child = BASE + 1;
        t.on_event(&ev(ProcEventKind::Fork, child, BASE));
        t.procs.get_mut(&child).unwrap().info.comm = "alpha".into();
        t.on_event(&ev(ProcEventKind::Exit, child, 0));
        assert!(t.procs[&child].info.exited);
        t.on_event(&ev(ProcEventKind::Fork, child, BASE));
        assert!(!t.procs[&child].info.exited);
        assert_ne!(t.procs[&child].info.comm, "alpha");
        assert_eq!(t.seen, 3);
        assert_eq!(t.pids_reused, [child].into());
    }

    /// A child that execs and exits before /proc is read takes the new image's name from
    /// the exec event, not its parent's.
    #[test]
    fn an_exec_names_the_process_after_its_new_image() {
        let mut t = Tracker::new(&[BASE]);
        t.add(BASE, None);
        t.procs.get_mut(&BASE).unwrap().info.comm = "parent".into();
        let child = BASE + 1;
        t.on_event(&ev(ProcEventKind::Fork, child, BASE));
        assert_eq!(t.procs[&child].info.comm, "parent");
        let mut exec = ev(ProcEventKind::Exec, child, 0);
        exec.comm = [0; 16];
        exec.comm[..4].copy_from_slice(b"true");
        t.on_event(&exec);
        t.on_event(&ev(ProcEventKind::Exit, child, 0));
        assert_eq!(t.procs[&child].info.comm, "true");
    }

    #[test]
    fn an_image_gone_before_its_maps_are_read_is_placed_from_its_exec() {
        use crate::image::tests::{exe, own_exec};
        let mut t = storm_parent();
        // Forked by a live process (this one), whose root it is looked up in.
        let child = BASE + 1;
        t.on_event(&ev(ProcEventKind::Fork, child, std::process::id()));
        let mut exec = ev(ProcEventKind::Exec, child, 0);
        exec.arg = 2;
        t.on_event(&exec);
        // No such process here: /proc gave no maps.
        assert!(t.maps_for(child).is_empty());
        let (path, id) = exe();
        let mut image = own_exec(&path, id);
        image.head = exec;
        t.on_exec_image(&image);
        let (maps, earlier) = t.maps_for_image(child, 2);
        assert!(!earlier && maps.iter().any(|m| m.path == path), "{maps:?}");
        assert_eq!(t.images_placed, 1);
        // Its files are held, for a report written after they are replaced on disk.
        assert!(t.held.paths().contains_key(&(id.2, path.clone())));
        // A child whose parent is gone by now: from our root, its executable checked all
        // the same.
        let orphan = BASE + 2;
        t.on_event(&ev(ProcEventKind::Fork, orphan, BASE));
        t.on_event(&ev(ProcEventKind::Exec, orphan, 0));
        image.head.pid = orphan;
        t.on_exec_image(&image);
        assert!(t.maps_for(orphan).iter().any(|m| m.path == path));
        assert_eq!(t.images_placed, 2);
        // Maps /proc gave since the exec are the process's own: kept.
        let me = std::process::id();
        let mut t = Tracker::new(&[me]);
        t.add(me, None);
        t.refresh_maps(true);
        let before = t.maps_for(me).to_vec();
        assert!(!before.is_empty());
        let mut image = own_exec(&path, id);
        image.head.pid = me;
        t.on_exec_image(&image);
        assert_eq!(t.maps_for(me), &before[..]);
        assert_eq!(t.images_placed, 0);
    }

    #[test]
    fn a_young_processs_library_is_placed_from_its_mmap() {
        use std::os::unix::fs::MetadataExt;
        let mut t = storm_parent();
        let child = BASE + 1;
        t.on_event(&ev(ProcEventKind::Fork, child, BASE));
        t.on_event(&ev(ProcEventKind::Exec, child, 0));
        assert!(t.maps_for(child).is_empty());
        // A file another process's maps named (held): this test binary.
        let (path, id) = crate::image::tests::exe();
        let ino = id.2;
        let file = std::fs::File::open(&path).unwrap();
        let dev = file.metadata().unwrap().dev();
        t.held.insert((ino, path.clone()), file);
        let base = 0x7000_0000_0000;
        let mut code = MappedCodeEvent {
            head: ev(ProcEventKind::MappedCode, child, 0),
            addr: base,
            len: 0x1800,
            offset: 0x2000,
            ino,
            dev: (libc::major(dev) << 20) | libc::minor(dev),
            _pad: 0,
            path: [0; tracer_common::wall::FD_NAME_LEN],
        };
        t.on_mapped_code(&code);
        let placed = Mapping {
            start: base,
            end: base + 0x2000,
            offset: 0x2000,
            perms: "r-xp".into(),
            inode: ino,
            path: path.clone(),
        };
        assert_eq!(t.maps_for(child), &[placed.clone()][..]);
        // Where the maps have it already, nothing more.
        t.on_mapped_code(&code);
        assert_eq!(t.maps_for(child).len(), 1);
        // A file no maps named, or unread: left out.
        code.addr = base + 0x10_0000;
        for other in [ino + 1, 0] {
            code.ino = other;
            t.on_mapped_code(&code);
        }
        code.ino = ino;
        code.dev += 1;
        t.on_mapped_code(&code);
        assert_eq!(t.maps_for(child), &[placed][..]);
        // A mapping over part of it replaces it.
        code.dev -= 1;
        code.addr = base - 0x1000;
        t.on_mapped_code(&code);
        let maps = t.maps_for(child);
        assert_eq!(maps.len(), 1);
        assert_eq!((maps[0].start, maps[0].end), (base - 0x1000, base + 0x1000));
        assert_eq!(t.libraries_placed, 2);
        // A file no maps named (a dlopen'd library), found by the path it was opened by,
        // where that leads to it; and held.
        let lib = tempfile::NamedTempFile::new().unwrap();
        let meta = lib.as_file().metadata().unwrap();
        let name = std::fs::canonicalize(lib.path())
            .unwrap()
            .display()
            .to_string();
        code.addr = base + 0x20_0000;
        code.ino = meta.ino();
        code.dev = (libc::major(meta.dev()) << 20) | libc::minor(meta.dev());
        code.path[..name.len()].copy_from_slice(name.as_bytes());
        let mut wrong = code;
        wrong.ino += 1;
        t.on_mapped_code(&wrong);
        assert_eq!(t.libraries_placed, 2);
        t.on_mapped_code(&code);
        assert!(
            t.maps_for(child)
                .iter()
                .any(|m| m.start == code.addr && m.path == name),
            "{:?}",
            t.maps_for(child)
        );
        assert!(t.held.paths().contains_key(&(meta.ino(), name.clone())));
        assert_eq!(t.libraries_placed, 3);
        // An unknown process: nothing.
        code.head.pid = BASE + 9;
        t.on_mapped_code(&code);
        assert_eq!(t.libraries_placed, 3);
    }

    /// An exec keeps the old image's maps for the samples the kernel says are of it.
    #[test]
    fn samples_of_an_earlier_image_get_its_maps() {
        let mut t = Tracker::new(&[BASE]);
        t.add(BASE, None);
        t.procs.get_mut(&BASE).unwrap().maps = vec![mapping()];
        let child = BASE + 1;
        t.on_event(&ev(ProcEventKind::Fork, child, BASE));
        let mut exec = ev(ProcEventKind::Exec, child, 0);
        exec.arg = 7;
        exec.ts_ns = 1;
        t.on_event(&exec);
        // The child's maps could not be read (no such process here): none, not its parent's.
        assert!(t.maps_for(child).is_empty());
        assert_eq!(t.maps_for_image(child, 6), (&[mapping()][..], true));
        assert!(t.maps_for_image(child, 7).0.is_empty());
        // An image never seen, and a sample with no id, get the current maps.
        assert!(t.maps_for_image(child, 3).0.is_empty());
        t.procs.get_mut(&child).unwrap().maps = vec![mapping(), mapping()];
        assert_eq!(t.maps_for_image(child, 0).0.len(), 2);
        assert_eq!(
            t.maps_for_image(child, 7),
            (&t.procs[&child].maps[..], false)
        );
        // Maps read after the exec (before its event was handled) are not the old image's.
        let late = BASE + 3;
        t.on_event(&ev(ProcEventKind::Fork, late, BASE));
        t.procs.get_mut(&late).unwrap().maps_read_ns = 10;
        let mut exec = ev(ProcEventKind::Exec, late, 0);
        (exec.arg, exec.ts_ns) = (7, 5);
        t.on_event(&exec);
        assert!(t.procs[&late].images.is_empty());
        assert!(t.maps_for_image(late, 6).0.is_empty());
        // Where the kernel could not tell images apart, the old maps are dropped all the same.
        let other = BASE + 2;
        t.on_event(&ev(ProcEventKind::Fork, other, BASE));
        t.on_event(&ev(ProcEventKind::Exec, other, 0));
        assert!(t.maps_for(other).is_empty());
        assert!(t.procs[&other].images.is_empty());
    }

    #[test]
    fn live_processes_are_never_evicted() {
        let mut t = Tracker::new(&[BASE]);
        t.add(BASE, None);
        for i in 1..=(MAX_TRACKED as u32 + 10) {
            t.on_event(&ev(ProcEventKind::Fork, BASE + i, BASE));
        }
        // Nothing exited, so nothing could be evicted: the overflow is counted instead.
        assert_eq!(t.procs.len(), MAX_TRACKED);
        assert_eq!(t.untracked, 11);
        assert!(t.procs.values().all(|p| !p.info.exited));
    }

    /// The index of running processes says what a walk over every entry would, through
    /// forks, execs, exits (seen or polled), pids taken again and evictions past the cap.
    #[test]
    fn the_running_index_matches_the_entries() {
        let check = |t: &Tracker| {
            let walked: Vec<u32> = t
                .procs
                .iter()
                .filter(|(_, p)| !p.info.exited)
                .map(|(pid, _)| *pid)
                .collect();
            let indexed: Vec<u32> = t.running().map(|(pid, _)| pid).collect();
            assert_eq!(indexed, walked);
            assert_eq!(
                t.ended_at().is_some(),
                t.last_exit_ns > 0 && walked.is_empty()
            );
        };
        let mut t = Tracker::new(&[BASE]);
        t.add(BASE, None);
        check(&t);
        // Past the cap, so that exited children are evicted; every third one stays.
        for i in 1..=(MAX_TRACKED as u32 + 300) {
            t.on_event(&ev(ProcEventKind::Fork, BASE + i, BASE));
            if i % 5 == 0 {
                t.on_event(&ev(ProcEventKind::Exec, BASE + i, 0));
            }
            if i % 3 != 0 {
                t.on_event(&ev(ProcEventKind::Exit, BASE + i, 0));
            }
        }
        assert!(t.untracked > 0);
        check(&t);
        // A pid given up and taken again while its exited process is still remembered (the
        // last child, exited); an exec of a process never seen fork; an exit found by
        // polling.
        let reused = BASE + MAX_TRACKED as u32 + 300;
        assert!(t.procs[&reused].info.exited);
        t.on_event(&ev(ProcEventKind::Fork, reused, BASE));
        assert!(t.pids_reused.contains(&reused));
        let unseen = BASE + 10_000_000;
        t.on_event(&ev(ProcEventKind::Exec, unseen, 0));
        t.mark_exited(BASE + 3);
        check(&t);
        assert!(t.running().any(|(pid, _)| pid == reused));
        assert!(t.running().any(|(pid, _)| pid == unseen));
        assert!(t.running().all(|(pid, _)| pid != BASE + 3));
        let all: Vec<u32> = t.running().map(|(pid, _)| pid).collect();
        for pid in all {
            t.on_event(&ev(ProcEventKind::Exit, pid, 0));
        }
        check(&t);
        assert_eq!(t.running().count(), 0);
    }
}
