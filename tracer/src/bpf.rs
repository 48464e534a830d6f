//! Loading the embedded eBPF object and attaching its programs.
//!
//! Every attachment is an fd-based link owned by this process: when gputrace exits, however it
//! exits (even SIGKILL), the kernel closes the fds and nothing of ours stays attached.

use anyhow::{Context, Result};
use aya::{
    maps::HashMap,
    programs::{
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
        PerfEvent, ProgramError, RawTracePoint, TracePoint,
    },
    Ebpf, EbpfLoader,
};
use aya_obj::generated::{bpf_attr, bpf_cmd};
use tracer_common::{
    cpu::{YOUNG_STACKS_ENTRIES, YOUNG_STACKS_MAPS},
    proc::{MAYBE_MAP, MAYBE_SLOTS, TRACED_MAP},
};

use crate::{error::TraceError, tracefs::Format};

/// The eBPF object built by build.rs.
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/gputrace.bpf.o"));

pub struct LoadOptions {
    pub follow_children: bool,
}

/// Loads the object (maps are created, programs are not loaded yet).
pub fn load(opts: &LoadOptions, families: &[Box<dyn crate::probes::ProbeFamily>]) -> Result<Ebpf> {
    let newtask = Format::read("task", "task_newtask")?;
    let exit = Format::read("sched", "sched_process_exit")?;
    let follow: u32 = opts.follow_children.into();
    let newtask_pid = newtask.offset("pid")?;
    let newtask_flags = newtask.offset("clone_flags")?;
    let exit_group_dead = exit.offset("group_dead")?;
    // A kernel without it (none since 3.x) leaves a thread's move at its exec unfollowed.
    let exec_old_pid = Format::read("sched", "sched_process_exec")
        .and_then(|f| f.offset("old_pid"))
        .unwrap_or(0);
    let mut loader = EbpfLoader::new();
    loader
        .override_global("FOLLOW_CHILDREN", &follow, true)
        .override_global("OFF_NEWTASK_PID", &newtask_pid, true)
        .override_global("OFF_NEWTASK_FLAGS", &newtask_flags, true)
        .override_global("OFF_EXIT_GROUP_DEAD", &exit_group_dead, true)
        .override_global("OFF_EXEC_OLD_PID", &exec_old_pid, true);
    // Lowered (never raised) by a test that fills the young processes' stack maps in seconds.
    let young = crate::young::capacity();
    if young < YOUNG_STACKS_ENTRIES {
        for map in YOUNG_STACKS_MAPS {
            loader.map_max_entries(map, young);
        }
    }
    for f in families {
        f.configure(&mut loader)
            .with_context(|| format!("configure {}", f.name()))?;
    }
    let alloc = crate::prealloc::mode();
    crate::prealloc::configure(&mut loader, alloc);
    let object = crate::prealloc::object(OBJECT, alloc).context("set the maps' allocation")?;
    loader
        .load(object.bytes())
        .map_err(|e| TraceError::BpfLoad(format!("{:#}", anyhow::Error::from(e))).into())
}

/// Marks ids (tids, tgids) as possibly traced (`tracer_common::proc::MAYBE_MAP`): before they
/// go into `TRACED` or `THREADS`, whose lookups the hot programs skip for unmarked ids.
pub fn mark_maybe(ebpf: &mut Ebpf, ids: impl IntoIterator<Item = u32>) -> Result<()> {
    let mut maybe: aya::maps::Array<_, u8> =
        aya::maps::Array::try_from(ebpf.map_mut(MAYBE_MAP).context("map MAYBE_IDS missing")?)?;
    for id in ids {
        maybe
            .set(id % MAYBE_SLOTS, 1, 0)
            .with_context(|| format!("mark id {id} as traced"))?;
    }
    Ok(())
}

