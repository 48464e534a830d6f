//! CPython frames in CPU stacks (issue 7). User space detects CPython in each traced process,
//! keeps the kernel's tid -> `PyThreadState` map current, reads the Python stacks the sampler
//! recorded while the process is alive (code objects can be freed once it exits) and splices
//! them into the native stacks at symbolisation time.

pub mod code;
pub mod detect;
pub mod linetable;
pub mod memory;
pub mod merge;
pub mod offsets;

use std::{
    cell::RefCell,
    collections::{BTreeMap, HashMap, HashSet},
    path::Path,
    rc::Rc,
};

use anyhow::{Context, Result};
use aya::{
    maps::{HashMap as BpfHashMap, MapData, PerCpuArray},
    Ebpf,
};
use tracer_common::{
    python::{
        PySeed, PyStack, PyStat, PY_ENABLED_GLOBAL, PY_FRAME_ENTRY, PY_NOT_MAP, PY_PROCS_MAP,
        PY_SEED_MAP, PY_STACKS_MAP, PY_STACK_PENDING, PY_STATS_MAP, PY_TSTATE_MAP,
    },
    wall::PHASE_ONCPU,
};

use self::{
    code::CodeInfo,
    detect::Interpreter,
    memory::{Memory, ProcessMemory},
    merge::{Merge, PyFrameSym},
    offsets::{ThreadTid, VersionOffsets},
};
use crate::{
    probes::{AttachCtx, FinishCtx, ProbeFamily},
    procfs,
    report::ReportData,
    symbolize::Frame,
    tracker::Tracker,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum PythonMode {
    /// Python frames for every CPython process found among the targets.
    #[default]
    Auto,
    /// As auto, and the report warns when no traced process runs CPython.
    On,
    /// Native frames only.
    Off,
}

enum ProcState {
    /// Not CPython as of the maps with this many entries, checked this many times, in the
    /// image of this exec (`Tracker`'s `exec_id`): re-checked every tick while young (the
    /// dynamic loader maps libpython after exec), then only when the tracker's maps change or
    /// the process execs (a shell that execs python may leave as many maps as it had).
    NotPython(usize, u32, Option<u32>),
    Unsupported,
    Python {
        interp: Interpreter,
        off: &'static VersionOffsets,
        tids: HashSet<u32>,
        /// Whether `PY_PROCS` has the GIL's address yet (the interpreter creates it at init).
        gil_known: bool,
    },
}

/// Keys of the stacks user space walks itself (`PY_SEED`); the kernel's are hashes, which
/// these will not meet in practice.
const SEED_KEYS: u64 = 0x5eed_0000_0000_0000;

/// A stack whose code objects cannot be read this many times (process gone) stays native-only.
const MAX_ATTEMPTS: u32 = 3;

/// Ticks (100 ms each) during which a process not yet found to be CPython is re-checked.
const YOUNG_CHECKS: u32 = 30;

/// The checks a process found not CPython by `maps` counts after `checks` before: young
/// ones are re-checked each tick, and until the verdict is final (`mark_not_python`) each of
/// its blocking waits costs the kernel three hash lookups for a Python stack that may come
/// (a data loader's waits ~100 ns more each). Final at once where the loader has mapped the
/// program's libraries ([`detect::libraries_loaded`]): a libpython mapped later (a
/// `dlopen`) changes the maps, which brings a check again.
fn not_python_checks(checks: u32, maps: &[procfs::Mapping]) -> u32 {
    if detect::libraries_loaded(maps) {
        YOUNG_CHECKS.max(checks + 1)
    } else {
        checks + 1
    }
}

#[derive(Debug, Default, Clone, Copy)]
pub struct MergeStats {
    pub exact: u64,
    pub approximate: u64,
    pub no_eval_frame: u64,
    /// Samples with a Python stack whose code objects could not all be read (process gone,
    /// object freed): native frames only.
    pub unresolved: u64,
}

#[derive(Default)]
pub struct PyState {
    mode: PythonMode,
    procs: HashMap<u32, ProcState>,
    /// Symbolised stacks by their `PY_STACKS` key, with their process.
    stacks: HashMap<u64, (u32, Vec<PyFrameSym>)>,
    /// Keys of the stacks the kernel cut at `PY_MAX_FRAMES` (their root frames are missing).
    cut: HashSet<u64>,
    /// Stacks that could not be symbolised yet, and how often that was tried.
    attempts: HashMap<u64, u32>,
    /// Code objects read, by (pid, address), with what they were: an address freed and taken
    /// by another code object (exec'd strings, lambdas, generated code) is read again.
    codes: HashMap<(u32, u64), (CodeInfo, code::CodeIdentity)>,
    /// (pid, `PyThreadState *`) -> native thread id, as last seen: names GIL holders. A thread
    /// state freed and reused by a later thread names the later one.
    tstates: HashMap<(u32, u64), u32>,
    /// Stacks walked by user space for threads already waiting when first found.
    seeded: u64,
    /// Processes in `PY_NOT`.
    not_python: HashSet<u32>,
    pub notes: Vec<String>,
    pub merge: MergeStats,
}

/// Shared between the probe family (attach/tick/finish) and the session's symbolisation.
#[derive(Clone, Default)]
pub struct Python(pub Rc<RefCell<PyState>>);

impl Python {
    pub fn new(mode: PythonMode) -> Self {
        Python(Rc::new(RefCell::new(PyState {
            mode,
            ..PyState::default()
        })))
    }

    pub fn family(&self) -> Box<dyn ProbeFamily> {
        let enabled = u32::from(self.0.borrow().mode != PythonMode::Off);
        Box::new(PythonFamily(self.clone(), enabled))
    }

    /// Reads the stacks recorded since the last tick (call once more before symbolising).
    pub fn sync(&self, ebpf: &mut Ebpf) -> Result<()> {
        self.0.borrow_mut().sync_stacks(ebpf)
    }

    /// Splices the Python stack `key` of process `pid` into `native` (root first).
    pub fn merge(&self, pid: u32, key: u64, native: Vec<Frame>) -> Vec<Frame> {
        let mut st = self.0.borrow_mut();
        if key == 0 || key == PY_STACK_PENDING {
            return native;
        }
        let Some(py) = st.resolve(pid, key).map(<[PyFrameSym]>::to_vec) else {
            st.merge.unresolved += 1;
            return native;
        };
        let (mut out, how) = merge::merge(&native, &py);
        match how {
            Merge::Exact => st.merge.exact += 1,
            Merge::Approximate => st.merge.approximate += 1,
            Merge::NoEvalFrame => st.merge.no_eval_frame += 1,
        }
        // Its outermost Python frames are missing: the stack's root is not its root. Native
        // roots nothing names above them go (as `merge` drops them above Python frames): under
        // `[truncated]`, an `[unknown]` reads as a walk into garbage (`CpuProfile::cut_stacks`).
        let truncated = crate::symbolize::TRUNCATED;
        if st.cut.contains(&key) && out.first().is_none_or(|f| f.name != truncated) {
            out.drain(..merge::lost_roots(&out));
            out.insert(0, Frame::native(truncated, None));
        }
        out
    }
}

impl Python {
    /// The innermost Python frame of stack `key` (the line that made the call or waits).
    pub fn innermost(&self, pid: u32, key: u64) -> Option<String> {
        if key == 0 || key == PY_STACK_PENDING {
            return None;
        }
        let st = self.0.borrow();
        st.resolve(pid, key)?.last().map(|f| f.frame.name.clone())
    }

    /// The native thread id whose `PyThreadState` was at `tstate` in process `pid`.
    pub fn thread_of(&self, pid: u32, tstate: u64) -> Option<u32> {
        self.0.borrow().tstates.get(&(pid, tstate)).copied()
    }
}

impl PyState {
    fn refresh(&mut self, ebpf: &mut Ebpf, tracker: &Tracker) -> Result<()> {
        let mut procs: BpfHashMap<&mut MapData, u32, tracer_common::python::PyOffsets> =
            BpfHashMap::try_from(ebpf.map_mut(PY_PROCS_MAP).context("map PY_PROCS missing")?)?;
        // From the processes known here, a few: under process churn the tracker remembers
        // tens of thousands of exited ones, and a lookup for each at every tick was 4% of
        // gputrace's CPU. One it no longer remembers exited too.
        let gone: Vec<u32> = self
            .procs
            .keys()
            .copied()
            .filter(|pid| tracker.procs.get(pid).is_none_or(|t| t.info.exited))
            .collect();
        let mut stale_tids: Vec<u32> = Vec::new();
        for (pid, t) in tracker.running() {
            // After an exec the old interpreter's addresses mean nothing: detect again.
            // `PyCode_Type` always has file data; `_PyRuntime` may be in anonymous memory.
            if let Some(ProcState::Python { interp, .. }) = self.procs.get(&pid) {
                let still = crate::symbolize::find_mapping(&t.maps, interp.code_type)
                    .is_some_and(|m| m.path == interp.module);
                if !still {
                    let _ = procs.remove(&pid);
                    if let Some(ProcState::Python { tids, .. }) = self.procs.remove(&pid) {
                        stale_tids.extend(tids);
                    }
                    // Code objects of the old image; samples taken before the exec whose
                    // objects were not read yet stay native-only.
                    self.codes.retain(|(p, _), _| *p != pid);
                }
            }
            let checks = match self.procs.get(&pid) {
                None => 0,
                // Another image: young again.
                Some(ProcState::NotPython(_, _, image)) if *image != t.exec_id => 0,
                Some(ProcState::NotPython(n, c, _)) if *n != t.maps.len() || *c < YOUNG_CHECKS => {
                    *c
                }
                Some(_) => continue,
            };
            let fresh;
            let maps = if checks > 0 && checks < YOUNG_CHECKS {
                fresh = procfs::read_maps(pid).unwrap_or_default();
                &fresh
            } else {
                &t.maps
            };
            let mem = ProcessMemory(pid);
            let det = detect::detect(pid, maps, &mem);
            let state = match det {
                Ok(None) => {
                    ProcState::NotPython(t.maps.len(), not_python_checks(checks, maps), t.exec_id)
                }
                Err(e) => {
                    self.notes.push(format!("python: pid {pid}: {e}"));
                    ProcState::Unsupported
                }
                Ok(Some(mut interp)) => {
                    let (a, b, _) = interp.version;
                    let v = interp.version_string();
                    let off = offsets::for_version(a, b);
                    let checked = off.map(|o| verify_at_runtime(pid, maps, &mem, &mut interp, o));
                    let off = match checked {
                        Some(Err(Unverified::NotYet(_))) if checks + 1 < YOUNG_CHECKS => {
                            self.procs.insert(
                                pid,
                                ProcState::NotPython(t.maps.len(), checks + 1, t.exec_id),
                            );
                            continue;
                        }
                        Some(Err(Unverified::NotYet(e) | Unverified::Refused(e))) => {
                            self.notes.push(format!(
                                "python: pid {pid} runs CPython {v} ({}): {e}: native frames only",
                                interp.module
                            ));
                            self.procs.insert(pid, ProcState::Unsupported);
                            continue;
                        }
                        _ => off,
                    };
                    match off {
                        None => {
                            self.notes.push(format!(
                                "python: pid {pid} runs CPython {v} ({}), a version without \
                                 verified offsets: native frames only",
                                interp.module
                            ));
                            ProcState::Unsupported
                        }
                        Some(off) => {
                            procs
                                .insert(pid, off.bpf, 0)
                                .with_context(|| format!("add pid {pid} to PY_PROCS"))?;
                            self.notes.push(format!(
                                "python: pid {pid} runs CPython {v} ({}); offsets verified",
                                interp.module
                            ));
                            ProcState::Python {
                                interp,
                                off,
                                tids: HashSet::new(),
                                gil_known: false,
                            }
                        }
                    }
                }
            };
            self.procs.insert(pid, state);
        }
        for (pid, state) in self.procs.iter_mut() {
            let ProcState::Python {
                interp,
                off,
                gil_known,
                ..
            } = state
            else {
                continue;
            };
            if *gil_known || gone.contains(pid) {
                continue;
            }
            if let Ok(Some(gil)) = code::gil_address(&ProcessMemory(*pid), interp, off) {
                let mut o = off.bpf;
                o.gil = gil;
                procs
                    .insert(*pid, o, 0)
                    .with_context(|| format!("set the GIL of pid {pid} in PY_PROCS"))?;
                *gil_known = true;
            }
        }
        for pid in &gone {
            let _ = procs.remove(pid);
        }
        let mut tstates: BpfHashMap<&mut MapData, u32, u64> = BpfHashMap::try_from(
            ebpf.map_mut(PY_TSTATE_MAP)
                .context("map PY_TSTATE missing")?,
        )?;
        let mut fresh: Vec<(u32, u32, u64)> = Vec::new();
        for (pid, state) in self.procs.iter_mut() {
            let ProcState::Python {
                interp, off, tids, ..
            } = state
            else {
                continue;
            };
            let now: Vec<(u32, u64)> = if gone.contains(pid) {
                Vec::new()
            } else {
                // A read that races with thread creation/exit fails; the next tick retries.
                match code::thread_states(&ProcessMemory(*pid), interp, off) {
                    Ok(v) => v,
                    Err(_) => continue,
                }
            };
            let live: HashSet<u32> = now.iter().map(|(t, _)| *t).collect();
            for (tid, ts) in now {
                self.tstates.insert((*pid, ts), tid);
                if tstates.get(&tid, 0).ok() != Some(ts) {
                    let _ = tstates.insert(tid, ts, 0);
                }
                if tids.insert(tid) {
                    fresh.push((*pid, tid, ts));
                }
            }
            for tid in tids.iter().filter(|t| !live.contains(t)) {
                let _ = tstates.remove(tid);
            }
            tids.retain(|t| live.contains(t));
        }
        for pid in gone {
            self.procs.remove(&pid);
            self.not_python.remove(&pid);
        }
        self.mark_not_python(ebpf)?;
        self.seed_blocked(ebpf, &fresh)
    }

    /// Tells the kernel which processes are classified as not Python (their waits need no
    /// pending Python stack); the kernel itself forgets a process when it execs.
    fn mark_not_python(&mut self, ebpf: &mut Ebpf) -> Result<()> {
        let mut map: BpfHashMap<&mut MapData, u32, u8> =
            BpfHashMap::try_from(ebpf.map_mut(PY_NOT_MAP).context("map PY_NOT missing")?)?;
        for (&pid, state) in &self.procs {
            // Final verdicts only: a young process is checked again each tick (the loader maps
            // libpython, or libc for 3.10's thread ids, after exec), and its waits stay
            // pending until then.
            let not = match state {
                ProcState::Python { .. } => false,
                ProcState::NotPython(_, checks, _) => *checks >= YOUNG_CHECKS,
                ProcState::Unsupported => true,
            };
            // Re-inserted each tick while unsupported: an exec may have removed it, and the
            // process is then re-classified by its maps.
            if not && map.get(&pid, 0).is_err() {
                // Full: the process's waits stay pending (a lookup more each), nothing is lost.
                let _ = map.insert(pid, 1, 0);
                self.not_python.insert(pid);
            } else if !not && self.not_python.remove(&pid) {
                let _ = map.remove(&pid);
            }
        }
        let stale: Vec<u32> = self
            .not_python
            .iter()
            .copied()
            .filter(|p| !self.procs.contains_key(p))
            .collect();
        for pid in stale {
            let _ = map.remove(&pid);
            self.not_python.remove(&pid);
        }
        Ok(())
    }

    /// Threads just found that are off CPU in a wait that began before their thread state was
    /// known: their frames cannot have changed since, so walk them here and leave the stack in
    /// `PY_SEED` for the kernel to charge the wait to when it ends.
    fn seed_blocked(&mut self, ebpf: &mut Ebpf, fresh: &[(u32, u32, u64)]) -> Result<()> {
        if fresh.is_empty() {
            return Ok(());
        }
        let threads = crate::accounting::States::open(ebpf)?;
        let mut seeds: Vec<(u32, PySeed)> = Vec::new();
        for &(pid, tid, tstate) in fresh {
            let Some(st) = threads.get(ebpf, tid) else {
                continue;
            };
            if st.phase == PHASE_ONCPU || st.off_pystack != PY_STACK_PENDING {
                continue;
            }
            let Some(ProcState::Python { off, .. }) = self.procs.get(&pid) else {
                continue;
            };
            // The thread may wake and run meanwhile: then the walk reads a changed chain (or
            // fails), but the seed no longer matches the wait it was for and is not used.
            let Ok(stack) = code::walk_stack(&ProcessMemory(pid), &off.bpf, pid, tstate) else {
                continue;
            };
            if stack.len == 0 {
                continue;
            }
            let Some(frames) = self.symbolise(&stack) else {
                continue;
            };
            self.seeded += 1;
            let key = SEED_KEYS | self.seeded;
            self.stacks.insert(key, (pid, frames));
            seeds.push((
                tid,
                PySeed {
                    off_ns: st.off_ns,
                    key,
                },
            ));
        }
        let mut map: BpfHashMap<&mut MapData, u32, PySeed> =
            BpfHashMap::try_from(ebpf.map_mut(PY_SEED_MAP).context("map PY_SEED missing")?)?;
        for (tid, seed) in seeds {
            // Full: that wait keeps no Python stack.
            let _ = map.insert(tid, seed, 0);
        }
        Ok(())
    }

    /// Reads the stacks recorded since the last call and symbolises them now, while the
    /// process is alive and before an exec can replace its code objects. Symbolised stacks are
    /// deleted from the kernel map (the samples keep their keys), so a long trace with many
    /// distinct (frame, instruction) stacks does not fill it.
    fn sync_stacks(&mut self, ebpf: &mut Ebpf) -> Result<()> {
        let Some(map) = ebpf.map_mut(PY_STACKS_MAP) else {
            return Ok(());
        };
        let mut map: BpfHashMap<&mut MapData, u64, PyStack> = BpfHashMap::try_from(map)?;
        let keys: Vec<u64> = map.keys().filter_map(Result::ok).collect();
        for k in keys {
            if !self.stacks.contains_key(&k) {
                if self.attempts.get(&k).copied().unwrap_or(0) >= MAX_ATTEMPTS {
                    // Its samples stay native-only; free the slot.
                    let _ = map.remove(&k);
                    continue;
                }
                let Ok(st) = map.get(&k, 0) else { continue };
                match self.symbolise(&st) {
                    Some(frames) => {
                        self.attempts.remove(&k);
                        self.stacks.insert(k, (st.pid, frames));
                        if st.status & tracer_common::python::PY_STACK_TRUNCATED != 0 {
                            self.cut.insert(k);
                        }
                    }
                    None => {
                        *self.attempts.entry(k).or_default() += 1;
                        continue;
                    }
                }
            }
            let _ = map.remove(&k);
        }
        Ok(())
    }

    /// Root-first Python frames of a recorded stack; `None` when any code object is unreadable.
    fn symbolise(&mut self, st: &PyStack) -> Option<Vec<PyFrameSym>> {
        let ProcState::Python { interp, off, .. } = self.procs.get(&st.pid)? else {
            return None;
        };
        let len = (st.len as usize).min(st.frames.len());
        let mut out = Vec::with_capacity(len);
        let mem = ProcessMemory(st.pid);
        for f in st.frames[..len].iter().rev() {
            let key = (st.pid, f.code);
            let id = code::code_identity(&mem, off, f.code).ok()?;
            if self.codes.get(&key).is_none_or(|(_, known)| *known != id) {
                let info = code::read_code(&mem, interp, off, f.code).ok()?;
                self.codes.insert(key, (info, id));
            }
            let (info, _) = &self.codes[&key];
            out.push(PyFrameSym {
                frame: py_frame(info, off.instr_addr(f.instr_off)),
                entry: f.flags & PY_FRAME_ENTRY != 0,
            });
        }
        Some(out)
    }

    /// Python frames of stack `key`, root first, when it was symbolised.
    fn resolve(&self, pid: u32, key: u64) -> Option<&[PyFrameSym]> {
        let (p, frames) = self.stacks.get(&key)?;
        (*p == pid).then_some(frames.as_slice())
    }

    fn python_seen(&self) -> bool {
        self.procs
            .values()
            .any(|p| matches!(p, ProcState::Python { .. } | ProcState::Unsupported))
            || !self.notes.is_empty()
    }
}

/// Why a process of a version with offsets cannot be walked.
enum Unverified {
    /// Something the process may not have mapped yet: a process started by the command is
    /// detected as soon as the interpreter's module is mapped, and the loader maps the C library
    /// after it. Checked again while the process is young.
    NotYet(String),
    Refused(String),
}

/// What the built-in table needs from the process itself. 3.10's thread states name their
/// thread by `pthread_t`: the C library says where the tid is. 3.13+ carries its own offsets
/// (`_Py_DebugOffsets`): the built-in table must agree with them.
fn verify_at_runtime(
    pid: u32,
    maps: &[procfs::Mapping],
    mem: &ProcessMemory,
    interp: &mut Interpreter,
    off: &VersionOffsets,
) -> Result<(), Unverified> {
    if let ThreadTid::Pthread(_) = off.tstate_tid {
        match detect::pthread_tid_offset(pid, maps, mem, &interp.module) {
            Ok(Some(o)) => interp.pthread_tid = Some(o),
            Ok(None) => {
                return Err(Unverified::NotYet(
                    "no _thread_db_pthread_tid in the C library (not glibc?)".into(),
                ))
            }
            Err(e) => return Err(Unverified::Refused(e)),
        }
    }
    if (interp.version.0, interp.version.1) < (3, 13) {
        return Ok(());
    }
    let mut buf = vec![0u8; offsets::DEBUG_OFFSETS_WORDS * 8];
    mem.read(interp.runtime, &mut buf)
        .map_err(|e| Unverified::Refused(format!("reading _Py_DebugOffsets: {e}")))?;
    let words: Vec<u64> = buf
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    offsets::check_debug_offsets(&words, off).map_err(Unverified::Refused)
}

/// `qualname (file.py:line)` for the instruction at byte `addr` of the bytecode (`None`: the
/// frame has not run its first instruction); the line is left out when the table gives none.
pub fn py_frame(info: &CodeInfo, addr: Option<u32>) -> Frame {
    let file = Path::new(&info.filename)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| info.filename.clone());
    let line = match addr {
        None => Some(info.first_line),
        Some(a) => info.format.line_for(&info.linetable, info.first_line, a),
    };
    let name = match line {
        Some(l) => format!("{} ({file}:{l})", info.qualname),
        None => format!("{} ({file})", info.qualname),
    };
    Frame::python(name, info.filename.clone())
}

