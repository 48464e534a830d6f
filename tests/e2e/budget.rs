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

fn untraced(bin: &str, lib: &str, n: &str) -> f64 {
    let out = std::process::Command::new(bin)
        .args([lib, n, WORK])
        .output()
        .expect("run launch_storm");
    assert!(out.status.success(), "{out:?}");
    ns_per_op(&String::from_utf8_lossy(&out.stdout))
}

fn traced(bin: &str, lib: &str, n: &str, budget: &str, name: &str) -> (f64, Value, String) {
    let out = common::out_dir(name);
    let run = common::gputrace(&[
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
    ]);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr);
    (ns_per_op(&run.stdout), run.report(&out), run.stdout)
}

fn launches(report: &Value) -> u64 {
    report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["cuda"]["api"].as_array())
        .flatten()
        .filter(|a| a["function"] == "cudaLaunchKernel")
        .map(|a| a["count"].as_u64().unwrap())
        .sum()
}

#[test]
fn launch_storm_stays_within_the_default_budget() {
    let _g = serial();
    if !require_root("launch_storm_stays_within_the_default_budget") {
        return;
    }
    let (bin, lib) = storm();
    let n = 6_000_000u64;
    let ns = n.to_string();
    // Interleaved, fastest of three each: the machine is shared, and noise only adds time.
    let (mut base, mut best) = (f64::MAX, f64::MAX);
    let mut last = None;
    for i in 0..3 {
        base = base.min(untraced(&bin, &lib, &ns));
        let (t, report, stdout) = traced(&bin, &lib, &ns, "2%", &format!("budget-{i}"));
        best = best.min(t);
        last = Some((report, stdout));
    }
    let (report, stdout) = last.unwrap();
    let slowdown = best / base - 1.0;
    // Probed on every call, each launch would cost ~3.8 us more (a 4x slowdown). The budget is
    // 2%. On top of it, measured here: the first window, before any rate is known, runs probed
    // until the next 100 ms tick, and attaching/detaching the links takes tens of ms during
    // which the return probe fires alone: 100-150 ms of probe time per storm, up to 2.5% of
    // this ~6 s storm (the budget holds over longer traces: the gate then waits until the
    // spent cost is back under it). And noise: on this shared 2-CPU machine the fastest of
    // three runs of the same binary still differ by up to ~2.5%.
    assert!(
        slowdown < 0.02 + 0.025 + 0.025,
        "slowdown {:.1}% (untraced {base:.0} ns/launch, traced {best:.0})",
        slowdown * 100.0
    );
    let o = &report["overhead"];
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
    // The scaled count estimates every launch. One or two windows make a rough estimate (the
    // first window also holds the idle part of the tick before the storm began).
    let est = launches(&report) as f64;
    assert!(
        (est - n as f64).abs() / (n as f64) < 0.5,
        "estimated {est} launches of {n}: {o}"
    );
    assert!(stdout.contains("ESTIMATED"), "{stdout}");
    assert!(stdout.contains("gputrace overhead: ~"), "{stdout}");
}

#[test]
fn full_budget_counts_every_launch() {
    let _g = serial();
    if !require_root("full_budget_counts_every_launch") {
        return;
    }
    let (bin, lib) = storm();
    let n = 300_000u64;
    let (_, report, stdout) = traced(&bin, &lib, &n.to_string(), "100%", "budget-full");
    assert_eq!(launches(&report), n);
    let o = &report["overhead"];
    assert!(o.get("sampled").is_none(), "{o}");
    assert!(
        o["estimated"].as_f64().unwrap() > 0.1,
        "every launch probed: {o}"
    );
    assert!(!stdout.contains("ESTIMATED"), "{stdout}");
}
