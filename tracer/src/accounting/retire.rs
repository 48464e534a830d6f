//! Moves what dead threads left in the kernel's maps into gputrace's memory while the trace
//! runs, so that a job that starts a thread per request for an hour does not fill them: each
//! thread leaves a `LIFE` entry, a few `WALL` rows and a `SYSCALLS` row per syscall it made,
//! and with nothing taken out `SYSCALLS` (32,768 rows) was full after ~6,500 threads, `WALL`
//! after ~20,000, and later threads' figures were lost (counted as drops).
//!
//! A dead thread's rows are final: the programs write them out at its last switch-out
//! (`account::died`) before they record its death in `LIFE`, and nothing writes them after.
//! So a pass reads and deletes the deaths, then the `WALL` rows of those thread instances
//! (keyed by birth time and tid) and the `SYSCALLS` and `ERRNOS` rows of those tids; `fill`
//! adds what was retired to what is still in the maps at the end.
//!
//! Retired syscall rows are the largest (~330 bytes each); past [`MAX_THREAD_SYSCALL_ROWS`]
//! a dead thread's rows are folded into its process's (tid 0: no thread has it), which keeps
//! the process's table exact and drops only that thread's own. Time rows (~72 bytes) are kept
//! per thread up to [`MAX_WALL_ROWS`]; past that a dead thread's time rows are summed into its
//! process's in the same way, with its life (`aggregate::FoldedLives`): the process's time
//! stays whole, and gputrace's memory is bounded by the distinct reasons and stacks, not by
//! how many threads came and went.

use std::collections::{BTreeMap, BTreeSet, HashMap as StdHashMap};

use anyhow::{Context, Result};
use aya::{
    maps::{HashMap, MapData},
    Ebpf,
};
use tracer_common::wall::{
    BlkKey, BlkStat, ErrnoKey, FdGenKey, FdKey, FdName, FdStat, LifeKey, LifeVal, SysKey, SysStat,
    WallKey, WallVal, BLOCK_MAP, DEATHS_MAP, ERRNOS_MAP, FD_EPOCH_MAP, FD_GEN_MAP, FD_NAMES_MAP,
    FD_NAME_WAYS, FILEIO_MAP, LIFE_MAP, SYSCALLS_MAP, WALL_MAP,
};

use super::aggregate::{FoldedLives, Row, FOLDED_TID};

/// Deaths that start a pass before its time: a storm of short threads (each leaves ~5
/// syscall rows, the map holds 32,768) is caught well before the maps fill.
pub const DEATHS_PER_PASS: u64 = 1_000;

/// Closes that start a files pass before its time (`FILEIO` holds 16,384 rows: one per file
/// opened and used, until the end).
pub const CLOSES_PER_PASS: u64 = 1_000;

/// Closed-file names kept at most, all processes together (~100 bytes each); past it, a
/// closed file's I/O goes under its directory (`/data/train/…`), and past a quarter more
/// rows, a row of a (process, directory) not there yet is not kept: each new process of a
/// storm that reads a file would add one. `GPUTRACE_MAX_CLOSED_FILES` lowers it, for tests.
pub const MAX_CLOSED_FILES: usize = 200_000;

pub fn max_closed_files() -> usize {
    crate::env_cap("GPUTRACE_MAX_CLOSED_FILES", MAX_CLOSED_FILES)
}

/// Retired time rows kept per thread at most (~18 MB: ~75,000 threads' worth; the report
/// lists 128 threads per process). Past it, dead threads' rows are folded into their
/// processes'. `GPUTRACE_MAX_WALL_ROWS` lowers it, for tests.
pub const MAX_WALL_ROWS: usize = 250_000;

pub fn max_wall_rows() -> usize {
    crate::env_cap("GPUTRACE_MAX_WALL_ROWS", MAX_WALL_ROWS)
}

/// Retired per-thread syscall rows kept at most (~30 MB); beyond, rows fold into their
/// process's.
pub const MAX_THREAD_SYSCALL_ROWS: usize = 100_000;

/// Retired syscall rows kept at most, folded ones included (~70 MB). Folding a thread's rows
/// into its process's bounds a thread storm, not a process storm: each short process has
/// one thread, and `while :; do /bin/true; done` left ~20 rows per process, 230 MB in 30 s.
/// Past it, an exited process's rows that are not there yet are not kept (counted, and said
/// in the report). `GPUTRACE_MAX_SYSCALL_ROWS` lowers it, for tests.
pub const MAX_SYSCALL_ROWS: usize = 200_000;

pub fn max_syscall_rows() -> usize {
    crate::env_cap("GPUTRACE_MAX_SYSCALL_ROWS", MAX_SYSCALL_ROWS)
}

