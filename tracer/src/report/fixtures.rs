//! Constructed reports for the verdict, terminal, HTML and diff tests.

use super::model::{
    cuda::*,
    time::{BlockIo, CategoryTime, ReasonTime, SyscallStat, TimeBreakdown},
    *,
};
use crate::aggregate::cpu::FnStat;

pub const SEC: u64 = 1_000_000_000;

/// A 10 s window, 99 Hz, 4 CPUs, no processes.
pub fn report() -> Report {
    Report {
        schema_version: SCHEMA_VERSION,
        tool: "gputrace test".into(),
        findings: vec![],
        target: Target {
            command: Some(vec!["python".into(), "train.py".into()]),
            pids: vec![100],
            follow_children: true,
            exit_code: None,
        },
        window: Window {
            start_unix_ns: 0,
            duration_ns: 10 * SEC,
            ended_by: "duration".into(),
            attach_ms: 12.5,
        },
        sampling: Sampling {
            frequency_hz: 99,
            cpus: 4,
            samples: 0,
            in_probes: 0,
        },
        processes: vec![],
        nvml: None,
        drops: vec![],
        blind_spots: vec![],
        warnings: vec![],
        timeline: None,
        overhead: None,
        followed: Default::default(),
    }
}

/// A breakdown over `alive` ns from (category, percent) pairs; the rest is `sleep`.
pub fn time(alive: u64, cats: &[(&str, f64)]) -> TimeBreakdown {
    let mut categories: Vec<CategoryTime> = cats
        .iter()
        .map(|&(c, p)| CategoryTime {
            category: c.into(),
            ns: (alive as f64 * p / 100.0) as u64,
            percent: p,
        })
        .collect();
    let used: f64 = cats.iter().map(|c| c.1).sum();
    if used < 100.0 {
        categories.push(CategoryTime {
            category: "sleep".into(),
            ns: (alive as f64 * (100.0 - used) / 100.0) as u64,
            percent: 100.0 - used,
        });
    }
    categories.sort_by_key(|c| std::cmp::Reverse(c.ns));
    let reasons = categories
        .iter()
        .filter(|c| c.category != "cpu")
        .map(|c| ReasonTime {
            category: c.category.clone(),
            reason: reason_of(&c.category).into(),
            ns: c.ns,
            count: 100,
        })
        .collect();
    TimeBreakdown {
        alive_ns: alive,
        accounted_ns: categories.iter().map(|c| c.ns).sum(),
        categories,
        cpu_user_percent: Some(90.0),
        reasons,
    }
}

fn reason_of(cat: &str) -> &'static str {
    match cat {
        "io" => "read",
        "ipc" => "pipe read",
        "lock" => "futex",
        "poll" => "epoll_wait",
        "runqueue" => "preempted",
        "cuda_sync" => "cudaDeviceSynchronize",
        "cuda_launch" => "cudaLaunchKernel",
        "cuda_memcpy" => "cudaMemcpy",
        _ => "nanosleep",
    }
}

pub fn f(function: &str, percent: f64, samples: u64) -> FnStat {
    FnStat {
        function: function.into(),
        module: Some("libtest.so".into()),
        samples,
        percent,
    }
}

pub fn thread(tid: u32, comm: &str, cats: &[(&str, f64)]) -> ThreadReport {
    ThreadReport {
        tid,
        comm: comm.into(),
        samples: 0,
        kernel_samples: 0,
        top_self: vec![],
        top_python: vec![],
        time: Some(time(10 * SEC, cats)),
        syscalls: vec![],
        python_sites: vec![],
    }
}

