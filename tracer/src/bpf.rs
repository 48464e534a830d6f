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
use tracer_common::proc::{MAYBE_MAP, MAYBE_SLOTS, TRACED_MAP};

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
    let mut loader = EbpfLoader::new();
    loader
        .override_global("FOLLOW_CHILDREN", &follow, true)
        .override_global("OFF_NEWTASK_PID", &newtask_pid, true)
        .override_global("OFF_NEWTASK_FLAGS", &newtask_flags, true)
        .override_global("OFF_EXIT_GROUP_DEAD", &exit_group_dead, true);
    for f in families {
        f.configure(&mut loader)
            .with_context(|| format!("configure {}", f.name()))?;
    }
    loader
        .load(OBJECT)
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
            .insert(pid, 0, 0)
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
    p.load().map_err(|e| load_error(prog, e))?;
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
    if refused_by_request(prog) {
        return Err(TraceError::BpfLoad(format!(
            "program {prog}: refused as GPUTRACE_REFUSE_PROGRAMS asks (a kernel's verifier \
             walking it past its limit)"
        ))
        .into());
    }
    p.load().map_err(|e| load_error(prog, e))?;
    let id = p.attach(name).map_err(|e| TraceError::Attach {
        what: format!("{prog} to raw tracepoint {name}"),
        reason: format!("{:#}", anyhow::Error::from(e)),
    })?;
    Ok(TpLink::Raw(id))
}

/// GPUTRACE_REFUSE_PROGRAMS=a,b: the raw tracepoint programs named fail to load, as on a
/// kernel whose verifier refuses them (`sched_switch` walks 87% of the verifier's limit
/// here), so that the fallback to the classic ones is tested.
fn refused_by_request(prog: &str) -> bool {
    std::env::var("GPUTRACE_REFUSE_PROGRAMS").is_ok_and(|v| v.split(',').any(|p| p == prog))
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
    p.load(name, btf).map_err(|e| load_error(prog, e))?;
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
    p.load().map_err(|e| load_error("cpu_sample", e))?;
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

    /// The scheduler program's walk rests on these staying BPF global functions (see
    /// tracer-ebpf/src/main.rs): a static one is walked again on every path that calls it.
    #[test]
    fn the_objects_global_functions_stay_global() {
        use object::{Object, ObjectSymbol, SymbolKind};
        let elf = object::File::parse(OBJECT).expect("parse the embedded eBPF object");
        let globals: Vec<String> = elf
            .symbols()
            .filter(|s| s.kind() == SymbolKind::Text && s.is_global())
            .filter_map(|s| s.name().ok().map(str::to_string))
            .collect();
        for f in [
            "gputrace_python_walk",
            "gputrace_flush",
            "gputrace_born",
            "gputrace_died",
            "gputrace_name_fd",
        ] {
            assert!(
                globals.iter().any(|g| g == f),
                "{f} not global in {globals:?}"
            );
        }
    }

    #[test]
    fn verifier_rejection_without_a_log() {
        let e = std::io::Error::from_raw_os_error(libc::EINVAL);
        let msg = rejection_message("task_newtask", &e, "\n");
        assert_eq!(msg.lines().count(), 1);
        assert!(msg.contains("without a verifier log"), "{msg}");
    }
}
