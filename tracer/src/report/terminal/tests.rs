use super::*;
use crate::report::{
    fixtures::*,
    model::{
        cuda::{CopyStat, KernelStat, ProcessCuda},
        DropCount, TimelineSummary,
    },
    snapshot,
};

fn full_report() -> Report {
    let mut r = data_loading_job();
    r.processes[0].threads.push({
        let mut t = thread(103, "pt_pin_memory", &[("cpu", 5.0), ("cuda_memcpy", 25.0)]);
        t.samples = 50;
        t
    });
    let threads = std::mem::take(&mut r.processes[0].threads);
    let top_self = r.processes[0].top_self.clone();
    let syscalls = r.processes[0].syscalls.clone();
    r.processes[0] = process(100, None, "python", threads);
    r.processes[0].top_self = top_self;
    r.processes[0].syscalls = syscalls;
    r.processes[0].cmdline = vec!["python".into(), "train.py".into()];
    r.processes[0].top_total = vec![
        f("main", 100.0, 297),
        f("_PyEval_EvalFrameDefault", 80.0, 238),
    ];
    r.processes[0].samples = 297;
    r.processes[0].cuda = Some(ProcessCuda {
        api: vec![
            api("cudaMemcpy", 400, 2_500_000_000),
            api("cudaLaunchKernel", 20_000, 400_000_000),
        ],
        copies: vec![CopyStat {
            direction: "H2D".into(),
            mode: "sync".into(),
            count: 400,
            bytes: 4_000_000_000,
            total_ns: 2_500_000_000,
            gbps: 1.6,
        }],
        kernels: vec![KernelStat {
            name: "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>"
                .into(),
            launches: 20_000,
            grid: [1, 1, 1],
            block: [128, 1, 1],
            launch_ns: 400_000_000,
        }],
        ..Default::default()
    });
    r.nvml = Some(nvml(35.0));
    r.drops = vec![DropCount {
        reason: "Ringbuf".into(),
        affects: "timeline events lost (ring buffer full)".into(),
        count: 12,
        programs: String::new(),
        per_cpu: vec![],
    }];
    r.blind_spots = vec![
        "GPU kernel execution times are not measured: only launches are seen \
                          from the CPU side."
            .into(),
    ];
    r.timeline = Some(TimelineSummary {
        events: 1000,
        counter_samples: 100,
        limit: 1000,
        cut_events: 250,
        cut_counter_samples: 0,
        cuda_calls_below_threshold: 0,
    });
    crate::verdict::apply(&mut r);
    r
}

#[test]
fn data_loading_report_snapshot() {
    let out = render(&full_report(), false);
    snapshot::check("terminal_data_loading.txt", &out);
}

#[test]
fn quiet_report_snapshot() {
    let mut r = report();
    r.processes.push(process(
        100,
        None,
        "python",
        vec![thread(100, "python", &[("cpu", 30.0)])],
    ));
    crate::verdict::apply(&mut r);
    let out = render(&r, false);
    assert!(out.contains("No rule fired"));
    snapshot::check("terminal_quiet.txt", &out);
}

#[test]
fn fits_100_columns_and_colours_only_when_asked() {
    let r = full_report();
    let plain = render(&r, false);
    for l in plain.lines() {
        assert!(
            l.chars().count() <= 100,
            "{} columns: {l}",
            l.chars().count()
        );
    }
    assert!(!plain.contains('\x1b'));
    let coloured = render(&r, true);
    assert!(coloured.contains("\x1b[1;31m[CRITICAL"));
    let stripped = strip_ansi(&coloured);
    assert_eq!(stripped, plain, "colour changes nothing but escapes");
}

#[test]
fn verdict_comes_first() {
    let out = render(&full_report(), false);
    let v = out.find("VERDICT").unwrap();
    let p = out.find("pid 100 python").unwrap();
    assert!(v < p);
    assert!(out.contains(" 1. [CRITICAL 55%] The main thread of python (pid 100) waited 55%"));
}

#[test]
fn a_long_warning_is_wrapped_whole() {
    let mut r = full_report();
    let w = "186 more processes are not listed, the lightest beyond the 64 listed (184 CPU \
             samples between them, all in cpu.folded)";
    r.warnings.push(w.into());
    let out = render(&r, false);
    let at = out.find("warning: 186 more").expect(&out);
    let lines: Vec<&str> = out[at..].lines().take(2).collect();
    assert!(lines.iter().all(|l| l.chars().count() <= 100), "{lines:?}");
    assert!(lines[1].starts_with("         ") && lines[1].ends_with("in cpu.folded)"));
    assert_eq!(
        lines
            .join(" ")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" "),
        format!("warning: {w}")
    );
}

