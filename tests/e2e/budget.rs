//! The overhead budget (issue 6): a launch storm of ~1M cudaLaunchKernel calls per second is
//! slowed by no more than the budget allows, its counts are scaled and marked as estimated; at
//! `--max-overhead 100%` every launch is counted exactly.

use serde_json::Value;

use crate::common::{self, build_c, require_root, serial};

/// ~1 us of CPU work per launch on this machine: a storm of ~1M launches/s.
const WORK: &str = "2700";

fn storm() -> (String, String) {
    let lib = build_c("storm_cudart", &["-shared", "-fPIC"]);
    let bin = build_c("launch_storm", &["-ldl"]);
    (bin.display().to_string(), lib.display().to_string())
}

fn ns_per_op(stdout: &str) -> f64 {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("ns_per_op "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no ns_per_op line in:\n{stdout}"))
}

fn traced(bin: &str, lib: &str, n: &str, budget: &str, name: &str) -> (f64, Value, String) {
    traced_env(bin, lib, n, budget, name, &[])
}

fn traced_env(
    bin: &str,
    lib: &str,
    n: &str,
    budget: &str,
    name: &str,
    env: &[(&str, &str)],
) -> (f64, Value, String) {
    let out = common::out_dir(name);
    let run = common::gputrace_env(
        &[
            "-F",
            "1",
            "--max-overhead",
            budget,
            "--libcudart",
            lib,
            "-o",
            out.to_str().unwrap(),
            "--",
            bin,
            lib,
            n,
            WORK,
        ],
        env,
    );
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr);
    (ns_per_op(&run.stdout), run.report(&out), run.stdout)
}

/// Every traced process's CUDA API rows.
fn api_rows(report: &Value) -> impl Iterator<Item = &Value> {
    report["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["cuda"]["api"].as_array())
        .flatten()
}

/// Calls of `function` in every traced process.
fn calls(report: &Value, function: &str) -> u64 {
    api_rows(report)
        .filter(|a| a["function"] == function)
        .map(|a| a["count"].as_u64().unwrap())
        .sum()
}

fn launches(report: &Value) -> u64 {
    calls(report, "cudaLaunchKernel")
}

/// Fails if any call was counted at the driver: the workloads here call only the runtime, so
/// a driver row is a runtime launch whose own probe was off while the driver's was on.
fn no_driver_launches(report: &Value) {
    let driver: Vec<&Value> = api_rows(report)
        .filter(|a| a["layer"] == "driver")
        .collect();
    assert!(
        driver.is_empty(),
        "runtime launches counted at the driver: {driver:?}"
    );
}

/// Checks that the storm's thread is the report's costliest, and that the CUDA probes, as
/// gputrace counted and priced their hits, took some of its `storm_ns` and less than `share`.
fn probes_took_under(report: &Value, storm_ns: f64, share: f64) {
    let o = &report["overhead"];
    let thread = &o["costliest_thread"];
    assert_eq!(thread["tid"], report["target"]["pids"][0], "{o}");
    let probes_ns = common::field_of(&thread["parts"], "what", "CUDA probes", "ns") as f64;
    assert!(
        probes_ns > 0.0 && probes_ns / storm_ns < share,
        "the probes took {:.0} ms of the storm's {:.0} ms ({:.1}%): {o}",
        probes_ns / 1e6,
        storm_ns / 1e6,
        100.0 * probes_ns / storm_ns
    );
}

/// Whether `estimated` of `n` calls lands within the bound the report gives for the sampling
/// `key` of `overhead`; with none, whether the report says why and added to what it saw.
fn bound_kept(
    report: &Value,
    key: &str,
    estimated: u64,
    n: u64,
    stdout: &str,
) -> Result<(), String> {
    let s = &report["overhead"][key];
    let est = estimated as f64;
    match s["rel_error"].as_f64() {
        Some(bound) if (est - n as f64).abs() / (n as f64) > bound => Err(format!(
            "estimated {est} of {n}, bound {bound}: {}",
            report["overhead"]
        )),
        Some(_) => Ok(()),
        // The terminal folds its lines: the words may be a line apart.
        None if !stdout
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .contains("(error unknown:") =>
        {
            Err(format!("no bound, unsaid: {stdout}"))
        }
        None if est <= s["seen_hits"].as_f64().unwrap_or(0.0) => {
            Err(format!("nothing added: {}", report["overhead"]))
        }
        None => Ok(()),
    }
}

/// The fake libcudart, whose launches call the fake libcuda's `cuLaunchKernel` inside as the
/// real runtime's call the driver's.
fn nested_runtime() -> String {
    crate::cuda::fake_cuda()
        .join("libcudart.so.12")
        .display()
        .to_string()
}

#[test]
fn launch_storm_stays_within_the_default_budget() {
    let _g = serial();
    if !require_root("launch_storm_stays_within_the_default_budget") {
        return;
    }
    let (bin, lib) = storm();
    let n = 4_000_000u64;
    let (ns_per_launch, report, stdout) = traced(&bin, &lib, &n.to_string(), "2%", "budget");
    // What the budget holds down is the time the probes take from the storm's thread: each
    // hit gputrace saw (the programs count them) at the trap and run cost it measured, against
    // the storm's own CPU clock. How much slower the storm ran is the bench's to measure
    // (`cargo xtask bench`, BENCHMARKS.md), not a test's: this host moves the same untraced
    // storm between 1,057 and 1,603 ns a launch in eight runs back to back, and two copies
    // run side by side differed by up to 2.3x, so a fresh-clone CI run failed this test at
    // +39.4% (fastest of five each, bound 19%) and a local run at +25.2% while the report's
    // own measure of the windows was 1.9-2.5% in each.
    let o = &report["overhead"];
    // Probed on every call, the probes would take ~60% of the storm's time. The budget is
    // 2%. On top of it: one bucket (1 s of budget, 20 ms) that the first window may spend
    // before the watchdog closes it, and the links' close (the kernel takes ~200 ms to
    // release a uprobe, part of it with the probe still hit): together up to ~2% of this
    // ~5 s storm.
    probes_took_under(&report, ns_per_launch * n as f64, 0.02 + 0.02);
    assert_eq!(o["budget"].as_f64(), Some(0.02), "{o}");
    let s = &o["sampled"];
    let scale = s["scale"]
        .as_f64()
        .unwrap_or_else(|| panic!("not sampled: {o}"));
    assert!(scale > 5.0, "{o}");
    assert!(s.get("rel_error").is_some(), "{o}");
    assert!(
        s["seen_hits"].as_u64().unwrap() < n / 5,
        "most launches must go unprobed: {o}"
    );
    assert!(stdout.contains("ESTIMATED"), "{stdout}");
    assert!(stdout.contains("gputrace overhead: ~"), "{stdout}");
    // The scaled count estimates every launch, within the error bound the report gives. With
    // no copy or sync to go by, the windows' launch rates are read in the storm's own time,
    // the probes' cost taken out at what a hit was measured to cost; where a cost per hit 50%
    // off would leave a window no work at all, the report must say the error is unknown
    // rather than give a bound it cannot keep. This VM's uprobe traps do not keep to what was
    // measured: in four traces of 2026-11-27 the windows' probes took 2.0-5.8 us a launch
    // against 2.0-2.4 us priced, and one read 0.58 of the launches with a bound of 20% (and a
    // fresh-clone CI run 1.69 with a bound of 34%). So a trace that fails is taken again
    // once, loudly; two in a row fail the test (as for the moderate rate below).
    let check = |report: &Value, stdout: &str| -> Result<(), String> {
        bound_kept(report, "sampled", launches(report), n, stdout)
    };
    if let Err(first) = check(&report, &stdout) {
        eprintln!("first trace off (the host's traps?), tracing again: {first}");
        let (_, report, stdout) = traced(&bin, &lib, &n.to_string(), "2%", "budget-again");
        if let Err(second) = check(&report, &stdout) {
            panic!("twice: {first}\nthen: {second}");
        }
    }
}

/// A storm through a runtime whose launches call the driver's `cuLaunchKernel` inside (as the
/// real libcudart does), under the default budget: every window attaches and drops the two
/// libraries' links one after another, and a launch caught between them must still count once,
/// as a runtime launch. On an H100 ~20% of a PyTorch loop's launches (all made through
/// cudaLaunchKernel) were counted as direct cuLaunchKernel calls: a driver return probe that
/// was on while its entry probe was not took the runtime call's count. Later a CI run counted
/// 2,067 (two launches, scaled): a close's links drop each on a thread of its own, and the
/// kernel took the runtime's off before the driver's. Now no launch starts to count from the
/// watchdog's decision to close until the next window's probes are all on.
#[test]
fn runtime_launches_under_the_budget_count_no_driver_launches() {
    let _g = serial();
    if !require_root("runtime_launches_under_the_budget_count_no_driver_launches") {
        return;
    }
    let lib = nested_runtime();
    let bin = build_c("launch_storm", &["-ldl"]).display().to_string();
    // The second trace drops the runtime's links first at each close (a test hook): the
    // kernel may take a window's links off in any order, and the window must end for both
    // libraries at once all the same.
    for (i, env) in [&[][..], &[("GPUTRACE_CLOSE_RUNTIME_FIRST", "1")][..]]
        .into_iter()
        .enumerate()
    {
        let (_, report, stdout) =
            traced_env(&bin, &lib, "3000000", "2%", &format!("nested-{i}"), env);
        let o = &report["overhead"];
        // The hook orders the closes of windows reopened by the gate, the second on: the
        // first window's links go on as the libraries load.
        let windows = o["sampled"]["windows"].as_u64().unwrap_or(0);
        eprintln!("nested-{i}: {windows} windows");
        assert!(windows > i as u64, "{o}");
        assert!(launches(&report) > 0, "{stdout}");
        no_driver_launches(&report);
    }
}

/// Steps of 100 launches and two copies (one made from a deeper frame) under the default budget:
/// the windows sample the launches, and a window that closes while a launch is in flight
/// drops its return probe before the launch returns. The copies, which fit the budget, must all be
/// counted: before the thread's call depth was told by its stack pointer and the return
/// probes' generation, the first such close left the depth up for good and 613 of 20,000
/// copies were counted (on an H100, 2 of a PyTorch loop's 2,339).
///
/// The launches between windows are filled in from those copies: 100 a step, whatever the
/// probes cost. Filled in from the windows' launch rates in time (in probe runs, which a
/// nested launch makes two of), the previous build read the 2M launches as 1.31-2.81M in four
/// runs; from the copies, 1.94-2.06M in ten. The runs also found windows that took a library's
/// links while being closed: the runtime loads the driver at its first launch, a first window
/// that closed before the driver was probed left the driver's probes on outside any window,
/// and 90% of that window's launches (3 runs of 13) were counted as driver launches.
#[test]
fn a_loops_copies_are_counted_exactly_and_its_launches_estimated_from_them() {
    let _g = serial();
    if !require_root("a_loops_copies_are_counted_exactly_and_its_launches_estimated_from_them") {
        return;
    }
    let lib = nested_runtime();
    let bin = build_c("launches_and_copies", &["-ldl"])
        .display()
        .to_string();
    let out = common::out_dir("launches-and-copies");
    let steps = 20_000u64;
    // A budget the copies surely fit in: where the copies alone cost more than the default
    // one (two probed calls a step: ~0.5% of the loop's time here, ~2.9% on a host whose
    // traps cost ~1.3 us) they are sampled too (`a_copy_storm_...` below), and their counts
    // are estimates.
    let run = common::gputrace(&[
        "-F",
        "1",
        "--max-overhead",
        "10%",
        "-o",
        out.to_str().unwrap(),
        "--",
        &bin,
        &lib,
        &steps.to_string(),
    ]);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr);
    let report = run.report(&out);
    let o = &report["overhead"];
    let s = &o["sampled"];
    // Sampled: at least one window closed (with launches in flight) and the rest scaled.
    assert!(s["scale"].as_f64() > Some(1.0), "{o}");
    assert_eq!(calls(&report, "cudaMemcpy"), steps, "{o}");
    assert_eq!(calls(&report, "cudaMemcpyAsync"), steps, "{o}");
    no_driver_launches(&report);
    assert!(s["filled_by_calls"].as_f64() > Some(0.99), "{o}");
    let truth = (steps * 100) as f64;
    let off = (launches(&report) as f64 - truth).abs() / truth;
    assert!(off < 0.1, "{} launches of {truth}: {o}", launches(&report));
    // The bound is each window's disagreement with the next and one step either way at
    // each window's edges, in quadrature: a 3-4 s run has two to four windows, and with one
    // copy a step (one step taken as one copy) one run in ~12 came out up to 1% outside it.
    if let Some(bound) = s["rel_error"].as_f64() {
        assert!(off <= bound + 0.02, "{off} off, bound {bound}: {o}");
    }
}

