//! The terminal summary: target, duration, samples, then per process its threads and top
//! functions by self and total samples. Fits 100 columns.

use std::fmt::Write as _;

use super::model::Report;

const WIDTH: usize = 100;

pub fn render(r: &Report) -> String {
    let mut o = String::new();
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
    let _ = writeln!(
        o,
        "gputrace: traced {what} for {:.2}s ({}), {} process(es)",
        r.window.duration_ns as f64 / 1e9,
        r.window.ended_by,
        r.processes.len()
    );
    let _ = writeln!(
        o,
        "CPU: {} samples at {} Hz on {} CPUs",
        r.sampling.samples, r.sampling.frequency_hz, r.sampling.cpus
    );
    for p in &r.processes {
        let _ = writeln!(o);
        let _ = writeln!(
            o,
            "{}",
            clip(&format!(
                "pid {} {}{}  {} samples{}",
                p.pid,
                p.comm,
                p.ppid.map(|pp| format!(" (ppid {pp})")).unwrap_or_default(),
                p.samples,
                if p.exited { ", exited" } else { "" }
            ))
        );
        if p.samples == 0 {
            continue;
        }
        let threads: Vec<String> = p
            .threads
            .iter()
            .filter(|t| t.samples > 0)
            .map(|t| format!("{} {} {}", t.tid, t.comm, t.samples))
            .collect();
        let _ = writeln!(o, "{}", clip(&format!("  threads: {}", threads.join(", "))));
        let _ = writeln!(o, "  top functions by self samples:");
        for f in &p.top_self {
            let _ = writeln!(o, "{}", fn_line(f));
        }
        let _ = writeln!(o, "  top functions by total samples:");
        for f in &p.top_total {
            let _ = writeln!(o, "{}", fn_line(f));
        }
    }
    o.push_str(&crate::cuda::terminal::section(r));
    let _ = writeln!(o);
    if r.drops.is_empty() {
        let _ = writeln!(o, "Drops: none");
    } else {
        for d in &r.drops {
            let _ = writeln!(o, "{}", clip(&format!("Drops: {} {}", d.count, d.affects)));
        }
    }
    for w in &r.warnings {
        let _ = writeln!(o, "{}", clip(&format!("warning: {w}")));
    }
    o
}

fn fn_line(f: &crate::aggregate::cpu::FnStat) -> String {
    let module = f
        .module
        .as_deref()
        .map(|m| format!("  [{m}]"))
        .unwrap_or_default();
    clip(&format!(
        "    {:>5.1}% {:>7}  {}{}",
        f.percent, f.samples, f.function, module
    ))
}

fn clip(s: &str) -> String {
    if s.chars().count() <= WIDTH {
        s.to_string()
    } else {
        let mut c: String = s.chars().take(WIDTH - 1).collect();
        c.push('…');
        c
    }
}
