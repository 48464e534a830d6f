//! Addresses to function names, with blazesym.
//!
//! User addresses are turned into (file, file offset) with a snapshot of the process's maps
//! taken while it was alive, so processes that exited before the report are still symbolised.
//! Results are cached per (file, offset) and per kernel address: a flame graph has few distinct
//! frames and many samples.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use blazesym::{
    symbolize::{
        source::{Elf, Kernel, Process, Source},
        Input, Symbolized, Symbolizer as Blaze,
    },
    MaybeDefault, Pid,
};

use crate::{
    perf_map::PerfMap,
    procfs::{self, Mapping},
};

#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct Frame {
    pub name: String,
    /// File name of the object the frame is in (`[kernel]` for kernel frames).
    pub module: Option<String>,
    pub kernel: bool,
    /// Put in by the Python walk: a line of Python code, whose module is its source file.
    /// Known from where the frame came, not its file's name: a console script (`torchrun`)
    /// has no `.py`.
    pub python: bool,
}

impl Frame {
    pub fn unknown(module: Option<String>, kernel: bool) -> Frame {
        Frame {
            name: "[unknown]".into(),
            module,
            kernel,
            python: false,
        }
    }

    /// A function of an object file (or one named by the tracer, `module` `None`).
    pub fn native(name: impl Into<String>, module: Option<String>) -> Frame {
        Frame {
            name: name.into(),
            module,
            kernel: false,
            python: false,
        }
    }

    /// A kernel function; `module` is `[kernel]` when it was symbolised from an address.
    pub fn kernel(name: impl Into<String>, module: Option<String>) -> Frame {
        Frame {
            kernel: true,
            ..Frame::native(name, module)
        }
    }

    /// A Python frame: `qualname (file.py:line)` in the source file `file`.
    pub fn python(name: impl Into<String>, file: impl Into<String>) -> Frame {
        Frame {
            python: true,
            ..Frame::native(name, Some(file.into()))
        }
    }
}

/// `module` in brackets for a report's line, unless it is already a bracketed name
/// (`[kernel]`, `[vdso]`, `[anon]`).
pub fn module_label(module: &str) -> String {
    if module.starts_with('[') && module.ends_with(']') {
        module.to_string()
    } else {
        format!("[{module}]")
    }
}

/// Whether a frame named `name` in `module` is the one frame of that module's code no symbol
/// covers (`[libcrypto.so.3]`), named by nothing but its module.
pub fn names_only_its_module(name: &str, module: Option<&str>) -> bool {
    module.is_some_and(|m| module_label(m) == name)
}

/// The most frames the kernel keeps of a stack (`PERF_MAX_STACK_DEPTH`, the stack map's value
/// size, and the default `kernel.perf_event_max_stack`): a user stack that long was cut.
pub const MAX_STACK_FRAMES: usize = 127;

/// The outermost frame of a stack the kernel cut ([`MAX_STACK_FRAMES`]): its root is unknown.
pub const TRUNCATED: &str = "[truncated]";

/// The kernel's name for the vDSO's mapping in /proc/PID/maps.
pub const VDSO: &str = "[vdso]";

/// The module of a function named by a JIT's perf map.
pub const JIT: &str = "[jit]";

/// Perf maps kept parsed at once (each up to `perf_map::MAX_BYTES` of text).
const MAX_PERF_MAPS_READ: usize = 8;

/// How often a live JIT's perf map is read on for what it appended.
const PERF_MAP_REREAD: std::time::Duration = std::time::Duration::from_millis(500);

/// Identity of a mapped file: its inode and path (a path alone can be replaced on disk).
pub type FileKey = (u64, String);