/// A storm of 4M `cudaMemcpyAsync` calls (~1 us of work each), under the default budget: the
/// copy probes alone cost the thread ~60% of its time, which no launch window takes off. The
/// budget switches them on and off too: what they took from the storm stays near the budget,
/// the copies' count and bytes are scaled to within their bound, and the report says so.
/// Before, every copy was probed and the report warned that the thread paid ~67% of its time.
#[test]
fn a_copy_storm_is_sampled_under_the_default_budget() {
    let _g = serial();
    if !require_root("a_copy_storm_is_sampled_under_the_default_budget") {
        return;
    }
    let lib = nested_runtime();
    let bin = build_c("copy_storm", &["-ldl"]).display().to_string();
    let n = 4_000_000u64;
    let trace = |name: &str| {
        let out = common::out_dir(name);
        let run = common::gputrace(&[
            "-F",
            "1",
            "-o",
            out.to_str().unwrap(),
            "--",
            &bin,
            &lib,
            &n.to_string(),
            "500",
        ]);
        assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr);
        (ns_per_op(&run.stdout), run.report(&out), run.stdout)
    };
    let (ns_per_copy, report, stdout) = trace("copy-storm");
    let o = &report["overhead"];
    let s = &o["sampled_calls"];
    let scale = s["scale"]
        .as_f64()
        .unwrap_or_else(|| panic!("copies not sampled: {o}"));
    assert!(scale > 5.0, "{o}");
    assert!(s["windows"].as_u64() >= Some(2), "{o}");
    assert!(
        s["seen_hits"].as_u64().unwrap() < n / 5,
        "most copies must go unprobed: {o}"
    );
    assert!(
        stdout.contains("ESTIMATED: CUDA copy and sync probes probed"),
        "{stdout}"
    );
    // What the probes took from the storm's thread, as gputrace counted and priced its hits
    // (the slowdown itself is the bench's to measure): the budget is a ceiling the windows
    // spend up to (2.0-2.1% of this ~4 s storm in a CI run, with its over-budget line), plus
    // a window's close. Before, ~60%.
    probes_took_under(&report, ns_per_copy * n as f64, 0.02 + 0.02);
    // The scaled count, and the bytes with it (8 a copy), within the bound the report gives;
    // with none, it must say why and have added to what it saw. Taken again once, loudly, as
    // the launch storm's: this VM's traps do not keep to what was measured.
    let check = |report: &Value, stdout: &str| -> Result<(), String> {
        let est = calls(report, "cudaMemcpyAsync") as f64;
        let bytes: u64 = report["processes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["cuda"]["copies"].as_array())
            .flatten()
            .map(|c| c["bytes"].as_u64().unwrap())
            .sum();
        if (bytes as f64 - 8.0 * est).abs() > 8.0 * est * 0.01 {
            return Err(format!("{bytes} bytes for {est} copies"));
        }
        // A copy's time is its own: none took a lost call's entry time, and the seconds
        // between two windows with it (`CALL_GEN_SLOT`).
        let longest = api_rows(report)
            .filter(|a| a["function"] == "cudaMemcpyAsync")
            .filter_map(|a| a["max_ns"].as_u64())
            .max()
            .unwrap_or(0);
        if longest > 200_000_000 {
            return Err(format!("a copy of {longest} ns: {}", report["overhead"]));
        }
        // Whatever the bound says: the storm's copies within a factor of two.
        if !(0.5..=2.0).contains(&(est / n as f64)) {
            return Err(format!(
                "estimated {est} copies of {n}: {}",
                report["overhead"]
            ));
        }
        bound_kept(report, "sampled_calls", est as u64, n, stdout)
    };
    if let Err(first) = check(&report, &stdout) {
        eprintln!("first trace off (the host's traps?), tracing again: {first}");
        let (_, report, stdout) = trace("copy-storm-again");
        if let Err(second) = check(&report, &stdout) {
            panic!("twice: {first}\nthen: {second}");
        }
    }
}

