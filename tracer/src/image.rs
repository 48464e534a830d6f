//! Where an exec'd image's code lies, from what the kernel side sent at the exec
//! ([`ExecEvent`]): the executable's and its loader's executable segments, placed by the
//! auxiliary vector (`AT_ENTRY` gives the executable's load bias, `AT_BASE` the loader's).
//!
//! A process that execs and exits within the 10 ms between two reads of the events (a shell
//! loop's `true`, a build's compiler drivers) is gone before /proc can give its maps: its CPU
//! samples were `[unknown]` throughout, though most of such a process's user time is its
//! loader's (relocations, CPU feature probes). Libraries the loader maps later (libc) are not
//! known from the exec, and stay unnamed.

use std::{
    collections::HashMap,
    fs::File,
    io::Read,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use object::{
    elf,
    read::elf::{FileHeader, ProgramHeader},
    Endianness,
};
use tracer_common::proc::{auxv_value, ExecEvent, AT_BASE, AT_ENTRY};

use crate::procfs::Mapping;

/// Bytes read from the start of an ELF file: its header and program headers, and the
/// loader's name, lie well within them (a linker puts them first).
const HEAD_BYTES: u64 = 64 * 1024;

const PAGE: u64 = 4096;

/// One file of a placed image: the key its mappings hold it by (inode, path as the process's
/// maps would name it), and its name under the directory it was found from (the process's
/// root, or its working directory), to open it again and hold it while the trace runs: by the
/// report that name may lead elsewhere, or, under a parent gone since, nowhere.
#[derive(Debug)]
pub struct ImageFile {
    pub key: (u64, String),
    name: String,
    from_cwd: bool,
}

impl ImageFile {
    /// The file, where it still has its inode: opened as it was found, from `root` or `cwd`.
    pub fn open(&self, root: &Path, cwd: Option<&Path>) -> Option<File> {
        let dir = if self.from_cwd { cwd? } else { root };
        open_checked(dir, &self.name, Some(self.key.0)).map(|(f, _)| f)
    }
}

/// What was read of exec'd files: a shell loop
/// execs the same few files thousands of times, and each read was two files' opens and
/// headers, ~23 µs of gputrace's CPU an exec here.
#[derive(Debug, Default)]
pub struct Images {
    /// By (the directory it was found from, its name there, its inode).
    parsed: HashMap<(PathBuf, String, u64), Option<Image>>,
}

/// Files kept parsed, at most; past it the cache starts again.
const MAX_IMAGES: usize = 1024;

/// An executable's code segments and its loader's, where it names one.
#[derive(Debug)]
struct Image {
    exe: Segments,
    exe_file: ImageFile,
    loader: Option<(Segments, ImageFile)>,
}

impl Images {
    /// The code mappings of the image an exec started, sorted by start, and the files they
    /// map. Empty where the event lacks the place (`AT_ENTRY`) or the executable's inode, or
    /// where the file it names is not the one exec'd: `root` is the process's root directory
    /// as this process can reach it, `cwd` its working directory (for a relative name), each
    /// as of the exec.
    pub fn exec_maps(
        &mut self,
        ev: &ExecEvent,
        root: &Path,
        cwd: Option<&Path>,
    ) -> (Vec<Mapping>, Vec<&ImageFile>) {
        let mut maps = Vec::new();
        let mut files = Vec::new();
        let Some(entry) = auxv_value(&ev.auxv, AT_ENTRY) else {
            return (maps, files);
        };
        let name = cstr(&ev.path);
        if name.is_empty() || ev.exe_ino == 0 {
            return (maps, files);
        }
        let from_cwd = !name.starts_with('/');
        let dir = match (from_cwd, cwd) {
            (false, _) => root,
            (true, Some(cwd)) => cwd,
            (true, None) => return (maps, files),
        };
        let key = (dir.to_path_buf(), name, ev.exe_ino);
        if !self.parsed.contains_key(&key) {
            if self.parsed.len() >= MAX_IMAGES {
                self.parsed.clear();
            }
            let image = Image::read(dir, &key.1, from_cwd, ev.exe_ino, root);
            self.parsed.insert(key.clone(), image);
        }
        let Some(Some(image)) = self.parsed.get(&key) else {
            return (maps, files);
        };
        let bias = entry.wrapping_sub(image.exe.entry);
        maps.extend(image.exe.mappings(bias, &image.exe_file.key));
        files.push(&image.exe_file);
        // The loader, placed by AT_BASE (0 for a static executable).
        let base = auxv_value(&ev.auxv, AT_BASE).unwrap_or(0);
        if let (Some((segments, file)), true) = (&image.loader, base != 0) {
            maps.extend(segments.mappings(base, &file.key));
            files.push(file);
        }
        // The vDSO (`clock_gettime`'s code): the kernel maps one image into every process
        // of an ABI, ours as large as theirs (a 64-bit executable's, all that is placed here).
        if let (Some(at), Some(len)) = (auxv_value(&ev.auxv, AT_SYSINFO_EHDR), own_vdso_len()) {
            maps.push(Mapping {
                start: at,
                end: at.wrapping_add(len),
                offset: 0,
                perms: "r-xp".into(),
                inode: 0,
                path: crate::symbolize::VDSO.into(),
            });
        }
        maps.sort_by_key(|m| m.start);
        (maps, files)
    }
}

impl Image {
    /// The executable `name` (found from `dir`: `cwd` where `from_cwd`, else `root`) where it
    /// has inode `inode`, or a script's interpreter (its `#!` line's, under `root`) where
    /// that has it; and the loader it names under `root`.
    fn read(dir: &Path, name: &str, from_cwd: bool, inode: u64, root: &Path) -> Option<Image> {
        let (file, head) = open_checked(dir, name, None)?;
        let (dir, name, from_cwd, head) = if file.metadata().ok()?.ino() == inode {
            (dir, name.to_string(), from_cwd, head)
        } else {
            // The kernel exec'd the interpreter a script names (binfmt_script), whose file
            // the process maps; an interpreter that is a script itself is not followed.
            let interp = shebang(&head)?;
            let head = open_checked(root, &interp, Some(inode))?.1;
            (root, interp, false, head)
        };
        let exe = Segments::parse(&head)?;
        let exe_file = ImageFile {
            key: (inode, mapping_path(root, dir, &name)),
            name,
            from_cwd,
        };
        let loader = exe.interp.as_deref().and_then(|interp| {
            let (file, head) = open_checked(root, interp, None)?;
            let segments = Segments::parse(&head)?;
            let ino = file.metadata().ok()?.ino();
            let name = interp.to_string();
            let key = (ino, mapping_path(root, root, &name));
            let file = ImageFile {
                key,
                name,
                from_cwd: false,
            };
            Some((segments, file))
        });
        Some(Image {
            exe,
            exe_file,
            loader,
        })
    }
}

/// The vDSO's address in the auxiliary vector.
const AT_SYSINFO_EHDR: u64 = 33;

/// The size of this process's vDSO, once read.
fn own_vdso_len() -> Option<u64> {
    static LEN: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *LEN.get_or_init(|| {
        crate::procfs::read_maps(std::process::id())?
            .into_iter()
            .find(|m| m.path == crate::symbolize::VDSO)
            .map(|m| m.end - m.start)
    })
}

/// The path a process's maps would name file `name` found from `dir` by: its real path where
/// the process shares our root `/` (as /proc/PID/maps resolves links:
/// `/lib64/ld-linux-x86-64.so.2` is `/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2` there),
/// else `name` as given (its links are the other root's, not resolved from ours).
fn mapping_path(root: &Path, dir: &Path, name: &str) -> String {
    if root == Path::new("/") {
        if let Ok(real) = std::fs::canonicalize(dir.join(name)) {
            return real.display().to_string();
        }
    }
    name.to_string()
}

/// The regular file `name` inside directory `dir` ([`crate::perf_map::open_within`]: never
/// out of it, as a container's absolute symlink would lead from its root), where its inode is
/// `inode` (when given), and its first [`HEAD_BYTES`].
fn open_checked(dir: &Path, name: &str, inode: Option<u64>) -> Option<(File, Vec<u8>)> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)
        .ok()?;
    let file = File::from(crate::perf_map::open_within(&dir.into(), name, 0)?);
    let meta = file.metadata().ok()?;
    if !meta.is_file() || inode.is_some_and(|i| i != meta.ino()) {
        return None;
    }
    let mut head = Vec::new();
    (&file).take(HEAD_BYTES).read_to_end(&mut head).ok()?;
    Some((file, head))
}