/// (tgid, tid) pairs.
type Threads = BTreeSet<(u32, u32)>;

/// A syscall row kept in gputrace's memory: a [`SysStat`] with its histogram cut to the
/// buckets from its first used to its last (a row uses 3-6 of its 32 buckets, typically). A
/// storm of short processes keeps [`MAX_SYSCALL_ROWS`] retired rows: ~330 bytes each whole,
/// ~130 cut.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SysRow {
    pub count: u64,
    pub errors: u64,
    pub total_ns: u64,
    pub min_ns: u64,
    pub max_ns: u64,
    pub bytes: u64,
    pub timed: u64,
    /// The bucket `hist[0]` is.
    first: u8,
    hist: Box<[u64]>,
}

impl SysRow {
    pub fn whole(&self) -> SysStat {
        let mut s = SysStat {
            count: self.count,
            errors: self.errors,
            total_ns: self.total_ns,
            min_ns: self.min_ns,
            max_ns: self.max_ns,
            bytes: self.bytes,
            timed: self.timed,
            ..SysStat::default()
        };
        let first = usize::from(self.first);
        s.hist[first..first + self.hist.len()].copy_from_slice(&self.hist);
        s
    }

    /// Adds another row of the same syscall (`SysStat::add`).
    pub fn add(&mut self, o: &SysStat) {
        let mut w = self.whole();
        w.add(o);
        *self = SysRow::from(&w);
    }
}

impl From<&SysStat> for SysRow {
    fn from(s: &SysStat) -> Self {
        let first = s.hist.iter().position(|&n| n != 0).unwrap_or(0);
        let last = s
            .hist
            .iter()
            .rposition(|&n| n != 0)
            .map_or(first, |l| l + 1);
        SysRow {
            count: s.count,
            errors: s.errors,
            total_ns: s.total_ns,
            min_ns: s.min_ns,
            max_ns: s.max_ns,
            bytes: s.bytes,
            timed: s.timed,
            first: first as u8,
            hist: s.hist[first..last].into(),
        }
    }
}

/// What dead threads left, taken out of the maps.
#[derive(Default)]
pub struct Retired {
    pub deaths: Vec<(LifeKey, LifeVal)>,
    pub wall: Vec<Row>,
    pub syscalls: BTreeMap<SysKey, SysRow>,
    pub errnos: BTreeMap<ErrnoKey, u64>,
    /// Dead threads whose syscall rows were folded into their process's.
    pub folded_threads: u64,
    /// Time rows of dead threads folded into their processes' (tid `FOLDED_TID`, born 0),
    /// and the threads they stand for, per process.
    pub folded_wall: StdHashMap<WallKey, WallVal>,
    pub folded_lives: BTreeMap<u32, FoldedLives>,
    /// `DEATHS` at the last pass.
    seen_deaths: u64,
    /// Dead threads (tgid, tid) whose syscall rows a pass left because a live thread of that
    /// process had the tid: it died during the pass (its state goes after its `LIFE` entry),
    /// or the tid was used again. Looked at again by every pass until no live thread has it.
    pending: Threads,
    /// Closed files' I/O by (tgid, name), taken out of `FILEIO` and named when taken.
    pub files: BTreeMap<(u32, String), FdStat>,
    /// Gone processes' block I/O by (tgid, disk), taken out of `BLOCK_IO` (each CPU's copy
    /// summed), at most [`MAX_BLOCK_ROWS`].
    pub block: BTreeMap<BlkKey, BlkStat>,
    /// Closed files whose I/O went under their directory's name (`MAX_CLOSED_FILES`).
    pub files_folded: u64,
    /// Closed files whose I/O was not kept (past the folded rows' room too), and its bytes.
    pub files_dropped: u64,
    pub files_bytes_dropped: u64,
    /// `FD_EPOCH` at the last files pass.
    seen_closes: u64,
    /// Syscall rows of exited processes not kept past [`MAX_SYSCALL_ROWS`], and the calls
    /// they held.
    pub syscall_rows_dropped: u64,
    pub syscall_calls_dropped: u64,
    /// The names files passes gave, by file, the latest [`RECENT_NAMES`]: a thread holds the
    /// I/O of its last file in its state and writes it as a row of its own at its next file,
    /// perhaps after the file's `FD_NAMES` slot went to another open (20,000 short children
    /// took it between a file's first write and the rest of its writes).
    recent: StdHashMap<FdKey, String>,
    recent_order: std::collections::VecDeque<FdKey>,
    /// The young stacks of the time rows taken (`crate::young`): the rows hold copies' ids,
    /// not slots of the maps, which are freed.
    pub copies: crate::young::Copies,
}

