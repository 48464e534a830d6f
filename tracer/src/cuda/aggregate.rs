//! From what the kernel aggregated (per thread and function) and the ordered events to the
//! report's per-process CUDA section. Pure: no BPF, no /proc.

use std::collections::{BTreeMap, HashMap};

use tracer_common::{
    cuda::{
        ApiKey, ApiVal, CopyKey, CopyVal, ErrKey, LaunchKey, LaunchVal, DIR_D2D, DIR_D2H, DIR_H2D,
        DIR_H2H,
    },
    wall::ThreadState,
};

use super::{errors, table};
use crate::report::model::cuda::{
    Allocation, ApiStat, CopyStat, CudaErrorCount, KernelStat, MemoryStat, ThreadCuda,
};

/// How many never-freed allocations and live-bytes points a report keeps.
pub const MAX_NEVER_FREED: usize = 20;
pub const MAX_SERIES: usize = 1000;

pub fn api_stats(pid: u32, api: &[(ApiKey, ApiVal)], errs: &[(ErrKey, u64)]) -> Vec<ApiStat> {
    merge_api(
        api.iter().filter(|(k, _)| k.pid == pid),
        errs.iter().filter(|(k, _)| k.pid == pid),
    )
}

/// Adds the calls that thread states still hold (`ThreadState::held_api_count`, counted by
/// `--cuda-entry-only` probes) to their (process, thread, function) rows, making the rows
/// that no call wrote out yet.
pub fn add_held_calls(api: &mut Vec<(ApiKey, ApiVal)>, states: &[(u32, ThreadState)]) {
    for (tid, st) in states {
        if st.held_api_count == 0 || st.held_api_fid < 0 {
            continue;
        }
        let key = ApiKey {
            pid: st.tgid,
            tid: *tid,
            fid: st.held_api_fid as u32,
            _pad: 0,
        };
        match api.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.count += st.held_api_count,
            None => api.push((
                key,
                ApiVal {
                    count: st.held_api_count,
                    total_ns: 0,
                    min_ns: 0,
                    max_ns: 0,
                    errors: 0,
                    hist: [0; tracer_common::cuda::HIST_BUCKETS],
                },
            )),
        }
    }
}

/// Per-thread API statistics of one process (errors are kept per process, not per thread).
pub fn thread_stats(pid: u32, api: &[(ApiKey, ApiVal)]) -> Vec<ThreadCuda> {
    let mut tids: Vec<u32> = api
        .iter()
        .filter(|(k, _)| k.pid == pid)
        .map(|(k, _)| k.tid)
        .collect();
    tids.sort_unstable();
    tids.dedup();
    let mut out: Vec<ThreadCuda> = tids
        .into_iter()
        .map(|tid| {
            let stats = merge_api(
                api.iter().filter(|(k, _)| k.pid == pid && k.tid == tid),
                std::iter::empty(),
            );
            ThreadCuda {
                tid,
                total_ns: stats.iter().map(|s| s.total_ns).sum(),
                api: stats,
            }
        })
        .filter(|t| !t.api.is_empty())
        .collect();
    out.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(a.tid.cmp(&b.tid)));
    out
}

fn merge_api<'a>(
    api: impl Iterator<Item = &'a (ApiKey, ApiVal)>,
    errs: impl Iterator<Item = &'a (ErrKey, u64)>,
) -> Vec<ApiStat> {
    let mut by_fid: BTreeMap<u32, ApiStat> = BTreeMap::new();
    for (k, v) in api {
        let Some(f) = table::func(k.fid) else {
            continue;
        };
        let s = by_fid.entry(k.fid).or_insert_with(|| ApiStat {
            function: f.name.into(),
            layer: f.layer.name().into(),
            ..Default::default()
        });
        if v.count == 0 {
            continue;
        }
        s.min_ns = if s.count == 0 {
            v.min_ns
        } else {
            s.min_ns.min(v.min_ns)
        };
        s.count += v.count;
        s.total_ns += v.total_ns;
        s.max_ns = s.max_ns.max(v.max_ns);
        if s.hist_log2_ns.len() < v.hist.len() {
            s.hist_log2_ns.resize(v.hist.len(), 0);
        }
        for (a, b) in s.hist_log2_ns.iter_mut().zip(v.hist.iter()) {
            *a += b;
        }
    }
    for (k, n) in errs {
        let Some(f) = table::func(k.fid) else {
            continue;
        };
        let s = by_fid.entry(k.fid).or_default();
        s.errors.push(CudaErrorCount {
            code: k.code,
            name: errors::name(f.layer, k.code),
            count: *n,
        });
    }
    let mut out: Vec<ApiStat> = by_fid
        .into_values()
        .filter(|s| s.count > 0)
        .map(|mut s| {
            while s.hist_log2_ns.last() == Some(&0) {
                s.hist_log2_ns.pop();
            }
            s.errors
                .sort_by(|a, b| b.count.cmp(&a.count).then(a.code.cmp(&b.code)));
            s
        })
        .collect();
    out.sort_by(|a, b| {
        b.total_ns
            .cmp(&a.total_ns)
            .then(a.function.cmp(&b.function))
    });
    out
}

