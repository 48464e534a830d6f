//! `gputrace diff BEFORE.json AFTER.json`: what changed between two runs. Exit 0 when compared;
//! 1 when a file cannot be read; 2 when a file is not a gputrace report or the two reports
//! have different schema versions (docs/exit-codes.md).

mod compare;
mod render;

use std::{io::Write, path::Path, process::ExitCode};

pub use compare::{compare, Diff};

use crate::{
    cli::DiffArgs,
    error::exit,
    report::model::{Report, SCHEMA_VERSION},
};

/// Why a file could not be compared, with the exit code it maps to.
#[derive(Debug)]
pub struct LoadError {
    pub code: u8,
    pub message: String,
}

pub fn load(path: &Path) -> Result<Report, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|e| LoadError {
        code: exit::FAILURE,
        message: format!("cannot read {}: {e}", path.display()),
    })?;
    parse(&text).map_err(|m| LoadError {
        code: exit::USAGE,
        message: format!("{}: {m}", path.display()),
    })
}

fn parse(text: &str) -> Result<Report, String> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not JSON ({e})"))?;
    let version = value
        .get("schema_version")
        .and_then(|v| v.as_u64())
        .ok_or("not a gputrace report.json (no schema_version)")?;
    if version != SCHEMA_VERSION as u64 {
        return Err(format!(
            "report schema version {version}, this gputrace reads version {SCHEMA_VERSION}"
        ));
    }
    serde_json::from_value(value).map_err(|e| format!("not a gputrace report.json ({e})"))
}

pub fn run(args: &DiffArgs) -> anyhow::Result<ExitCode> {
    let loaded = load(&args.before).and_then(|b| load(&args.after).map(|a| (b, a)));
    let (before, after) = match loaded {
        Ok(pair) => pair,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "gputrace: error: {}", e.message);
            return Ok(ExitCode::from(e.code));
        }
    };
    let d = compare(&before, &after);
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &d)?;
        writeln!(out)?;
    } else {
        write!(
            out,
            "{}",
            render::text(
                &d,
                &args.before.display().to_string(),
                &args.after.display().to_string()
            )
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixtures;

    #[test]
    fn bad_inputs_get_one_line_errors() {
        let dir = tempfile::tempdir().unwrap();
        let missing = load(&dir.path().join("nope.json")).unwrap_err();
        assert_eq!(missing.code, 1);
        assert!(
            missing.message.starts_with("cannot read"),
            "{}",
            missing.message
        );

        let cases = [
            ("garbage.json", "{not json".to_string(), "not JSON"),
            ("other.json", r#"{"a": 1}"#.to_string(), "no schema_version"),
            (
                "future.json",
                r#"{"schema_version": 99}"#.to_string(),
                "schema version 99",
            ),
            (
                "partial.json",
                r#"{"schema_version": 1, "tool": "x"}"#.to_string(),
                "not a gputrace report.json (missing field",
            ),
        ];
        for (name, text, want) in cases {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            let e = load(&p).unwrap_err();
            assert_eq!(e.code, 2, "{name}");
            assert!(e.message.contains(want), "{name}: {}", e.message);
            assert!(!e.message.contains('\n'), "one line: {}", e.message);
        }

        let p = dir.path().join("good.json");
        std::fs::write(
            &p,
            serde_json::to_string(&fixtures::data_loading_job()).unwrap(),
        )
        .unwrap();
        assert_eq!(load(&p).unwrap().processes.len(), 3);
    }
}