/// Gone processes' block rows kept (~340 bytes each): past this they stay in `BLOCK_IO`, whose
/// 4,096 rows (one per process and disk) a long trace of short processes reading a disk
/// filled (`BlockMapFull`).
pub const MAX_BLOCK_ROWS: usize = 65_536;

/// Names kept for a closed file's later rows (~100 bytes each).
pub const RECENT_NAMES: usize = 65_536;

/// The shared counter in map `name` (an array of one `u64`).
pub(super) fn counter(ebpf: &Ebpf, name: &str) -> Result<u64> {
    let map: aya::maps::Array<&MapData, u64> = aya::maps::Array::try_from(
        ebpf.map(name)
            .with_context(|| format!("map {name} missing"))?,
    )?;
    Ok(map.get(&0, 0)?)
}

/// Moves every fd of the traced processes on to a new open generation, and `FD_EPOCH` with
/// them (so threads look their fd's generation up again): while the syscall programs were off
/// closes went unseen, and a file opened since under an old number must not add to the row of
/// the file that number had, nor take the name an open gave it (`FD_NAMES`). A file open
/// throughout gets a second row, named from /proc like the first; the report sums a process's
/// rows by name. Only while the programs are off: no program moves these meanwhile.
pub(super) fn next_fd_generations(ebpf: &mut Ebpf) -> Result<()> {
    let mut gens = super::fill::fd_gens(ebpf)?;
    let mut see = |k: FdKey| {
        let g = gens.entry((k.tgid, k.fd)).or_insert(0);
        *g = (*g).max(k.gen);
    };
    for (k, _) in crate::batch::read::<FdKey, FdStat>(ebpf, FILEIO_MAP)? {
        see(k);
    }
    if let Some(names) = super::fill::opened_paths(ebpf) {
        for n in names.iter().filter_map(Result::ok) {
            if n.key.tgid != 0 {
                see(n.key);
            }
        }
    }
    let mut map: HashMap<&mut MapData, FdGenKey, u32> = HashMap::try_from(
        ebpf.map_mut(FD_GEN_MAP)
            .with_context(|| format!("map {FD_GEN_MAP} missing"))?,
    )?;
    for ((tgid, fd), g) in gens {
        // A full map leaves that fd where it was: its rows may then mix two files.
        let _ = map.insert(FdGenKey { tgid, fd }, g + 1, 0);
    }
    let epoch = counter(ebpf, FD_EPOCH_MAP)?;
    let mut map: aya::maps::Array<&mut MapData, u64> = aya::maps::Array::try_from(
        ebpf.map_mut(FD_EPOCH_MAP)
            .with_context(|| format!("map {FD_EPOCH_MAP} missing"))?,
    )?;
    map.set(0, epoch + 1, 0)
        .with_context(|| format!("set {FD_EPOCH_MAP}"))
}

/// Frees the `FD_NAMES` slots of the files `keys` (named already), so that their sets have
/// room for the live processes' opens.
fn forget_names(ebpf: &mut Ebpf, keys: &[FdKey]) -> Result<()> {
    if keys.is_empty() {
        return Ok(());
    }
    let mut names: aya::maps::Array<&mut MapData, FdName> = aya::maps::Array::try_from(
        ebpf.map_mut(FD_NAMES_MAP)
            .with_context(|| format!("map {FD_NAMES_MAP} missing"))?,
    )?;
    for k in keys {
        let set = FdName::set(k);
        for i in set..set + FD_NAME_WAYS {
            if let Ok(mut n) = names.get(&i, 0) {
                if n.key == *k {
                    n.key.tgid = 0;
                    let _ = names.set(i, n, 0);
                }
            }
        }
    }
    Ok(())
}

/// Where a closed file's I/O goes once `MAX_CLOSED_FILES` names are held: its directory's
/// entry, or one for all unnamed ones.
fn folded_name(name: &str) -> String {
    match name.rfind('/') {
        Some(cut) if name.starts_with('/') => format!("{}/…", &name[..cut]),
        _ => "<other closed files>".to_string(),
    }
}

/// The eBPF object's hash map `name`.
fn hash_map<'a, K: aya::Pod, V: aya::Pod>(
    ebpf: &'a mut Ebpf,
    name: &str,
) -> Result<HashMap<&'a mut MapData, K, V>> {
    Ok(HashMap::try_from(
        ebpf.map_mut(name)
            .with_context(|| format!("map {name} missing"))?,
    )?)
}