pub fn direction_name(dir: u32) -> &'static str {
    match dir as u8 {
        DIR_H2H => "H2H",
        DIR_H2D => "H2D",
        DIR_D2H => "D2H",
        DIR_D2D => "D2D",
        _ => "default",
    }
}

pub fn copy_stats(pid: u32, copies: &[(CopyKey, CopyVal)]) -> Vec<CopyStat> {
    let mut out: Vec<CopyStat> = copies
        .iter()
        .filter(|(k, _)| k.pid == pid)
        .map(|(k, v)| CopyStat {
            direction: direction_name(k.dir).into(),
            mode: if k.asynchronous != 0 { "async" } else { "sync" }.into(),
            count: v.count,
            bytes: v.bytes,
            total_ns: v.total_ns,
            gbps: if v.total_ns > 0 {
                v.bytes as f64 / v.total_ns as f64
            } else {
                0.0
            },
        })
        .collect();
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.direction.cmp(&b.direction)));
    out
}

/// (grid, block).
type Dims = ([u32; 3], [u32; 3]);

/// Kernels by launch count; `name` names a (launching function id, handle or stub pointer).
pub fn kernels(
    pid: u32,
    launches: &[(LaunchKey, LaunchVal)],
    mut name: impl FnMut(u32, u64) -> String,
) -> Vec<KernelStat> {
    // name -> (stat, launches per dims)
    let mut by_name: HashMap<String, (KernelStat, HashMap<Dims, u64>)> = HashMap::new();
    for (k, v) in launches.iter().filter(|(k, _)| k.pid == pid) {
        let n = name(k.fid, k.func);
        let e = by_name.entry(n.clone()).or_insert_with(|| {
            (
                KernelStat {
                    name: n,
                    ..Default::default()
                },
                HashMap::new(),
            )
        });
        e.0.launches += v.count;
        e.0.launch_ns += v.total_ns;
        *e.1.entry((k.grid, k.block)).or_default() += v.count;
    }
    let mut out: Vec<KernelStat> = by_name
        .into_values()
        .map(|(mut s, dims)| {
            // The most used dimensions (ties: the smallest, so the output is stable).
            if let Some(((g, b), _)) = dims
                .into_iter()
                .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
            {
                s.grid = g;
                s.block = b;
            }
            s
        })
        .collect();
    out.sort_by(|a, b| b.launches.cmp(&a.launches).then(a.name.cmp(&b.name)));
    out
}

/// One allocation or free, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemEvent {
    pub ts_ns: u64,
    pub fid: u32,
    pub addr: u64,
    /// `None` for a free.
    pub size: Option<u64>,
}

/// Live bytes over time and what was never freed, from the ordered allocation events of one
/// process. Frees of addresses allocated before the trace are counted but change nothing.
pub fn memory(events: &[MemEvent], window_start_ns: u64) -> MemoryStat {
    let mut m = MemoryTracker::default();
    for e in events {
        m.add(e);
    }
    m.finish(window_start_ns)
}

/// [`memory`] one event at a time, as they arrive: it keeps the live allocations and a bounded
/// series, not the events, so an hour of allocation churn costs no more than its peak.
#[derive(Debug, Default)]
pub struct MemoryTracker {
    m: MemoryStat,
    /// addr -> (bytes, function id, when).
    live: HashMap<u64, (u64, u32, u64)>,
    live_bytes: u64,
    /// (absolute ns, live bytes) until the series is full.
    series: Vec<(u64, u64)>,
}