/// The interpreter a script's first bytes `head` name (`#!/bin/sh -e`: `/bin/sh`), where it
/// is an absolute path.
fn shebang(head: &[u8]) -> Option<String> {
    let line = head.strip_prefix(b"#!")?.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let interp = line.split_whitespace().next()?;
    interp.starts_with('/').then(|| interp.to_string())
}

/// What an ELF file's headers say of its loading.
#[derive(Debug)]
struct Segments {
    /// `e_entry`.
    entry: u64,
    /// `PT_INTERP`: the loader it asks for.
    interp: Option<String>,
    /// Its executable `PT_LOAD`s: (`p_vaddr`, `p_memsz`, `p_offset`).
    code: Vec<(u64, u64, u64)>,
}

impl Segments {
    /// A 64-bit ELF file's, from its first bytes `head`.
    fn parse(head: &[u8]) -> Option<Segments> {
        let header = elf::FileHeader64::<Endianness>::parse(head).ok()?;
        let endian = header.endian().ok()?;
        let mut out = Segments {
            entry: header.e_entry(endian),
            interp: None,
            code: Vec::new(),
        };
        for ph in header.program_headers(endian, head).ok()? {
            match ph.p_type(endian) {
                elf::PT_LOAD if ph.p_flags(endian) & elf::PF_X != 0 => {
                    out.code
                        .push((ph.p_vaddr(endian), ph.p_memsz(endian), ph.p_offset(endian)))
                }
                elf::PT_INTERP => {
                    out.interp = ph
                        .interpreter(endian, head)
                        .ok()
                        .flatten()
                        .map(|b| String::from_utf8_lossy(b).into_owned());
                }
                _ => {}
            }
        }
        Some(out)
    }

