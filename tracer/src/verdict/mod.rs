//! The verdict engine: reads a finished [`Report`] (time accounting, syscalls, block I/O, CUDA,
//! NVML, CPU profile) and ranks findings, each with a severity, the share of wall time at
//! stake, the numbers it rests on and what to do. Pure; the rules and their thresholds are
//! documented in docs/verdicts.md and live in [`thresholds`].

mod gpu;
pub use gpu::util_since_work;
mod host;
#[cfg(test)]
mod tests;
pub mod thresholds;

use crate::report::{
    model::{time::TimeBreakdown, verdict::Finding, ProcessReport, Report, ThreadReport},
    units,
};

/// Replaces `report.findings` with the ranked findings of every rule.
pub fn apply(report: &mut Report) {
    report.findings = evaluate(report);
}

/// All findings, most important first.
pub fn evaluate(r: &Report) -> Vec<Finding> {
    let mut out = Vec::new();
    // Threads and processes a data-loading finding already explains: their own I/O or CPU
    // time is the cause named there, not a second bottleneck.
    let mut explained: Vec<u32> = Vec::new();
    for (f, workers) in host::data_loading(r) {
        explained.extend(workers);
        out.push(f);
    }
    out.extend(host::io_bound(r, &explained));
    out.extend(host::cpu_bound(r, &explained));
    out.extend(host::cpu_contention(r));
    out.extend(host::gil_contention(r));
    let gpu_bound = gpu::gpu_bound(r);
    let gpu_bound_pids: Vec<u32> = gpu_bound.iter().filter_map(|f| f.pid).collect();
    out.extend(gpu_bound);
    out.extend(gpu::launch_bound(r));
    out.extend(gpu::transfer_bound(r));
    out.extend(gpu::sync_heavy(r, &gpu_bound_pids));
    out.extend(gpu::allocation_churn(r));
    out.extend(gpu::memory_not_freed(r));
    out.extend(gpu::cuda_errors(r));
    out.extend(gpu::gpu_idle(r));
    // Nothing of its own slows it: what it waited in is the lead (a hung job, or one that
    // waits on a process gputrace does not trace). Also beside low findings when no traced
    // thread did anything (a hung job whose helper's CUDA calls failed): with a busy thread
    // somewhere the job runs, and its idle helpers are no lead.
    if out.iter().all(|f| f.severity == "low") && (out.is_empty() || host::all_idle(r)) {
        out.extend(host::waiting(r));
    }
    rank(&mut out);
    out
}

/// Highest impact first; ties broken by severity, then rule id, so the order is stable.
fn rank(findings: &mut [Finding]) {
    findings.sort_by(|a, b| {
        b.impact_percent
            .total_cmp(&a.impact_percent)
            .then(severity_rank(&a.severity).cmp(&severity_rank(&b.severity)))
            .then(a.rule.cmp(&b.rule))
            .then(a.pid.cmp(&b.pid))
    });
}

fn severity_rank(s: &str) -> u8 {
    match s {
        "critical" => 0,
        "high" => 1,
        "medium" => 2,
        _ => 3,
    }
}

/// Severity from the share of wall time at stake.
pub(crate) fn severity(impact: f64) -> &'static str {
    use thresholds::*;
    if impact >= SEVERITY_CRITICAL {
        "critical"
    } else if impact >= SEVERITY_HIGH {
        "high"
    } else if impact >= SEVERITY_MEDIUM {
        "medium"
    } else {
        "low"
    }
}

/// Share of the window a thread (or process) was alive, 0..1: scales its impact.
pub(crate) fn weight(r: &Report, alive_ns: u64) -> f64 {
    (units::pct(alive_ns, r.window.duration_ns) / 100.0).min(1.0)
}

/// Alive long enough in the window to be judged at all.
pub(crate) fn substantial(r: &Report, t: &TimeBreakdown) -> bool {
    units::pct(t.alive_ns, r.window.duration_ns) >= thresholds::MIN_ALIVE_SHARE
}

/// "of wall time" for a thread alive the whole window, "of its 1.20 s" for a shorter one.
pub(crate) fn of_life(r: &Report, t: &TimeBreakdown) -> String {
    if weight(r, t.alive_ns) >= 0.9 {
        "of wall time".into()
    } else {
        format!("of its {} alive", units::dur(t.alive_ns))
    }
}