impl MemoryTracker {
    pub fn add(&mut self, e: &MemEvent) {
        let m = &mut self.m;
        match e.size {
            Some(size) => {
                m.allocs += 1;
                m.alloc_bytes += size;
                if let Some((old, _, _)) = self.live.insert(e.addr, (size, e.fid, e.ts_ns)) {
                    // Freed without our seeing it (e.g. through a path we do not probe).
                    self.live_bytes -= old;
                }
                self.live_bytes += size;
            }
            None => {
                m.frees += 1;
                match self.live.remove(&e.addr) {
                    Some((size, _, _)) => self.live_bytes -= size,
                    None => return,
                }
            }
        }
        m.peak_live_bytes = m.peak_live_bytes.max(self.live_bytes);
        if self.series.len() < MAX_SERIES {
            self.series.push((e.ts_ns, self.live_bytes));
        }
    }

    pub fn finish(&self, window_start_ns: u64) -> MemoryStat {
        let mut m = self.m.clone();
        m.live_bytes_series = self
            .series
            .iter()
            .map(|&(ts, b)| (ts.saturating_sub(window_start_ns), b))
            .collect();
        m.live_bytes_at_end = self.live_bytes;
        let mut never: Vec<Allocation> = self
            .live
            .values()
            .map(|&(bytes, fid, ts)| Allocation {
                function: table::func(fid).map(|f| f.name).unwrap_or("?").into(),
                bytes,
                at_ns: ts.saturating_sub(window_start_ns),
            })
            .collect();
        never.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.at_ns.cmp(&b.at_ns)));
        never.truncate(MAX_NEVER_FREED);
        m.never_freed = never;
        m
    }
}