    /// Its code's mappings once loaded at `bias`, as /proc/PID/maps would give them (`key`:
    /// inode and path).
    fn mappings<'a>(
        &'a self,
        bias: u64,
        key: &'a (u64, String),
    ) -> impl Iterator<Item = Mapping> + 'a {
        self.code.iter().map(move |&(vaddr, memsz, offset)| {
            let at = bias.wrapping_add(vaddr);
            Mapping {
                start: at & !(PAGE - 1),
                end: at.wrapping_add(memsz).next_multiple_of(PAGE),
                offset: offset & !(PAGE - 1),
                perms: "r-xp".into(),
                inode: key.0,
                path: key.1.clone(),
            }
        })
    }
}

fn cstr(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use tracer_common::proc::{ProcEvent, EXEC_AUXV_WORDS, EXEC_PATH_BYTES};

    /// This process's exec as the kernel side would send it: its saved auxv (from
    /// /proc/self/auxv), its executable's inode, and `path`.
    pub(crate) fn own_exec(path: &str, ino: u64) -> ExecEvent {
        let raw = std::fs::read("/proc/self/auxv").unwrap();
        let mut auxv = [0u64; EXEC_AUXV_WORDS];
        for (w, b) in auxv.iter_mut().zip(raw.chunks_exact(8)) {
            *w = u64::from_ne_bytes(b.try_into().unwrap());
        }
        let mut p = [0u8; EXEC_PATH_BYTES];
        p[..path.len()].copy_from_slice(path.as_bytes());
        ExecEvent {
            head: ProcEvent {
                kind: 2,
                pid: std::process::id(),
                tid: std::process::id(),
                ppid: 0,
                ts_ns: 0,
                exit_code: 0,
                arg: 0,
                comm: [0; 16],
            },
            auxv,
            exe_ino: ino,
            path: p,
        }
    }

    /// This test binary's path and inode.
    pub(crate) fn exe() -> (String, u64) {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let ino = std::fs::metadata(&exe).unwrap().ino();
        (exe.display().to_string(), ino)
    }

    #[test]
    fn places_the_executable_and_its_loader_where_the_kernel_mapped_them() {
        let (path, ino) = exe();
        let mut images = Images::default();
        let (maps, files) = images.exec_maps(&own_exec(&path, ino), Path::new("/"), None);
        let real: Vec<Mapping> = crate::procfs::read_maps(std::process::id())
            .unwrap()
            .into_iter()
            .filter(|m| m.is_exec() && m.is_file())
            .collect();
        // The test binary (PIE) and the loader it names, each code mapping exactly where, and
        // from where in the file, /proc says; and the vDSO.
        assert!(files.len() == 2, "executable and loader: {:?}", maps);
        assert!(maps.iter().any(|m| m.path == path));
        let vdso = crate::procfs::read_maps(std::process::id())
            .unwrap()
            .into_iter()
            .find(|m| m.path == crate::symbolize::VDSO)
            .unwrap();
        assert!(maps
            .iter()
            .any(|m| (m.start, m.end, &m.path) == (vdso.start, vdso.end, &vdso.path)));
        for m in maps.iter().filter(|m| m.inode != 0) {
            let r = real
                .iter()
                .find(|r| r.start == m.start)
                .unwrap_or_else(|| panic!("{m:?} in no real mapping: {real:?}"));
            assert_eq!(
                (r.end, r.offset, r.inode, &r.path),
                (m.end, m.offset, m.inode, &m.path)
            );
        }
        let ld = maps
            .iter()
            .find(|m| m.inode != 0 && m.path != path)
            .expect("the loader's code");
        assert!(ld.path.contains("ld-linux"), "{ld:?}");
        assert!(maps.windows(2).all(|w| w[0].start < w[1].start));
    }

    #[test]
    fn another_file_at_the_name_is_not_taken() {
        let (path, ino) = exe();
        // Replaced since (or a script, whose interpreter was mapped): another inode.
        assert!(Images::default()
            .exec_maps(&own_exec(&path, ino + 1), Path::new("/"), None)
            .0
            .is_empty());
        // Unread inode, no name, no auxv: nothing is guessed.
        assert!(Images::default()
            .exec_maps(&own_exec(&path, 0), Path::new("/"), None)
            .0
            .is_empty());
        assert!(Images::default()
            .exec_maps(&own_exec("", ino), Path::new("/"), None)
            .0
            .is_empty());
        let mut ev = own_exec(&path, ino);
        ev.auxv = [0; tracer_common::proc::EXEC_AUXV_WORDS];
        assert!(Images::default()
            .exec_maps(&ev, Path::new("/"), None)
            .0
            .is_empty());
    }

    #[test]
    fn a_relative_name_is_found_from_the_working_directory() {
        let (path, ino) = exe();
        let p = Path::new(&path);
        let (dir, file) = (
            p.parent().unwrap(),
            p.file_name().unwrap().to_str().unwrap(),
        );
        let (maps, _) =
            Images::default().exec_maps(&own_exec(file, ino), Path::new("/"), Some(dir));
        assert!(maps.iter().any(|m| m.path == path), "{maps:?}");
        // Without a directory to start from, it is not guessed.
        assert!(Images::default()
            .exec_maps(&own_exec(file, ino), Path::new("/"), None)
            .0
            .is_empty());
    }

    #[test]
    fn a_script_is_placed_as_its_interpreter() {
        let (path, ino) = exe();
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("job.sh");
        std::fs::write(&script, format!("#!{path} --flag\necho hi\n")).unwrap();
        let script = script.display().to_string();
        let mut images = Images::default();
        let (maps, files) = images.exec_maps(&own_exec(&script, ino), Path::new("/"), None);
        assert!(maps.iter().any(|m| m.path == path), "{maps:?}");
        assert_eq!(files.len(), 2);
        // An interpreter other than the one exec'd (its inode) is not taken.
        assert!(images
            .exec_maps(&own_exec(&script, ino + 1), Path::new("/"), None)
            .0
            .is_empty());
        assert_eq!(shebang(b"#! /bin/sh -e\nx"), Some("/bin/sh".into()));
        assert_eq!(shebang(b"#!sh\n"), None);
        assert_eq!(shebang(b"\x7fELF"), None);
    }

    #[test]
    fn a_link_under_another_root_leads_nowhere_outside_it() {
        let (path, ino) = exe();
        // A container's `/bin/prog`, a link to `path`: in its tree, not ours (a planted link
        // would have us read, and name frames after, any file of the host's).
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("bin")).unwrap();
        std::os::unix::fs::symlink(&path, root.path().join("bin/prog")).unwrap();
        let mut images = Images::default();
        assert!(images
            .exec_maps(&own_exec("/bin/prog", ino), root.path(), None)
            .0
            .is_empty());
        // Nor up out of it, nor from the working directory.
        let up = format!("../../../../../../../..{path}");
        assert!(images
            .exec_maps(&own_exec(&up, ino), root.path(), Some(root.path()))
            .0
            .is_empty());
    }

    #[test]
    fn a_name_is_looked_up_under_the_processs_root() {
        let (path, ino) = exe();
        // Our own root through /proc, as a process in another mount namespace's would be.
        let root = format!("/proc/{}/root", std::process::id());
        let mut images = Images::default();
        let (maps, files) = images.exec_maps(&own_exec(&path, ino), Path::new(&root), None);
        assert_eq!(files.len(), 2);
        // Named as given (links under another root are not resolved from ours).
        assert!(maps.iter().any(|m| m.path == path), "{maps:?}");
    }
}
