//! One trace from start to report: check, launch or find the targets, load and attach, pump
//! events until the target exits / the duration ends / Ctrl-C, then read, symbolise, report.

use std::{
    collections::{BTreeMap, HashMap},
    io::Write,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result};
use aya::{
    maps::{MapData, RingBuf},
    Ebpf,
};
use tokio::{io::unix::AsyncFd, signal::unix::SignalKind};
use tracer_common::{
    drops::Drop,
    proc::{ExecEvent, MappedCodeEvent, ProcEvent, ProcEventKind, PROC_EVENTS_MAP},
};

use crate::{
    aggregate::cpu::CpuProfile,
    bpf,
    cli::TraceArgs,
    collect, cpu_samples,
    error::TraceError,
    probes::{self, AttachCtx, FinishCtx, ProbeFamily},
    procfs,
    report::{
        self,
        build::{BuildInput, ProcessInfo},
        model::{DropCount, Sampling, Target, Window},
        ReportData,
    },
    target::{self, Launched},
    tracker::Tracker,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    TargetExited,
    Duration,
    Interrupted,
}

impl EndReason {
    pub fn as_str(self) -> &'static str {
        match self {
            EndReason::TargetExited => "target-exited",
            EndReason::Duration => "duration",
            EndReason::Interrupted => "interrupted",
        }
    }
}

pub fn run(args: &TraceArgs) -> Result<()> {
    let started = Instant::now();
    if !procfs::is_privileged() {
        return Err(TraceError::NotPrivileged.into());
    }
    let mut started_at: HashMap<u32, u64> = HashMap::new();
    for &pid in &args.pids {
        if let Some(st) = procfs::stat(pid) {
            started_at.insert(pid, st.starttime);
        }
        if pid == std::process::id() {
            return Err(TraceError::SelfTarget(pid).into());
        }
        if !procfs::is_alive(pid) {
            return Err(TraceError::NoSuchProcess(pid).into());
        }
        // A thread's id would be traced as a process (its name, and its exit as the end of
        // the trace); a kernel thread has no syscalls, and its seed read as blocked in `read`.
        match procfs::not_a_process(pid) {
            Some(procfs::NotAProcess::Thread { tgid }) => {
                return Err(TraceError::ThreadId { pid, tgid }.into())
            }
            Some(procfs::NotAProcess::KernelThread) => {
                return Err(TraceError::KernelThread(pid).into())
            }
            None => {}
        }
    }
    let output = args
        .output
        .as_deref()
        .map(report::prepare_output_dir)
        .transpose()?;
    let follow = !args.no_children;

    // Launched before loading so its pid can be put in the traced set; it waits for us to exec.
    let launched: Option<Launched> = if args.command.is_empty() {
        None
    } else {
        Some(target::spawn_paused(&args.command)?)
    };
    // After the launch: the command keeps the limits it was given.
    raise_open_files_limit();
    let roots: Vec<u32> = match &launched {
        Some(l) => vec![l.pid],
        None => args.pids.clone(),
    };
    let released = std::cell::Cell::new(false);
    let result = trace(
        args,
        output.as_ref(),
        &Roots {
            pids: &roots,
            started: &started_at,
        },
        launched,
        &released,
        follow,
        started,
    );
    if result.is_err() && !args.command.is_empty() {
        if released.get() {
            // Released, it is the user's job: an error after that (a full disk, a closed
            // stdout) loses the report, not the job, which runs on untraced as it would at
            // the trace's end. It may also have exited and been reaped, its pid another's.
            if procfs::is_alive(roots[0]) && target::try_reap(roots[0]).is_none() {
                crate::note!("gputrace: pid {} (the command) runs on, untraced", roots[0]);
            }
        } else {
            // A launched command must not be left waiting for a release that never comes.
            for &pid in &roots {
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                target::try_reap(pid);
            }
        }
    }
    result
}

/// The trace's root processes, and when each `--pid` target started (`/proc/PID/stat`'s
/// start time, read as it was checked): a pid whose process exits while gputrace attaches
/// may be taken by another before the probes are on.
struct Roots<'a> {
    pids: &'a [u32],
    started: &'a HashMap<u32, u64>,
}

impl Roots<'_> {
    /// Whether `pid` is still the process that was checked at the start (a launched command,
    /// not checked so, always is while alive).
    fn same(&self, pid: u32) -> bool {
        procfs::is_alive(pid)
            && self
                .started
                .get(&pid)
                .is_none_or(|&t| procfs::stat(pid).is_some_and(|s| s.starttime == t))
    }
}

