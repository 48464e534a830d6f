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
    /// Major, minor, and the patch release where the target says (`Py_Version`, 3.11+); before
    /// 3.11 the version comes from the file name, which has no patch number.
    pub version: (u8, u8, Option<u8>),
    /// Address of `_PyRuntime` in the target.
    pub runtime: u64,
    /// Address of `PyCode_Type`: a code object's `ob_type` must equal it.
    pub code_type: u64,
    /// Offset of the kernel tid in the C library's `struct pthread`, where the version's thread
    /// states have no native thread id ([`pthread_tid_offset`]).
    pub pthread_tid: Option<u64>,
}

impl Interpreter {
    /// `3.11.2`, or `3.10` where the patch release is not known.
    pub fn version_string(&self) -> String {
        match self.version {
            (a, b, Some(c)) => format!("{a}.{b}.{c}"),
            (a, b, None) => format!("{a}.{b}"),
        }
    }
}

/// File names that may hold an interpreter: `libpython3.11.so.1.0`, `python3.11`, `python3`.
pub fn candidate(path: &str) -> bool {
    let name = Path::new(path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    name.starts_with("libpython3") || name.starts_with("python3")
}

/// Whether the dynamic loader has mapped the libraries the program was linked against: the
/// GNU C library is mapped (the linker lists it after the program's other libraries, and the
/// loader maps them in that order, so a libpython it needs is there too), or no loader is (a
/// static executable). Until then, a process that is not CPython by its maps may map
/// libpython still: it was read between its exec and the loader's work.
pub fn libraries_loaded(maps: &[Mapping]) -> bool {
    let name = |m: &Mapping| {
        Path::new(&m.path)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let files = || maps.iter().filter(|m| m.is_file()).map(name);
    files().any(|n| n == "libc.so.6" || (n.starts_with("libc-2.") && n.ends_with(".so")))
        || (maps.iter().any(Mapping::is_file)
            && !files().any(|n| n.starts_with("ld-linux") || n.starts_with("ld-musl")))
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
pub fn decode_version_hex(v: u32) -> (u8, u8, Option<u8>) {
    ((v >> 24) as u8, (v >> 16) as u8, Some((v >> 8) as u8))
}

/// Whether `addr` is in a writable mapping. `_PyRuntime` is written at run time, so it is in
/// the library's data segment, mapped read-write. While the loader maps a library, the whole
/// span is at first one read-only mapping of the file from offset 0, and the data segment is
/// mapped over its place last: a file offset found in that first mapping is off by the data
/// segment's offset-to-address shift (0x1000 in pyenv's libpython3.12). Seen then (a mapped
/// executable segment sends gputrace to the maps at once), the runtime's address was wrong
/// for the whole trace: no thread state found, no Python frame.
fn writable_at(maps: &[Mapping], addr: u64) -> bool {
    maps.iter()
        .any(|m| m.start <= addr && addr < m.end && m.perms.contains('w'))
}

/// The address at which byte `file_offset` of `path` is mapped by the loader. A shared mapping
/// is the program's own (or a symbol reader's, such as blazesym's when tracing ourselves), and
/// may cover the same bytes at another address, or be gone by the time it is read.
pub fn address_of(maps: &[Mapping], path: &str, file_offset: u64) -> Option<u64> {
    maps.iter()
        .find(|m| {
            m.path == path
                && !m.perms.contains('s')
                && m.offset <= file_offset
                && file_offset < m.offset + (m.end - m.start)
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
        let Some(addr) = lookup(
            &inspector,
            pid,
            maps,
            m,
            &["_PyRuntime", "Py_Version", "PyCode_Type"],
        ) else {
            continue;
        };
        let Some(runtime) = addr[0] else { continue };
        if !writable_at(maps, runtime) {
            // Read while the loader was mapping the library: found again at the next look.
            continue;
        }
        let code_type = addr[2].ok_or_else(|| format!("{}: no PyCode_Type symbol", m.path))?;
        let version = match addr[1].and_then(|a| mem.u32(a).ok()) {
            Some(v) => decode_version_hex(v),
            None => {
                let (a, b) = version_from_name(&m.path)
                    .ok_or_else(|| format!("{}: cannot tell the Python version", m.path))?;
                (a, b, None)
            }
        };
        return Ok(Some(Interpreter {
            module: m.path.clone(),
            version,
            runtime,
            code_type,
            pthread_tid: None,
        }));
    }
    Ok(None)
}

/// The target addresses of `names` in the module mapped as `m`, `None` when its symbols cannot
/// be read.
fn lookup(
    inspector: &Inspector,
    pid: u32,
    maps: &[Mapping],
    m: &Mapping,
    names: &[&str],
) -> Option<Vec<Option<u64>>> {
    let open: PathBuf = procfs::map_file_path(procfs::mm_pid(pid), m);
    let mut elf = Elf::new(open);
    // The symbols needed are in the ELF symbol tables; parsing DWARF (pyenv builds carry it)
    // would take seconds.
    elf.debug_syms = false;
    let src = Source::from(elf);
    let found = inspector.lookup(&src, names).ok()?;
    let syms: Vec<Vec<(u64, Option<u64>)>> = (0..names.len())
        .map(|i| {
            found
                .get(i)
                .map(|v| v.iter().map(|s| (s.addr, s.file_offset)).collect())
                .unwrap_or_default()
        })
        .collect();
    Some(place(maps, &m.path, &syms))
}

/// Target addresses of symbols of the module `path`, given per name as (virtual address, file
/// offset) candidates. A symbol with file data is where its file offset is mapped. One without
/// (in .bss, as `_PyRuntime` is before 3.10) is placed by the load bias of one with, since one
/// bias relocates the whole image, and must land in a mapping (the module's zero-filled tail).
pub fn place(maps: &[Mapping], path: &str, syms: &[Vec<(u64, Option<u64>)>]) -> Vec<Option<u64>> {
    let mapped = |&(_, off): &(u64, Option<u64>)| off.and_then(|o| address_of(maps, path, o));
    let bias = syms
        .iter()
        .flatten()
        .find_map(|s| Some(mapped(s)?.wrapping_sub(s.0)));
    syms.iter()
        .map(|cands| {
            cands.iter().find_map(mapped).or_else(|| {
                let (vaddr, _) = cands.iter().find(|(_, off)| off.is_none())?;
                let a = bias?.wrapping_add(*vaddr);
                maps.iter().any(|m| m.start <= a && a < m.end).then_some(a)
            })
        })
        .collect()
}

/// Where glibc's `struct pthread` (what a `pthread_t` points to) holds the kernel tid: from the
/// descriptor glibc publishes for libthread_db, `_thread_db_pthread_tid` (bit size, count,
/// offset), in libc.so.6 (2.34+), libpthread.so.0 (older), or a statically linked interpreter.
/// Read from the target, so it is the C library the process runs with. `None` when no mapped
/// module has it: not mapped yet, or another C library (musl), whose processes are left
/// unsupported rather than guessed.
pub fn pthread_tid_offset(
    pid: u32,
    maps: &[Mapping],
    mem: &dyn Memory,
    interp_module: &str,
) -> Result<Option<u64>, String> {
    let libc_like = |m: &&Mapping| {
        let name = Path::new(&m.path)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        ["libc.so", "libc-", "libpthread"]
            .iter()
            .any(|p| name.starts_with(p))
    };
    let mut paths: Vec<&Mapping> = Vec::new();
    for m in maps
        .iter()
        .filter(|m| m.is_file() && (libc_like(m) || m.path == interp_module))
    {
        if !paths.iter().any(|p| p.path == m.path) {
            paths.push(m);
        }
    }
    paths.sort_by_key(|m| m.path == interp_module);
    let inspector = Inspector::new();
    for m in paths {
        let Some(Some(at)) =
            lookup(&inspector, pid, maps, m, &["_thread_db_pthread_tid"]).map(|a| a[0])
        else {
            continue;
        };
        let mut d = [0u8; 12];
        mem.read(at, &mut d)
            .map_err(|e| format!("{}: reading _thread_db_pthread_tid: {e}", m.path))?;
        let word = |i: usize| u32::from_le_bytes(d[i * 4..i * 4 + 4].try_into().unwrap());
        return pthread_tid_from_descriptor([word(0), word(1), word(2)])
            .map(Some)
            .ok_or_else(|| format!("{}: unexpected _thread_db_pthread_tid {d:?}", m.path));
    }
    Ok(None)
}

/// The offset in a `_thread_db_pthread_tid` descriptor of a 32-bit `pid_t` field.
pub fn pthread_tid_from_descriptor(d: [u32; 3]) -> Option<u64> {
    let [bits, count, offset] = d;
    (bits == 32 && count == 1 && offset % 4 == 0 && offset < 4096).then_some(offset as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(start: u64, end: u64, offset: u64, path: &str) -> Mapping {
        Mapping {
            start,
            end,
            offset,
            perms: "rw-p".into(),
            inode: 1,
            path: path.into(),
        }
    }

    #[test]
    fn the_loader_is_done_once_libc_is_mapped_or_there_is_no_loader() {
        let m = |path: &str| mapping(0x1000, 0x2000, 0, path);
        let anon = Mapping {
            inode: 0,
            ..m("[stack]")
        };
        // Just exec'd: the program and its loader, nothing else yet.
        let exec = vec![
            m("/usr/bin/app"),
            m("/usr/lib64/ld-linux-x86-64.so.2"),
            anon.clone(),
        ];
        assert!(!libraries_loaded(&exec));
        let mut loaded = exec.clone();
        loaded.push(m("/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert!(libraries_loaded(&loaded));
        // glibc before 2.34 named its file by version.
        let mut old = exec.clone();
        old.push(m("/lib/x86_64-linux-gnu/libc-2.31.so"));
        assert!(libraries_loaded(&old));
        // Static: no loader was ever mapped.
        assert!(libraries_loaded(&[
            m("/usr/local/bin/static-app"),
            anon.clone()
        ]));
        // musl's loader is its C library: mapped at the exec, so it tells nothing.
        assert!(!libraries_loaded(&[
            m("/usr/bin/app"),
            m("/lib/ld-musl-x86_64.so.1")
        ]));
        // Nothing read (the process is gone): not known.
        assert!(!libraries_loaded(&[anon]));
        assert!(!libraries_loaded(&[
            m("/usr/lib/libcuda.so.1"),
            m("/x/ld-linux.so.2")
        ]));
    }

    #[test]
    fn names() {
        assert!(candidate("/usr/bin/python3.11"));
        assert!(candidate("/x/lib/libpython3.12.so.1.0"));
        assert!(!candidate("/usr/bin/bash"));
        assert_eq!(version_from_name("/x/libpython3.12.so.1.0"), Some((3, 12)));
        assert_eq!(version_from_name("/usr/bin/python3.11"), Some((3, 11)));
        assert_eq!(version_from_name("/usr/bin/python3"), None);
        assert_eq!(decode_version_hex(0x030b02f0), (3, 11, Some(2)));
        assert_eq!(decode_version_hex(0x030d00f0), (3, 13, Some(0)));
        // 3.10 has no Py_Version: the version comes from the name, shared library or static
        // executable alike.
        assert!(candidate("/x/lib/libpython3.10.so.1.0") && candidate("/usr/bin/python3.10"));
        assert_eq!(
            version_from_name("/x/lib/libpython3.10.so.1.0"),
            Some((3, 10))
        );
        assert_eq!(version_from_name("/x/lib/libpython3.10.so"), Some((3, 10)));
        assert_eq!(version_from_name("/usr/bin/python3.10"), Some((3, 10)));
        assert_eq!(
            version_from_name("/usr/local/bin/python3.10d"),
            Some((3, 10))
        );
        let mut i = Interpreter {
            module: "/usr/bin/python3.10".into(),
            version: (3, 10, None),
            runtime: 0,
            code_type: 0,
            pthread_tid: None,
        };
        assert_eq!(i.version_string(), "3.10");
        i.version = (3, 11, Some(7));
        assert_eq!(i.version_string(), "3.11.7");
    }

    /// This test process's own C library: the offset must lead from `pthread_self()` to the
    /// calling thread's tid, on the main thread and another.
    #[test]
    fn pthread_tid_offset_of_this_process() {
        let pid = std::process::id();
        let maps = procfs::read_maps(pid).unwrap();
        let mem = super::super::memory::ProcessMemory(pid);
        let off = pthread_tid_offset(pid, &maps, &mem, "").unwrap().unwrap();
        let check = move || {
            let me = unsafe { libc::pthread_self() } as u64;
            let tid = unsafe { libc::gettid() } as u32;
            assert_eq!(mem.u32(me + off).unwrap(), tid);
        };
        check();
        std::thread::spawn(check).join().unwrap();
    }

    /// glibc 2.36's descriptor (Debian 12's libc.so.6) is {32, 1, 720}.
    #[test]
    fn pthread_tid_descriptors() {
        assert_eq!(pthread_tid_from_descriptor([32, 1, 720]), Some(720));
        assert_eq!(pthread_tid_from_descriptor([64, 1, 720]), None);
        assert_eq!(pthread_tid_from_descriptor([32, 2, 720]), None);
        assert_eq!(pthread_tid_from_descriptor([32, 1, 722]), None);
        assert_eq!(pthread_tid_from_descriptor([32, 1, 1 << 20]), None);
    }

    /// libpython3.9's `_PyRuntime` is in .bss: no file offset, placed by the load bias of
    /// `PyCode_Type` (in .data) into the anonymous mapping after the file's last one.
    #[test]
    fn symbols_without_file_data() {
        let m = mapping;
        let lib = "/x/lib/libpython3.9.so.1.0";
        let maps = vec![
            m(0x7f00_0000_0000, 0x7f00_0010_0000, 0, lib),
            m(0x7f00_0035_9000, 0x7f00_0037_0000, 0x358000, lib),
            m(0x7f00_0037_0000, 0x7f00_003c_0000, 0, ""),
        ];
        let code_type = vec![(0x359cc0, Some(0x358cc0))];
        let runtime = vec![(0x3acf60, None)];
        let placed = place(&maps, lib, &[runtime, code_type.clone(), vec![]]);
        assert_eq!(
            placed,
            vec![Some(0x7f00_003a_cf60), Some(0x7f00_0035_9cc0), None]
        );
        // Without a symbol that has file data there is no bias; an address outside every
        // mapping is no address.
        assert_eq!(place(&maps, lib, &[vec![(0x3acf60, None)]]), vec![None]);
        let far = vec![(0x900000, None)];
        assert_eq!(
            place(&maps, lib, &[far, code_type]),
            vec![None, Some(0x7f00_0035_9cc0)]
        );
    }

    /// pyenv's libpython3.12 as the loader maps it: first its whole span read-only from
    /// offset 0, then each segment over its place; `_PyRuntime` (address 0x643340, file
    /// offset 0x642340: its segment is shifted 0x1000) is found only once the data segment is.
    #[test]
    fn the_runtime_is_found_only_once_the_data_segment_is_mapped() {
        let lib = "/p/lib/libpython3.12.so.1.0";
        let base = 0x7f74_c8c0_0000;
        let at = |start: u64, end: u64, offset: u64, perms: &str| Mapping {
            perms: perms.into(),
            ..mapping(base + start, base + end, offset, lib)
        };
        let runtime = vec![(0x643340, Some(0x642340))];
        // Text and read-only data mapped over the first mapping; its tail is still there.
        let during = vec![
            at(0, 0x106000, 0, "r--p"),
            at(0x106000, 0x379000, 0x106000, "r-xp"),
            at(0x379000, 0x4cd000, 0x379000, "r--p"),
            at(0x4cd000, 0x6b5000, 0x4cd000, "r--p"),
        ];
        let wrong = place(&during, lib, std::slice::from_ref(&runtime))[0].unwrap();
        assert_eq!(wrong, base + 0x642340);
        assert!(!writable_at(&during, wrong));
        let done = vec![
            at(0, 0x106000, 0, "r--p"),
            at(0x106000, 0x379000, 0x106000, "r-xp"),
            at(0x379000, 0x4cd000, 0x379000, "r--p"),
            at(0x4cd000, 0x544000, 0x4cc000, "r--p"),
            at(0x544000, 0x6b4000, 0x543000, "rw-p"),
        ];
        let right = place(&done, lib, &[runtime])[0].unwrap();
        assert_eq!(right, base + 0x643340);
        assert!(writable_at(&done, right));
    }

    #[test]
    fn file_offsets_to_addresses() {
        let m = mapping;
        let mut maps = vec![
            m(0x100000, 0x110000, 0, "/p"),
            m(0x400000, 0x401000, 0, "/p"),
            m(0x600000, 0x602000, 0x1000, "/p"),
            m(0x700000, 0x701000, 0x1000, "/q"),
        ];
        // The first, a whole-file shared mapping, is not the loader's.
        maps[0].perms = "r--s".into();
        assert_eq!(address_of(&maps, "/p", 0x1800), Some(0x600800));
        assert_eq!(address_of(&maps, "/p", 0x10), Some(0x400010));
        assert_eq!(address_of(&maps, "/p", 0x9000), None);
        assert_eq!(address_of(&maps, "/q", 0x1004), Some(0x700004));
    }
}
