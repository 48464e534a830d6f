//! `report.html`: one self-contained file (no network, no external assets) with the verdict,
//! time breakdown bars (CSS), GPU utilisation chart (inline SVG), tables and the flame graphs
//! embedded as data URIs.

use std::{fmt::Write as _, io::Write};

use anyhow::Result;

use super::{
    flamegraph, folded,
    model::{time::TimeBreakdown, ProcessReport, Report},
    units, Exporter, ReportData,
};

const CSS: &str = r#"
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1200px;padding:16px;color:#1d1d1f;background:#fafafa}
h1{font-size:22px;margin:0 0 4px} h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:18px 0 6px} .meta{color:#666}
.finding{border-left:6px solid #999;background:#fff;margin:10px 0;padding:8px 12px;border-radius:4px;box-shadow:0 1px 2px #0002}
.critical{border-color:#c62828}.high{border-color:#ef6c00}.medium{border-color:#f9a825}.low{border-color:#0277bd}
.sev{font-weight:700;text-transform:uppercase;font-size:12px;margin-right:6px}
.finding ul{margin:4px 0 0 18px;padding:0} .evidence{color:#555} .suggest li{color:#1b5e20}
.bar{display:flex;height:18px;width:100%;background:#eee;border-radius:3px;overflow:hidden;margin:2px 0 6px}
.bar div{height:100%;font-size:11px;line-height:18px;color:#fff;text-shadow:0 0 2px #000;overflow:hidden;white-space:nowrap;padding-left:3px;box-sizing:border-box} .row{display:grid;grid-template-columns:260px 1fr;gap:8px;align-items:center}
.legend span{display:inline-block;margin-right:12px;font-size:12px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:middle}
table{border-collapse:collapse;background:#fff;margin:4px 0 10px;font-size:13px}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:right} th{background:#f0f0f0}
td:first-child,th:first-child{text-align:left;max-width:560px;overflow-wrap:anywhere}
.pair{display:flex;gap:24px;flex-wrap:wrap}
img.flame{width:100%;border:1px solid #ddd;background:#fff}
"#;

fn color(cat: &str) -> &'static str {
    match cat {
        "cpu" => "#43a047",
        "runqueue" => "#e53935",
        "io" => "#1e88e5",
        "net" => "#3949ab",
        "ipc" => "#fb8c00",
        "lock" => "#f4511e",
        "gil" => "#8d6e63",
        "poll" => "#fdd835",
        "sleep" => "#bdbdbd",
        "other" => "#9e9e9e",
        "cuda_launch" => "#8e24aa",
        "cuda_memcpy" => "#d81b60",
        "cuda_sync" => "#00897b",
        "cuda_malloc" => "#6d4c41",
        _ => "#5e35b1",
    }
}

pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '&' => o.push_str("&amp;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            _ => o.push(c),
        }
    }
    o
}

pub fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut o = String::with_capacity(data.len().div_ceil(3) * 4);
    for ch in data.chunks(3) {
        let b = [ch[0], *ch.get(1).unwrap_or(&0), *ch.get(2).unwrap_or(&0)];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        o.push(T[(n >> 18) as usize & 63] as char);
        o.push(T[(n >> 12) as usize & 63] as char);
        o.push(if ch.len() > 1 {
            T[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        o.push(if ch.len() > 2 {
            T[n as usize & 63] as char
        } else {
            '='
        });
    }
    o
}

fn table(o: &mut String, head: &[&str], rows: &[Vec<String>]) {
    if rows.is_empty() {
        return;
    }
    o.push_str("<table><tr>");
    for h in head {
        let _ = write!(o, "<th>{}</th>", esc(h));
    }
    o.push_str("</tr>");
    for r in rows {
        o.push_str("<tr>");
        for c in r {
            let _ = write!(o, "<td>{}</td>", esc(c));
        }
        o.push_str("</tr>");
    }
    o.push_str("</table>\n");
}

fn bar(o: &mut String, label: &str, t: &TimeBreakdown) {
    let _ = write!(o, "<div class=row><div>{}</div><div class=bar>", esc(label));
    for c in t.categories.iter().filter(|c| c.ns > 0) {
        let pct = units::pct(c.ns, t.alive_ns);
        // Wide segments say what they are; narrow ones keep it in the tooltip.
        let label = if pct >= 8.0 {
            format!("{} {pct:.0}%", esc(&c.category))
        } else {
            String::new()
        };
        let _ = write!(
            o,
            "<div style=\"width:{pct:.2}%;background:{}\" title=\"{} {pct:.1}% ({})\">{label}</div>",
            color(&c.category),
            esc(&c.category),
            esc(&units::dur(c.ns))
        );
    }
    o.push_str("</div></div>\n");
}

fn legend(o: &mut String, r: &Report) {
    let mut cats: Vec<&str> = Vec::new();
    for p in &r.processes {
        let all = p
            .time
            .iter()
            .chain(p.threads.iter().filter_map(|t| t.time.as_ref()));
        for t in all {
            for c in &t.categories {
                if !cats.contains(&c.category.as_str()) {
                    cats.push(&c.category);
                }
            }
        }
    }
    if cats.is_empty() {
        return;
    }
    o.push_str("<p class=legend>");
    for c in cats {
        let _ = write!(
            o,
            "<span><i style=\"background:{}\"></i>{}</span>",
            color(c),
            esc(c)
        );
    }
    o.push_str("</p>\n");
}

fn process(o: &mut String, r: &Report, p: &ProcessReport) {
    let _ = write!(
        o,
        "<h2>pid {} {}{}</h2><p class=meta>{} &middot; {} samples{}</p>",
        p.pid,
        esc(&p.comm),
        p.ppid.map(|pp| format!(" (ppid {pp})")).unwrap_or_default(),
        esc(&p.cmdline.join(" ")),
        p.samples,
        if p.exited { " &middot; exited" } else { "" }
    );
    if let Some(t) = &p.time {
        o.push_str("<h3>Where wall time went</h3>\n");
        bar(o, &format!("all threads ({})", units::dur(t.alive_ns)), t);
        for th in &p.threads {
            if let Some(tb) = &th.time {
                bar(
                    o,
                    &format!("{} {} ({})", th.tid, th.comm, units::dur(tb.alive_ns)),
                    tb,
                );
            }
        }
    }
    let fns = |list: &[crate::aggregate::cpu::FnStat]| -> Vec<Vec<String>> {
        list.iter()
            .map(|f| {
                vec![
                    f.function.clone(),
                    f.module.clone().unwrap_or_default(),
                    f.samples.to_string(),
                    format!("{:.1}%", f.percent),
                ]
            })
            .collect()
    };
    if !p.top_self.is_empty() {
        o.push_str("<h3>Top functions (self)</h3>");
        table(
            o,
            &["function", "module", "samples", "share"],
            &fns(&p.top_self),
        );
        o.push_str("<h3>Top functions (total)</h3>");
        table(
            o,
            &["function", "module", "samples", "share"],
            &fns(&p.top_total),
        );
    }
    if let Some(c) = &p.cuda {
        let api: Vec<Vec<String>> = c
            .api
            .iter()
            .map(|a| {
                vec![
                    a.function.clone(),
                    a.count.to_string(),
                    units::dur(a.total_ns),
                    units::dur(a.total_ns.checked_div(a.count).unwrap_or(0)),
                    units::dur(a.max_ns),
                    a.errors
                        .iter()
                        .map(|e| format!("{} x{}", e.name, e.count))
                        .collect::<Vec<_>>()
                        .join(", "),
                ]
            })
            .collect();
        if !api.is_empty() {
            o.push_str("<h3>CUDA calls</h3>");
            table(
                o,
                &["function", "count", "total", "mean", "max", "errors"],
                &api,
            );
        }
        let ks: Vec<Vec<String>> = c
            .kernels
            .iter()
            .map(|k| {
                vec![
                    k.name.clone(),
                    k.launches.to_string(),
                    format!("{}x{}x{}", k.grid[0], k.grid[1], k.grid[2]),
                    format!("{}x{}x{}", k.block[0], k.block[1], k.block[2]),
                    units::dur(k.launch_ns.checked_div(k.launches).unwrap_or(0)),
                ]
            })
            .collect();
        if !ks.is_empty() {
            o.push_str("<h3>Kernels</h3>");
            table(
                o,
                &["kernel", "launches", "grid", "block", "CPU per launch"],
                &ks,
            );
        }
        let cs: Vec<Vec<String>> = c
            .copies
            .iter()
            .map(|k| {
                vec![
                    format!("{} {}", k.direction, k.mode),
                    k.count.to_string(),
                    units::bytes(k.bytes),
                    units::dur(k.total_ns),
                    format!("{:.2}", k.gbps),
                ]
            })
            .collect();
        if !cs.is_empty() {
            o.push_str("<h3>Copies</h3>");
            table(o, &["direction", "count", "bytes", "in calls", "GB/s"], &cs);
        }
    }
    let sc: Vec<Vec<String>> = p
        .syscalls
        .iter()
        .map(|s| {
            vec![
                s.name.clone(),
                s.count.to_string(),
                s.errors.to_string(),
                units::dur(s.total_ns),
                units::dur(s.total_ns.checked_div(s.count).unwrap_or(0)),
                units::dur(s.max_ns),
                units::bytes(s.bytes),
            ]
        })
        .collect();
    if !sc.is_empty() {
        o.push_str("<h3>Syscalls</h3>");
        if let Some(partial) = r.overhead.as_ref().and_then(|ov| ov.syscalls_partial()) {
            let _ = write!(
                o,
                "<p><b>{}</b> (see Limits of this trace)</p>",
                esc(&partial)
            );
        }
        table(
            o,
            &[
                "syscall", "count", "errors", "total", "mean", "max", "bytes",
            ],
            &sc,
        );
    }
    let files: Vec<Vec<String>> = p
        .files
        .iter()
        .map(|f| {
            vec![
                f.file.clone(),
                units::dur(f.ns),
                f.calls.to_string(),
                units::bytes(f.bytes),
            ]
        })
        .collect();
    if !files.is_empty() {
        o.push_str("<h3>Files</h3>");
        table(o, &["file", "time", "calls", "bytes"], &files);
    }
    let dirs: Vec<Vec<String>> = p
        .dirs
        .iter()
        .map(|d| {
            vec![
                d.dir.clone(),
                d.files.to_string(),
                units::dur(d.ns),
                d.calls.to_string(),
                units::bytes(d.bytes),
            ]
        })
        .collect();
    if !dirs.is_empty() {
        o.push_str("<h3>Directories</h3>");
        table(o, &["directory", "files", "time", "calls", "bytes"], &dirs);
    }
    let bio: Vec<Vec<String>> = p
        .block_io
        .iter()
        .map(|b| {
            vec![
                b.device.clone(),
                match &b.sampled {
                    Some(s) => format!(
                        "~{} (+/-{:.1}%, {} counted)",
                        b.requests,
                        b.requests_rel_error() * 100.0,
                        s.seen
                    ),
                    None => b.requests.to_string(),
                },
                units::bytes(b.read_bytes),
                units::bytes(b.write_bytes),
                units::rate(b.read_bytes, r.window.duration_ns),
                units::dur(b.total_ns.checked_div(b.requests).unwrap_or(0)),
            ]
        })
        .collect();
    if !bio.is_empty() {
        o.push_str("<h3>Block I/O</h3>");
        table(
            o,
            &[
                "device",
                "requests",
                "read",
                "written",
                "read rate",
                "mean latency",
            ],
            &bio,
        );
    }
}

/// GPU utilisation over the window as an inline SVG line chart.
fn nvml_chart(o: &mut String, r: &Report) {
    let Some(n) = &r.nvml else { return };
    o.push_str("<h2>GPU</h2>\n");
    if !n.available {
        let _ = writeln!(
            o,
            "<p>Not sampled: {}</p>",
            esc(n.reason.as_deref().unwrap_or("NVML unavailable"))
        );
        return;
    }
    let span = r.window.duration_ns.max(1) as f64;
    for g in &n.gpus {
        let pts: Vec<String> = g
            .samples
            .iter()
            .map(|s| {
                format!(
                    "{:.1},{:.1}",
                    s.t_ns as f64 / span * 800.0,
                    100.0 - s.util_gpu.min(100) as f64
                )
            })
            .collect();
        let since = crate::verdict::util_since_work(r, g)
            .map(|(u, from)| {
                format!(
                    " ({u:.0}% since the job's first GPU allocation at {})",
                    crate::report::units::dur(from)
                )
            })
            .unwrap_or_default();
        let _ = write!(
            o,
            "<h3>GPU {} {}: mean utilisation {:.0}%{}</h3>\
             <svg width=800 height=110 viewBox=\"0 -5 800 110\" style=\"background:#fff;border:1px solid #ddd\">\
             <line x1=0 y1=0 x2=800 y2=0 stroke=#eee /><line x1=0 y1=50 x2=800 y2=50 stroke=#eee />\
             <polyline fill=none stroke=#00897b stroke-width=2 points=\"{}\"/></svg>",
            g.index,
            esc(&g.name),
            g.mean_util_percent,
            esc(&since),
            pts.join(" ")
        );
    }
}

/// A flame graph of the report, as an image, linked to the interactive one written beside
/// report.html (`file`): an image runs no script, so it neither zooms nor searches, and a
/// name too long for its frame stays cut.
struct Flame<'a> {
    title: &'a str,
    /// What a frame's width counts (`samples`, `us`).
    count_name: &'a str,
    lines: &'a [String],
    file: &'a str,
}

fn flame(o: &mut String, f: &Flame) -> Result<()> {
    let mut svg = Vec::new();
    flamegraph::write_svg(f.title, f.count_name, f.lines, &mut svg)?;
    let _ = write!(
        o,
        "<h3>{} <small class=meta>(<a href=\"{file}\">{file}</a>: click to zoom, Ctrl-F to \
         search)</small></h3><a href=\"{file}\"><img class=flame alt=\"{}\" \
         src=\"data:image/svg+xml;base64,{}\"></a>",
        esc(f.title),
        esc(f.title),
        base64(&svg),
        file = esc(f.file),
    );
    Ok(())
}

pub fn render(data: &ReportData) -> Result<String> {
    let r = &data.report;
    let mut o = String::new();
    let what = match &r.target.command {
        Some(c) => c.join(" "),
        None => format!("pid {:?}", r.target.pids),
    };
    let _ = write!(
        o,
        "<!DOCTYPE html><html><head><meta charset=utf-8><title>gputrace: {}</title><style>{CSS}</style></head><body>\n\
         <h1>gputrace: {}</h1><p class=meta>{} &middot; {:.2} s ({}) &middot; {} processes &middot; {} samples at {} Hz on {} CPUs</p>\n",
        esc(&what),
        esc(&what),
        esc(&r.tool),
        r.window.duration_ns as f64 / 1e9,
        esc(&r.window.ended_by),
        r.processes.len(),
        r.sampling.samples,
        r.sampling.frequency_hz,
        r.sampling.cpus
    );
    o.push_str("<h2 id=verdict>Verdict</h2>\n");
    if r.findings.is_empty() {
        o.push_str("<p>No rule fired: no bottleneck reached a threshold.</p>\n");
    }
    for (i, f) in r.findings.iter().enumerate() {
        let _ = write!(
            o,
            "<div class=\"finding {}\"><span class=sev>{}. {} &middot; {:.0}%</span> <b>{}</b>\
             <ul class=evidence>",
            esc(&f.severity),
            i + 1,
            esc(&f.severity),
            f.impact_percent,
            esc(&f.title)
        );
        for e in &f.evidence {
            let _ = write!(o, "<li>{}</li>", esc(e));
        }
        o.push_str("</ul><ul class=suggest>");
        for s in &f.suggestions {
            let _ = write!(o, "<li>{}</li>", esc(s));
        }
        let _ = writeln!(
            o,
            "</ul><small class=meta>rule {}</small></div>",
            esc(&f.rule)
        );
    }
    o.push_str("<h2 id=flamegraphs>Flame graphs</h2>\n");
    let cpu = folded::lines(&data.cpu);
    flame(
        &mut o,
        &Flame {
            title: "CPU (on-CPU samples)",
            count_name: "samples",
            lines: &cpu,
            file: crate::report::CpuSvg.file_name(),
        },
    )?;
    drop(cpu);
    for (title, lines, file) in [
        (
            "Off-CPU time by reason",
            &data.time.offcpu,
            crate::accounting::render::OffcpuSvg.file_name(),
        ),
        (
            "Wall-clock time: on-CPU and off-CPU by category",
            &data.time.wall,
            crate::accounting::render::WallSvg.file_name(),
        ),
    ] {
        if !lines.is_empty() {
            flame(
                &mut o,
                &Flame {
                    title,
                    count_name: "us",
                    lines,
                    file,
                },
            )?;
        }
    }
    legend(&mut o, r);
    for p in &r.processes {
        process(&mut o, r, p);
    }
    nvml_chart(&mut o, r);
    o.push_str("<h2>Limits of this trace</h2><ul>");
    if let Some(ov) = &r.overhead {
        let _ = write!(o, "<li>{}</li>", esc(&ov.summary()));
        for l in ov.limit_lines() {
            let _ = write!(o, "<li><b>{}</b></li>", esc(&l));
        }
    }
    if r.drops.is_empty() {
        o.push_str("<li>No events dropped.</li>");
    }
    for d in &r.drops {
        let _ = write!(
            o,
            "<li>Dropped: {} {}{}</li>",
            d.count,
            esc(&d.affects),
            esc(&d.detail())
        );
    }
    for b in &r.blind_spots {
        let _ = write!(o, "<li>Blind spot: {}</li>", esc(b));
    }
    if let Some(t) = &r.timeline {
        let _ = write!(
            o,
            "<li>Timeline (trace.json): {} events, {} counter samples kept; {} events and {} \
             samples cut over --timeline-limit {}.</li>",
            t.events, t.counter_samples, t.cut_events, t.cut_counter_samples, t.limit
        );
        if t.cuda_calls_below_threshold > 0 {
            let _ = write!(
                o,
                "<li>Timeline: {} short CUDA calls (under the 20 us threshold) counted, not \
                 drawn.</li>",
                t.cuda_calls_below_threshold
            );
        }
    }
    for w in &r.warnings {
        let _ = write!(o, "<li>Warning: {}</li>", esc(w));
    }
    o.push_str("</ul></body></html>\n");
    Ok(o)
}

pub fn write(data: &ReportData, out: &mut dyn Write) -> Result<()> {
    out.write_all(render(data)?.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        aggregate::cpu::{CpuProfile, StackSample},
        report::{fixtures, timeline::Timeline},
        symbolize::Frame,
    };

    fn frame(n: &str) -> Frame {
        Frame::native(n, None)
    }

    #[test]
    fn self_contained_with_verdict_bars_and_flame() {
        let mut r = fixtures::data_loading_job();
        r.nvml = Some(fixtures::nvml(40.0));
        r.processes[0].comm = "py<thon>".into();
        r.processes[0].dirs = vec![crate::report::model::time::DirIo {
            dir: "/data/train".into(),
            files: 1200,
            ns: 3_000_000_000,
            bytes: 1 << 30,
            calls: 2400,
        }];
        crate::verdict::apply(&mut r);
        let cpu = CpuProfile::from_samples([StackSample {
            pid: 100,
            tid: 100,
            comm: "python".into(),
            frames: vec![frame("main"), frame("hot_loop")],
            count: 10,
            kernel_mode: false,
        }]);
        let data = ReportData {
            report: r,
            cpu,
            timeline: Timeline::default(),
            time: crate::accounting::Folded {
                offcpu: vec!["python;[sleep];nanosleep 5".into()],
                ..Default::default()
            },
        };
        let html = render(&data).unwrap();
        // A sample page to look at (headless Chromium screenshot), written only when asked.
        if let Some(path) = std::env::var_os("GPUTRACE_HTML_SAMPLE") {
            std::fs::write(path, &html).unwrap();
        }
        assert!(html.starts_with("<!DOCTYPE html>"));
        let (v, f, p) = (
            html.find("id=verdict").unwrap(),
            html.find("id=flamegraphs").unwrap(),
            html.find("<h2>pid 100").unwrap(),
        );
        assert!(v < f && f < p, "verdict, then flame graphs, then processes");
        for bad in ["http://", "https://", "<script src", "<link"] {
            assert!(!html.contains(bad), "external reference {bad}");
        }
        assert!(html.contains("finding critical"));
        assert!(html.contains("waited 55% of wall time for data"));
        assert!(html.contains("py&lt;thon&gt;") && !html.contains("py<thon>"));
        assert!(html.contains("title=\"ipc 45.0% (4.50 s)\">ipc 45%</div>"));
        assert!(html.contains("<h3>Directories</h3>"));
        assert!(html.contains("<td>/data/train</td><td>1200</td><td>3.00 s</td>"));
        assert!(html.contains("<polyline"));
        // Each image links to its interactive flame graph beside the report; no wall-clock
        // one without its rows.
        assert!(html.contains("<a href=\"cpu.svg\"><img class=flame"));
        assert!(html.contains("<a href=\"offcpu.svg\"><img class=flame"));
        assert!(!html.contains("wall.svg"));
        let b64 = html.split("data:image/svg+xml;base64,").nth(1).unwrap();
        assert!(b64.len() > 100);
        assert!(html.ends_with("</html>\n"));
    }

    #[test]
    fn base64_matches_rfc4648() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }
}
