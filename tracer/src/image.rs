//! Where an exec'd image's code lies, from what the kernel side sent at the exec
//! ([`ExecEvent`]): the executable's and its loader's executable segments, placed by the
//! auxiliary vector (`AT_ENTRY` gives the executable's load bias, `AT_BASE` the loader's).
//!
//! A process that execs and exits within the 10 ms between two reads of the events (a shell
//! loop's `true`, a build's compiler drivers) is gone before /proc can give its maps: its CPU
//! samples were `[unknown]` throughout, though most of such a process's user time is its
//! loader's (relocations, CPU feature probes). The libraries the loader maps later come from
//! their own events (`crate::tracker::Tracker::on_mapped_code`).
//!
//! The files are the target's, found by the names it used: a hostile one may swap a name for
//! a link or a device between its exec and our look. So a file is looked up inside the
//! process's root (`RESOLVE_IN_ROOT`), first without opening it (`O_PATH`), and opened only
//! as a regular file of a real filesystem, the executable only where it is the file the kernel
//! exec'd (device and inode).

use std::{
    collections::HashMap,
    fs::File,
    io::Read,
    os::{
        fd::{AsRawFd, OwnedFd},
        unix::fs::{MetadataExt, OpenOptionsExt},
    },
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
/// Bytes read of a file that is not the one exec'd, to find a script's `#!` line (the
/// kernel's own limit, `BINPRM_BUF_SIZE`).
const SHEBANG_BYTES: u64 = 256;

/// The page size mappings are placed in (x86-64's; arm64's 64 KiB pages only move a placed
/// mapping's edges).
pub const PAGE: u64 = 4096;

/// A file's device (major, minor) and inode.
pub type FileId = (u32, u32, u64);

/// A [`FileId`] from the kernel's `dev_t` (major << 20 | minor) and an inode number.
pub fn kernel_file_id(dev: u32, ino: u64) -> FileId {
    (dev >> 20, dev & 0xf_ffff, ino)
}

/// A file's [`FileId`] from its metadata.
pub fn meta_id(m: &std::fs::Metadata) -> FileId {
    (libc::major(m.dev()), libc::minor(m.dev()), m.ino())
}

/// Where a process's files are looked up: its root and working directories, as this process
/// reaches them, as of its exec (its parent's: a child execs with its parent's unless it
/// moved, which the executable's identity check catches).
pub struct Dirs {
    root: PathBuf,
    cwd: Option<PathBuf>,
    /// The root's own path from ours (its link's target), taken off the paths found under
    /// it; None where the root is ours.
    prefix: Option<String>,
}

impl Dirs {
    /// Process `ppid`'s, None where it is gone.
    pub fn of(ppid: u32) -> Option<Dirs> {
        let root = PathBuf::from(format!("/proc/{ppid}/root"));
        let theirs = std::fs::metadata(&root).ok()?;
        let cwd = Some(PathBuf::from(format!("/proc/{ppid}/cwd")));
        if std::fs::metadata("/").is_ok_and(|o| meta_id(&o) == meta_id(&theirs)) {
            return Some(Dirs {
                root: PathBuf::from("/"),
                cwd,
                prefix: None,
            });
        }
        let prefix = std::fs::read_link(&root).ok()?.display().to_string();
        Some(Dirs {
            root,
            cwd,
            prefix: Some(prefix),
        })
    }

    /// Ours (gputrace's root, no working directory): for a process whose parent is gone (or
    /// unknown). Its executable is still found only as the file the kernel exec'd, which at
    /// the same path under our root is the same file; its loader, found by name, is the one
    /// our root has there, which a process whose root differs may not have (a container with
    /// the host's binaries but its own loader: its loader's frames misnamed, never outside our
    /// root).
    pub fn ours() -> Dirs {
        Dirs {
            root: PathBuf::from("/"),
            cwd: None,
            prefix: None,
        }
    }

    fn dir(&self, from_cwd: bool) -> Option<&Path> {
        if from_cwd {
            self.cwd.as_deref()
        } else {
            Some(&self.root)
        }
    }
}

/// One file of a placed image: the key its mappings hold it by (inode, path as the process's
/// maps would name it), and how it was found, to open it again and hold it while the trace
/// runs (by the report its name may lead elsewhere, or, under a parent gone since, nowhere).
#[derive(Debug)]
pub struct ImageFile {
    pub key: (u64, String),
    name: String,
    from_cwd: bool,
    id: FileId,
}

impl ImageFile {
    /// The file, opened, where its name under `dirs` still leads to it.
    pub fn open(&self, dirs: &Dirs) -> Option<File> {
        find(dirs, self.from_cwd, &self.name, Some(self.id)).map(|f| f.file)
    }
}

/// What was read of exec'd files: a shell loop execs the same few files thousands of times,
/// and each read was two files' opens and headers, ~23 µs of gputrace's CPU an exec here.
#[derive(Debug, Default)]
pub struct Images {
    /// By (the directory the name was found from, the name, the executable).
    parsed: HashMap<(FileId, String, FileId), Image>,
}

/// Files kept parsed, at most; past it the cache starts again.
const MAX_IMAGES: usize = 1024;

/// How long a loader found is taken as still there.
const LOADER_RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// An executable's code segments and its loader's, where it names one.
#[derive(Debug)]
struct Image {
    exe: Segments,
    exe_file: ImageFile,
    loader: Option<(Segments, ImageFile)>,
    /// When the loader was last found to be the file read.
    checked: std::time::Instant,
}

impl Images {
    /// The code mappings of the image an exec started, sorted by start, and the files they
    /// map. Empty where the event lacks the place (`AT_ENTRY`) or the executable's identity,
    /// or where the name it was exec'd by does not lead to that file under `dirs`.
    pub fn exec_maps(&mut self, ev: &ExecEvent, dirs: &Dirs) -> (Vec<Mapping>, Vec<&ImageFile>) {
        let mut maps = Vec::new();
        let mut files = Vec::new();
        let Some(entry) = auxv_value(&ev.auxv, AT_ENTRY) else {
            return (maps, files);
        };
        let name = cstr(&ev.path);
        if name.is_empty() || ev.exe_ino == 0 || ev.exe_dev == 0 {
            return (maps, files);
        }
        let want = kernel_file_id(ev.exe_dev, ev.exe_ino);
        let from_cwd = !name.starts_with('/');
        let Some(dir) = dirs.dir(from_cwd).and_then(|d| std::fs::metadata(d).ok()) else {
            return (maps, files);
        };
        let key = (meta_id(&dir), name, want);
        // A hit's loader may have been replaced since (an upgrade): looked at again, once a
        // second at most (five syscalls an exec were ~2 µs of gputrace's CPU each).
        let now = std::time::Instant::now();
        let fresh = self.parsed.get_mut(&key).is_some_and(|i| {
            if now.duration_since(i.checked) < LOADER_RECHECK {
                return true;
            }
            i.checked = now;
            i.loader
                .as_ref()
                .is_none_or(|(_, f)| identify(dirs, false, &f.name) == Some(f.id))
        });
        if !fresh {
            self.parsed.remove(&key);
            // Not kept where not found: a name that leads nowhere now may lead to the file
            // later, and a failure may be passing (out of descriptors).
            let Some(image) = Image::read(dirs, &key.1, from_cwd, want) else {
                return (maps, files);
            };
            if self.parsed.len() >= MAX_IMAGES {
                self.parsed.clear();
            }
            self.parsed.insert(key.clone(), image);
        }
        let Some(image) = self.parsed.get(&key) else {
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
    /// The executable exec'd as `name` (from the working directory where `from_cwd`, else the
    /// root), where that is the file `want`, or a script whose `#!` interpreter is; and the
    /// loader it names.
    fn read(dirs: &Dirs, name: &str, from_cwd: bool, want: FileId) -> Option<Image> {
        let found = find(dirs, from_cwd, name, None)?;
        let (found, name, from_cwd) = if found.id == want {
            (found, name.to_string(), from_cwd)
        } else {
            // The kernel exec'd the interpreter a script names (binfmt_script), whose file
            // the process maps; an interpreter that is a script itself is not followed.
            let interp = shebang(&read_head(&found.file, SHEBANG_BYTES))?;
            (find(dirs, false, &interp, Some(want))?, interp, false)
        };
        let exe = Segments::parse(&read_head(&found.file, HEAD_BYTES))?;
        let exe_file = ImageFile {
            key: (want.2, found.path),
            name,
            from_cwd,
            id: want,
        };
        let loader = exe.interp.as_deref().and_then(|interp| {
            let ld = find(dirs, false, interp, None)?;
            let segments = Segments::parse(&read_head(&ld.file, HEAD_BYTES))?;
            let file = ImageFile {
                key: (ld.id.2, ld.path),
                name: interp.to_string(),
                from_cwd: false,
                id: ld.id,
            };
            Some((segments, file))
        });
        Some(Image {
            exe,
            exe_file,
            loader,
            checked: std::time::Instant::now(),
        })
    }
}

/// A file found by [`find`]: opened, its identity, and its path as the process's maps would
/// name it (as the kernel resolves it, links followed, from the process's root).
struct Found {
    file: File,
    id: FileId,
    path: String,
}

/// Filesystems whose files are the kernel's, not code: what a planted link may lead to
/// (`/proc/kmsg` reads consume the kernel's log).
const PSEUDO_FS: [i64; 11] = [
    0x9fa0,      // proc
    0x6265_6572, // sysfs
    0x6462_6720, // debugfs
    0x7472_6163, // tracefs
    0x7363_6673, // securityfs
    0x0027_e0eb, // cgroup
    0x6367_7270, // cgroup2
    0xcafe_4a11, // bpf
    0x6265_6570, // configfs
    0xde5e_81e4, // efivarfs
    0x6165_676c, // pstore
];

/// The regular file `name` inside `dirs`' root (or working directory, where `from_cwd`),
/// where it is `want` (when given), on a real filesystem, opened read-only: looked up first
/// (`O_PATH`, never opening a device or a FIFO, nor leaving the root), opened after the checks.
fn find(dirs: &Dirs, from_cwd: bool, name: &str, want: Option<FileId>) -> Option<Found> {
    let (path, id) = look_up(dirs, from_cwd, name)?;
    if want.is_some_and(|w| w != id) {
        return None;
    }
    // SAFETY: an all-zero statfs is valid; fstatfs fills it.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a statfs to fill.
    if unsafe { libc::fstatfs(path.as_raw_fd(), &mut fs) } != 0
        || PSEUDO_FS.contains(&(fs.f_type as i64))
    {
        return None;
    }
    let link = format!("/proc/self/fd/{}", path.as_raw_fd());
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&link)
        .ok()?;
    if file.metadata().ok().map(|m| meta_id(&m)) != Some(id) {
        return None;
    }
    let real = std::fs::read_link(&link).ok()?.display().to_string();
    let path = match &dirs.prefix {
        Some(p) if p != "/" => real.strip_prefix(p.as_str())?.to_string(),
        _ => real,
    };
    path.starts_with('/').then_some(Found { file, id, path })
}

/// The file `name` (absolute from `dirs`' root, else from its working directory) leads to,
/// opened, where it is `want`, and its path as the process's maps would name it.
pub fn find_file(dirs: &Dirs, name: &str, want: FileId) -> Option<(File, String)> {
    find(dirs, !name.starts_with('/'), name, Some(want)).map(|f| (f.file, f.path))
}

/// [`find`]'s look-up: the file `name` leads to, not opened (`O_PATH`), and its identity,
/// where it is a regular file.
fn look_up(dirs: &Dirs, from_cwd: bool, name: &str) -> Option<(OwnedFd, FileId)> {
    let dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dirs.dir(from_cwd)?)
        .ok()?;
    let fd = crate::perf_map::open_within(&dir.into(), name, libc::O_PATH)?;
    let file = File::from(fd);
    let meta = file.metadata().ok()?;
    meta.is_file().then(|| (file.into(), meta_id(&meta)))
}

/// The identity of the regular file `name` leads to under `dirs`.
fn identify(dirs: &Dirs, from_cwd: bool, name: &str) -> Option<FileId> {
    look_up(dirs, from_cwd, name).map(|(_, id)| id)
}

/// The first `n` bytes of `file` (fewer where it is shorter or unreadable).
fn read_head(file: &File, n: u64) -> Vec<u8> {
    let mut head = Vec::new();
    let _ = file.take(n).read_to_end(&mut head);
    head
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

/// The interpreter a script's first bytes `head` name (`#!/bin/sh -e`: `/bin/sh`), where it
/// is an absolute path.
fn shebang(head: &[u8]) -> Option<String> {
    let line = head.strip_prefix(b"#!")?.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let interp = line.split_whitespace().next()?;
    interp.starts_with('/').then(|| interp.to_string())
}

/// Segments larger than this are not code a loader maps (a corrupt or hostile header).
const MAX_SEGMENT: u64 = 1 << 30;

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
    /// A 64-bit ELF file's, from its first bytes `head`. Segments no loader would map (over
    /// [`MAX_SEGMENT`], or whose address and file offset differ within a page) are left out.
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
                    let (vaddr, memsz, offset) =
                        (ph.p_vaddr(endian), ph.p_memsz(endian), ph.p_offset(endian));
                    if memsz > 0
                        && memsz <= MAX_SEGMENT
                        && offset <= u64::MAX / 2
                        && (vaddr ^ offset) & (PAGE - 1) == 0
                    {
                        out.code.push((vaddr, memsz, offset));
                    }
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
    /// inode and path); none that would wrap past the address space's end.
    fn mappings<'a>(
        &'a self,
        bias: u64,
        key: &'a (u64, String),
    ) -> impl Iterator<Item = Mapping> + 'a {
        self.code.iter().filter_map(move |&(vaddr, memsz, offset)| {
            let at = bias.wrapping_add(vaddr);
            let end = at.checked_add(memsz)?.checked_next_multiple_of(PAGE)?;
            Some(Mapping {
                start: at & !(PAGE - 1),
                end,
                offset: offset & !(PAGE - 1),
                perms: "r-xp".into(),
                inode: key.0,
                path: key.1.clone(),
            })
        })
    }
}

