use super::*;
use crate::report::{
    fixtures::*,
    model::{
        cuda::{Allocation, CopyStat, CudaErrorCount, KernelStat, MemoryStat, ProcessCuda},
        time::{DirIo, FileIo},
    },
};

fn rules(r: &Report) -> Vec<String> {
    evaluate(r).into_iter().map(|f| f.rule).collect()
}

#[test]
fn nothing_fires_on_a_quiet_job() {
    let mut r = report();
    r.processes.push(process(
        100,
        None,
        "python",
        vec![thread(100, "python", &[("cpu", 30.0)])],
    ));
    assert_eq!(rules(&r), Vec::<String>::new());
    assert!(evaluate(&report()).is_empty(), "empty report");
}

#[test]
fn data_loading_names_the_wait_and_the_workers() {
    let fs = evaluate(&data_loading_job());
    assert_eq!(fs[0].rule, "data-loading-bound", "{fs:#?}");
    let f = &fs[0];
    assert_eq!(f.impact_percent, 55.0);
    assert_eq!(f.severity, "critical");
    assert!(f.title.contains("waited 55%"), "{}", f.title);
    assert!(
        f.title.contains("2 worker processes spent 70% in disk I/O"),
        "{}",
        f.title
    );
    assert!(f.title.contains("180.0 MB/s"), "{}", f.title);
    assert_eq!((f.pid, f.tid), (Some(100), Some(100)));
    assert!(f.suggestions.iter().any(|s| s.contains("I/O-bound")));
    // The workers' own I/O is explained by the finding, not reported again.
    assert!(!fs.iter().any(|f| f.rule == "io-bound"), "{fs:#?}");
}

#[test]
fn data_loading_needs_busy_workers() {
    let mut r = data_loading_job();
    for p in r.processes.iter_mut().skip(1) {
        *p = process(
            p.pid,
            Some(100),
            "idle",
            vec![thread(p.pid, "idle", &[("cpu", 5.0)])],
        );
    }
    assert!(!rules(&r).contains(&"data-loading-bound".into()));
}

#[test]
fn cpu_heavy_workers_get_cpu_advice() {
    let mut r = data_loading_job();
    for p in r.processes.iter_mut().skip(1) {
        *p = process(
            p.pid,
            Some(100),
            "w",
            vec![thread(p.pid, "w", &[("cpu", 85.0)])],
        );
    }
    let fs = evaluate(&r);
    assert_eq!(fs[0].rule, "data-loading-bound");
    assert!(fs[0].suggestions[0].contains("CPU-bound in the workers"));
    assert!(
        !fs.iter().any(|f| f.rule == "cpu-bound"),
        "workers explained: {fs:#?}"
    );
    // With every core busy, more workers is not the advice.
    let free = fs[0].suggestions[0].clone();
    assert!(free.contains("raise DataLoader num_workers"), "{free}");
    r.sampling.cpus = 2;
    r.sampling.samples =
        (2.0 * r.window.duration_ns as f64 / 1e9 * r.sampling.frequency_hz as f64) as u64;
    let busy = evaluate(&r)[0].suggestions[0].clone();
    assert!(
        busy.contains("every core busy") && !busy.contains("raise"),
        "{busy}"
    );
}

#[test]
fn io_bound_cites_devices_and_files() {
    let mut r = report();
    let mut p = process(
        100,
        None,
        "tar",
        vec![thread(100, "tar", &[("io", 60.0), ("cpu", 10.0)])],
    );
    p.files = vec![FileIo {
        file: "/data/shard-0001.tar".into(),
        ns: 5 * SEC,
        bytes: 500_000_000,
        calls: 4000,
        timed: None,
    }];
    p.block_io = data_loading_job().processes[1].block_io.clone();
    r.processes.push(p);
    let fs = evaluate(&r);
    assert_eq!(rules(&r), vec!["io-bound"]);
    assert!(fs[0].title.contains("60% of wall time blocked on disk I/O"));
    assert!(fs[0]
        .evidence
        .iter()
        .any(|e| e.contains("/data/shard-0001.tar")));
    assert!(
        fs[0]
            .evidence
            .iter()
            .any(|e| e.contains("mean latency 777.8 µs")),
        "{:?}",
        fs[0].evidence
    );
    assert!(!fs[0].evidence.iter().any(|e| e.starts_with("directory")));
}

#[test]
fn io_bound_over_many_small_files_cites_their_directory() {
    let mut r = report();
    let mut p = process(
        100,
        None,
        "python",
        vec![thread(100, "python", &[("io", 70.0), ("cpu", 10.0)])],
    );
    p.dirs = vec![DirIo {
        dir: "/data/train".into(),
        files: 12_000,
        ns: 7 * SEC,
        bytes: 1_200_000_000,
        calls: 36_000,
    }];
    r.processes.push(p);
    let fs = evaluate(&r);
    assert_eq!(rules(&r), vec!["io-bound"]);
    assert!(
        fs[0]
            .evidence
            .iter()
            .any(|e| e.starts_with("directory /data/train: 12000 files, 7.00 s in 36000 calls")),
        "{:?}",
        fs[0].evidence
    );
}