/// Takes the entries of `name` whose keys `pick` chooses out of the map.
fn take<K: aya::Pod, V: aya::Pod>(
    ebpf: &mut Ebpf,
    name: &str,
    pick: impl Fn(&K) -> bool,
) -> Result<Vec<(K, V)>> {
    Ok(super::take::take(&mut hash_map(ebpf, name)?, pick))
}

/// As [`take`], for rows no program writes any more: a dead thread's (`take::take_final`).
/// A death is recorded after the thread's last rows, and its tid's rows are left while a
/// live thread holds that tid (`pending`, read at the pass's start). A thread of the same
/// process given the dead one's tid during the pass would add to its syscall and errno rows
/// (keyed by process and tid, not by birth) between their listing and their delete, and that
/// would be lost (the one-step take gave it to the dead thread instead). The kernel hands pids
/// out in order and a freed one again only after the rest of the range (`pid_max`), so that
/// takes a pass at the moment they wrap onto the tid, or a tid chosen with `clone3`.
fn take_final<K: aya::Pod, V: aya::Pod>(
    ebpf: &mut Ebpf,
    name: &str,
    pick: impl Fn(&K) -> bool,
) -> Result<Vec<(K, V)>> {
    Ok(super::take::take_final(&mut hash_map(ebpf, name)?, pick))
}

impl Retired {
    /// The names files passes gave (see `recent`), for the rows left at the end.
    pub fn take_recent_names(&mut self) -> StdHashMap<FdKey, String> {
        self.recent_order.clear();
        std::mem::take(&mut self.recent)
    }

    /// Keeps the name a pass gave file `k` (not a `<closed fd N>`) for its later rows.
    fn remember(&mut self, k: FdKey, name: &str) {
        if name.starts_with("<closed fd") || self.recent.contains_key(&k) {
            return;
        }
        if self.recent_order.len() >= RECENT_NAMES {
            if let Some(old) = self.recent_order.pop_front() {
                self.recent.remove(&old);
            }
        }
        self.recent.insert(k, name.to_string());
        self.recent_order.push_back(k);
    }

    /// Whether `DEATHS_PER_PASS` threads died since the last pass, or any did (or some wait
    /// in `pending`) and `due`.
    pub fn wanted(&self, ebpf: &Ebpf, due: bool) -> bool {
        counter(ebpf, DEATHS_MAP).is_ok_and(|n| {
            let new = n.saturating_sub(self.seen_deaths);
            new >= DEATHS_PER_PASS || (due && (new > 0 || !self.pending.is_empty()))
        })
    }

    /// One pass: the deaths recorded since the last, and their rows; returns how many.
    pub fn pass(&mut self, ebpf: &mut Ebpf) -> Result<usize> {
        // Read first: deaths recorded during the pass are counted for the next one.
        self.seen_deaths = counter(ebpf, DEATHS_MAP)?;
        // A (process, tid) a live thread holds keeps its syscall rows: they are keyed by tid,
        // so they are that thread's too. Read before anything is taken: each step below keeps
        // what it took before the next one can fail.
        let live: BTreeSet<(u32, u32)> = super::States::open(ebpf)
            .and_then(|s| s.all(ebpf))
            .context("read the thread states")?
            .into_iter()
            .map(|(tid, st)| (st.tgid, tid))
            .collect();
        let deaths: Vec<(LifeKey, LifeVal)> = take_final(ebpf, LIFE_MAP, |_: &LifeKey| true)?;
        if deaths.is_empty() && self.pending.is_empty() {
            return Ok(0);
        }
        let instances: BTreeSet<(u64, u32)> =
            deaths.iter().map(|(k, _)| (k.born_ns, k.tid)).collect();
        let (tids, pending): (Threads, Threads) = deaths
            .iter()
            .map(|(k, v)| (v.tgid, k.tid))
            .chain(std::mem::take(&mut self.pending))
            .partition(|t| !live.contains(t));
        self.pending = pending;
        let n = deaths.len();
        let wall: Vec<(WallKey, WallVal)> = match take_final(ebpf, WALL_MAP, |k: &WallKey| {
            instances.contains(&(k.born_ns, k.tid))
        }) {
            Ok(w) => w,
            Err(e) => {
                // Kept whole: the rows left in the map are read at the end and need their
                // deaths then.
                self.deaths.extend(deaths);
                return Err(e);
            }
        };
        // Their young stacks' slots are freed once no row holds them: the rows take copies,
        // each stack read once a pass (`Stacks` caches; a thread's rows share a few).
        let mut stacks = crate::collect::Stacks::new(ebpf).ok();
        let wall: Vec<(WallKey, WallVal)> = wall
            .into_iter()
            .map(|(mut k, v)| {
                k.ustack = self.copies.keep(k.ustack, stacks.as_mut());
                (k, v)
            })
            .collect();
        let fold = self.wall.len() >= max_wall_rows();
        self.add_time(deaths, wall, fold);
        let rows: Vec<(SysKey, SysStat)> = take_final(ebpf, SYSCALLS_MAP, |k: &SysKey| {
            tids.contains(&(k.tgid, k.tid))
        })?;
        // One decision for both tables: a thread's errno rows go where its syscall rows went.
        let fold = self.syscalls.len() >= MAX_THREAD_SYSCALL_ROWS;
        self.add_syscalls(rows, fold);
        let errs: Vec<(ErrnoKey, u64)> = take_final(ebpf, ERRNOS_MAP, |k: &ErrnoKey| {
            tids.contains(&(k.tgid, k.tid))
        })?;
        self.add_errnos(errs, fold);
        Ok(n)
    }