/// Demangles a C++ symbol (`_Z...`); other names are returned as they are.
pub fn demangle(name: &str) -> String {
    if name.starts_with("_Z") {
        if let Ok(sym) = cpp_demangle::Symbol::new(name) {
            if let Ok(s) = sym.demangle() {
                return s;
            }
        }
    }
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_common::cuda::HIST_BUCKETS;

    fn fid(name: &str) -> u32 {
        table::FUNCS.iter().position(|f| f.name == name).unwrap() as u32
    }

    fn val(count: u64, total: u64, min: u64, max: u64, bucket: usize) -> ApiVal {
        let mut hist = [0; HIST_BUCKETS];
        hist[bucket] = count;
        ApiVal {
            count,
            total_ns: total,
            min_ns: min,
            max_ns: max,
            errors: 0,
            hist,
        }
    }

    #[test]
    fn held_calls_join_their_rows_or_make_them() {
        let f = fid("cudaLaunchKernel");
        let key = |tid| ApiKey {
            pid: 7,
            tid,
            fid: f,
            _pad: 0,
        };
        let mut api = vec![(key(8), val(10, 0, 0, 0, 0))];
        let held = |tid, fid: i32, n| {
            let mut st = ThreadState::new(0, tid, 7, 0);
            st.held_api_fid = fid;
            st.held_api_count = n;
            (tid, st)
        };
        // Thread 8 holds 5 more calls of its row; thread 9 holds 3 with no row yet; thread 10
        // holds nothing.
        let states = [held(8, f as i32, 5), held(9, f as i32, 3), held(10, -1, 0)];
        add_held_calls(&mut api, &states);
        let count = |tid| {
            api.iter()
                .find(|(k, _)| *k == key(tid))
                .map(|(_, v)| v.count)
        };
        assert_eq!(count(8), Some(15));
        assert_eq!(count(9), Some(3));
        assert_eq!(count(10), None);
        assert_eq!(api.len(), 2);
        assert_eq!(api_stats(7, &api, &[])[0].count, 18);
    }

    #[test]
    fn api_stats_merge_threads_and_name_errors() {
        let f = fid("cudaMalloc");
        let k = |pid, tid| ApiKey {
            pid,
            tid,
            fid: f,
            _pad: 0,
        };
        let api = [
            (k(1, 1), val(2, 300, 100, 200, 7)),
            (k(1, 2), val(1, 50, 50, 50, 5)),
            (k(2, 3), val(9, 9, 1, 1, 0)),
        ];
        let errs = [(
            ErrKey {
                pid: 1,
                fid: f,
                code: 35,
                _pad: 0,
            },
            2,
        )];
        let s = api_stats(1, &api, &errs);
        assert_eq!(s.len(), 1);
        let s = &s[0];
        assert_eq!((s.count, s.total_ns, s.min_ns, s.max_ns), (3, 350, 50, 200));
        assert_eq!(s.hist_log2_ns, vec![0, 0, 0, 0, 0, 1, 0, 2]);
        assert_eq!(s.layer, "runtime");
        assert_eq!(s.errors[0].name, "cudaErrorInsufficientDriver");
        assert_eq!(s.errors[0].count, 2);
        let t = thread_stats(1, &api);
        assert_eq!(t.iter().map(|t| t.tid).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!((t[0].total_ns, t[0].api[0].count), (300, 2));
    }

    #[test]
    fn copies_have_direction_mode_and_bandwidth() {
        let k = |dir, a| CopyKey {
            pid: 7,
            dir,
            asynchronous: a,
            _pad: 0,
        };
        let c = copy_stats(
            7,
            &[
                (
                    k(1, 0),
                    CopyVal {
                        count: 2,
                        bytes: 2_000_000,
                        total_ns: 1_000_000,
                    },
                ),
                (
                    k(3, 1),
                    CopyVal {
                        count: 1,
                        bytes: 10,
                        total_ns: 0,
                    },
                ),
            ],
        );
        assert_eq!(c[0].direction, "H2D");
        assert_eq!(c[0].mode, "sync");
        assert!((c[0].gbps - 2.0).abs() < 1e-9);
        assert_eq!(
            (c[1].direction.as_str(), c[1].mode.as_str()),
            ("D2D", "async")
        );
        assert_eq!(c[1].gbps, 0.0);
    }

    #[test]
    fn kernels_group_by_name_and_keep_common_dims() {
        let k = |func, gx| LaunchKey {
            pid: 1,
            fid: 0,
            func,
            grid: [gx, 1, 1],
            block: [32, 1, 1],
        };
        let l = [
            (
                k(0x10, 4),
                LaunchVal {
                    count: 3,
                    total_ns: 30,
                },
            ),
            (
                k(0x10, 8),
                LaunchVal {
                    count: 5,
                    total_ns: 50,
                },
            ),
            (
                k(0x20, 1),
                LaunchVal {
                    count: 1,
                    total_ns: 1,
                },
            ),
        ];
        let ks = kernels(1, &l, |_, f| format!("k{f:x}"));
        assert_eq!(ks[0].name, "k10");
        assert_eq!(ks[0].launches, 8);
        assert_eq!(ks[0].launch_ns, 80);
        assert_eq!(ks[0].grid, [8, 1, 1]);
        assert_eq!(ks[1].launches, 1);
    }

    #[test]
    fn memory_tracks_live_peak_and_leaks() {
        let a = |t, addr, size| MemEvent {
            ts_ns: t,
            fid: fid("cudaMalloc"),
            addr,
            size: Some(size),
        };
        let f = |t, addr| MemEvent {
            ts_ns: t,
            fid: fid("cudaFree"),
            addr,
            size: None,
        };
        let m = memory(
            &[
                a(110, 1, 100),
                a(120, 2, 50),
                f(130, 1),
                f(140, 99),
                a(150, 3, 10),
            ],
            100,
        );
        assert_eq!((m.allocs, m.frees, m.alloc_bytes), (3, 2, 160));
        assert_eq!(m.peak_live_bytes, 150);
        assert_eq!(m.live_bytes_at_end, 60);
        assert_eq!(m.never_freed.len(), 2);
        assert_eq!(m.never_freed[0].bytes, 50);
        assert_eq!(m.never_freed[0].function, "cudaMalloc");
        assert_eq!(
            m.live_bytes_series,
            vec![(10, 100), (20, 150), (30, 50), (50, 60)]
        );
    }

    #[test]
    fn demangles_cpp_names_only() {
        assert_eq!(demangle("_Z5scalePfif"), "scale(float*, int, float)");
        assert_eq!(demangle("plain_c"), "plain_c");
    }

    /// Churn keeps what is live and a bounded series, not the events.
    #[test]
    fn allocation_churn_is_kept_in_bounded_memory() {
        let mut t = MemoryTracker::default();
        let n = 200_000u64;
        for i in 0..n {
            let addr = 0x1000 + (i % 7) * 0x100;
            t.add(&MemEvent {
                ts_ns: 2 * i,
                fid: fid("cudaMalloc"),
                addr,
                size: Some(64),
            });
            t.add(&MemEvent {
                ts_ns: 2 * i + 1,
                fid: fid("cudaFree"),
                addr,
                size: None,
            });
        }
        t.add(&MemEvent {
            ts_ns: 2 * n,
            fid: fid("cudaMalloc"),
            addr: 0x9000,
            size: Some(4096),
        });
        assert_eq!(t.live.len(), 1);
        assert!(t.series.len() <= MAX_SERIES);
        let m = t.finish(0);
        assert_eq!((m.allocs, m.frees), (n + 1, n));
        assert_eq!((m.peak_live_bytes, m.live_bytes_at_end), (4096, 4096));
        assert_eq!(m.never_freed.len(), 1);
    }
}