#[test]
fn cpu_bound_names_functions_from_time_or_samples() {
    let mut r = report();
    let mut t = thread(100, "python", &[("cpu", 92.0)]);
    t.top_self = vec![f("resize_bilinear", 55.0, 500), f("decode_jpeg", 20.0, 180)];
    t.samples = 900;
    r.processes.push(process(100, None, "python", vec![t]));
    let fs = evaluate(&r);
    assert_eq!(fs[0].rule, "cpu-bound");
    assert!(fs[0].title.contains("on CPU 92%"));
    assert!(
        fs[0].title.contains("resize_bilinear (55%)"),
        "{}",
        fs[0].title
    );

    // No time accounting: 990 samples at 99 Hz over 10 s is 100% on CPU.
    let mut t = thread(7, "hot", &[]);
    t.time = None;
    t.samples = 990;
    t.top_self = vec![f("spin", 100.0, 990)];
    r.processes[0] = process(7, None, "hot", vec![t]);
    let fs = evaluate(&r);
    assert_eq!(fs[0].rule, "cpu-bound");
    assert!(fs[0]
        .evidence
        .iter()
        .any(|e| e.contains("from CPU samples")));
    assert!(fs[0].title.contains("spin (100%)"));
}

#[test]
fn contention_counts_runnable_time() {
    let mut r = report();
    r.processes.push(process(
        100,
        None,
        "python",
        vec![
            thread(100, "python", &[("cpu", 50.0), ("runqueue", 30.0)]),
            thread(101, "python", &[("cpu", 50.0), ("runqueue", 8.0)]),
        ],
    ));
    let fs = evaluate(&r);
    assert_eq!(rules(&r), vec!["cpu-contention"]);
    assert_eq!(fs[0].impact_percent, 30.0);
    assert!(fs[0].evidence.iter().any(|e| e.contains("2 thread(s)")));
    assert!(
        fs[0].evidence.iter().any(|e| e.contains("1.0 CPUs busy")),
        "{:?}",
        fs[0].evidence
    );
}

/// Waits for a CPU while the job keeps few of them busy: the advice looks outside the job,
/// not at its thread counts.
#[test]
fn contention_from_outside_the_job_points_outside() {
    let mut r = report();
    r.processes.push(process(
        100,
        None,
        "python",
        vec![thread(
            100,
            "python",
            &[("sleep", 55.0), ("runqueue", 35.0), ("cpu", 10.0)],
        )],
    ));
    r.sampling.samples = 0;
    let fs = evaluate(&r);
    let f = fs
        .iter()
        .find(|f| f.rule == "cpu-contention")
        .expect("fires");
    assert!(
        f.suggestions[0].contains("something else"),
        "{:?}",
        f.suggestions
    );
    assert!(!f.suggestions.iter().any(|s| s.contains("num_workers")));
}

/// Threads busy inside CUDA launch calls (their time in cuda_launch, not cpu) still keep
/// CPUs busy: the CPU samples say how many.
#[test]
fn contention_counts_cpu_time_inside_cuda_calls() {
    let mut r = report();
    r.processes.push(process(
        100,
        None,
        "app",
        vec![
            thread(
                100,
                "app",
                &[("cuda_launch", 60.0), ("runqueue", 37.0), ("cpu", 3.0)],
            ),
            thread(
                101,
                "app",
                &[("cuda_launch", 60.0), ("runqueue", 37.0), ("cpu", 3.0)],
            ),
        ],
    ));
    // 1.9 CPU-seconds of samples a second of the window.
    let secs = r.window.duration_ns as f64 / 1e9;
    r.sampling.samples = (1.9 * secs * r.sampling.frequency_hz as f64) as u64;
    let fs = evaluate(&r);
    let f = fs
        .iter()
        .find(|f| f.rule == "cpu-contention")
        .expect("fires");
    assert!(
        f.evidence.iter().any(|e| e.contains("1.9 CPUs busy")),
        "{:?}",
        f.evidence
    );
}

fn sync_cuda(count: u64, ns: u64) -> ProcessCuda {
    ProcessCuda {
        api: vec![
            api("cudaDeviceSynchronize", count, ns),
            api("cudaLaunchKernel", 1000, SEC / 100),
        ],
        ..Default::default()
    }
}

