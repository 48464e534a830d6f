//! Field offsets of tracepoints, read from their `format` files so that the eBPF programs never
//! read a field at a guessed offset.

use std::{fs, path::Path};

use anyhow::{anyhow, Context, Result};

const ROOTS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// The tracefs mount, mounting it at /sys/kernel/tracing when nothing is mounted (root only).
pub fn root() -> Result<&'static str> {
    for r in ROOTS {
        if Path::new(r).join("events").is_dir() {
            return Ok(r);
        }
    }
    let target = std::ffi::CString::new(ROOTS[0]).unwrap();
    let fstype = std::ffi::CString::new("tracefs").unwrap();
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc == 0 && Path::new(ROOTS[0]).join("events").is_dir() {
        return Ok(ROOTS[0]);
    }
    Err(anyhow!(
        "tracefs is not mounted and mounting it at {} failed: {}",
        ROOTS[0],
        std::io::Error::last_os_error()
    ))
}

/// Offsets of the fields of one tracepoint.
#[derive(Debug, Clone)]
pub struct Format {
    fields: Vec<(String, u32, u32)>,
}

impl Format {
    pub fn read(category: &str, name: &str) -> Result<Format> {
        let path = format!("{}/events/{category}/{name}/format", root()?);
        let text = fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
        Ok(Format::parse(&text))
    }

    pub fn parse(text: &str) -> Format {
        let fields = text
            .lines()
            .filter_map(|l| {
                let l = l.trim();
                let decl = l.strip_prefix("field:")?.split(';').next()?;
                let name = decl
                    .split_whitespace()
                    .last()?
                    .split('[')
                    .next()?
                    .to_string();
                let num = |key: &str| -> Option<u32> {
                    l.split(';')
                        .find_map(|p| p.trim().strip_prefix(key))
                        .and_then(|v| v.parse().ok())
                };
                Some((name, num("offset:")?, num("size:")?))
            })
            .collect();
        Format { fields }
    }

    pub fn offset(&self, field: &str) -> Result<u32> {
        self.fields
            .iter()
            .find(|(n, _, _)| n == field)
            .map(|(_, o, _)| *o)
            .ok_or_else(|| anyhow!("tracepoint has no field `{field}`"))
    }
}

pub fn exists(category: &str, name: &str) -> bool {
    root()
        .map(|r| {
            Path::new(r)
                .join("events")
                .join(category)
                .join(name)
                .is_dir()
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_format() {
        let f = Format::parse(
            "name: sched_process_exit\nID: 1\nformat:\n\
             \tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
             \tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;\n\
             \tfield:pid_t pid;\toffset:24;\tsize:4;\tsigned:1;\n\
             \tfield:bool group_dead;\toffset:32;\tsize:1;\tsigned:0;\n",
        );
        assert_eq!(f.offset("comm").unwrap(), 8);
        assert_eq!(f.offset("pid").unwrap(), 24);
        assert_eq!(f.offset("group_dead").unwrap(), 32);
        assert!(f.offset("nope").is_err());
    }
}
