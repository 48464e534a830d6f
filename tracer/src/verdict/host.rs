//! Rules on host time: data loading, I/O, CPU, contention.

use super::{
    cat_ns, cat_pct, finding, of_life, python_line, python_lines, substantial, thread_label,
    thresholds::*, top_reasons, weight,
};
use crate::report::{
    model::{time::TimeBreakdown, verdict::Finding, ProcessReport, Report, ThreadReport},
    units,
};

const WAIT: [&str; 3] = ["lock", "ipc", "poll"];
const BUSY: [&str; 3] = ["cpu", "io", "runqueue"];
/// Every off-CPU category but the CUDA ones.
const WAITS_ALL: [&str; 8] = ["io", "net", "ipc", "lock", "gil", "sleep", "poll", "other"];

/// Wall time of a set of processes by category, from their (process-level) breakdowns.
struct Sum {
    alive: u64,
    io: u64,
    cpu: u64,
    runqueue: u64,
    busy: u64,
}

/// The worker threads of worker processes: those alive long enough and busy (a queue feeder
/// thread idling beside the reading thread would dilute the shares).
fn worker_threads<'a>(r: &Report, ps: &[&'a ProcessReport]) -> Vec<&'a ThreadReport> {
    ps.iter()
        .flat_map(|p| &p.threads)
        .filter(|t| {
            t.time
                .as_ref()
                .is_some_and(|tb| substantial(r, tb) && cat_pct(tb, &BUSY) >= WORKER_MIN_BUSY)
        })
        .collect()
}

fn sum_threads(ts: &[&ThreadReport]) -> Sum {
    let mut s = Sum {
        alive: 0,
        io: 0,
        cpu: 0,
        runqueue: 0,
        busy: 0,
    };
    for th in ts {
        if let Some(t) = &th.time {
            s.alive += t.alive_ns;
            s.io += cat_ns(t, &["io"]);
            s.cpu += cat_ns(t, &["cpu"]);
            s.runqueue += cat_ns(t, &["runqueue"]);
            s.busy += cat_ns(t, &BUSY);
        }
    }
    s
}

/// Bytes the processes read: block-device reads when seen, else read-family syscall bytes.
fn bytes_read(ps: &[&ProcessReport]) -> u64 {
    let block: u64 = ps
        .iter()
        .flat_map(|p| &p.block_io)
        .map(|b| b.read_bytes)
        .sum();
    if block > 0 {
        return block;
    }
    ps.iter()
        .flat_map(|p| &p.syscalls)
        .filter(|s| s.name.contains("read"))
        .map(|s| s.bytes)
        .sum()
}

/// Every traced descendant of `pid`: DataLoader workers are children of the trainer, or
/// grandchildren under the forkserver start method.
fn descendants(r: &Report, pid: u32) -> Vec<&ProcessReport> {
    let mut out: Vec<&ProcessReport> = Vec::new();
    let mut frontier = vec![pid];
    while let Some(parent) = frontier.pop() {
        for c in r.processes.iter().filter(|c| c.ppid == Some(parent)) {
            if c.pid != pid && !out.iter().any(|o| o.pid == c.pid) {
                out.push(c);
                frontier.push(c.pid);
            }
        }
    }
    out
}

/// Waiting for a child to exit (a shell, a launcher), or a `vfork` child to exec (a spawn), is
/// not waiting for data.
const NOT_DATA: [&str; 6] = ["wait4", "waitid", "waitpid", "vfork", "clone", "clone3"];

/// ns a thread waited on queues, pipes, locks and polls, less waits for child exits.
fn data_wait_ns(t: &TimeBreakdown) -> u64 {
    let child_waits: u64 = t
        .reasons
        .iter()
        .filter(|r| WAIT.contains(&r.category.as_str()) && NOT_DATA.contains(&r.reason.as_str()))
        .map(|r| r.ns)
        .sum();
    cat_ns(t, &WAIT).saturating_sub(child_waits)
}