pub struct Symbolizer {
    blaze: Blaze,
    kernel_src: Source<'static>,
    kernel_cache: HashMap<u64, Frame>,
    user_cache: HashMap<(FileKey, u64), Frame>,
    /// Where each file is opened from (a /proc/PID/map_files link works across mount namespaces).
    open_paths: HashMap<FileKey, PathBuf>,
    /// gputrace's own vDSO (None until first needed; Some(None) when it has none).
    own_vdso: Option<Option<Mapping>>,
    /// Code files held open while their processes ran (`tracker::HeldFiles::paths`).
    held: HashMap<FileKey, PathBuf>,
    /// JIT perf maps held open, by pid (`tracker::HeldFiles::perf_map_paths`), and those
    /// read, with when they were last read on (a live JIT appends); at most
    /// [`MAX_PERF_MAPS_READ`].
    perf_map_paths: HashMap<u32, PathBuf>,
    perf_maps: HashMap<u32, (std::time::Instant, PerfMap)>,
    pub stats: SymbolizeStats,
}

#[derive(Debug, Default, Clone, Copy)]
pub struct SymbolizeStats {
    pub lookups: u64,
    pub cache_hits: u64,
    pub unknown: u64,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    pub fn new() -> Self {
        let blaze = Blaze::builder()
            .enable_code_info(false)
            .enable_inlined_fns(false)
            .enable_demangling(true)
            .build();
        let kernel = Kernel {
            kallsyms: MaybeDefault::Default,
            vmlinux: MaybeDefault::None,
            ..Kernel::default()
        };
        Self {
            blaze,
            kernel_src: Source::from(kernel),
            kernel_cache: HashMap::new(),
            user_cache: HashMap::new(),
            open_paths: HashMap::new(),
            own_vdso: None,
            held: HashMap::new(),
            perf_map_paths: HashMap::new(),
            perf_maps: HashMap::new(),
            stats: SymbolizeStats::default(),
        }
    }

    /// The code files held open while their processes ran: an exited process's are read
    /// through them, not by a path that may now hold another file.
    pub fn use_held(&mut self, held: HashMap<FileKey, PathBuf>) {
        self.held = held;
    }

    /// The processes' JIT perf maps, held open while they ran: code in anonymous memory is
    /// named from them.
    pub fn use_perf_maps(&mut self, paths: HashMap<u32, PathBuf>) {
        self.perf_maps.retain(|pid, _| paths.contains_key(pid));
        self.perf_map_paths = paths;
    }

    /// The JIT function at `addr` of process `pid`, from its perf map: read on from where
    /// the last read ended, at most every [`PERF_MAP_REREAD`].
    fn jit_frame(&mut self, pid: u32, addr: u64) -> Option<Frame> {
        let path = self.perf_map_paths.get(&pid)?;
        let stale = self
            .perf_maps
            .get(&pid)
            .is_none_or(|(at, _)| at.elapsed() >= PERF_MAP_REREAD);
        if stale {
            if !self.perf_maps.contains_key(&pid) && self.perf_maps.len() >= MAX_PERF_MAPS_READ {
                // Parsed again if asked again: a bound on memory, not on time.
                let any = *self.perf_maps.keys().next()?;
                self.perf_maps.remove(&any);
            }
            let (at, map) = self
                .perf_maps
                .entry(pid)
                .or_insert_with(|| (std::time::Instant::now(), PerfMap::default()));
            *at = std::time::Instant::now();
            // A read that failed keeps what was read before.
            let _ = map.update(path);
        }
        let name = self.perf_maps.get(&pid)?.1.find(addr)?;
        Some(Frame::native(name, Some(JIT.into())))
    }

    /// Kernel stack (leaf first) to frames (leaf first).
    pub fn kernel(&mut self, ips: &[u64]) -> Vec<Frame> {
        let missing: Vec<u64> = ips
            .iter()
            .copied()
            .filter(|ip| !self.kernel_cache.contains_key(ip))
            .collect();
        self.stats.lookups += ips.len() as u64;
        self.stats.cache_hits += (ips.len() - missing.len()) as u64;
        if !missing.is_empty() {
            let syms = self
                .blaze
                .symbolize(&self.kernel_src, Input::AbsAddr(&missing))
                .unwrap_or_default();
            for (i, ip) in missing.iter().enumerate() {
                let frame = match syms.get(i) {
                    Some(Symbolized::Sym(s)) => {
                        Frame::kernel(s.name.to_string(), Some("[kernel]".into()))
                    }
                    _ => {
                        self.stats.unknown += 1;
                        Frame::unknown(Some("[kernel]".into()), true)
                    }
                };
                self.kernel_cache.insert(*ip, frame);
            }
        }
        ips.iter().map(|ip| self.kernel_cache[ip].clone()).collect()
    }