#[test]
fn gpu_bound_with_busy_gpu_or_long_waits() {
    let mut r = cuda_job(
        &[("cuda_sync", 70.0), ("cpu", 20.0)],
        sync_cuda(100, 7 * SEC),
    );
    r.nvml = Some(nvml(95.0));
    let fs = evaluate(&r);
    assert_eq!(fs[0].rule, "gpu-bound", "{fs:#?}");
    assert_eq!(fs[0].severity, "medium", "never alarming");
    assert!(fs[0].title.contains("70%") && fs[0].title.contains("95%"));

    // Idle GPU with the same waits: not GPU-bound.
    r.nvml = Some(nvml(20.0));
    let rs = rules(&r);
    assert!(
        !rs.contains(&"gpu-bound".into()) && rs.contains(&"gpu-idle".into()),
        "{rs:?}"
    );

    // No NVML: 10 waits/s of 7 ms each read as a busy GPU.
    r.nvml = None;
    assert_eq!(rules(&r)[0], "gpu-bound");
}

#[test]
fn frequent_short_syncs_are_sync_heavy() {
    // 5000 syncs of 0.8 ms: 500/s.
    let mut c = sync_cuda(5000, 4 * SEC);
    c.copies = vec![copy("D2H", 2000, 8000, SEC / 2, 0.0)];
    let r = cuda_job(&[("cuda_sync", 40.0), ("cpu", 40.0)], c);
    let fs = evaluate(&r);
    assert_eq!(fs[0].rule, "sync-heavy", "{fs:#?}");
    assert!(fs[0].title.contains("700 times/s"), "{}", fs[0].title);
    assert!(fs[0].evidence[0].contains("2000 small synchronous"));
}

#[test]
fn launch_bound_counts_tiny_kernels() {
    let c = ProcessCuda {
        api: vec![api("cudaLaunchKernel", 200_000, 6 * SEC)],
        kernels: vec![
            KernelStat {
                name: "elementwise_add".into(),
                launches: 150_000,
                grid: [1, 1, 1],
                block: [128, 1, 1],
                launch_ns: 4 * SEC,
            },
            KernelStat {
                name: "gemm".into(),
                launches: 50_000,
                grid: [64, 64, 1],
                block: [256, 1, 1],
                launch_ns: 2 * SEC,
            },
        ],
        ..Default::default()
    };
    let mut r = cuda_job(&[("cuda_launch", 60.0), ("cpu", 30.0)], c);
    let fs = evaluate(&r);
    assert_eq!(fs[0].rule, "launch-bound", "{fs:#?}");
    assert!(fs[0].title.contains("20000 launches/s"), "{}", fs[0].title);
    assert!(fs[0].title.contains("30.0 µs each"), "{}", fs[0].title);
    assert!(fs[0]
        .evidence
        .iter()
        .any(|e| e.contains("75% of launches have at most 8 blocks")));
    assert!(fs[0].suggestions.iter().any(|s| s.contains("CUDA graph")));
    // A saturated GPU is not launch-bound, whatever the CPU does.
    r.nvml = Some(nvml(97.0));
    assert!(!rules(&r).contains(&"launch-bound".into()));
}

/// A row of synchronous copies in `direction`.
fn copy(direction: &str, count: u64, bytes: u64, total_ns: u64, gbps: f64) -> CopyStat {
    CopyStat {
        direction: direction.into(),
        mode: "sync".into(),
        count,
        bytes,
        total_ns,
        gbps,
    }
}

#[test]
fn transfer_bound_spots_pageable_memory() {
    let c = ProcessCuda {
        api: vec![api("cudaMemcpy", 1000, 5 * SEC)],
        copies: vec![copy("H2D", 1000, 10_000_000_000, 5 * SEC, 2.0)],
        ..Default::default()
    };
    let r = cuda_job(&[("cuda_memcpy", 50.0), ("cpu", 30.0)], c);
    let fs = evaluate(&r);
    assert_eq!(fs[0].rule, "transfer-bound", "{fs:#?}");
    assert!(
        fs[0].title.contains("10.0 GB at 2.0 GB/s"),
        "{}",
        fs[0].title
    );
    assert!(fs[0].evidence.iter().any(|e| e.contains("pageable")));
    assert!(fs[0].suggestions[0].contains("pin_memory=True"));
}

/// Time in the cuda_memcpy category that moves nothing across the link is not a transfer:
/// memsets, and tiny synchronous read-backs (`.item()`), which wait for the GPU.
#[test]
fn transfer_bound_needs_bytes_moving() {
    let readbacks = ProcessCuda {
        api: vec![api("cudaMemcpy", 300, 2 * SEC)],
        copies: vec![copy("D2H", 300, 1200, 2 * SEC, 0.0)],
        ..Default::default()
    };
    let r = cuda_job(&[("cuda_memcpy", 67.0), ("cpu", 30.0)], readbacks);
    assert!(
        !rules(&r).contains(&"transfer-bound".into()),
        "{:?}",
        rules(&r)
    );
    let memsets = ProcessCuda {
        api: vec![api("cudaMemset", 200, 2 * SEC)],
        ..Default::default()
    };
    let r = cuda_job(&[("cuda_memcpy", 67.0), ("cpu", 30.0)], memsets);
    assert!(
        !rules(&r).contains(&"transfer-bound".into()),
        "{:?}",
        rules(&r)
    );
}

