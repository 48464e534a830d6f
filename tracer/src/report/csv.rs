//! CSV tables for spreadsheets and scripts: functions, syscalls, kernels, copies. One row per
//! (process[, thread], item); numbers unformatted (ns, bytes).

use std::io::Write;

use anyhow::Result;

use super::model::Report;

/// Quotes a field when it holds a comma, quote or line break (RFC 4180).
pub fn field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn row(out: &mut dyn Write, fields: &[String]) -> Result<()> {
    let line: Vec<String> = fields.iter().map(|f| field(f)).collect();
    writeln!(out, "{}", line.join(","))?;
    Ok(())
}

macro_rules! cells {
    ($($e:expr),* $(,)?) => { &[$($e.to_string()),*] };
}

pub fn functions(r: &Report, out: &mut dyn Write) -> Result<()> {
    row(
        out,
        cells!["pid", "tid", "kind", "function", "module", "samples", "percent"],
    )?;
    for p in &r.processes {
        for (kind, list) in [("self", &p.top_self), ("total", &p.top_total)] {
            for f in list {
                let m = f.module.as_deref().unwrap_or("");
                row(
                    out,
                    cells![
                        p.pid,
                        "",
                        kind,
                        f.function,
                        m,
                        f.samples,
                        format!("{:.2}", f.percent)
                    ],
                )?;
            }
        }
        for t in &p.threads {
            for f in &t.top_self {
                let m = f.module.as_deref().unwrap_or("");
                row(
                    out,
                    cells![
                        p.pid,
                        t.tid,
                        "self",
                        f.function,
                        m,
                        f.samples,
                        format!("{:.2}", f.percent)
                    ],
                )?;
            }
        }
    }
    Ok(())
}

pub fn syscalls(r: &Report, out: &mut dyn Write) -> Result<()> {
    row(
        out,
        cells![
            "pid", "tid", "syscall", "count", "errors", "total_ns", "min_ns", "max_ns", "bytes",
            "timed"
        ],
    )?;
    for p in &r.processes {
        let threads = p.threads.iter().map(|t| (t.tid.to_string(), &t.syscalls));
        for (tid, list) in std::iter::once((String::new(), &p.syscalls)).chain(threads) {
            for s in list {
                row(
                    out,
                    cells![
                        p.pid,
                        tid,
                        s.name,
                        s.count,
                        s.errors,
                        s.total_ns,
                        s.min_ns,
                        s.max_ns,
                        s.bytes,
                        // The calls timed where not all were (total_ns is then an estimate).
                        s.timed.unwrap_or(s.count)
                    ],
                )?;
            }
        }
    }
    Ok(())
}

pub fn kernels(r: &Report, out: &mut dyn Write) -> Result<()> {
    row(
        out,
        cells!["pid", "kernel", "launches", "grid", "block", "launch_ns"],
    )?;
    for p in &r.processes {
        for k in p.cuda.iter().flat_map(|c| &c.kernels) {
            let g = format!("{}x{}x{}", k.grid[0], k.grid[1], k.grid[2]);
            let b = format!("{}x{}x{}", k.block[0], k.block[1], k.block[2]);
            row(out, cells![p.pid, k.name, k.launches, g, b, k.launch_ns])?;
        }
    }
    Ok(())
}

pub fn copies(r: &Report, out: &mut dyn Write) -> Result<()> {
    row(
        out,
        cells![
            "pid",
            "direction",
            "mode",
            "count",
            "bytes",
            "total_ns",
            "gbps"
        ],
    )?;
    for p in &r.processes {
        for c in p.cuda.iter().flat_map(|c| &c.copies) {
            row(
                out,
                cells![
                    p.pid,
                    c.direction,
                    c.mode,
                    c.count,
                    c.bytes,
                    c.total_ns,
                    format!("{:.3}", c.gbps)
                ],
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{
        fixtures,
        model::cuda::{KernelStat, ProcessCuda},
    };

    fn text(f: fn(&Report, &mut dyn Write) -> Result<()>, r: &Report) -> String {
        let mut buf = Vec::new();
        f(r, &mut buf).unwrap();
        String::from_utf8(buf).unwrap()
    }

    #[test]
    fn tables_quote_and_count() {
        let mut r = fixtures::data_loading_job();
        r.processes[0].cuda = Some(ProcessCuda {
            kernels: vec![KernelStat {
                name: "add<float, 4>".into(),
                launches: 3,
                grid: [1, 2, 3],
                block: [4, 5, 6],
                launch_ns: 30,
            }],
            ..Default::default()
        });
        let k = text(kernels, &r);
        assert_eq!(
            k,
            "pid,kernel,launches,grid,block,launch_ns\n100,\"add<float, 4>\",3,1x2x3,4x5x6,30\n"
        );
        let f = text(functions, &r);
        assert_eq!(f.lines().count(), 1 + 1 + 2, "{f}");
        assert!(f.contains("100,100,self,memcpy,libtest.so,30,10.00"));
        let s = text(syscalls, &r);
        assert!(
            s.contains("100,,read,1200,0,4000000000,0,0,12000000"),
            "{s}"
        );
        assert_eq!(text(copies, &r).lines().count(), 1);
        assert_eq!(field("a\"b"), "\"a\"\"b\"");
    }
}