    /// User stack (leaf first) of process `pid` to frames (leaf first), using `maps` (sorted by
    /// start). `alive` says whether /proc/PID/map_files can still be used.
    pub fn user(&mut self, pid: u32, maps: &[Mapping], alive: bool, ips: &[u64]) -> Vec<Frame> {
        let full = ips.len();
        // A frame-pointer walk through code built without frame pointers (a distribution's
        // Python) reads on from whatever the register held: a return address in data, the
        // heap or a stack, where no call returns to, and then the same word over and over up
        // to the kernel's limit (a Python 3.11 sample: `_PyRuntime` and 125 `[unknown]`, cut
        // as if deep). Its frames from there on are not the caller's; its root is unknown.
        // Memory in no mapping read, or anonymous, is left alone: it may be code mapped (or
        // made executable, as a JIT does) since the maps were read.
        let lost = ips
            .iter()
            .skip(1)
            .position(|&ip| find_mapping(maps, ip.saturating_sub(1)).is_some_and(never_code));
        let ips = &ips[..lost.map_or(full, |i| i + 1)];
        // A return address points after the call; step back into the call so a call at the
        // very end of a function is attributed to that function.
        let lookup_ips: Vec<u64> = ips
            .iter()
            .enumerate()
            .map(|(i, &ip)| if i == 0 { ip } else { ip.saturating_sub(1) })
            .collect();
        let mut out: Vec<Option<Frame>> = vec![None; ips.len()];
        let mut per_file: HashMap<FileKey, Vec<(usize, u64)>> = HashMap::new();
        self.stats.lookups += ips.len() as u64;
        for (i, &ip) in lookup_ips.iter().enumerate() {
            match find_mapping(maps, ip) {
                Some(m) if m.is_file() => {
                    let key: FileKey = (m.inode, m.path.clone());
                    let off = ip - m.start + m.offset;
                    if let Some(f) = self.user_cache.get(&(key.clone(), off)) {
                        self.stats.cache_hits += 1;
                        out[i] = Some(f.clone());
                    } else {
                        if !self.open_paths.contains_key(&key) {
                            let p = if alive {
                                procfs::map_file_path(procfs::mm_pid(pid), m)
                            } else if let Some(h) = self.held.get(&key) {
                                h.clone()
                            } else {
                                PathBuf::from(&m.path)
                            };
                            self.open_paths.insert(key.clone(), p);
                        }
                        per_file.entry(key).or_default().push((i, off));
                    }
                }
                Some(m) if m.path == VDSO => {
                    let off = ip - m.start;
                    // Keyed by size too: another ABI's vDSO is another image.
                    let key: FileKey = (m.end - m.start, VDSO.into());
                    if let Some(f) = self.user_cache.get(&(key.clone(), off)) {
                        self.stats.cache_hits += 1;
                        out[i] = Some(f.clone());
                    } else {
                        let name = self.vdso_name(m.end - m.start, off);
                        if name.is_none() {
                            self.stats.unknown += 1;
                        }
                        let f = match name {
                            Some(n) => Frame::native(n, Some(VDSO.into())),
                            None => Frame::unknown(Some(VDSO.into()), false),
                        };
                        self.user_cache.insert((key, off), f.clone());
                        out[i] = Some(f);
                    }
                }
                // Code in anonymous memory (named with prctl's `[anon:NAME]` too) is a JIT's,
                // and so may be code outside the maps read (mapped after): its perf map, if it
                // wrote one, may name it.
                m => {
                    let module = m.map(|m| match m.path.as_str() {
                        "" => "[anon]".to_string(),
                        p => p.to_string(),
                    });
                    let jit = m.is_none_or(|m| m.path.is_empty() || m.path.starts_with("[anon:"));
                    let named = if jit { self.jit_frame(pid, ip) } else { None };
                    out[i] = Some(named.unwrap_or_else(|| Frame::unknown(module, false)));
                }
            }
        }
        for (key, items) in per_file {
            let module = Path::new(&key.1)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned());
            let offsets: Vec<u64> = items.iter().map(|(_, o)| *o).collect();
            let syms = self.resolve_file(&key, &offsets);
            // Code in a memfd (`/memfd:doublemapper`, .NET's JIT) has no symbols of its
            // own: its perf map may name it.
            let memfd = key.1.starts_with("/memfd:");
            for ((i, off), sym) in items.into_iter().zip(syms) {
                let jit = if sym.is_none() && memfd {
                    self.jit_frame(pid, lookup_ips[i])
                } else {
                    None
                };
                let frame = match (sym, jit) {
                    (Some(name), _) => Frame::native(name, module.clone()),
                    (None, Some(f)) => {
                        // Per process: another process's memfd under that name is other code.
                        out[i] = Some(f);
                        continue;
                    }
                    (None, None) => {
                        // Code no symbol covers (a stripped library's internals, libcuda's):
                        // one frame per library, as perf's flame graphs have it. One per
                        // address split a library's 88% of the samples into 182 rows of
                        // under 3%, and the top functions named something else.
                        self.stats.unknown += 1;
                        Frame::native(
                            module_label(module.as_deref().unwrap_or("?")),
                            module.clone(),
                        )
                    }
                };
                self.user_cache.insert((key.clone(), off), frame.clone());
                out[i] = Some(frame);
            }
        }
        let mut frames: Vec<Frame> = out
            .into_iter()
            .map(|f| f.unwrap_or_else(|| Frame::unknown(None, false)))
            .collect();
        if lost.is_some() {
            frames.push(Frame::unknown(None, false));
        } else if full >= MAX_STACK_FRAMES {
            // A walk that ran to the limit through addresses nothing names (the same word
            // read over and over, or memory never mapped) ends in one `[unknown]`: a hundred
            // of them said nothing more and buried the flame graph's roots.
            let named = frames.len() - frames.iter().rev().take_while(|f| is_unknown(f)).count();
            frames.truncate((named + 1).min(frames.len()));
            // The kernel kept the innermost frames only: the root is cut off.
            frames.push(Frame::native(TRUNCATED, None));
        }
        frames
    }

    /// The function at offset `off` of a process's vDSO of `len` bytes, read from gputrace's
    /// own: the kernel maps one image into every process of an ABI, and the target's is
    /// neither a file nor worth reading out of its memory. A vDSO of another size is another
    /// ABI's (a 32-bit process's) and is left unnamed.
    fn vdso_name(&mut self, len: u64, off: u64) -> Option<String> {
        let own = self
            .own_vdso
            .get_or_insert_with(|| {
                procfs::read_maps(std::process::id())?
                    .into_iter()
                    .find(|m| m.path == VDSO)
            })
            .clone()?;
        if own.end - own.start != len {
            return None;
        }
        let src = Source::from(Process::new(Pid::Slf));
        let syms = self
            .blaze
            .symbolize(&src, Input::AbsAddr(&[own.start + off]))
            .ok()?;
        match syms.into_iter().next()? {
            Symbolized::Sym(s) => Some(s.name.to_string()),
            Symbolized::Unknown(_) => None,
        }
    }

    fn resolve_file(&mut self, key: &FileKey, offsets: &[u64]) -> Vec<Option<String>> {
        let mut paths = vec![self.open_paths[key].clone()];
        if paths[0] != Path::new(&key.1) {
            paths.push(PathBuf::from(&key.1));
        }
        for path in paths {
            // By its path, only the file the process mapped: a library replaced on disk since
            // (an upgrade), or another mount namespace's file at that path (a container's),
            // named all its samples after the other file's functions.
            if path == Path::new(&key.1) && !same_inode(&path, key.0) {
                continue;
            }
            let src = Source::from(Elf::new(path));
            if let Ok(syms) = self.blaze.symbolize(&src, Input::FileOffset(offsets)) {
                return syms
                    .into_iter()
                    .map(|s| match s {
                        Symbolized::Sym(s) => Some(s.name.to_string()),
                        Symbolized::Unknown(_) => None,
                    })
                    .collect();
            }
        }
        vec![None; offsets.len()]
    }
}

