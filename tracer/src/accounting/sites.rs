//! Python-level summaries of the time rows: under which Python line each thread waited or sat in
//! CUDA calls, and who held the GIL while threads waited for it. Pure: the rows come with their
//! Python frame and GIL holder already resolved.

use std::collections::{BTreeMap, HashMap};

use tracer_common::time::Category;

use crate::report::model::{
    python::{GilReport, GilThread, PySite},
    ProcessReport,
};

/// Sites kept per thread (waits, and CUDA calls, each), and the smallest share of a wait worth a
/// line. CUDA call sites have no floor: a synchronisation called from one line is worth naming
/// even when the GPU answered at once.
const SITES_PER_THREAD: usize = 8;
const SITE_MIN_PERCENT: f64 = 0.5;

/// One time row, resolved.
#[derive(Debug, Clone)]
pub struct SiteRow {
    pub tgid: u32,
    pub tid: u32,
    pub category: Category,
    /// Innermost Python frame of the row's stack, when it had one.
    pub frame: Option<String>,
    /// The CUDA function of a CUDA row.
    pub call: Option<&'static str>,
    /// For a GIL wait: its holder's tid (`None` when the holder was unknown or never mapped to a
    /// thread); `None` for any other row.
    pub gil_holder: Option<Option<u32>>,
    pub ns: u64,
}