    /// Whether `CLOSES_PER_PASS` files were closed since the last files pass, or any were and
    /// `due`.
    pub fn files_wanted(&self, ebpf: &Ebpf, due: bool) -> bool {
        counter(ebpf, FD_EPOCH_MAP).is_ok_and(|n| {
            let new = n.saturating_sub(self.seen_closes);
            new >= CLOSES_PER_PASS || (due && new > 0)
        })
    }

    /// Takes the `FILEIO` rows of closed files (an fd's generation behind the fd's current
    /// one) out of the map, named now: by `fds` (read from /proc while open), else by the
    /// path that opened it (`FD_NAMES`, whose slots later opens take). A thread may still
    /// hold I/O of such a file in its state; it writes a new row when it flushes, taken out
    /// by a later pass under the same name.
    ///
    /// `gone`: processes that exited at least a pass ago (their dying threads' last rows are
    /// written by then). All their rows are final: taken too, and their fd generations and
    /// names are forgotten. Nothing else removes them, and a job that starts processes (every
    /// exec'd program's loader closes an fd) filled `FD_GEN`'s 16,384 entries: a later
    /// process's closes then started no new generation, and its files' I/O went under one
    /// unnamed row. Returns the rows taken and the processes forgotten.
    pub fn files_pass(
        &mut self,
        ebpf: &mut Ebpf,
        fds: &BTreeMap<FdKey, String>,
        gone: &BTreeSet<u32>,
        parent: &dyn Fn(u32) -> Option<u32>,
    ) -> Result<(usize, BTreeSet<u32>)> {
        self.seen_closes = counter(ebpf, FD_EPOCH_MAP)?;
        let gens = super::fill::fd_gens(ebpf)?;
        let rows: Vec<(FdKey, FdStat)> = take(ebpf, FILEIO_MAP, |k: &FdKey| {
            gone.contains(&k.tgid) || gens.get(&(k.tgid, k.fd)).is_some_and(|g| k.gen < *g)
        })?;
        let names = super::fill::opened_paths(ebpf);
        let lineage = super::fill::Lineage {
            parent,
            gens: &gens,
        };
        let n = rows.len();
        let mut named_gone: Vec<FdKey> = Vec::new();
        for (k, v) in rows {
            let name = super::fill::file_name(fds, &self.recent, names.as_ref(), &k, &lineage);
            self.remember(k, &name);
            if gone.contains(&k.tgid) {
                named_gone.push(k);
            }
            self.keep_file(k.tgid, name, &v, max_closed_files());
        }
        let forgotten: BTreeSet<u32> = gens
            .keys()
            .map(|(tgid, _)| *tgid)
            .filter(|t| gone.contains(t))
            .collect();
        // Their values are not needed, and no program moves a gone process's generations
        // (but a new process given its pid during the pass, as for `take_final`'s dead
        // threads; the one-step take deleted those too): deleted in batches, not a syscall
        // per fd (~1,150 a second under a shell loop).
        let _ = take_final::<FdGenKey, u32>(ebpf, FD_GEN_MAP, |k| forgotten.contains(&k.tgid))?;
        forget_names(ebpf, &named_gone)?;
        self.take_block(ebpf, gone)?;
        Ok((n, forgotten))
    }