/// The text of NUL-terminated `bytes` (all of them where none is NUL).
pub fn cstr(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use tracer_common::proc::{ProcEvent, EXEC_AUXV_WORDS, EXEC_PATH_BYTES};

    /// This process's exec as the kernel side would send it: its saved auxv (from
    /// /proc/self/auxv), its executable's identity `id`, and `path`.
    pub(crate) fn own_exec(path: &str, id: FileId) -> ExecEvent {
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
            exe_ino: id.2,
            exe_dev: (id.0 << 20) | id.1,
            _pad: 0,
            path: p,
        }
    }

    /// This test binary's path and identity.
    pub(crate) fn exe() -> (String, FileId) {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let id = meta_id(&std::fs::metadata(&exe).unwrap());
        (exe.display().to_string(), id)
    }

    fn other(id: FileId) -> FileId {
        (id.0, id.1, id.2 + 1)
    }

    #[test]
    fn places_the_executable_and_its_loader_where_the_kernel_mapped_them() {
        let (path, id) = exe();
        let mut images = Images::default();
        let (maps, files) = images.exec_maps(&own_exec(&path, id), &Dirs::ours());
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
        // Again from what was read the first time: the same.
        let again = images.exec_maps(&own_exec(&path, id), &Dirs::ours()).0;
        assert_eq!(again, maps);
    }

    #[test]
    fn another_file_at_the_name_is_not_taken() {
        let (path, id) = exe();
        let mut images = Images::default();
        // Replaced since (or a script, whose interpreter was mapped): another inode; or
        // another filesystem's file of that inode number.
        for wrong in [other(id), (id.0, id.1 + 1, id.2)] {
            let ev = own_exec(&path, wrong);
            assert!(images.exec_maps(&ev, &Dirs::ours()).0.is_empty());
        }
        // Unread identity, no name, no auxv: nothing is guessed.
        let mut ev = own_exec(&path, id);
        ev.exe_ino = 0;
        assert!(images.exec_maps(&ev, &Dirs::ours()).0.is_empty());
        let mut ev = own_exec(&path, id);
        ev.exe_dev = 0;
        assert!(images.exec_maps(&ev, &Dirs::ours()).0.is_empty());
        let ev = own_exec("", id);
        assert!(images.exec_maps(&ev, &Dirs::ours()).0.is_empty());
        let mut ev = own_exec(&path, id);
        ev.auxv = [0; tracer_common::proc::EXEC_AUXV_WORDS];
        assert!(images.exec_maps(&ev, &Dirs::ours()).0.is_empty());
    }

    #[test]
    fn a_relative_name_is_found_from_the_working_directory() {
        let (path, id) = exe();
        let p = Path::new(&path);
        let (dir, file) = (
            p.parent().unwrap(),
            p.file_name().unwrap().to_str().unwrap(),
        );
        let dirs = Dirs {
            cwd: Some(dir.to_path_buf()),
            ..Dirs::ours()
        };
        let mut images = Images::default();
        let (maps, _) = images.exec_maps(&own_exec(file, id), &dirs);
        assert!(maps.iter().any(|m| m.path == path), "{maps:?}");
        // Without a directory to start from, it is not guessed.
        assert!(images
            .exec_maps(&own_exec(file, id), &Dirs::ours())
            .0
            .is_empty());
    }

    #[test]
    fn a_script_is_placed_as_its_interpreter() {
        let (path, id) = exe();
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("job.sh");
        std::fs::write(&script, format!("#!{path} --flag\necho hi\n")).unwrap();
        let script = script.display().to_string();
        let mut images = Images::default();
        let (maps, files) = images.exec_maps(&own_exec(&script, id), &Dirs::ours());
        assert!(maps.iter().any(|m| m.path == path), "{maps:?}");
        assert_eq!(files.len(), 2);
        // An interpreter other than the one exec'd (its inode) is not taken.
        assert!(images
            .exec_maps(&own_exec(&script, other(id)), &Dirs::ours())
            .0
            .is_empty());
        assert_eq!(shebang(b"#! /bin/sh -e\nx"), Some("/bin/sh".into()));
        assert_eq!(shebang(b"#!sh\n"), None);
        assert_eq!(shebang(b"\x7fELF"), None);
    }

    #[test]
    fn a_link_under_another_root_leads_nowhere_outside_it() {
        let (path, id) = exe();
        // A container's `/bin/prog`, a link to `path`: in its tree, not ours (a planted link
        // would have us read, and name frames after, any file of the host's).
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("bin")).unwrap();
        std::os::unix::fs::symlink(&path, root.path().join("bin/prog")).unwrap();
        let dirs = Dirs {
            root: root.path().to_path_buf(),
            cwd: Some(root.path().to_path_buf()),
            prefix: Some(root.path().display().to_string()),
        };
        let mut images = Images::default();
        assert!(images
            .exec_maps(&own_exec("/bin/prog", id), &dirs)
            .0
            .is_empty());
        // Nor up out of it, nor from the working directory.
        let up = format!("../../../../../../../..{path}");
        assert!(images.exec_maps(&own_exec(&up, id), &dirs).0.is_empty());
        // A file of the kernel's (a link to /proc/kmsg, whose reads take the kernel's log)
        // is not opened: no regular file of a real filesystem.
        assert!(look_up(&Dirs::ours(), false, "/proc/self/status").is_some());
        assert!(find(&Dirs::ours(), false, "/proc/self/status", None).is_none());
        assert!(find(&Dirs::ours(), false, "/dev/null", None).is_none());
        assert!(find(&Dirs::ours(), false, &path, None).is_some());
    }

    #[test]
    fn a_name_is_looked_up_under_the_processs_root() {
        let (path, id) = exe();
        // Our own root through /proc, as a process in another mount namespace's would be.
        let root = PathBuf::from(format!("/proc/{}/root", std::process::id()));
        let prefix = std::fs::read_link(&root).unwrap().display().to_string();
        let dirs = Dirs {
            root,
            cwd: None,
            prefix: Some(prefix),
        };
        let mut images = Images::default();
        let (maps, files) = images.exec_maps(&own_exec(&path, id), &dirs);
        assert_eq!(files.len(), 2);
        assert!(maps.iter().any(|m| m.path == path), "{maps:?}");
        // And opened again from there, to hold.
        assert!(files.iter().all(|f| f.open(&dirs).is_some()));
    }

    #[test]
    fn segments_are_placed_at_their_bias_and_odd_ones_left_out() {
        let key = (7, "/x".to_string());
        // A non-PIE executable (bias 0) whose code's address and offset differ.
        let s = Segments {
            entry: 0x401000,
            interp: None,
            code: vec![(0x401000, 0x1234, 0x1000)],
        };
        let m: Vec<Mapping> = s.mappings(0, &key).collect();
        assert_eq!(
            (m[0].start, m[0].end, m[0].offset),
            (0x401000, 0x403000, 0x1000)
        );
        // PIE at a bias; a segment starting within a page.
        let s = Segments {
            entry: 0x1100,
            interp: None,
            code: vec![(0x1100, 0x100, 0x1100)],
        };
        let m: Vec<Mapping> = s.mappings(0x5555_0000_0000, &key).collect();
        assert_eq!(
            (m[0].start, m[0].end, m[0].offset),
            (0x5555_0000_1000, 0x5555_0000_2000, 0x1000)
        );
        // One that would wrap the address space is none.
        let s = Segments {
            entry: 0,
            interp: None,
            code: vec![(u64::MAX - 0x10, 0x100, 0)],
        };
        assert_eq!(s.mappings(0, &key).count(), 0);
    }
}