/// Whether `path` is the file with inode `inode` (as /proc/PID/maps gave it).
fn same_inode(path: &Path, inode: u64) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).is_ok_and(|m| m.ino() == inode)
}

/// Whether `f` is a frame nothing named (`[unknown]`, whatever memory it was in).
pub fn is_unknown(f: &Frame) -> bool {
    f.name == "[unknown]"
}

/// Whether no call can return into mapping `m`: a file's data, the heap, a stack. A memfd is
/// left out: a JIT's (.NET's) may be made executable after the maps were read.
fn never_code(m: &Mapping) -> bool {
    let file = m.is_file() && !m.path.starts_with("/memfd:");
    !m.is_exec() && (file || m.path == "[heap]" || m.path.starts_with("[stack"))
}

/// The mapping containing `addr`; `maps` sorted by start (as /proc/PID/maps is).
pub fn find_mapping(maps: &[Mapping], addr: u64) -> Option<&Mapping> {
    let i = maps.partition_point(|m| m.start <= addr);
    let m = maps.get(i.checked_sub(1)?)?;
    (addr < m.end).then_some(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(start: u64, end: u64, path: &str) -> Mapping {
        Mapping {
            start,
            end,
            offset: 0,
            perms: "r-xp".into(),
            inode: 1,
            path: path.into(),
        }
    }

    #[test]
    fn a_stack_the_kernel_cut_gets_a_truncated_root() {
        let pid = std::process::id();
        let maps = procfs::read_maps(pid).unwrap();
        let addr = symbolizes_own_function_and_caches as *const () as u64;
        let mut s = Symbolizer::new();
        let full = s.user(pid, &maps, true, &[addr; MAX_STACK_FRAMES]);
        assert_eq!(full.len(), MAX_STACK_FRAMES + 1);
        assert_eq!(full.last().unwrap().name, TRUNCATED);
        let short = s.user(pid, &maps, true, &[addr; 3]);
        assert!(short.iter().all(|f| f.name != TRUNCATED));
        // Walked on through memory no mapping covers: the named frames, one `[unknown]`, cut.
        let mut junk = vec![addr, addr + 4];
        junk.resize(MAX_STACK_FRAMES, 8);
        let names: Vec<String> = s
            .user(pid, &maps, true, &junk)
            .into_iter()
            .map(|f| f.name)
            .collect();
        assert_eq!(names.len(), 4, "{names:?}");
        assert_eq!(names[2..], ["[unknown]", TRUNCATED]);
    }

    #[test]
    fn a_walk_that_returns_into_data_ends_there_at_an_unknown_root() {
        let pid = std::process::id();
        let mut maps = procfs::read_maps(pid).unwrap();
        // Inside the function: a caller's address is looked up one byte back.
        let code = symbolizes_own_function_and_caches as *const () as u64 + 4;
        let data = maps
            .iter()
            .find(|m| m.path == "[heap]" || m.path.starts_with("[stack"))
            .map(|m| m.start + 8)
            .unwrap();
        let mut s = Symbolizer::new();
        // Leaf, caller, then a word of the stack and the same word up to the kernel's limit.
        let mut ips = vec![code, code];
        ips.resize(MAX_STACK_FRAMES, data);
        let frames = s.user(pid, &maps, true, &ips);
        assert_eq!(frames.len(), 3, "{frames:?}");
        assert!(frames[..2]
            .iter()
            .all(|f| f.name.contains("symbolizes_own_function")));
        assert_eq!(frames[2].name, "[unknown]");
        // A leaf is where the thread was, whatever the mapping; anonymous memory may be a
        // JIT's code made executable since the maps were read.
        let frames = s.user(pid, &maps, true, &[data, code]);
        assert_eq!(frames.len(), 2, "{frames:?}");
        for m in maps.iter_mut() {
            if m.start <= data && data < m.end {
                m.path.clear();
            }
        }
        let frames = s.user(pid, &maps, true, &[code, data, code]);
        assert_eq!(frames.len(), 3, "{frames:?}");
    }

    #[test]
    fn brackets_modules_once() {
        assert_eq!(module_label("libc.so.6"), "[libc.so.6]");
        assert_eq!(module_label("[kernel]"), "[kernel]");
        assert_eq!(module_label("[vdso]"), "[vdso]");
    }

    #[test]
    fn finds_mappings() {
        let maps = vec![m(0x1000, 0x2000, "/a"), m(0x3000, 0x4000, "/b")];
        assert_eq!(find_mapping(&maps, 0x1000).unwrap().path, "/a");
        assert_eq!(find_mapping(&maps, 0x1fff).unwrap().path, "/a");
        assert!(find_mapping(&maps, 0x2000).is_none());
        assert_eq!(find_mapping(&maps, 0x3500).unwrap().path, "/b");
        assert!(find_mapping(&maps, 0x10).is_none());
        assert!(find_mapping(&maps, 0x5000).is_none());
    }

    /// The vDSO's functions are named from gputrace's own copy, at the target's offsets: a
    /// made-up process whose vDSO sits elsewhere gets the name our own address has.
    #[test]
    fn names_vdso_functions_from_our_own() {
        let own = procfs::read_maps(std::process::id())
            .unwrap()
            .into_iter()
            .find(|m| m.path == VDSO)
            .expect("this process has a vDSO");
        let len = own.end - own.start;
        let mut s = Symbolizer::new();
        // Each function's first byte, as a leaf's IP would be.
        let named: Vec<(u64, String)> = (0..len)
            .step_by(16)
            .filter_map(|off| Some((off, s.vdso_name(len, off)?)))
            .collect();
        assert!(
            named.iter().any(|(_, n)| n.contains("clock_gettime")),
            "no clock_gettime among {named:?}"
        );
        let (off, name) = named[0].clone();
        let elsewhere = 0x7f00_0000_0000u64;
        let maps = vec![Mapping {
            start: elsewhere,
            end: elsewhere + len,
            offset: 0,
            perms: "r-xp".into(),
            inode: 0,
            path: VDSO.into(),
        }];
        let f = s.user(1, &maps, false, &[elsewhere + off]);
        assert_eq!(f[0], Frame::native(name, Some(VDSO.into())));
        // Another ABI's vDSO (another size) is not ours to read.
        let other = vec![Mapping {
            end: elsewhere + len + 4096,
            ..maps[0].clone()
        }];
        let g = s.user(1, &other, false, &[elsewhere + 4096 + off]);
        assert_eq!(g[0].name, "[unknown]");
    }

    #[test]
    fn symbolizes_own_function_and_caches() {
        let pid = std::process::id();
        let maps = procfs::read_maps(pid).unwrap();
        let addr = symbolizes_own_function_and_caches as *const () as u64;
        let mut s = Symbolizer::new();
        let f = s.user(pid, &maps, true, &[addr]);
        assert!(
            f[0].name.contains("symbolizes_own_function_and_caches"),
            "got {:?}",
            f[0]
        );
        let before = s.stats.cache_hits;
        let g = s.user(pid, &maps, true, &[addr]);
        assert_eq!(f, g);
        assert_eq!(s.stats.cache_hits, before + 1);
    }
}