/// Launches with ~8 us of work each (~120k/s, a busy PyTorch loop): the probes cost less than
/// the work, and the scaled count must land within a bound that says something.
#[test]
fn a_moderate_launch_rate_is_estimated_within_its_bound() {
    let _g = serial();
    if !require_root("a_moderate_launch_rate_is_estimated_within_its_bound") {
        return;
    }
    let (bin, lib) = storm();
    // ~8 s at ~120k launches/s: each window's close is paid from the bucket (its uncounted
    // traps), so the 2% budget affords about one window a second, and the bound narrows
    // with their number.
    let n = 1_000_000u64;
    let trace = || {
        let out = common::out_dir("budget-moderate");
        let run = common::gputrace(&[
            "-F",
            "1",
            "--libcudart",
            &lib,
            "-o",
            out.to_str().unwrap(),
            "--",
            &bin,
            &lib,
            &n.to_string(),
            "12000",
        ]);
        assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr);
        let report = run.report(&out);
        let o = &report["overhead"];
        let s = &o["sampled"];
        assert!(s["scale"].as_f64().unwrap_or(0.0) > 2.0, "not sampled: {o}");
        let bound = s["rel_error"]
            .as_f64()
            .unwrap_or_else(|| panic!("no error bound: {o}"));
        (report, bound)
    };
    // 0.24-0.41 on this VM with 500k launches before closes were paid for (2026-11-21); 0.93
    // and 0.87 in two of ~20 runs since, on a loaded host, where one of 4-5 windows saw another
    // rate (the bound widens with how much windows disagree, which the host's load decides).
    // Under 1: it still says something.
    //
    // The bound does not cover a host whose load changes during the trace: in two full e2e
    // runs of 2026-11-22 (both with the machine busy at the suite's start) one trace came out
    // at 48% of the launches with a bound of 31-44%, or with a bound of 1 or more, where
    // traces of the same build alone gave 80-108% within bounds of 35-73%. So a trace that
    // fails is taken again once, loudly; two in a row fail the test.
    let check = |report: &Value, bound: f64| -> Result<(), String> {
        let o = &report["overhead"];
        if bound >= 1.0 {
            return Err(format!("a bound too wide to say anything: {o}"));
        }
        let est = launches(report) as f64;
        if (est - n as f64).abs() / (n as f64) > bound {
            return Err(format!(
                "estimated {est} launches of {n}, bound {bound}: {o}"
            ));
        }
        Ok(())
    };
    let (report, bound) = trace();
    if let Err(first) = check(&report, bound) {
        eprintln!("first trace off (the host's load?), tracing again: {first}");
        let (report, bound) = trace();
        if let Err(second) = check(&report, bound) {
            panic!("twice: {first}\nthen: {second}");
        }
    }
}

#[test]
fn full_budget_counts_every_launch() {
    let _g = serial();
    if !require_root("full_budget_counts_every_launch") {
        return;
    }
    let (bin, lib) = storm();
    let n = 300_000u64;
    // Run again once when the priced share is off: under the whole suite on a loaded host one
    // run came out 16% over the listed prices (1.06 alone, three runs), where a mispricing is
    // off in every run.
    let mut tries = 0;
    let (ns_per_launch, report, stdout, o, probes_ns) = loop {
        tries += 1;
        let (ns_per_launch, report, stdout) =
            traced(&bin, &lib, &n.to_string(), "100%", "budget-full");
        assert_eq!(launches(&report), n);
        let o = report["overhead"].clone();
        // The thread's probes are priced at what this machine measured: each hit at the
        // programs' run time, trap and statistics cost as the report lists them. Left at the
        // built-in constants when the gate does not sample, they once came out at 117% of the
        // storm's time where the measured costs gave 49%. The priced share is not compared
        // with the storm's own CPU time: on this host the probes take 0.69-0.81 of it, and a
        // noisy trap measurement (1,320 ns against ~1,000 for the return trap) or preemption
        // beside it (x1.43) took the estimate past it in two runs.
        let thread = &o["costliest_thread"];
        let probes_ns = common::field_of(&thread["parts"], "what", "CUDA probes", "ns") as f64;
        let price: f64 = ["cuda_entry", "cuda_ret"]
            .iter()
            .map(|name| {
                let p = o["programs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|p| p["program"] == *name)
                    .unwrap_or_else(|| panic!("no {name} in {o}"));
                let f = |k: &str| p[k].as_f64().unwrap_or(0.0);
                assert!(f("bpf_ns_per_hit") > 0.0, "{name} not timed: {o}");
                f("bpf_ns_per_hit") + f("trap_ns_per_hit") + f("stats_ns_per_hit")
            })
            .sum();
        // Within 15%: the gate prices the closes' share by its own mean of the runs (5-7% over
        // the listed prices here), where the constants (1,000 + 2,000 ns of traps) come out
        // ~50% over them.
        let priced = price * n as f64;
        let within = (probes_ns - priced).abs() <= 0.15 * priced;
        assert!(
            within || tries < 2,
            "the thread's probes at {:.0} ms, its {n} launches at the listed prices {:.0} ms \
             (twice): {o}",
            probes_ns / 1e6,
            priced / 1e6
        );
        if within {
            break (ns_per_launch, report, stdout, o, probes_ns);
        }
    };
    let storm_ns = ns_per_launch * n as f64;
    assert!(probes_ns > 0.0 && storm_ns > 0.0, "{o}");
    // The traps were measured on this machine at startup.
    assert_eq!(o["trap_measured"], true, "{o}");
    // A uretprobe returns through the `uretprobe` syscall on x86-64: gputrace's own cost, not
    // one of the target's syscalls.
    for p in report["processes"].as_array().unwrap() {
        for sc in p["syscalls"].as_array().into_iter().flatten() {
            assert_ne!(
                sc["nr"], 335,
                "the probes' own syscall is in the target's table: {sc}"
            );
        }
    }
    assert!(o.get("sampled").is_none(), "{o}");
    assert!(
        o["estimated"].as_f64().unwrap() > 0.1,
        "every launch probed: {o}"
    );
    assert!(!stdout.contains("ESTIMATED"), "{stdout}");
}

/// Calls of `syscall_loop` (getppid) a run makes.
const SYSCALL_LOOP_CALLS: &str = "2000000";

/// `syscall_loop`'s ns per call, untraced.
fn syscall_loop_untraced(bin: &str) -> f64 {
    let out = std::process::Command::new(bin)
        .arg(SYSCALL_LOOP_CALLS)
        .output()
        .expect("run syscall_loop");
    assert!(out.status.success(), "{out:?}");
    ns_per_op(&String::from_utf8_lossy(&out.stdout))
}

/// `syscall_loop` traced with every probe on, sampled at `hz`, its report in `out`.
fn syscall_loop_traced(bin: &str, hz: &str, out: &std::path::Path) -> common::Run {
    common::gputrace(&[
        "-F",
        hz,
        "--max-overhead",
        "100%",
        "-o",
        out.to_str().unwrap(),
        "--",
        bin,
        SYSCALL_LOOP_CALLS,
    ])
}

/// The estimate of what the syscall tracepoints cost a thread agrees with what its syscalls
/// measurably paid: a getppid storm, traced with every probe on, against the same untraced.
/// With the tracepoints' cost outside their programs taken from a constant measured on another
/// day (170 ns per hit where this VM now pays ~25-40), the estimate was 121% of the thread's
/// time where it paid 66%.
#[test]
fn a_syscall_storm_is_estimated_at_what_it_pays() {
    let _g = serial();
    if !require_root("a_syscall_storm_is_estimated_at_what_it_pays") {
        return;
    }
    let bin = build_c("syscall_loop", &[]);
    let bin = bin.to_str().unwrap();
    let untraced = || syscall_loop_untraced(bin);
    // Three traced runs between untraced ones, judged by the median of their ratios: the
    // host's speed drifts, and its noise reaches the programs' measured run times too (on a
    // noisy day (2026-11-26) single runs gave 0.95-1.62, 1.22 the median of five: the
    // programs' means, timed at a few sampled ticks, carry the host's noise). The constant
    // that once put a storm at 1.83 is guarded by `syscall_trap_measured`; up to 1.75 here
    // catches a hit priced twice (~2.4).
    let mut bare: Vec<f64> = (0..2).map(|_| untraced()).collect();
    let mut rounds = Vec::new();
    for i in 0..3 {
        let out = common::out_dir(&format!("syscall-estimate-{i}"));
        let run = syscall_loop_traced(bin, "1", &out);
        assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr);
        let traced = ns_per_op(&run.stdout);
        let r = run.report(&out);
        let o = r["overhead"].clone();
        assert_eq!(o["syscall_trap_measured"], true, "{o:#}");
        let c = &o["costliest_thread"];
        assert_eq!(c["tid"], r["target"]["pids"][0], "{c:#}");
        // In ns, not as shares of the thread's life: that also holds its wait to be released,
        // which a loaded machine stretches.
        let estimated = common::field_of(&c["parts"], "what", "syscall tracepoints", "ns") as f64;
        rounds.push((traced, estimated, o));
        bare.extend((0..2).map(|_| untraced()));
    }
    bare.sort_by(f64::total_cmp);
    let bare = (bare[3] + bare[4]) / 2.0;
    let calls: f64 = SYSCALL_LOOP_CALLS.parse().unwrap();
    let mut ratios: Vec<(f64, usize)> = Vec::new();
    for (i, (traced, estimated, _)) in rounds.iter().enumerate() {
        let paid = (traced - bare) * calls;
        assert!(
            paid > 0.2 * traced * calls,
            "untraced {bare} ns, traced {traced} ns per call"
        );
        ratios.push((estimated / paid, i));
    }
    ratios.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (ratio, i) = ratios[1];
    let (traced, estimated, o) = &rounds[i];
    let paid = (traced - bare) * calls;
    assert!(
        (0.6..=1.75).contains(&ratio),
        "median of {ratios:?}: estimated {:.0} ms for the syscall tracepoints, paid {:.0} ms \
         (untraced {bare} ns, traced {traced} ns per call): {o:#}",
        estimated / 1e6,
        paid / 1e6
    );
}