    /// Takes the block rows of the `gone` processes out of `BLOCK_IO`, up to
    /// [`MAX_BLOCK_ROWS`] kept. Their requests completed a pass ago or more (a completion
    /// after that, in flight at the exit for over a second, is lost with the row's delete).
    fn take_block(&mut self, ebpf: &mut Ebpf, gone: &BTreeSet<u32>) -> Result<()> {
        if gone.is_empty() {
            return Ok(());
        }
        let Some(map) = ebpf.map_mut(BLOCK_MAP) else {
            return Ok(());
        };
        let mut map: aya::maps::PerCpuHashMap<&mut MapData, BlkKey, BlkStat> =
            aya::maps::PerCpuHashMap::try_from(map)?;
        let keys: Vec<BlkKey> = map
            .keys()
            .filter_map(Result::ok)
            .filter(|k| gone.contains(&k.tgid))
            .collect();
        for k in keys {
            if self.block.len() >= MAX_BLOCK_ROWS && !self.block.contains_key(&k) {
                break;
            }
            let Ok(per_cpu) = map.get(&k, 0) else {
                continue;
            };
            if map.remove(&k).is_err() {
                continue;
            }
            let row = self.block.entry(k).or_default();
            for v in per_cpu.iter() {
                row.add(v);
            }
        }
        Ok(())
    }

    /// Adds a closed file's I/O under its name, under its directory's past `max` names, and
    /// not at all past a quarter more rows where its process has no row of that directory.
    fn keep_file(&mut self, tgid: u32, mut name: String, v: &FdStat, max: usize) {
        if self.files.len() >= max && !self.files.contains_key(&(tgid, name.clone())) {
            name = folded_name(&name);
            self.files_folded += 1;
            if self.files.len() >= max + max / 4 && !self.files.contains_key(&(tgid, name.clone()))
            {
                self.files_dropped += 1;
                self.files_bytes_dropped += v.bytes;
                return;
            }
        }
        self.files.entry((tgid, name)).or_default().add(v);
    }

    /// Dead threads' lives and time rows; `fold`: summed into their processes' (the per-thread
    /// rows being at their cap).
    fn add_time(
        &mut self,
        deaths: Vec<(LifeKey, LifeVal)>,
        wall: Vec<(WallKey, WallVal)>,
        fold: bool,
    ) {
        if !fold {
            self.deaths.extend(deaths);
            self.wall
                .extend(wall.into_iter().map(|(key, val)| Row { key, val }));
            return;
        }
        for (k, v) in deaths {
            let f = self.folded_lives.entry(v.tgid).or_default();
            f.threads += 1;
            f.alive_ns += v.died_ns.saturating_sub(k.born_ns);
            f.tids.insert(k.tid);
        }
        for (mut key, val) in wall {
            key.tid = FOLDED_TID;
            key.born_ns = 0;
            let e = self
                .folded_wall
                .entry(key)
                .or_insert(WallVal { ns: 0, count: 0 });
            e.ns += val.ns;
            e.count += val.count;
        }
    }

    /// Dead threads whose time rows were folded into their processes'.
    pub fn folded_time_threads(&self) -> u64 {
        self.folded_lives.values().map(|f| f.threads).sum()
    }

    /// `fold`: into the process's rows (tid `FOLDED_TID`), the per-thread ones being at their
    /// cap.
    fn add_syscalls(&mut self, rows: Vec<(SysKey, SysStat)>, fold: bool) {
        let mut folded = BTreeSet::new();
        let full = self.syscalls.len() >= max_syscall_rows();
        for (mut k, v) in rows {
            if fold {
                folded.insert((k.tgid, k.tid));
                k.tid = FOLDED_TID;
            }
            match self.syscalls.get_mut(&k) {
                Some(s) => s.add(&v),
                None if full => {
                    self.syscall_rows_dropped += 1;
                    self.syscall_calls_dropped += v.count;
                }
                None => {
                    self.syscalls.insert(k, SysRow::from(&v));
                }
            }
        }
        self.folded_threads += folded.len() as u64;
    }

    /// The errno rows of the threads whose syscall rows `add_syscalls` took with `fold`.
    fn add_errnos(&mut self, errs: Vec<(ErrnoKey, u64)>, fold: bool) {
        // Their rows go where the syscall rows went: not kept once those are not.
        let full = self.syscalls.len() >= max_syscall_rows();
        for (mut k, n) in errs {
            if fold {
                k.tid = FOLDED_TID;
            }
            match self.errnos.get_mut(&k) {
                Some(e) => *e += n,
                None if full => {}
                None => {
                    self.errnos.insert(k, n);
                }
            }
        }
    }

    /// Adds the retired rows to those read from the maps at the end (and gives them up).
    /// (A map, not a vector: after a thread storm it holds ~100,000 rows, and a copy would
    /// double that at the report's peak.)
    pub fn syscalls_with(&mut self, rows: Vec<(SysKey, SysStat)>) -> BTreeMap<SysKey, SysRow> {
        let mut all = std::mem::take(&mut self.syscalls);
        for (k, v) in rows {
            all.entry(k).or_default().add(&v);
        }
        all
    }