#[test]
fn allocation_churn_and_memory_not_freed() {
    let c = ProcessCuda {
        api: vec![api("cudaMalloc", 2000, SEC), api("cudaFree", 2000, SEC / 2)],
        memory: MemoryStat {
            allocs: 2000,
            frees: 2000,
            alloc_bytes: 4_000_000_000,
            peak_live_bytes: 2_000_000_000,
            live_bytes_at_end: 1_000_000_000,
            never_freed: vec![Allocation {
                function: "cudaMalloc".into(),
                bytes: 512 << 20,
                at_ns: SEC,
            }],
            live_bytes_series: vec![],
        },
        ..Default::default()
    };
    let r = cuda_job(&[("cuda_malloc", 15.0), ("cpu", 50.0)], c);
    let fs = evaluate(&r);
    assert_eq!(rules(&r), vec!["allocation-churn", "gpu-memory-not-freed"]);
    assert!(
        fs[0].title.contains("400 cudaMalloc/cudaFree calls/s"),
        "{}",
        fs[0].title
    );
    assert!(fs[1].title.contains("536.9 MB"), "{}", fs[1].title);
    assert_eq!(fs[1].severity, "low");
}

#[test]
fn failing_cuda_calls_are_critical_when_most_fail() {
    let mut a = api("cudaMalloc", 10, 1000);
    a.errors = vec![CudaErrorCount {
        code: 35,
        name: "cudaErrorInsufficientDriver".into(),
        count: 10,
    }];
    let r = cuda_job(
        &[("cpu", 20.0)],
        ProcessCuda {
            api: vec![a, api("cudaGetDeviceCount", 10, 1000)],
            ..Default::default()
        },
    );
    let fs = evaluate(&r);
    assert_eq!(fs[0].rule, "cuda-errors");
    assert_eq!(fs[0].severity, "critical");
    assert!(fs[0].title.contains("10 of 20 CUDA calls failed (50%)"));
    assert!(fs[0].title.contains("cudaErrorInsufficientDriver"));
}

#[test]
fn several_rules_fire_and_rank_by_impact() {
    let mut r = data_loading_job();
    r.processes[0]
        .threads
        .push(thread(103, "python", &[("cpu", 40.0), ("runqueue", 15.0)]));
    r.processes[0].cuda = Some(ProcessCuda {
        api: vec![api("cudaMemcpy", 1000, 2 * SEC)],
        copies: vec![CopyStat {
            mode: "async".into(),
            ..copy("H2D", 1000, 20_000_000_000, 2 * SEC, 10.0)
        }],
        ..Default::default()
    });
    r.nvml = Some(nvml(12.0));
    let fs = evaluate(&r);
    let rs: Vec<&str> = fs.iter().map(|f| f.rule.as_str()).collect();
    assert_eq!(
        rs,
        vec![
            "data-loading-bound",
            "gpu-idle",
            "transfer-bound",
            "cpu-contention"
        ],
        "{fs:#?}"
    );
    assert!(fs
        .windows(2)
        .all(|w| w[0].impact_percent >= w[1].impact_percent));
    let mut r2 = r.clone();
    apply(&mut r2);
    assert_eq!(r2.findings, fs);
}

#[test]
fn forkserver_grandchildren_count_as_workers() {
    let mut r = data_loading_job();
    let mut fs = process(
        99,
        Some(100),
        "forkserver",
        vec![thread(99, "forkserver", &[])],
    );
    fs.time = None;
    r.processes.insert(1, fs);
    for p in r.processes.iter_mut().skip(2) {
        p.ppid = Some(99);
    }
    let f = &evaluate(&r)[0];
    assert_eq!(f.rule, "data-loading-bound");
    assert!(f.title.contains("its 2 worker processes"), "{}", f.title);
}

#[test]
fn cuda_time_not_charged_to_cuda_is_not_cpu_bound() {
    // No cuda_* categories: the 80% "cpu" is mostly inside 7 s of cudaLaunchKernel.
    let c = ProcessCuda {
        api: vec![api("cudaLaunchKernel", 500_000, 7 * SEC)],
        ..Default::default()
    };
    let r = cuda_job(&[("cpu", 80.0)], c);
    let fs = evaluate(&r);
    assert_eq!(rules(&r), vec!["launch-bound"], "{fs:#?}");
    assert_eq!(fs[0].impact_percent, 70.0);
}

