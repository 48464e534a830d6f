//! Is this process CPython, which version, and where is `_PyRuntime`? Found from the module that
//! holds the interpreter (libpython3.X.so or a statically linked python3.X executable) in the
//! process's own maps, and that module's ELF symbols.

use std::path::{Path, PathBuf};

use blazesym::inspect::{source::Elf, source::Source, Inspector};

use super::memory::Memory;
use crate::procfs::{self, Mapping};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interpreter {
    /// Path of the module that holds the interpreter, as mapped.
    pub module: String,
    pub version: (u8, u8, u8),
    /// Address of `_PyRuntime` in the target.
    pub runtime: u64,
    /// Address of `PyCode_Type`: a code object's `ob_type` must equal it.
    pub code_type: u64,
}

/// File names that may hold an interpreter: `libpython3.11.so.1.0`, `python3.11`, `python3`.
pub fn candidate(path: &str) -> bool {
    let name = Path::new(path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    name.starts_with("libpython3") || name.starts_with("python3")
}

/// `(3, 11)` from `libpython3.11.so.1.0` or `python3.11`.
pub fn version_from_name(path: &str) -> Option<(u8, u8)> {
    let name = Path::new(path).file_name()?.to_string_lossy().into_owned();
    let rest = name
        .strip_prefix("libpython")
        .or_else(|| name.strip_prefix("python"))?;
    let mut it = rest.split('.');
    let major = it.next()?.parse().ok()?;
    let minor: String = it
        .next()?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Some((major, minor.parse().ok()?))
}

/// `Py_Version` (3.11+) is `PY_VERSION_HEX`: 0x030b02f0 is 3.11.2 final.
pub fn decode_version_hex(v: u32) -> (u8, u8, u8) {
    ((v >> 24) as u8, (v >> 16) as u8, (v >> 8) as u8)
}

/// The address at which byte `file_offset` of `path` is mapped.
pub fn address_of(maps: &[Mapping], path: &str, file_offset: u64) -> Option<u64> {
    maps.iter()
        .find(|m| {
            m.path == path && m.offset <= file_offset && file_offset < m.offset + (m.end - m.start)
        })
        .map(|m| m.start + (file_offset - m.offset))
}

/// Finds the interpreter of `pid`; `Ok(None)` when the process is not CPython.
pub fn detect(pid: u32, maps: &[Mapping], mem: &dyn Memory) -> Result<Option<Interpreter>, String> {
    let mut paths: Vec<&Mapping> = Vec::new();
    for m in maps.iter().filter(|m| m.is_file() && candidate(&m.path)) {
        if !paths.iter().any(|p| p.path == m.path) {
            paths.push(m);
        }
    }
    // libpython first: a pyenv `python3.11` executable is a small launcher without the runtime.
    paths.sort_by_key(|m| !m.path.contains("libpython"));
    let inspector = Inspector::new();
    for m in paths {
        let open: PathBuf = procfs::map_file_path(pid, m);
        let mut elf = Elf::new(open);
        // The symbols needed are in the ELF symbol tables; parsing DWARF (pyenv builds carry it)
        // would take seconds.
        elf.debug_syms = false;
        let src = Source::from(elf);
        let found = match inspector.lookup(&src, &["_PyRuntime", "Py_Version", "PyCode_Type"]) {
            Ok(f) => f,
            Err(_) => continue,
        };
        let addr = |i: usize| -> Option<u64> {
            found
                .get(i)?
                .iter()
                .find_map(|s| s.file_offset.and_then(|o| address_of(maps, &m.path, o)))
        };
        let Some(runtime) = addr(0) else { continue };
        let code_type = addr(2).ok_or_else(|| format!("{}: no PyCode_Type symbol", m.path))?;
        let version = match addr(1).and_then(|a| mem.u32(a).ok()) {
            Some(v) => decode_version_hex(v),
            None => {
                let (a, b) = version_from_name(&m.path)
                    .ok_or_else(|| format!("{}: cannot tell the Python version", m.path))?;
                (a, b, 0)
            }
        };
        return Ok(Some(Interpreter {
            module: m.path.clone(),
            version,
            runtime,
            code_type,
        }));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(candidate("/usr/bin/python3.11"));
        assert!(candidate("/x/lib/libpython3.12.so.1.0"));
        assert!(!candidate("/usr/bin/bash"));
        assert_eq!(version_from_name("/x/libpython3.12.so.1.0"), Some((3, 12)));
        assert_eq!(version_from_name("/usr/bin/python3.11"), Some((3, 11)));
        assert_eq!(version_from_name("/usr/bin/python3"), None);
        assert_eq!(decode_version_hex(0x030b02f0), (3, 11, 2));
        assert_eq!(decode_version_hex(0x030d00f0), (3, 13, 0));
    }

    #[test]
    fn file_offsets_to_addresses() {
        let m = |start, end, offset, path: &str| Mapping {
            start,
            end,
            offset,
            perms: "rw-p".into(),
            inode: 1,
            path: path.into(),
        };
        let maps = vec![
            m(0x400000, 0x401000, 0, "/p"),
            m(0x600000, 0x602000, 0x1000, "/p"),
            m(0x700000, 0x701000, 0x1000, "/q"),
        ];
        assert_eq!(address_of(&maps, "/p", 0x1800), Some(0x600800));
        assert_eq!(address_of(&maps, "/p", 0x10), Some(0x400010));
        assert_eq!(address_of(&maps, "/p", 0x9000), None);
        assert_eq!(address_of(&maps, "/q", 0x1004), Some(0x700004));
    }
}
