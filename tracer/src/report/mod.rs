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
pub mod outdir;
pub mod partial;
#[cfg(test)]
pub mod snapshot;
pub mod terminal;
pub mod timeline;
pub mod trace_event;
pub mod units;

use std::{
    fs,
    io::{BufWriter, Write},
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
};

use anyhow::Result;

use crate::{aggregate::cpu::CpuProfile, error::TraceError};
pub use outdir::OutputDir;

/// Everything an exporter may render.
pub struct ReportData {
    pub report: model::Report,
    pub cpu: CpuProfile,
    /// Off-CPU and wall-clock folded stacks (time accounting).
    pub time: crate::accounting::Folded,
    /// Events for trace.json, filled by the probe families while tracing.
    pub timeline: timeline::Timeline,
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

/// Opens the output directory (creating what is missing) before tracing starts, so an
/// unwritable directory fails in a second, not after a ten-minute trace; the reports are
/// written through the handle it returns (`outdir`). Directories it creates belong to the
/// user who ran sudo.
pub fn prepare_output_dir(dir: &Path) -> Result<OutputDir> {
    let err = |reason: String| TraceError::Output {
        path: dir.to_path_buf(),
        reason,
    };
    let out = OutputDir::open(dir, sudo_owner()).map_err(err)?;
    // A name anyone may plant a link or a file at: removed first, then created exclusively and
    // never through a link.
    let probe = c".gputrace-write-test";
    out.unlink(probe);
    out.create(probe).map_err(|e| err(e.to_string()))?;
    out.unlink(probe);
    Ok(out)
}

/// The user who ran `sudo gputrace` (SUDO_UID/SUDO_GID), when we run as root for them: outputs
/// belong to them, not to root.
pub fn sudo_owner() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let uid: u32 = std::env::var("SUDO_UID").ok()?.parse().ok()?;
    // (uid_t)-1 to chown means "leave it": root's files would pass for the user's.
    if uid == u32::MAX {
        return None;
    }
    // Without SUDO_GID, the user's primary group: a group numbered as the user may be
    // anybody's. Root's where the user is unknown.
    let gid: u32 = std::env::var("SUDO_GID")
        .ok()
        .and_then(|g| g.parse().ok())
        .filter(|&g| g != u32::MAX)
        .or_else(|| primary_group(uid))
        .unwrap_or(0);
    Some((uid, gid))
}

/// The primary group of user `uid` in the password database.
fn primary_group(uid: u32) -> Option<u32> {
    // A directory service's entry may not fit the first buffer (ERANGE): larger ones, to 1 MiB.
    let mut len = 16 * 1024;
    loop {
        let mut buf = vec![0u8; len];
        // SAFETY: an all-zero passwd is valid; getpwuid_r fills it with pointers into `buf`,
        // which outlives its use here.
        let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        let r = unsafe {
            libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut found)
        };
        if r == libc::ERANGE && len < 1 << 20 {
            len *= 4;
            continue;
        }
        return (r == 0 && !found.is_null()).then_some(pw.pw_gid);
    }
}

/// Writes one file as `dir/.name.tmp` and renames it over `dir/name`: a symlink or hard link
/// planted at `dir/name` is replaced, never followed or truncated, and a reader never sees a
/// half-written report. Mode 0644, owned by the sudo user. A failed file is removed.
fn write_file(
    dir: &OutputDir,
    name: &str,
    body: impl FnOnce(&mut dyn Write) -> Result<()>,
) -> Result<PathBuf, (PathBuf, String)> {
    let path = dir.path().join(name);
    let fail = |reason: String| (path.clone(), reason);
    let cname = std::ffi::CString::new(name).map_err(|_| fail("a NUL in the name".into()))?;
    let tmp = std::ffi::CString::new(format!(".{name}.gputrace-{}.tmp", std::process::id()))
        .map_err(|_| fail("a NUL in the name".into()))?;
    dir.unlink(&tmp);
    // Marked before it exists: an abort between the two finds no file, or removes it.
    let _writing = partial::writing(dir.raw_fd(), &tmp);
    let f = dir.create(&tmp).map_err(|e| fail(describe_io(&e)))?;
    if let Some(ms) = std::env::var("GPUTRACE_TEST_WRITE_DELAY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        // Tests only: a file slow enough to be interrupted while it is written.
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
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
        dir.rename(&tmp, &cname).map_err(|e| describe_io(&e))
    })();
    if let Err(reason) = res {
        dir.unlink(&tmp);
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
/// error names each file that failed and the files that were kept. A file of an earlier run
/// under a name this run could not write is removed (and said so): left, it would pass for
/// this run's beside the files that were written.
pub fn write_all(dir: &OutputDir, data: &ReportData) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let mut failed: Vec<(PathBuf, String)> = Vec::new();
    let mut removed: Vec<&str> = Vec::new();
    for e in exporters() {
        match write_file(dir, e.file_name(), |w| e.write(data, w)) {
            Ok(p) => written.push(p),
            Err(err) => {
                if std::ffi::CString::new(e.file_name()).is_ok_and(|c| dir.unlink(&c)) {
                    removed.push(e.file_name());
                }
                failed.push(err);
            }
        }
    }
    let mut failed = failed.into_iter();
    let Some((path, reason)) = failed.next() else {
        return Ok(written);
    };
    let mut reason = reason;
    let also: Vec<String> = failed
        .filter_map(|(p, _)| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    if !also.is_empty() {
        reason.push_str(&format!("; also failed: {}", also.join(", ")));
    }
    if !removed.is_empty() {
        reason.push_str(&format!(
            "; removed an earlier run's {}",
            removed.join(", ")
        ));
    }
    let kept: Vec<String> = written
        .iter()
        .filter_map(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .collect();
    if kept.is_empty() {
        reason.push_str("; no file was written");
    } else {
        reason.push_str(&format!("; kept {}", kept.join(", ")));
    }
    Err(TraceError::OutputFile { path, reason }.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_without_sudo_gid_gets_their_primary_group() {
        assert_eq!(primary_group(0), Some(0));
        assert_eq!(primary_group(3_999_999_999), None);
    }
}
