//! Keeps the report's size bounded however many processes the trace followed: processes with
//! nothing to show beyond the first few are counted, not listed.

use super::model::{ProcessReport, Report};

/// Processes with nothing to show that are still listed (a few show that children were seen).
pub const MAX_IDLE_PROCESSES: usize = 32;

fn is_idle(p: &ProcessReport) -> bool {
    p.samples == 0
        && p.threads.is_empty()
        && p.time.is_none()
        && p.syscalls.is_empty()
        && p.files.is_empty()
        && p.block_io.is_empty()
        && p.cuda.is_none()
}

/// Removes idle processes beyond `max_idle` (targets always stay); returns how many it removed
/// and records the number in `report.followed.not_listed`.
pub fn limit_idle_processes(report: &mut Report, max_idle: usize) -> u64 {
    let roots = report.target.pids.clone();
    let mut idle_kept = 0usize;
    let before = report.processes.len();
    report.processes.retain(|p| {
        if roots.contains(&p.pid) || !is_idle(p) {
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
    fn a_small_report_is_untouched() {
        let mut r = report(vec![process(1, 0), process(2, 0), process(3, 5)]);
        assert_eq!(limit_idle_processes(&mut r, MAX_IDLE_PROCESSES), 0);
        assert_eq!(r.processes.len(), 3);
    }
}