/// The shared state, and `PY_ENABLED` for the loader.
struct PythonFamily(Python, u32);

impl ProbeFamily for PythonFamily {
    fn name(&self) -> &'static str {
        "python"
    }

    fn configure<'a>(&'a self, loader: &mut aya::EbpfLoader<'a>) -> Result<()> {
        loader.override_global(PY_ENABLED_GLOBAL, &self.1, true);
        Ok(())
    }

    fn attach(&mut self, _ebpf: &mut Ebpf, _ctx: &AttachCtx<'_>) -> Result<()> {
        // The walk runs inside the CPU sampler; the first tick fills the maps.
        Ok(())
    }

    fn tick(&mut self, ebpf: &mut Ebpf, tracker: &Tracker) -> Result<()> {
        let mut st = self.0 .0.borrow_mut();
        if st.mode == PythonMode::Off {
            return Ok(());
        }
        st.refresh(ebpf, tracker)?;
        st.sync_stacks(ebpf)
    }

    fn finish(
        &mut self,
        ebpf: &mut Ebpf,
        _ctx: &mut FinishCtx<'_>,
        data: &mut ReportData,
    ) -> Result<()> {
        let st = self.0 .0.borrow();
        if st.mode == PythonMode::Off {
            return Ok(());
        }
        let mut lines = st.notes.clone();
        let stats = walk_stats(ebpf)?;
        // A truncated walk is a walk too (counted in Walked as well).
        let cut = stats.get("Truncated").copied().unwrap_or(0);
        let total: u64 = stats.values().sum::<u64>() - cut;
        if total > 0 {
            let m = st.merge;
            let mut others = stats
                .iter()
                .filter(|(k, v)| **v > 0 && !["Walked", "Truncated"].contains(&k.as_str()))
                .map(|(k, v)| format!("{k} {v}; "))
                .collect::<String>();
            if cut > 0 {
                others.push_str(&format!(
                    "{cut} of them cut at {} frames, rooted at `{}`; ",
                    tracer_common::python::PY_MAX_FRAMES,
                    crate::symbolize::TRUNCATED
                ));
            }
            lines.push(format!(
                "python: {} of {total} Python stack walks succeeded ({others}the kernel walks at \
                 CPU samples, blocking switch-outs and CUDA calls); of the distinct native \
                 stacks they joined, merged exactly {}, approximately {}, without an eval \
                 frame {}, with unresolved code objects {}",
                stats.get("Walked").copied().unwrap_or(0),
                m.exact,
                m.approximate,
                m.no_eval_frame,
                m.unresolved,
            ));
        }
        if st.mode == PythonMode::On && !st.python_seen() {
            lines.push("python: --python on, but no traced process runs CPython".into());
        }
        data.report.warnings.extend(lines);
        Ok(())
    }
}