/// The CPU sampler catches the probes running on a getppid storm about as often as they
/// measurably cost it: the probes' share of its CPU time is what it pays per call over what a
/// traced call takes, against the same storm untraced. The sampler misses the syscall slow
/// path outside the tracepoints' dispatch (~10% of that here: 0.56-0.59 caught where 0.64
/// was paid), and the estimate, at 0.74-1.06 of the samples' CPU time here, is not low
/// beside it.
#[test]
fn the_cpu_sampler_catches_the_probes_about_as_often_as_they_cost() {
    let _g = serial();
    if !require_root("the_cpu_sampler_catches_the_probes_about_as_often_as_they_cost") {
        return;
    }
    let bin = build_c("syscall_loop", &[]);
    let bin = bin.to_str().unwrap();
    let untraced = || syscall_loop_untraced(bin);
    let mut bare: Vec<f64> = (0..2).map(|_| untraced()).collect();
    let out = common::out_dir("sampler-check");
    let run = syscall_loop_traced(bin, "999", &out);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr);
    bare.extend((0..2).map(|_| untraced()));
    bare.sort_by(f64::total_cmp);
    let bare = (bare[1] + bare[2]) / 2.0;
    let traced = ns_per_op(&run.stdout);
    let paid = (traced - bare) / traced;
    let r = run.report(&out);
    let c = &r["overhead"]["seen_by_sampler"];
    assert_eq!(c["samples"], r["sampling"]["samples"], "{c:#}");
    let (caught, share, error) = (
        c["in_probes"].as_u64().unwrap(),
        c["share"].as_f64().unwrap(),
        c["error"].as_f64().unwrap(),
    );
    assert!(caught >= 50, "{c:#}");
    assert!(
        share > 0.5 * paid - 3.0 * error && share < 1.15 * paid + 3.0 * error,
        "caught in {share:.3} of the samples, paid {paid:.3} of the time (untraced {bare} ns, \
         traced {traced} ns per call): {c:#}"
    );
    assert!(
        !r["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().contains("estimate reads low")),
        "{c:#}"
    );
    assert!(
        common::unwrapped(&run.stdout).contains("the CPU sampler caught probes in"),
        "{}",
        run.stdout
    );
}

/// A thread whose syscalls alone cost more than the budget (`dd bs=1`: two syscalls per byte,
/// each paying two tracepoint hits and the kernel's slow path) gets the syscall tracepoints
/// taken off within milliseconds: its cost stays near the budget instead of ~60% of its time,
/// the report names it and says the syscall figures are partial.
///
/// The second run takes them off 400 ms late (a test hook), as a loaded host may: the programs
/// stop themselves at the storm, so they do no work for the syscalls made meanwhile, and the
/// report charges the storm for what those still paid. Before the programs stopped themselves
/// the hooked run traced 820,300 reads, and was estimated at 11.6% of dd's time while its
/// programs ran in full for ~1.6M syscalls (~0.85 s at ~530 ns each).
#[test]
fn a_syscall_storm_takes_the_syscall_tracepoints_off() {
    let _g = serial();
    if !require_root("a_syscall_storm_takes_the_syscall_tracepoints_off") {
        return;
    }
    for (i, env) in [&[][..], &[("GPUTRACE_SLOW_TAKE_OFF_MS", "400")][..]]
        .into_iter()
        .enumerate()
    {
        dd_storm(&format!("syscall-storm-budget-{i}"), env);
    }

    // A thread that only sleeps pays next to nothing and is not warned about.
    let out = common::out_dir("sleep-budget");
    let run = common::gputrace(&["-o", out.to_str().unwrap(), "--", "sleep", "0.5"]);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr);
    let r = run.report(&out);
    // The whole overhead family on failure: CI run 55 put `sleep`'s syscalls at 519 us (~4.7
    // us each, ~10x the usual), and which price was off (a program's mean, its split by path,
    // the trap measured at attach) could not be told from the thread's parts alone.
    let c = &r["overhead"]["costliest_thread"];
    assert!(
        c["estimated"].as_f64().unwrap() < 0.001,
        "{c:#}\n{:#}",
        r["overhead"]
    );
    assert!(
        !r["warnings"].to_string().contains("over budget"),
        "{:#}",
        r["warnings"]
    );
    assert!(
        r["overhead"]["syscalls_off"].is_null(),
        "{:#}",
        r["overhead"]
    );
}

