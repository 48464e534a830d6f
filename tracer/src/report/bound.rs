//! Keeps the report's size bounded however many processes the trace followed: processes with
//! nothing to show beyond the first few are counted, not listed, and so are the lightest of
//! those beyond a fixed number (a fork storm's children each caught by one sample). The same
//! for a process's threads: a job that starts a thread per request lists its heaviest threads,
//! not the thousands an hour of it makes.

use super::model::{ProcessReport, Report, ThreadReport};

/// Processes with nothing to show that are still listed (a few show that children were seen).
pub const MAX_IDLE_PROCESSES: usize = 32;

/// Processes listed at most besides the targets. A training job's data-loader workers and
/// torch.compile's worker pool (up to 32) fit; past this, a process is one of thousands of short-lived
/// children and the flame graph (which keeps every sample) says more than its entry would.
pub const MAX_LISTED_PROCESSES: usize = 64;

/// Threads listed at most per process. A training process's own threads (the main thread,
/// data-loader and pin-memory threads, CUDA's, a thread pool per core) fit; each listed thread
/// costs the report about a kilobyte.
pub const MAX_LISTED_THREADS: usize = 128;

/// What was left out of `processes`, so that the report can say so.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Unlisted {
    /// Idle processes beyond the first `max_idle`.
    pub idle: u64,
    /// The lightest processes beyond `max_listed`.
    pub light: u64,
    /// CPU samples the light ones held between them (still in cpu.folded).
    pub light_samples: u64,
    /// CUDA calls the light ones made between them (in no table of the report once they are
    /// not listed), and the bytes they copied.
    pub light_cuda_calls: u64,
    pub light_copied_bytes: u64,
}

impl Unlisted {
    pub fn total(&self) -> u64 {
        self.idle + self.light
    }
}

/// A process is idle (worth counting, not listing) when it has no CPU samples, no CUDA, no
/// block I/O, and lived for only a sliver of the window: what a fork storm's children look like.
fn is_idle(p: &ProcessReport, window_ns: u64) -> bool {
    let short = (window_ns / 200).max(10_000_000);
    p.samples == 0
        && p.block_io.is_empty()
        && p.cuda.is_none()
        && p.time.as_ref().is_none_or(|t| t.alive_ns < short)
}

/// How much a process shows, for choosing which to keep: CUDA first (the question this tool
/// answers), then its samples as CPU time plus the wall time it was traced for, so that an
/// I/O-bound worker with no samples outranks a child that lived a millisecond.
fn weight(p: &ProcessReport, sample_period_ns: u64) -> (bool, u64) {
    let alive = p.time.as_ref().map_or(0, |t| t.alive_ns);
    (
        p.cuda.is_some(),
        p.samples
            .saturating_mul(sample_period_ns)
            .saturating_add(alive),
    )
}

/// Removes idle processes beyond `max_idle`, then the lightest beyond `max_listed` (targets
/// always stay, the rest keep their order); records the count in `report.followed.not_listed`.
pub fn limit_processes(report: &mut Report, max_idle: usize, max_listed: usize) -> Unlisted {
    let roots = report.target.pids.clone();
    let window_ns = report.window.duration_ns;
    let mut out = Unlisted::default();

    let mut idle_kept = 0usize;
    let before = report.processes.len();
    report.processes.retain(|p| {
        if roots.contains(&p.pid) || !is_idle(p, window_ns) {
            return true;
        }
        idle_kept += 1;
        idle_kept <= max_idle
    });
    out.idle = (before - report.processes.len()) as u64;

    let period_ns = 1_000_000_000 / report.sampling.frequency_hz.max(1);
    let others: Vec<(usize, (bool, u64))> = report
        .processes
        .iter()
        .enumerate()
        .filter(|(_, p)| !roots.contains(&p.pid))
        .map(|(i, p)| (i, weight(p, period_ns)))
        .collect();
    for p in drop_lightest(&mut report.processes, others, max_listed) {
        out.light += 1;
        out.light_samples += p.samples;
        if let Some(c) = &p.cuda {
            out.light_cuda_calls += c.api.iter().map(|a| a.count).sum::<u64>();
            out.light_copied_bytes += c.copies.iter().map(|x| x.bytes).sum::<u64>();
        }
    }
    report.followed.not_listed += out.total();
    out
}

/// Removes the items `ranked` (index, weight) names beyond its `max` heaviest and returns
/// them; the rest keep their order. Among equal weights the earlier-listed item stays.
fn drop_lightest<T, W: Ord>(items: &mut Vec<T>, mut ranked: Vec<(usize, W)>, max: usize) -> Vec<T> {
    if ranked.len() <= max {
        return Vec::new();
    }
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut drop = vec![false; items.len()];
    for &(i, _) in &ranked[max..] {
        drop[i] = true;
    }
    let (dropped, kept): (Vec<_>, Vec<_>) = std::mem::take(items)
        .into_iter()
        .zip(drop)
        .partition(|(_, d)| *d);
    *items = kept.into_iter().map(|(t, _)| t).collect();
    dropped.into_iter().map(|(t, _)| t).collect()
}