/// Adds processes to the in-kernel traced set.
pub fn trace_pids(ebpf: &mut Ebpf, pids: &[u32]) -> Result<()> {
    mark_maybe(ebpf, pids.iter().copied())?;
    let mut traced: HashMap<_, u32, u32> =
        HashMap::try_from(ebpf.map_mut(TRACED_MAP).context("map TRACED missing")?)?;
    for &pid in pids {
        traced
            .insert(pid, tracer_common::proc::TRACED_AT_ATTACH, 0)
            .with_context(|| format!("add pid {pid} to the traced set"))?;
    }
    Ok(())
}

/// Loads and attaches a tracepoint program.
pub fn attach_tracepoint(ebpf: &mut Ebpf, prog: &str, category: &str, name: &str) -> Result<()> {
    let p: &mut TracePoint = ebpf
        .program_mut(prog)
        .with_context(|| format!("program {prog} missing from the object"))?
        .try_into()?;
    let loaded = p.fd().is_ok();
    load_once(prog, loaded, || p.load())?;
    p.attach(category, name).map_err(|e| TraceError::Attach {
        what: format!("{prog} to tracepoint {category}/{name}"),
        reason: format!("{:#}", anyhow::Error::from(e)),
    })?;
    Ok(())
}

/// A raw or BTF tracepoint program's link, for programs taken off and put back during a trace
/// (the syscall programs under the overhead budget).
#[derive(Debug)]
pub enum TpLink {
    Raw(aya::programs::raw_trace_point::RawTracePointLinkId),
    Btf(aya::programs::tp_btf::BtfTracePointLinkId),
}

/// Loads and attaches a raw tracepoint program.
pub fn attach_raw_tracepoint(ebpf: &mut Ebpf, prog: &str, name: &str) -> Result<TpLink> {
    let p: &mut RawTracePoint = ebpf
        .program_mut(prog)
        .with_context(|| format!("program {prog} missing from the object"))?
        .try_into()?;
    let loaded = p.fd().is_ok();
    load_once(prog, loaded, || p.load())?;
    let id = p.attach(name).map_err(|e| TraceError::Attach {
        what: format!("{prog} to raw tracepoint {name}"),
        reason: format!("{:#}", anyhow::Error::from(e)),
    })?;
    Ok(TpLink::Raw(id))
}

/// GPUTRACE_REFUSE_PROGRAMS=a,b: the programs named fail to load, as on a kernel whose
/// verifier refuses them (`sched_switch` walked 87% of the verifier's limit here before its
/// rare paths became global functions), so that the fallbacks are tested: from BTF to raw,
/// and from raw to classic. Refused as they are loaded ahead ([`preload`]), as a kernel would
/// refuse them there, else at their own load ([`load_once`]).
fn refused_by_request(prog: &str) -> bool {
    std::env::var("GPUTRACE_REFUSE_PROGRAMS").is_ok_and(|v| v.split(',').any(|p| p == prog))
}

fn refusal_by_request(prog: &str) -> String {
    format!(
        "program {prog}: refused as GPUTRACE_REFUSE_PROGRAMS asks (a kernel's verifier \
         walking it past its limit)"
    )
}

/// The same, where the loads ahead refused it: said so, for the tests.
fn refusal_ahead_by_request(prog: &str) -> String {
    format!("{}, as it was loaded ahead", refusal_by_request(prog))
}

/// Attaches again a raw or BTF tracepoint program that was loaded and attached before.
pub fn reattach_tracepoint(ebpf: &mut Ebpf, prog: &str, name: &str) -> Result<TpLink> {
    let link = match ebpf.program_mut(prog) {
        Some(aya::programs::Program::RawTracePoint(p)) => p.attach(name).map(TpLink::Raw),
        Some(aya::programs::Program::BtfTracePoint(p)) => p.attach().map(TpLink::Btf),
        _ => anyhow::bail!("program {prog} is not a raw or BTF tracepoint program"),
    };
    link.with_context(|| format!("attach {prog} to {name} again"))
}