/// One traced `dd bs=1` storm and what the report must say of it (`env`: test hooks).
fn dd_storm(name: &str, env: &[(&str, &str)]) {
    let late = !env.is_empty();
    let out = common::out_dir(name);
    let run = common::gputrace_env(
        &[
            "-o",
            out.to_str().unwrap(),
            "--",
            "dd",
            "if=/dev/zero",
            "of=/dev/null",
            "bs=1",
            // ~4.4 s here (~3 s on a host half as fast again): through the first window (2 s
            // after the storm is seen), which sees it again, and not to the second (4 s later).
            "count=12000000",
        ],
        env,
    );
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr);
    let r = run.report(&out);
    let pid = r["target"]["pids"][0].as_u64().unwrap();
    let off = &r["overhead"]["syscalls_off"];
    assert!(off["windows"].as_u64().unwrap() >= 1, "{off:#}");
    let t = &off["threads"][0];
    assert_eq!(t["tid"].as_u64(), Some(pid), "{off:#}");
    assert_eq!(t["comm"], "dd", "{off:#}");
    assert!(t["share"].as_f64().unwrap() > 0.1, "{off:#}");
    // Off within the first blocks of syscalls, and off for most of the run.
    assert!(off["first_off_s"].as_f64().unwrap() < 1.0, "{off:#}");
    assert!(off["on_share"].as_f64().unwrap() < 0.5, "{off:#}");
    // What the tracepoints saw while on: some of the 12,000,000 reads, not all.
    let p = &r["processes"][0];
    let reads = common::field_of(&p["syscalls"], "name", "read", "count");
    assert!(reads > 0 && reads < 200_000, "{reads} reads");
    // All of them from /dev/zero (bar the dynamic loader's few), those before the window and
    // those in it (a new generation of the fd, named when the window opened) alike.
    let zero = common::field_of(&p["files"], "file", "/dev/zero", "calls");
    assert!(
        zero <= reads && zero + 10 >= reads,
        "{reads} reads: {:#}",
        p["files"]
    );
    // What it paid for them: about a block (the budget's worth of a second, ~20 ms) at the
    // storm and one in the window, where with the tracepoints on throughout its 24,000,000
    // syscalls would cost it ~12 s (~60% of its time). As a share of its time: the price of
    // a hit is read from the kernel's statistics now and then, and moved from 207 to 364 ns
    // between runs on this host (40-75 ms for the same ~145,000 hits); a run the CPU was
    // taken from put it at 6.2 us once, before such runs were taken out of the mean
    // (`overhead::paths::without_stalls`).
    let c = &r["overhead"]["costliest_thread"];
    assert_eq!(c["tid"].as_u64(), Some(pid), "{c:#}");
    let paid = common::field_of(&c["parts"], "what", "syscall tracepoints", "ns");
    assert!(paid > 1_000_000, "{c:#}");
    // Stopped, the programs still cost each syscall the tracepoints' dispatch and two early
    // returns until they come off (~135 ns here, a quarter of their full cost): ~2,400 of
    // dd's syscalls here, and when taken off 400 ms late 2.4-2.6M, priced at 241-427 ms
    // (5.4-8.7% of its time, which the budget cannot help: user space is late).
    // What the budget holds is the rest: the blocks (as a share of dd's time, the stop's
    // part taken out, which grows with how long the host takes to detach), under 5% either
    // way. The stopped syscalls are priced at the programs' early returns (57-187 ns a
    // syscall in four runs here: the split of the kernel's mean puts an early return of
    // `sys_exit` at 17-116 ns, its trap below 0), never more than a full one.
    let halted = off["halted_calls"].as_u64().unwrap() as f64;
    let stopped = common::field_of(&c["parts"], "what", "syscall tracepoints, stopped", "ns");
    let parts = common::sum_of(&c["parts"], "ns");
    let share = c["estimated"].as_f64().unwrap() * (parts - stopped) as f64 / parts as f64;
    assert!(share < 0.05, "{share}: {c:#}");
    if late {
        assert!(halted > 200_000.0 && stopped > 0, "{off:#} {c:#}");
    }
    if halted > 0.0 {
        let each = stopped as f64 / halted;
        assert!(each < 1000.0, "{each} ns a stopped syscall: {c:#}");
    }
    // And the programs themselves did their work for those blocks of its syscalls only:
    // ~140,000 traced runs, against the storm's 24,000,000. (Their runs in all also count
    // the machine's other syscalls, and dd's while they were stopped before they came off:
    // 2.2M more of those when taken off 400 ms late.)
    let programs = &r["overhead"]["programs"];
    let traced = common::field_of(programs, "program", "sys_exit", "traced_hits");
    assert!(
        traced > 10_000 && traced < 300_000,
        "{traced} traced sys_exit runs"
    );
    let shown = run.stdout.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        shown.contains("PARTIAL: over the 2% budget, the syscall tracepoints took thread")
            && shown.contains("(dd) ~")
            && shown.contains("of its time")
            && shown.contains("syscalls: PARTIAL: tracepoints on"),
        "{}",
        run.stdout
    );
}

