//! The terminal report: the verdict first, then per process its time breakdown (a bar per
//! category, for the process and its busiest threads), top functions, CUDA (API, kernels,
//! copies, memory), syscalls, block I/O; then drops, blind spots and warnings. Fits 100
//! columns; ANSI colour only when asked (stdout is a terminal).
//!
//! Each section is one `render_*` function called from [`render`], so a new section is one
//! function and one call line.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::{
    model::{cuda::ProcessCuda, time::TimeBreakdown, verdict::Finding, ProcessReport, Report},
    units,
};

const WIDTH: usize = 100;
const BAR: usize = 40;
/// Threads shown per process (busiest first); the rest are counted.
const MAX_THREADS: usize = 8;
const MAX_ROWS: usize = 8;

/// ANSI styling that is a no-op when colour is off.
#[derive(Clone, Copy)]
pub struct Style {
    color: bool,
}

impl Style {
    fn paint(self, code: &str, s: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
    fn bold(self, s: &str) -> String {
        self.paint("1", s)
    }
    fn dim(self, s: &str) -> String {
        self.paint("2", s)
    }
    fn severity(self, sev: &str, s: &str) -> String {
        let code = match sev {
            "critical" => "1;31",
            "high" => "31",
            "medium" => "33",
            _ => "36",
        };
        self.paint(code, s)
    }
    fn category(self, cat: &str, s: &str) -> String {
        let code = match cat {
            "cpu" => "32",
            "runqueue" => "91",
            "io" | "net" => "34",
            "ipc" | "lock" | "gil" | "poll" => "33",
            "sleep" | "other" => "90",
            _ => "35",
        };
        self.paint(code, s)
    }
}

/// Whether the summary on stdout is coloured: a terminal, unless `NO_COLOR` is set
/// (no-color.org).
pub fn wants_color() -> bool {
    std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
        && std::io::IsTerminal::is_terminal(&std::io::stdout())
}

pub fn render(r: &Report, color: bool) -> String {
    let st = Style { color };
    let mut o = String::new();
    render_header(&mut o, r, st);
    render_verdict(&mut o, r, st);
    let (helpers, shown): (Vec<&ProcessReport>, Vec<&ProcessReport>) =
        r.processes.iter().partition(|p| is_helper(r, p));
    // Folded only beside a process that is shown: a trace of nothing but helpers shows them.
    let (helpers, shown) = if shown.is_empty() {
        (vec![], helpers)
    } else {
        (helpers, shown)
    };
    for p in shown {
        render_process_header(&mut o, p, st);
        render_time(&mut o, p, st);
        render_functions(&mut o, p);
        render_cuda(&mut o, r, p);
        render_syscalls(&mut o, r, p);
        render_block_io(&mut o, r, p);
    }
    render_helpers(&mut o, &helpers);
    render_nvml(&mut o, r);
    render_footer(&mut o, r, st);
    o
}

/// A short-lived helper process (a pyenv shim's readlink, a wrapper's shell): no CPU
/// samples, no CUDA, not a target, alive under 1% of the window. Forty of them buried the one
/// process that mattered under hundreds of lines of empty sections.
fn is_helper(r: &Report, p: &ProcessReport) -> bool {
    p.samples == 0
        && p.cuda.is_none()
        && !r.target.pids.contains(&p.pid)
        && p.time
            .as_ref()
            .is_none_or(|t| t.alive_ns * 100 < r.window.duration_ns)
}

/// The helpers in one line: how many, and their names with counts.
fn render_helpers(o: &mut String, helpers: &[&ProcessReport]) {
    if helpers.is_empty() {
        return;
    }
    let mut names: BTreeMap<&str, usize> = BTreeMap::new();
    for p in helpers {
        *names.entry(p.comm.as_str()).or_default() += 1;
    }
    let mut names: Vec<(&str, usize)> = names.into_iter().collect();
    names.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let list: Vec<String> = names
        .iter()
        .map(|(n, c)| {
            let n = clip(n);
            if *c > 1 {
                format!("{n} x{c}")
            } else {
                n
            }
        })
        .collect();
    line(o, "");
    let text = format!(
        "{} short-lived helper process(es) (no samples, each alive under 1% of the window; in \
         report.json): {}",
        helpers.len(),
        list.join(", ")
    );
    for l in wrap(&text, 100) {
        line(o, &l);
    }
}

fn render_header(o: &mut String, r: &Report, st: Style) {
    let what = match &r.target.command {
        Some(cmd) => format!("`{}`", cmd.join(" ")),
        None => format!(
            "pid {}",
            r.target
                .pids
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    // A command that failed or crashed says so first: the trace may be of a job that died.
    let status = match r.target.exit_code {
        Some(c) if c > 128 => format!(", killed by signal {}", c - 128),
        Some(c) if c != 0 => format!(", exit status {c}"),
        _ => String::new(),
    };
    line(
        o,
        &st.bold(&clip(&format!(
            "gputrace: traced {what} for {:.2}s ({}{status}), {} process(es)",
            r.window.duration_ns as f64 / 1e9,
            r.window.ended_by,
            r.processes.len()
        ))),
    );
    line(
        o,
        &format!(
            "CPU: {} samples at {} Hz on {} CPUs",
            r.sampling.samples, r.sampling.frequency_hz, r.sampling.cpus
        ),
    );
}

fn render_verdict(o: &mut String, r: &Report, st: Style) {
    line(o, "");
    line(o, &st.bold("VERDICT"));
    if r.findings.is_empty() {
        line(
            o,
            "  No rule fired: no bottleneck reached a threshold (docs/verdicts.md).",
        );
        return;
    }
    for (i, f) in r.findings.iter().enumerate() {
        render_finding(o, i + 1, f, st);
    }
}

fn render_finding(o: &mut String, n: usize, f: &Finding, st: Style) {
    let tag = format!("[{} {:.0}%]", f.severity.to_uppercase(), f.impact_percent);
    let head = format!("{n:>2}. {tag} ");
    let indent = head.chars().count();
    let wrapped = wrap(&f.title, WIDTH - indent);
    for (i, l) in wrapped.iter().enumerate() {
        if i == 0 {
            line(
                o,
                &format!("{:>2}. {} {l}", n, st.severity(&f.severity, &tag)),
            );
        } else {
            line(o, &format!("{}{l}", " ".repeat(indent)));
        }
    }
    for e in &f.evidence {
        for (i, l) in wrap(e, WIDTH - 8).iter().enumerate() {
            let lead = if i == 0 { "      - " } else { "        " };
            line(o, &st.dim(&format!("{lead}{l}")));
        }
    }
    for s in &f.suggestions {
        for (i, l) in wrap(s, WIDTH - 8).iter().enumerate() {
            let lead = if i == 0 { "      > " } else { "        " };
            line(o, &format!("{lead}{l}"));
        }
    }
}

fn render_process_header(o: &mut String, p: &ProcessReport, st: Style) {
    line(o, "");
    line(
        o,
        &st.bold(&clip(&format!(
            "pid {} {}{}  {} samples{}",
            p.pid,
            p.comm,
            p.ppid.map(|pp| format!(" (ppid {pp})")).unwrap_or_default(),
            p.samples,
            if p.exited { ", exited" } else { "" }
        ))),
    );
    if !p.cmdline.is_empty() && p.cmdline != [p.comm.clone()] {
        line(o, &clip(&format!("  {}", p.cmdline.join(" "))));
    }
}

/// Where wall time went: the process (all threads summed), then its busiest threads.
pub fn render_time(o: &mut String, p: &ProcessReport, st: Style) {
    let Some(t) = &p.time else {
        let threads: Vec<String> = p
            .threads
            .iter()
            .filter(|t| t.samples > 0)
            .map(|t| format!("{} {} {}", t.tid, t.comm, t.samples))
            .collect();
        if !threads.is_empty() {
            line(o, &clip(&format!("  threads: {}", threads.join(", "))));
        }
        return;
    };
    line(
        o,
        &format!(
            "  wall time of {} thread(s){}, {} alive in the window:",
            p.threads.len() as u64 + p.threads_not_listed,
            if p.threads_not_listed > 0 {
                format!(" ({} listed)", p.threads.len())
            } else {
                String::new()
            },
            units::dur(t.alive_ns)
        ),
    );
    bars(o, t, 6, "    ", st);
    if let Some(g) = &p.gil {
        let holder = g
            .holders
            .iter()
            .find(|h| h.tid.is_some())
            .map(|h| {
                format!(
                    "; held most by tid {}{} ({:.0}% of the wait)",
                    h.tid.unwrap_or(0),
                    if h.comm.is_empty() {
                        String::new()
                    } else {
                        format!(" {}", h.comm)
                    },
                    h.percent
                )
            })
            .unwrap_or_default();
        line(
            o,
            &clip(&format!(
                "    GIL: {} thread(s) waited {}{holder}",
                g.waiters.len(),
                units::dur(g.wait_ns)
            )),
        );
    }
    let mut threads: Vec<_> = p.threads.iter().filter(|t| t.time.is_some()).collect();
    // Busiest first: time not spent sleeping.
    threads.sort_by_key(|t| {
        let tb = t.time.as_ref().expect("filtered");
        std::cmp::Reverse(
            tb.alive_ns
                .saturating_sub(crate::verdict::cat_ns(tb, &["sleep"])),
        )
    });
    if threads.len() > 1 {
        for th in threads.iter().take(MAX_THREADS) {
            let tb = th.time.as_ref().expect("filtered");
            line(
                o,
                &clip(&format!(
                    "    thread {} {} ({} alive)",
                    th.tid,
                    th.comm,
                    units::dur(tb.alive_ns)
                )),
            );
            bars(o, tb, 4, "      ", st);
            // Where in the Python code the biggest wait or CUDA call was.
            if let Some(s) = th.python_sites.iter().max_by_key(|s| s.ns) {
                line(
                    o,
                    &clip(&format!(
                        "      python: {} {:.1}% at {}{}",
                        s.category,
                        s.percent,
                        s.frame,
                        s.call
                            .as_deref()
                            .map(|c| format!(" ({c})"))
                            .unwrap_or_default()
                    )),
                );
            }
        }
        if threads.len() > MAX_THREADS {
            line(
                o,
                &format!("    ... {} more thread(s)", threads.len() - MAX_THREADS),
            );
        }
    }
}

fn bars(o: &mut String, t: &TimeBreakdown, n: usize, indent: &str, st: Style) {
    for c in t.categories.iter().filter(|c| c.ns > 0).take(n) {
        let pct = units::pct(c.ns, t.alive_ns);
        let filled = ((pct / 100.0) * BAR as f64).round() as usize;
        let filled = filled.min(BAR);
        let bar = format!(
            "{}{}",
            st.category(&c.category, &"█".repeat(filled)),
            st.dim(&"·".repeat(BAR - filled))
        );
        let mut reasons: Vec<String> = t
            .reasons
            .iter()
            .filter(|r| r.category == c.category)
            .take(2)
            .map(|r| r.reason.clone())
            .collect();
        if c.category == "cpu" {
            if let Some(u) = t.cpu_user_percent {
                reasons.insert(0, format!("{u:.0}% user"));
            }
        }
        // The bar is BAR columns whatever its escape codes; only the reasons may be cut.
        let room = WIDTH.saturating_sub(indent.len() + 11 + 1 + BAR + 1 + 6 + 1 + 9 + 2);
        let why = if reasons.is_empty() {
            String::new()
        } else {
            format!("  {}", cut(&reasons.join(", "), room))
        };
        let text = format!(
            "{indent}{:<11} {bar} {:>5.1}% {:>9}{why}",
            c.category,
            pct,
            units::dur(c.ns)
        );
        line(o, &text);
    }
}

fn render_functions(o: &mut String, p: &ProcessReport) {
    if p.samples == 0 {
        return;
    }
    if !p.top_python.is_empty() {
        // The innermost Python line of each sample, native code under it included.
        line(
            o,
            "  top Python lines by samples (own time, native calls included):",
        );
        for f in &p.top_python {
            line(o, &fn_line(f));
        }
    }
    line(o, "  top functions by self samples:");
    for f in &p.top_self {
        line(o, &fn_line(f));
    }
    line(o, "  top functions by total samples:");
    for f in &p.top_total {
        line(o, &fn_line(f));
    }
}

/// CUDA API calls, kernels, copies and memory of a process.
pub fn render_cuda(o: &mut String, r: &Report, p: &ProcessReport) {
    let Some(c) = &p.cuda else { return };
    render_cuda_api(o, c);
    if !c.kernels.is_empty() {
        line(
            o,
            &format!(
                "  {:<50} {:>9} {:>14} {:>11} {:>9}",
                "kernels", "launches", "grid", "block", "launch"
            ),
        );
        let mut ks: Vec<_> = c.kernels.iter().collect();
        ks.sort_by_key(|k| std::cmp::Reverse(k.launches));
        for k in ks.iter().take(MAX_ROWS) {
            let g = format!("{}x{}x{}", k.grid[0], k.grid[1], k.grid[2]);
            let b = format!("{}x{}x{}", k.block[0], k.block[1], k.block[2]);
            line(
                o,
                &format!(
                    "    {:<48} {:>9} {:>14} {:>11} {:>9}",
                    cut(&k.name, 48),
                    k.launches,
                    cut(&g, 14),
                    cut(&b, 11),
                    units::dur(k.launch_ns.checked_div(k.launches).unwrap_or(0))
                ),
            );
        }
        more(o, ks.len());
    }
    if !c.copies.is_empty() {
        line(
            o,
            &format!(
                "  {:<16} {:>10} {:>12} {:>12} {:>10}",
                "copies", "count", "bytes", "in calls", "GB/s"
            ),
        );
        for k in &c.copies {
            line(
                o,
                &format!(
                    "    {:<14} {:>10} {:>12} {:>12} {:>10.2}",
                    format!("{} {}", k.direction, k.mode),
                    k.count,
                    units::bytes(k.bytes),
                    units::dur(k.total_ns),
                    k.gbps
                ),
            );
        }
    }
    let m = &c.memory;
    if m.allocs + m.frees > 0 {
        line(
            o,
            &clip(&format!(
                "  GPU memory: {} allocs ({}), {} frees, peak live {}, live at end {}, {} never \
                 freed",
                m.allocs,
                units::bytes(m.alloc_bytes),
                m.frees,
                units::bytes(m.peak_live_bytes),
                units::bytes(m.live_bytes_at_end),
                m.never_freed.len()
            )),
        );
    }
    for lib in &c.libraries {
        line(
            o,
            &clip(&format!(
                "  {} {}: {} probes attached{}",
                lib.kind,
                lib.path,
                lib.attached.len(),
                if lib.failed.is_empty() {
                    String::new()
                } else {
                    format!(", {} failed", lib.failed.len())
                }
            )),
        );
    }
    let _ = r;
}

fn render_cuda_api(o: &mut String, c: &ProcessCuda) {
    if c.api.is_empty() {
        return;
    }
    line(
        o,
        &format!(
            "  {:<36} {:>10} {:>11} {:>10} {:>10} {:>8}",
            "CUDA calls", "count", "total", "mean", "max", "errors"
        ),
    );
    let mut api: Vec<_> = c.api.iter().collect();
    api.sort_by_key(|a| std::cmp::Reverse(a.total_ns));
    for a in api.iter().take(MAX_ROWS) {
        let errors: u64 = a.errors.iter().map(|e| e.count).sum();
        line(
            o,
            &format!(
                "    {:<34} {:>10} {:>11} {:>10} {:>10} {:>8}",
                cut(&a.function, 34),
                a.count,
                units::dur(a.total_ns),
                units::dur(a.total_ns.checked_div(a.count).unwrap_or(0)),
                units::dur(a.max_ns),
                errors
            ),
        );
    }
    more(o, api.len());
}

fn render_syscalls(o: &mut String, r: &Report, p: &ProcessReport) {
    if p.syscalls.is_empty() {
        return;
    }
    if let Some(partial) = r.overhead.as_ref().and_then(|ov| ov.syscalls_partial()) {
        line(o, &format!("  syscalls: {partial} (see the end)"));
    }
    line(
        o,
        &format!(
            "  {:<22} {:>10} {:>8} {:>11} {:>10} {:>10} {:>12}",
            "syscalls", "count", "errors", "total", "mean", "max", "bytes"
        ),
    );
    let mut s: Vec<_> = p.syscalls.iter().collect();
    s.sort_by_key(|s| std::cmp::Reverse(s.total_ns));
    for c in s.iter().take(MAX_ROWS) {
        line(
            o,
            &format!(
                "    {:<20} {:>10} {:>8} {:>11} {:>10} {:>10} {:>12}",
                cut(&c.name, 20),
                c.count,
                c.errors,
                units::dur(c.total_ns),
                units::dur(c.total_ns.checked_div(c.count).unwrap_or(0)),
                units::dur(c.max_ns),
                if c.bytes > 0 {
                    units::bytes(c.bytes)
                } else {
                    "-".into()
                }
            ),
        );
    }
    more(o, s.len());
    let mut files: Vec<_> = p.files.iter().collect();
    files.sort_by_key(|f| std::cmp::Reverse(f.ns));
    for f in files.iter().take(FILE_LINES) {
        line(
            o,
            &clip(&format!(
                "    file {:<50} {:>10} {:>8} calls {:>10}",
                cut(&f.file, 50),
                units::dur(f.ns),
                f.calls,
                units::bytes(f.bytes)
            )),
        );
    }
    // Worth a line when its files are more than the list above could show.
    for d in p
        .dirs
        .iter()
        .take(3)
        .filter(|d| d.files as usize > FILE_LINES)
    {
        line(
            o,
            &clip(&format!(
                "    dir  {:<50} {:>10} {:>8} calls {:>10}",
                cut(
                    &format!("{}/ ({} files)", d.dir.trim_end_matches('/'), d.files),
                    50
                ),
                units::dur(d.ns),
                d.calls,
                units::bytes(d.bytes)
            )),
        );
    }
}

/// Files listed per process in the summary (the report keeps `--top`).
const FILE_LINES: usize = 5;

fn render_block_io(o: &mut String, r: &Report, p: &ProcessReport) {
    if p.block_io.is_empty() {
        return;
    }
    line(
        o,
        &format!(
            "  {:<18} {:>9} {:>11} {:>11} {:>12} {:>11} {:>11}",
            "block I/O", "requests", "read", "written", "read rate", "mean lat", "mean queue"
        ),
    );
    for b in &p.block_io {
        let requests = match &b.sampled {
            Some(_) => format!("~{}", b.requests),
            None => b.requests.to_string(),
        };
        line(
            o,
            &format!(
                "    {:<16} {:>9} {:>11} {:>11} {:>12} {:>11} {:>11}",
                cut(&b.device, 16),
                requests,
                units::bytes(b.read_bytes),
                units::bytes(b.write_bytes),
                units::rate(b.read_bytes, r.window.duration_ns),
                units::dur(b.total_ns.checked_div(b.requests).unwrap_or(0)),
                units::dur(b.queue_ns.checked_div(b.requests).unwrap_or(0))
            ),
        );
        if let Some(s) = &b.sampled {
            line(
                o,
                &format!(
                    "      ~ estimated from {} requests counted: requests +/-{:.1}% (95%)",
                    s.seen,
                    b.requests_rel_error() * 100.0
                ),
            );
        }
    }
}

fn render_nvml(o: &mut String, r: &Report) {
    let Some(n) = &r.nvml else { return };
    line(o, "");
    if !n.available {
        line(
            o,
            &clip(&format!(
                "GPU: not sampled ({})",
                n.reason.as_deref().unwrap_or("NVML unavailable")
            )),
        );
        return;
    }
    for g in &n.gpus {
        let peak_mem = g
            .samples
            .iter()
            .map(|s| s.mem_used_bytes)
            .max()
            .unwrap_or(0);
        line(
            o,
            &clip(&format!(
                "GPU {} {}: mean utilisation {:.0}%, peak memory {}, {} samples every {} ms",
                g.index,
                g.name,
                g.mean_util_percent,
                units::bytes(peak_mem),
                g.samples.len(),
                n.interval_ms
            )),
        );
        // The verdicts judge utilisation from the job's first GPU allocation: both are shown.
        if let Some((u, from)) = crate::verdict::util_since_work(r, g) {
            line(
                o,
                &format!(
                    "  {u:.0}% since the job's first GPU allocation at {} (what the verdict \
                     judges)",
                    units::dur(from)
                ),
            );
        }
    }
}

fn render_footer(o: &mut String, r: &Report, st: Style) {
    line(o, "");
    if let Some(ov) = &r.overhead {
        for (i, l) in wrap(&ov.summary(), WIDTH - 2).iter().enumerate() {
            line(o, &if i == 0 { l.clone() } else { format!("  {l}") });
        }
        for l in ov.limit_lines() {
            for w in wrap(&l, WIDTH) {
                line(o, &st.severity("medium", &w));
            }
        }
    }
    if r.drops.is_empty() {
        line(o, "Drops: none");
    } else {
        for d in &r.drops {
            line(
                o,
                &st.severity(
                    "medium",
                    &clip(&format!("Drops: {} {}{}", d.count, d.affects, d.detail())),
                ),
            );
        }
    }
    for b in &r.blind_spots {
        for (i, l) in wrap(b, WIDTH - 14).iter().enumerate() {
            let lead = if i == 0 {
                "Blind spot:  "
            } else {
                "             "
            };
            line(o, &format!("{lead}{l}"));
        }
    }
    if let Some(t) = &r.timeline {
        if t.cut_events + t.cut_counter_samples > 0 {
            line(
                o,
                &clip(&format!(
                    "Timeline: --timeline-limit {} cut {} events and {} counter samples \
                     (kept {} and {})",
                    t.limit, t.cut_events, t.cut_counter_samples, t.events, t.counter_samples
                )),
            );
        }
    }
    // Wrapped, not clipped: a warning's tail (a count, what to do) is often the point.
    for w in &r.warnings {
        for (i, l) in wrap(w, WIDTH - 9).iter().enumerate() {
            let lead = if i == 0 { "warning: " } else { "         " };
            line(o, &format!("{lead}{l}"));
        }
    }
}

fn more(o: &mut String, n: usize) {
    if n > MAX_ROWS {
        line(o, &format!("    ... {} more", n - MAX_ROWS));
    }
}

fn line(o: &mut String, s: &str) {
    let _ = writeln!(o, "{s}");
}

fn fn_line(f: &crate::aggregate::cpu::FnStat) -> String {
    // A library's unnamed code is named `[library]` already.
    let module = f
        .module
        .as_deref()
        .filter(|m| !crate::symbolize::names_only_its_module(&f.function, Some(m)))
        .map(|m| format!("  {}", crate::symbolize::module_label(m)))
        .unwrap_or_default();
    clip(&format!(
        "    {:>5.1}% {:>7}  {}{}",
        f.percent, f.samples, f.function, module
    ))
}

/// At most `n` characters on one line, with an ellipsis when cut. Control characters (a
/// `python -c` script's newlines, escapes in a traced program's name) become spaces so they
/// cannot break the layout or drive the terminal.
fn cut(s: &str, n: usize) -> String {
    let clean = s.chars().map(|c| if c.is_control() { ' ' } else { c });
    if s.chars().count() <= n {
        clean.collect()
    } else {
        let mut c: String = clean.take(n - 1).collect();
        c.push('…');
        c
    }
}

fn clip(s: &str) -> String {
    cut(s, WIDTH)
}

/// Greedy word wrap to `width` columns; words longer than a line are cut.
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut cur = String::new();
    for word in text.split_whitespace() {
        let word = cut(word, width);
        let len = cur.chars().count();
        if len > 0 && len + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(&word);
    }
    if !cur.is_empty() || lines.is_empty() {
        lines.push(cur);
    }
    lines
}

#[cfg(test)]
mod tests;