/// Fills `python_sites` of every thread and `gil` of every process that has them.
pub fn fill(processes: &mut [ProcessReport], rows: &[SiteRow], comm: impl Fn(u32) -> String) {
    type SiteKey = (u32, u32, Category, String, Option<&'static str>);
    type Site = (Category, String, Option<&'static str>, u64);
    /// Wait per waiting thread, and per holder at the wait's start.
    type GilSums = (BTreeMap<u32, u64>, BTreeMap<Option<u32>, u64>);
    let mut sites: HashMap<SiteKey, u64> = HashMap::new();
    let mut gil: BTreeMap<u32, GilSums> = BTreeMap::new();
    for r in rows {
        if matches!(r.category, Category::Cpu | Category::Runqueue) {
            continue;
        }
        if let Some(f) = &r.frame {
            *sites
                .entry((r.tgid, r.tid, r.category, f.clone(), r.call))
                .or_default() += r.ns;
        }
        if let Some(holder) = r.gil_holder {
            let g = gil.entry(r.tgid).or_default();
            *g.0.entry(r.tid).or_default() += r.ns;
            *g.1.entry(holder).or_default() += r.ns;
        }
    }
    let mut by_thread: HashMap<(u32, u32), Vec<Site>> = HashMap::new();
    for ((pid, tid, cat, frame, call), ns) in sites {
        by_thread
            .entry((pid, tid))
            .or_default()
            .push((cat, frame, call, ns));
    }
    for p in processes.iter_mut() {
        for t in p.threads.iter_mut() {
            let Some(mut v) = by_thread.remove(&(p.pid, t.tid)) else {
                continue;
            };
            let alive = t.time.as_ref().map_or(0, |b| b.alive_ns).max(1);
            v.sort_by(|a, b| b.3.cmp(&a.3).then_with(|| a.1.cmp(&b.1)));
            let site = |(cat, frame, call, ns): Site| PySite {
                category: cat.name().into(),
                frame,
                call: call.map(str::to_string),
                ns,
                percent: 100.0 * ns as f64 / alive as f64,
            };
            let (cuda, waits): (Vec<Site>, Vec<Site>) = v.into_iter().partition(|s| s.0.is_cuda());
            t.python_sites = waits
                .into_iter()
                .map(site)
                .filter(|s| s.percent >= SITE_MIN_PERCENT)
                .take(SITES_PER_THREAD)
                .chain(cuda.into_iter().map(site).take(SITES_PER_THREAD))
                .collect();
            t.python_sites
                .sort_by(|a, b| b.ns.cmp(&a.ns).then_with(|| a.frame.cmp(&b.frame)));
        }
        if let Some((waiters, holders)) = gil.remove(&p.pid) {
            let wait_ns: u64 = waiters.values().sum();
            let pct = |ns: u64| 100.0 * ns as f64 / wait_ns.max(1) as f64;
            let mut waiters: Vec<GilThread> = waiters
                .into_iter()
                .map(|(tid, ns)| GilThread {
                    tid: Some(tid),
                    comm: comm(tid),
                    ns,
                    percent: pct(ns),
                })
                .collect();
            let mut holders: Vec<GilThread> = holders
                .into_iter()
                .map(|(tid, ns)| GilThread {
                    tid,
                    comm: tid.map(&comm).unwrap_or_default(),
                    ns,
                    percent: pct(ns),
                })
                .collect();
            waiters.sort_by(|a, b| b.ns.cmp(&a.ns).then(a.tid.cmp(&b.tid)));
            holders.sort_by(|a, b| b.ns.cmp(&a.ns).then(a.tid.cmp(&b.tid)));
            p.gil = Some(GilReport {
                wait_ns,
                waiters,
                holders,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixtures;

    fn row(
        tid: u32,
        cat: Category,
        frame: Option<&str>,
        gil: Option<Option<u32>>,
        ns: u64,
    ) -> SiteRow {
        SiteRow {
            tgid: 1,
            tid,
            category: cat,
            frame: frame.map(str::to_string),
            call: (cat == Category::CudaSync).then_some("cudaStreamSynchronize"),
            gil_holder: gil,
            ns,
        }
    }

    fn process() -> ProcessReport {
        fixtures::process(
            1,
            None,
            "python3",
            vec![
                fixtures::thread(1, "python3", &[("lock", 50.0), ("cpu", 50.0)]),
                fixtures::thread(2, "worker", &[("cpu", 100.0)]),
                fixtures::thread(3, "worker", &[("gil", 60.0), ("cpu", 40.0)]),
            ],
        )
    }

    #[test]
    fn sites_per_thread_largest_first_cpu_left_out() {
        let mut ps = vec![process()];
        let alive = ps[0].threads[0].time.as_ref().unwrap().alive_ns;
        let rows = vec![
            row(
                1,
                Category::Lock,
                Some("Queue.get (queue.py:171)"),
                None,
                alive / 4,
            ),
            row(
                1,
                Category::Lock,
                Some("Queue.get (queue.py:171)"),
                None,
                alive / 4,
            ),
            row(
                1,
                Category::CudaSync,
                Some("step (train.py:88)"),
                None,
                alive / 10,
            ),
            row(1, Category::Cpu, Some("hot (train.py:12)"), None, alive / 2),
            // Too small to be worth a line.
            row(1, Category::Io, Some("read (io.py:3)"), None, alive / 1000),
            row(1, Category::Lock, None, None, alive / 10),
        ];
        fill(&mut ps, &rows, |t| format!("t{t}"));
        let s = &ps[0].threads[0].python_sites;
        assert_eq!(s.len(), 2, "{s:?}");
        assert_eq!(s[0].frame, "Queue.get (queue.py:171)");
        assert_eq!(s[0].category, "lock");
        assert!((s[0].percent - 50.0).abs() < 0.1, "{s:?}");
        assert_eq!(s[1].call.as_deref(), Some("cudaStreamSynchronize"));
        assert!(ps[0].gil.is_none());
    }

    #[test]
    fn gil_waits_name_their_holders() {
        let mut ps = vec![process()];
        let rows = vec![
            row(3, Category::Gil, Some("work (w.py:5)"), Some(Some(2)), 600),
            row(3, Category::Gil, Some("work (w.py:5)"), Some(None), 100),
            row(1, Category::Gil, Some("main (w.py:9)"), Some(Some(2)), 300),
        ];
        fill(&mut ps, &rows, |t| format!("t{t}"));
        let g = ps[0].gil.as_ref().unwrap();
        assert_eq!(g.wait_ns, 1000);
        assert_eq!(g.waiters[0].tid, Some(3));
        assert_eq!(g.waiters[0].ns, 700);
        assert_eq!(g.holders[0].tid, Some(2));
        assert_eq!(g.holders[0].comm, "t2");
        assert!((g.holders[0].percent - 90.0).abs() < 1e-9);
        assert_eq!(g.holders[1].tid, None);
    }
}