/// After the storm the tracepoints come back in a window, and stay once it is quiet: the
/// syscalls made after are counted exactly, and a file opened under a closed fd's number while
/// they were off gets its own I/O, not the closed file's.
#[test]
fn syscall_tracepoints_come_back_after_a_storm() {
    let _g = serial();
    if !require_root("syscall_tracepoints_come_back_after_a_storm") {
        return;
    }
    let dir = common::tmp_dir().join(format!("storm-quiet-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let dir = std::fs::canonicalize(&dir).unwrap();
    let (first, second) = (dir.join("stormed.bin"), dir.join("later.bin"));
    std::fs::write(&first, b"x").unwrap();
    std::fs::write(&second, b"y").unwrap();
    let (out, run) = common::trace_workload(
        "storm_then_quiet",
        &[first.to_str().unwrap(), second.to_str().unwrap()],
    );
    assert!(run.stdout.contains("done"), "{}", run.stdout);
    let r = run.report(&out);
    let off = &r["overhead"]["syscalls_off"];
    assert!(off["windows"].as_u64().unwrap() >= 1, "{off:#}");
    // Off from the storm until the window 2 s later, not for the rest (~3.5 s).
    let off_s = off["off_s"].as_f64().unwrap();
    assert!(off_s > 0.5 && off_s < 2.5, "{off:#}");
    let p = r["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["comm"] == "storm_then_quie")
        .unwrap_or_else(|| panic!("{:#}", r["processes"]));
    let count = |name: &str| common::field_of(&p["syscalls"], "name", name, "count");
    assert_eq!(count("getuid"), 1000, "{:#}", p["syscalls"]);
    let preads = count("pread64");
    assert!(preads > 1000 && preads < 200_000, "{preads}");
    let file =
        |f: &std::path::Path| common::field_of(&p["files"], "file", f.to_str().unwrap(), "calls");
    assert_eq!(file(&second), 1000, "{:#}", p["files"]);
    // The storm's reads seen land on the first file (the dynamic loader's preads of the
    // libraries are the few others).
    let stormed = file(&first);
    assert!(
        stormed <= preads - 1000 && stormed + 5 >= preads - 1000,
        "{preads} preads: {:#}",
        p["files"]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A traced job beside a busy untraced one: most of the machine's switches are the other
/// job's, which the scheduler programs return from at once, and their mean per run is far
/// below what a traced switch costs. The report prices the traced thread's switches at what
/// a traced switch costs, and does not charge the other job's to the traced threads.
#[test]
fn switches_beside_a_busy_untraced_job_are_priced_by_their_path() {
    let _g = serial();
    if !require_root("switches_beside_a_busy_untraced_job_are_priced_by_their_path") {
        return;
    }
    let bin = build_c("pingpong", &[]);
    // Killed however the test ends: left running, it would load every test after it.
    struct KillOnDrop(std::process::Child);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _other = KillOnDrop(
        std::process::Command::new(&bin)
            .arg("100000000")
            .spawn()
            .expect("run the untraced pingpong"),
    );
    let out = common::out_dir("paths-beside");
    // Long enough for the statistics' sampled ticks (one 100 ms tick a second) to time a few
    // thousand switches of each path: 100,000 rounds (~0.6 s traced) timed as few as 689 runs
    // once the wake-ups ran no program, too few to split.
    let run = common::gputrace(&[
        "-o",
        out.to_str().unwrap(),
        "--",
        bin.to_str().unwrap(),
        "400000",
    ]);
    drop(_other);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr);
    let r = run.report(&out);
    let o = &r["overhead"];
    let sw = o["programs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["program"].as_str().unwrap().starts_with("sched_switch"))
        .unwrap_or_else(|| panic!("no sched_switch program: {o:#}"));
    let hits = sw["hits"].as_u64().unwrap();
    let traced = sw["traced_hits"]
        .as_u64()
        .unwrap_or_else(|| panic!("{sw:#}"));
    assert!(
        traced > 0 && traced < hits,
        "traced {traced} of {hits} hits: {sw:#}"
    );
    let (t, e) = (
        sw["traced_bpf_ns_per_hit"].as_f64(),
        sw["early_bpf_ns_per_hit"].as_f64(),
    );
    let (Some(t), Some(e)) = (t, e) else {
        panic!("the mean was not split: {sw:#}");
    };
    assert!(
        t > e,
        "a traced switch at {t:.0} ns, an early return at {e:.0}: {sw:#}"
    );
    // The traced threads' switches at the traced price, above the machine's mean.
    let mean = sw["bpf_ns_per_hit"].as_f64().unwrap();
    assert!(
        t > mean,
        "traced {t:.0} ns against a mean of {mean:.0}: {sw:#}"
    );
}

/// A driver library loaded in the middle of a launch storm: mapped while the budget's window is
/// closed (most of the time), its launch probes wait for the next window, which attaches them.
/// One of its launch functions starts with a breakpoint, which the kernel will not probe: the
/// window attaches the others one at a time and the report lists the refused one as not
/// attached, as a library's first attach does. Before, the window's attach of the library's
/// launch probes as one group failed at every window without a word, and none of its launches
/// was counted.
#[test]
fn a_late_library_with_a_refused_probe_gets_the_others_at_its_first_window() {
    let _g = serial();
    if !require_root("a_late_library_with_a_refused_probe_gets_the_others_at_its_first_window") {
        return;
    }
    let rt = build_c("storm_cudart", &["-shared", "-fPIC"]);
    let dir = common::tmp_dir().join("late-driver");
    std::fs::create_dir_all(&dir).unwrap();
    // A driver by its name (`libcuda-*.so*`), found in the process's maps when it loads it.
    let drv = dir.join("libcuda-late.so.1");
    common::build_shared_c(
        &common::repo_root().join("tests/workloads/late_driver.c"),
        &drv,
        &[],
    );
    let bin = build_c("late_library", &["-ldl"]);
    let (rt, drv_s) = (rt.to_str().unwrap(), drv.to_str().unwrap());
    // The gate's first windows come about a second apart: the storm through the runtime
    // (~0.5-1 s) loads the driver between two of them, and the driver's storm (~2-3 s) sees
    // the next.
    for attempt in 0..3 {
        let out = common::out_dir(&format!("late-driver-{attempt}"));
        let run = common::gputrace(&[
            "-v",
            "-F",
            "1",
            "--libcudart",
            rt,
            "-o",
            out.to_str().unwrap(),
            "--",
            bin.to_str().unwrap(),
            rt,
            "500000",
            drv_s,
            "1500000",
            "2700",
        ]);
        assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr);
        let r = run.report(&out);
        let p = &r["processes"][0];
        let lib = p["cuda"]["libraries"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|l| l["path"] == drv_s)
            .unwrap_or_else(|| panic!("the late library was not found: {:#}", p["cuda"]));
        assert_eq!(
            lib["attached"],
            serde_json::json!(["cuLaunchKernel"]),
            "{lib:#}"
        );
        let failed: Vec<&str> = lib["failed"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|f| f.as_str())
            .collect();
        // Once, for its return probe: an entry probe without one is not attached (a call
        // entered with no return to match would hide its thread's later calls).
        assert!(
            failed.len() == 1
                && failed[0].starts_with("cuLaunchKernelEx (cuda_ret)")
                && failed[0].contains("ENOTSUPP"),
            "{lib:#}"
        );
        let blind = r["blind_spots"].to_string();
        assert!(blind.contains("cuLaunchKernelEx"), "{blind}");
        // On a loaded host the gate may open no window after the driver loads (one window in
        // the whole trace in one CI run): the scenario did not happen, as below. Three runs
        // in a row counting none fail.
        if calls(&r, "cuLaunchKernel") == 0 {
            eprintln!(
                "attempt {attempt}: no window counted the late library's launches; again: {:#}",
                r["overhead"]["sampled"]
            );
            continue;
        }
        let waited = run
            .stderr
            .lines()
            .any(|l| l.contains(drv_s) && l.contains("wait for the budget's next window"));
        if waited {
            return;
        }
        eprintln!("attempt {attempt}: the late library loaded while a window was open; again");
    }
    panic!(
        "in three runs the late library never loaded between two windows, or no window counted \
         its launches"
    );
}

/// A reader making thousands of small direct reads a second: past the sampling threshold
/// (lowered here so that a slow CI disk passes it too) the block programs count 1 request in
/// `2^k`, each `2^k` times. The report says so, its row's estimates hold the truth within their
/// error, and the programs did the counted work for a fraction of the requests only. At
/// `--max-overhead 100%` every request is counted.
#[test]
fn block_requests_past_the_threshold_are_sampled_and_estimated() {
    let _g = serial();
    if !require_root("block_requests_past_the_threshold_are_sampled_and_estimated") {
        return;
    }
    // On the root disk: O_DIRECT there reaches the block layer.
    let file = common::tmp_dir().join(format!("sampled-{}.bin", std::process::id()));
    let reads: u64 = 16_384;
    std::fs::write(&file, vec![3u8; (reads * 4096) as usize]).unwrap();
    std::process::Command::new("sync").status().unwrap();
    let dd = |budget: &str, name: &str| {
        let out = common::out_dir(name);
        let run = common::gputrace_env(
            &[
                "--max-overhead",
                budget,
                "-o",
                out.to_str().unwrap(),
                "--",
                "/usr/bin/dd",
                &format!("if={}", file.display()),
                "of=/dev/null",
                "bs=4k",
                "iflag=direct",
            ],
            &[("GPUTRACE_BLOCK_SAMPLE_KEEP", "500")],
        );
        assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr);
        let r = run.report(&out);
        (r, run)
    };
    let (r, run) = dd("2%", "sampled");
    let (exact, _) = dd("100%", "sampled-exact");
    let _ = std::fs::remove_file(&file);

    let s = &r["overhead"]["block_sampled"];
    assert!(
        s["one_in_max"].as_u64().unwrap_or(0) >= 2 && s["sampled_s"].as_f64().unwrap_or(0.0) > 0.0,
        "not sampled: {:#}\nblock rows: {:#}",
        r["overhead"],
        r["processes"][0]["block_io"]
    );
    assert!(
        run.stdout.contains("ESTIMATED: traced block requests"),
        "stdout:\n{}",
        run.stdout
    );
    let rows = &r["processes"][0]["block_io"];
    let requests = common::sum_of(rows, "requests") as f64;
    let seen: u64 = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["sampled"]["seen"].as_u64().unwrap_or(0))
        .sum();
    let err: f64 = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["sampled"]["requests_error"].as_f64().unwrap_or(0.0))
        .sum();
    // Two 95% bounds (four standard deviations), and a few requests of the file system's own.
    let slack = 2.0 * err + 0.02 * reads as f64 + 8.0;
    assert!(
        seen > 0 && (seen as f64) < requests * 0.8 && err > 0.0,
        "{seen} seen of {requests} (error {err}): {rows:#}"
    );
    assert!(
        (requests - reads as f64).abs() <= slack,
        "{requests} requests estimated for {reads} reads (error {err}): {rows:#}"
    );
    let bytes = common::sum_of(rows, "read_bytes") as f64;
    let truth = (reads * 4096) as f64;
    assert!(
        (bytes - truth).abs() <= slack / reads as f64 * truth,
        "{bytes} bytes estimated for {truth}: {rows:#}"
    );
    // The counted work ran for the picked requests only.
    let progs = r["overhead"]["programs"].as_array().unwrap();
    let (hits, counted) = progs
        .iter()
        .filter(|p| {
            p["program"]
                .as_str()
                .unwrap()
                .starts_with("block_rq_complete")
        })
        .fold((0, 0), |(h, c), p| {
            (
                h + p["hits"].as_u64().unwrap(),
                c + p["traced_hits"].as_u64().unwrap_or(0),
            )
        });
    // (A few completions may run no program: see the time accounting's block tests.)
    assert!(
        hits * 10 >= reads * 9 && counted * 5 < hits * 4,
        "{counted} counted completions of {hits}: {progs:#?}"
    );

    // Every request counted at 100%.
    assert!(
        exact["overhead"]["block_sampled"].is_null(),
        "{:#}",
        exact["overhead"]
    );
    let rows = &exact["processes"][0]["block_io"];
    let requests = common::sum_of(rows, "requests");
    // Completions that ran no program (0-0.7% of a reader's here) are allowed: said in the
    // blind spots past 0.1%, tested with the time accounting's block tests.
    assert!(
        requests * 100 >= reads * 98
            && requests <= reads + 8
            && rows
                .as_array()
                .unwrap()
                .iter()
                .all(|b| b["sampled"].is_null()),
        "{requests} requests for {reads} reads: {rows:#}"
    );
}

/// A thread making one syscall over and over, its calls under 200 µs apart on average
/// (nanosleeps of ~60-90 µs): after a window of 256 of them, each is timed with a chance of 1
/// in 8 and a timed one counts 8 times in the latency sums. Its count stays exact; its total
/// time, estimated, holds what the workload measured itself; the report says what is
/// estimated. At `--max-overhead 100%` every call is timed.
#[test]
fn a_fast_runs_syscalls_are_timed_one_in_eight_and_estimated() {
    let _g = serial();
    if !require_root("a_fast_runs_syscalls_are_timed_one_in_eight_and_estimated") {
        return;
    }
    let bin = build_c("fast_sleeps", &[]);
    let calls: u64 = 20_000;
    let run = |budget: &str, name: &str| {
        let out = common::out_dir(name);
        let run = common::gputrace(&[
            "--max-overhead",
            budget,
            "-o",
            out.to_str().unwrap(),
            "--",
            bin.to_str().unwrap(),
            &calls.to_string(),
        ]);
        assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr);
        let truth: f64 = run
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("calls {calls} total_ns ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no total in:\n{}", run.stdout));
        let r = run.report(&out);
        let row = r["processes"][0]["threads"][0]["syscalls"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == "clock_nanosleep" || s["name"] == "nanosleep")
            .cloned()
            .unwrap_or_else(|| panic!("no sleep row: {:#}", r["processes"][0]["threads"]));
        (r, row, truth, run.stdout)
    };
    let (r, row, truth, stdout) = run("2%", "fast-sleeps");
    let count = row["count"].as_u64().unwrap();
    let timed = row["timed"].as_u64().unwrap_or(count);
    let total = row["total_ns"].as_f64().unwrap();
    let hist: u64 = row["hist_log2_ns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_u64().unwrap())
        .sum();
    assert_eq!(count, calls, "{row:#}");
    // ~1 in 8 once the run is fast; its first window's calls, and those of any slower window,
    // all timed.
    assert!(
        timed * 3 < count && timed * 12 > count,
        "{timed} of {count} timed: {row:#}"
    );
    // The estimate: within 10% of the workload's own clock (which also holds the vDSO
    // reads and the loop around each call: the estimate comes out below it).
    assert!(
        total > 0.75 * truth && total < 1.1 * truth,
        "{total} ns estimated for {truth} measured: {row:#}"
    );
    assert!(
        (hist as f64 - count as f64).abs() < 0.1 * count as f64,
        "{hist} in the histogram for {count} calls: {row:#}"
    );
    assert!(
        r["overhead"]["syscalls_timed"]["untimed_calls"]
            .as_u64()
            .unwrap_or(0)
            >= count - timed,
        "{:#}",
        r["overhead"]
    );
    assert!(
        stdout.contains("syscalls of fast runs"),
        "stdout:\n{stdout}"
    );

    let (exact, row, truth, _) = run("100%", "fast-sleeps-exact");
    assert!(exact["overhead"]["syscalls_timed"].is_null());
    assert_eq!(row["count"].as_u64(), Some(calls), "{row:#}");
    assert!(row["timed"].is_null(), "{row:#}");
    let total = row["total_ns"].as_f64().unwrap();
    assert!(
        total > 0.75 * truth && total <= truth,
        "{total} ns timed for {truth} measured: {row:#}"
    );
}

