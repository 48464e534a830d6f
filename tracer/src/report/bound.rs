//! Keeps the report's size bounded however many processes the trace followed: processes with
//! nothing to show beyond the first few are counted, not listed.

use super::model::{ProcessReport, Report};

/// Processes with nothing to show that are still listed (a few show that children were seen).
pub const MAX_IDLE_PROCESSES: usize = 32;

/// A process is idle (worth counting, not listing) when it has no CPU samples, no CUDA, no
/// block I/O, and lived for only a sliver of the window: what a fork storm's children look like.
fn is_idle(p: &ProcessReport, window_ns: u64) -> bool {
    let short = (window_ns / 200).max(10_000_000);
    p.samples == 0
        && p.block_io.is_empty()
        && p.cuda.is_none()
        && p.time.as_ref().is_none_or(|t| t.alive_ns < short)
}

/// Removes idle processes beyond `max_idle` (targets always stay); returns how many it removed
/// and records the number in `report.followed.not_listed`.
pub fn limit_idle_processes(report: &mut Report, max_idle: usize) -> u64 {
    let roots = report.target.pids.clone();
    let window_ns = report.window.duration_ns;
    let mut idle_kept = 0usize;
    let before = report.processes.len();
    report.processes.retain(|p| {
        if roots.contains(&p.pid) || !is_idle(p, window_ns) {
            return true;
        }
        idle_kept += 1;
        idle_kept <= max_idle
    });
    let removed = (before - report.processes.len()) as u64;
    report.followed.not_listed += removed;
    removed
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
            top_total: vec![],
            time: None,
            syscalls: vec![],
            files: vec![],
            block_io: vec![],
            cuda: None,
            gil: None,
            threads: vec![],
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
        let removed = limit_idle_processes(&mut r, 3);
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
        assert_eq!(limit_idle_processes(&mut r, 2), 8);
        let pids: Vec<u32> = r.processes.iter().map(|p| p.pid).collect();
        assert_eq!(pids, vec![1, 7, 10, 11]);
    }

    #[test]
    fn a_small_report_is_untouched() {
        let mut r = report(vec![process(1, 0), process(2, 0), process(3, 5)]);
        assert_eq!(limit_idle_processes(&mut r, MAX_IDLE_PROCESSES), 0);
        assert_eq!(r.processes.len(), 3);
    }
}