fn walk_stats(ebpf: &Ebpf) -> Result<BTreeMap<String, u64>> {
    let map: PerCpuArray<&MapData, u64> =
        PerCpuArray::try_from(ebpf.map(PY_STATS_MAP).context("map PY_STATS missing")?)?;
    let mut out = BTreeMap::new();
    for s in PyStat::ALL {
        let v = map.get(&(s as u32), 0).context("read PY_STATS")?;
        out.insert(format!("{s:?}"), v.iter().sum());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::python::{
        linetable::LineTable,
        offsets::{PY310, PY311},
    };

    #[test]
    fn a_native_process_is_final_at_once_when_its_libraries_are_mapped() {
        let m = |path: &str| procfs::Mapping {
            start: 0x1000,
            end: 0x2000,
            offset: 0,
            perms: "r-xp".into(),
            inode: 7,
            path: path.into(),
        };
        let exec = [m("/usr/bin/app"), m("/lib64/ld-linux-x86-64.so.2")];
        let loaded = [
            m("/usr/bin/app"),
            m("/lib64/ld-linux-x86-64.so.2"),
            m("/lib/libc.so.6"),
        ];
        // Read before the loader's work: young, checked again next tick.
        assert_eq!(not_python_checks(0, &exec), 1);
        assert_eq!(not_python_checks(5, &exec), 6);
        // After it: final (marked in PY_NOT at this tick), and stays so when checked again
        // on a change of its maps.
        assert!(not_python_checks(0, &loaded) >= YOUNG_CHECKS);
        assert!(not_python_checks(YOUNG_CHECKS, &loaded) > YOUNG_CHECKS);
    }

    #[test]
    fn frame_names_with_lines() {
        let info = CodeInfo {
            qualname: "Worker.run".into(),
            filename: "/srv/app/worker.py".into(),
            first_line: 1,
            linetable: include_bytes!("testdata/linetable_311.bin").to_vec(),
            format: LineTable::Locations,
        };
        // Offset 30 bytes into the bytecode is on line 4 of the fixture (see linetable tests).
        let name = |instr_off| py_frame(&info, PY311.instr_addr(instr_off)).name;
        assert_eq!(name(184 + 30), "Worker.run (worker.py:4)");
        // Before the first instruction: the def line.
        assert_eq!(name(182), "Worker.run (worker.py:1)");
        // Beyond the table: no line rather than a wrong one.
        assert_eq!(name(184 + 10_000), "Worker.run (worker.py)");
        // A console script's source has no suffix; its frames are Python all the same.
        let script = CodeInfo {
            filename: "/usr/local/bin/torchrun".into(),
            ..info
        };
        let f = py_frame(&script, PY311.instr_addr(184 + 30));
        assert_eq!(f.name, "Worker.run (torchrun:4)");
        assert!(crate::aggregate::cpu::is_python(&f));
    }

    /// 3.10 frames as the kernel records them (2 * f_lasti), with the 3.10 fixture, whose bytes
    /// 16..34 are line 4 and 34..40 line 5.
    #[test]
    fn frame_names_with_lines_310() {
        let info = CodeInfo {
            qualname: "run".into(),
            filename: "/srv/app/worker.py".into(),
            first_line: 1,
            linetable: include_bytes!("testdata/linetable_310.bin").to_vec(),
            format: LineTable::Pep626,
        };
        let name = |lasti: i32| py_frame(&info, PY310.instr_addr((lasti * 2) as u32)).name;
        assert_eq!(name(8), "run (worker.py:4)");
        assert_eq!(name(17), "run (worker.py:5)");
        assert_eq!(name(-1), "run (worker.py:1)");
        assert_eq!(name(20), "run (worker.py)");
    }
}
