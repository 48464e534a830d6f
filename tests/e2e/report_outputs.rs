//! Issue 5: what `--output` writes besides report.json (report.html, trace.json, CSV tables)
//! on a real trace, and `gputrace diff` on real reports and bad input.

use std::path::Path;

use crate::common::*;

fn traced(name: &str) -> std::path::PathBuf {
    let bin = build_c("hot_threads", &[]);
    let dir = out_dir(name);
    let run = gputrace(&[
        "-o",
        dir.to_str().unwrap(),
        "--",
        bin.to_str().unwrap(),
        "2",
    ]);
    assert_eq!(
        run.code(),
        0,
        "stdout:\n{}\nstderr:\n{}",
        run.stdout,
        run.stderr
    );
    assert!(run.stdout.contains("VERDICT"), "{}", run.stdout);
    assert!(
        !run.stdout.contains('\x1b'),
        "no colour when stdout is not a terminal"
    );
    dir
}

fn read(dir: &Path, f: &str) -> String {
    std::fs::read_to_string(dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"))
}

#[test]
fn output_dir_has_html_trace_and_csv() {
    let _g = serial();
    if !require_root("output_dir_has_html_trace_and_csv") {
        return;
    }
    let dir = traced("outputs");
    let html = read(&dir, "report.html");
    assert!(html.contains("<h2 id=verdict>Verdict</h2>"));
    assert!(
        html.contains("data:image/svg+xml;base64,"),
        "flame graph embedded"
    );
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "no network"
    );
    assert!(html.contains("hot_threads"));

    let trace: serde_json::Value = serde_json::from_str(&read(&dir, "trace.json")).unwrap();
    let events = trace["traceEvents"].as_array().expect("traceEvents");
    assert!(events
        .iter()
        .all(|e| e.get("ph").is_some() && e.get("pid").is_some()));
    assert!(events.iter().any(|e| e["name"] == "process_name"));
    // hot_threads forks a child; both processes exit inside the window.
    let instants: Vec<&str> = events
        .iter()
        .filter(|e| e["ph"] == "i")
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert!(
        instants.iter().any(|n| n.starts_with("fork ")),
        "{instants:?}"
    );
    assert!(
        instants.iter().filter(|n| **n == "exit").count() >= 2,
        "{instants:?}"
    );

    let functions = read(&dir, "functions.csv");
    assert!(functions.starts_with("pid,tid,kind,function,module,samples,percent\n"));
    assert!(functions.contains(",burn,"), "{functions}");
    for f in ["syscalls.csv", "kernels.csv", "copies.csv"] {
        assert!(read(&dir, f).starts_with("pid,"), "{f}");
    }
    let report: serde_json::Value = serde_json::from_str(&read(&dir, "report.json")).unwrap();
    assert!(report["findings"].is_array());
    assert_eq!(report["timeline"]["limit"], 200_000);
}

#[test]
fn diff_compares_real_reports_and_rejects_bad_ones() {
    let _g = serial();
    if !require_root("diff_compares_real_reports_and_rejects_bad_ones") {
        return;
    }
    let dir = traced("diff");
    let report = dir.join("report.json");
    let r = report.to_str().unwrap();
    let run = gputrace(&["diff", r, r]);
    assert_eq!(run.code(), 0, "{}", run.stderr);
    assert!(run.stdout.contains("speedup 1.00x"), "{}", run.stdout);
    assert!(run.stdout.contains("findings"), "{}", run.stdout);

    let bad = dir.join("bad.json");
    std::fs::write(&bad, "{\"schema_version\": 1}").unwrap();
    let run = gputrace(&["diff", r, bad.to_str().unwrap()]);
    assert_eq!(run.code(), 2);
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
    assert!(
        run.stderr.contains("not a gputrace report.json"),
        "{}",
        run.stderr
    );

    let run = gputrace(&["diff", r, dir.join("missing.json").to_str().unwrap()]);
    assert_eq!(run.code(), 1);
    assert!(run.stderr.contains("cannot read"), "{}", run.stderr);
}