/// The thread of `p` alive long enough that waits most for data, with its wait share.
fn most_waiting<'a>(r: &Report, p: &'a ProcessReport) -> Option<(&'a ThreadReport, f64)> {
    p.threads
        .iter()
        .filter_map(|t| t.time.as_ref().map(|tb| (t, tb)))
        .filter(|(_, tb)| substantial(r, tb))
        .map(|(t, tb)| (t, units::pct(data_wait_ns(tb), tb.alive_ns)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
}

/// data-loading-bound: a trainer thread waits on queues/pipes/locks while worker processes
/// (its children) or sibling loader threads do the I/O and decoding. Returns each finding with
/// the pids and tids it explains.
pub fn data_loading(r: &Report) -> Vec<(Finding, Vec<u32>)> {
    let mut out = Vec::new();
    for p in &r.processes {
        let Some((trainer, wait)) = most_waiting(r, p) else {
            continue;
        };
        if wait < DATA_WAIT_MIN {
            continue;
        }
        let children: Vec<&ProcessReport> = descendants(r, p.pid)
            .into_iter()
            .filter(|c| {
                // Idle helpers (a forkserver, a resource tracker) are no workers.
                c.threads
                    .iter()
                    .filter_map(|t| t.time.as_ref())
                    .any(|tb| substantial(r, tb) && cat_pct(tb, &BUSY) >= WORKER_MIN_BUSY)
            })
            .collect();
        let (sum, n, what, explained, read) = if !children.is_empty() {
            let s = sum_threads(&worker_threads(r, &children));
            let ids = children.iter().map(|c| c.pid).collect::<Vec<_>>();
            let read = bytes_read(&children);
            (s, children.len(), "worker processes", ids, read)
        } else if trainer.tid == p.pid {
            // Only the main thread: in a worker process, a helper thread (a queue feeder)
            // waiting on a condition variable while the main thread reads is no trainer.
            let loaders: Vec<&ThreadReport> = p
                .threads
                .iter()
                .filter(|t| t.tid != trainer.tid)
                .filter(|t| {
                    t.time.as_ref().is_some_and(|tb| {
                        substantial(r, tb) && cat_pct(tb, &["io"]) >= WORKER_THREAD_IO_MIN
                    })
                })
                .collect();
            if loaders.is_empty() {
                continue;
            }
            let s = sum_threads(&loaders);
            let ids = loaders.iter().map(|t| t.tid).collect();
            (s, loaders.len(), "loader threads", ids, bytes_read(&[p]))
        } else {
            continue;
        };
        let busy = units::pct(sum.busy, sum.alive);
        if busy < WORKER_BUSY_MIN {
            continue;
        }
        let io = units::pct(sum.io, sum.alive);
        let cpu = units::pct(sum.cpu, sum.alive);
        let rq = units::pct(sum.runqueue, sum.alive);
        let tb = trainer.time.as_ref().expect("filtered on time");
        let rate = if read > 0 {
            format!(" at {}", units::rate(read, r.window.duration_ns))
        } else {
            String::new()
        };
        let at = python_line(trainer, &WAIT)
            .map(|(f, _)| format!(" in `{f}`"))
            .unwrap_or_default();
        let title = format!(
            "{} waited {:.0}% {} for data{at}; its {} {} spent {:.0}% in disk I/O{} \
             and {:.0}% on CPU",
            capitalize(&thread_label(p, trainer)),
            wait,
            of_life(r, tb),
            n,
            what,
            io,
            rate,
            cpu
        );
        let mut evidence = vec![
            format!(
                "waiting: lock {:.1}%, ipc {:.1}%, poll {:.1}% of {}",
                cat_pct(tb, &["lock"]),
                cat_pct(tb, &["ipc"]),
                cat_pct(tb, &["poll"]),
                units::dur(tb.alive_ns)
            ),
            format!(
                "{what}: {:.0}% busy (io {:.0}%, cpu {:.0}%{}) over {}",
                busy,
                io,
                cpu,
                if rq >= 1.0 {
                    format!(", waiting for a CPU {rq:.0}%")
                } else {
                    String::new()
                },
                units::dur(sum.alive)
            ),
        ];
        let mut waits = tb.clone();
        waits
            .reasons
            .retain(|r| !NOT_DATA.contains(&r.reason.as_str()));
        let reasons = top_reasons(&waits, &WAIT, 3);
        if !reasons.is_empty() {
            evidence.push(format!("waits: {reasons}"));
        }
        evidence.extend(python_lines(trainer, &WAIT, 3));
        if read > 0 {
            evidence.push(format!(
                "{what} read {} in {}",
                units::bytes(read),
                units::dur(r.window.duration_ns)
            ));
        }
        let mut sugg = vec![];
        if rq > io && rq > cpu {
            sugg.push(
                "The workers mostly wait for a CPU: the machine is oversubscribed. Use fewer \
                 workers than free cores, or give the job more CPUs.",
            );
        } else if io >= cpu {
            sugg.push(
                "Loading is I/O-bound: cache or pre-shard the dataset on local NVMe or in RAM, \
                 read larger sequential chunks, and raise DataLoader prefetch_factor.",
            );
            sugg.push(
                "More DataLoader workers (num_workers) overlap more reads, up to what the disk \
                 can serve.",
            );
        } else if cpu_demand(r, all_cpu_ns(r)) + 0.5 >= r.sampling.cpus as f64 {
            sugg.push(
                "Loading is CPU-bound in the workers (decoding, augmentation), and the job \
                 keeps every core busy: more workers would not help. Cache decoded samples, \
                 make decoding cheaper, or move augmentation to the GPU (e.g. DALI, \
                 torchvision.transforms.v2 on tensors).",
            );
        } else {
            sugg.push(
                "Loading is CPU-bound in the workers (decoding, augmentation): raise \
                 DataLoader num_workers toward the free cores, cache decoded samples, or move \
                 augmentation to the GPU (e.g. DALI, torchvision.transforms.v2 on tensors).",
            );
        }
        sugg.push(
            "Use persistent_workers=True and pin_memory=True so batches are ready when asked for.",
        );
        out.push((
            finding(
                "data-loading-bound",
                wait * weight(r, tb.alive_ns),
                title,
                evidence,
                sugg,
                Some(p.pid),
                Some(trainer.tid),
            ),
            explained,
        ));
    }
    out
}

/// io-bound: a thread spends a large share of its time blocked on disk or file I/O.
pub fn io_bound(r: &Report, explained: &[u32]) -> Vec<Finding> {
    let mut out = Vec::new();
    for p in r.processes.iter().filter(|p| !explained.contains(&p.pid)) {
        let best = p
            .threads
            .iter()
            .filter(|t| !explained.contains(&t.tid))
            .filter_map(|t| t.time.as_ref().map(|tb| (t, tb)))
            .filter(|(_, tb)| substantial(r, tb))
            .map(|(t, tb)| (t, cat_pct(tb, &["io"])))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        let Some((t, io)) = best else { continue };
        if io < IO_MIN {
            continue;
        }
        let tb = t.time.as_ref().expect("filtered on time");
        let life = of_life(r, tb);
        let read = bytes_read(&[p]);
        let mut evidence = vec![format!(
            "io {} of {} alive",
            units::dur(cat_ns(tb, &["io"])),
            units::dur(tb.alive_ns)
        )];
        let reasons = top_reasons(tb, &["io"], 3);
        if !reasons.is_empty() {
            evidence.push(format!("blocked in: {reasons}"));
        }
        evidence.extend(python_lines(t, &["io"], 3));
        for b in p.block_io.iter().take(2) {
            let lat = b
                .total_ns
                .checked_div(b.requests)
                .map(units::dur)
                .unwrap_or_else(|| "-".into());
            evidence.push(format!(
                "block device {}: {} requests, read {}, written {}, mean latency {}",
                b.device,
                b.requests,
                units::bytes(b.read_bytes),
                units::bytes(b.write_bytes),
                lat
            ));
        }
        let mut files = p.files.clone();
        files.sort_by_key(|f| std::cmp::Reverse(f.ns));
        for f in files.iter().take(3) {
            evidence.push(format!(
                "file {}: {} in {} calls, {}",
                f.file,
                units::dur(f.ns),
                f.calls,
                units::bytes(f.bytes)
            ));
        }
        // Many small files (one per sample) say more as their directory.
        if let Some(d) = p.dirs.first().filter(|d| d.files > 3) {
            evidence.push(format!(
                "directory {}: {} files, {} in {} calls, {}",
                d.dir,
                d.files,
                units::dur(d.ns),
                d.calls,
                units::bytes(d.bytes)
            ));
        }
        let rate = if read > 0 {
            format!(", reading {}", units::rate(read, r.window.duration_ns))
        } else {
            String::new()
        };
        out.push(finding(
            "io-bound",
            io * weight(r, tb.alive_ns),
            format!(
                "{} spent {:.0}% {life} blocked on disk I/O{}{}",
                capitalize(&thread_label(p, t)),
                io,
                python_line(t, &["io"])
                    .map(|(f, _)| format!(" in `{f}`"))
                    .unwrap_or_default(),
                rate
            ),
            evidence,
            vec![
                "Read less or read it once: cache hot files in RAM (page cache, /dev/shm) or on \
                 local NVMe instead of network storage.",
                "Prefer few large sequential reads (sharded record files, e.g. WebDataset) over \
                 many small random ones.",
                "Overlap I/O with compute: background loader workers, prefetching, async I/O.",
            ],
            Some(p.pid),
            Some(t.tid),
        ));
    }
    out
}

/// On-CPU share of a thread: from time accounting when present, else from its samples.
/// Time inside CUDA calls is the CUDA rules' business: when the accounting did not charge it
/// to the cuda_* categories (or there is no accounting), the process's CUDA call time is taken
/// off, so a launch- or copy-bound thread is not also called CPU-bound.
fn on_cpu(r: &Report, p: &ProcessReport, t: &ThreadReport) -> Option<f64> {
    let cuda_ns: u64 = p.cuda.iter().flat_map(|c| &c.api).map(|a| a.total_ns).sum();
    if let Some(tb) = &t.time {
        if !substantial(r, tb) {
            return None;
        }
        let charged = tb
            .categories
            .iter()
            .any(|c| c.category.starts_with("cuda_"));
        let cpu = cat_ns(tb, &["cpu"]);
        let cpu = if charged {
            cpu
        } else {
            cpu.saturating_sub(cuda_ns)
        };
        return Some(units::pct(cpu, tb.alive_ns) * weight(r, tb.alive_ns));
    }
    let possible = r.sampling.frequency_hz as f64 * r.window.duration_ns as f64 / 1e9;
    let in_cuda = units::pct(cuda_ns, r.window.duration_ns);
    (possible > 0.0 && t.samples > 0)
        .then(|| ((t.samples as f64 * 100.0 / possible).min(100.0) - in_cuda).max(0.0))
}

/// cpu-bound: a thread is on CPU nearly all of its time; names the functions that burn it.
pub fn cpu_bound(r: &Report, explained: &[u32]) -> Vec<Finding> {
    let mut out = Vec::new();
    for p in r.processes.iter().filter(|p| !explained.contains(&p.pid)) {
        let best = p
            .threads
            .iter()
            .filter(|t| !explained.contains(&t.tid))
            .filter_map(|t| on_cpu(r, p, t).map(|c| (t, c)))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        let Some((t, cpu)) = best else { continue };
        // A CUDA process whose GPU sat mostly idle: the host thread that feeds it is the
        // bottleneck well before it is on CPU nearly all the time (an H100 trace of a loop
        // preparing batches in Python: 67% on CPU, the GPU 18% busy).
        let util = p
            .cuda
            .as_ref()
            .filter(|c| !c.api.is_empty())
            .and_then(|_| super::gpu::gpu_util(r))
            .filter(|&u| u < GPU_IDLE_UTIL);
        if cpu
            < if util.is_some() {
                CPU_MIN_GPU_IDLE
            } else {
                CPU_MIN
            }
        {
            continue;
        }
        let fns = if t.top_self.is_empty() {
            &p.top_self
        } else {
            &t.top_self
        };
        let py = if t.samples > 0 {
            &t.top_python
        } else {
            &p.top_python
        };
        // Python lines name the work better than the interpreter's own functions under them
        // (PyObject_Malloc, _PyEval_EvalFrameDefault): py-spy's view, first.
        let py_hot = py.first().is_some_and(|f| f.percent >= PYTHON_LINE_MIN);
        let hot = if py_hot {
            format!(
                "Python: {}",
                py.iter()
                    .take(3)
                    .map(|f| format!("{} ({:.0}%)", f.function, f.percent))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        } else {
            fns.iter()
                .take(3)
                .map(|f| format!("{} ({:.0}%)", f.function, f.percent))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut evidence: Vec<String> = Vec::new();
        if py_hot {
            evidence.extend(
                py.iter()
                    .take(3)
                    .map(|f| format!("{:.1}% under {} (Python)", f.percent, f.function)),
            );
        }
        if let Some(u) = util {
            evidence.push(format!(
                "meanwhile the GPU was busy {u:.0}% of the time (NVML): this thread feeds it"
            ));
        }
        evidence.extend(fns.iter().take(if py_hot { 3 } else { 5 }).map(|f| {
            format!(
                "{:.1}% {}{}",
                f.percent,
                f.function,
                f.module
                    .as_deref()
                    .filter(|m| !crate::symbolize::names_only_its_module(&f.function, Some(m)))
                    .map(|m| format!(" {}", crate::symbolize::module_label(m)))
                    .unwrap_or_default()
            )
        }));
        if t.samples > 0 {
            evidence.push(format!(
                "{} samples, {:.0}% in the kernel",
                t.samples,
                units::pct(t.kernel_samples, t.samples)
            ));
        }
        let source = if t.time.is_some() {
            "time accounting"
        } else {
            "CPU samples"
        };
        evidence.push(format!("on-CPU share from {source}"));
        let mut sugg = vec![
            "Optimise the functions named above, or move that work off the training loop \
             (DataLoader workers, a preprocessing job).",
        ];
        if units::pct(t.kernel_samples, t.samples.max(1)) >= 30.0 {
            sugg.push(
                "Much of it is kernel time: look at the syscalls below (small reads/writes, \
                 page faults) and batch them.",
            );
        }
        if py_hot {
            sugg.push(
                "The Python lines above hold the CPU (with the native code they call): \
                 vectorise them (NumPy/torch ops), cache what they compute, or move them into \
                 DataLoader workers.",
            );
        } else if p.comm.starts_with("python") || fns.iter().any(|f| f.function.contains("_PyEval"))
        {
            sugg.push(
                "Python interpreter frames without Python lines (the frame walk did not \
                 resolve them; see the report's warnings): vectorise the loop (NumPy/torch \
                 ops), or use py-spy to see which Python lines are hot.",
            );
        }
        out.push(finding(
            "cpu-bound",
            cpu,
            format!(
                "{} was on CPU {:.0}% of wall time{}",
                capitalize(&thread_label(p, t)),
                cpu,
                if hot.is_empty() {
                    String::new()
                } else {
                    format!("; hottest: {hot}")
                }
            ),
            evidence,
            sugg,
            Some(p.pid),
            Some(t.tid),
        ));
    }
    out
}

/// cpu-contention: threads are runnable but wait for a CPU.
pub fn cpu_contention(r: &Report) -> Vec<Finding> {
    let mut worst: Option<(&ProcessReport, &ThreadReport, f64)> = None;
    let mut waiting_threads = 0;
    let mut cpu_ns = 0u64;
    for p in &r.processes {
        for t in &p.threads {
            let Some(tb) = &t.time else { continue };
            cpu_ns += cat_ns(tb, &["cpu"]);
            if !substantial(r, tb) {
                continue;
            }
            let rq = cat_pct(tb, &["runqueue"]);
            if rq >= RUNQUEUE_MIN / 2.0 {
                waiting_threads += 1;
            }
            if worst.is_none_or(|w| rq > w.2) {
                worst = Some((p, t, rq));
            }
        }
    }
    let Some((p, t, rq)) = worst else {
        return vec![];
    };
    if rq < RUNQUEUE_MIN {
        return vec![];
    }
    let tb = t.time.as_ref().expect("filtered on time");
    let demand = cpu_demand(r, cpu_ns);
    let life = of_life(r, tb);
    let evidence = vec![
        format!(
            "runnable but not running {} of {} alive",
            units::dur(cat_ns(tb, &["runqueue"])),
            units::dur(tb.alive_ns)
        ),
        format!(
            "{waiting_threads} thread(s) waited >= {:.0}% of their time for a CPU",
            RUNQUEUE_MIN / 2.0
        ),
        format!(
            "traced threads kept {:.1} CPUs busy on average; the machine has {}",
            demand, r.sampling.cpus
        ),
    ];
    vec![finding(
        "cpu-contention",
        rq * weight(r, tb.alive_ns),
        format!(
            "{} waited {:.0}% {life} for a CPU (runnable, not running)",
            capitalize(&thread_label(p, t)),
            rq
        ),
        evidence,
        contention_advice(demand, r.sampling.cpus),
        Some(p.pid),
        Some(t.tid),
    )]
}

/// cpu-category time of every traced thread.
fn all_cpu_ns(r: &Report) -> u64 {
    r.processes
        .iter()
        .flat_map(|p| &p.threads)
        .filter_map(|t| t.time.as_ref())
        .map(|tb| cat_ns(tb, &["cpu"]))
        .sum()
}

/// How many CPUs the traced threads kept busy on average, from their `cpu_ns` of cpu-category
/// time. That category leaves out CPU time inside CUDA calls (charged to their categories,
/// all of a launch storm's), where the CPU samples count it: the larger of the two.
fn cpu_demand(r: &Report, cpu_ns: u64) -> f64 {
    let window_s = r.window.duration_ns.max(1) as f64 / 1e9;
    let sampled = r.sampling.samples as f64 / r.sampling.frequency_hz.max(1) as f64 / window_s;
    (cpu_ns as f64 / r.window.duration_ns.max(1) as f64).max(sampled)
}

/// What to do about waits for a CPU, by who holds the CPUs: the job itself, when it keeps
/// most of them busy, else something outside it (another job, a CPU quota), where fewer
/// threads in the job would not help.
fn contention_advice(demand: f64, cpus: usize) -> Vec<&'static str> {
    if demand >= 0.5 * cpus as f64 {
        vec![
            "Fewer runnable threads than cores: lower DataLoader num_workers, OMP_NUM_THREADS / \
             torch.set_num_threads, or intra-op thread pools.",
            "Check the container's CPU quota (cpu.max) and other jobs on the machine; pin the \
             trainer to its own cores (taskset, numactl).",
        ]
    } else {
        vec![
            "The traced threads keep under half the CPUs busy: the CPUs go to something else. \
             Look for other jobs on the machine (top, pidstat) and the container's CPU quota \
             (cpu.max, throttling in cpu.stat).",
            "Pin the trainer to cores of its own (taskset, numactl, a cpuset), away from the \
             other work.",
        ]
    }
}

/// gil-contention: a Python thread waits a large share of its life for the GIL. Names the
/// Python line it waits at and the thread that held the GIL most while it waited.
pub fn gil_contention(r: &Report) -> Vec<Finding> {
    let mut out = Vec::new();
    for p in &r.processes {
        let Some(gil) = &p.gil else { continue };
        let best = p
            .threads
            .iter()
            .filter_map(|t| t.time.as_ref().map(|tb| (t, tb)))
            .filter(|(_, tb)| substantial(r, tb))
            .map(|(t, tb)| (t, tb, cat_pct(tb, &["gil"])))
            .max_by(|a, b| a.2.total_cmp(&b.2));
        let Some((t, tb, pct)) = best else { continue };
        if pct < GIL_WAIT_MIN {
            continue;
        }
        let waiting = gil
            .waiters
            .iter()
            .filter(|w| {
                p.threads.iter().any(|x| {
                    Some(x.tid) == w.tid
                        && x.time.as_ref().is_some_and(|b| {
                            substantial(r, b) && cat_pct(b, &["gil"]) >= GIL_WAIT_MIN
                        })
                })
            })
            .count();
        let holder = gil.holders.iter().find(|h| h.tid.is_some());
        let held = holder
            .map(|h| {
                let name = p
                    .threads
                    .iter()
                    .find(|x| Some(x.tid) == h.tid)
                    .map(|x| thread_label(p, x))
                    .unwrap_or_else(|| format!("tid {}", h.tid.unwrap_or(0)));
                format!("; {name} held it {:.0}% of the time waited", h.percent)
            })
            .unwrap_or_default();
        let at = python_line(t, &["gil"])
            .map(|(f, _)| format!(" at `{f}`"))
            .unwrap_or_default();
        let mut evidence = vec![format!(
            "{} thread(s) waited over {GIL_WAIT_MIN:.0}% of their life for the GIL; {} in all",
            waiting,
            units::dur(gil.wait_ns)
        )];
        for h in gil.holders.iter().take(3) {
            evidence.push(match h.tid {
                Some(tid) => format!(
                    "held by tid {tid}{}: {:.0}% of the wait",
                    if h.comm.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", h.comm)
                    },
                    h.percent
                ),
                None => format!("being handed over: {:.0}% of the wait", h.percent),
            });
        }
        evidence.extend(python_lines(t, &["gil"], 3));
        out.push(finding(
            "gil-contention",
            pct * weight(r, tb.alive_ns),
            format!(
                "{} waited {pct:.0}% {} for the GIL{at}{held}",
                capitalize(&thread_label(p, t)),
                of_life(r, tb),
            ),
            evidence,
            vec![
                "Threads that run Python code take turns on one GIL: move the CPU-heavy Python \
                 work to processes (multiprocessing, DataLoader num_workers) or into code that \
                 releases the GIL (NumPy, PyTorch ops, C extensions).",
                "A thread that needs to react quickly waits behind the holder's switch interval \
                 (sys.getswitchinterval(), 5 ms by default).",
            ],
            Some(p.pid),
            Some(t.tid),
        ));
    }
    out
}

/// What a wait in each category means, and what to look at next.
fn waiting_on(category: &str) -> (&'static str, &'static str) {
    match category {
        "ipc" => (
            "it waits on another process (a pipe, a socket pair, a terminal, a child)",
            "Find the other end: `ls -l /proc/PID/fd` names the pipe or socket, and `gputrace \
             --pid` on the process that should write to it shows why it does not.",
        ),
        "net" => (
            "it waits on the network",
            "Look at the peer (a data service, a parameter server, another rank): `ss -tnp` \
             shows the connection; trace the peer if it runs here.",
        ),
        "lock" => (
            "it waits on a lock another thread holds",
            "Find the holder: the off-CPU flame graph (offcpu.svg) shows where each thread \
             waits; for native code `gdb -p PID -batch -ex 'thread apply all bt'`.",
        ),
        "poll" => (
            "it waits for events that do not come (poll/epoll/select)",
            "An event loop with nothing to do: the work it waits for is elsewhere (another \
             process, a remote service).",
        ),
        "sleep" => (
            "it sleeps",
            "A sleep loop (a retry, a back-off, a polling interval): find what it waits for \
             in the Python lines or the off-CPU flame graph.",
        ),
        _ => (
            "it is blocked in the kernel",
            "The kernel stack in the off-CPU flame graph (offcpu.svg) says in what (a driver \
             such as the GPU's for a hung kernel, a filesystem, a device).",
        ),
    }
}

/// What each of `p`'s listed threads spent on CPU, runnable or in disk I/O (ns).
fn busy_ns(p: &ProcessReport) -> impl Iterator<Item = u64> + '_ {
    p.threads
        .iter()
        .filter_map(|t| t.time.as_ref())
        .map(|tb| cat_ns(tb, &BUSY))
}

/// The largest share of the window one of `p`'s threads spent on CPU, runnable or in disk I/O
/// (per thread: 40 idle threads do not hide a busy one).
fn busiest_thread(r: &Report, p: &ProcessReport) -> f64 {
    units::pct(busy_ns(p).max().unwrap_or(0), r.window.duration_ns)
}

/// Whether no traced process did anything to speak of in the window: the whole job is
/// stalled. Thread by thread, as `waiting` judges (many nearly idle threads are not a busy
/// one); the threads folded out of the list by their mean (the process's breakdown holds
/// them, less what the listed ones hold).
pub fn all_idle(r: &Report) -> bool {
    r.processes.iter().all(|p| {
        let folded = match (p.time.as_ref(), p.threads_not_listed) {
            (Some(pt), n) if n > 0 => {
                let rest = cat_ns(pt, &BUSY).saturating_sub(busy_ns(p).sum());
                units::pct(rest / n, r.window.duration_ns)
            }
            _ => 0.0,
        };
        busiest_thread(r, p).max(folded) < WAITING_BUSY_MAX
    })
}

/// waiting: when no other rule fires (or only low ones while the whole job is idle), a process
/// that did next to nothing in the window (each of its threads on CPU, runnable or in disk I/O
/// under 2% of the window) while its main thread spent most of it in one wait. A launcher is
/// left out (one waiting for a child, or one whose children are traced: however it waits,
/// they are the story).
pub fn waiting(r: &Report) -> Vec<Finding> {
    let mut out = Vec::new();
    for p in &r.processes {
        let Some(pt) = p.time.as_ref() else { continue };
        let busy = busiest_thread(r, p);
        if !substantial(r, pt)
            || busy >= WAITING_BUSY_MAX
            || r.processes.iter().any(|c| c.ppid == Some(p.pid))
        {
            continue;
        }
        let Some((t, tb)) = p
            .threads
            .iter()
            .find(|t| t.tid == p.pid)
            .and_then(|t| t.time.as_ref().map(|tb| (t, tb)))
            .filter(|(_, tb)| substantial(r, tb))
        else {
            continue;
        };
        let Some(top) = tb.reasons.iter().max_by_key(|x| x.ns) else {
            continue;
        };
        let share = units::pct(top.ns, tb.alive_ns);
        if share < WAITING_ONE_MIN
            || NOT_DATA.contains(&top.reason.as_str())
            || top.category.starts_with("cuda")
            || top.category == "gil"
        {
            continue;
        }
        let (what, next) = waiting_on(&top.category);
        let title = format!(
            "{} spent {:.0}% {} in `{}` ({}): {what}",
            capitalize(&thread_label(p, t)),
            share,
            of_life(r, tb),
            top.reason,
            top.category,
        );
        let mut evidence = vec![
            format!(
                "pid {}: on CPU {:.1}%, waiting for a CPU {:.1}%, disk I/O {:.1}% of its threads' \
                 {} alive",
                p.pid,
                cat_pct(pt, &["cpu"]),
                cat_pct(pt, &["runqueue"]),
                cat_pct(pt, &["io"]),
                units::dur(pt.alive_ns)
            ),
            format!("waits: {}", top_reasons(tb, &WAITS_ALL, 3)),
        ];
        evidence.extend(python_lines(t, &[top.category.as_str()], 3));
        if p.threads.len() > 1 {
            evidence.push(format!(
                "its {} listed threads: none on CPU, runnable or in disk I/O {:.0}% of the \
                 window or more",
                p.threads.len(),
                WAITING_BUSY_MAX
            ));
        }
        let mut f = finding(
            "waiting",
            share * weight(r, tb.alive_ns),
            title,
            evidence,
            vec![next],
            Some(p.pid),
            Some(t.tid),
        );
        // A lead, not a bottleneck of the process's own doing.
        f.severity = "low".into();
        out.push(f);
    }
    out
}

pub(crate) fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().collect::<String>() + c.as_str(),
        None => String::new(),
    }
}