#[test]
fn wraps_words() {
    assert_eq!(wrap("aa bb cc", 5), vec!["aa bb", "cc"]);
    assert_eq!(wrap("", 5), vec![""]);
    assert_eq!(wrap("abcdefgh", 4), vec!["abc…"]);
    assert_eq!(clip("a\nb\x1b[2Jc"), "a b [2Jc");
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for d in chars.by_ref() {
                if d == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[test]
fn python_lines_and_gil_in_the_time_section() {
    use crate::report::model::python::{GilReport, GilThread, PySite};
    let mut r = report();
    let mut worker = thread(101, "worker", &[("gil", 40.0), ("cpu", 60.0)]);
    worker.python_sites = vec![PySite {
        category: "gil".into(),
        frame: "hot (w.py:12)".into(),
        call: None,
        ns: 4 * SEC,
        percent: 40.0,
    }];
    let mut p = process(
        100,
        None,
        "python",
        vec![thread(100, "python", &[("cpu", 100.0)]), worker],
    );
    p.gil = Some(GilReport {
        wait_ns: 4 * SEC,
        waiters: vec![GilThread {
            tid: Some(101),
            comm: "worker".into(),
            ns: 4 * SEC,
            percent: 100.0,
        }],
        holders: vec![
            GilThread {
                tid: None,
                comm: String::new(),
                ns: SEC,
                percent: 25.0,
            },
            GilThread {
                tid: Some(100),
                comm: "python".into(),
                ns: 3 * SEC,
                percent: 75.0,
            },
        ],
    });
    r.processes.push(p);
    let out = render(&r, false);
    assert!(
        out.contains(
            "    GIL: 1 thread(s) waited 4.00 s; held most by tid 100 python (75% of the wait)"
        ),
        "{out}"
    );
    assert!(
        out.contains("      python: gil 40.0% at hot (w.py:12)"),
        "{out}"
    );
}

/// The GPU section shows the whole window's utilisation and, where the verdicts leave the
/// start-up out, theirs: one report must not read 21% in one place and 85% in another unsaid.
#[test]
fn gpu_section_shows_the_utilisation_the_verdicts_judge() {
    let mut r = full_report();
    let nv = r.nvml.as_mut().unwrap();
    let g = &mut nv.gpus[0];
    let proto = g.samples[0].clone();
    g.samples = (0..160u64)
        .map(|i| crate::report::model::cuda::GpuSample {
            t_ns: i * 100_000_000,
            util_gpu: if i < 120 { 0 } else { 85 },
            ..proto.clone()
        })
        .collect();
    g.mean_util_percent = 21.25;
    let trainer = r.processes.iter_mut().find(|p| p.cuda.is_some()).unwrap();
    trainer.cuda.as_mut().unwrap().memory.live_bytes_series = vec![(12_000_000_000, 1 << 30)];
    let out = render(&r, false);
    assert!(
        out.contains("mean utilisation 21%")
            && out.contains("85% since the job's first GPU allocation at 12.00 s"),
        "{out}"
    );
    // Without an allocation in the window: the one figure.
    r.processes
        .iter_mut()
        .filter_map(|p| p.cuda.as_mut())
        .for_each(|c| c.memory.live_bytes_series.clear());
    assert!(!render(&r, false).contains("since the job's first GPU allocation"));
}

/// Short-lived helpers (no samples, no CUDA, alive under 1% of the window) are one line after
/// the processes that matter, not a section each.
#[test]
fn short_helpers_are_folded_into_one_line() {
    let mut r = full_report();
    let shown = r.processes.len();
    for i in 0..3 {
        let mut p = process(
            900 + i,
            Some(100),
            if i < 2 { "readlink" } else { "bash" },
            vec![],
        );
        p.time = Some(time(SEC / 1000, &[("cpu", 100.0)]));
        r.processes.push(p);
    }
    let out = render(&r, false);
    assert!(!out.contains("pid 900 "), "{out}");
    assert!(
        out.contains("3 short-lived helper process(es)") && out.contains("readlink x2, bash"),
        "{out}"
    );
    assert_eq!(out.matches("\npid ").count(), shown, "{out}");
    // Alone, they are shown.
    r.processes.drain(..shown);
    r.target.pids = vec![];
    let out = render(&r, false);
    assert!(
        out.contains("pid 900 ") && !out.contains("short-lived helper"),
        "{out}"
    );
}