/// Takes a link made by [`attach_raw_tracepoint`], [`attach_btf_tracepoint`] or
/// [`reattach_tracepoint`] off; the program stays loaded.
pub fn detach_tracepoint(ebpf: &mut Ebpf, prog: &str, link: TpLink) -> Result<()> {
    let done = match (ebpf.program_mut(prog), link) {
        (Some(aya::programs::Program::RawTracePoint(p)), TpLink::Raw(id)) => p.detach(id),
        (Some(aya::programs::Program::BtfTracePoint(p)), TpLink::Btf(id)) => p.detach(id),
        _ => anyhow::bail!("program {prog} does not hold that link"),
    };
    done.with_context(|| format!("detach {prog}"))
}

/// Loads and attaches a BTF-typed raw tracepoint program (`tp_btf`): its pointer arguments
/// are typed, so it reads their fields with plain loads instead of `bpf_probe_read_kernel`.
pub fn attach_btf_tracepoint(
    ebpf: &mut Ebpf,
    btf: &aya::Btf,
    prog: &str,
    name: &str,
) -> Result<TpLink> {
    let p: &mut aya::programs::BtfTracePoint = ebpf
        .program_mut(prog)
        .with_context(|| format!("program {prog} missing from the object"))?
        .try_into()?;
    let loaded = p.fd().is_ok();
    load_once(prog, loaded, || p.load(name, btf))?;
    let id = p.attach().map_err(|e| TraceError::Attach {
        what: format!("{prog} to BTF tracepoint {name}"),
        reason: format!("{:#}", anyhow::Error::from(e)),
    })?;
    Ok(TpLink::Btf(id))
}

/// Loads the CPU sampler and attaches it to the cpu-clock event of every online CPU.
pub fn attach_cpu_sampler(ebpf: &mut Ebpf, frequency_hz: u64) -> Result<usize> {
    let p: &mut PerfEvent = ebpf
        .program_mut("cpu_sample")
        .context("program cpu_sample missing from the object")?
        .try_into()?;
    let loaded = p.fd().is_ok();
    load_once("cpu_sample", loaded, || p.load())?;
    let cpus = aya::util::online_cpus().map_err(|(what, e)| anyhow::anyhow!("{what}: {e}"))?;
    for &cpu in &cpus {
        p.attach(
            PerfEventConfig::Software(SoftwareEvent::CpuClock),
            PerfEventScope::AllProcessesOneCpu { cpu },
            // A fixed period of CPU time, not the kernel's adaptive frequency mode, which over-samples
            // CPUs that wake from idle.
            SamplePolicy::Period(1_000_000_000 / frequency_hz),
            false,
        )
        .map_err(|e| TraceError::Attach {
            what: format!("the CPU sampler (cpu-clock) on CPU {cpu}"),
            reason: format!("{:#}", anyhow::Error::from(e)),
        })?;
    }
    Ok(cpus.len())
}

/// A program to load ahead of its attach ([`preload`]): on a BTF tracepoint, the tracepoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preload {
    pub prog: &'static str,
    pub btf_tracepoint: Option<&'static str>,
}

impl Preload {
    pub const fn plain(prog: &'static str) -> Preload {
        Preload {
            prog,
            btf_tracepoint: None,
        }
    }

    pub const fn btf(prog: &'static str, tracepoint: &'static str) -> Preload {
        Preload {
            prog,
            btf_tracepoint: Some(tracepoint),
        }
    }
}

/// Programs the kernel refused as they were loaded ahead ([`preload`]), with why: their
/// attach says so rather than run the verifier again (twice: aya retries a refused load
/// with the verifier's log), on just the kernels that then take a fallback.
static REFUSED_AHEAD: std::sync::Mutex<Vec<(String, String)>> = std::sync::Mutex::new(Vec::new());

fn refused_ahead(prog: &str) -> Option<String> {
    let refused = REFUSED_AHEAD.lock().ok()?;
    refused
        .iter()
        .find(|(p, _)| p == prog)
        .map(|(_, why)| why.clone())
}