/// A process whose time is its threads' summed.
pub fn process(
    pid: u32,
    ppid: Option<u32>,
    comm: &str,
    threads: Vec<ThreadReport>,
) -> ProcessReport {
    let mut sum = TimeBreakdown::default();
    for t in threads.iter().filter_map(|t| t.time.as_ref()) {
        sum.alive_ns += t.alive_ns;
        for c in &t.categories {
            match sum.categories.iter_mut().find(|x| x.category == c.category) {
                Some(x) => x.ns += c.ns,
                None => sum.categories.push(c.clone()),
            }
        }
    }
    for c in &mut sum.categories {
        c.percent = crate::report::units::pct(c.ns, sum.alive_ns);
    }
    sum.categories.sort_by_key(|c| std::cmp::Reverse(c.ns));
    sum.accounted_ns = sum.categories.iter().map(|c| c.ns).sum();
    ProcessReport {
        pid,
        ppid,
        comm: comm.into(),
        cmdline: vec![comm.into()],
        exited: false,
        samples: threads.iter().map(|t| t.samples).sum(),
        top_self: vec![],
        top_python: vec![],
        top_total: vec![],
        time: (sum.alive_ns > 0).then_some(sum),
        syscalls: vec![],
        files: vec![],
        dirs: vec![],
        block_io: vec![],
        cuda: None,
        gil: None,
        threads,
        threads_not_listed: 0,
    }
}

pub fn api(function: &str, count: u64, total_ns: u64) -> ApiStat {
    ApiStat {
        function: function.into(),
        layer: "runtime".into(),
        count,
        total_ns,
        min_ns: total_ns / count.max(1),
        max_ns: total_ns / count.max(1),
        hist_log2_ns: vec![],
        errors: vec![],
    }
}

pub fn nvml(util: f64) -> Nvml {
    Nvml {
        available: true,
        reason: None,
        interval_ms: 100,
        gpus: vec![GpuSeries {
            index: 0,
            name: "NVIDIA H100".into(),
            samples: (0..10)
                .map(|i| GpuSample {
                    t_ns: i * SEC,
                    util_gpu: util as u32,
                    util_mem: 10,
                    mem_used_bytes: 1 << 30,
                    mem_total_bytes: 80 << 30,
                    pcie_tx_kbps: 0,
                    pcie_rx_kbps: 0,
                    sm_clock_mhz: 1980,
                    power_mw: 300_000,
                })
                .collect(),
            mean_util_percent: util,
            process_util: vec![],
        }],
    }
}

/// A data-loading-bound PyTorch job: the trainer waits on a pipe while two workers read disk.
pub fn data_loading_job() -> Report {
    let mut r = report();
    let mut trainer = thread(
        100,
        "python",
        &[("ipc", 45.0), ("poll", 10.0), ("cpu", 30.0)],
    );
    trainer.samples = 297;
    trainer.top_self = vec![
        f("_PyEval_EvalFrameDefault", 40.0, 119),
        f("memcpy", 10.0, 30),
    ];
    let mut main = process(100, None, "python", vec![trainer]);
    main.top_self = vec![f("_PyEval_EvalFrameDefault", 40.0, 119)];
    main.syscalls = vec![SyscallStat {
        name: "read".into(),
        nr: 0,
        count: 1200,
        total_ns: 4 * SEC,
        bytes: 12_000_000,
        ..Default::default()
    }];
    r.processes.push(main);
    for pid in [101, 102] {
        let mut w = process(
            pid,
            Some(100),
            "pt_data_worker",
            vec![thread(
                pid,
                "pt_data_worker",
                &[("io", 70.0), ("cpu", 20.0)],
            )],
        );
        w.block_io = vec![BlockIo {
            device: "8:0 sda".into(),
            requests: 9000,
            reads: 9000,
            read_bytes: 900_000_000,
            total_ns: 7 * SEC,
            ..Default::default()
        }];
        r.processes.push(w);
    }
    r
}

/// A GPU job whose trainer thread has the given shares, with CUDA stats.
pub fn cuda_job(cats: &[(&str, f64)], cuda: ProcessCuda) -> Report {
    let mut r = report();
    let mut p = process(100, None, "python", vec![thread(100, "python", cats)]);
    p.cuda = Some(cuda);
    r.processes.push(p);
    r
}
