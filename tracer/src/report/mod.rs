//! Reports: one model ([`model::Report`]) and one exporter per format.

pub mod build;
pub mod csv;
#[cfg(test)]
pub mod fixtures;
pub mod flamegraph;
pub mod folded;
pub mod html;
pub mod model;
#[cfg(test)]
pub mod snapshot;
pub mod terminal;
pub mod timeline;
pub mod trace_event;
pub mod units;

use std::{
    fs::{self, File, OpenOptions},
    io::{BufWriter, Write},
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

use crate::{aggregate::cpu::CpuProfile, error::TraceError};

/// Everything an exporter may render.
pub struct ReportData {
    pub report: model::Report,
    pub cpu: CpuProfile,
    /// Events for trace.json, filled by the probe families while tracing.
    pub timeline: timeline::Timeline,
    /// Flame graphs beyond the CPU one (off-CPU by reason, ...), embedded in report.html.
    pub flames: Vec<Flame>,
}

/// A flame graph a family adds to the HTML report, from folded lines.
#[derive(Debug, Clone, Default)]
pub struct Flame {
    pub title: String,
    /// What a frame's width counts (`samples`, `ns`).
    pub count_name: String,
    pub lines: Vec<String>,
}

/// Last step before rendering, after every probe family has finished: the verdicts and what
/// the report says about the timeline.
pub fn finalize(data: &mut ReportData) {
    if let Some(n) = &data.report.nvml {
        timeline::add_nvml(&mut data.timeline, n);
    }
    data.report.timeline = Some(data.timeline.summary());
    crate::verdict::apply(&mut data.report);
}

/// One output file.
pub trait Exporter {
    fn file_name(&self) -> &'static str;
    fn write(&self, data: &ReportData, out: &mut dyn Write) -> Result<()>;
}

pub struct Json;
impl Exporter for Json {
    fn file_name(&self) -> &'static str {
        "report.json"
    }
    fn write(&self, data: &ReportData, out: &mut dyn Write) -> Result<()> {
        serde_json::to_writer_pretty(&mut *out, &data.report)?;
        writeln!(out)?;
        Ok(())
    }
}

pub struct CpuFolded;
impl Exporter for CpuFolded {
    fn file_name(&self) -> &'static str {
        "cpu.folded"
    }
    fn write(&self, data: &ReportData, out: &mut dyn Write) -> Result<()> {
        for l in folded::lines(&data.cpu) {
            writeln!(out, "{l}")?;
        }
        Ok(())
    }
}

pub struct CpuSvg;
impl Exporter for CpuSvg {
    fn file_name(&self) -> &'static str {
        "cpu.svg"
    }
    fn write(&self, data: &ReportData, out: &mut dyn Write) -> Result<()> {
        flamegraph::write_svg(
            "gputrace: CPU (on-CPU samples)",
            "samples",
            &folded::lines(&data.cpu),
            out,
        )
    }
}

pub struct Html;
impl Exporter for Html {
    fn file_name(&self) -> &'static str {
        "report.html"
    }
    fn write(&self, data: &ReportData, out: &mut dyn Write) -> Result<()> {
        html::write(data, out)
    }
}

pub struct TraceEvents;
impl Exporter for TraceEvents {
    fn file_name(&self) -> &'static str {
        "trace.json"
    }
    fn write(&self, data: &ReportData, out: &mut dyn Write) -> Result<()> {
        trace_event::write(&data.timeline, &data.report, out)
    }
}

/// One CSV table.
pub struct Csv {
    pub name: &'static str,
    pub table: fn(&model::Report, &mut dyn Write) -> Result<()>,
}
impl Exporter for Csv {
    fn file_name(&self) -> &'static str {
        self.name
    }
    fn write(&self, data: &ReportData, out: &mut dyn Write) -> Result<()> {
        (self.table)(&data.report, out)
    }
}

pub fn exporters() -> Vec<Box<dyn Exporter>> {
    vec![
        Box::new(Json),
        Box::new(CpuFolded),
        Box::new(CpuSvg),
        Box::new(Html),
        Box::new(TraceEvents),
        Box::new(Csv {
            name: "functions.csv",
            table: csv::functions,
        }),
        Box::new(Csv {
            name: "syscalls.csv",
            table: csv::syscalls,
        }),
        Box::new(Csv {
            name: "kernels.csv",
            table: csv::kernels,
        }),
        Box::new(Csv {
            name: "copies.csv",
            table: csv::copies,
        }),
    ]
}

/// Creates the output directory (or checks an existing one) before tracing starts, so an
/// unwritable directory fails in a second, not after a ten-minute trace.
pub fn prepare_output_dir(dir: &Path) -> Result<()> {
    let err = |reason: String| TraceError::Output {
        path: dir.to_path_buf(),
        reason,
    };
    if let Ok(meta) = fs::symlink_metadata(dir) {
        if !meta.is_dir() {
            return Err(err("exists and is not a directory".into()).into());
        }
    } else {
        fs::create_dir_all(dir).map_err(|e| err(e.to_string()))?;
    }
    let probe = dir.join(".gputrace-write-test");
    let _ = fs::remove_file(&probe);
    File::create(&probe).map_err(|e| err(e.to_string()))?;
    let _ = fs::remove_file(&probe);
    Ok(())
}

/// Opens `dir/name` for writing without following a symlink planted there, mode 0644.
fn create_file(dir: &Path, name: &str) -> Result<(PathBuf, File)> {
    let path = dir.join(name);
    if fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
        fs::remove_file(&path).with_context(|| format!("remove symlink {}", path.display()))?;
    }
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .map_err(|e| TraceError::Output {
            path: path.clone(),
            reason: e.to_string(),
        })?;
    Ok((path, f))
}

/// Writes every exporter's file; a failing one is reported and the others are still written.
pub fn write_all(dir: &Path, data: &ReportData) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let mut first_err: Option<anyhow::Error> = None;
    for e in exporters() {
        let res = create_file(dir, e.file_name()).and_then(|(path, f)| {
            let mut w = BufWriter::new(f);
            e.write(data, &mut w)
                .and_then(|_| w.flush().map_err(Into::into))
                .map_err(|err| {
                    anyhow::Error::from(TraceError::Output {
                        path: path.clone(),
                        reason: format!("{err:#}"),
                    })
                })?;
            Ok(path)
        });
        match res {
            Ok(p) => written.push(p),
            Err(e) => {
                eprintln!("gputrace: error: {e:#}");
                first_err.get_or_insert(e);
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(written),
    }
}