/// How much a thread shows, for choosing which to list: its CPU samples as CPU time plus the
/// wall time it was traced for, so that a worker blocked all along outranks a thread that
/// lived a millisecond. The main thread always stays.
fn thread_weight(t: &ThreadReport, pid: u32, sample_period_ns: u64) -> (bool, u64) {
    let alive = t.time.as_ref().map_or(0, |b| b.alive_ns);
    (
        t.tid == pid,
        t.samples
            .saturating_mul(sample_period_ns)
            .saturating_add(alive),
    )
}

/// The threads of one process that the report does not list.
#[derive(Debug, PartialEq)]
pub struct UnlistedThreads {
    pub pid: u32,
    /// (tid, comm) of each.
    pub threads: Vec<(u32, String)>,
}

/// Keeps each process's `max_listed` heaviest threads, in their order; returns the threads
/// left out of each process that had more, and sums the listed processes' unlisted threads
/// into `report.followed`. The process's own figures (time, syscalls, samples) were summed
/// over every thread and stay.
pub fn limit_threads(report: &mut Report, max_listed: usize) -> Vec<UnlistedThreads> {
    let period_ns = 1_000_000_000 / report.sampling.frequency_hz.max(1);
    let mut out = Vec::new();
    for p in report.processes.iter_mut() {
        if p.threads.len() <= max_listed {
            continue;
        }
        let ranked: Vec<(usize, (bool, u64))> = p
            .threads
            .iter()
            .enumerate()
            .map(|(i, t)| (i, thread_weight(t, p.pid, period_ns)))
            .collect();
        let threads: Vec<(u32, String)> = drop_lightest(&mut p.threads, ranked, max_listed)
            .into_iter()
            .map(|t| (t.tid, t.comm))
            .collect();
        p.threads_not_listed += threads.len() as u64;
        out.push(UnlistedThreads {
            pid: p.pid,
            threads,
        });
    }
    // Over the processes still listed: a process dropped from the list takes its threads
    // along (folded threads were counted in it before the list was bounded).
    report.followed.threads_not_listed =
        report.processes.iter().map(|p| p.threads_not_listed).sum();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::model::*;

    fn process(pid: u32, samples: u64) -> ProcessReport {
        ProcessReport {
            pid,
            ppid: Some(1),
            comm: "p".into(),
            cmdline: vec![],
            exited: true,
            samples,
            top_self: vec![],
            top_python: vec![],
            top_total: vec![],
            time: None,
            syscalls: vec![],
            files: vec![],
            dirs: vec![],
            block_io: vec![],
            cuda: None,
            gil: None,
            threads: vec![],
            threads_not_listed: 0,
        }
    }

    fn report(processes: Vec<ProcessReport>) -> Report {
        let mut r = crate::report::fixtures::report();
        r.target.pids = vec![1];
        r.processes = processes;
        r
    }

    #[test]
    fn keeps_targets_busy_processes_and_a_few_idle_ones() {
        let mut ps = vec![process(1, 0)];
        ps.extend((2..2000).map(|pid| process(pid, 0)));
        ps.push(process(5000, 7));
        let mut r = report(ps);
        let removed = limit_processes(&mut r, 3, MAX_LISTED_PROCESSES).idle;
        let pids: Vec<u32> = r.processes.iter().map(|p| p.pid).collect();
        assert_eq!(pids, vec![1, 2, 3, 4, 5000]);
        assert_eq!(removed, 1995);
        assert_eq!(r.followed.not_listed, 1995);
    }

    #[test]
    fn short_lived_children_are_idle_long_lived_ones_are_not() {
        let alive = |pid: u32, ns: u64| {
            let mut p = process(pid, 0);
            p.time = Some(crate::report::model::time::TimeBreakdown {
                alive_ns: ns,
                ..Default::default()
            });
            p
        };
        let mut ps = vec![process(1, 0), alive(7, 8_000_000_000)];
        ps.extend((10..20).map(|pid| alive(pid, 1_000_000)));
        let mut r = report(ps);
        r.window.duration_ns = 10_000_000_000;
        assert_eq!(limit_processes(&mut r, 2, MAX_LISTED_PROCESSES).total(), 8);
        let pids: Vec<u32> = r.processes.iter().map(|p| p.pid).collect();
        assert_eq!(pids, vec![1, 7, 10, 11]);
    }

    #[test]
    fn a_small_report_is_untouched() {
        let mut r = report(vec![process(1, 0), process(2, 0), process(3, 5)]);
        assert_eq!(
            limit_processes(&mut r, MAX_IDLE_PROCESSES, MAX_LISTED_PROCESSES).total(),
            0
        );
        assert_eq!(r.processes.len(), 3);
    }

    #[test]
    fn beyond_the_cap_the_lightest_go_and_their_samples_are_counted() {
        let alive = |pid: u32, samples: u64, ns: u64| {
            let mut p = process(pid, samples);
            p.time = Some(crate::report::model::time::TimeBreakdown {
                alive_ns: ns,
                ..Default::default()
            });
            p
        };
        // The target, an I/O-bound worker with no samples that lived 5 s, a CUDA process with
        // one sample, and a storm of children each caught by one sample in a millisecond.
        let mut ps = vec![process(1, 0), alive(2, 0, 5_000_000_000)];
        let mut gpu = alive(3, 1, 1_000_000);
        gpu.cuda = Some(Default::default());
        ps.push(gpu);
        ps.extend((10..300).map(|pid| alive(pid, 1, 1_000_000)));
        ps.push(alive(400, 2, 1_000_000));
        let mut r = report(ps);
        r.window.duration_ns = 10_000_000_000;
        r.sampling.frequency_hz = 100;
        let out = limit_processes(&mut r, MAX_IDLE_PROCESSES, 8);
        let pids: Vec<u32> = r.processes.iter().map(|p| p.pid).collect();
        assert_eq!(pids, vec![1, 2, 3, 10, 11, 12, 13, 14, 400]);
        assert_eq!(out.light, 285);
        assert_eq!(out.light_samples, 285);
        assert_eq!(out.idle, 0);
        assert_eq!(r.followed.not_listed, 285);
        assert_eq!(out.light_cuda_calls, 0);

        // A storm of CUDA workers beyond the cap: their calls and bytes are counted for the
        // warning (they are in no table once unlisted).
        let worker = |pid: u32| {
            let mut p = alive(pid, 1, 1_000_000);
            p.cuda = Some(crate::report::model::cuda::ProcessCuda {
                api: vec![crate::report::model::cuda::ApiStat {
                    function: "cudaMemcpy".into(),
                    count: 10,
                    ..Default::default()
                }],
                copies: vec![crate::report::model::cuda::CopyStat {
                    bytes: 640,
                    ..Default::default()
                }],
                ..Default::default()
            });
            p
        };
        let mut ps = vec![process(1, 0)];
        ps.extend((10..30).map(worker));
        let mut r = report(ps);
        r.window.duration_ns = 10_000_000_000;
        let out = limit_processes(&mut r, MAX_IDLE_PROCESSES, 8);
        assert_eq!(out.light, 12);
        assert_eq!(
            (out.light_cuda_calls, out.light_copied_bytes),
            (120, 12 * 640)
        );
    }

    fn thread(tid: u32, samples: u64, alive_ns: u64) -> ThreadReport {
        ThreadReport {
            tid,
            comm: format!("t{tid}"),
            samples,
            kernel_samples: 0,
            top_self: vec![],
            top_python: vec![],
            time: Some(crate::report::model::time::TimeBreakdown {
                alive_ns,
                accounted_ns: alive_ns,
                ..Default::default()
            }),
            syscalls: vec![],
            python_sites: vec![],
        }
    }

    #[test]
    fn lists_the_main_thread_and_the_heaviest_others() {
        let mut p = process(1, 0);
        // The main thread lived briefly; thread 7 ran, thread 9 was alive longest; the rest
        // lived a microsecond each.
        p.threads = vec![thread(1, 0, 10)];
        p.threads.extend((2..500).map(|tid| match tid {
            7 => thread(tid, 50, 1_000),
            9 => thread(tid, 0, 10_000_000_000),
            _ => thread(tid, 0, 1_000),
        }));
        let mut r = report(vec![p, process(2, 0)]);
        let left = limit_threads(&mut r, 3);
        assert_eq!(left.len(), 1);
        assert_eq!((left[0].pid, left[0].threads.len()), (1, 496));
        assert!(left[0]
            .threads
            .iter()
            .all(|(tid, _)| ![1, 7, 9].contains(tid)));
        assert!(left[0].threads.contains(&(2, "t2".to_string())));
        let tids: Vec<u32> = r.processes[0].threads.iter().map(|t| t.tid).collect();
        assert_eq!(tids, vec![1, 7, 9]);
        assert_eq!(r.followed.threads_not_listed, 496);
        assert_eq!(r.processes[0].threads_not_listed, 496);
        // Within the bound nothing moves.
        assert!(limit_threads(&mut r, 3).is_empty());
        assert_eq!(r.processes[0].threads.len(), 3);
    }
}