/// ns of the named categories.
pub(crate) fn cat_ns(t: &TimeBreakdown, names: &[&str]) -> u64 {
    t.categories
        .iter()
        .filter(|c| names.contains(&c.category.as_str()))
        .map(|c| c.ns)
        .sum()
}

/// Share of alive time in the named categories (percent).
pub(crate) fn cat_pct(t: &TimeBreakdown, names: &[&str]) -> f64 {
    units::pct(cat_ns(t, names), t.alive_ns)
}

/// `"futex 1.2 s (340x), read 0.4 s (12x)"`: the largest reasons behind the categories.
pub(crate) fn top_reasons(t: &TimeBreakdown, names: &[&str], n: usize) -> String {
    let mut rs: Vec<_> = t
        .reasons
        .iter()
        .filter(|r| names.contains(&r.category.as_str()))
        .collect();
    rs.sort_by(|a, b| b.ns.cmp(&a.ns).then(a.reason.cmp(&b.reason)));
    rs.iter()
        .take(n)
        .map(|r| format!("{} {} ({}x)", r.reason, units::dur(r.ns), r.count))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The Python line under which a thread spent most of its time in `names` (its innermost
/// Python frame), with that time's share of the thread's life.
pub(crate) fn python_line<'a>(t: &'a ThreadReport, names: &[&str]) -> Option<(&'a str, f64)> {
    t.python_sites
        .iter()
        .filter(|s| names.contains(&s.category.as_str()))
        .max_by_key(|s| s.ns)
        .map(|s| (s.frame.as_str(), s.percent))
}

/// `"Python lines: Queue.get (queue.py:171) 1.2 s, read (io.py:3) 0.4 s"` for the time in `names`.
pub(crate) fn python_lines(t: &ThreadReport, names: &[&str], n: usize) -> Option<String> {
    let lines: Vec<String> = t
        .python_sites
        .iter()
        .filter(|s| names.contains(&s.category.as_str()))
        .take(n)
        .map(|s| format!("{} {}", s.frame, units::dur(s.ns)))
        .collect();
    (!lines.is_empty()).then(|| format!("Python lines: {}", lines.join(", ")))
}

/// Where a process's threads made the CUDA calls of `category`, most time first:
/// (`"cudaStreamSynchronize called from train_step (train.py:88)"`, its time).
pub(crate) fn cuda_call_sites(p: &ProcessReport, category: &str, n: usize) -> Vec<(String, u64)> {
    let mut sites: Vec<_> = p
        .threads
        .iter()
        .flat_map(|t| &t.python_sites)
        .filter(|s| s.category == category)
        .collect();
    sites.sort_by(|a, b| b.ns.cmp(&a.ns).then(a.frame.cmp(&b.frame)));
    sites
        .into_iter()
        .take(n)
        .map(|s| {
            (
                format!(
                    "{} called from `{}`",
                    s.call.as_deref().unwrap_or("CUDA"),
                    s.frame
                ),
                s.ns,
            )
        })
        .collect()
}

/// `"main thread of python (pid 12)"` or `"thread pt_data (tid 14, pid 12)"`.
pub(crate) fn thread_label(p: &ProcessReport, t: &ThreadReport) -> String {
    if t.tid == p.pid {
        format!("the main thread of {} (pid {})", p.comm, p.pid)
    } else {
        let comm = if t.comm.is_empty() { &p.comm } else { &t.comm };
        format!("thread {} (tid {}, pid {})", comm, t.tid, p.pid)
    }
}

pub(crate) fn finding(
    rule: &str,
    impact: f64,
    title: String,
    evidence: Vec<String>,
    suggestions: Vec<&str>,
    pid: Option<u32>,
    tid: Option<u32>,
) -> Finding {
    Finding {
        rule: rule.into(),
        severity: severity(impact).into(),
        title,
        impact_percent: (impact.clamp(0.0, 100.0) * 10.0).round() / 10.0,
        evidence,
        suggestions: suggestions.into_iter().map(String::from).collect(),
        pid,
        tid,
    }
}