    pub fn errnos_with(&mut self, rows: Vec<(ErrnoKey, u64)>) -> Vec<(ErrnoKey, u64)> {
        let mut all = std::mem::take(&mut self.errnos);
        for (k, n) in rows {
            *all.entry(k).or_default() += n;
        }
        all.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(count: u64, min: u64, max: u64, bucket: usize) -> SysStat {
        let mut s = SysStat {
            count,
            timed: count,
            min_ns: min,
            max_ns: max,
            total_ns: count * min,
            ..Default::default()
        };
        s.hist[bucket] = count;
        s
    }

    fn key(tgid: u32, tid: u32, nr: i32) -> SysKey {
        SysKey {
            tgid,
            tid,
            nr,
            _pad: 0,
        }
    }

    fn wall(tgid: u32, tid: u32, born: u64, kind: u32, ns: u64) -> (WallKey, WallVal) {
        (
            WallKey {
                born_ns: born,
                tgid,
                tid,
                kind,
                sys_nr: 0,
                kstack: -1,
                ustack: -1,
                state: 0,
                fd1: 0,
                pystack: 0,
                gil: 0,
            },
            WallVal { ns, count: 1 },
        )
    }

    fn death(tgid: u32, tid: u32, born: u64, died: u64) -> (LifeKey, LifeVal) {
        (
            LifeKey {
                born_ns: born,
                tid,
                _pad: 0,
            },
            LifeVal {
                died_ns: died,
                tgid,
                _pad: 0,
                comm: [0; 16],
            },
        )
    }

    #[test]
    fn dead_threads_time_past_the_cap_folds_into_their_process() {
        let mut r = Retired::default();
        r.add_time(
            vec![death(1, 10, 100, 400)],
            vec![wall(1, 10, 100, 0, 200), wall(1, 10, 100, 5, 100)],
            false,
        );
        assert_eq!((r.deaths.len(), r.wall.len()), (1, 2));
        // Past the cap: two threads of process 1 and one of process 2, same reasons summed.
        r.add_time(
            vec![
                death(1, 11, 500, 800),
                death(1, 12, 600, 700),
                death(2, 20, 0, 50),
            ],
            vec![
                wall(1, 11, 500, 0, 250),
                wall(1, 11, 500, 5, 50),
                wall(1, 12, 600, 0, 100),
                wall(2, 20, 0, 0, 50),
            ],
            true,
        );
        assert_eq!((r.deaths.len(), r.wall.len()), (1, 2), "kept rows stay");
        assert_eq!(r.folded_time_threads(), 3);
        assert_eq!(
            r.folded_lives[&1],
            FoldedLives {
                threads: 2,
                alive_ns: 400,
                tids: [11, 12].into(),
            }
        );
        assert_eq!(r.folded_lives[&2].alive_ns, 50);
        let cpu1 = r.folded_wall[&wall(1, FOLDED_TID, 0, 0, 0).0];
        assert_eq!((cpu1.ns, cpu1.count), (350, 2));
        assert_eq!(r.folded_wall.len(), 3);
        // A process's folded rows add up to its folded lives.
        let ns1: u64 = r
            .folded_wall
            .iter()
            .filter(|(k, _)| k.tgid == 1)
            .map(|(_, v)| v.ns)
            .sum();
        assert_eq!(ns1, r.folded_lives[&1].alive_ns);
    }

    #[test]
    fn closed_files_past_the_cap_fold_then_stop_at_new_processes() {
        let mut r = Retired::default();
        let io = FdStat {
            ns: 10,
            bytes: 100,
            calls: 1,
            timed: 1,
        };
        for tgid in 0..8 {
            r.keep_file(tgid, format!("/d/{tgid}.txt"), &io, 8);
        }
        // Past 8 names: under the directory, for a process known or new.
        r.keep_file(1, "/d/more.txt".into(), &io, 8);
        r.keep_file(20, "/d/x.txt".into(), &io, 8);
        assert_eq!(r.files_folded, 2);
        assert_eq!(r.files[&(1, "/d/…".to_string())].bytes, 100);
        assert_eq!(r.files.len(), 10);
        // Past 8 + 2 rows: a new (process, directory) is not kept, a known one still adds.
        r.keep_file(21, "/e/x.txt".into(), &io, 8);
        r.keep_file(22, "/d/y.txt".into(), &io, 8);
        r.keep_file(20, "/d/z.txt".into(), &io, 8);
        r.keep_file(3, "/d/3.txt".into(), &io, 8);
        assert_eq!((r.files_dropped, r.files_bytes_dropped), (2, 200));
        assert_eq!(r.files_folded, 5);
        assert_eq!(r.files[&(20, "/d/…".to_string())].bytes, 200);
        assert_eq!(r.files[&(3, "/d/3.txt".to_string())].bytes, 200);
        assert_eq!(r.files.len(), 10);
    }

    #[test]
    fn closed_files_past_the_cap_go_under_their_directory() {
        assert_eq!(folded_name("/data/train/a.jpg"), "/data/train/…");
        assert_eq!(folded_name("/a.txt"), "/…");
        assert_eq!(folded_name("pipe:[123]"), "<other closed files>");
        assert_eq!(folded_name("<closed fd 7>"), "<other closed files>");
    }

    #[test]
    fn merged_rows_keep_counts_extremes_and_histogram() {
        let mut a = SysStat::default();
        a.add(&stat(3, 500, 900, 9));
        a.add(&stat(2, 200, 400, 8));
        a.add(&SysStat::default());
        assert_eq!((a.count, a.min_ns, a.max_ns), (5, 200, 900));
        assert_eq!(a.total_ns, 1500 + 400);
        assert_eq!((a.hist[8], a.hist[9]), (2, 3));
    }

    #[test]
    fn a_kept_row_cuts_its_histogram_and_gives_it_back_whole() {
        let mut s = stat(3, 500, 900, 9);
        s.hist[12] = 4;
        s.count += 4;
        let row = SysRow::from(&s);
        assert_eq!((row.first, row.hist.len()), (9, 4));
        assert_eq!(row.whole(), s);
        let mut grown = row.clone();
        grown.add(&stat(2, 200, 400, 2));
        let mut want = s;
        want.add(&stat(2, 200, 400, 2));
        assert_eq!((grown.first, grown.whole()), (2, want));
        let empty = SysRow::from(&SysStat::default());
        assert_eq!((empty.hist.len(), empty.whole()), (0, SysStat::default()));
        let mut from_empty = SysRow::default();
        from_empty.add(&s);
        assert_eq!(from_empty, row);
    }

    #[test]
    fn retired_and_live_rows_add_up_and_fold_past_the_cap() {
        let mut r = Retired::default();
        r.add_syscalls(vec![(key(1, 5, 39), stat(4, 100, 100, 7))], false);
        let all = r.syscalls_with(vec![(key(1, 5, 39), stat(1, 50, 50, 6))]);
        assert_eq!(all.len(), 1);
        assert_eq!(
            (all[&key(1, 5, 39)].count, all[&key(1, 5, 39)].min_ns),
            (5, 50)
        );

        // Full: a dead thread's rows go to its process's (tid 0), and are counted.
        for tid in 0..MAX_THREAD_SYSCALL_ROWS as u32 {
            r.syscalls
                .insert(key(2, 1000 + tid, 0), SysRow::from(&stat(1, 1, 1, 0)));
        }
        let fold = r.syscalls.len() >= MAX_THREAD_SYSCALL_ROWS;
        r.add_syscalls(
            vec![
                (key(3, 7, 39), stat(2, 10, 10, 4)),
                (key(3, 7, 0), stat(1, 10, 10, 4)),
            ],
            fold,
        );
        r.add_errnos(
            vec![(
                ErrnoKey {
                    tgid: 3,
                    tid: 7,
                    nr: 0,
                    errno: 9,
                },
                1,
            )],
            fold,
        );
        assert_eq!(r.folded_threads, 1);
        assert_eq!(r.syscalls[&key(3, 0, 39)].count, 2);
        assert!(!r.syscalls.contains_key(&key(3, 7, 39)));
        assert_eq!(r.errnos.keys().next().map(|k| k.tid), Some(0));

        // Full of rows altogether (a storm of short processes): a row already kept still
        // adds up; a new process's are not kept, and counted.
        for tgid in 0..MAX_SYSCALL_ROWS as u32 {
            r.syscalls
                .insert(key(100 + tgid, 0, 1), SysRow::from(&stat(1, 1, 1, 0)));
        }
        r.add_syscalls(
            vec![
                (key(3, 8, 39), stat(3, 10, 10, 4)),
                (key(999_999, 5, 2), stat(7, 10, 10, 4)),
            ],
            true,
        );
        assert_eq!(r.syscalls[&key(3, 0, 39)].count, 5);
        assert!(!r.syscalls.contains_key(&key(999_999, 0, 2)));
        assert_eq!((r.syscall_rows_dropped, r.syscall_calls_dropped), (1, 7));
    }
}
