//! Reports: one model ([`model::Report`]) and one exporter per format.

pub mod bound;
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
    fs::{self, OpenOptions},
    io::{BufWriter, Write},
    os::unix::{
        ffi::OsStrExt,
        fs::{OpenOptionsExt, PermissionsExt},
    },
    path::{Path, PathBuf},
};

use anyhow::Result;

use crate::{aggregate::cpu::CpuProfile, error::TraceError};

/// Everything an exporter may render.
pub struct ReportData {
    pub report: model::Report,
    pub cpu: CpuProfile,
    /// Off-CPU and wall-clock folded stacks (time accounting).
    pub time: crate::accounting::Folded,
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
    for (title, lines) in [
        ("Off-CPU time by reason", &data.time.offcpu),
        (
            "Wall-clock time: on-CPU and off-CPU by category",
            &data.time.wall,
        ),
    ] {
        if !lines.is_empty() {
            data.flames.push(Flame {
                title: title.into(),
                count_name: "us".into(),
                lines: lines.clone(),
            });
        }
    }
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
        // Serialised first so that a write error stays an io::Error (disk full is told apart).
        let mut text = serde_json::to_vec_pretty(&data.report)?;
        text.push(b'\n');
        out.write_all(&text)?;
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
        Box::new(crate::accounting::render::OffcpuFolded),
        Box::new(crate::accounting::render::OffcpuSvg),
        Box::new(crate::accounting::render::WallSvg),
    ]
}

/// Creates the output directory (or checks an existing one) before tracing starts, so an
/// unwritable directory fails in a second, not after a ten-minute trace. Directories it creates
/// belong to the user who ran sudo.
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
        let missing: Vec<PathBuf> = dir
            .ancestors()
            .take_while(|a| !a.as_os_str().is_empty() && fs::symlink_metadata(a).is_err())
            .map(Path::to_path_buf)
            .collect();
        fs::create_dir_all(dir).map_err(|e| err(e.to_string()))?;
        if let Some((uid, gid)) = sudo_owner() {
            for d in &missing {
                let c = std::ffi::CString::new(d.as_os_str().as_bytes())
                    .map_err(|_| err("path contains a NUL byte".into()))?;
                // SAFETY: a valid C string; lchown never follows a link.
                if unsafe { libc::lchown(c.as_ptr(), uid, gid) } != 0 {
                    let e = std::io::Error::last_os_error();
                    return Err(err(format!("chown to the sudo user: {e}")).into());
                }
            }
        }
    }
    let probe = dir.join(".gputrace-write-test");
    let _ = fs::remove_file(&probe);
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&probe)
        .map_err(|e| err(e.to_string()))?;
    let _ = fs::remove_file(&probe);
    Ok(())
}

/// The user who ran `sudo gputrace` (SUDO_UID/SUDO_GID), when we run as root for them: outputs
/// belong to them, not to root.
pub fn sudo_owner() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let uid: u32 = std::env::var("SUDO_UID").ok()?.parse().ok()?;
    let gid: u32 = std::env::var("SUDO_GID")
        .ok()
        .and_then(|g| g.parse().ok())
        .unwrap_or(uid);
    Some((uid, gid))
}

/// Writes one file as `dir/.name.tmp` and renames it over `dir/name`: a symlink or hard link
/// planted at `dir/name` is replaced, never followed or truncated, and a reader never sees a
/// half-written report. Mode 0644, owned by the sudo user. A failed file is removed.
fn write_file(
    dir: &Path,
    name: &str,
    body: impl FnOnce(&mut dyn Write) -> Result<()>,
) -> Result<PathBuf, (PathBuf, String)> {
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.gputrace-{}.tmp", std::process::id()));
    let fail = |reason: String| (path.clone(), reason);
    let _ = fs::remove_file(&tmp);
    let f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(|e| fail(describe_io(&e)))?;
    let res = (|| -> Result<(), String> {
        // The umask may have narrowed the mode; reports are meant to be readable.
        f.set_permissions(fs::Permissions::from_mode(0o644))
            .map_err(|e| describe_io(&e))?;
        if let Some((uid, gid)) = sudo_owner() {
            std::os::unix::fs::fchown(&f, Some(uid), Some(gid))
                .map_err(|e| format!("chown to the sudo user: {e}"))?;
        }
        let mut w = BufWriter::new(&f);
        body(&mut w).map_err(|e| describe_err(&e))?;
        w.flush().map_err(|e| describe_io(&e))?;
        drop(w);
        // Delayed allocation reports a full disk only here.
        f.sync_data().map_err(|e| describe_io(&e))?;
        fs::rename(&tmp, &path).map_err(|e| describe_io(&e))
    })();
    if let Err(reason) = res {
        let _ = fs::remove_file(&tmp);
        return Err(fail(reason));
    }
    Ok(path)
}

fn describe_io(e: &std::io::Error) -> String {
    if e.raw_os_error() == Some(libc::ENOSPC) || e.raw_os_error() == Some(libc::EDQUOT) {
        format!("disk full ({e})")
    } else {
        e.to_string()
    }
}

fn describe_err(e: &anyhow::Error) -> String {
    match e.chain().find_map(|c| c.downcast_ref::<std::io::Error>()) {
        Some(io) => describe_io(io),
        None => format!("{e:#}"),
    }
}

/// Writes every exporter's file. A failing one (disk full) does not stop the others; the
/// error names the files that were kept.
pub fn write_all(dir: &Path, data: &ReportData) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let mut first_err: Option<(PathBuf, String)> = None;
    for e in exporters() {
        match write_file(dir, e.file_name(), |w| e.write(data, w)) {
            Ok(p) => written.push(p),
            Err(err) => {
                first_err.get_or_insert(err);
            }
        }
    }
    match first_err {
        Some((path, reason)) => {
            let kept: Vec<String> = written
                .iter()
                .filter_map(|p| p.file_name())
                .map(|n| n.to_string_lossy().into_owned())
                .collect();
            let kept = if kept.is_empty() {
                "no file was written".to_string()
            } else {
                format!("kept {}", kept.join(", "))
            };
            Err(TraceError::OutputFile {
                path,
                reason: format!("{reason}; {kept}"),
            }
            .into())
        }
        None => Ok(written),
    }
}