/// What a real `python3` launched through a shell wrapper looks like: short-lived shells
/// waiting in wait4 for their children, and queue feeder threads in the workers.
#[test]
fn shells_and_feeder_threads_are_not_trainers() {
    let mut r = report();
    let mut shell = thread(50, "bash", &[]);
    shell.time = Some(time(SEC / 20, &[("ipc", 95.0)]));
    shell.time.as_mut().unwrap().reasons[0].reason = "wait4".into();
    let mut sh = process(50, None, "bash", vec![shell]);
    sh.time = None;
    r.processes.push(sh);
    let mut child = thread(51, "bash", &[]);
    child.time = Some(time(SEC / 20, &[("cpu", 50.0), ("runqueue", 50.0)]));
    r.processes.push(process(51, Some(50), "bash", vec![child]));
    // A worker process: the main thread reads, the feeder thread waits on a futex.
    r.processes.push(process(
        60,
        None,
        "python3",
        vec![
            thread(60, "python3", &[("io", 60.0), ("cpu", 20.0)]),
            thread(61, "python3", &[("lock", 95.0)]),
        ],
    ));
    let rs = rules(&r);
    assert_eq!(rs, vec!["io-bound"], "{:#?}", evaluate(&r));

    // A long-lived launcher waiting for its child in wait4 is not waiting for data either.
    let mut r = report();
    let mut launcher = thread(50, "bash", &[("ipc", 95.0)]);
    launcher.time.as_mut().unwrap().reasons[0].reason = "wait4".into();
    r.processes.push(process(50, None, "bash", vec![launcher]));
    r.processes.push(process(
        51,
        Some(50),
        "tar",
        vec![thread(51, "tar", &[("io", 20.0), ("cpu", 20.0)])],
    ));
    assert!(evaluate(&r).is_empty(), "{:#?}", evaluate(&r));
}

#[test]
fn impact_is_scaled_by_the_share_of_the_window_alive() {
    let mut r = report();
    let mut t = thread(100, "reader", &[]);
    t.time = Some(time(5 * SEC, &[("io", 60.0)]));
    r.processes.push(process(100, None, "reader", vec![t]));
    let fs = evaluate(&r);
    assert_eq!(fs[0].rule, "io-bound");
    assert_eq!(fs[0].impact_percent, 30.0);
    assert_eq!(fs[0].severity, "high");
    assert!(
        fs[0].title.contains("60% of its 5.00 s alive"),
        "{}",
        fs[0].title
    );
}

#[test]
fn oversubscribed_workers_get_cpu_advice() {
    let mut r = data_loading_job();
    for p in r.processes.iter_mut().skip(1) {
        *p = process(
            p.pid,
            Some(100),
            "w",
            vec![thread(
                p.pid,
                "w",
                &[("io", 20.0), ("cpu", 10.0), ("runqueue", 50.0)],
            )],
        );
    }
    let fs = evaluate(&r);
    let dl = fs.iter().find(|f| f.rule == "data-loading-bound").unwrap();
    assert!(
        dl.evidence[1].contains("waiting for a CPU 50%"),
        "{:?}",
        dl.evidence
    );
    assert!(dl.suggestions[0].contains("oversubscribed"));
}

#[test]
fn idle_feeder_threads_do_not_dilute_worker_shares() {
    let mut r = data_loading_job();
    for p in r.processes.iter_mut().skip(1) {
        let pid = p.pid;
        let block_io = p.block_io.clone();
        *p = process(
            pid,
            Some(100),
            "pt_data_worker",
            vec![
                thread(pid, "pt_data_worker", &[("io", 70.0), ("cpu", 20.0)]),
                // Mostly blocked on its condition variable, a little runnable and on CPU.
                thread(
                    pid + 10,
                    "QueueFeederThread",
                    &[("lock", 90.0), ("runqueue", 6.0), ("cpu", 1.0)],
                ),
            ],
        );
        p.block_io = block_io;
    }
    let f = &evaluate(&r)[0];
    assert_eq!(f.rule, "data-loading-bound");
    assert!(f.title.contains("spent 70% in disk I/O"), "{}", f.title);
    assert!(f.evidence[1].contains("over 20.00 s"), "{:?}", f.evidence);
}

fn site(
    category: &str,
    frame: &str,
    call: Option<&str>,
    ns: u64,
) -> crate::report::model::python::PySite {
    crate::report::model::python::PySite {
        category: category.into(),
        frame: frame.into(),
        call: call.map(str::to_string),
        ns,
        percent: 100.0 * ns as f64 / (10 * SEC) as f64,
    }
}