/// A long trace of short processes each reading a disk: their block rows (one per process
/// and disk) are taken out of the kernel's map once they are gone, so that a map of 16 rows
/// holds 24 readers' I/O with none lost.
#[test]
fn gone_readers_leave_room_for_the_next_ones_block_rows() {
    let _g = serial();
    if !require_root("gone_readers_leave_room_for_the_next_ones_block_rows") {
        return;
    }
    // On the root disk: O_DIRECT there reaches the block layer.
    let file = common::tmp_dir().join(format!("readers-{}.bin", std::process::id()));
    std::fs::write(&file, vec![7u8; 24 * 4096]).unwrap();
    std::process::Command::new("sync").status().unwrap();
    let out = common::out_dir("gone-readers");
    let script = format!(
        "for i in $(seq 0 23); do dd if={} of=/dev/null bs=4k count=1 skip=$i iflag=direct \
         status=none; sleep 0.3; done",
        file.display()
    );
    let run = common::gputrace_env(
        &["-o", out.to_str().unwrap(), "--", "bash", "-c", &script],
        &[("GPUTRACE_BLOCK_ROWS", "16")],
    );
    let _ = std::fs::remove_file(&file);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr);
    let r = run.report(&out);
    assert!(
        r["drops"]
            .as_array()
            .unwrap()
            .iter()
            .all(|d| d["reason"] != "BlockMapFull"),
        "{:#}",
        r["drops"]
    );
    let readers: Vec<u64> = r["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["comm"] == "dd")
        .map(|p| common::sum_of(&p["block_io"], "read_bytes"))
        .collect();
    assert_eq!(readers.len(), 24, "{readers:?}");
    assert!(readers.iter().all(|&b| b >= 4096), "{readers:?}");
}

/// The report of a traced `bash -c script`, and the run.
fn shell_loop(name: &str, script: &str) -> (serde_json::Value, common::Run) {
    let out = common::out_dir(name);
    let run = common::gputrace(&["-o", out.to_str().unwrap(), "--", "bash", "-c", script]);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr);
    (run.report(&out), run)
}

/// The costliest thread's waited-for children's part (ns) in `overhead`.
fn waited_part(overhead: &serde_json::Value) -> f64 {
    common::field_of(
        &overhead["costliest_thread"]["parts"],
        "what",
        "waited-for children's probes",
        "ns",
    ) as f64
}

/// A shell loop of short children (`/bin/true`, ~1 ms each): each is too short to be the
/// costliest thread, and their parent, blocked in `wait4` for the whole loop, dilutes them in
/// the whole trace's figure. Priced together (`overhead.short_lived`), they are in the summary
/// line, and what they paid is their summed parts over their summed lives; the shell paid it
/// too, waiting for them.
#[test]
fn a_shell_loops_short_children_are_priced_together() {
    let _g = serial();
    if !require_root("a_shell_loops_short_children_are_priced_together") {
        return;
    }
    let (r, run) = shell_loop("short-lived", "for i in $(seq 400); do /bin/true; done");
    let o = &r["overhead"];
    let g = &o["short_lived"];
    assert_eq!(g["under_ns"].as_u64(), Some(100_000_000), "{o:#}");
    // Every child, perhaps the shell's own forks before their exec too; not the shell.
    let threads = g["threads"].as_u64().unwrap();
    assert!((400..=800).contains(&threads), "{g:#}");
    let alive = g["alive_ns"].as_u64().unwrap() as f64;
    assert!(alive > 400.0 * 100e3 && alive < 400.0 * 100e6, "{g:#}");
    let parts = common::sum_of(&g["parts"], "ns") as f64;
    let syscalls = common::field_of(&g["parts"], "what", "syscall tracepoints", "ns");
    assert!(syscalls > 0, "{g:#}");
    // Each child's exec and exit ran programs in its own context; the shell's forks in its.
    let lifecycle = "fork, exec and exit tracepoints";
    let theirs = common::field_of(&g["parts"], "what", lifecycle, "ns");
    assert!(theirs > 0, "{g:#}");
    let shells = common::field_of(&o["costliest_thread"]["parts"], "what", lifecycle, "ns");
    assert!(shells > 0, "{o:#}");
    // Each thread's parts times its contention (at least 1), capped at their whole lives.
    let est = g["estimated"].as_f64().unwrap();
    assert!(est >= (parts / alive).min(1.0) - 1e-9, "{g:#}");
    assert!(est > 0.0 && est <= 1.0, "{g:#}");
    // The shell is the costliest thread: alive the whole loop.
    let root = r["target"]["pids"][0].as_u64();
    assert_eq!(o["costliest_thread"]["tid"].as_u64(), root, "{o:#}");
    // It waited in wait4 through each child's life, so their probes are in its time too:
    // about what they paid (their parts times their contention), scaled by its waits over
    // their lives (a little under 1: it forks before it waits).
    let waited = waited_part(o);
    let paid = est * alive;
    assert!(
        waited > 0.5 * paid && waited < 1.2 * paid,
        "{waited} ns waited for, {paid} ns paid by the children: {o:#}"
    );
    if alive >= 100e6 {
        assert!(
            common::unwrapped(&run.stdout)
                .contains(&format!("{threads} threads alive under 100 ms")),
            "{}",
            run.stdout
        );
    }
}