fn trace(
    args: &TraceArgs,
    output: Option<&report::OutputDir>,
    root_set: &Roots<'_>,
    launched: Option<Launched>,
    released: &std::cell::Cell<bool>,
    follow: bool,
    started: Instant,
) -> Result<()> {
    let roots = root_set.pids;
    let mut families = probes::families(args);
    let python = crate::python::Python::new(args.python);
    families.push(python.family());
    let mut ebpf = bpf::load(
        &bpf::LoadOptions {
            follow_children: follow,
        },
        &families,
    )?;
    // Before any family takes a map out of `ebpf`: the uprobe_multi programs are relocated
    // against all of them.
    let mut btf = None;
    let uprobes = crate::uprobes::Uprobes::load_beside(
        &mut ebpf,
        bpf::OBJECT,
        &[
            tracer_common::cuda::ENTRY_PROG,
            tracer_common::cuda::RET_PROG,
            tracer_common::overhead::CALIB_ENTRY_PROG,
            tracer_common::overhead::CALIB_RET_PROG,
        ],
        |ebpf| btf = preload(ebpf, &families, args.verbose),
    )?;
    if args.verbose {
        crate::note!("gputrace: {}", uprobes.describe());
    }
    let mut tracker = Tracker::new(roots);
    // A target gone while the programs loaded, its pid perhaps another's by now: that other
    // process is not traced (nor its children), and the target reads as gone before the
    // window (below).
    let (live, replaced): (Vec<u32>, Vec<u32>) = if launched.is_none() {
        roots.iter().partition(|&&p| root_set.same(p))
    } else {
        (roots.to_vec(), Vec::new())
    };
    let mut initial: Vec<u32> = live.clone();
    if follow && launched.is_none() {
        initial.extend(procfs::descendants(&live));
    }
    for &pid in &initial {
        tracker.add(pid, None);
    }
    for &pid in &replaced {
        tracker.mark_exited(pid);
    }
    bpf::trace_pids(&mut ebpf, &initial)?;
    bpf::attach_tracepoint(&mut ebpf, "task_newtask", "task", "task_newtask")?;
    bpf::attach_tracepoint(
        &mut ebpf,
        "sched_process_exec",
        "sched",
        "sched_process_exec",
    )?;
    bpf::attach_tracepoint(
        &mut ebpf,
        "sched_process_exit",
        "sched",
        "sched_process_exit",
    )?;
    let cpus = bpf::attach_cpu_sampler(&mut ebpf, args.frequency)?;
    let attach_ctx = AttachCtx {
        args,
        pids: &initial,
        launched: launched.as_ref().map(|l| l.pid),
        uprobes: &uprobes,
        btf: btf.as_ref(),
    };
    for f in families.iter_mut() {
        f.attach(&mut ebpf, &attach_ctx)
            .with_context(|| format!("attach the {} probes", f.name()))?;
    }
    // The kernel's BTF served the attach only: parsed, it is ~13 MB that would be held
    // through the trace and the report (a quarter of the data demo's heap at its peak).
    drop(btf);
    // The window opens here: the accounting seeds the threads there are as of this instant,
    // and a `--pid` trace's threads were alive for the window, not for it and the seeding.
    let window_start_ktime = probes::ktime_now();
    let usage_opened = crate::overhead::own::Usage::now();
    let start_unix_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    for f in families.iter_mut() {
        f.attached(&mut ebpf, window_start_ktime)
            .with_context(|| format!("start the {} probes' window", f.name()))?;
    }
    let attach_ms = started.elapsed().as_secs_f64() * 1e3;
    // A target that exited while gputrace attached left nothing in the window: its report
    // would be an empty "traced for 0.00s" with no word why.
    let gone_before: Vec<u32> = if launched.is_none() {
        roots
            .iter()
            .copied()
            .filter(|&p| replaced.contains(&p) || !root_set.same(p))
            .collect()
    } else {
        Vec::new()
    };
    for &pid in &gone_before {
        // Its pid may be another process's now: that one's exit must not be waited for.
        tracker.mark_exited(pid);
    }
    if args.verbose {
        crate::note!(
            "gputrace: attached in {attach_ms:.1} ms to {} process(es) on {cpus} CPUs",
            initial.len()
        );
        let late = bpf::loaded_at_attach();
        if !late.is_empty() {
            crate::note!(
                "gputrace: {} programs verified at their attach, not ahead: {}",
                late.len(),
                late.join(", ")
            );
        }
    }
    if let Some(l) = launched {
        for f in families.iter_mut() {
            f.before_release(&mut ebpf, l.pid)
                .with_context(|| format!("prepare the {} probes for the command", f.name()))?;
        }
        l.release(&args.command[0])?;
        released.set(true);
        // The exec replaced the names we read before it.
        tracker.add(roots[0], None);
    }
    // After the release: a command that cannot be executed gets its one-line error alone.
    if !args.verbose && !args.json {
        // Nothing else is printed until the trace ends: say that it runs and how it ends.
        crate::note!(
            "gputrace: tracing {} process(es){}",
            initial.len(),
            match (args.duration, args.command.is_empty()) {
                (Some(d), _) => format!(" for {}s (Ctrl-C to stop sooner)", d.as_secs_f64()),
                (None, true) => " until they exit (Ctrl-C to stop)".into(),
                (None, false) => " until the command exits (Ctrl-C to stop)".into(),
            }
        );
    }
    tracker.refresh_maps(true);

    let ring: RingBuf<MapData> = RingBuf::try_from(
        ebpf.take_map(PROC_EVENTS_MAP)
            .context("map PROC_EVENTS missing")?,
    )?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the event loop")?;
    let launched_pid = (!args.command.is_empty()).then(|| roots[0]);
    let mut passes = Passes {
        exited: cpu_samples::Exited::new(python.clone()),
        young: crate::young::Young::new(),
    };
    let (end, exit_code) = rt.block_on(pump(
        ring,
        &mut tracker,
        &mut ebpf,
        &mut families,
        &mut passes,
        args.duration,
        launched_pid,
    ))?;
    let Passes { exited, young } = passes;
    let window_end_ktime = probes::ktime_now();
    let usage_ended = crate::overhead::own::Usage::now();
    let duration_ns = window_end_ktime.saturating_sub(window_start_ktime);
    // The one that ends the window first, then the others in their order.
    let mut ending: Vec<usize> = (0..families.len()).collect();
    ending.sort_by_key(|&i| !families[i].ends_the_window());
    for i in ending {
        let f = &mut families[i];
        f.window_ended(&mut ebpf, &tracker)
            .with_context(|| format!("stop the {} probes", f.name()))?;
    }
    // After the stops, not between the end's clock and the accounting's: a read of every fd's
    // fdinfo.
    let kernel_maps_bytes = crate::overhead::own::kernel_maps_bytes();
    // The event loop no longer listens: a second Ctrl-C during the report aborts at once
    // (every link is an fd, so nothing stays attached). A window that ended otherwise has had
    // no first one: the first (a supervisor's SIGTERM, `timeout`'s) lets the report finish.
    if end == EndReason::Interrupted {
        abort_on_signal();
    } else {
        spare_the_report_one_signal();
    }
    tracker.refresh_maps(true);
    if !args.json {
        match end {
            EndReason::TargetExited => crate::note!("gputrace: target exited; writing the report"),
            EndReason::Interrupted => {
                crate::note!("gputrace: interrupted; writing what was collected")
            }
            EndReason::Duration => {}
        }
    }

    if let Some(ms) = std::env::var("GPUTRACE_TEST_REPORT_DELAY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        // Tests only: a report slow enough to be interrupted while it is written.
        std::thread::sleep(Duration::from_millis(ms));
    }
    let stop = Instant::now();
    let mut samples = collect::cpu_counts(&ebpf)?;
    let drops = collect::drops(&ebpf)?;
    let skips = collect::kernel_skips(&ebpf);
    let cpu_samples::Finished {
        samples: exited_samples,
        unread,
        sym: mut symbolizer,
        failed: exited_failed,
        folded: exited_folded,
    } = exited.finish();
    samples.extend(unread);
    symbolizer.use_held(tracker.held.paths());
    symbolizer.use_perf_maps(tracker.held.perf_map_paths());
    python.sync(&mut ebpf)?;
    let cpu = cpu_samples::symbolize(&ebpf, &tracker, &samples, &mut symbolizer, &python)?;
    let cpu = CpuProfile::from_samples(cpu.samples.into_iter().chain(exited_samples));

    let mut infos: BTreeMap<u32, ProcessInfo> = tracker.infos();
    // A launched command that exited before /proc gave its command line after the exec has
    // the one gputrace ran (before the exec it was gputrace's own).
    if let Some(info) = launched_pid.and_then(|pid| infos.get_mut(&pid)) {
        if info.cmdline.is_empty() {
            info.cmdline = args.command.clone();
        }
    }
    let report = report::build::build(BuildInput {
        target: Target {
            command: (!args.command.is_empty()).then(|| args.command.clone()),
            pids: roots.to_vec(),
            follow_children: follow,
            exit_code,
        },
        window: Window {
            start_unix_ns,
            duration_ns,
            ended_by: end.as_str().into(),
            attach_ms,
        },
        sampling: Sampling {
            frequency_hz: args.frequency,
            cpus,
            samples: cpu.total(),
            in_probes: cpu.in_probes(),
        },
        processes: &infos,
        cpu: &cpu,
        // Filled in once the families finished (below).
        drops: Vec::new(),
        blind_spots: vec![],
        warnings: gone_before
            .iter()
            .map(|pid| {
                let taken = procfs::stat(*pid)
                    .filter(|s| procfs::is_alive(*pid) && !s.comm.is_empty())
                    .map(|s| {
                        format!(
                            "; pid {pid} is now another process's ({}), not traced as the target",
                            s.comm
                        )
                    })
                    .unwrap_or_default();
                format!(
                    "pid {pid} exited while gputrace attached ({attach_ms:.0} ms), before the \
                     trace's window opened: nothing of it was traced{taken}"
                )
            })
            .chain(truncated_stacks(&cpu))
            .chain(exited_folded)
            .chain(young.failed.as_ref().map(|e| {
                format!(
                    "the young processes' stack maps stopped being freed ({e}): short \
                     processes' stacks from then on were kept while there was room"
                )
            }))
            .chain(exited_failed.map(|e| {
                format!(
                    "CPU samples of exited processes were read at the end only after a pass \
                     that took them as they exited failed ({e}): those of processes whose maps \
                     were dropped by the end are not symbolised"
                )
            }))
            .collect(),
        top: args.top,
    });
    let mut data = ReportData {
        report,
        cpu,
        timeline: report::timeline::Timeline::with_limit(args.timeline_limit),
        time: Default::default(),
    };
    report::timeline::add_lifecycle(&mut data.timeline, &tracker.lifecycle, window_start_ktime);
    data.report.followed.young_stack_switches = young.done.switches;
    data.report.followed.young_stacks_freed = young.done.freed;
    let mut finish_ctx = FinishCtx {
        args,
        tracker: &tracker,
        symbolizer: &mut symbolizer,
        python: &python,
        window_start_ktime,
        window_end_ktime,
        uprobes: &uprobes,
    };
    for f in families.iter_mut() {
        f.ended(&mut ebpf, &tracker);
    }
    for f in families.iter_mut() {
        f.finish(&mut ebpf, &mut finish_ctx, &mut data)
            .with_context(|| format!("collect the {} data", f.name()))?;
    }
    // Read again for what stays on for the report (`collect::settle_drops`). The kernel's
    // skips keep their read as the trace ended: the programs they would add to now (the CPU
    // sampler, the process events) count past the report's window.
    data.report.drops = drop_rows(collect::settle_drops(drops, collect::drops(&ebpf)?), skips);
    data.report
        .overhead
        .get_or_insert_with(Default::default)
        .own = crate::overhead::own::own_cost(
        usage_opened,
        usage_ended,
        crate::overhead::own::Usage::now(),
        duration_ns,
        u32::try_from(cpus).unwrap_or(u32::MAX),
        (
            kernel_maps_bytes,
            crate::prealloc::mode() == crate::prealloc::Alloc::AsUsed,
        ),
    );
    crate::overhead::complete(&mut data.report);
    // Verdicts first, so that they weigh every process followed, not only those listed.
    report::finalize(&mut data);
    bound_report(&mut data, &tracker);

    // Files first: a reader that closes stdout early (`| head`) must not cost the report.
    let written = output.map(|dir| (dir.path(), report::write_all(dir, &data)));
    let mut text = if args.json {
        let mut t = serde_json::to_string_pretty(&data.report).context("render report.json")?;
        t.push('\n');
        t
    } else {
        report::terminal::render(&data.report, report::terminal::wants_color())
    };
    let mut files_failed = None;
    if let Some((dir, res)) = written {
        match res {
            Ok(w) if !args.json => {
                text.push_str(&format!("Wrote {} files to {}\n", w.len(), dir.display()));
            }
            Ok(_) => {}
            Err(e) => files_failed = Some(e),
        }
    }
    print_report(&text)?;
    if let Some(e) = files_failed {
        return Err(e);
    }
    if args.verbose {
        crate::note!(
            "gputrace: report in {:.1} ms",
            stop.elapsed().as_secs_f64() * 1e3
        );
    }
    // The report is out before the programs are detached: each uprobe link's close waits for
    // a grace period (the CUDA family closes its links together when dropped, after this).
    // Everything is detached before gputrace exits.
    drop(ebpf);
    drop(families);
    Ok(())
}