#[test]
fn findings_name_the_python_lines() {
    let mut r = data_loading_job();
    r.processes[0].threads[0].python_sites = vec![
        site("lock", "_next_data (dataloader.py:631)", None, 4 * SEC),
        site("ipc", "_recv (connection.py:416)", None, SEC),
        site("cpu", "not a wait (x.py:1)", None, SEC),
    ];
    let f = &evaluate(&r)[0];
    assert_eq!(f.rule, "data-loading-bound");
    assert!(
        f.title
            .contains("for data in `_next_data (dataloader.py:631)`"),
        "{}",
        f.title
    );
    assert!(
        f.evidence.iter().any(|e| e
            == "Python lines: _next_data (dataloader.py:631) 4.00 s, _recv (connection.py:416) 1.00 s"),
        "{:#?}",
        f.evidence
    );

    let mut c = sync_cuda(5000, 4 * SEC);
    c.copies.clear();
    let mut r = cuda_job(&[("cuda_sync", 40.0), ("cpu", 40.0)], c);
    r.processes[0].threads[0].python_sites = vec![
        site(
            "cuda_sync",
            "train_step (train.py:88)",
            Some("cudaDeviceSynchronize"),
            3 * SEC,
        ),
        site(
            "cuda_sync",
            "log (train.py:120)",
            Some("cudaDeviceSynchronize"),
            SEC,
        ),
    ];
    let f = &evaluate(&r)[0];
    assert_eq!(f.rule, "sync-heavy", "{f:#?}");
    assert!(
        f.title
            .ends_with("mostly cudaDeviceSynchronize called from `train_step (train.py:88)`"),
        "{}",
        f.title
    );
    assert!(f
        .evidence
        .iter()
        .any(|e| e == "cudaDeviceSynchronize called from `log (train.py:120)`: 1.00 s"));
}

#[test]
fn gil_contention_names_the_line_and_the_holder() {
    use crate::report::model::python::{GilReport, GilThread};
    let gt = |tid: Option<u32>, ns: u64, percent: f64| GilThread {
        tid,
        comm: String::new(),
        ns,
        percent,
    };
    let mut r = report();
    let mut waiter = thread(101, "python", &[("gil", 45.0), ("cpu", 55.0)]);
    waiter.python_sites = vec![site("gil", "handle (server.py:40)", None, 4 * SEC)];
    let mut p = process(
        100,
        None,
        "python",
        vec![
            thread(100, "python", &[("cpu", 90.0), ("gil", 10.0)]),
            waiter,
        ],
    );
    p.gil = Some(GilReport {
        wait_ns: 5 * SEC,
        waiters: vec![gt(Some(101), 4 * SEC, 80.0), gt(Some(100), SEC, 20.0)],
        holders: vec![gt(None, 3 * SEC, 60.0), gt(Some(100), 2 * SEC, 40.0)],
    });
    r.processes.push(p);
    let fs = evaluate(&r);
    let f = fs
        .iter()
        .find(|f| f.rule == "gil-contention")
        .expect("gil-contention");
    assert_eq!(f.tid, Some(101));
    assert!(
        f.title
            .contains("waited 45% of wall time for the GIL at `handle (server.py:40)`")
            && f.title
                .contains("the main thread of python (pid 100) held it 40%"),
        "{}",
        f.title
    );
    assert!(
        f.evidence[0].starts_with("1 thread(s)"),
        "{:#?}",
        f.evidence
    );
    // Below the threshold: nothing.
    r.processes[0].threads[1] = thread(101, "python", &[("gil", 10.0), ("cpu", 90.0)]);
    assert!(!rules(&r).contains(&"gil-contention".into()));
}

/// A report of one process (pid 100, `python`) of one thread with the time `cats`, its first
/// reason renamed `reason`.
fn lone(cats: &[(&str, f64)], reason: Option<&str>) -> Report {
    let mut r = report();
    let mut t = thread(100, "python", cats);
    if let Some(reason) = reason {
        t.time.as_mut().unwrap().reasons[0].reason = reason.into();
    }
    r.processes.push(process(100, None, "python", vec![t]));
    r
}

/// A process that did nothing in the window but wait: what it waited in is the lead.
#[test]
fn waiting_names_the_wait_when_nothing_else_fires() {
    let fs = evaluate(&lone(&[("ipc", 100.0)], Some("read")));
    assert_eq!(fs.len(), 1, "{fs:#?}");
    let f = &fs[0];
    assert_eq!(f.rule, "waiting");
    assert_eq!(f.severity, "low");
    assert_eq!((f.pid, f.tid), (Some(100), Some(100)));
    assert!(
        f.title
            .contains("spent 100% of wall time in `read` (ipc): it waits on another process"),
        "{}",
        f.title
    );
    assert!(f.suggestions[0].contains("/proc/PID/fd"), "{f:#?}");

    // Blocked in the kernel (a hung GPU kernel under an ioctl, say): the stack is the lead.
    let fs = evaluate(&lone(&[("other", 100.0)], Some("ioctl")));
    assert!(fs[0]
        .title
        .contains("`ioctl` (other): it is blocked in the kernel"));
    assert!(fs[0].suggestions[0].contains("offcpu.svg"));
}

