//! The diff as text, 100 columns.

use std::fmt::Write as _;

use super::compare::{Change, Diff};
use crate::report::units;

const ROWS: usize = 10;

fn changes(o: &mut String, title: &str, list: &[Change]) {
    let shown: Vec<&Change> = list
        .iter()
        .filter(|c| c.delta().abs() >= 0.05)
        .take(ROWS)
        .collect();
    if shown.is_empty() {
        if !list.is_empty() {
            let _ = writeln!(o, "\n{title}: no change of 0.1 pt or more");
        }
        return;
    }
    let _ = writeln!(
        o,
        "\n{title:<58} {:>9} {:>9} {:>10}",
        "before", "after", "change"
    );
    for c in shown {
        let name: String = if c.name.chars().count() > 56 {
            c.name.chars().take(55).chain(['…']).collect()
        } else {
            c.name.clone()
        };
        let _ = writeln!(
            o,
            "  {name:<56} {:>8.1}% {:>8.1}% {:>+9.1}pt",
            c.before,
            c.after,
            c.delta()
        );
    }
}

pub fn text(d: &Diff, before: &str, after: &str) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "gputrace diff: {before} -> {after}");
    let _ = writeln!(
        o,
        "run time: {} -> {}{}",
        units::dur(d.before_duration_ns),
        units::dur(d.after_duration_ns),
        match d.run_time_speedup {
            // Two runs of one length (`demo --seconds`, a loop with a time limit) finish
            // together whatever they did: their rates below tell them apart.
            Some(s) if (s - 1.0).abs() < 0.02 => {
                format!("  speedup {s:.2}x (a fixed-length run? compare the rates)")
            }
            Some(s) => format!("  speedup {s:.2}x"),
            None => "  (no speedup: a run did not end with its target)".into(),
        }
    );
    for r in &d.rates {
        let _ = writeln!(
            o,
            "{}: {} -> {}  ({:.2}x){}",
            r.name,
            rate_value(&r.name, r.before),
            rate_value(&r.name, r.after),
            r.ratio,
            if r.estimated {
                "  ESTIMATED (scaled from the budget's windows)"
            } else {
                ""
            }
        );
    }
    changes(
        &mut o,
        "wall time by category (share of all threads)",
        &d.categories,
    );
    changes(
        &mut o,
        "functions (share of CPU samples, self)",
        &d.functions,
    );
    let _ = writeln!(o, "\nfindings");
    for f in &d.findings_gone {
        let _ = writeln!(
            o,
            "  gone:    {} ({:.0}%, {})",
            f.rule, f.impact_percent, f.severity
        );
    }
    for f in &d.findings_new {
        let _ = writeln!(
            o,
            "  new:     {} ({:.0}%, {})",
            f.rule, f.impact_percent, f.severity
        );
    }
    for (b, a) in &d.findings_kept {
        let _ = writeln!(
            o,
            "  still:   {} ({:.0}% -> {:.0}%)",
            b.rule, b.impact_percent, a.impact_percent
        );
    }
    if d.findings_gone.is_empty() && d.findings_new.is_empty() && d.findings_kept.is_empty() {
        let _ = writeln!(o, "  none in either run");
    }
    o
}

/// A rate as the reports print it: bytes per second in decimal units, counts whole.
fn rate_value(name: &str, v: f64) -> String {
    if name.starts_with("bytes") || name.starts_with("disk bytes") {
        units::bytes(v as u64) + "/s"
    } else {
        format!("{v:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diff::compare::{FindingRef, RateChange};

    #[test]
    fn text_names_speedup_and_findings() {
        let d = Diff {
            before_duration_ns: 10_000_000_000,
            after_duration_ns: 4_000_000_000,
            run_time_speedup: Some(2.5),
            rates: vec![
                RateChange {
                    name: "kernel launches/s".into(),
                    before: 100.0,
                    after: 250.0,
                    ratio: 2.5,
                    estimated: true,
                },
                RateChange {
                    name: "disk bytes read/s".into(),
                    before: 13_929_927.5,
                    after: 7_550_555.9,
                    ratio: 0.54,
                    estimated: false,
                },
            ],
            categories: vec![Change {
                name: "ipc".into(),
                before: 45.0,
                after: 5.0,
            }],
            functions: vec![],
            findings_gone: vec![FindingRef {
                rule: "data-loading-bound".into(),
                severity: "critical".into(),
                impact_percent: 55.0,
                title: "t".into(),
            }],
            findings_new: vec![],
            findings_kept: vec![],
        };
        let t = text(&d, "a.json", "b.json");
        assert!(
            t.contains("run time: 10.00 s -> 4.00 s  speedup 2.50x"),
            "{t}"
        );
        assert!(
            t.contains("kernel launches/s: 100 -> 250  (2.50x)  ESTIMATED"),
            "{t}"
        );
        assert!(
            t.contains("disk bytes read/s: 13.9 MB/s -> 7.6 MB/s  (0.54x)\n"),
            "{t}"
        );
        assert!(t.contains("  ipc "));
        assert!(t.contains("-40.0pt"));
        assert!(t.contains("gone:    data-loading-bound (55%, critical)"));
        assert!(t.lines().all(|l| l.chars().count() <= 100));
        // Equal run times: flagged, not passed off as no change.
        let same = Diff {
            run_time_speedup: Some(1.0),
            after_duration_ns: 10_000_000_000,
            ..d
        };
        let t = text(&same, "a.json", "b.json");
        assert!(t.contains("speedup 1.00x (a fixed-length run?"), "{t}");
        assert!(t.lines().all(|l| l.chars().count() <= 100), "{t}");
    }
}
