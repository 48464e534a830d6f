//! The timeline behind `trace.json`: typed events that probe families stream over their ring
//! buffers and push here while tracing, plus counter samples (NVML). Bounded: once `limit`
//! events are held, further ones are counted in `cut` and the report says so.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What an event is; decides its track colour and category in the trace viewer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// The thread was off CPU; `name` is the reason (`read`, `futex`, `preempted`, ...).
    OffCpu,
    /// A CUDA runtime/driver call; `args` hold its arguments (bytes, grid, stream, error).
    Cuda,
    /// A syscall above the family's latency threshold.
    Syscall,
    /// A block I/O request from issue to completion (not on a thread: requests overlap).
    BlockIo,
    /// A zero-length mark (process start/exit, exec).
    Instant,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimelineEvent {
    /// ns since the window start.
    pub ts_ns: u64,
    pub dur_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub kind: EventKind,
    pub name: String,
    pub args: Vec<(String, String)>,
}

/// One sample of a counter track, e.g. `gpu0` with `util %` and `mem used MB`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CounterSample {
    pub ts_ns: u64,
    /// The track's name.
    pub name: String,
    pub values: Vec<(String, f64)>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    pub events: Vec<TimelineEvent>,
    pub counters: Vec<CounterSample>,
    /// Most events (and, separately, counter samples) kept.
    pub limit: usize,
    /// Events not kept because the limit was reached.
    pub cut_events: u64,
    pub cut_counters: u64,
    /// Short CUDA calls (launches and the like) left out of the timeline by design.
    #[serde(default)]
    pub cuda_calls_below_threshold: u64,
    /// Names of threads with events here that the report does not list (it lists at most
    /// `report::bound::MAX_LISTED_THREADS` per process): (pid, tid) -> comm.
    #[serde(skip)]
    pub unlisted_names: BTreeMap<(u32, u32), String>,
}

impl Default for Timeline {
    fn default() -> Self {
        Timeline::with_limit(200_000)
    }
}

impl Timeline {
    pub fn with_limit(limit: usize) -> Self {
        Timeline {
            events: Vec::new(),
            counters: Vec::new(),
            limit,
            cut_events: 0,
            cut_counters: 0,
            cuda_calls_below_threshold: 0,
            unlisted_names: BTreeMap::new(),
        }
    }

    /// Keeps the event unless the limit is reached; returns whether it was kept.
    pub fn push(&mut self, ev: TimelineEvent) -> bool {
        if self.events.len() >= self.limit {
            self.cut_events += 1;
            return false;
        }
        self.events.push(ev);
        true
    }

    pub fn push_counter(&mut self, c: CounterSample) -> bool {
        if self.counters.len() >= self.limit {
            self.cut_counters += 1;
            return false;
        }
        self.counters.push(c);
        true
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty() && self.counters.is_empty()
    }

    /// What the report says about the timeline.
    pub fn summary(&self) -> crate::report::model::TimelineSummary {
        crate::report::model::TimelineSummary {
            events: self.events.len() as u64,
            counter_samples: self.counters.len() as u64,
            limit: self.limit as u64,
            cut_events: self.cut_events,
            cut_counter_samples: self.cut_counters,
            cuda_calls_below_threshold: self.cuda_calls_below_threshold,
        }
    }
}

/// Process lifecycle events the tracker keeps for the timeline.
pub const LIFECYCLE_MAX: usize = 10_000;

/// Syscalls at least this long are worth a timeline event; shorter ones only count in the
/// per-syscall statistics (a default for the families that stream syscalls).
pub const SYSCALL_EVENT_MIN_NS: u64 = 100_000;

/// NVML samples as counter tracks (one per GPU), when no family pushed counters itself.
pub fn add_nvml(t: &mut Timeline, nvml: &crate::report::model::cuda::Nvml) {
    if !t.counters.is_empty() || !nvml.available {
        return;
    }
    for g in &nvml.gpus {
        for s in &g.samples {
            t.push_counter(CounterSample {
                ts_ns: s.t_ns,
                name: format!("GPU {} utilisation %", g.index),
                values: vec![
                    ("gpu".into(), s.util_gpu as f64),
                    ("memory".into(), s.util_mem as f64),
                ],
            });
            t.push_counter(CounterSample {
                ts_ns: s.t_ns,
                name: format!("GPU {} memory used MB", g.index),
                values: vec![("used".into(), s.mem_used_bytes as f64 / 1e6)],
            });
            t.push_counter(CounterSample {
                ts_ns: s.t_ns,
                name: format!("GPU {} PCIe MB/s", g.index),
                values: vec![
                    ("tx".into(), s.pcie_tx_kbps as f64 / 1e3),
                    ("rx".into(), s.pcie_rx_kbps as f64 / 1e3),
                ],
            });
            t.push_counter(CounterSample {
                ts_ns: s.t_ns,
                name: format!("GPU {} power W", g.index),
                values: vec![("power".into(), s.power_mw as f64 / 1e3)],
            });
        }
    }
}