/// Prints the report on stdout. A reader that is gone is not an error: `| head` closed the
/// pipe, or the terminal hung up (the on-call's ssh session dropped: EIO), and the files in
/// `--output` are written already.
fn print_report(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if !reader_gone(&e) => Err(e).context("print the report on standard output"),
        _ => Ok(()),
    }
}

/// Whether a write to stdout failed because nothing reads it any more.
fn reader_gone(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::BrokenPipe || e.raw_os_error() == Some(libc::EIO)
}

/// What the event loop's ticks do besides the families' and the tracker's work.
struct Passes {
    /// Takes the exited processes' CPU samples.
    exited: cpu_samples::Exited,
    /// Frees the young processes' stacks nothing holds.
    young: crate::young::Young,
}

/// Runs until the end condition; returns why it ended and a launched command's exit code.
async fn pump(
    ring: RingBuf<MapData>,
    tracker: &mut Tracker,
    ebpf: &mut Ebpf,
    families: &mut [Box<dyn ProbeFamily>],
    passes: &mut Passes,
    duration: Option<Duration>,
    launched: Option<u32>,
) -> Result<(EndReason, Option<i32>)> {
    // SAFETY: the RingBuf owns its fd and keeps it open for as long as the AsyncFd holds it.
    let mut ring = unsafe { AsyncFd::register(ring) }
        .map_err(|e| anyhow::anyhow!("watch the process-event ring buffer: {e}"))?;
    let mut sigint = tokio::signal::unix::signal(SignalKind::interrupt()).context("SIGINT")?;
    let mut sigterm = tokio::signal::unix::signal(SignalKind::terminate()).context("SIGTERM")?;
    // A hang-up (the on-call's ssh session dropped) ends the trace as SIGTERM does, and the
    // report is still written; tokio's handler stays installed, so a later one is ignored.
    let mut sighup = tokio::signal::unix::signal(SignalKind::hangup()).context("SIGHUP")?;
    let deadline = duration.map(|d| tokio::time::Instant::now() + d);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut poll = tokio::time::interval(PROC_POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ticks: u64 = 0;
    let mut exit_code = None;
    // When the processes that mapped a library are handed on: a loader maps a program's
    // libraries in a burst, which one look covers.
    let mut mapped_due: Option<tokio::time::Instant> = None;
    loop {
        let sleep = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        let mapped_sleep = async {
            match mapped_due {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = sigint.recv() => return Ok((EndReason::Interrupted, exit_code)),
            _ = sigterm.recv() => return Ok((EndReason::Interrupted, exit_code)),
            _ = sighup.recv() => return Ok((EndReason::Interrupted, exit_code)),
            _ = sleep => return Ok((EndReason::Duration, exit_code)),
            guard = ring.readable_mut() => {
                let mut guard = guard.context("poll the ring buffer")?;
                drain(guard.get_inner_mut(), tracker);
                guard.clear_ready();
                hand_drained(tracker, ebpf, families, &mut mapped_due);
            }
            // Forks, execs, exits and mapped libraries do not wake the loop
            // (`tracer-ebpf/src/proc.rs`).
            _ = poll.tick() => {
                drain(ring.get_mut(), tracker);
                hand_drained(tracker, ebpf, families, &mut mapped_due);
            }
            _ = mapped_sleep => {
                mapped_due = None;
                hand_mapped(tracker, ebpf, families);
            }
            _ = tick.tick() => {
                ticks += 1;
                drain(ring.get_mut(), tracker);
                hand_drained(tracker, ebpf, families, &mut mapped_due);
                if let Some(pid) = launched {
                    if let Some(code) = target::try_reap(pid) {
                        exit_code = Some(code);
                        tracker.mark_exited(pid);
                    }
                }
                if ticks.is_multiple_of(5) {
                    tracker.poll_liveness();
                }
                // Right after the drain, with the exits it read (a pid the tracker has as
                // exited may be a new process's by now: the pass reads the ring again).
                if passes.exited.tick(ebpf, tracker, |t| drain(ring.get_mut(), t)) {
                    hand_drained(tracker, ebpf, families, &mut mapped_due);
                }
                // New processes and execs right away; everything every 2 s (dlopen'd libraries).
                tracker.refresh_maps(ticks.is_multiple_of(20));
                for f in families.iter_mut() {
                    f.tick(ebpf, tracker)
                        .with_context(|| format!("{} probes", f.name()))?;
                }
                // After the retire passes, whose rows took copies of their young stacks.
                passes.young.tick(ebpf, passes.exited.unread_stacks());
                tracker.ticked();
            }
        }
        if tracker.all_roots_exited() {
            drain(ring.get_mut(), tracker);
            if let (Some(pid), None) = (launched, exit_code) {
                exit_code = reap_soon(pid).await;
            }
            return Ok((EndReason::TargetExited, exit_code));
        }
    }
}

/// Hands the syscall storms the ring brought to the families, at once: the budget takes the
/// syscall programs off within milliseconds, not at the next tick.
fn hand_storms(tracker: &mut Tracker, ebpf: &mut Ebpf, families: &mut [Box<dyn ProbeFamily>]) {
    if tracker.storms.is_empty() {
        return;
    }
    let storms = std::mem::take(&mut tracker.storms);
    for f in families.iter_mut() {
        // The trace goes on as it is: a family that cannot react says so in its report.
        if let Err(e) = f.storms(ebpf, &storms) {
            crate::note!("gputrace: {} probes: {e:#}", f.name());
        }
    }
}

/// What a drain of the ring brought: storms go to the families at once, and processes that
/// mapped a library `MAPPED_SETTLE` later (`mapped_due`).
fn hand_drained(
    tracker: &mut Tracker,
    ebpf: &mut Ebpf,
    families: &mut [Box<dyn ProbeFamily>],
    mapped_due: &mut Option<tokio::time::Instant>,
) {
    hand_storms(tracker, ebpf, families);
    if !tracker.mapped.is_empty() && mapped_due.is_none() {
        *mapped_due = Some(tokio::time::Instant::now() + MAPPED_SETTLE);
    }
}

/// How long after a process mapped a library the families look at it: the loader maps the
/// rest of a burst (a program's needed libraries, a Python extension's) meanwhile, and a
/// CUDA runtime's first launch comes hundreds of milliseconds after its load (context
/// creation).
const MAPPED_SETTLE: Duration = Duration::from_millis(3);

/// Hands the processes that mapped a library to the families (the CUDA probes attach to a new
/// runtime or driver before its first calls, not at their next scan).
fn hand_mapped(tracker: &mut Tracker, ebpf: &mut Ebpf, families: &mut [Box<dyn ProbeFamily>]) {
    let pids: Vec<(u32, u64)> = std::mem::take(&mut tracker.mapped)
        .into_iter()
        .filter(|(pid, _)| tracker.procs.get(pid).is_none_or(|t| !t.info.exited))
        .collect();
    if pids.is_empty() {
        return;
    }
    tracker.refresh_mapped(&pids.iter().map(|(pid, _)| *pid).collect::<Vec<_>>());
    for f in families.iter_mut() {
        // The periodic scan is still there: a family that cannot look now says so.
        if let Err(e) = f.mapped(ebpf, &pids) {
            crate::note!("gputrace: {} probes: {e:#}", f.name());
        }
    }
}

/// How often the event loop reads the process events that did not wake it (forks, execs,
/// exits, mapped libraries): a target's exit ends the trace within this, a short-lived
/// child's /proc is read this late at most. ~100 wake-ups a second of gputrace's, against a
/// self-interrupt in each traced fork, exec, exit and library load.
const PROC_POLL: Duration = Duration::from_millis(10);

/// The exit tracepoint fires before the process becomes a zombie: give it a moment.
async fn reap_soon(pid: u32) -> Option<i32> {
    for _ in 0..100 {
        if let Some(code) = target::try_reap(pid) {
            return Some(code);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

/// Loads ahead, on every CPU, the programs the session and the families attach first
/// (`bpf::preload`); the kernel's BTF, when it was read for them.
fn preload(ebpf: &mut Ebpf, families: &[Box<dyn ProbeFamily>], verbose: bool) -> Option<aya::Btf> {
    let t0 = Instant::now();
    let mut wanted: Vec<bpf::Preload> = families.iter().flat_map(|f| f.preload()).collect();
    // Second, beside the scheduler's switch (the two longest to verify).
    wanted.insert(wanted.len().min(1), bpf::Preload::plain("cpu_sample"));
    wanted.extend(
        ["task_newtask", "sched_process_exec", "sched_process_exit"].map(bpf::Preload::plain),
    );
    let btf = wanted
        .iter()
        .any(|p| p.btf_tracepoint.is_some())
        .then(aya::Btf::from_sys_fs)
        .and_then(|b| b.ok());
    bpf::preload(ebpf, btf.as_ref(), &wanted);
    if verbose {
        crate::note!(
            "gputrace: {} programs loaded ahead in {:.1} ms",
            wanted.len(),
            t0.elapsed().as_secs_f64() * 1e3
        );
    }
    btf
}

/// The report's drop rows: the kernel programs' counters, then the runs the kernel skipped.
fn drop_rows(drops: Vec<(Drop, u64, Vec<u64>)>, skips: Vec<(String, u64)>) -> Vec<DropCount> {
    drops
        .into_iter()
        .map(|(d, n, per_cpu)| DropCount {
            reason: format!("{d:?}"),
            affects: d.describe().into(),
            count: n,
            programs: d.programs().into(),
            per_cpu,
        })
        .chain(skips.into_iter().map(|(prog, n)| DropCount {
            reason: "KernelSkipped".into(),
            affects: format!(
                "runs of {prog} the kernel skipped (another BPF program was running on that \
                 CPU): the events they would have counted are missing"
            ),
            count: n,
            programs: prog,
            per_cpu: Vec::new(),
        }))
        .collect()
}

/// The first SIGINT or SIGTERM while the report is written: said, and the next one aborts.
/// Both are blocked while it runs (`sa_mask`), so a second cannot count as a first.
extern "C" fn first_signal_in_report(_sig: libc::c_int) {
    const MSG: &[u8] = b"gputrace: writing the report; interrupt again to abort\n";
    // SAFETY: sigaction and write are async-signal-safe; the message is static; errno is
    // put back as it was for the code this interrupted.
    unsafe {
        let errno = *libc::__errno_location();
        install_for_report(abort_in_report);
        libc::write(2, MSG.as_ptr().cast(), MSG.len());
        *libc::__errno_location() = errno;
    }
}

/// The signal that aborts the report: the file being written goes (a hidden `.tmp` would
/// stay behind), then gputrace dies of the signal as it would have without a handler.
extern "C" fn abort_in_report(sig: libc::c_int) {
    crate::report::partial::remove();
    // SAFETY: sigaction and raise are async-signal-safe. The signal is blocked while this
    // runs: raised again, it is delivered on return, with the default action now.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(sig, &act, std::ptr::null_mut());
        libc::raise(sig);
    }
}

/// Installs `handler` for SIGINT and SIGTERM (over tokio's, which nothing reads once the
/// event loop has ended), both blocked while it runs, restarting the syscalls it interrupts.
/// Async-signal-safe.
fn install_for_report(handler: extern "C" fn(libc::c_int)) {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a plain handler that only calls async-signal-safe functions.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = handler as usize;
            act.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaddset(&mut act.sa_mask, libc::SIGINT);
            libc::sigaddset(&mut act.sa_mask, libc::SIGTERM);
            libc::sigaction(sig, &act, std::ptr::null_mut());
        }
    }
}

/// The first signal while the report is written lets it finish ([`first_signal_in_report`]).
fn spare_the_report_one_signal() {
    install_for_report(first_signal_in_report);
}

/// The next signal aborts the report ([`abort_in_report`]): the window ended with a Ctrl-C.
fn abort_on_signal() {
    install_for_report(abort_in_report);
}

/// Raises the soft limit on open files to the hard one (at most 2^20): the programs, maps
/// and links take a few hundred, and the code files held for symbolisation
/// (`tracker::MAX_HELD_FILES`) up to 4,096 more, past a 1,024 soft limit.
fn raise_open_files_limit() {
    let Some(mut r) = open_files_limit() else {
        return;
    };
    let want = r.rlim_max.min(1 << 20);
    if r.rlim_cur < want {
        r.rlim_cur = want;
        // SAFETY: a plain syscall on a local struct.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) };
    }
}

/// gputrace's limits on open files (soft and hard), if it can read them.
pub(crate) fn open_files_limit() -> Option<libc::rlimit> {
    // SAFETY: a plain syscall on a local struct.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        (libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0).then_some(r)
    }
}

/// Fills in how many processes were followed and keeps the process and thread lists bounded.
fn bound_report(data: &mut report::ReportData, tracker: &Tracker) {
    let report = &mut data.report;
    report.followed.processes = tracker.seen;
    report.followed.forgotten = tracker.untracked;
    report.followed.maps_evicted = tracker.maps_evicted;
    report.followed.exec_images_placed = tracker.images_placed;
    report.followed.libraries_placed = tracker.libraries_placed;
    let out = report::bound::limit_processes(
        report,
        report::bound::MAX_IDLE_PROCESSES,
        report::bound::MAX_LISTED_PROCESSES,
    );
    if out.idle > 0 {
        report.warnings.push(format!(
            "followed {} processes; {} with nothing to show are not listed",
            tracker.seen, out.idle
        ));
    }
    if out.light > 0 {
        // A fork storm of CUDA workers: their calls are in no table once they are not listed.
        let cuda = if out.light_cuda_calls > 0 {
            format!(
                "; {} CUDA calls and {} copied, in no table of the report",
                out.light_cuda_calls,
                report::units::bytes(out.light_copied_bytes)
            )
        } else {
            String::new()
        };
        report.warnings.push(format!(
            "{} more processes are not listed, the lightest beyond the {} listed ({} CPU samples \
             between them, all in cpu.folded{cuda})",
            out.light,
            report::bound::MAX_LISTED_PROCESSES,
            out.light_samples
        ));
    }
    let timeline = &mut data.timeline;
    let on_timeline: std::collections::BTreeSet<(u32, u32)> =
        timeline.events.iter().map(|e| (e.pid, e.tid)).collect();
    for u in report::bound::limit_threads(report, report::bound::MAX_LISTED_THREADS) {
        report.warnings.push(format!(
            "pid {}: {} more threads are not listed, the lightest beyond the {} listed (the \
             process's totals include them)",
            u.pid,
            u.threads.len(),
            report::bound::MAX_LISTED_THREADS
        ));
        // trace.json names its tracks from the listed threads; these keep their names there.
        for (tid, comm) in u.threads {
            if !comm.is_empty() && on_timeline.contains(&(u.pid, tid)) {
                timeline.unlisted_names.insert((u.pid, tid), comm);
            }
        }
    }
    if tracker.untracked > 0 {
        report.warnings.push(format!(
            "to bound memory, {} processes were not remembered (their samples keep pid and comm \
             only)",
            tracker.untracked
        ));
    }
    if !tracker.pids_reused.is_empty() {
        report.warnings.push(format!(
            "pid(s) {} exited and were taken by new traced processes during the trace: each \
             pid's figures are the two processes' together, under the later one's name",
            report::units::some_of(&tracker.pids_reused, PIDS_NAMED)
        ));
    }
    if tracker.maps_evicted > 0 {
        report.warnings.push(format!(
            "to bound memory, {} exited processes lost their memory maps (their samples not \
             taken before that, ~128 exits at a time, are not symbolised)",
            tracker.maps_evicted
        ));
    }
}

/// Pids named in one warning at most: a shell loop traced for minutes wraps the pids, and
/// named all 7,741 it reused in one 52 KB line.
const PIDS_NAMED: usize = 20;

fn drain(ring: &mut RingBuf<MapData>, tracker: &mut Tracker) {
    while let Some(item) = ring.next() {
        if item.len() >= std::mem::size_of::<ProcEvent>() {
            // SAFETY: ProcEvent is repr(C) plain data written whole by the eBPF side.
            let ev: ProcEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
            tracker.on_event(&ev);
            if ev.kind == ProcEventKind::Exec as u32 && item.len() >= size_of::<ExecEvent>() {
                // SAFETY: as above; an exec's event is an ExecEvent, written whole.
                let image: ExecEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
                tracker.on_exec_image(&image);
            } else if ev.kind == ProcEventKind::MappedCode as u32
                && item.len() >= size_of::<MappedCodeEvent>()
            {
                // SAFETY: as above; written whole as a MappedCodeEvent.
                let code: MappedCodeEvent =
                    unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
                tracker.on_mapped_code(&code);
            }
        }
    }
}

/// A warning when CPU samples had user stacks the kernel cut (deeper than it keeps).
fn truncated_stacks(cpu: &CpuProfile) -> impl Iterator<Item = String> {
    let (deep, garbage) = cpu.cut_stacks();
    let deep = (deep > 0).then(|| {
        format!(
            "{deep} of {} CPU samples had user stacks deeper than the kernel keeps ({} frames): \
             their outermost frames are cut, and they sit under `{}` in the flame graphs and \
             outside their callers' totals",
            cpu.total(),
            crate::symbolize::MAX_STACK_FRAMES,
            crate::symbolize::TRUNCATED
        )
    });
    // Not deep stacks: a frame-pointer walk through code built without them (it stops only
    // at the kernel's limit when the chain happens to stay in mapped memory).
    let garbage = (garbage > 0).then(|| {
        format!(
            "{garbage} of {} CPU samples had user stacks walked {} frames into addresses no \
             code covers (one `[unknown]` under `[truncated]` in the flame graphs): a \
             frame-pointer walk through code built without frame pointers; only their \
             innermost named frames mean anything",
            cpu.total(),
            crate::symbolize::MAX_STACK_FRAMES
        )
    });
    deep.into_iter().chain(garbage)
}

pub fn comm_str(c: &[u8; 16]) -> String {
    let end = c.iter().position(|b| *b == 0).unwrap_or(c.len());
    String::from_utf8_lossy(&c[..end]).into_owned()
}
