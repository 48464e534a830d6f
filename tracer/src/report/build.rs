//! Builds the [`Report`] from the aggregated profile and what the process tracker learnt.

use std::collections::BTreeMap;

use crate::aggregate::cpu::{by_thread, top_python, top_self, top_total, CpuProfile};

use super::model::*;

/// What the session knows of a traced process apart from its samples.
#[derive(Debug, Clone, Default)]
pub struct ProcessInfo {
    pub pid: u32,
    pub ppid: Option<u32>,
    pub comm: String,
    pub cmdline: Vec<String>,
    pub exited: bool,
}

pub struct BuildInput<'a> {
    pub target: Target,
    pub window: Window,
    pub sampling: Sampling,
    pub processes: &'a BTreeMap<u32, ProcessInfo>,
    pub cpu: &'a CpuProfile,
    pub drops: Vec<DropCount>,
    pub blind_spots: Vec<String>,
    pub warnings: Vec<String>,
    pub top: usize,
}

/// The targets first, in the order they were given, then the rest by pid: past a pid wrap a
/// child's pid is under its parent's, and the process the user asked about would be listed
/// after its children.
fn targets_first(mut processes: Vec<ProcessReport>, targets: &[u32]) -> Vec<ProcessReport> {
    processes.sort_by_key(|p| {
        (
            targets
                .iter()
                .position(|&t| t == p.pid)
                .unwrap_or(usize::MAX),
            p.pid,
        )
    });
    processes
}

pub fn build(input: BuildInput<'_>) -> Report {
    let mut by_pid = input.cpu.by_process();
    let pids: std::collections::BTreeSet<u32> = input
        .processes
        .keys()
        .chain(by_pid.keys())
        .copied()
        .collect();
    let processes = pids
        .into_iter()
        .map(|pid| {
            let info = input.processes.get(&pid).cloned().unwrap_or(ProcessInfo {
                pid,
                ..Default::default()
            });
            let all = by_pid.remove(&pid).unwrap_or_default();
            let threads = by_thread(&all)
                .into_iter()
                .map(|(tid, samples)| ThreadReport {
                    tid,
                    comm: samples
                        .iter()
                        .max_by_key(|s| s.count)
                        .map(|s| s.comm.clone())
                        .unwrap_or_default(),
                    samples: samples.iter().map(|s| s.count).sum(),
                    kernel_samples: samples
                        .iter()
                        .filter(|s| s.kernel_mode)
                        .map(|s| s.count)
                        .sum(),
                    top_self: top_self(&samples, input.top),
                    top_python: top_python(&samples, input.top),
                    time: None,
                    syscalls: Vec::new(),
                    python_sites: Vec::new(),
                })
                .collect();
            let comm = if info.comm.is_empty() {
                all.first().map(|s| s.comm.clone()).unwrap_or_default()
            } else {
                info.comm.clone()
            };
            ProcessReport {
                pid,
                ppid: info.ppid,
                comm,
                cmdline: info.cmdline.clone(),
                exited: info.exited,
                samples: all.iter().map(|s| s.count).sum(),
                top_self: top_self(&all, input.top),
                top_total: top_total(&all, input.top),
                top_python: top_python(&all, input.top),
                time: None,
                syscalls: Vec::new(),
                files: Vec::new(),
                dirs: Vec::new(),
                block_io: Vec::new(),
                cuda: None,
                gil: None,
                threads,
                threads_not_listed: 0,
            }
        })
        .collect();
    let processes = targets_first(processes, &input.target.pids);
    Report {
        schema_version: SCHEMA_VERSION,
        tool: format!("gputrace {}", env!("CARGO_PKG_VERSION")),
        findings: Vec::new(),
        nvml: None,
        target: input.target,
        window: input.window,
        sampling: input.sampling,
        processes,
        followed: Followed::default(),
        drops: input.drops,
        blind_spots: input.blind_spots,
        warnings: input.warnings,
        timeline: None,
        overhead: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixtures::process;

    #[test]
    fn the_targets_come_first_past_a_pid_wrap() {
        let ps = [32_764, 302, 40, 32_765]
            .into_iter()
            .map(|pid| process(pid, None, "p", vec![]))
            .collect();
        let order: Vec<u32> = targets_first(ps, &[32_765, 32_764])
            .iter()
            .map(|p| p.pid)
            .collect();
        assert_eq!(order, [32_765, 32_764, 40, 302]);
    }
}