/// A shell that reads each child's output (`x=$(/bin/true)`) blocks on the pipe for the
/// child's life, not in `wait4` (the child has gone by the end of its output): those waits
/// carry the children's probes as `wait4`'s do.
#[test]
fn a_shell_reading_its_childrens_output_pays_their_probes() {
    let _g = serial();
    if !require_root("a_shell_reading_its_childrens_output_pays_their_probes") {
        return;
    }
    let (r, _) = shell_loop(
        "short-lived-output",
        "for i in $(seq 400); do x=$(/bin/true); done",
    );
    let o = &r["overhead"];
    let (root, shell) = crate::faults::target_process(&r);
    assert_eq!(o["costliest_thread"]["tid"].as_u64(), Some(root), "{o:#}");
    // Most of the shell's waits are on the pipe (reads; "syscall unseen" where the budget
    // took the syscall programs off), not wait4.
    let reasons = &shell["threads"][0]["time"]["reasons"];
    let ipc = |wait4: bool| {
        reasons
            .as_array()
            .unwrap()
            .iter()
            .filter(|x| x["category"] == "ipc" && (x["reason"] == "wait4") == wait4)
            .map(|x| x["ns"].as_u64().unwrap())
            .sum::<u64>()
    };
    assert!(ipc(false) > 2 * ipc(true), "{reasons:#}");
    let g = &o["short_lived"];
    let paid = g["estimated"].as_f64().unwrap() * g["alive_ns"].as_f64().unwrap();
    let waited = waited_part(o);
    assert!(
        waited > 0.5 * paid && waited < 1.2 * paid,
        "{waited} ns waited for, {paid} ns paid by the children: {o:#}"
    );
}

/// CPU time this test process's waited-for children (and theirs) have used.
fn children_cpu_ns() -> u64 {
    // SAFETY: a plain syscall filling a local struct.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru), 0);
        ru
    };
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1_000;
    ns(ru.ru_utime) + ns(ru.ru_stime)
}

/// gputrace's own process (not its probes, which the traced threads pay) is in every report:
/// its CPU before, in and after the window and its peak memory. What it says it took is
/// checked against what the kernel charged it, read here as a waited-for child's usage: the
/// traced command sleeps, so nearly all of that is gputrace's.
#[test]
fn gputraces_own_cpu_and_memory_are_in_every_report() {
    let _g = serial();
    if !require_root("gputraces_own_cpu_and_memory_are_in_every_report") {
        return;
    }
    let out = common::out_dir("own-cost");
    let before = children_cpu_ns();
    let run = common::gputrace(&["-o", out.to_str().unwrap(), "--", "sleep", "1.5"]);
    let charged = children_cpu_ns() - before;
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr);
    let r = run.report(&out);
    let own = &r["overhead"]["own"];
    let field = |k: &str| {
        own[k]
            .as_u64()
            .unwrap_or_else(|| panic!("no {k} in {own:#}"))
    };
    let (attach, window, report) = (
        field("attach_cpu_ns"),
        field("window_cpu_ns"),
        field("report_cpu_ns"),
    );
    // Loading and verifying the programs takes CPU; the event loop ticks through the window.
    assert!(attach > 1_000_000, "{own:#}");
    assert!(window > 0, "{own:#}");
    let said = attach + window + report;
    // The rest of `charged` is writing the files, detaching, and `sleep` itself.
    assert!(
        said <= charged + 10_000_000 && said >= charged / 3,
        "said {said} ns, the kernel charged {charged} ns: {own:#}"
    );
    let duration = r["window"]["duration_ns"].as_u64().unwrap();
    let share = own["cpu_share"].as_f64().unwrap();
    assert!(
        (share - window as f64 / duration as f64).abs() < 1e-6,
        "{own:#}"
    );
    assert_eq!(
        own["cpus"].as_u64(),
        r["sampling"]["cpus"].as_u64(),
        "{own:#}"
    );
    let (peak_window, peak) = (field("peak_rss_window_bytes"), field("peak_rss_bytes"));
    assert!(peak_window > 4 << 20 && peak >= peak_window, "{own:#}");
    // The stack map alone is 32,768 preallocated stacks of 127 frames (~34 MB).
    assert!(field("kernel_maps_bytes") > 32 << 20, "{own:#}");
    assert!(
        common::unwrapped(&run.stdout).contains("gputrace itself ~"),
        "{}",
        run.stdout
    );
}

/// The sparsest hash maps take kernel memory as they fill on Linux 6.1 and later, and all at
/// the load where `GPUTRACE_PREALLOC=1` asks for what older kernels get. Both load, count
/// the same calls and block I/O and lose nothing; the first holds ~60 MB less.
#[test]
fn hash_maps_take_kernel_memory_as_they_fill() {
    let _g = serial();
    if !require_root("hash_maps_take_kernel_memory_as_they_fill") {
        return;
    }
    // On the root disk: O_DIRECT there reaches the block layer.
    let file = common::tmp_dir().join(format!("as-used-{}.bin", std::process::id()));
    std::fs::write(&file, vec![5u8; 256 * 4096]).unwrap();
    std::process::Command::new("sync").status().unwrap();
    let trace = |name: &str, env: &[(&str, &str)], command: &[&str]| {
        let out = common::out_dir(name);
        let mut args = vec!["-o", out.to_str().unwrap(), "--max-overhead", "100%", "--"];
        args.extend_from_slice(command);
        let run = common::gputrace_env(&args, env);
        assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr);
        run.report(&out)
    };
    let calls = [
        "dd",
        "if=/dev/zero",
        "of=/dev/null",
        "bs=1",
        "count=3000",
        "status=none",
    ];
    let input = format!("if={}", file.display());
    let direct = [
        "dd",
        input.as_str(),
        "of=/dev/null",
        "bs=4k",
        "iflag=direct",
        "status=none",
    ];
    let upfront = [("GPUTRACE_PREALLOC", "1")];
    let as_used = trace("maps-as-used", &[], &calls);
    let preallocated = trace("maps-upfront", &upfront, &calls);
    let as_used_io = trace("maps-as-used-io", &[], &direct);
    let preallocated_io = trace("maps-upfront-io", &upfront, &direct);
    let _ = std::fs::remove_file(&file);

    let own = |r: &serde_json::Value| r["overhead"]["own"].clone();
    // Linux 6.1 allows maps allocated as used in every program; before, all are preallocated
    // (unless a distribution's kernel took the change in).
    let kernel = common::kernel_version();
    let allowed = own(&as_used)["maps_as_used"] == true;
    assert!(allowed || kernel < (6, 1), "{:#}", own(&as_used));
    assert_eq!(
        own(&as_used_io)["maps_as_used"],
        allowed,
        "{:#}",
        own(&as_used_io)
    );
    for r in [&preallocated, &preallocated_io] {
        assert_eq!(own(r)["maps_as_used"], false, "{:#}", own(r));
    }
    let bytes = |r: &serde_json::Value| own(r)["kernel_maps_bytes"].as_u64().unwrap();
    // Preallocated, the thread-state spill (38 MB), Python stacks (9 MB), sampled stacks'
    // counts (8 MB) and CUDA rows (8 MB); as used, their bucket arrays and a few rows. A map's
    // fdinfo says what it holds from Linux 6.4; before, its whole size either way.
    if allowed && kernel >= (6, 4) {
        assert!(
            bytes(&preallocated) >= bytes(&as_used) + (48 << 20),
            "preallocated {} as used {}",
            bytes(&preallocated),
            bytes(&as_used)
        );
    }
    // Nothing lost but a switch the kernel ran no program for (`SwitchInUnseen`: the
    // scheduler's, either way; cuda.rs and faults.rs leave it out alike).
    for r in [&as_used, &preallocated, &as_used_io, &preallocated_io] {
        let lost: Vec<&serde_json::Value> = r["drops"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["reason"] != "SwitchInUnseen")
            .collect();
        assert!(lost.is_empty(), "{:#}", r["drops"]);
    }
    let count = |r: &serde_json::Value, name: &str| {
        common::field_of(&r["processes"][0]["syscalls"], "name", name, "count")
    };
    for r in [&as_used, &preallocated] {
        assert!(
            count(r, "read") >= 3000,
            "{:#}",
            r["processes"][0]["syscalls"]
        );
        assert_eq!(
            count(r, "write"),
            3000,
            "{:#}",
            r["processes"][0]["syscalls"]
        );
    }
    assert_eq!(count(&as_used, "read"), count(&preallocated, "read"));
    // The per-CPU block rows, allocated as used or preallocated: the same 1 MiB read.
    for r in [&as_used_io, &preallocated_io] {
        let rows = &r["processes"][0]["block_io"];
        assert!(common::sum_of(rows, "read_bytes") >= 256 * 4096, "{rows:#}");
        assert!(common::sum_of(rows, "requests") >= 1, "{rows:#}");
    }
}