#[test]
fn waiting_leaves_launchers_busy_processes_and_other_findings_alone() {
    // A launcher waiting for its child.
    let r = lone(&[("ipc", 100.0)], Some("wait4"));
    assert!(evaluate(&r).is_empty(), "{:#?}", evaluate(&r));
    // A process that works a little is not stalled.
    let r = lone(&[("cpu", 5.0), ("ipc", 95.0)], None);
    assert!(evaluate(&r).is_empty(), "{:#?}", evaluate(&r));
    // Nor is one whose idle threads would dilute a busy one.
    let mut r = report();
    let mut threads = vec![thread(100, "python", &[("ipc", 100.0)])];
    threads.extend((101..141).map(|tid| thread(tid, "idle", &[("lock", 100.0)])));
    threads.push(thread(141, "busy", &[("cpu", 60.0)]));
    r.processes.push(process(100, None, "python", threads));
    assert!(
        !rules(&r).contains(&"waiting".into()),
        "{:#?}",
        evaluate(&r)
    );
    // A launcher whose child is traced, however it waits (torchrun's agent polls).
    let mut r = lone(&[("ipc", 100.0)], Some("read"));
    r.processes[0].ppid = Some(50);
    r.processes.push(process(
        50,
        None,
        "torchrun",
        vec![thread(50, "torchrun", &[("poll", 100.0)])],
    ));
    let fs = evaluate(&r);
    assert_eq!(fs.len(), 1, "{fs:#?}");
    assert_eq!(fs[0].pid, Some(100));
    // A wait spread over several reasons names none.
    let r = lone(&[("ipc", 50.0), ("lock", 50.0)], None);
    assert!(evaluate(&r).is_empty(), "{:#?}", evaluate(&r));
    // Where another rule fires, the idle process beside it is no lead.
    let mut r = lone(&[("cpu", 90.0)], None);
    r.processes.push(process(
        200,
        None,
        "agent",
        vec![thread(200, "agent", &[("poll", 100.0)])],
    ));
    assert_eq!(rules(&r), vec!["cpu-bound"]);
}

/// A hung job (its main process reading a pipe all trace) beside an idle helper whose CUDA
/// memory was never freed: the low finding does not hide the lead, which ranks first. With a
/// thread busy somewhere, the job runs, and an idle process's wait is no lead.
#[test]
fn waiting_beside_low_findings_only_when_the_whole_job_is_idle() {
    let helper = |cats: &[(&str, f64)]| {
        let mut p = process(200, None, "helper", vec![thread(200, "helper", cats)]);
        p.cuda = Some(ProcessCuda {
            api: vec![api("cudaMalloc", 1, 1000)],
            memory: MemoryStat {
                never_freed: vec![Allocation {
                    function: "cudaMalloc".into(),
                    bytes: 512 << 20,
                    at_ns: SEC,
                }],
                ..Default::default()
            },
            ..Default::default()
        });
        p
    };
    let mut r = lone(&[("ipc", 100.0)], Some("read"));
    r.processes.push(helper(&[("sleep", 100.0)]));
    let fs = evaluate(&r);
    // The helper's own sleep is named too: with everything idle, each wait may be the lead.
    assert_eq!(
        fs.iter()
            .map(|f| (f.rule.as_str(), f.pid))
            .collect::<Vec<_>>(),
        vec![
            ("waiting", Some(100)),
            ("waiting", Some(200)),
            ("gpu-memory-not-freed", Some(200))
        ],
        "{fs:#?}"
    );

    let mut r = lone(&[("ipc", 100.0)], Some("read"));
    r.processes.push(helper(&[("cpu", 10.0), ("sleep", 90.0)]));
    assert_eq!(
        rules(&r),
        vec!["gpu-memory-not-freed"],
        "{:#?}",
        evaluate(&r)
    );
}

/// Threads folded out of a process's list (a thread storm) still count, by their mean: the
/// process's own breakdown holds them. Many nearly idle threads are not a busy one.
#[test]
fn a_job_is_idle_only_when_its_folded_threads_are_too() {
    let mut r = lone(&[("ipc", 100.0)], Some("read"));
    assert!(host::all_idle(&r));
    let busy = process(
        300,
        None,
        "storm",
        vec![thread(300, "storm", &[("cpu", 30.0)])],
    );
    let mut folded = process(300, None, "storm", vec![]);
    folded.time = busy.time.clone();
    folded.threads_not_listed = 1;
    r.processes.push(folded);
    assert!(!host::all_idle(&r));
    // 30 listed threads at 1% each: idle.
    let mut r = lone(&[("ipc", 100.0)], Some("read"));
    let helpers = (400..430)
        .map(|tid| thread(tid, "helper", &[("runqueue", 1.0), ("lock", 99.0)]))
        .collect();
    r.processes.push(process(400, None, "helpers", helpers));
    assert!(host::all_idle(&r));
}

/// NVML samples 100 ms apart (`n` of them): `util(i)` for the i-th.
fn nvml_series(n: u64, util: impl Fn(u64) -> u32) -> crate::report::model::cuda::Nvml {
    let mut nv = nvml(0.0);
    let g = &mut nv.gpus[0];
    let proto = g.samples[0].clone();
    g.samples = (0..n)
        .map(|i| crate::report::model::cuda::GpuSample {
            t_ns: i * SEC / 10,
            util_gpu: util(i),
            ..proto.clone()
        })
        .collect();
    g.mean_util_percent =
        g.samples.iter().map(|s| s.util_gpu as f64).sum::<f64>() / g.samples.len() as f64;
    nv
}