/// Loads a program its caller found `loaded` or not, unless it was refused ahead (or its
/// refusal is asked for: [`refused_by_request`]).
fn load_once(
    prog: &str,
    loaded: bool,
    load: impl FnOnce() -> std::result::Result<(), ProgramError>,
) -> Result<()> {
    if loaded {
        return Ok(());
    }
    if let Some(why) = refused_ahead(prog) {
        return Err(TraceError::BpfLoad(why).into());
    }
    if refused_by_request(prog) {
        return Err(TraceError::BpfLoad(refusal_by_request(prog)).into());
    }
    if let Ok(mut l) = LOADED_AT_ATTACH.lock() {
        l.push(prog.to_string());
    }
    load().map_err(|e| load_error(prog, e))
}

/// Programs verified at their own attach, not ahead: each costs the start its whole verifier
/// run on one CPU (the scheduler's switch ~170 ms here). The loads-ahead list is written
/// beside each family's attach, not derived from it, so this is how a divergence shows
/// (`-v`, and an e2e test).
static LOADED_AT_ATTACH: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// The programs loaded at their attach so far ([`LOADED_AT_ATTACH`]).
pub fn loaded_at_attach() -> Vec<String> {
    LOADED_AT_ATTACH
        .lock()
        .map(|l| l.clone())
        .unwrap_or_default()
}

/// Loads `wanted` (heaviest first) on as many threads as there are CPUs (at most four), before
/// their families attach them: the verifier is most of the time to attach (the scheduler
/// switch alone ~170 ms here, ~0.5 s in all of ~0.77 s), and it verifies one program per
/// thread. The attach helpers skip a loaded program, and report a refused one as its own load
/// would have (then its family takes its fallback, as before). `btf`: the kernel's, for the
/// BTF tracepoint programs (without it they are left to their family).
pub fn preload(ebpf: &mut Ebpf, btf: Option<&aya::Btf>, wanted: &[Preload]) {
    use aya::programs::Program;
    let mut progs: std::collections::HashMap<&str, &mut Program> = ebpf.programs_mut().collect();
    let jobs: Vec<(&str, &mut Program, Option<&str>)> = wanted
        .iter()
        .filter_map(|w| Some((w.prog, progs.remove(w.prog)?, w.btf_tracepoint)))
        .collect();
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 4);
    let queue = std::sync::Mutex::new(jobs.into_iter());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let Some((prog, p, tp)) = queue.lock().ok().and_then(|mut q| q.next()) else {
                    return;
                };
                if refused_by_request(prog) {
                    if let Ok(mut r) = REFUSED_AHEAD.lock() {
                        r.push((prog.to_string(), refusal_ahead_by_request(prog)));
                    }
                    continue;
                }
                let res = match (p, tp, btf) {
                    (Program::BtfTracePoint(p), Some(tp), Some(btf)) if p.fd().is_err() => {
                        p.load(tp, btf)
                    }
                    (Program::RawTracePoint(p), None, _) if p.fd().is_err() => p.load(),
                    (Program::TracePoint(p), None, _) if p.fd().is_err() => p.load(),
                    (Program::PerfEvent(p), None, _) if p.fd().is_err() => p.load(),
                    _ => continue,
                };
                if let Err(e) = res {
                    let why = format!("{:#}", load_error(prog, e));
                    if let Ok(mut r) = REFUSED_AHEAD.lock() {
                        r.push((prog.to_string(), why));
                    }
                }
            });
        }
    });
}

/// Lines of the verifier log shown when a program is rejected: the reason is at the end.
pub const VERIFIER_TAIL_LINES: usize = 12;

/// A program the verifier rejected becomes a [`TraceError::BpfLoad`] with the log's last lines.
pub fn load_error(prog: &str, e: ProgramError) -> anyhow::Error {
    match e {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => TraceError::BpfLoad(rejection_message(
            prog,
            &io_error,
            &verifier_log.to_string(),
        ))
        .into(),
        other => TraceError::BpfLoad(format!("program {prog}: {other}")).into(),
    }
}

