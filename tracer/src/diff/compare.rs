//! The comparison itself, pure: categories, functions, CUDA rates, findings.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::report::{model::Report, units};

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Diff {
    pub before_duration_ns: u64,
    pub after_duration_ns: u64,
    /// before / after run time, when both runs ended because the target exited (a whole
    /// job both times, so shorter is faster).
    pub run_time_speedup: Option<f64>,
    /// Throughput-like rates (per second of window) that exist in both runs, with their ratio.
    pub rates: Vec<RateChange>,
    /// Share of all threads' wall time per category, largest change first.
    pub categories: Vec<Change>,
    /// Share of CPU samples per function (self), largest change first.
    pub functions: Vec<Change>,
    pub findings_gone: Vec<FindingRef>,
    pub findings_new: Vec<FindingRef>,
    pub findings_kept: Vec<(FindingRef, FindingRef)>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Change {
    pub name: String,
    /// Percent before and after (0 when absent).
    pub before: f64,
    pub after: f64,
}

impl Change {
    pub fn delta(&self) -> f64 {
        self.after - self.before
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RateChange {
    pub name: String,
    pub before: f64,
    pub after: f64,
    /// after / before: > 1 means more per second.
    pub ratio: f64,
    /// A run's figure was scaled from the overhead budget's windows (launches), not counted.
    #[serde(default)]
    pub estimated: bool,
}

/// The rates a run scaled from the budget's windows rather than counted.
const SCALED_RATES: [&str; 1] = ["kernel launches/s"];

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FindingRef {
    pub rule: String,
    pub severity: String,
    pub impact_percent: f64,
    pub title: String,
}

/// Per category ns summed over every process (which sums its threads), and the alive total.
fn categories(r: &Report) -> (BTreeMap<String, u64>, u64) {
    let mut m = BTreeMap::new();
    let mut alive = 0;
    for t in r.processes.iter().filter_map(|p| p.time.as_ref()) {
        alive += t.alive_ns;
        for c in &t.categories {
            *m.entry(c.category.clone()).or_insert(0) += c.ns;
        }
    }
    (m, alive)
}

/// Self samples per function over every process.
fn functions(r: &Report) -> (BTreeMap<String, u64>, u64) {
    let mut m = BTreeMap::new();
    for p in &r.processes {
        for f in &p.top_self {
            *m.entry(f.function.clone()).or_insert(0) += f.samples;
        }
    }
    let total = r.processes.iter().map(|p| p.samples).sum();
    (m, total)
}

fn changes(
    (b, btotal): (BTreeMap<String, u64>, u64),
    (a, atotal): (BTreeMap<String, u64>, u64),
) -> Vec<Change> {
    let mut names: Vec<&String> = b.keys().chain(a.keys()).collect();
    names.sort();
    names.dedup();
    let mut out: Vec<Change> = names
        .into_iter()
        .map(|n| Change {
            name: n.clone(),
            before: units::pct(b.get(n).copied().unwrap_or(0), btotal),
            after: units::pct(a.get(n).copied().unwrap_or(0), atotal),
        })
        .collect();
    out.sort_by(|x, y| {
        y.delta()
            .abs()
            .total_cmp(&x.delta().abs())
            .then(x.name.cmp(&y.name))
    });
    out
}

/// Rates both runs can be compared on, per second of their windows.
fn rates(r: &Report) -> BTreeMap<&'static str, f64> {
    let mut m = BTreeMap::new();
    let w = r.window.duration_ns;
    let cuda: Vec<_> = r.processes.iter().filter_map(|p| p.cuda.as_ref()).collect();
    let launches: u64 = cuda
        .iter()
        .flat_map(|c| &c.kernels)
        .map(|k| k.launches)
        .sum();
    if launches > 0 {
        m.insert("kernel launches/s", units::per_sec(launches, w));
    }
    let copied: u64 = cuda.iter().flat_map(|c| &c.copies).map(|k| k.bytes).sum();
    if copied > 0 {
        m.insert("bytes copied to/from GPU/s", units::per_sec(copied, w));
    }
    let read: u64 = r
        .processes
        .iter()
        .flat_map(|p| &p.block_io)
        .map(|b| b.read_bytes)
        .sum();
    if read > 0 {
        m.insert("disk bytes read/s", units::per_sec(read, w));
    }
    m
}

fn fref(f: &crate::report::model::verdict::Finding) -> FindingRef {
    FindingRef {
        rule: f.rule.clone(),
        severity: f.severity.clone(),
        impact_percent: f.impact_percent,
        title: f.title.clone(),
    }
}

pub fn compare(before: &Report, after: &Report) -> Diff {
    let run_time_speedup = (before.window.ended_by == "target-exited"
        && after.window.ended_by == "target-exited"
        && after.window.duration_ns > 0)
        .then(|| before.window.duration_ns as f64 / after.window.duration_ns as f64);
    let (rb, ra) = (rates(before), rates(after));
    let rates = rb
        .iter()
        .filter_map(|(k, &b)| {
            ra.get(k).map(|&a| RateChange {
                name: k.to_string(),
                before: b,
                after: a,
                ratio: if b > 0.0 { a / b } else { 0.0 },
                estimated: SCALED_RATES.contains(k)
                    && [before, after]
                        .iter()
                        .any(|r| r.overhead.as_ref().is_some_and(|o| o.sampled.is_some())),
            })
        })
        .collect();
    // Findings match by rule: pids differ between runs.
    let by_rule = |r: &Report| -> BTreeMap<String, FindingRef> {
        let mut m = BTreeMap::new();
        for f in &r.findings {
            m.entry(f.rule.clone()).or_insert_with(|| fref(f));
        }
        m
    };
    let (fb, fa) = (by_rule(before), by_rule(after));
    Diff {
        before_duration_ns: before.window.duration_ns,
        after_duration_ns: after.window.duration_ns,
        run_time_speedup,
        rates,
        categories: changes(categories(before), categories(after)),
        functions: changes(functions(before), functions(after)),
        findings_gone: fb
            .iter()
            .filter(|(k, _)| !fa.contains_key(*k))
            .map(|(_, v)| v.clone())
            .collect(),
        findings_new: fa
            .iter()
            .filter(|(k, _)| !fb.contains_key(*k))
            .map(|(_, v)| v.clone())
            .collect(),
        findings_kept: fb
            .iter()
            .filter_map(|(k, v)| fa.get(k).map(|a| (v.clone(), a.clone())))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        report::fixtures::{self, *},
        verdict,
    };

    /// The data-loading job, then the same job with the loading fixed: the trainer computes.
    fn runs() -> (Report, Report) {
        let mut before = fixtures::data_loading_job();
        before.window.ended_by = "target-exited".into();
        before.processes[0].samples = 297;
        verdict::apply(&mut before);
        let mut after = fixtures::report();
        after.window.ended_by = "target-exited".into();
        after.window.duration_ns = 4 * SEC;
        let mut t = thread(100, "python", &[("cpu", 45.0), ("ipc", 5.0)]);
        t.time = Some(time(4 * SEC, &[("cpu", 45.0), ("ipc", 5.0)]));
        let mut p = process(100, None, "python", vec![t]);
        p.samples = 180;
        p.top_self = vec![
            f("_PyEval_EvalFrameDefault", 50.0, 90),
            f("sgemm", 30.0, 54),
        ];
        after.processes.push(p);
        verdict::apply(&mut after);
        (before, after)
    }

    #[test]
    fn fixed_data_loading_shows_as_improvement() {
        let (b, a) = runs();
        let d = compare(&b, &a);
        assert_eq!(d.run_time_speedup, Some(2.5));
        assert_eq!(d.findings_gone.len(), 1);
        assert_eq!(d.findings_gone[0].rule, "data-loading-bound");
        assert!(d.findings_new.is_empty() && d.findings_kept.is_empty());
        let ipc = d.categories.iter().find(|c| c.name == "ipc").unwrap();
        assert_eq!((ipc.before, ipc.after), (15.0, 5.0));
        let io = d.categories.iter().find(|c| c.name == "io").unwrap();
        assert!(io.before > 40.0 && io.after == 0.0);
        assert_eq!(d.categories[0].name, "io", "largest change first");
        let sgemm = d.functions.iter().find(|c| c.name == "sgemm").unwrap();
        assert_eq!((sgemm.before, sgemm.after), (0.0, 30.0));
        // Reversed, the finding appeared.
        let r = compare(&a, &b);
        assert_eq!(r.findings_new[0].rule, "data-loading-bound");
        assert_eq!(r.run_time_speedup, Some(0.4));
    }

    #[test]
    fn rates_compare_only_what_both_have() {
        let (mut b, mut a) = runs();
        assert!(compare(&b, &a).rates.is_empty(), "after has no block I/O");
        for r in [&mut b, &mut a] {
            r.processes[0].cuda = Some(crate::report::model::cuda::ProcessCuda {
                kernels: vec![crate::report::model::cuda::KernelStat {
                    name: "k".into(),
                    launches: 1000,
                    ..Default::default()
                }],
                ..Default::default()
            });
        }
        let d = compare(&b, &a);
        assert_eq!(d.rates.len(), 1);
        assert_eq!(d.rates[0].name, "kernel launches/s");
        assert_eq!(
            (d.rates[0].before, d.rates[0].after, d.rates[0].ratio),
            (100.0, 250.0, 2.5)
        );
    }
}