/// Fork, exec and exit of traced processes as instants; `window_start_ktime` is the ktime of
/// the window start (events before it are put at 0).
pub fn add_lifecycle(
    t: &mut Timeline,
    events: &[tracer_common::proc::ProcEvent],
    window_start_ktime: u64,
) {
    use tracer_common::proc::ProcEventKind as K;
    for ev in events {
        let comm = {
            let end = ev
                .comm
                .iter()
                .position(|b| *b == 0)
                .unwrap_or(ev.comm.len());
            String::from_utf8_lossy(&ev.comm[..end]).into_owned()
        };
        let (name, pid, args) = match K::from_u32(ev.kind) {
            Some(K::Fork) => (
                format!("fork {}", ev.pid),
                ev.ppid,
                vec![("child".to_string(), ev.pid.to_string())],
            ),
            Some(K::Exec) => (format!("exec {comm}"), ev.pid, vec![]),
            Some(K::Exit) => ("exit".to_string(), ev.pid, exit_status(ev.exit_code)),
            Some(K::ThreadExit)
            | Some(K::SyscallStorm)
            | Some(K::MappedExec)
            | Some(K::MappedCode)
            | None => continue,
        };
        t.push(TimelineEvent {
            ts_ns: ev.ts_ns.saturating_sub(window_start_ktime),
            dur_ns: 0,
            pid,
            tid: if matches!(K::from_u32(ev.kind), Some(K::Fork)) {
                ev.ppid
            } else {
                ev.tid
            },
            kind: EventKind::Instant,
            name,
            args,
        });
    }
}

/// A process's exit as the kernel had it (`task_struct.exit_code`, a wait status, read at its
/// exit): `status` (its exit status) or `signal` (what killed it); nothing where the kernel
/// side could not read it (-1).
fn exit_status(code: i32) -> Vec<(String, String)> {
    if code < 0 {
        return vec![];
    }
    let sig = code & 0x7f;
    if sig == 0 {
        vec![("status".to_string(), ((code >> 8) & 0xff).to_string())]
    } else {
        vec![("signal".to_string(), sig.to_string())]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvml_samples_become_counters_once() {
        let nvml = crate::report::fixtures::nvml(60.0);
        let mut t = Timeline::with_limit(100);
        add_nvml(&mut t, &nvml);
        assert_eq!(t.counters.len(), 40, "4 tracks x 10 samples");
        assert_eq!(t.counters[0].name, "GPU 0 utilisation %");
        assert_eq!(t.counters[0].values[0], ("gpu".to_string(), 60.0));
        add_nvml(&mut t, &nvml);
        assert_eq!(t.counters.len(), 40, "not twice");
    }

    #[test]
    fn lifecycle_becomes_instants() {
        use tracer_common::proc::{ProcEvent, ProcEventKind as K};
        let ev = |kind: K, pid, ts_ns| ProcEvent {
            kind: kind as u32,
            pid,
            tid: pid,
            ppid: 1,
            ts_ns,
            exit_code: 0,
            arg: 0,
            comm: *b"worker\0\0\0\0\0\0\0\0\0\0",
        };
        let mut t = Timeline::with_limit(10);
        add_lifecycle(
            &mut t,
            &[
                ev(K::Fork, 5, 900),
                ev(K::Exec, 5, 2_000),
                ev(K::ThreadExit, 5, 2_500),
                ev(K::Exit, 5, 3_000),
            ],
            1_000,
        );
        let names: Vec<(&str, u32, u64)> = t
            .events
            .iter()
            .map(|e| (e.name.as_str(), e.pid, e.ts_ns))
            .collect();
        assert_eq!(
            names,
            vec![
                ("fork 5", 1, 0),
                ("exec worker", 5, 1_000),
                ("exit", 5, 2_000)
            ]
        );
    }

    #[test]
    fn limit_counts_what_is_cut() {
        let mut t = Timeline::with_limit(2);
        let ev = TimelineEvent {
            ts_ns: 0,
            dur_ns: 1,
            pid: 1,
            tid: 1,
            kind: EventKind::Syscall,
            name: "read".into(),
            args: vec![],
        };
        assert!(t.push(ev.clone()));
        assert!(t.push(ev.clone()));
        assert!(!t.push(ev));
        assert_eq!(t.events.len(), 2);
        let s = t.summary();
        assert_eq!((s.events, s.cut_events, s.limit), (2, 1, 2));
    }
}