/// `the kernel rejected program P (errno); verifier's last lines:` and the log's last non-blank
/// lines, indented, or a note that the kernel gave no log.
pub fn rejection_message(prog: &str, io_error: &std::io::Error, log: &str) -> String {
    let lines: Vec<&str> = log
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty())
        .collect();
    if lines.is_empty() {
        return format!("the kernel rejected program {prog} ({io_error}) without a verifier log");
    }
    let tail = &lines[lines.len().saturating_sub(VERIFIER_TAIL_LINES)..];
    let mut msg =
        format!("the kernel rejected program {prog} ({io_error}); verifier's last lines:");
    for l in tail {
        msg.push_str("\n    ");
        msg.push_str(l);
    }
    msg
}

/// The bpf(2) syscall with a whole `bpf_attr` (the kernel reads the fields its command uses
/// and wants the rest zero).
pub fn sys_bpf(cmd: bpf_cmd, attr: &mut bpf_attr) -> std::io::Result<i64> {
    // SAFETY: attr is a live, initialised bpf_attr; whatever it points at outlives the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            attr as *mut bpf_attr,
            std::mem::size_of::<bpf_attr>(),
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// `membarrier(2)`'s `MEMBARRIER_CMD_GLOBAL`: not in the libc crate's constants.
const MEMBARRIER_CMD_GLOBAL: libc::c_int = 1;

/// Waits for an RCU grace period (`membarrier(MEMBARRIER_CMD_GLOBAL)`, `synchronize_rcu`): every
/// program run that began before the call has ended, as the programs run inside RCU read-side
/// sections. False where the kernel refuses it (no membarrier, a seccomp filter, `nohz_full`
/// CPUs), having waited for nothing.
pub fn grace_period() -> bool {
    // SAFETY: a syscall with no pointers.
    unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verifier_rejection_shows_the_last_lines() {
        let mut log = String::from("func#0 @0\n");
        for i in 0..40 {
            log.push_str(&format!("{i}: (b7) r0 = {i}\n"));
        }
        log.push_str("R1 invalid mem access 'scalar'\n");
        log.push_str("processed 41 insns (limit 1000000)\n\n");
        let e = std::io::Error::from_raw_os_error(libc::EACCES);
        let msg = rejection_message("cpu_sample", &e, &log);
        let lines: Vec<&str> = msg.lines().collect();
        assert!(lines[0].starts_with("the kernel rejected program cpu_sample (Permission denied"));
        assert_eq!(lines.len(), 1 + VERIFIER_TAIL_LINES);
        assert_eq!(
            lines.last().unwrap().trim(),
            "processed 41 insns (limit 1000000)"
        );
        assert!(lines.contains(&"    R1 invalid mem access 'scalar'"));
        assert!(!msg.contains("func#0"), "only the tail: {msg}");
    }

    /// The embedded object's functions and programs as the kernel's verifier sees their
    /// stacks: each one's frame (the deepest slot below r10 it touches) and the functions it
    /// calls (`call` or a callback's address, through relocations).
    struct Frames {
        /// `section:name` -> its frame.
        funcs: std::collections::BTreeMap<String, Func>,
    }

    struct Func {
        /// Bytes of stack below r10.
        frame: u32,
        callees: Vec<String>,
    }

    impl Frames {
        fn parse() -> Frames {
            use object::{Object, ObjectSection, ObjectSymbol, RelocationTarget, SymbolKind};
            let elf = object::File::parse(OBJECT).expect("parse the embedded eBPF object");
            let mut funcs = std::collections::BTreeMap::new();
            // Which function of `.text` holds a byte offset.
            let text = elf.section_by_name(".text").expect(".text").index();
            let text_funcs: Vec<_> = elf
                .symbols()
                .filter(|s| s.section_index() == Some(text))
                .filter(|s| s.kind() == SymbolKind::Text && s.size() > 0)
                .map(|s| (s.address()..s.address() + s.size(), s.name().unwrap_or("?")))
                .collect();
            let text_fn = |off: u64| -> String {
                let (_, name) = text_funcs
                    .iter()
                    .find(|(r, _)| r.contains(&off))
                    .unwrap_or_else(|| panic!("no function at .text+{off}"));
                name.to_string()
            };
            for sec in elf
                .sections()
                .filter(|s| s.kind() == object::SectionKind::Text)
            {
                let code = sec.data().expect("section data");
                let syms: Vec<_> = elf
                    .symbols()
                    .filter(|s| s.section_index() == Some(sec.index()))
                    .filter(|s| s.kind() == SymbolKind::Text && s.size() > 0)
                    .collect();
                let relocs: Vec<(u64, object::Relocation)> = sec.relocations().collect();
                for f in &syms {
                    let (lo, hi) = (f.address(), f.address() + f.size());
                    let insn = |at: u64| &code[at as usize..at as usize + 8];
                    let mut frame = 0u32;
                    let mut fp_off: [Option<i64>; 11] = [None; 11];
                    let mut at = lo;
                    while at < hi {
                        let b = insn(at);
                        let (op, dst, src) = (b[0], (b[1] & 0xf) as usize, (b[1] >> 4) as usize);
                        let off = i16::from_le_bytes([b[2], b[3]]) as i64;
                        let imm = i32::from_le_bytes([b[4], b[5], b[6], b[7]]) as i64;
                        let mut deep = |d: i64| frame = frame.max((-d).max(0) as u32);
                        match op & 7 {
                            // LDX from the stack, or through a pointer into it.
                            1 if src == 10 => deep(off),
                            1 if src < 11 && fp_off[src].is_some() => {
                                deep(fp_off[src].unwrap() + off)
                            }
                            2 | 3 if dst == 10 => deep(off),
                            2 | 3 if fp_off[dst].is_some() => deep(fp_off[dst].unwrap() + off),
                            _ => {}
                        }
                        if op == 0xbf && src == 10 {
                            fp_off[dst] = Some(0);
                        } else if op == 0x07 && dst < 11 && fp_off[dst].is_some() {
                            let o = fp_off[dst].unwrap() + imm;
                            fp_off[dst] = Some(o);
                            deep(o);
                        } else if op == 0x85 {
                            fp_off[..6].fill(None);
                        } else if matches!(op & 7, 0 | 1 | 4 | 7) && dst < 11 {
                            fp_off[dst] = None;
                        }
                        at += if op == 0x18 { 16 } else { 8 };
                    }
                    let mut callees = Vec::new();
                    for (roff, r) in relocs.iter().filter(|(o, _)| (lo..hi).contains(o)) {
                        let RelocationTarget::Symbol(i) = r.target() else {
                            continue;
                        };
                        let target = elf.symbol_by_index(i).expect("relocation symbol");
                        let b = insn(*roff);
                        let imm = i32::from_le_bytes([b[4], b[5], b[6], b[7]]) as i64;
                        let in_text = target.section_index() == Some(text);
                        let callee = match (b[0], target.kind()) {
                            (0x85, SymbolKind::Text) => target.name().expect("name").to_string(),
                            // A static function's call: `.text` plus (imm + 1) instructions.
                            (0x85, SymbolKind::Section) if in_text => {
                                text_fn(target.address() + (imm as u64 + 1) * 8)
                            }
                            // A callback's address (`bpf_loop`): `.text` plus its offset.
                            (0x18, SymbolKind::Section) if in_text => {
                                text_fn(target.address() + imm as u64)
                            }
                            (0x85, kind) => panic!(
                                "a call at {}+{roff} to {:?} ({kind:?}) this test cannot follow",
                                sec.name().unwrap_or("?"),
                                target.name()
                            ),
                            _ => continue,
                        };
                        callees.push(callee);
                    }
                    callees.sort();
                    callees.dedup();
                    let name = f.name().expect("function name").to_string();
                    let section = sec.name().expect("section name");
                    funcs.insert(format!("{section}:{name}"), Func { frame, callees });
                }
            }
            Frames { funcs }
        }

        fn key_of(&self, name: &str) -> Option<&String> {
            self.funcs.keys().find(|k| k.ends_with(&format!(":{name}")))
        }

        /// The deepest stack a call chain from `key` reaches, counted as a kernel before 6.13
        /// counts it (frames rounded up to 32 bytes and summed along the chain), and the chain.
        fn chain(&self, key: &str, depth: usize) -> (u32, Vec<String>) {
            let Func { frame, callees } = &self.funcs[key];
            let own = frame.max(&1).div_ceil(32) * 32;
            assert!(depth < 8, "calls nested past 8 at {key}");
            let deepest = callees
                .iter()
                .map(|c| {
                    let k = self.key_of(c).unwrap_or_else(|| panic!("{c} not found"));
                    self.chain(k, depth + 1)
                })
                .max_by_key(|(d, _)| *d)
                .unwrap_or_default();
            let mut names = vec![format!("{key} ({own})")];
            names.extend(deepest.1);
            (own + deepest.0, names)
        }
    }

    /// The scheduler program's walk rests on these staying BPF global functions that its
    /// programs call (see tracer-ebpf/src/main.rs): inlined again, or made static, each would
    /// be walked again on every path that reaches it.
    #[test]
    fn the_objects_global_functions_stay_global_and_called() {
        use object::{Object, ObjectSymbol, SymbolKind};
        let elf = object::File::parse(OBJECT).expect("parse the embedded eBPF object");
        let globals: Vec<String> = elf
            .symbols()
            .filter(|s| s.kind() == SymbolKind::Text && s.is_global())
            .filter_map(|s| s.name().ok().map(str::to_string))
            .collect();
        let frames = Frames::parse();
        let called_by = |f: &str, section: &str| {
            frames
                .funcs
                .iter()
                .any(|(k, func)| k.starts_with(section) && func.callees.iter().any(|c| c == f))
        };
        for (f, caller) in [
            ("gputrace_python_walk", "tp_btf/sched_switch"),
            ("gputrace_flush", "tp_btf/sched_switch"),
            ("gputrace_born", "tp_btf/sched_switch"),
            ("gputrace_died", "tp_btf/sched_switch"),
            ("gputrace_name_fd", "raw_tp/sys_exit"),
        ] {
            assert!(
                globals.iter().any(|g| g == f),
                "{f} not global in {globals:?}"
            );
            assert!(called_by(f, caller), "{caller} does not call {f}");
        }
    }

    /// A kernel before 6.13 sums the frames along each call chain of a program and refuses it
    /// past 512 bytes (`combined stack size ... Too large`); 6.13 gave these program types a
    /// stack per function, so a kernel that loads them here proves nothing for the older ones.
    #[test]
    fn every_call_chain_fits_the_older_kernels_stack() {
        let frames = Frames::parse();
        let mut programs = 0;
        for key in frames.funcs.keys().filter(|k| !k.starts_with(".text:")) {
            programs += 1;
            let (depth, chain) = frames.chain(key, 0);
            assert!(
                depth <= 512,
                "{depth} bytes of stack: {}",
                chain.join(" -> ")
            );
        }
        assert!(programs > 20, "only {programs} programs found");
    }

    #[test]
    fn verifier_rejection_without_a_log() {
        let e = std::io::Error::from_raw_os_error(libc::EINVAL);
        let msg = rejection_message("task_newtask", &e, "\n");
        assert_eq!(msg.lines().count(), 1);
        assert!(msg.contains("without a verifier log"), "{msg}");
    }
}