/// What an H100 showed: a Python loop preparing batches on CPU 67% of the time while the GPU
/// ran kernels 18% of it. The host thread is the bottleneck, named by its Python line.
#[test]
fn cpu_bound_below_70_percent_when_the_gpu_it_feeds_is_idle() {
    let mut r = cuda_job(
        &[("cpu", 67.0), ("cuda_memcpy", 15.0), ("lock", 15.0)],
        sync_cuda(100, SEC / 10),
    );
    {
        let t = &mut r.processes[0].threads[0];
        t.samples = 660;
        t.top_self = vec![f("PyObject_Free", 13.0, 88), f("PyObject_Malloc", 12.0, 82)];
        t.top_python = vec![
            f("prep_batch (train.py:15)", 71.0, 470),
            f("step (train.py:20)", 6.0, 40),
        ];
    }
    r.nvml = Some(nvml(18.0));
    let fs = evaluate(&r);
    let cpu = fs
        .iter()
        .find(|f| f.rule == "cpu-bound")
        .unwrap_or_else(|| panic!("{fs:#?}"));
    assert!(
        cpu.title
            .contains("hottest: Python: prep_batch (train.py:15) (71%)"),
        "{}",
        cpu.title
    );
    assert!(
        cpu.evidence[0].contains("71.0% under prep_batch (train.py:15)"),
        "{:?}",
        cpu.evidence
    );
    assert!(cpu.evidence.iter().any(|e| e.contains("GPU was busy 18%")));
    assert!(!cpu.suggestions.iter().any(|s| s.contains("py-spy")));
    // The same thread beside a busy GPU, or with no GPU figures: under 70%, not CPU-bound.
    r.nvml = Some(nvml(90.0));
    assert!(!rules(&r).contains(&"cpu-bound".to_string()));
    r.nvml = None;
    assert!(!rules(&r).contains(&"cpu-bound".to_string()));
    // A process without CUDA calls keeps the 70% bar even beside an idle GPU.
    r.nvml = Some(nvml(18.0));
    r.processes[0].cuda = None;
    assert!(!rules(&r).contains(&"cpu-bound".to_string()));
}

/// `gputrace -- python train.py`: seconds of imports before the first GPU allocation leave the
/// GPU idle; the loop after it keeps the GPU busy. Utilisation is judged from the allocation on
/// (an H100 trace of such a loop read 30% over the whole window and said "GPU idle").
#[test]
fn gpu_utilisation_is_judged_from_the_jobs_first_allocation() {
    let mut cuda = sync_cuda(500, 6 * SEC);
    cuda.memory = MemoryStat {
        live_bytes_series: vec![(12 * SEC, 1 << 30)],
        ..Default::default()
    };
    let mut r = cuda_job(&[("cuda_sync", 40.0), ("cpu", 55.0)], cuda);
    // 16 s at 10 Hz: idle for the first 12 s, 85% busy after (21% over the whole window).
    r.nvml = Some(nvml_series(160, |i| if i < 120 { 0 } else { 85 }));
    let rs = rules(&r);
    assert!(!rs.contains(&"gpu-idle".to_string()), "{rs:?}");
    let fs = evaluate(&r);
    let gb = fs.iter().find(|f| f.rule == "gpu-bound");
    assert!(
        gb.is_some_and(|f| f.title.contains("85%")
            && f.title
                .contains("since the job's first GPU allocation at 12.00 s")),
        "{fs:#?}"
    );

    // Without an allocation in the window (attached to a running job), every sample counts.
    if let Some(c) = r.processes[0].cuda.as_mut() {
        c.memory.live_bytes_series.clear();
    }
    assert!(rules(&r).contains(&"gpu-idle".to_string()));
    // An allocation too late to leave enough samples after it: every sample counts too.
    if let Some(c) = r.processes[0].cuda.as_mut() {
        c.memory.live_bytes_series = vec![(SEC * 155 / 10, 1 << 20)];
    }
    assert!(rules(&r).contains(&"gpu-idle".to_string()));
}

/// NVML's utilisation is the share of each sample period a kernel ran: a GPU at 18% in every
/// sample was idle most of the time without one idle sample, and the evidence says so.
#[test]
fn gpu_idle_evidence_reads_utilisation_as_a_share_of_time() {
    let mut r = cuda_job(&[("cpu", 30.0)], sync_cuda(10, SEC / 100));
    r.nvml = Some(nvml_series(44, |i| if i % 2 == 0 { 16 } else { 20 }));
    let fs = evaluate(&r);
    let idle = fs.iter().find(|f| f.rule == "gpu-idle").expect("gpu-idle");
    assert!(
        idle.evidence[0].contains("a kernel ran 18% of the time on average, at most 20%")
            && idle.evidence[0].contains("no kernel at all in 0 of 44 samples"),
        "{:?}",
        idle.evidence
    );
}
